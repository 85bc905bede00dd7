"""`tfstrategy k8s`: every generated manifest validates against Kubernetes' own OpenAPI schemas, offline.

kubernetes-validate ships the JSON schemas generated from Kubernetes' OpenAPI; "strict" ones refuse
unknown fields, so a misspelt or misplaced field fails here as `kubectl apply` would.
"""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest
from k8s_pods import expand, pod_environment, policy_action

from tfstrategy.cli import build_parser, main
from tfstrategy.cli.k8s import options_from_args
from tfstrategy.cli.launch import options_from_args as launch_options
from tfstrategy.kubernetes import dump_all, manifests
from tfstrategy.kubernetes.yaml_text import dump

# Installed by the test extra; the version venvs of .ci/versions run only the smoke set without them.
kubernetes_validate = pytest.importorskip("kubernetes_validate")
yaml = pytest.importorskip("yaml")

#: The oldest release with backoffLimitPerIndex GA, and the newest schema kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")

FLAG_SETS = [
    pytest.param(["-n", "2", "--image", "python:3.12"], ["python", "train.py"], id="minimal"),
    pytest.param(["-n", "4", "--image", "registry.example.com/ml/train:1.2", "--gpus", "1", "--cpu", "8",
                  "--memory", "32Gi", "--backup-pvc", "train-backups", "--max-restarts", "5", "--env", "DATA_DIR=/data",
                  "--env", "MODE=yes", "--namespace", "ml-team", "--name", "resnet-run7", "--port", "23456",
                  "--grace", "120"], ["python", "-m", "pkg.train", "--epochs", "10"], id="gpus-backups-everything"),
    pytest.param(["-n", "1", "--image", "img@sha256:" + "a" * 64, "--cpu", "500m", "--no-network-policy",
                  "--backup-pvc", "b", "--backup-dir", "/mnt/ckpt", "--max-restarts", "0"], ["python", "t.py"],
                 id="one-pod-no-policy-digest-image"),
    pytest.param(["-n", "16", "--image", "x", "--no-hook", "--env", "EMPTY=", "--env", "QUOTE=a: 'b' #c"],
                 ["bash", "-c", "python train.py --lr 1e-3"], id="sixteen-pods-no-hook-odd-values"),
    pytest.param(["-n", "100", "--image", "x"], ["python", "scripts/2_train.py"], id="script-name-starts-with-a-digit"),
    pytest.param(["-n", "8", "--image", "x", "--queue", "user-queue", "--node-selector", "pool=train",
                  "--node-selector", "cloud.google.com/gke-accelerator=nvidia-l4", "--toleration",
                  "nvidia.com/gpu:NoSchedule", "--toleration", "dedicated=ml", "--toleration", "spot",
                  "--image-pull-secret", "regcred", "--image-pull-secret", "gcr.io-pull", "--service-account",
                  "trainer", "--ttl-after-finished", "0", "--cpu", "2500m", "--cpu-limit", "3", "--memory", "1.5Gi"],
                 ["python", "2_train.py"], id="kueue-placement-digit-script"),
    pytest.param(["-n", "2", "--image", "x", "--ttl-after-finished", "never", "--cpu", "4", "--cpu-limit", "4",
                  "--gpus", "2"], ["python", "train.py"], id="guaranteed-kept-forever"),
]


def generate(flags: list[str], program: list[str]) -> list[dict]:
    args = build_parser().parse_args(["k8s", *flags, "--", *program])
    return manifests(options_from_args(args))


@pytest.mark.parametrize(("flags", "program"), FLAG_SETS)
def test_every_manifest_validates_against_the_kubernetes_schemas_and_reads_back_from_its_yaml(flags, program):
    objects = generate(flags, program)
    for obj in objects:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    assert list(yaml.safe_load_all(dump_all(objects))) == objects


