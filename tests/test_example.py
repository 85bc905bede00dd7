"""examples/train.py (the how-to's steps 2-4) runs end to end on 2 replicas."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.slow
def test_example_trains_one_epoch_on_two_replicas():
    environment = {key: value for key, value in os.environ.items() if not key.startswith("TFSTRATEGY_")}
    result = subprocess.run(
        [sys.executable, "examples/train.py", "--cpu-replicas", "2", "--epochs", "1", "--steps-per-execution", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**environment, "TF_CPP_MIN_LOG_LEVEL": "2"},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert out.startswith("strategy MirroredStrategy with 2 replica(s)")
    assert "  per_replica_batch 128\n  drop_remainder True\n  dataset_size 10000\n  steps_per_epoch 39" in out
    assert "  drop_remainder False\n  dataset_size 2000\n  steps_per_epoch 8\n  last_batch 208" in out
    assert "39/39" in out  # Keras' progress bar reached the last step
    final = dict(item.split("=") for item in out.strip().splitlines()[-1].removeprefix("final ").split())
    assert set(final) == {"loss", "mae", "val_loss", "val_mae"}
    assert all(math.isfinite(float(value)) for value in final.values())
