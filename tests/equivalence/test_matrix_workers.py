"""The equivalence matrix on 2 workers: several cells in one ``tfstrategy launch -n 2`` job of an unchanged script
(tests/workers/equivalence_worker.py, whose ``MirroredStrategy()`` joins the job's MultiWorkerMirroredStrategy,
one replica per worker), each compared with the same cell on one device in this process."""

from __future__ import annotations

import json
import sys

import pytest

import matrix_cells
from helpers import ROOT, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess,
              pytest.mark.over_ceiling(seconds=240, reason="the module's first test carries the one launch job of its 16 "
                                                            "cells (40-45 CPU-s; 47-55 s alone, more beside other jobs)")]
WORKER = ROOT / "tests" / "workers" / "equivalence_worker.py"


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory) -> dict:
    # Ports come from this pytest worker's TFSTRATEGY_PORT_RANGE (conftest), which launch reads by default.
    out = tmp_path_factory.mktemp("workers") / "equivalence.json"
    done = run_cli("launch", "-n", "2", "--timeout", "90", "--", sys.executable, str(WORKER), "--out", str(out),
                   *matrix_cells.WORKER_CELLS, timeout=220)
    assert done.returncode == 0 and out.exists(), f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_the_job_gave_the_script_two_workers(worker_results):
    assert worker_results["replicas"] == 2  # else the comparisons below compare one device with itself
    assert worker_results["local_replicas"] == 1  # one replica per worker: the all-reduce crossed processes


@pytest.mark.parametrize("cell", matrix_cells.group_params("workers"))
def test_two_workers_match_one_device(cell, worker_results):
    matrix_cells.assert_group_cell_equal("workers", cell, worker_results)
