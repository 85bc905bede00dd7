"""The output pump on real pipes (threads, no process): bounded memory, coalesced \\r, any terminal encoding."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest

from tfstrategy.launch.diagnosis import failure_reason, is_consequence, root_cause
from tfstrategy.launch.output import MAX_LINE, TAIL_LINE_CHARS, TAIL_LINES, Console, Pump, Tail
from tfstrategy.launch.reports import ErrorRecord, ProgressWriter, read_error, read_progress, write_error
from tfstrategy.launch.states import Failure


def _pump(data: bytes, stream: io.TextIOBase | None = None, log=None) -> tuple[Pump, Tail, io.TextIOBase]:
    read, write = os.pipe()
    stream = stream if stream is not None else io.StringIO()
    tail = Tail()
    pump = Pump(read, prefix="[worker 1] ", console=Console(stream, threading.Lock()), log=log, tail=tail)
    writer = threading.Thread(target=lambda: (os.write(write, data) if len(data) < 65536 else _write_all(write, data),
                                              os.close(write)))
    writer.start()
    writer.join()
    assert pump.join(timeout=30)
    return pump, tail, stream


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def test_a_carriage_return_flood_without_newline_keeps_memory_and_the_report_bounded():
    flood = b"".join(b"\rprogress %7d" % i for i in range(1_300_000))  # 20 MB, one "line"
    pump, tail, stream = _pump(flood + b"\nfailed\n")
    assert pump.peak_buffer <= MAX_LINE + 64 * 1024
    assert tail.lines()[-1] == "failed"
    assert sum(len(line) for line in tail.lines()) <= TAIL_LINES * (TAIL_LINE_CHARS + 40)
    lines = stream.getvalue().splitlines()
    assert len(lines) < 2000 and lines[-2] == "[worker 1] progress 1299999"


def test_an_overlong_line_is_split_at_the_cap_and_the_log_keeps_every_byte(tmp_path):
    line = b"x" * (3 * MAX_LINE + 10)
    log = open(tmp_path / "stdout.log", "wb")  # noqa: SIM115 (the pump closes it)
    _, tail, stream = _pump(line + b"\nend\n", log=log)
    printed = stream.getvalue().splitlines()
    assert len(printed) == 4 + 1 and printed[0].endswith("[line split: longer than 16 KiB]")
    assert (tmp_path / "stdout.log").read_bytes() == line + b"\nend\n"
    assert len(tail.lines()[0]) < TAIL_LINE_CHARS + 60


def test_a_terminal_that_cannot_encode_gets_replacements_and_every_later_line():
    raw = io.BytesIO()
    ascii_terminal = io.TextIOWrapper(raw, encoding="ascii", write_through=True)
    _, tail, _ = _pump("café ☕\nafter the café\nlast\n".encode(), stream=ascii_terminal)
    assert raw.getvalue().decode("ascii").splitlines() == ["[worker 1] caf? ?", "[worker 1] after the caf?",
                                                           "[worker 1] last"]
    assert tail.lines()[0] == "café ☕"  # the report keeps the real characters


def test_bytes_that_are_not_utf8_are_replaced_not_fatal():
    _, tail, stream = _pump(b"\xff\xfe bad\nok\n")
    assert stream.getvalue().splitlines() == ["[worker 1] \ufffd\ufffd bad", "[worker 1] ok"]


@pytest.mark.parametrize(("kind", "message", "consequence"), [
    pytest.param("tensorflow.python.framework.errors_impl.UnavailableError", "Socket closed", True, id="unavailable"),
    pytest.param("tensorflow.python.framework.errors_impl.CancelledError", "Cancelled", True, id="cancelled"),
    pytest.param("tensorflow.python.framework.errors_impl.InternalError",
                 "Collective ops is aborted by: ... The error could be from a previous operation", True, id="aborted"),
    pytest.param("ValueError", "shapes (32, 4) and (3, 1) not aligned", False, id="user-error"),
    pytest.param("tensorflow.python.framework.errors_impl.ResourceExhaustedError", "OOM when allocating", False,
                 id="oom-is-a-root-cause"),
])
def test_consequences_are_told_from_root_causes(kind, message, consequence):
    record = ErrorRecord(type=kind, message=message, frame="", time=0.0)
    assert is_consequence(record) is consequence
    assert is_consequence(None, ["Traceback (most recent call last):", f"{kind}: {message}"]) is consequence


def test_root_cause_is_the_earliest_real_failure_else_the_earliest():
    echo = Failure(index=0, reason="echo", status=1, time=1.0, consequential=True)
    real = Failure(index=1, reason="real", status=1, time=2.0)
    later = Failure(index=2, reason="later", status=1, time=3.0)
    assert root_cause([later, echo, real]) == (real, (echo, later))
    assert root_cause([echo]) == (echo, ())


@pytest.mark.parametrize(("code", "expected"), [
    pytest.param(-9, "was killed by SIGKILL; tfstrategy did not send it: the kernel's OOM killer", id="sigkill"),
    pytest.param(-11, "was killed by SIGSEGV", id="sigsegv"),
    pytest.param(-15, "was killed by SIGTERM", id="sigterm"),
    pytest.param(3, "exited with status 3", id="status"),
])
def test_signal_deaths_name_the_signal(code, expected):
    assert failure_reason(code, [], None, True).startswith(expected)


def test_error_file_keeps_the_first_error_and_the_users_frame(tmp_path):
    def users_code():
        raise KeyError("no such column")

    path = tmp_path / "error.json"
    for message in ("first", "second"):
        try:
            users_code() if message == "first" else int("x")
        except Exception as error:  # noqa: BLE001
            write_error(path, error, now=12.5)
    record = read_error(path)
    assert (record.type, record.message, record.time) == ("KeyError", "'no such column'", 12.5)
    assert record.frame.endswith("in users_code") and "test_output.py:" in record.frame
    assert read_error(tmp_path / "missing.json") is None


def test_progress_file_round_trip(tmp_path):
    path = tmp_path / "progress"
    assert read_progress(path) is None
    writer = ProgressWriter(path)
    writer.beat()
    writer.step_begins()
    progress = read_progress(path)
    assert (progress.heartbeat, progress.steps, progress.in_step) == (1, 0, True)
    writer.step_ends()
    assert read_progress(path).steps == 1 and not read_progress(path).in_step


COLOURED = "\x1b[1mEpoch 1/2\x1b[0m\n32/32 \x1b[32m━━━━\x1b[0m\x1b[37m\x1b[0m \x1b[1m1s\x1b[0m\n\x1b]0;title\x07end\n"


@pytest.mark.parametrize("size", [1, 2, 5, 4096], ids=lambda size: f"chunks-of-{size}")
def test_ansi_codes_are_stripped_even_when_a_chunk_ends_inside_one(size: int) -> None:
    from tfstrategy.launch.output import AnsiStripper

    data = COLOURED.encode()
    stripper = AnsiStripper()
    plain = b"".join(stripper.feed(data[i:i + size]) for i in range(0, len(data), size)) + stripper.flush()
    assert plain.decode() == "Epoch 1/2\n32/32 ━━━━ 1s\nend\n"


def test_log_files_get_no_colour_codes_and_the_console_keeps_them(tmp_path):
    log = open(tmp_path / "stdout.log", "wb")  # noqa: SIM115 (the pump closes it)
    _, tail, stream = _pump(COLOURED.encode() + b"a lone \x1b at the end", log=log)
    assert (tmp_path / "stdout.log").read_text() == "Epoch 1/2\n32/32 ━━━━ 1s\nend\na lone \x1b at the end"
    assert "[worker 1] \x1b[1mEpoch 1/2\x1b[0m" in stream.getvalue().splitlines()


@pytest.mark.parametrize(
    ("options", "line"),
    [
        pytest.param(dict(reason="succeeded", returncode=0, workers=2, seconds=30.4), "2 workers exited 0 in 30 s",
                     id="success"),
        pytest.param(dict(reason="succeeded", returncode=0, workers=1, seconds=2.25, restarts=1),
                     "1 worker exited 0 in 2.2 s, after 1 restart", id="one-worker-restarted"),
        pytest.param(dict(reason="succeeded", returncode=0, workers=2, seconds=200, nodes=2, log_dir=Path("logs")),
                     "this node's 2 workers exited 0 in 3 min 20 s; output in logs", id="node-with-log-dir"),
        pytest.param(dict(reason="failed", returncode=1, workers=2, seconds=12, restarts=2),
                     "the job failed after 12 s; exit status 1, after 2 restarts", id="failed"),
        pytest.param(dict(reason="interrupted", returncode=130, workers=2, seconds=5),
                     "the job was interrupted after 5.0 s; exit status 130", id="ctrl-c"),
    ],
)
def test_status_line(options, line):
    from tfstrategy.launch.output import status_line

    assert status_line(**options) == line


def test_every_end_reason_has_words():
    from tfstrategy.launch.output import _ENDINGS
    from tfstrategy.launch.states import EndReason

    assert {reason.value for reason in EndReason} - {"succeeded"} <= set(_ENDINGS)