def test_the_schemas_catch_a_misspelt_field_and_a_wrong_type():
    job = generate(["-n", "2", "--image", "x"], ["python", "t.py"])[-1]
    job["spec"]["completionsMode"] = job["spec"].pop("completionMode")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[0], strict=True)
    job = generate(["-n", "2", "--image", "x"], ["python", "t.py"])[-1]
    job["spec"]["completions"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize(("flags", "program"), FLAG_SETS)
def test_the_objects_agree_on_names_labels_ports_and_counts(flags, program):
    objects = {obj["kind"]: obj for obj in generate(flags, program)}
    job, service = objects["Job"], objects["Service"]
    name, spec = job["metadata"]["name"], job["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    port = container["ports"][0]["containerPort"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    assert pod["restartPolicy"] == "Never" and pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["port"] == port
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    env = pod_environment(job, spec["completions"] - 1)
    assert env["TFSTRATEGY_K8S_JOB"] == name and env["TFSTRATEGY_K8S_SERVICE"] == service["metadata"]["name"]
    assert env["TFSTRATEGY_K8S_WORKERS"] == str(spec["completions"]) and env["TFSTRATEGY_K8S_PORT"] == str(port)
    if "NetworkPolicy" in objects:
        policy = objects["NetworkPolicy"]["spec"]
        assert policy["podSelector"]["matchLabels"] == service["spec"]["selector"]
        assert policy["ingress"] == [{"from": [{"podSelector": policy["podSelector"]}],
                                      "ports": [{"protocol": "TCP", "port": port}]}]
    if "--backup-pvc" in flags:
        (mount,) = container["volumeMounts"]
        assert env["TFSTRATEGY_BACKUP_DIR"] == mount["mountPath"] and mount["subPath"] == name
    else:
        assert "TFSTRATEGY_BACKUP_DIR" not in env and "volumes" not in pod


@pytest.mark.parametrize(("exit_code", "condition", "action"), [
    pytest.param(75, None, "Ignore", id="75-preempted-saved-restart-uncounted"),
    pytest.param(42, None, "Ignore", id="42-tensorflow-restart-request-not-permanent"),
    pytest.param(137, "DisruptionTarget", "Ignore", id="evicted-or-preempted-pod"),
    pytest.param(2, None, "FailJob", id="2-invalid-options-fail-at-once"),
    pytest.param(1, None, "Count", id="1-may-be-a-lost-peer-retried"),
    pytest.param(137, None, "Count", id="137-killed-oom-retried"),
    pytest.param(124, None, "Count", id="124-retried"),
])
def test_the_pod_failure_policy_follows_tfstrategys_exit_codes(exit_code, condition, action):
    job = generate(["-n", "2", "--image", "x"], ["python", "t.py"])[-1]
    assert policy_action(job, exit_code, condition=condition) == action
    assert job["spec"]["maxFailedIndexes"] == 0 and job["spec"]["podReplacementPolicy"] == "Failed"


def test_the_pod_command_runs_the_program_under_tfstrategy_run_unless_no_hook():
    job = generate(["-n", "2", "--image", "x"], ["python", "train.py", "--lr", "0.1"])[-1]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "tfstrategy", "run", "--", "python", "train.py", "--lr", "0.1"]
    job = generate(["-n", "2", "--image", "x", "--audit", "stop", "--precision", "mixed_float16"], ["python", "t.py"])[-1]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "tfstrategy", "run", "--audit", "stop", "--precision", "mixed_float16", "--", "python", "t.py"]
    job = generate(["-n", "2", "--image", "x", "--no-hook"], ["python", "train.py"])[-1]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["python", "train.py"]


def test_the_name_defaults_to_the_scripts_name():
    assert generate(["-n", "2", "--image", "x"], ["python", "src/Train_V2.py"])[-1]["metadata"]["name"] == "train-v2"
    assert generate(["-n", "2", "--image", "x"], ["python", "-m", "pkg"])[-1]["metadata"]["name"] == "tfstrategy-job"


@pytest.mark.parametrize("value", ["", "yes", "No", "null", "~", "123", "1e3", "0x1F", "a: b", "- x", "#x", "x #y",
                                   "'q'", '"q"', "{a}", "[1]", "a\nb", " lead", "trail ", "é", "@x", "*x", "!x",
                                   "%x", "x:", "true", "on", ".5", "-", "|", ">"])
def test_yaml_text_reads_back_as_the_same_string(value):
    document = {"s": value, "l": [value, {value or "k": value}]}
    assert yaml.safe_load(dump(document)) == document


def test_the_command_writes_yaml_or_json_to_a_file(tmp_path, capsys):
    out = tmp_path / "train.yaml"
    assert main(["k8s", "-n", "2", "--image", "x", "-o", str(out), "--", "python", "train.py"]) == 0
    assert [obj["kind"] for obj in yaml.safe_load_all(out.read_text())] == ["Service", "NetworkPolicy", "Job"]
    assert f"kubectl apply -f {out}" in capsys.readouterr().err
    assert main(["k8s", "-n", "2", "--image", "x", "--json", "--", "python", "train.py"]) == 0
    assert [obj["kind"] for obj in json.loads(capsys.readouterr().out)] == ["Service", "NetworkPolicy", "Job"]


