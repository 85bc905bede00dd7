"""Every MirroredStrategy tfstrategy makes in a process has collective keys of its own.

Two strategies with the same keys that train different models break the whole process:
the second fails with "Shape mismatch in the collective instance 100", and so does every
collective after it, whatever its keys (the full suite's failure on CI: a selection took
the keys of a patch's probe, and every later test of that pytest worker failed).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ROOT
from tfstrategy import _versions
from tfstrategy.selection.strategies import LOCAL_KEY_BASE
from tfstrategy.state.registry import KEY_STRIDE

SCRIPT = ROOT / "tests" / "workers" / "collective_keys_script.py"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(_versions.legacy_keras_requested(), reason="the probes that make strategies are Keras 3's")
def test_probes_and_selections_never_share_keys_where_plain_strategies_break_the_process():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr[-3000:]
    bases = [int(line.split()[1]) for line in lines if line.startswith("keys ")]
    ours, plain = bases[:-2], bases[-2:]
    assert len(ours) >= 2 + 8  # the two probes (and the registry's own, on first fit), 8 selections
    assert len(set(ours)) == len(ours), f"two strategies share collective keys: {ours}"
    assert all(LOCAL_KEY_BASE <= base <= 2**31 - 1 - KEY_STRIDE for base in ours)
    assert [line for line in lines if line.startswith("tfstrategy ")] == [f"tfstrategy {width} trained" for width in range(1, 9)]

    # Plain TensorFlow, the same way: the second strategy takes the first one's keys and fails.
    assert plain == [0, 0]
    assert "plain 3 trained" in lines
    failed = next(line for line in lines if line.startswith("plain 5 "))
    assert "failed" in failed and "Shape mismatch in the collective instance" in failed


def test_the_last_strategy_with_keys_of_its_own_is_made_and_the_next_is_refused_in_one_line(monkeypatch):
    from tfstrategy.errors import StrategyError
    from tfstrategy.selection.strategies import mirrored_strategy
    from tfstrategy.state.registry import RUNTIME

    monkeypatch.setattr(RUNTIME, "next_number", lambda counter, start=0: 11_473)
    assert mirrored_strategy(["/cpu:0"]).extended._collective_key_base == 2_147_300_000
    monkeypatch.setattr(RUNTIME, "next_number", lambda counter, start=0: 11_474)
    with pytest.raises(StrategyError, match=r"^Received a request for MirroredStrategy number 11,475 of this process; "
                                            r".* room for 11,474 .* start a new process\.$"):
        mirrored_strategy(["/cpu:0"])
