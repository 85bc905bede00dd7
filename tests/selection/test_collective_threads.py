"""tfstrategy's default collective timeout must not cost a thread per collective (docs/reference/upstream-bugs.md).

With a collective timeout TensorFlow sleeps it out on a thread of its own for every collective, so a worker
gained two threads a step and a fast job aborted after a few thousand steps (``Resource temporarily
unavailable``). Without a timeout the count stays flat.
"""

from __future__ import annotations

import json
import sys

import pytest

from helpers import ROOT, run_cli
from tfstrategy.settings import ENV_COLLECTIVE_TIMEOUT

WORKER = ROOT / "tests" / "workers" / "threads_worker.py"
STEPS = 300


@pytest.mark.multiprocess
def test_default_collective_timeout_keeps_threads_flat_over_steps(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_COLLECTIVE_TIMEOUT, raising=False)
    result = run_cli("launch", "-n", "2", "--timeout", "120", "--", sys.executable, str(WORKER), "--out",
                     str(tmp_path), "--steps", str(STEPS), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for index in (0, 1):
        counts = json.loads((tmp_path / f"worker-{index}.json").read_text())
        # 280 steps more: with a timeout that was 560 threads more; a few threads of TensorFlow's pools may start.
        assert counts["last"] - counts["first"] < 40, counts
        assert "collective timeout" not in counts["explain"]
