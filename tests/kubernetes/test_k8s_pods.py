"""Simulated pods of a generated Indexed Job: one job over stable hostnames, a pod killed mid-step, every pod resumed exactly to `launch -n 2`'s weights.

No Kubernetes runs here, so the test plays its parts with what Linux has: each pod is a process in
a network namespace of its own (as a pod has; TensorFlow's servers listen on 0.0.0.0, so two pods
share a port only that way), the two joined by a veth pair at 127.0.0.2 and 127.0.0.3, and
``<job>-<i>.<service>`` resolving to them through the namespace's hosts file (``ip netns exec``
mounts /etc/netns/NS/hosts over /etc/hosts). The pods' command and environment come from the
generated YAML (k8s_pods.py resolves the Downward API fields); the test's Job controller restarts a
failed pod with its index's next retry count as the manifest's podFailurePolicy says. Needs root
(CI and the developers' machines run as root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from k8s_pods import expand, pod_environment, policy_action

from helpers import ROOT
from tfstrategy.cli import main

yaml = pytest.importorskip("yaml")

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
SCRIPT = ROOT / "tests" / "workers" / "k8s_pod_script.py"
ADDRESSES = ("127.0.0.2", "127.0.0.3")
DEADLINE = 420.0  # seconds for a whole simulated job; it ends by itself far sooner


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def pod_network():
    """Two network namespaces joined by a veth pair; yields their names, removed (with their hosts files) after."""
    tag = f"tfk8s{os.getpid() % 100000}"
    names = [f"{tag}-{i}" for i in range(2)]
    veths = [f"{tag}{side}" for side in "ab"]
    try:
        for name in names:
            ip("netns", "add", name)
        ip("link", "add", veths[0], "type", "veth", "peer", "name", veths[1])
        for name, veth, mine, other in zip(names, veths, ADDRESSES, reversed(ADDRESSES)):
            ip("link", "set", veth, "netns", name)
            for key in ("all", veth):  # 127/8 on an interface other than lo: allowed inside this namespace only
                ip("netns", "exec", name, "sysctl", "-qw", f"net.ipv4.conf.{key}.route_localnet=1")
            ip("-n", name, "link", "set", "lo", "up")
            ip("-n", name, "addr", "add", f"{mine}/32", "dev", veth)
            ip("-n", name, "link", "set", veth, "up")
            ip("-n", name, "route", "add", f"{other}/32", "dev", veth)
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


def resolve(names: list[str], hostnames: list[str]) -> None:
    """Pod i's hostname resolves to ADDRESSES[i] in every pod (what the headless Service's DNS gives)."""
    lines = ["127.0.0.1 localhost", *(f"{address} {host}" for address, host in zip(ADDRESSES, hostnames))]
    for name in names:
        Path(f"/etc/netns/{name}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{name}/hosts").write_text("\n".join(lines) + "\n")


def generate(tmp_path: Path, *flags: str) -> dict:
    """The Job of `tfstrategy k8s`, read back from the YAML file it wrote."""
    path = tmp_path / "job.yaml"
    assert main(["k8s", "-n", "2", "--image", "unused", "--name", "train", *flags, "-o", str(path), "--",
                 "python", str(SCRIPT), str(tmp_path / "out")]) == 0
    (job,) = [obj for obj in yaml.safe_load_all(path.read_text()) if obj["kind"] == "Job"]
    return job


class Pod:
    """One attempt of one index: the manifest's command in pod i's namespace, with pod i's environment."""

    def __init__(self, job: dict, index: int, namespace: str, logs: Path, *, failures: int, ignored: int,
                 secrets: dict[str, dict[str, str]] | None = None) -> None:
        self.index, self.failures, self.ignored = index, failures, ignored
        (container,) = job["spec"]["template"]["spec"]["containers"]
        command = [part for word in container["command"]
                   for part in ([sys.executable, "-m", "tfstrategy"] if word == "tfstrategy" else
                                [sys.executable] if word == "python" else [word])]
        # No TF_CONFIG: tfstrategy run's hook derives it from the detected KubernetesEnvironment.
        env = pod_environment(job, index, failures=failures, ignored=ignored, secrets=secrets)
        command = [expand(word, env) for word in command]
        env.update(PATH=os.environ["PATH"], HOME=os.environ.get("HOME", "/root"), TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=str(ROOT / "src"))
        self.log = logs / f"pod-{index}-attempt-{failures + ignored}.log"
        while self.log.exists():  # a pod of the same index started again (scaled up)
            self.log = self.log.with_name(f"{self.log.stem}+.log")
        with self.log.open("w") as out:
            self.process = subprocess.Popen(["ip", "netns", "exec", namespace, *command], env=env, stdout=out,
                                            stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)

    def exit_code(self) -> int | None:
        code = self.process.poll()
        return None if code is None else (128 - code if code < 0 else code)  # a container killed by N: 128+N

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=30)


