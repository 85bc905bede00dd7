"""What Kubernetes does with a generated Job, for the tests: a pod's environment and the podFailurePolicy's verdict.

Read from the manifest itself, never from a second copy of what tfstrategy k8s writes: the Job
controller labels and annotates each pod (batch.kubernetes.io/job-name, job-completion-index, and
with backoffLimitPerIndex the index's failure counts) and adds JOB_COMPLETION_INDEX; the kubelet
resolves each env entry's value or Downward API fieldRef against that metadata.
"""

from __future__ import annotations

import re
from typing import Any

PREFIX = "batch.kubernetes.io/"


def pod_metadata(job: dict[str, Any], index: int, *, failures: int = 0, ignored: int = 0) -> dict[str, dict[str, str]]:
    """The labels and annotations the Job controller gives pod ``index`` after ``failures`` + ``ignored`` retries."""
    template = job["spec"]["template"].get("metadata", {})
    labels = {**template.get("labels", {}), f"{PREFIX}job-name": job["metadata"]["name"], "job-name": job["metadata"]["name"],
              f"{PREFIX}job-completion-index": str(index)}
    annotations = {**template.get("annotations", {}), f"{PREFIX}job-completion-index": str(index)}
    if job["spec"].get("backoffLimitPerIndex") is not None:
        annotations[f"{PREFIX}job-index-failure-count"] = str(failures)
        if ignored:  # "When the annotation is absent zero is implied" (batch/v1 types)
            annotations[f"{PREFIX}job-index-ignored-failure-count"] = str(ignored)
    return {"labels": labels, "annotations": annotations}


def pod_environment(job: dict[str, Any], index: int, *, failures: int = 0, ignored: int = 0,
                    secrets: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    """The variables the Job's container sees in pod ``index`` (JOB_COMPLETION_INDEX and its resolved env);
    ``secrets``: the namespace's Secrets, by name, each its keys' values."""
    assert job["spec"]["completionMode"] == "Indexed"
    metadata = pod_metadata(job, index, failures=failures, ignored=ignored)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {"JOB_COMPLETION_INDEX": str(index)}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        if "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = (secrets or {})[ref["name"]][ref["key"]]  # a missing Secret: the pod never starts
            continue
        path = entry["valueFrom"]["fieldRef"]["fieldPath"]
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        assert match, f"a fieldRef the test's kubelet does not know: {path}"
        env[entry["name"]] = metadata[match[1]].get(match[2], "")  # a missing key is an empty value
    return env


def expand(word: str, env: dict[str, str]) -> str:
    """``$(NAME)`` in a command word as the kubelet expands it: the container's variable, left as is if undefined."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), word)


def policy_action(job: dict[str, Any], exit_code: int, *, condition: str | None = None) -> str:
    """What the Job controller does with a failed pod: the first matching podFailurePolicy rule, else Count."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
        if "onPodConditions" in rule:
            if any(c["type"] == condition and c.get("status", "True") == "True" for c in rule["onPodConditions"]):
                return rule["action"]
            continue
        codes = rule["onExitCodes"]
        if codes.get("containerName", container["name"]) != container["name"]:
            continue
        inside = exit_code in codes["values"]
        if inside == (codes["operator"] == "In") and exit_code != 0:
            return rule["action"]
    return "Count"