BAD = [
    pytest.param(["-n", "0", "--image", "x", "--", "python", "t.py"], "-n 0", id="no-pods"),
    pytest.param(["-n", "2", "--image", "a b", "--", "python", "t.py"], "--image 'a b'", id="image-with-space"),
    pytest.param(["-n", "2", "--image", "x", "--name", "Train_1", "--", "python", "t.py"], "--name 'Train_1'", id="name"),
    pytest.param(["-n", "10", "--image", "x", "--name", "a" * 62, "--", "python", "t.py"], "at most 63", id="long-name"),
    pytest.param(["-n", "2", "--image", "x", "--namespace", "NS", "--", "python", "t.py"], "--namespace", id="ns"),
    pytest.param(["-n", "2", "--image", "x", "--port", "70000", "--", "python", "t.py"], "--port 70000", id="port"),
    pytest.param(["-n", "2", "--image", "x", "--cpu", "four", "--", "python", "t.py"], "--cpu 'four'", id="cpu"),
    pytest.param(["-n", "2", "--image", "x", "--memory", "16GB", "--", "python", "t.py"], "--memory '16GB'", id="mem"),
    pytest.param(["-n", "2", "--image", "x", "--gpus", "-1", "--", "python", "t.py"], "--gpus -1", id="gpus"),
    pytest.param(["-n", "2", "--image", "x", "--max-restarts", "-1", "--", "python", "t.py"], "--max-restarts", id="k"),
    pytest.param(["-n", "2", "--image", "x", "--grace", "0", "--", "python", "t.py"], "--grace 0", id="grace"),
    pytest.param(["-n", "2", "--image", "x", "--backup-pvc", "B", "--", "python", "t.py"], "--backup-pvc", id="pvc"),
    pytest.param(["-n", "2", "--image", "x", "--backup-dir", "/b", "--", "python", "t.py"], "without --backup-pvc",
                 id="dir-without-pvc"),
    pytest.param(["-n", "2", "--image", "x", "--backup-pvc", "b", "--backup-dir", "rel", "--", "python", "t.py"],
                 "--backup-dir 'rel'", id="relative-dir"),
    pytest.param(["-n", "2", "--image", "x", "--env", "NOVALUE", "--", "python", "t.py"], "--env 'NOVALUE'", id="env"),
    pytest.param(["-n", "2", "--image", "x", "--env", "1A=b", "--", "python", "t.py"], "--env '1A'", id="env-name"),
    pytest.param(["-n", "2", "--image", "x", "--env", "TF_CONFIG={}", "--", "python", "t.py"], "TF_CONFIG",
                 id="env-reserved"),
    pytest.param(["-n", "2", "--image", "x", "--"], "no command", id="no-command"),
    pytest.param(["-n", "2", "--image", "x", "--precision", "fp8", "--", "python", "t.py"], "--precision", id="precision"),
    pytest.param(["-n", "2", "--image", "x", "--audit", "stop", "--no-hook", "--", "python", "t.py"], "--no-hook",
                 id="run-option-without-hook"),
    pytest.param(["-n", "2", "--image", "x", "-o", "/nonexistent/dir/x.yaml", "--", "python", "t.py"], "-o ",
                 id="unwritable-output"),
    pytest.param(["-n", "2", "--image", "x", "--name", "2-train", "--", "python", "t.py"], "DNS-1035", id="name-digit"),
    pytest.param(["-n", "2", "--image", "x", "--cpu-limit", "1", "--cpu", "2", "--", "python", "t.py"],
                 "--cpu-limit 1 below --cpu 2", id="cpu-limit-below-request"),
    pytest.param(["-n", "2", "--image", "x", "--cpu-limit", "x", "--", "python", "t.py"], "--cpu-limit 'x'",
                 id="cpu-limit-quantity"),
    pytest.param(["-n", "2", "--image", "x", "--queue", "Team_A", "--", "python", "t.py"], "--queue 'Team_A'",
                 id="queue"),
    pytest.param(["-n", "2", "--image", "x", "--node-selector", "pool", "--", "python", "t.py"], "KEY=VALUE",
                 id="node-selector-no-value"),
    pytest.param(["-n", "2", "--image", "x", "--node-selector", "a/b/c=d", "--", "python", "t.py"], "prefix 'a/b'",
                 id="node-selector-key"),
    pytest.param(["-n", "2", "--image", "x", "--node-selector", "a=b", "--node-selector", "a=c", "--", "python", "t.py"],
                 "one value", id="node-selector-twice"),
    pytest.param(["-n", "2", "--image", "x", "--toleration", "gpu:NoScheduel", "--", "python", "t.py"],
                 "effect 'NoScheduel'", id="toleration-effect"),
    pytest.param(["-n", "2", "--image", "x", "--toleration", "=x:NoSchedule", "--", "python", "t.py"],
                 "--toleration '=x:NoSchedule'", id="toleration-no-key"),
    pytest.param(["-n", "2", "--image", "x", "--image-pull-secret", "Reg_Cred", "--", "python", "t.py"],
                 "--image-pull-secret 'Reg_Cred'", id="pull-secret"),
    pytest.param(["-n", "2", "--image", "x", "--service-account", "a..b", "--", "python", "t.py"],
                 "--service-account 'a..b'", id="service-account"),
    pytest.param(["-n", "2", "--image", "x", "--ttl-after-finished", "1d", "--", "python", "t.py"],
                 "--ttl-after-finished '1d'", id="ttl"),
    pytest.param(["-n", "2", "--image", "x", "--ttl-after-finished", "2147483648", "--", "python", "t.py"],
                 "0 to 2147483647", id="ttl-over-int32"),
    pytest.param(["-n", "2", "--image", "x", "--ttl-after-finished", "\u00b2", "--", "python", "t.py"],
                 "--ttl-after-finished", id="ttl-superscript-digit"),
]