def run_job(job: dict, namespaces: list[str], logs: Path) -> list[Pod]:
    """The Job controller: start every index, restart a failed pod per the podFailurePolicy; every attempt."""
    logs.mkdir(parents=True, exist_ok=True)
    limit = job["spec"]["backoffLimitPerIndex"]
    pods = [Pod(job, i, namespaces[i], logs, failures=0, ignored=0) for i in range(2)]
    attempts = list(pods)
    start = time.monotonic()
    try:
        while not all(pod.exit_code() == 0 for pod in pods):
            assert time.monotonic() - start < DEADLINE, "the simulated job did not end: " + tail(attempts)
            for i, pod in enumerate(pods):
                code = pod.exit_code()
                if code in (None, 0):
                    continue
                action = policy_action(job, code)
                assert action != "FailJob" and (action == "Ignore" or pod.failures < limit), (
                    f"pod {i} exited {code}: {action}, the Job fails\n" + tail(attempts))
                counted = action == "Count"
                pods[i] = Pod(job, i, namespaces[i], logs, failures=pod.failures + counted,
                              ignored=pod.ignored + (not counted))
                attempts.append(pods[i])
            time.sleep(0.2)
    finally:
        for pod in attempts:
            pod.kill()
    return attempts


def tail(attempts: list[Pod]) -> str:
    return "\n".join(f"--- {pod.log.name} exit {pod.exit_code()}\n" + "\n".join(pod.log.read_text().splitlines()[-15:])
                     for pod in attempts)


