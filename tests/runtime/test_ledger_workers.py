"""Two launched workers keep their ledgers (issue 38): the same batches and the same fingerprints on both."""

from __future__ import annotations

import sys

import pytest

from helpers import ROOT, run_cli
from tfstrategy.launch.ledger import read_ledger

WORKER = ROOT / "tests" / "workers" / "ledger_fit_worker.py"


@pytest.mark.multiprocess
def test_two_workers_ledgers_agree_on_batches_and_fingerprints(tmp_path):
    result = run_cli("launch", "-n", "2", "--timeout", "120", "--", sys.executable, str(WORKER), "--out",
                     str(tmp_path), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ledgers = [read_ledger(tmp_path / f"worker-{index}.ledger") for index in (0, 1)]
    assert None not in ledgers
    for ledger in ledgers:
        assert (ledger.epoch, ledger.batches, ledger.steps, ledger.total_steps) == (1, 8, 8, 16)
        assert ledger.extra["epoch_steps"] == 8 and ledger.extra["loop"] == "fit" and ledger.end_of_data == ()
        assert "ledger_fit_worker.py:" in ledger.frame and ledger.step_seconds is not None
        assert [trace.kind for trace in ledger.functions][:1] == ["train"]
        assert ledger.functions[0].collectives  # the gradients' all-reduce across the two workers
    first, second = ([(trace.kind, trace.fingerprint) for trace in ledger.functions] for ledger in ledgers)
    assert first == second
