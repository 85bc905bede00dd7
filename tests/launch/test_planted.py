"""Issue 38's planted causes on real TensorFlow workers: each gets its one-line diagnosis, a healthy job none.

``tests/workers/planted_worker.py CAUSE`` trains a tiny Keras model on two workers, worker 1 with
the cause; each case runs it under ``tfstrategy launch -n 2`` and checks the launcher's headline;
one failure and one straggler also under ``--nnodes 2`` (one worker a node: node 0 diagnoses, and watches
for a straggler, over both nodes' worker views, as each node sends them over the rendezvous; every other
cause's two-node headline is tested over the real wire with fake nodes, ``test_nnodes_diagnosis``). A hang is
reported after ``--stall-report`` seconds without progress and fails the job after
``--stall-timeout``: each case follows node 0's console until its launcher ends (its own timeout
only guards a hang of the test); a straggler's job would go on, so the test stops it with Ctrl-C
once the warning is said. The headline and the seconds from the cause (the worker's ``planted ...
at`` line) to the moment the headline reached the console are printed (``-s``) for the issue's table.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from planted_causes import HEADLINES, PREFIX
from test_launch import Run

from docs_samples import assert_sample
from helpers import ROOT

WORKER = ROOT / "tests" / "workers" / "planted_worker.py"
#: A straggler's job is stopped with Ctrl-C once warned of: its workers get 2 s, not the default 10, to end.
STALL = ("--stall-report", "10", "--stall-timeout", "20", "--grace", "2")


def _report(cause: str, err: str) -> str:
    """The launcher's lines (its workers' output left out), for a failure message."""
    return f"{cause}:\n" + "\n".join(line for line in err.splitlines() if not line.startswith("  |"))[-4000:]


def _follow(runs: Sequence[Run], cause: str, *, timeout: float) -> tuple[int, str, str, float | None]:
    """Node 0's (``runs[0]``) exit status, output and console, and when (wall clock) the headline reached it.

    A straggler's warning leaves the job running: then every launcher gets Ctrl-C, which ends the case
    as soon as the warning is said. Every launcher is then waited for (``survivors`` checked). A job still
    running after ``timeout`` seconds gets Ctrl-C too (below the test's own limit), so that a headline that
    never came fails the case with the console that was said instead.
    """
    lead = runs[0].process
    pattern = re.compile(PREFIX + HEADLINES[cause][0]) if cause in HEADLINES else None
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(lead.stdout or ()), daemon=True)
    reader.start()
    err: list[str] = []
    seen = None
    guard = threading.Timer(timeout, lambda: [run.process.send_signal(signal.SIGINT) for run in runs
                                              if run.process.poll() is None])
    guard.start()
    for line in lead.stderr or ():
        err.append(line)
        if seen is None and pattern is not None and pattern.search(line):
            seen = time.time()
            if cause.startswith("slow"):
                for run in runs:
                    run.process.send_signal(signal.SIGINT)
    guard.cancel()
    reader.join(timeout)
    results = [run.finish(timeout) for run in runs]
    if seen is not None:
        print(f"\n(the launcher{'s' if len(runs) > 1 else ''} ended {time.time() - seen:.0f} s after the headline, "
              f"{results[0][3]:.0f} s after starting)", end="")
    for run, (_, _, rest, _) in zip(runs, results):
        assert run.survivors == [], _report(cause, "".join(err) + rest)
    others = "".join(result[1] + result[2] for result in results[1:])
    return results[0][0], "".join(out) + others, "".join(err), seen


def _check(cause: str, code: int, out: str, err: str, seen: float | None, where: str) -> None:
    if cause == "healthy":
        assert code == 0, _report(cause, err)
        assert not re.search(r"straggler|stall|diagnos|warning", err), _report(cause, err)
        return
    pattern, status = HEADLINES[cause]
    found = re.search(PREFIX + pattern, err)
    assert found is not None and seen is not None, _report(cause, err)
    if cause.startswith("slow"):
        # Named while it runs, before it becomes a stall (a loaded machine may stall a peer for a moment);
        # the job would go on (the test stopped it once the warning was said).
        assert "stall: worker 1" not in err and "worker 1 stalled" not in err, _report(cause, err)
        assert re.search(re.escape(found.group(0)) + r".*\n(  .*\n)*  the job goes on", err), _report(cause, err)
    else:
        assert code == status if status is not None else code != 0, _report(cause, err)
    planted = re.search(rf"planted {cause} at ([0-9.]+)", out + err)
    stalled = re.search(r"found ([0-9.]+) s after its last progress", err)
    after = (f"{seen - float(planted.group(1)):.1f} s after the cause" if planted else "the cause not timed"
             ) + (f"; stall found {stalled.group(1)} s after the last progress" if stalled else "")
    print(f"\n{where} {cause}: {found.group(0)} ({after})")


#: slow-input runs for real on two nodes (below), where the same ledger gives the same warning through node 0's watch.
ONE_NODE = ["healthy", *(cause for cause in HEADLINES if cause != "slow-input")]
#: One failure and one straggler run for real on two nodes; node 0's headline for every other cause, from the views
#: node 1 sends over the real wire, is ``test_nnodes_diagnosis``'s (``..._planted_causes_headline_...``,
#: ``..._each_planted_straggler_...``): the assertions of the two-node cases they replace, each cause's.
TWO_NODES = ["uneven", "slow-input"]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("cause", ONE_NODE)
def test_each_planted_cause_gets_its_diagnosis_on_one_node(cause):
    run = Run("-n", "2", *STALL, "--", sys.executable, str(WORKER), cause)
    code, out, err, seen = _follow([run], cause, timeout=90)
    _check(cause, code, out, err, seen, "launch -n 2")
    if cause == "uneven":  # the page shows this case's console
        assert_sample("uneven-shards", err)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("cause", TWO_NODES)
def test_the_planted_causes_are_diagnosed_on_node_0_of_two_nodes(cause):
    """Under --nnodes 2 (one worker a node) each node sends node 0 its worker's ledger view with its failure
    and while it runs: node 0 watches every worker of the job for a straggler. (A healthy job of two
    nodes gets no warning: ``test_multinode``'s ``two_by_one``.)"""
    from test_multinode import MASTER_HOST, _free_port, _node

    master = f"{MASTER_HOST}:{_free_port()}"
    job = ("-n", "1", "--timeout", "120", *STALL, "--", sys.executable, str(WORKER), cause)
    code, out, err, seen = _follow([_node(0, master, *job), _node(1, master, *job)], cause, timeout=90)
    _check(cause, code, out, err, seen, "launch --nnodes 2 (node 0)")
    if cause == "slow-input":  # the page shows node 0's warning
        assert_sample("straggler-input", err)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_worker_stopped_on_node_1_is_named_on_node_0_not_its_waiting_peer():
    """SIGSTOP on node 1's worker inside a step (slow-input: its steps are spent reading; stopped once node 0
    warned of it, so steps flow): node 0's worker aborts first, on TensorFlow's heartbeat, and reports; node 0
    names the stopped worker on node 1 from the views node 1 shares, its own worker's abort a consequence.
    Before that, node 0 says the stall as soon as node 1's views show the stopped worker."""
    from test_launch import _tagged
    from test_multinode import MASTER_HOST, _free_port, _node

    master = f"{MASTER_HOST}:{_free_port()}"
    job = ("-n", "1", "--timeout", "120", *STALL, "--", sys.executable, str(WORKER), "slow-input")
    node0, node1 = nodes = [_node(0, master, *job), _node(1, master, *job)]
    err: list[str] = []
    stopped = seen = said = None
    try:
        for line in node0.process.stderr or ():
            err.append(line)
            if stopped is None and "warning: worker 1 is a straggler" in line:
                worker = next(pid for pid in _tagged(node1.tag) if pid != node1.process.pid
                              and b"planted_worker.py" in Path(f"/proc/{pid}/cmdline").read_bytes())
                os.kill(worker, signal.SIGSTOP)
                stopped = time.time()
            elif said is None and line.startswith("tfstrategy launch: stall: node 1: worker 1 is stopped"):
                said = time.time()
            elif seen is None and line.startswith("tfstrategy launch: node 1: worker 1 is stopped"):
                seen = time.time()
    finally:
        if stopped is not None:
            with contextlib.suppress(OSError):
                os.kill(worker, signal.SIGCONT)
        results = [run.finish(300) for run in nodes]
    report = "".join(err) + results[0][2]
    assert all(run.survivors == [] for run in nodes), _report("sigstop", report)
    assert results[0][0] != 0 and None not in (stopped, said, seen), _report("sigstop", report)
    # (node 1's stall timeout may end the job first, its own failure diagnosed: the same headline)
    assert re.search(r"^tfstrategy launch: node 1: worker 1 is stopped \(SIGSTOP or a debugger\) after step \d+; its "
                     r"peers wait for it$", report, re.M), _report("sigstop", report)
    assert "node 0 worker 1" not in report and "stall: worker 0" not in report, _report("sigstop", report)
    print(f"\nlaunch --nnodes 2 (node 0) SIGSTOP on node 1: the stall said {said - stopped:.1f} s after the SIGSTOP, "
          f"the headline 'node 1: worker 1 is stopped' {seen - stopped:.1f} s after it")
