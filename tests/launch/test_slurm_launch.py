"""``srun tfstrategy launch``: one launcher per task of a Slurm job step, its multi-node options from the step.

The policy (a step's variables to ``--nnodes``/``--node-rank``/``--master``) is tested on fake
environments; one process test runs issue 38's planted uneven shards under a real Slurm
(``tests/slurm_cluster.py``), two launchers as the step's two tasks on this machine.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers import ROOT
from tfstrategy.cli import build_parser
from tfstrategy.cli.launch import node_arguments, options_from_args
from tfstrategy.environments import detect_environment
from tfstrategy.environments.slurm import cluster_from_slurm_step, read_slurm_step
from tfstrategy.environments.slurm_lists import PLAIN_PARSERS
from tfstrategy.errors import LaunchError
from tfstrategy.launch.slurm import slurm_nodes
from tfstrategy.runtime.inputs import derive_inputs
from tfstrategy.settings import ENV_LAUNCH_SECRET

SECRET = "tfstrategy-test-secret-0123456789"
#: Task 1 of a step of 4 tasks, two a node on n1 and n2 (n1 resolves to 10.0.0.1, n2 to 10.0.0.2).
STEP = {
    "SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "n1",
    "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_RESV_PORTS": "21234-21236",
    ENV_LAUNCH_SECRET: SECRET,
}
HOSTS = {"n1": "10.0.0.1", "n2": "10.0.0.2", "vm": "127.0.0.1", "lo1": "127.0.1.1"}


def resolve(name: str) -> str:
    if name not in HOSTS:
        raise OSError(f"[Errno -2] Name or service not known: {name!r}")
    return HOSTS[name]


def nodes(env: dict[str, str], *, explicit: bool = False, secret_file: bool = False):
    return slurm_nodes(env, explicit=explicit, secret_file=secret_file, resolve=resolve)


# --- the policy: a step's variables to the launcher's options -------------------------------


@pytest.mark.parametrize(
    ("env", "rank", "address"),
    [
        pytest.param(STEP, 1, "10.0.0.1", id="second-task-on-the-first-node"),
        pytest.param({**STEP, "SLURM_PROCID": "3", "SLURMD_NODENAME": "n2"}, 3, "10.0.0.2", id="block"),
        # Cyclic distribution: task 1 runs on n2 as its local task 0; the rank is its place node by node.
        pytest.param({**STEP, "SLURM_PROCID": "1", "SLURMD_NODENAME": "n2", "SLURM_LOCALID": "0"}, 2, "10.0.0.2",
                     id="cyclic"),
    ],
)
def test_a_step_of_several_tasks_gives_nnodes_rank_and_master(env, rank, address):
    found = nodes(env)

    assert (found.nnodes, found.node_rank, found.master, found.node_address) == (4, rank, "10.0.0.1:21234", address)
    assert found.describe() == (f"Slurm job 12 step 0: 4 nodes, this is node {rank}, rendezvous on 10.0.0.1:21234 "
                                "(port SLURM_STEP_RESV_PORTS=21234-21236)")


def test_the_rendezvous_port_is_the_one_select_would_give_the_first_task():
    derived = {key: value for key, value in STEP.items() if key != "SLURM_STEP_RESV_PORTS"}

    assert nodes(derived).master_port == 20000 + 8 * (12 * 5 + 0)  # environments/slurm.py's derived ports
    assert nodes({**STEP, "TFSTRATEGY_SLURM_PORT": "30000"}).master_port == 30000
    assert nodes({**derived, "SLURM_STEP_ID": "3"}).master_port != nodes(derived).master_port


@pytest.mark.parametrize(
    ("env", "explicit"),
    [
        pytest.param({}, False, id="not-under-slurm"),
        pytest.param({"SLURM_JOB_ID": "12", "SLURM_NTASKS": "4", ENV_LAUNCH_SECRET: SECRET}, False,
                     id="batch-script-without-srun"),
        pytest.param({**STEP, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_NODELIST": "n1",
                      "SLURM_STEP_TASKS_PER_NODE": "1"}, False, id="one-task"),
        pytest.param({**STEP, "TFSTRATEGY_SLURM": "off"}, False, id="switched-off"),
        pytest.param(STEP, True, id="explicit-flags"),
        # Nothing of the step is read with explicit flags or off: not even its broken variables, nor the secret.
        pytest.param({**STEP, "SLURM_PROCID": "x", ENV_LAUNCH_SECRET: ""}, True, id="explicit-flags-bad-step"),
        pytest.param({**STEP, "SLURM_PROCID": "x", "TFSTRATEGY_SLURM": "0"}, False, id="switched-off-bad-step"),
    ],
)
def test_single_node_behaviour_is_kept(env, explicit):
    assert nodes(env, explicit=explicit) is None


@pytest.mark.parametrize(
    ("env", "secret_file", "message"),
    [
        pytest.param({**STEP, ENV_LAUNCH_SECRET: ""}, False,
                     r"^Received a Slurm job step of 4 tasks \(job 12 step 0\), so this launcher is node 1 of 4, but no "
                     r"shared secret; expected TFSTRATEGY_LAUNCH_SECRET exported before srun \(srun passes the "
                     r"environment on\) or --secret-file FILE on a path every node reads\. Make one with: export ",
                     id="no-secret"),
        pytest.param({**STEP, "SLURM_PROCID": "x"}, False,
                     r"SLURM_PROCID='x'.*which do not parse.*\(tfstrategy launch inside a Slurm job step: pass --nnodes, "
                     r"--node-rank and --master yourself, or set TFSTRATEGY_SLURM=off", id="rank-not-a-number"),
        pytest.param({**STEP, "SLURM_STEP_NODELIST": "n[1-2"}, False, r"SLURM_STEP_NODELIST='n\[1-2'.*do not parse",
                     id="unbalanced-node-list"),
        pytest.param({**STEP, "SLURMD_NODENAME": "n9"}, False, r"SLURMD_NODENAME='n9', which is not in SLURM_STEP_NODELIST",
                     id="node-not-in-step"),
        pytest.param({**STEP, "SLURM_STEP_RESV_PORTS": "ports"}, False, r"SLURM_STEP_RESV_PORTS='ports'; expected ports",
                     id="bad-reserved-ports"),
        pytest.param({**STEP, "SLURM_STEP_NODELIST": "n[1-2],n7", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
                      "SLURM_PROCID": "4", "SLURMD_NODENAME": "n7", "SLURM_LOCALID": "0"}, True,
                     r"^Received node 'n7' in SLURM_STEP_NODELIST, which does not resolve to an address here "
                     r"\(.*Name or service not known.*\); expected", id="unresolvable-node"),
        pytest.param({**STEP, "SLURM_STEP_NODELIST": "lo1,n2", "SLURMD_NODENAME": "lo1"}, True,
                     r"^Received node 'lo1' in SLURM_STEP_NODELIST, which resolves to 127\.0\.1\.1 here, a loopback "
                     r"address the other nodes of the step \(lo1,n2\) cannot reach; .*Fix /etc/hosts", id="loopback-master"),
    ],
)
def test_a_step_the_launcher_cannot_use_is_refused_in_one_line(env, secret_file, message):
    with pytest.raises(LaunchError, match=message) as error:
        nodes(env, secret_file=secret_file)
    assert "\n" not in str(error.value)


def test_a_step_on_one_machine_may_use_its_loopback_address():
    found = nodes({**STEP, "SLURM_STEP_NODELIST": "vm", "SLURMD_NODENAME": "vm", "SLURM_STEP_TASKS_PER_NODE": "2"})

    assert (found.nnodes, found.node_rank, found.master, found.node_address) == (2, 1, "127.0.0.1:21234", "127.0.0.1")


@pytest.mark.parametrize("nodelist", ["n1", "gpu[01-02,05],cpu1", "a[8-11]", "node-[009-011],x7,y[1-3]"])
def test_the_launchers_node_list_parser_agrees_with_tensorflows(nodelist):
    """The launcher reads the step without importing TensorFlow; its parsers must order nodes as select()'s do."""
    counts = ",".join(["2"] * 30)
    env = {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}

    assert read_slurm_step(env, parsers=PLAIN_PARSERS) == read_slurm_step(env)
    assert read_slurm_step({**env, "SLURM_STEP_TASKS_PER_NODE": counts}, parsers=PLAIN_PARSERS).tasks_per_node[:3] == (2, 2, 2)


