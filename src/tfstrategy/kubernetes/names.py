"""Kubernetes' name rules, each kind's own, and the name ``tfstrategy k8s`` derives from a script (pure).

The schemas (``kubernetes-validate``) say only that a name is a string; the API server applies
these rules, so a name that breaks one passes every offline check and fails ``kubectl apply``:

======================================  =======================  ==========================================
what                                    rule                     why
======================================  =======================  ==========================================
Service                                 DNS-1035 label, 63       a Service name is a DNS label that must
                                                                 not start with a digit
Job (Indexed)                           DNS-1123 subdomain, 63   the ``job-name`` label holds it (63), and
                                                                 pod ``i``'s hostname is ``<job>-<i>``
pod hostname ``<job>-<i>``, subdomain   DNS-1123 label, 63       a hostname is a DNS label; pod ``i`` is
                                                                 reached as ``<job>-<i>.<service>``
Kueue LocalQueue                        DNS-1123 subdomain, 63   the ``queue-name`` label holds it
NetworkPolicy, PVC, Secret,             DNS-1123 subdomain,
ServiceAccount, ConfigMap               253
namespace                               DNS-1123 label, 63
label value                             63, alphanumeric at      ``([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]``
                                        both ends, may be empty
label key                               ``[prefix/]name``        prefix a DNS-1123 subdomain, name as a
                                                                 label value but not empty
======================================  =======================  ==========================================

:func:`check_generated_names` applies them to every object ``tfstrategy k8s`` writes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfstrategy.errors import LaunchError

__all__ = [
    "NameRule", "DNS1035_LABEL", "DNS1123_LABEL", "DNS1123_SUBDOMAIN", "NAME_IN_LABEL", "JOB_NAME", "KIND_RULES", "name_problem",
    "label_key_problem", "label_value_problem", "check_names", "derive_name", "name_from_command", "check_generated_names",
    "MAX_HOSTNAME", "DEFAULT_NAME",
]

MAX_HOSTNAME = 63
DEFAULT_NAME = "tfstrategy-job"
#: The prefix a derived name gets when the script's name does not start with a letter.
DERIVED_PREFIX = "job-"

_LABEL_1123 = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_1035 = r"[a-z]([-a-z0-9]*[a-z0-9])?"
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


@dataclass(frozen=True)
class NameRule:
    """One of Kubernetes' name rules: a pattern, a length and the words that teach it."""

    title: str
    pattern: re.Pattern[str]
    max_length: int
    describes: str
    #: The characters it allows, as a regular-expression class.
    characters: str = "a-z0-9-"

    def expected(self) -> str:
        """``a DNS-1035 label (lower-case letters, ...; at most 63 characters)``."""
        return f"{self.title} ({self.describes}; at most {self.max_length} characters)"


DNS1035_LABEL = NameRule("a DNS-1035 label", re.compile(_LABEL_1035), 63,
                         "lower-case letters, digits and '-', starting with a letter, ending with a letter or digit")
DNS1123_LABEL = NameRule("a DNS-1123 label", re.compile(_LABEL_1123), 63,
                         "lower-case letters, digits and '-', starting and ending with a letter or digit")
DNS1123_SUBDOMAIN = NameRule("a DNS-1123 subdomain", re.compile(rf"{_LABEL_1123}(\.{_LABEL_1123})*"), 253,
                             "DNS-1123 labels joined by '.': lower-case letters, digits, '-' and '.', starting and "
                             "ending with a letter or digit", "a-z0-9.-")
#: An object's name that a label also holds: a Job's (the Job controller's ``job-name`` label), a
#: Kueue LocalQueue's (``kueue.x-k8s.io/queue-name``).
NAME_IN_LABEL = NameRule("a DNS-1123 subdomain", DNS1123_SUBDOMAIN.pattern, 63, DNS1123_SUBDOMAIN.describes, "a-z0-9.-")
JOB_NAME = NAME_IN_LABEL

#: The rule of ``metadata.name`` for each kind tfstrategy writes or names.
KIND_RULES: Mapping[str, NameRule] = {
    "Service": DNS1035_LABEL,
    "Job": JOB_NAME,
    "Namespace": DNS1123_LABEL,
    "NetworkPolicy": DNS1123_SUBDOMAIN,
    "PersistentVolumeClaim": DNS1123_SUBDOMAIN,
    "Secret": DNS1123_SUBDOMAIN,
    "ServiceAccount": DNS1123_SUBDOMAIN,
    "ConfigMap": DNS1123_SUBDOMAIN,
    "LocalQueue": NAME_IN_LABEL,
}


def name_problem(value: str, rule: NameRule) -> str | None:
    """What breaks ``rule`` in ``value`` (``None`` when it holds), e.g. ``"starts with '2'"``."""
    if not value:
        return "is empty"
    if len(value) > rule.max_length:
        return f"has {len(value)} characters"
    if rule.pattern.fullmatch(value):
        return None
    other = re.search(f"[^{rule.characters}]", value)
    if other:
        return f"has the {'upper-case letter' if other[0].isupper() else 'character'} {other[0]!r}"
    if not value[0].isalnum() or (rule is DNS1035_LABEL and not value[0].isalpha()):
        return f"starts with {value[0]!r}"
    if not value[-1].isalnum():
        return f"ends with {value[-1]!r}"
    return "is not " + rule.title  # a subdomain's empty or dashed part, e.g. a..b or a.-b