@pytest.mark.parametrize(("argv", "named"), BAD)
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(argv, named, capsys):
    assert main(["k8s", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfstrategy k8s: error: Received "), lines
    assert named in lines[0]


def qos_class(pod: dict) -> str:
    """The QoS class Kubernetes gives a pod (the pod QoS rules, for one container with CPU and memory)."""
    (container,) = pod["containers"]
    requests, limits = container.get("resources", {}).get("requests", {}), container.get("resources", {}).get("limits", {})
    if not requests and not limits:
        return "BestEffort"
    if all(limits.get(kind) is not None and requests.get(kind, limits[kind]) == limits[kind] for kind in ("cpu", "memory")):
        return "Guaranteed"
    return "Burstable"


@pytest.mark.parametrize(("flags", "requests", "limits", "qos"), [
    pytest.param([], {"cpu": "1", "memory": "4Gi"}, {"memory": "4Gi"}, "Burstable", id="defaults-never-besteffort"),
    pytest.param(["--cpu", "8", "--memory", "32Gi"], {"cpu": "8", "memory": "32Gi"}, {"memory": "32Gi"}, "Burstable",
                 id="memory-limit-is-the-request-no-cpu-limit"),
    pytest.param(["--cpu", "8", "--cpu-limit", "8", "--gpus", "1"], {"cpu": "8", "memory": "4Gi", "nvidia.com/gpu": "1"},
                 {"cpu": "8", "memory": "4Gi", "nvidia.com/gpu": "1"}, "Guaranteed", id="cpu-limit-equal-guaranteed"),
    pytest.param(["--cpu", "500m", "--cpu-limit", "1"], {"cpu": "500m", "memory": "4Gi"}, {"cpu": "1", "memory": "4Gi"},
                 "Burstable", id="cpu-limit-above-request"),
])
def test_pods_request_resources_so_they_are_not_evicted_first(flags, requests, limits, qos):
    pod = generate(["-n", "2", "--image", "x", *flags], ["python", "t.py"])[-1]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {"requests": requests, "limits": limits}
    assert qos_class(pod) == qos


def test_queue_labels_the_job_for_kueue_and_writes_it_suspended():
    job = generate(["-n", "2", "--image", "x", "--queue", "team-a"], ["python", "t.py"])[-1]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a" and job["spec"]["suspend"] is True
    job = generate(["-n", "2", "--image", "x"], ["python", "t.py"])[-1]
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"] and "suspend" not in job["spec"]


def test_placement_flags_land_in_the_pod_spec_and_the_ttl_in_the_job():
    job = generate(["-n", "2", "--image", "x", "--node-selector", "pool=a", "--node-selector", "zone=", "--toleration",
                    "nvidia.com/gpu:NoSchedule", "--toleration", "dedicated=ml", "--toleration", "spot=true:NoExecute",
                    "--image-pull-secret", "regcred", "--image-pull-secret", "other", "--service-account", "trainer",
                    "--ttl-after-finished", "600"], ["python", "t.py"])[-1]
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "a", "zone": ""}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
        {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute"},
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    assert pod["serviceAccountName"] == "trainer" and job["spec"]["ttlSecondsAfterFinished"] == 600
    default = generate(["-n", "2", "--image", "x"], ["python", "t.py"])[-1]
    assert default["spec"]["ttlSecondsAfterFinished"] == 86400
    assert not {"nodeSelector", "tolerations", "imagePullSecrets", "serviceAccountName"} & set(default["spec"]["template"]["spec"])
    kept = generate(["-n", "2", "--image", "x", "--ttl-after-finished", "never"], ["python", "t.py"])[-1]
    assert "ttlSecondsAfterFinished" not in kept["spec"]


def test_a_library_caller_cannot_queue_a_job_that_requests_nothing():
    from tfstrategy.errors import LaunchError
    from tfstrategy.kubernetes import K8sOptions

    options = K8sOptions(command=("python", "t.py"), num_workers=2, image="x", name="t", queue="q", cpu=None, memory=None)
    with pytest.raises(LaunchError, match="Kueue admits a Job by the resources"):
        manifests(options)
    besteffort = manifests(K8sOptions(command=("python", "t.py"), num_workers=2, image="x", name="t", cpu=None, memory=None))
    assert "resources" not in besteffort[-1]["spec"]["template"]["spec"]["containers"][0]


# --- elastic jobs (--elastic MIN:MAX): each pod one node of tfstrategy launch --nnodes MIN:MAX -------------

ELASTIC = ["--elastic", "2:4", "--image", "x", "--launch-secret", "train-secret", "--backup-pvc", "claim", "--name",
           "train", "--port", "23456"]


def test_an_elastic_job_validates_and_its_pods_run_one_node_each_of_an_elastic_launch():
    objects = {obj["kind"]: obj for obj in generate(ELASTIC, ["python", "train.py"])}
    for version in KUBERNETES_VERSIONS:
        for obj in objects.values():
            kubernetes_validate.validate(obj, version, strict=True)
    job, service, policy = objects["Job"], objects["Service"], objects["NetworkPolicy"]
    spec = job["spec"]
    # Elastic Indexed Jobs (GA in 1.31): completions may change when it changes with an equal parallelism.
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"] == [
        "tfstrategy", "launch", "--nnodes", "2:4", "--master", "train-0.train:23457", "--node-address",
        "train-$(TFSTRATEGY_NODE_RANK).train", "-n", "1", "--port-range",
        "23456-23456", "--backup-dir", "/backups", "--grace", "25", "--", "python", "train.py"]
    env = pod_environment(job, 3, secrets={"train-secret": {"secret": "s" * 32}})
    assert env["TFSTRATEGY_NODE_RANK"] == "3" and env["TFSTRATEGY_LAUNCH_SECRET"] == "s" * 32
    assert env["TFSTRATEGY_JOB_ID"] == "train" and not any(key.startswith("TFSTRATEGY_K8S_") for key in env)
    ports = {23456, 23457}
    assert {p["containerPort"] for p in container["ports"]} == {p["port"] for p in service["spec"]["ports"]} == ports
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} == ports
    # the pod's launcher reads its rank and secret from that environment, and its options parse
    args = build_parser().parse_args([expand(word, env) for word in container["command"][1:]])
    with mock.patch.dict(os.environ, env):
        options = launch_options(args)
    assert options.nodes is not None and (options.nodes.min_nodes, options.nodes.nnodes) == (2, 4)
    assert (options.nodes.node_rank, options.nodes.master) == (3, "train-0.train:23457")
    assert options.nodes.node_address == "train-3.train"  # the pod's own name through the headless Service