def test_the_launcher_reads_the_step_without_importing_tensorflow():
    """TensorFlow's parsers would cost every launcher seconds of start-up before its first worker."""
    step = {**STEP, "SLURM_STEP_NODELIST": "localhost", "SLURMD_NODENAME": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2"}
    code = ("import sys; from tfstrategy.cli import build_parser; from tfstrategy.cli.launch import node_arguments; "
            f"args, slurm = node_arguments(build_parser().parse_args(['launch', '-n', '1', '--', 'true']), {step!r}); "
            "print(slurm.nnodes, slurm.node_rank, 'tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(ROOT / "src")})

    assert result.stdout.split() == ["2", "1", "False"], result.stderr[-2000:]


def test_the_launchers_node_list_parser_reads_names_with_several_ranges():
    """Slurm writes a suffix after a range, or several ranges, which TensorFlow's parser refuses."""
    expand = PLAIN_PARSERS[0]

    assert expand("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand("login[1-2]-ib,x") == ["login1-ib", "login2-ib", "x"]
    for bad in ("a[1-", "a]", "a[]", "a,,b", "a[2-1]"):
        with pytest.raises(ValueError):
            expand(bad)


# --- the CLI: explicit flags win; the worker's own TF_CONFIG wins over the step ---------------


def _args(*argv: str):
    return build_parser().parse_args(["launch", *argv, "--", "true"])


def test_explicit_flags_win_and_the_node_address_flag_alone_keeps_the_rest_from_the_step(monkeypatch):
    env = {**STEP, "SLURM_STEP_NODELIST": "vm", "SLURMD_NODENAME": "vm", "SLURM_STEP_TASKS_PER_NODE": "2"}

    derived, slurm = node_arguments(_args("-n", "1", "--node-address", "127.0.0.9"), env)
    assert slurm is not None and (derived.nnodes, derived.node_rank, derived.master) == (2, 1, "127.0.0.1:21234")
    assert derived.node_address == "127.0.0.9"
    explicit, slurm = node_arguments(_args("-n", "1", "--nnodes", "1"), env)
    assert slurm is None and (explicit.nnodes, explicit.node_rank, explicit.master) == (1, None, None)
    plain, slurm = node_arguments(_args("-n", "1"), {})
    assert slurm is None and plain.nnodes == 1
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    options = options_from_args(_args("-n", "1"))  # options_from_args alone takes the step too
    assert options.nodes is not None and (options.nodes.nnodes, options.nodes.node_rank) == (2, 1)


def test_an_elastic_nnodes_in_a_step_keeps_min_max_and_takes_rank_and_master_from_the_step():
    env = {**STEP, "SLURM_STEP_NODELIST": "vm", "SLURMD_NODENAME": "vm", "SLURM_STEP_TASKS_PER_NODE": "2"}
    derived, slurm = node_arguments(_args("-n", "1", "--nnodes", "1:3"), env)
    assert slurm is not None and (derived.min_nodes, derived.nnodes, derived.node_rank) == (1, 3, 1)
    assert derived.master == "127.0.0.1:21234"
    with pytest.raises(LaunchError, match=r"--nnodes 1:1 in a Slurm job step of 2 tasks; expected MAX >= the step's "
                                          r"tasks, one launcher a node, e\.g\. --nnodes 1:2"):
        node_arguments(_args("-n", "1", "--nnodes", "1:1"), env)


def test_a_worker_the_launcher_started_inside_a_step_uses_the_launchers_tf_config_not_the_step():
    """``srun -n 2 tfstrategy launch -n 2``: worker 3 of 4 runs in task 1 of the 2-task step, whose variables it inherits."""
    workers = [f"127.0.0.{i // 2 + 1}:{41000 + i}" for i in range(4)]
    tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": 3}})
    env = {**STEP, "SLURMD_NODENAME": "n2", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
           "TF_CONFIG": tf_config, "TFSTRATEGY_NUM_WORKERS": "4", "TFSTRATEGY_WORKER_INDEX": "3"}

    inputs = derive_inputs("hook", env=env)

    assert detect_environment(env).name == "tfstrategy launch" and cluster_from_slurm_step(env) is None
    assert (inputs.cluster_source, inputs.cluster.num_workers, inputs.cluster.task_index) == ("tfstrategy launch", 4, 3)
    assert list(inputs.cluster.cluster["worker"]) == workers


# --- under a real Slurm: srun -n 2 tfstrategy launch -n 1 ------------------------------------


@pytest.fixture(scope="module")
def cluster():
    from slurm_cluster import SlurmCluster, _processes_with_env

    cluster = SlurmCluster().start(timeout=60)
    yield cluster
    conf = str(cluster.conf)
    cluster.stop()
    assert _processes_with_env("SLURM_CONF", conf) == []


@pytest.mark.multiprocess
def test_srun_launch_diagnoses_uneven_shards_on_node_0_and_in_the_log_dir(cluster, tmp_path):
    """Two tasks of one step, one launcher each (two "nodes" on this machine), worker 1 one batch short."""
    from test_planted import HEADLINES, STALL, WORKER

    logs = tmp_path / "logs"
    variables = f"ALL,TF_CPP_MIN_LOG_LEVEL=2,PYTHONPATH={ROOT / 'src'},{ENV_LAUNCH_SECRET}={secrets.token_hex(16)}"
    srun = subprocess.Popen(
        [cluster._programs["srun"], "-n", "2", f"--export={variables}", sys.executable, "-m", "tfstrategy", "launch",
         "-n", "1", *STALL, "--log-dir", str(logs), "--run-id", "uneven", "--", sys.executable, str(WORKER), "uneven"],
        env=cluster.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    headline = re.compile(r"tfstrategy launch: (stall: )?(node \d:? )?" + HEADLINES["uneven"][0])
    lines, diagnosed = [], None
    guard = threading.Timer(300, srun.terminate)  # only a hung job: srun then cancels its step
    guard.start()
    try:
        for line in srun.stderr:  # the launchers' lines as they come, to time the diagnosis
            lines.append(line.rstrip("\n"))
            if diagnosed is None and headline.match(line):
                diagnosed = time.time()
        code = srun.wait(timeout=60)
    finally:
        guard.cancel()
        if srun.poll() is None:
            srun.terminate()
            srun.wait(30)
    err = "\n".join(lines)

    assert code != 0 and diagnosed is not None, err[-5000:]
    steps = re.findall(r"^tfstrategy launch: Slurm job \d+ step \d+: 2 nodes, this is node 0, rendezvous on "
                       r"127\.0\.0\.1:\d+ \(port SLURM_STEP_RESV_PORTS=\S+\)$", err, re.MULTILINE)
    assert len(steps) == 1, err[-5000:]
    assert "starting 1 worker(s) (worker 0 of 2)" in err and "starting 1 worker(s) (worker 1 of 2)" in err
    run = logs / "uneven"  # --run-id: both nodes' launchers write one run's folder
    text = (run / "attempt-0" / "failure.txt").read_text()
    record = json.loads((run / "attempt-0" / "failure.json").read_text())
    assert re.match(r"(stall: )?(node \d:? )?" + HEADLINES["uneven"][0], text), text[:2000]
    assert record["worker"] == 1 and re.match(HEADLINES["uneven"][0], record["diagnosis"][0]), record
    planted = float(re.search(r"planted uneven at ([0-9.]+)", (run / "attempt-0" / "worker-1" / "stdout.log")
                              .read_text()).group(1))
    print(f"\nsrun -n 2 tfstrategy launch -n 1: {headline.search(err).group(0)} "
          f"({diagnosed - planted:.1f} s after worker 1's last batch)")


@pytest.mark.multiprocess
def test_srun_launch_elastic_loses_a_task_goes_on_and_takes_a_new_step_back(cluster, tmp_path):
    """``srun -n 2 tfstrategy launch --nnodes 1:2``: task 1's launcher is SIGKILLed at step 10 (a node lost: task 0
    goes on alone from step 10), then a new step of the same job (``srun --jobid``) joins as node 1; the job ends
    with one device's weights."""
    from test_elastic_job import GUARD, TOLERANCE, WORKER, _one_device_weights

    from slurm_cluster import _processes_with_env
    from tfstrategy.launch.elastic import newest_committed_step

    backup, out = tmp_path / "backup", tmp_path / "out"
    out.mkdir()
    backup.mkdir(mode=0o700)
    (out / "gate").write_text("10")
    secret = secrets.token_hex(16)
    variables = f"ALL,TF_CPP_MIN_LOG_LEVEL=2,PYTHONPATH={ROOT / 'src'},{ENV_LAUNCH_SECRET}={secret}"
    job = ["-n", "1", "--backup-dir", str(backup), "--timeout", "120", "--grace", "60", "--", sys.executable,
           str(WORKER), "--out", str(out)]

    def srun(tasks: int, *launch: str, step_of: str | None = None) -> tuple[subprocess.Popen, list[str]]:
        within = [] if step_of is None else ["--jobid", step_of, "--overlap"]  # a new step of that job's allocation
        process = subprocess.Popen(
            [cluster._programs["srun"], *within, "-n", str(tasks), f"--export={variables}", sys.executable, "-m", "tfstrategy",
             "launch", *launch, *job], env=cluster.env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True)
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(line.rstrip("\n") for line in process.stderr), daemon=True).start()
        return process, lines

    def wait(done, what: str) -> None:
        deadline = time.monotonic() + GUARD
        while not done():
            assert time.monotonic() < deadline, f"gave up waiting for {what}:\n" + "\n".join(lines[-30:])
            time.sleep(0.1)

    step, lines = srun(2, "--nnodes", "1:2", "--rendezvous-wait", "60")
    rejoined = None
    try:
        wait(lambda: newest_committed_step(backup) == 10, "step 10 committed by both tasks")
        job_id, master = re.search(r"Slurm job (\d+) step \d+: .* rendezvous on (127\.0\.0\.1:\d+)",
                                   "\n".join(lines)).groups()
        task_1 = [pid for pid in _processes_with_env("SLURM_PROCID", "1")
                  if b"tfstrategy\0launch" in open(f"/proc/{pid}/cmdline", "rb").read()
                  and str(out).encode() in open(f"/proc/{pid}/cmdline", "rb").read()]
        assert len(task_1) == 1, task_1
        os.kill(task_1[0], signal.SIGKILL)
        wait(lambda: any("node 1 lost: going on with 1 node (1 worker) from step 10" in line for line in lines),
             "task 0 to go on alone")
        (out / "gate").write_text("20")
        wait(lambda: newest_committed_step(backup) == 20, "step 20 committed by task 0 alone")
        rejoined, back = srun(1, "--nnodes", "1:2", "--node-rank", "1", "--master", master, step_of=job_id)
        wait(lambda: any("node 1 joined: going on with 2 nodes (2 workers)" in line for line in lines), "node 1 back")
        (out / "gate").unlink()
        assert rejoined.wait(GUARD) == 0, "\n".join(back[-30:])
        step.wait(GUARD)
    finally:
        for process in (step, rejoined):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)
    assert any("this node's 1 worker exited 0" in line for line in lines), "\n".join(lines[-30:])
    reference = _one_device_weights()
    for index in (0, 1):
        final = json.loads((out / f"worker-{index}.json").read_text())
        assert (final["workers"], final["steps"]) == (2, 50)
        worst = max(float(abs(np.asarray(w) - r).max()) for w, r in zip(final["weights"], reference))
        assert worst <= TOLERANCE, f"weights differ from one device's by {worst:.2e}"
