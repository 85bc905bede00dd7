"""The equivalence matrix under the start-up hook: several cells in one ``tfstrategy run --cpu-replicas 2``
process (tests/workers/equivalence_worker.py, an unchanged script that makes its own ``MirroredStrategy()``),
each compared with the same cell on one device in this process."""

from __future__ import annotations

import json
import sys

import pytest

import matrix_cells
from helpers import ROOT, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
WORKER = ROOT / "tests" / "workers" / "equivalence_worker.py"


@pytest.fixture(scope="module")
def hook_results() -> dict:
    done = run_cli("run", "--cpu-replicas", "2", "--", sys.executable, str(WORKER), *matrix_cells.HOOK_CELLS,
                   timeout=100)
    lines = [line for line in done.stdout.splitlines() if line.startswith("EQUIVALENCE ")]
    assert done.returncode == 0 and lines, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1].removeprefix("EQUIVALENCE "))


def test_the_hook_gave_the_script_two_replicas(hook_results):
    assert hook_results["replicas"] == 2  # else the comparisons below compare one device with itself


@pytest.mark.parametrize("cell", matrix_cells.group_params("hook"))
def test_two_replicas_under_the_hook_match_one_device(cell, hook_results):
    matrix_cells.assert_group_cell_equal("hook", cell, hook_results)