@pytest.mark.parametrize(("argv", "named"), [
    pytest.param(["--elastic", "2:4", "--image", "x", "--launch-secret", "s"], "without --backup-pvc", id="no-claim"),
    pytest.param(["--elastic", "2:4", "--image", "x", "--backup-pvc", "c"], "without --launch-secret", id="no-secret"),
    pytest.param(["--elastic", "2-4", "--image", "x"], "--elastic '2-4'; expected MIN:MAX", id="not-min-max"),
    pytest.param(["--elastic", "3:2", "--image", "x", "--backup-pvc", "c", "--launch-secret", "s"],
                 "expected 1 <= MIN <= MAX", id="min-above-max"),
    pytest.param(["-n", "3", "--elastic", "1:4", "--image", "x", "--backup-pvc", "c", "--launch-secret", "s"],
                 "with -n 3; expected 1 <= MIN <= MAX and -n MAX", id="n-not-max"),
    pytest.param(["--elastic", "1:2", "--image", "x", "--backup-pvc", "c", "--launch-secret", "s", "--no-hook"],
                 "with --no-hook", id="no-hook"),
    pytest.param(["-n", "2", "--image", "x", "--launch-secret", "s"], "without --elastic", id="secret-not-elastic"),
    pytest.param(["--image", "x"], "Received no -n", id="no-count"),
])
def test_bad_elastic_input_is_one_line_naming_the_flag(argv, named, capsys):
    assert main(["k8s", *argv, "--", "python", "t.py"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines
