"""Sampling every thread's stack does not freeze the process when a collection frees a ``threading.local``.

CPython before 3.11.9 and 3.12.3 (python/cpython#106883) deadlocks there: ``sys._current_frames()`` holds the
thread list's lock while it allocates frame objects, a collection starts, frees a ``threading.local``, whose
clean-up takes the same lock. A launched worker's heartbeat samples every beat (the ledger), and a job of the
equivalence matrix froze that way, one in three beside other jobs. Each case runs in a process of its own:
a deadlock would otherwise freeze pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers import ROOT

SCRIPT = textwrap.dedent("""
    import gc, sys, threading, time
    from tfstrategy.stacks import current_frames

    def churn():
        while True:
            time.sleep(0.001)

    for _ in range(3):
        threading.Thread(target=churn, daemon=True).start()
    sample = {"ours": current_frames, "sys": sys._current_frames}[sys.argv[1]]
    gc.set_threshold(1)  # a collection at every allocation: the frame objects the sample makes start one
    for _ in range(2000):
        garbage = {"local": threading.local()}
        garbage["self"] = garbage  # a cycle: only a collection frees it, and the threading.local with it
        del garbage
        def deep(n):
            return sample() if n == 0 else deep(n - 1)
        frames = deep(5)
    assert threading.main_thread().ident in frames
    print("sampled", gc.isenabled(), flush=True)
""")


def _sample(which: str, timeout: float) -> subprocess.CompletedProcess | None:
    """The script's run, or ``None`` if it was still running after ``timeout`` s (frozen; then killed)."""
    try:
        return subprocess.run([sys.executable, "-c", SCRIPT, which], capture_output=True, text=True, timeout=timeout,
                              env={"PYTHONPATH": str(ROOT / "src")})
    except subprocess.TimeoutExpired:
        return None


def test_our_sample_of_every_threads_stack_survives_collections_that_free_thread_locals():
    done = _sample("ours", timeout=110)  # 2 s alone; the bound only catches a freeze
    assert done is not None, "current_frames() froze the process"
    assert done.returncode == 0 and done.stdout == "sampled True\n", done.stderr  # and the collector is back on


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info >= (3, 12, 3) or (3, 11, 9) <= sys.version_info < (3, 12),
                    reason="this CPython has the fix of python/cpython#106883")
def test_upstream_cpython_still_freezes_in_sys_current_frames():
    """Canary: fails once this interpreter no longer freezes (then ``current_frames`` may go)."""
    assert _sample("sys", timeout=20) is None
