"""Each fault of a real 2-worker TensorFlow job, and the headline the launcher now prints for it.

Worker 1 of ``tests/workers/fault_worker.py`` has the fault; the launcher's report is checked
for the root cause, and stalls for how long after the worker's last progress they were found,
against the collective timeout (set to 120 s here, so a stall found by the launcher is found
long before TensorFlow would fail the job).
"""

from __future__ import annotations

import re
import sys
import time

import pytest
from test_launch import Run

from docs_samples import assert_sample
from helpers import ROOT

FAULT_WORKER = ROOT / "tests" / "workers" / "fault_worker.py"
COLLECTIVE_TIMEOUT = 120


def _fault(mode: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str, str, float]:
    run = Run("-n", "2", "--timeout", "120", *args, "--", sys.executable, str(FAULT_WORKER), mode,
              env={"TFSTRATEGY_COLLECTIVE_TIMEOUT": str(COLLECTIVE_TIMEOUT), **(env or {})})
    result = run.finish(timeout)
    assert run.survivors == [], result[2][-3000:]
    return result


def _headline(err: str) -> str:
    return next(line for line in err.splitlines() if re.match(r"tfstrategy launch: worker \d (?!joined|advances again)", line))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_crash_is_the_headline_with_the_users_frame_and_peers_errors_are_consequences():
    code, _, err, _ = _fault("crash")
    assert code == 1, err[-3000:]
    headline = _headline(err)
    print(headline)
    # Named from its error file as soon as it raised, before its process (TensorFlow's teardown) exits.
    assert re.match(r"tfstrategy launch: worker 1 (raised|exited with status 1:) ValueError: worker 1's bad batch",
                    headline)
    assert "fault_worker.py:" in headline and "in on_train_batch_end" in headline
    assert "worker 0" not in headline
    assert_sample("failure-report", err)  # docs/guides/multi-worker.md shows this report


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_worker_exiting_0_mid_training_is_named_at_once():
    code, out, err, _ = _fault("exit0")
    assert code == 1, err[-3000:]
    headline = _headline(err)
    print(headline)
    assert re.match(r"tfstrategy launch: worker 1 exited with status 0 after \d+ batch\(es\) while worker\(s\) 0 still "
                    r"wait for it inside a step: it left the job early", headline)
    assert "UnavailableError" not in headline


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_worker_exiting_0_before_joining_fails_the_job_at_once_not_at_the_timeout():
    code, _, err, seconds = _fault("early0")
    assert code == 1, err[-3000:]
    headline = _headline(err)
    print(headline, f"({seconds:.1f} s)")
    assert headline == "tfstrategy launch: worker 1 exited 0 before joining: the job cannot form"
    assert "  worker 0 is creating its strategy and waits for it" in err or "  worker 0 joined and waits for it" in err
    assert "  what the launcher saw: worker 1 exited with status 0 before joining, while worker(s) 0 wait for it" in err
    assert seconds < 120  # the --timeout; it fails as soon as worker 0 is creating its strategy


#: A stall is reported 5 s after the last progress (or 20 steps, if longer) and every worker's stack is dumped; the job
#: fails 10 s after the last progress (the test waits for that): seconds for the dumps to arrive, and still far from
#: anything a healthy worker of fault_worker.py (10 steps a second) does.
STALL_REPORT, STALL_TIMEOUT = 5, 10


def _stall(mode: str, headline: str = "tfstrategy launch: worker 1 stalled: it ") -> tuple[str, str, float]:
    """The stall's note (its diagnosis, if any, then what the launcher saw), the launcher's stderr (where the
    workers' stacks, on their stderr, arrive), when it was found."""
    code, _, err, _ = _fault(mode, "--stall-report", str(STALL_REPORT), "--stall-timeout", str(STALL_TIMEOUT))
    assert code == 125, err[-3000:]
    lines = err.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("tfstrategy launch: stall: worker 1"))
    note = "\n".join([lines[start], *(line for line in lines[start + 1:start + 12] if line.startswith("  "))])
    found = float(re.search(r"found ([0-9.]+) s after its last progress", note).group(1))
    print(f"{mode}: {note}\n{mode}: found {found:.1f} s after the last progress; collective timeout "
          f"{COLLECTIVE_TIMEOUT} s; headline: {_headline(err)}")
    assert found < COLLECTIVE_TIMEOUT / 4
    assert _headline(err).startswith(headline)
    return note, err, found


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_sigstopped_worker_is_named_as_stopped_with_its_peers_stacks():
    note, err, _ = _stall("sigstop", "tfstrategy launch: worker 1 is stopped (SIGSTOP or a debugger) after step ")
    assert re.match(r"tfstrategy launch: stall: worker 1 is stopped \(SIGSTOP or a debugger\) after step \d+; its "
                    r"peers wait for it", note)
    assert "  what the launcher saw: worker 1 is stopped (state T: SIGSTOP" in note
    assert "[worker 0] Thread 0x" in err or "[worker 0] Current thread 0x" in err  # faulthandler's dump


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_busy_loop_in_a_callback_is_named_with_its_stack():
    """Worker 1 outside its step in its own code, its peer waiting in the step's collectives: named, its stack shown.

    A worker blocked on its input is the same stall to the launcher (outside its step: the same note); its stack
    printed from inside the blocking read is test_worker_watch.py's blocked-on-input case.
    """
    note, err, _ = _stall("busy")
    assert "has been outside its step" in note and "while worker(s) 0 wait" in note
    assert re.search(r"\[worker 1\]   File \".*fault_worker.py\", line \d+ in on_train_batch_end", err)


@pytest.mark.multiprocess
def test_a_carriage_return_flood_keeps_the_launcher_small_and_the_report_short():
    run = Run("-n", "2", "--", sys.executable, str(FAULT_WORKER), "flood")
    peak = 0
    while run.process.poll() is None:
        try:
            status = open(f"/proc/{run.process.pid}/status").read()
            peak = max(peak, int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)))
        except (OSError, AttributeError):
            pass
        time.sleep(0.05)
    code, out, err, _ = run.finish(timeout=60)
    print(f"20 MB of \\r updates: launcher peak RSS {peak / 1024:.0f} MiB; report {len(err)} bytes")
    assert code == 1
    assert peak < 200 * 1024  # kB; the launcher holds at most a chunk and a line, never the stream
    assert len(err) < 20_000 and "[worker 1] progress     999" in out  # its last state, once (not in the report)
    assert run.survivors == []


@pytest.mark.multiprocess
def test_a_terminal_that_cannot_encode_gets_every_line_with_replacements():
    code, out, err, _ = _fault("cafe", "--console-workers", "all", env={"PYTHONIOENCODING": "ascii"}, timeout=60)
    assert code == 0, err
    assert "[worker 1] caf? au lait ?" in out and "[worker 0] after the caf?" in out
    assert "went away" not in err
