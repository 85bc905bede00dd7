"""`tfstrategy launch` with real processes: supervision, fit on 2 workers, restart after a kill.

Every run is bounded in time and tagged through its environment, so each test can check that
no worker (nor a worker's child) is left behind. TensorFlow workers are started as few times
as possible: the uninterrupted 2-worker run is shared by the tests that need it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from docs_samples import assert_sample
from helpers import ROOT
from tfstrategy.cli import build_parser
from tfstrategy.cli.launch import options_from_args
from tfstrategy.errors import LaunchError

FIT_WORKER = ROOT / "tests" / "workers" / "fit_worker.py"
PLAIN_WORKER = ROOT / "tests" / "workers" / "plain_worker.py"
TAG = "TFSTRATEGY_TEST_RUN"


def _tagged(tag: str) -> list[int]:
    """Pids of live processes whose environment carries ``tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"{TAG}={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _described(pids: list[int]) -> list[str]:
    """``pid: command line`` of each live (not zombie) process of ``pids``."""
    found = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(f"{pid}: {command.strip()}")
    return found


class Run:
    """One `tfstrategy launch` process, tagged so its descendants can be found."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, stdout: int = subprocess.PIPE) -> None:
        self.tag = uuid.uuid4().hex
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", TAG: self.tag, **(env or {})}
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tfstrategy", "launch", *args], cwd=ROOT, env=env, text=True,
            stdout=stdout, stderr=subprocess.PIPE,
        )

    def finish(self, timeout: float) -> tuple[int, str, str, float]:
        """Wait for the launcher (``timeout`` only guards against a hang); what it left alive is in ``survivors``."""
        try:
            out, err = self.process.communicate(timeout=timeout)
        finally:
            if self.process.poll() is None:  # a hung launcher must not outlive the test
                self.process.kill()
                self.process.communicate()
            #: Every process of the job still alive when its launcher had returned (its workers, their
            #: children, the launcher's reaper): none should be.
            self.survivors = _described(_tagged(self.tag))
            for pid in _tagged(self.tag):
                os.kill(pid, signal.SIGKILL)
        return self.process.returncode, out, err, time.monotonic() - self.started


def _launch(*args: str, timeout: float) -> tuple[int, str, str, float]:
    run = Run(*args)
    result = run.finish(timeout)
    assert run.survivors == [], result[2]
    return result


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["-n", "2"], "Received no command to run", id="no-command"),
        pytest.param(["-n", "0", "--", "true"], "Received -n 0; expected 1 or more", id="zero-workers"),
        pytest.param(["-n", "2", "--max-restarts", "-1", "--", "true"], "--max-restarts -1", id="negative-restarts"),
        pytest.param(["-n", "2", "--timeout", "-5", "--", "true"], "--timeout -5; expected seconds > 0", id="negative-timeout"),
        pytest.param(["-n", "2", "--", "no-such-program-xyz"], "'no-such-program-xyz', which is not an executable", id="unknown-program"),
        pytest.param(["-n", "2", "--timeout", "nan", "--", "true"], "--timeout nan; expected seconds > 0", id="nan-timeout"),
        pytest.param(["-n", "2", "--timeout", "inf", "--", "true"], "--timeout inf; expected seconds > 0", id="infinite-timeout"),
        pytest.param(["-n", "2", "--grace", "-1", "--", "true"], "--grace -1; expected seconds >= 0", id="negative-grace"),
        pytest.param(["-n", "2", "--", str(ROOT / "README.md")], "README.md', a file that is not executable", id="not-executable"),
        pytest.param(["-n", "2", "--backup-dir", "/proc/1/nope", "--", "true"], "--backup-dir /proc/1/nope, which cannot be created",
                     id="backup-dir-cannot-be-created"),
        pytest.param(["-n", "2", "--tee", "--", "true"], "--tee without --log-dir", id="tee-without-log-dir"),
        pytest.param(["-n", "2", "--console-workers", "a,1", "--", "true"], "--console-workers 'a,1'; expected comma",
                     id="console-workers-not-numbers"),
        pytest.param(["-n", "2", "--console-workers", "5", "--", "true"], "--console-workers with 5; expected worker "
                     "indices 0..1", id="console-workers-out-of-range"),
        pytest.param(["-n", "2", "--stall-timeout", "-1", "--", "true"], "--stall-timeout -1; expected seconds > 0",
                     id="negative-stall-timeout"),
        pytest.param(["-n", "2", "--stall-report", "0", "--", "true"], "--stall-report 0; expected seconds > 0",
                     id="zero-stall-report"),
        pytest.param(["-n", "2", "--log-dir", str(ROOT / "README.md"), "--", "true"], "--log-dir .*README.md, which is "
                     "a file", id="log-dir-is-a-file"),
        pytest.param(["-n", "2", "--port-range", "29500:29599", "--", "true"], "--port-range '29500:29599'; expected "
                     "LOW-HIGH", id="port-range-not-low-high"),
        pytest.param(["-n", "2", "--port-range", "80-90", "--", "true"], "--port-range 80-90; expected 1024 <= LOW",
                     id="port-range-privileged"),
        pytest.param(["-n", "2", "--port-range", "29600-29500", "--", "true"], "--port-range 29600-29500; expected "
                     "1024 <= LOW <= HIGH", id="port-range-reversed"),
        pytest.param(["-n", "3", "--port-range", "29500-29501", "--", "true"], "--port-range 29500-29501, 2 port.s. "
                     "for -n 3; expected at least one port per worker", id="port-range-too-small"),
        pytest.param(["-n", "2", "--run-id", "exp1", "--", "true"], "--run-id without --log-dir", id="run-id-without-log-dir"),
        pytest.param(["-n", "2", "--log-dir", "/tmp", "--run-id", "../up", "--", "true"], "--run-id '../up'; expected "
                     "one folder name", id="run-id-a-path"),
        pytest.param(["-n", "2", "--log-dir", "/tmp", "--run-id", ".hidden", "--", "true"], "--run-id '.hidden'",
                     id="run-id-hidden"),
    ],
)
def test_invalid_options_are_refused_before_starting(argv, message):
    with pytest.raises(LaunchError, match=message):
        options_from_args(build_parser().parse_args(["launch", *argv]))


def test_each_run_with_a_log_dir_gets_a_folder_of_its_own(monkeypatch, tmp_path):
    """Issue 45 point 10: --run-id, else TFSTRATEGY_RUN_ID, else a new id (its start time and a random part)."""
    def options(*argv: str):
        return options_from_args(build_parser().parse_args(["launch", "-n", "2", *argv, "--", "true"]))

    monkeypatch.delenv("TFSTRATEGY_RUN_ID", raising=False)
    first, second = options("--log-dir", str(tmp_path)), options("--log-dir", str(tmp_path))
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", first.run_id) and first.run_id != second.run_id
    assert first.run_log_dir == tmp_path / first.run_id
    from tfstrategy.cli.launch import _command_line  # --isolate-network runs it again: in the same folder

    line = _command_line(first, debug=False)
    assert line[line.index("--run-id") + 1] == first.run_id
    assert options().run_id is None and options().run_log_dir is None  # no --log-dir: no folder
    monkeypatch.setenv("TFSTRATEGY_RUN_ID", "from-env")
    assert options("--log-dir", str(tmp_path)).run_log_dir == tmp_path / "from-env"
    assert options("--log-dir", str(tmp_path), "--run-id", "exp1").run_id == "exp1"  # the flag wins
    assert options().run_id is None  # the variable alone asks for no log directory
    monkeypatch.setenv("TFSTRATEGY_RUN_ID", "a/b")
    with pytest.raises(LaunchError, match="Received TFSTRATEGY_RUN_ID 'a/b'; expected one folder name"):
        options("--log-dir", str(tmp_path))


def test_the_ports_of_a_range_are_tried_in_an_order_of_the_launchers_own():
    """``tfstrategy.launch()`` runs in the caller's process (a notebook): the order it tries a range's ports in
    leaves Python's shared random numbers, which the notebook may have seeded, alone."""
    import random

    from tfstrategy.launch.processes import free_ports

    random.seed(3)
    state = random.getstate()
    ports = free_ports(2, port_range=(40100, 40199))
    assert random.getstate() == state
    assert len(set(ports)) == 2 and all(40100 <= port <= 40199 for port in ports)


def test_port_range_comes_from_the_flag_else_the_environment(monkeypatch):
    def port_range(*argv: str):
        return options_from_args(build_parser().parse_args(["launch", "-n", "2", *argv, "--", "true"])).port_range

    monkeypatch.delenv("TFSTRATEGY_PORT_RANGE", raising=False)  # a parallel run sets it (conftest.py)
    assert port_range() is None
    monkeypatch.setenv("TFSTRATEGY_PORT_RANGE", "31000-31099")
    assert port_range() == (31000, 31099)
    assert port_range("--port-range", "29500-29501") == (29500, 29501)  # the flag wins
    monkeypatch.setenv("TFSTRATEGY_PORT_RANGE", "lots")
    with pytest.raises(LaunchError, match="Received TFSTRATEGY_PORT_RANGE 'lots'; expected LOW-HIGH"):
        port_range()


def test_ports_of_a_range_skip_the_ones_in_use_and_refuse_when_too_few_are_free():
    from tfstrategy.launch.processes import free_ports

    held = []
    try:
        for port in range(29700, 29710):  # every port of a 12-port range but two, held on another address
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.2", port))
            except OSError:  # held by someone else already: just as good
                sock.close()
                continue
            held.append(sock)
        free = set(range(29700, 29712)) - {sock.getsockname()[1] for sock in held}
        picked = free_ports(2, port_range=(29700, 29711))
        assert len(set(picked)) == 2 and set(picked) <= free  # a port bound on any address is not handed out
        with pytest.raises(LaunchError, match=rf"--port-range 29700-29711, in which {len(free)} port\(s\) are free; "
                           rf"expected {len(free) + 1}"):
            free_ports(len(free) + 1, port_range=(29700, 29711))
    finally:
        for sock in held:
            sock.close()


def test_a_port_whose_connections_linger_in_time_wait_is_free_and_a_listening_one_is_not():
    """A worker that ended leaves its accepted connections in TIME_WAIT on its port for a minute; TensorFlow binds the
    port again at once (SO_REUSEADDR), so an elastic job re-formed on a one-port --port-range must not wait."""
    from tfstrategy.launch.processes import free_ports

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the server's side closes first: its end of the connection waits in TIME_WAIT on `port`
    client.close()
    with pytest.raises(LaunchError, match=f"--port-range {port}-{port}, in which 0 port"):
        free_ports(1, port_range=(port, port))  # still listening
    listener.close()
    assert free_ports(1, port_range=(port, port)) == [port]


@pytest.mark.multiprocess
def test_workers_listen_on_ports_of_the_port_range():
    code, _, err, _ = _launch("-n", "2", "--port-range", "29800-29899", "--", sys.executable, str(PLAIN_WORKER),
                              "bind", timeout=120)
    ports = [int(port) for port in re.findall(r"127\.0\.0\.1:(\d+)", err.split("starting 2 worker(s) on ", 1)[1].splitlines()[0])]
    assert code == 0, err
    assert len(set(ports)) == 2 and all(29800 <= port <= 29899 for port in ports), err


def test_options_from_command_line():
    options = options_from_args(build_parser().parse_args(["launch", "-n", "3", "--timeout", "0", "--", "python3", "t.py", "-n", "1"]))
    assert (options.num_workers, options.command, options.join_timeout) == (3, ("python3", "t.py", "-n", "1"), None)


@pytest.mark.multiprocess
def test_failed_worker_stops_the_others_and_its_last_lines_are_shown_once():
    code, out, err, _ = _launch("-n", "3", "--", sys.executable, str(PLAIN_WORKER), "fail", timeout=60)
    assert code == 1  # a worker failed; its own status is in the report
    assert "[worker 1] line 29" in out and "[worker 2] ready" in out
    assert "worker 1 exited with status 3" in err
    assert "  | " not in err and "the output of worker 1 is above (its [worker 1] lines)" in err  # shown live
    assert "stopped every worker" in err  # the launcher stopped workers 0 and 2 (they sleep for 600 s otherwise)


@pytest.mark.multiprocess
def test_a_failing_workers_traceback_is_on_the_console_once_on_stderr_then_a_short_report():
    """Issue 45 points 4 and 12: the traceback live (on stderr), and a report that does not repeat it."""
    code, out, err, _ = _launch("-n", "2", "--", sys.executable, str(PLAIN_WORKER), "raise", timeout=60)
    assert code == 1, err
    assert [line.split(" ", 3)[:3] for line in out.splitlines() if line.startswith("[worker 1]")] == \
        [["[worker", "1]", "ready"]], out  # its stdout; worker 0 may be stopped before its own line
    assert "Traceback" not in out, out
    traceback = [line for line in err.splitlines() if line.startswith("[worker 1] ")]
    assert traceback[0] == "[worker 1] Traceback (most recent call last):" and \
        traceback[-1] == "[worker 1] KeyError: 'accuracy'", err
    assert sum("KeyError: 'accuracy'" in line for line in err.splitlines()) == 2, err  # live, then the headline
    report = [line for line in err.splitlines() if not line.startswith("[worker ")]
    assert len(report) == 5, err  # starting, the headline, where its output is, stopped, the status line
    assert report[1].startswith("tfstrategy launch: worker 1 ") and "KeyError: 'accuracy' (at " in report[1], err
    assert report[2] == "the output of worker 1 is above (its [worker 1] lines)"


@pytest.mark.multiprocess
def test_ctrl_c_stops_every_worker_and_their_children():
    run = Run("-n", "2", "--", sys.executable, str(PLAIN_WORKER), "sleep")
    deadline = time.monotonic() + 60
    while len(_tagged(run.tag)) < 6 and time.monotonic() < deadline:  # launcher, reaper, 2 workers, 2 children
        time.sleep(0.1)
    assert len(_tagged(run.tag)) == 6
    run.process.send_signal(signal.SIGINT)
    code, out, err, _ = run.finish(timeout=30)
    assert code == 130
    assert "received SIGINT: passed it on; every worker stopped" in err
    # Issue 35: one line per worker, not their KeyboardInterrupt tracebacks.
    assert "KeyboardInterrupt" not in out + err and "Traceback" not in out + err
    for index in (0, 1):  # their own status: 1 after a KeyboardInterrupt, 130 if Python re-raised SIGINT
        assert re.search(rf"^tfstrategy launch: worker {index}: stopped by Ctrl-C \(SIGINT\)(; exit status 1)?$", err,
                         re.M), err
    assert run.survivors == []


@pytest.mark.multiprocess
def test_a_worker_leaving_before_joining_ends_the_job_at_once_naming_it():
    """Issue 38: worker 0 joined and waits, worker 1 exits 0 without joining: a verdict, not a 60 s hang."""
    code, _, err, _ = _launch("-n", "2", "--timeout", "20", "--", sys.executable, str(PLAIN_WORKER), "leave",
                              timeout=120)
    assert code == 1, err  # neither the join timeout (124) nor a stall (125): the exit itself ended the job
    assert "worker 1 exited with status 0 before joining, while worker(s) 0 wait for it" in err


CHILDREN_AFTER_LAUNCH = """
import json, os, sys
from pathlib import Path
from tfstrategy import launch

result = launch([sys.executable, sys.argv[1], "leave"], 2, join_timeout=20, max_restarts=1)
children = []
for entry in Path("/proc").iterdir():
    try:
        fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        continue
    if int(fields[1]) == os.getpid():
        children.append(f"{entry.name} {fields[0]}: " + (entry / "cmdline").read_bytes().replace(b"\\0", b" ").decode())
print(json.dumps({"returncode": result.returncode, "restarts": result.restarts, "children": children}))
"""


@pytest.mark.multiprocess
def test_every_helper_of_the_launcher_is_gone_when_launch_returns():
    """``launch()`` in a process of its own, which lists its children once it returned: no reaper, worker or orphan."""
    done = subprocess.run([sys.executable, "-c", CHILDREN_AFTER_LAUNCH, str(PLAIN_WORKER)], cwd=ROOT, text=True,
                          capture_output=True, timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["returncode"], report["restarts"]) == (1, 1), done.stderr  # left early twice: restarted, gave up
    assert report["children"] == [], done.stderr
    assert done.stderr.count("worker 1 exited with status 0 before joining") == 2, done.stderr


@pytest.mark.multiprocess
def test_worker_that_never_joins_is_named_within_the_timeout():
    code, _, err, _ = _launch("-n", "2", "--timeout", "3", "--", sys.executable, str(PLAIN_WORKER), "joined", timeout=60)
    assert code == 124
    assert "worker 1 did not join within --timeout 3 s: it never started creating its strategy" in err


def _namespaces_allowed() -> bool:
    probe = subprocess.run(["unshare", "--net", "--map-root-user", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.multiprocess
def test_isolated_network_keeps_wildcard_servers_off_the_host():
    run = Run("-n", "2", "--isolate-network", "--", sys.executable, str(PLAIN_WORKER), "listen")
    if not _namespaces_allowed():
        code, _, err, _ = run.finish(timeout=60)
        assert code == 2 and "does not allow a private network namespace" in err
        return
    assert run.process.stdout is not None
    ports = []
    deadline = time.monotonic() + 60
    while len(ports) < 2 and time.monotonic() < deadline:
        line = run.process.stdout.readline()
        if "peers reachable" in line:
            ports.append(int(line.split("0.0.0.0:")[1].split(";")[0]))
    assert len(ports) == 2  # bound to 0.0.0.0 inside, reachable from each other on 127.0.0.1
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
    run.process.send_signal(signal.SIGINT)
    code, _, err, _ = run.finish(timeout=30)
    assert code == 130 and "in a private network namespace" in err
    assert _tagged(run.tag) == []


# --- with TensorFlow ------------------------------------------------------------------------


def _fit_worker_module():
    spec = importlib.util.spec_from_file_location("fit_worker", FIT_WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _results(out_dir: Path) -> list[dict]:
    return [json.loads((out_dir / f"worker-{i}.json").read_text()) for i in range(2)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("uninterrupted")
    code, out, err, _ = _launch("-n", "2", "--timeout", "120", "--", sys.executable, str(FIT_WORKER), "--out", str(out_dir), timeout=240)
    assert code == 0, err[-3000:]
    return out_dir, out


@pytest.mark.multiprocess
def test_two_workers_fit_like_one_process(uninterrupted):
    out_dir, out = uninterrupted
    assert "[worker 0] strategy CollectiveAllReduceStrategy replicas 2" in out
    assert "[worker 1] strategy" not in out  # the same line as worker 0's: shown once
    import tensorflow as tf

    worker = _fit_worker_module()
    model, history = worker.train(tf.distribute.get_strategy(), epochs=3)
    for result in _results(out_dir):
        assert result["steps"] == 24
        np.testing.assert_allclose(result["history"]["loss"], history.history["loss"], atol=1e-5, rtol=0)
        for got, want in zip(result["weights"], model.get_weights()):
            np.testing.assert_allclose(np.array(got), want, atol=1e-5, rtol=0)


@pytest.mark.multiprocess
def test_every_worker_saves_but_only_the_chief_writes(uninterrupted):
    import keras

    out_dir, _ = uninterrupted
    chief, other = _results(out_dir)
    assert chief["saved"] == str(out_dir / "model.keras") and other["saved"] is None
    assert sorted(p.name for p in out_dir.iterdir()) == ["model.keras", "worker-0.json", "worker-1.json"]
    for got, want in zip(keras.saving.load_model(out_dir / "model.keras").get_weights(), chief["weights"]):
        np.testing.assert_array_equal(got, np.array(want, dtype=got.dtype))


@pytest.mark.multiprocess
def test_sigkilled_worker_is_restarted_and_resumes_to_the_same_weights(uninterrupted, tmp_path):
    reference = _results(uninterrupted[0])[0]
    code, out, err, _ = _launch(
        "-n", "2", "--max-restarts", "1", "--timeout", "120", "--",
        sys.executable, str(FIT_WORKER), "--out", str(tmp_path), "--kill-at", "1:3", timeout=360,
    )
    assert code == 0, err[-3000:]
    assert "[worker 1] killing myself at epoch 1 batch 3" in out
    assert "worker 1 was killed by SIGKILL" in err and "(restart 1 of 1)" in err
    assert_sample("restart", err)  # docs/guides/multi-worker.md shows this console
    for result in _results(tmp_path):
        assert result["restart"] == 1
        assert result["steps"] == reference["steps"]
        # Resumed from the end of epoch 0: epochs 1 and 2 repeat the uninterrupted losses.
        np.testing.assert_allclose(result["history"]["loss"], reference["history"]["loss"][1:], atol=1e-5, rtol=0)
        for got, want in zip(result["weights"], reference["weights"]):
            np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5, rtol=0)


@pytest.mark.multiprocess
def test_worker_that_never_starts_fails_the_job_within_the_timeout():
    """Worker 0 is creating its strategy (its starting file), worker 1 never began: the join timeout names both.

    Plain workers, so --timeout 3 s is not waited out by TensorFlow's start-up; a real TensorFlow worker writing
    its starting file is test_faults.py's early0 case, the policy test_policy.py's
    test_join_timeout_names_the_worker_that_never_started_joining."""
    code, out, err, _ = _launch("-n", "2", "--timeout", "3", "--", sys.executable, str(PLAIN_WORKER), "starting", timeout=60)
    assert code == 124
    assert "worker 1 did not join within --timeout 3 s: it never started creating its strategy" in err
    assert "worker 0 is creating its strategy" in err
    assert "[worker 1] stalling before TensorFlow starts" in out and "  | " not in err  # its lines once, live


@pytest.mark.multiprocess
def test_port_conflict_fails_the_job_with_a_clear_message(tmp_path):
    code, _, err, _ = _launch("-n", "2", "--timeout", "60", "--", sys.executable, str(FIT_WORKER), "--out", str(tmp_path), "--steal-port", timeout=120)
    assert code == 1  # the conflict itself ended the job, not --timeout (124)
    # Named as it raises (the process still exiting) or once it exited; either way with the port held.
    # The headline (the diagnosis when worker 0 already waits for it: "... the job cannot form"), then what the
    # launcher saw: the error and the port held.
    headline = next(line for line in err.splitlines() if re.match(r"tfstrategy launch: worker 1 (raised|exited)", line))
    assert "before joining" in headline
    report = err[err.index(headline):]
    assert "tfstrategy.errors.StrategyError: Received TF_CONFIG placing worker-1 at 127.0.0.1:" in report
    assert "held by another process" in report or "which another process holds" in report


@pytest.mark.multiprocess
def test_losing_the_output_reader_neither_stops_nor_hangs_the_job():
    """`tfstrategy launch ... | head -1`: the job goes on, its output is drained and discarded."""
    chatty = "import time\nfor i in range(400):\n    print('line', i, flush=True)\n    time.sleep(0.005)\n"
    run = Run("-n", "2", "--", sys.executable, "-c", chatty)
    assert run.process.stdout is not None
    assert run.process.stdout.readline().startswith("[worker ")
    run.process.stdout.close()  # what `head -1` does after its line
    try:
        code = run.process.wait(timeout=60)
    finally:
        if run.process.poll() is None:
            run.process.kill()
    err = run.process.stderr.read() if run.process.stderr else ""
    assert code == 0, err
    assert "the reader of the workers' output went away (BrokenPipeError); the job goes on" in err
    assert "Traceback" not in err
    assert _tagged(run.tag) == []


@pytest.mark.multiprocess
def test_a_detached_child_neither_hangs_the_launcher_nor_survives_the_job():
    code, _, err, _ = _launch("-n", "1", "--", "sh", "-c", "setsid sleep 300 & setsid sleep 301 >/dev/null 2>&1 & exit 0",
                              timeout=60)
    assert code == 0, err  # it returned, within the hang guard, while its sleeps hold the output pipe for 300 s
    # _launch asserts that no process of the run (the setsid sleeps included) is left.


def _wait_until_gone(tag: str, bound: float = 60.0) -> list[int]:
    """Wait for every process tagged ``tag`` to disappear (bounded generously); those left."""
    deadline = time.monotonic() + bound
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _tagged(tag)


@pytest.mark.multiprocess
def test_sigkilled_launcher_takes_its_workers_and_their_children_with_it():
    run = Run("-n", "2", "--", sys.executable, str(PLAIN_WORKER), "sleep")
    deadline = time.monotonic() + 60
    while len(_tagged(run.tag)) < 6 and time.monotonic() < deadline:  # launcher, reaper, 2 workers, 2 children
        time.sleep(0.1)
    before = _tagged(run.tag)
    assert len(before) == 6
    run.process.kill()
    killed = time.monotonic()
    run.process.wait()
    assert _wait_until_gone(run.tag) == []
    print(f"every process of the job gone {time.monotonic() - killed:.2f} s after SIGKILL of the launcher")
    run.finish(timeout=5)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sigkilled_launcher_mid_training_leaves_no_worker(tmp_path):
    example = [sys.executable, str(ROOT / "examples" / "multi_worker_train.py"), "--epochs", "50"]
    run = Run("-n", "2", "--timeout", "120", "--", *example, "--out", str(tmp_path / "m.keras"))
    assert run.process.stdout is not None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = run.process.stdout.readline()
        if "Epoch 2/" in line or not line:
            break
    assert "Epoch 2/" in line
    workers = [pid for pid in _tagged(run.tag) if pid != run.process.pid
               and b"multi_worker_train" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(workers) == 2
    run.process.kill()
    killed = time.monotonic()
    run.process.wait()
    assert _wait_until_gone(run.tag) == []
    print(f"both training workers gone {time.monotonic() - killed:.2f} s after SIGKILL of the launcher")
    run.finish(timeout=5)


@pytest.mark.multiprocess
def test_log_dir_keeps_each_workers_streams_and_the_report_says_where(tmp_path):
    code, out, err, _ = _launch("-n", "2", "--log-dir", str(tmp_path), "--", sys.executable, str(PLAIN_WORKER), "fail",
                                timeout=60)
    assert code == 1
    assert "[worker" not in out  # the files instead of the console
    # Issue 45 point 10: the run's own folder (its start time and a random part), said once.
    [run] = tmp_path.iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", run.name), run
    worker_1 = run / "attempt-0" / "worker-1"
    assert "line 29" in (worker_1 / "stdout.log").read_text()
    assert (f"tfstrategy launch: run {run.name}: each worker's output goes to {run}/attempt-0/worker-<i>/stdout.log "
            "and stderr.log") in err.splitlines()
    assert f"full output of worker 1: {worker_1}/stdout.log, {worker_1}/stderr.log" in err
    assert re.fullmatch(rf"tfstrategy launch: the job failed after [0-9.]+ s; exit status 1; output in {run}",
                        err.splitlines()[-1]), err.splitlines()[-1]


@pytest.mark.multiprocess
def test_log_dir_with_console_workers_shows_those_plain_logs_and_a_final_status_line(tmp_path):
    # Issue 35: --console-workers was ignored without --tee, colour codes landed in the files, and a
    # successful run with --log-dir ended without a word.
    code, out, err, _ = _launch("-n", "2", "--log-dir", str(tmp_path), "--run-id", "green", "--console-workers", "0",
                                "--",
                                sys.executable, "-c", "import os; print('\\x1b[32mgreen\\x1b[0m', "
                                "os.environ['TFSTRATEGY_WORKER_INDEX'])", timeout=60)
    assert code == 0, err
    assert out.splitlines() == ["[worker 0] \x1b[32mgreen\x1b[0m 0"]
    assert (tmp_path / "green" / "attempt-0" / "worker-1" / "stdout.log").read_text() == "green 1\n"
    assert re.fullmatch(rf"tfstrategy launch: 2 workers exited 0 in [0-9.]+ s; output in {tmp_path}/green",
                        err.splitlines()[-1]), err


@pytest.mark.multiprocess
def test_tee_with_console_workers_shows_only_those_on_the_console(tmp_path):
    code, out, err, _ = _launch("-n", "2", "--log-dir", str(tmp_path), "--run-id", "tee", "--tee", "--console-workers",
                                "0", "--",
                                sys.executable, "-c", "import os, sys; print('hi from', os.environ['TFSTRATEGY_WORKER_INDEX']); "
                                "print('to stderr', file=sys.stderr)", timeout=60)
    assert code == 0, err
    # Each stream to the launcher's own (issue 45 point 12): stderr with the launcher's lines.
    assert out.splitlines() == ["[worker 0] hi from 0"]
    assert "[worker 0] to stderr" in err.splitlines() and "[worker 1]" not in err, err
    assert (tmp_path / "tee" / "attempt-0" / "worker-1" / "stderr.log").read_text() == "to stderr\n"


@pytest.mark.multiprocess
def test_sigterm_ends_143_even_when_workers_ignoring_it_are_sigkilled_after_the_grace():
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(600)"
    run = Run("-n", "2", "--grace", "1", "--console-workers", "all", "--", sys.executable, "-c", stubborn)
    assert run.process.stdout is not None
    assert sorted(run.process.stdout.readline().strip() for _ in range(2)) == ["[worker 0] ready", "[worker 1] ready"]
    deadline = time.monotonic() + 60
    while len(_tagged(run.tag)) < 4 and time.monotonic() < deadline:  # launcher, reaper, 2 workers
        time.sleep(0.1)
    run.process.send_signal(signal.SIGTERM)
    code, _, err, _ = run.finish(timeout=30)
    assert code == 143, err
    assert "received SIGTERM: passed it on; every worker stopped" in err


LIVE_FIT = """
import time
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((np.zeros((96, 4), "float32"), np.zeros((96, 1), "float32")))
slow = tf.keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.1))
model.fit(data.batch(8).with_options(options), epochs=1, verbose=1, callbacks=[slow])
# Both workers leave fit together (an all-reduce), so their "trained" lines come well within the console's
# 1 s hold for a repeat: on a loaded machine worker 0's last progress-bar draw once took longer than that.
strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
print("trained")
"""


@pytest.mark.multiprocess
def test_on_a_terminal_worker_0s_progress_bar_is_live_and_worker_1s_repeats_are_shown_once(tmp_path):
    # Issue 35: under launch the bar showed no live update, and every Keras line came twice.
    import pty

    script = tmp_path / "fit.py"
    script.write_text(LIVE_FIT)
    terminal, launcher_side = pty.openpty()
    run = Run("-n", "2", "--timeout", "120", "--log-dir", str(tmp_path / "logs"), "--run-id", "live", "--tee", "--",
              sys.executable, str(script), stdout=launcher_side)
    os.close(launcher_side)
    chunks = []
    while True:
        try:
            chunk = os.read(terminal, 65536)
        except OSError:  # EIO: the launcher closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(terminal)
    code, _, err, _ = run.finish(timeout=240)
    out = b"".join(chunks).decode()
    assert code == 0, err[-3000:]
    live = set(re.findall(r"\r\[worker 0\] (?:\x1b\[1m)? *(\d+/\d+)", out))
    assert len(live) >= 3, out  # states of the bar as it advanced, drawn in place
    assert "[worker 0] trained" in out and "[worker 1]" not in out, out
    worker_1 = (tmp_path / "logs" / "live" / "attempt-0" / "worker-1" / "stdout.log").read_text()
    assert "trained" in worker_1 and "\x1b" not in worker_1  # the file keeps every line, without colour codes


LEDGER_WORKER = ROOT / "tests" / "workers" / "ledger_worker.py"


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["straggler", "healthy"])
def test_a_straggler_is_named_from_the_workers_ledger_files_while_the_job_runs_on(mode):
    """Issue 38: the launcher reads each worker's ledger file beside its progress file; the job is never stopped."""
    code, _, err, _ = _launch("-n", "3", "--timeout", "60", "--", sys.executable, str(LEDGER_WORKER), mode, timeout=120)
    assert code == 0, err
    named = [line for line in err.splitlines() if "straggler" in line]
    if mode == "healthy":
        assert named == []
    else:
        assert len(named) == 1 and named[0].startswith("tfstrategy launch: warning: worker 1 is a straggler: it waits "
                                                       "0.10 s a step for its input"), err
