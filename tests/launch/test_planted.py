"""Issue 38's planted causes on real TensorFlow workers: each gets its one-line diagnosis, a healthy job none.

``tests/workers/planted_worker.py CAUSE`` trains a tiny Keras model on two workers, worker 1 with
the cause; each case runs it under ``tfstrategy launch -n 2`` and checks the launcher's headline;
four of them also under ``--nnodes 2`` (one worker a node: node 0 diagnoses, and watches for a
straggler, over both nodes' worker views, as each node sends them over the rendezvous). A hang is
reported after ``--stall-report`` seconds without progress and fails the job after
``--stall-timeout``: each case waits for the launcher to end (its own timeout only guards a hang
of the test). The time from the cause to the diagnosis is printed (``-s``) for the issue's table.
"""

from __future__ import annotations

import re
import sys

import pytest
from test_launch import Run

from helpers import ROOT

WORKER = ROOT / "tests" / "workers" / "planted_worker.py"
STALL = ("--stall-report", "10", "--stall-timeout", "20")
#: The headline each cause gets (a regular expression searched in the launcher's report), and its exit status.
HEADLINES = {
    "uneven": (r"worker 1 (plans 7 batch\(es\) in epoch 1 while worker 0 plans 8|ran out of data after 7 batch\(es\) "
               r"of epoch 1 while worker 0 waits in batch 8): the shards differ by one batch", None),
    "different-step": (r"workers 0 and 1 traced different train functions \(step 1\)", None),
    "different-model": (r"workers 0 and 1 built different models: weight 1 is dense/kernel \(4, 8\) on worker 0 and "
                        r"dense/kernel \(4, 16\) on worker 1", None),
    "exit0": (r"worker 1 exited 0 before joining: the job cannot form", 1),
    "exit1": (r"worker 1 exited (with status )?1 before joining", 1),
    "slow-input": (r"warning: worker 1 is a straggler: it waits [0-9.]+ s a step for its input, [0-9.]+x its peers'", 0),
    "slow-step": (r"warning: worker 1 is a straggler: its steps take [0-9.]+x its peers' CPU", 0),
    # A py_function in dataset.map burns CPU on tf.data's threads: input the step waits for, not the step's CPU.
    "slow-map": (r"warning: worker 1 is a straggler: it waits [0-9.]+ s a step for its input, [0-9.]+x its peers'", 0),
}


def _report(cause: str, err: str) -> str:
    """The launcher's lines (its workers' output left out), for a failure message."""
    return f"{cause}:\n" + "\n".join(line for line in err.splitlines() if not line.startswith("  |"))[-4000:]


def _check(cause: str, code: int, err: str, seconds: float, where: str) -> None:
    if cause == "healthy":
        assert code == 0, _report(cause, err)
        assert not re.search(r"straggler|stall|diagnos|warning", err), _report(cause, err)
        return
    pattern, status = HEADLINES[cause]
    found = re.search(r"tfstrategy launch: (stall: )?(node \d:? )?" + pattern, err)
    assert found is not None, _report(cause, err)
    assert code == status if status is not None else code != 0, _report(cause, err)
    if cause.startswith("slow"):
        # Named while it runs, before it becomes a stall (a loaded machine may stall a peer for a moment).
        assert "stall: worker 1" not in err and "worker 1 stalled" not in err, _report(cause, err)
    stalled = re.search(r"found ([0-9.]+) s after its last progress", err)
    after = f"; stall found {stalled.group(1)} s after the last progress" if stalled else ""
    print(f"\n{where} {cause}: {found.group(0)} (launcher ended after {seconds:.0f} s{after})")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("cause", ["healthy", *HEADLINES])
def test_each_planted_cause_gets_its_diagnosis_on_one_node(cause):
    run = Run("-n", "2", *STALL, "--", sys.executable, str(WORKER), cause)
    code, _, err, seconds = run.finish(timeout=600)
    assert run.survivors == [], _report(cause, err)
    _check(cause, code, err, seconds, "launch -n 2")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("cause", ["uneven", "different-step", "exit0", "slow-input"])
def test_the_planted_causes_that_need_every_worker_are_diagnosed_on_node_0_of_two_nodes(cause):
    """Under --nnodes 2 (one worker a node) each node sends node 0 its worker's ledger view with its failure
    and while it runs: node 0 watches every worker of the job for a straggler."""
    from test_multinode import MASTER_HOST, _finish_all, _free_port, _node

    master = f"{MASTER_HOST}:{_free_port()}"
    job = ("-n", "1", "--timeout", "120", *STALL, "--", sys.executable, str(WORKER), cause)
    nodes = [_node(0, master, *job), _node(1, master, *job)]
    (code, _, err, seconds), _ = _finish_all(*nodes, timeout=300)
    _check(cause, code, err, seconds, "launch --nnodes 2 (node 0)")