def label_value_problem(value: str) -> str | None:
    """What makes ``value`` an invalid label value, or ``None``."""
    if len(value) > 63:
        return f"has {len(value)} characters, more than 63"
    if not _LABEL_VALUE.fullmatch(value):
        return "is not letters, digits, '-', '_' and '.' starting and ending with a letter or digit"
    return None


def label_key_problem(key: str) -> str | None:
    """What makes ``key`` an invalid label (or taint) key such as ``cloud.google.com/gke-accelerator``, or ``None``."""
    prefix, slash, name = key.rpartition("/")
    if slash and name_problem(prefix, DNS1123_SUBDOMAIN) is not None:
        return f"has the prefix {prefix!r}, which is not a DNS-1123 subdomain"
    if not name:
        return "has an empty name"
    problem = label_value_problem(name)
    return None if problem is None else f"has the name {name!r}, which {problem}"


def derive_name(text: str, num_workers: int) -> str:
    """A valid Job and Service name from any text: the rule ``tfstrategy k8s`` names a job by.

    Lower-case ``text``, turn each run of characters other than a-z and 0-9 into '-', trim '-' at
    both ends, prefix ``job-`` unless it starts with a letter (a Service name must), and cut it so
    that the last pod's hostname ``<name>-<num_workers - 1>`` has at most 63 characters; ``tfstrategy-job``
    when nothing is left.

    Example:
        >>> derive_name("2_train", 4)
        'job-2-train'
    """
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if name and not name[0].isalpha():
        name = DERIVED_PREFIX + name
    room = MAX_HOSTNAME - len(f"-{max(num_workers, 1) - 1}")
    name = name[:room].rstrip("-")
    return name or DEFAULT_NAME[:room]


def name_from_command(command: Sequence[str], num_workers: int = 1) -> str:
    """The default name: :func:`derive_name` of the script's file name without ``.py``.

    ``python train_v2.py`` -> ``train-v2``, ``python 2_train.py`` -> ``job-2-train``, no script
    (``python -m pkg``) -> ``tfstrategy-job``.
    """
    scripts = [part for part in command if part.endswith(".py")]
    stem = scripts[0].rsplit("/", 1)[-1].removesuffix(".py") if scripts else ""
    return derive_name(stem, num_workers) if stem else DEFAULT_NAME


def check_names(flag: str, values: Iterable[str], example: str) -> None:
    """Raise a one-line error for the first value that is not a DNS-1123 subdomain (a Secret's, a PVC's, ...).

    Raises:
        LaunchError: naming ``flag``, the value, the rule and ``example``.
    """
    for value in values:
        problem = name_problem(value, DNS1123_SUBDOMAIN)
        if problem is not None:
            raise LaunchError(f"Received {flag} {value!r}, which {problem}; expected the name of an object in the "
                              f"Job's namespace, {DNS1123_SUBDOMAIN.expected()}, e.g. {flag} {example}.")


def _require(problems: list[str], what: str, value: str, rule: NameRule) -> None:
    problem = name_problem(value, rule)
    if problem is not None:
        problems.append(f"{what} {value!r} {problem}; expected {rule.expected()}")


def _labels(problems: list[str], what: str, labels: Mapping[str, str]) -> None:
    for key, value in labels.items():
        for part, problem in (("key", label_key_problem(key)), ("value", label_value_problem(value))):
            if problem is not None:
                problems.append(f"{what} label {key}={value!r}: the {part} {problem}")


def _pod_names(problems: list[str], job: Mapping[str, Any]) -> None:
    spec = job["spec"]
    pod = spec["template"]["spec"]
    if spec.get("completionMode") == "Indexed":
        _require(problems, "the last pod's hostname", f"{job['metadata']['name']}-{spec['completions'] - 1}", DNS1123_LABEL)
    if "subdomain" in pod:
        _require(problems, "the pods' subdomain", pod["subdomain"], DNS1123_LABEL)
    if "serviceAccountName" in pod:
        _require(problems, "the ServiceAccount", pod["serviceAccountName"], DNS1123_SUBDOMAIN)
    for secret in pod.get("imagePullSecrets", []):
        _require(problems, "the image pull Secret", secret["name"], DNS1123_SUBDOMAIN)
    for volume in pod.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            _require(problems, "the PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"],
                     DNS1123_SUBDOMAIN)
    _labels(problems, "the pods' node selector", pod.get("nodeSelector", {}))
    _labels(problems, "the pods'", spec["template"].get("metadata", {}).get("labels", {}))
    for toleration in pod.get("tolerations", []):
        problem = label_key_problem(toleration.get("key", ""))
        if problem is not None:
            problems.append(f"the toleration key {toleration.get('key')!r} {problem}")


def check_generated_names(objects: Sequence[Mapping[str, Any]]) -> None:
    """Check every name in ``objects`` by its kind's rule (this module's table).

    Raises:
        LaunchError: the names that the API server would reject, all of them in one line.
    """
    problems: list[str] = []
    for obj in objects:
        kind, metadata = obj["kind"], obj["metadata"]
        _require(problems, f"the {kind}'s name", metadata["name"], KIND_RULES.get(kind, DNS1123_SUBDOMAIN))
        if "namespace" in metadata:
            _require(problems, "the namespace", metadata["namespace"], DNS1123_LABEL)
        _labels(problems, f"the {kind}'s", metadata.get("labels", {}))
        if kind == "Job":
            _pod_names(problems, obj)
    if problems:
        raise LaunchError(f"Received manifests the Kubernetes API server would refuse: {'; '.join(problems)}. "
                          "Change the flag that sets each name (--name, --namespace, ...).")