def results(out: Path) -> list[dict]:
    return [json.loads((out / f"worker-{i}.json").read_text()) for i in range(2)]


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    """The same script under `tfstrategy launch -n 2`."""
    out = tmp_path_factory.mktemp("launch")
    result = subprocess.run([sys.executable, "-m", "tfstrategy", "launch", "-n", "2", "--timeout", "120", "--",
                             sys.executable, str(SCRIPT), str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=DEADLINE, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = results(out)
    assert first["loss"] == second["loss"] and first["steps"] == 24
    return first


def test_a_pod_killed_mid_step_restarts_its_peers_and_every_pod_resumes_exactly(pod_network, launched, tmp_path):
    backups = tmp_path / "claim"
    backups.mkdir(mode=0o700)
    job = generate(tmp_path, "--backup-pvc", "sim", "--backup-dir", str(backups), "--max-restarts", "2",
                   "--env", "KILL_AT=1:4", "--env", "TFSTRATEGY_COLLECTIVE_TIMEOUT=30")
    (tmp_path / "out").mkdir()
    resolve(pod_network, ["train-0.train", "train-1.train"])
    attempts = run_job(job, pod_network, tmp_path / "logs")
    killed = next(pod for pod in attempts if pod.index == 1 and pod.failures + pod.ignored == 0)
    assert killed.exit_code() == 137 and "pod 1 killed at epoch 1 batch 4" in killed.log.read_text()
    # its peer stops on TensorFlow's own error naming the lost task, exits 1 (Count, retried): the group restarts.
    # Which error depends on who is first, and a loaded machine changes that: the peer's missed heartbeats
    # ("unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:1"), the restarted pod reconnecting
    # ("task:1 unexpectedly tried to connect with a different incarnation"), the collective's own connection.
    peer = next(pod for pod in attempts if pod.index == 0 and pod.failures + pod.ignored == 0)
    log = peer.log.read_text()
    assert peer.exit_code() == 1 and re.search(r"^tensorflow\.python\.framework\.errors_impl\.\w+Error: ", log, re.M) \
        and re.search(r"/job:worker/(replica:0/)?task:1\b", log), tail(attempts)
    assert {pod.index for pod in attempts if pod.failures} == {0, 1}, tail(attempts)
    # The pods that ended the job formed one job over the Service's stable hostnames.
    for pod in (pod for pod in attempts if pod.exit_code() == 0):
        assert ("strategy MultiWorkerMirroredStrategy replicas 2 workers train-0.train:2222,train-1.train:2222"
                in pod.log.read_text()), tail(attempts)
    pods = results(tmp_path / "out")
    assert pods[0]["resumed"]["step"] == pods[1]["resumed"]["step"] > 0, tail(attempts)
    assert pods[0]["loss"][-1] == pods[1]["loss"][-1] == launched["loss"][-1]
    for pod in pods:
        for got, want in zip(pod["weights"], launched["weights"]):
            np.testing.assert_array_equal(np.array(got), np.array(want))


def test_an_elastic_job_scaled_down_and_up_trains_on_and_ends_with_one_devices_weights(pod_network, tmp_path):
    """`tfstrategy k8s --elastic 1:2`: pod 1 is deleted (its launcher gets SIGTERM, as when completions and
    parallelism are patched down to 1) at step 10; pod 0 trains on alone to step 20; pod 1 is created again (patched
    back to 2) and taken in; both end at step 50 with the weights of one device on the same global batches."""
    sys.path.insert(0, str(ROOT / "tests" / "launch"))
    from test_elastic_job import TOLERANCE, WORKER, _one_device_weights

    from tfstrategy.launch.elastic import newest_committed_step

    backups, out, logs = tmp_path / "claim", tmp_path / "out", tmp_path / "logs"
    backups.mkdir(mode=0o700)
    out.mkdir()
    (out / "gate").write_text("10")
    path = tmp_path / "job.yaml"
    assert main(["k8s", "--elastic", "1:2", "--image", "unused", "--name", "train", "--launch-secret", "train-secret",
                 "--backup-pvc", "claim", "--backup-dir", str(backups), "-o", str(path), "--", "python", str(WORKER),
                 "--out", str(out)]) == 0
    (job,) = [obj for obj in yaml.safe_load_all(path.read_text()) if obj["kind"] == "Job"]
    resolve(pod_network, [f"train-{i}.train" for i in range(2)])
    secrets = {"train-secret": {"secret": "k8s-test-secret-0123456789abcdef"}}
    logs.mkdir()

    def start(index: int) -> Pod:
        return Pod(job, index, pod_network[index], logs, failures=0, ignored=0, secrets=secrets)

    def wait(done, what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not done():
            assert time.monotonic() < deadline, f"gave up waiting for {what}\n" + tail(pods)
            time.sleep(0.1)

    pods = [start(0), start(1)]
    try:
        wait(lambda: newest_committed_step(backups) == 10, "step 10 committed by both pods")
        pods[1].process.send_signal(15)  # the kubelet's SIGTERM to the deleted pod's first process
        wait(lambda: pods[1].exit_code() is not None, "pod 1 to leave")
        assert pods[1].exit_code() == 75 and policy_action(job, 75) == "Ignore"
        wait(lambda: "node 1 left: going on with 1 node (1 worker) from step 10" in pods[0].log.read_text(),
             "pod 0 to go on alone")
        (out / "gate").write_text("20")
        wait(lambda: newest_committed_step(backups) == 20, "step 20 committed by pod 0 alone")
        pods.append(start(1))  # scaled up again: the Job controller creates index 1 anew
        wait(lambda: "node 1 joined: going on with 2 nodes (2 workers) from step 20" in pods[0].log.read_text(),
             "pod 1 to be taken back")
        (out / "gate").unlink()
        wait(lambda: pods[0].exit_code() is not None and pods[2].exit_code() is not None, "the job to end")
        assert (pods[0].exit_code(), pods[2].exit_code()) == (0, 0), tail(pods)
    finally:
        for pod in pods:
            pod.kill()
    reference = _one_device_weights()
    for index in (0, 1):
        final = json.loads((out / f"worker-{index}.json").read_text())
        assert (final["workers"], final["steps"]) == (2, 50)
        worst = max(float(np.max(np.abs(np.asarray(w) - r))) for w, r in zip(final["weights"], reference))
        assert worst <= TOLERANCE, f"weights differ from one device's by {worst:.2e}"
