"""Shared test set-up.

Logical devices can only be configured before the TensorFlow runtime starts,
so the CPU is split into ``CPU_REPLICAS`` logical devices once, here, before any
test runs. Tests then use 1, 2 or 4 of them as replicas.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfstrategy.runtime import configure_cpu_replicas

CPU_REPLICAS = 4
configure_cpu_replicas(CPU_REPLICAS)

ROOT = Path(__file__).resolve().parent.parent
WATCHED_ENV_PREFIXES = ("TFSTRATEGY_", "TF_CONFIG", "CUDA_VISIBLE_DEVICES", "SLURM_")


def _watched_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key.startswith(WATCHED_ENV_PREFIXES)}


@pytest.fixture(autouse=True)
def no_leaked_environment():
    """Fail a test that leaves TFSTRATEGY_*/TF_CONFIG/... changed (use monkeypatch.setenv)."""
    before = _watched_env()
    yield
    after = _watched_env()
    if after != before:
        for key in set(before) | set(after):
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)
        pytest.fail(f"test leaked environment variables: before={before} after={after}")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``python -m tfstrategy ARGS`` in a fresh process, bounded in time."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "tfstrategy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
    )


@functools.cache
def mirrored(replicas: int):
    """A MirroredStrategy over ``/cpu:0`` .. ``/cpu:{replicas-1}``, one per count per process.

    Every MirroredStrategy numbers its collective groups from 1, so a 2-replica
    and a 4-replica strategy in one process both claim group 1 with different
    sizes, and every later collective aborts ("joining a group with size 2, but
    that group has size 4"). TensorFlow's ``_collective_key_base`` ("only set this
    in tests") gives each replica count its own range.
    """
    import tensorflow as tf

    previous = tf.distribute.MirroredStrategy._collective_key_base
    tf.distribute.MirroredStrategy._collective_key_base = 1000 * replicas
    try:
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    finally:
        tf.distribute.MirroredStrategy._collective_key_base = previous
