"""Helpers the tests share (importable as ``helpers``: pytest puts tests/ on the path)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

#: Logical CPUs conftest.py splits the CPU into before any test runs.
CPU_REPLICAS = 4
ROOT = Path(__file__).resolve().parent.parent


#: Set by conftest.py under pytest-xdist: each pytest worker's launches and helper-picked ports keep to a
#: range of their own below the kernel's ephemeral range, so no test takes a port another test picked.
PORT_RANGE_VARIABLE = "TFSTRATEGY_PORT_RANGE"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now: from ``$TFSTRATEGY_PORT_RANGE`` if set, else the kernel's pick."""
    from tfstrategy.launch.options import parse_port_range
    from tfstrategy.launch.processes import free_ports as pick

    text = os.environ.get(PORT_RANGE_VARIABLE, "").strip()
    return pick(count, host, parse_port_range(text) if text else None)


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


def run_example(name: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``examples/NAME`` with this Python in a fresh process, from the repository root."""
    return subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
