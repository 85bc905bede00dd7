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
#: That range in quarters: the tests' own picks take the first, the nodes of a two-node job the next two.
_PARTS = 4


def _part(index: int) -> tuple[int, int] | None:
    from tfstrategy.launch.options import parse_port_range

    text = os.environ.get(PORT_RANGE_VARIABLE, "").strip()
    if not text:
        return None
    low, high = parse_port_range(text)
    size = (high - low + 1) // _PARTS
    return low + index * size, low + (index + 1) * size - 1


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``host`` now: from this pytest worker's range if set, else the kernel's pick."""
    from tfstrategy.launch.processes import free_ports as pick

    return pick(count, host, _part(0))


def node_port_range(rank: int) -> list[str]:
    """``--port-range`` for node ``rank`` (0 or 1) of a two-node job on this machine: a part of the range of its own.

    Two launchers on one machine (127.0.0.2 and 127.0.0.3) that pick from one range can both pick a port
    the other's worker has not bound yet, and a TF_CONFIG naming one port twice on one machine is refused.
    Real nodes are separate machines. Empty without the variable (the kernel picks, as for users).
    """
    part = _part(1 + rank)
    return [] if part is None else ["--port-range", "{}-{}".format(*part)]


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
    """A MirroredStrategy over ``/cpu:0`` .. ``/cpu:{replicas-1}`` with collective keys of its own.

    Two plain MirroredStrategy objects share their collective keys; once a second
    one trains another model in this process, every later collective of the
    process (every later test of this pytest worker) fails with "Shape mismatch
    in the collective instance 100". tfstrategy's own allocator gives each its keys.
    """
    from tfstrategy.selection.strategies import mirrored_strategy

    return mirrored_strategy([f"/cpu:{i}" for i in range(replicas)])


def run_example(name: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run ``examples/NAME`` with this Python in a fresh process, from the repository root."""
    return subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def run_script_on_one_cpu(script: Path, *argv: str) -> str:
    """Run a user's ``script`` in this process with ``MirroredStrategy()`` on ``/cpu:0`` alone; its stdout.

    What ``python script`` (or ``tfstrategy run --cpu-replicas 1``) gives it on this one-CPU host, without a
    TensorFlow start-up of its own: the one-replica reference of a multi-replica run.
    """
    import contextlib
    import io
    import runpy

    import pytest
    import tensorflow as tf

    one_cpu = mirrored(1)

    class OneCpu(tf.distribute.MirroredStrategy):  # a subclass: tfstrategy reads the class's own attributes
        def __new__(cls, *args, **kwargs):
            return one_cpu  # not a OneCpu: its __init__ is not called again

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(tf.distribute, "MirroredStrategy", OneCpu)
        patch.setattr(sys, "argv", [str(script), *argv])
        runpy.run_path(str(script), run_name="__main__")
    return out.getvalue()
