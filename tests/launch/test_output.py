"""The output pump on real pipes (threads, no process): bounded memory, coalesced \\r, any terminal encoding."""

from __future__ import annotations

import dataclasses
import io
import os
import signal
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
    assert not read_progress(path).finishing
    writer.step_begins()
    writer.finishing()  # the script ended (an exit handler): outside any step
    assert read_progress(path).finishing and not read_progress(path).in_step


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


# --- the console's view: the lead's live progress, repeats once, shutdown noise and dying output off ---------


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _console(live: bool = False, **view) -> tuple[Console, io.StringIO, _FakeClock]:
    from tfstrategy.launch.console import ConsoleView

    stream, clock = io.StringIO(), _FakeClock()
    console = Console(stream, threading.Lock(), view=ConsoleView(**view), live=live, clock=clock)
    for index in range(3):
        console.register(index)
    return console, stream, clock


def _later(console: Console, clock: _FakeClock, seconds: float) -> None:
    clock.now += seconds
    console.tick()


def test_another_workers_repeat_of_the_leads_line_is_shown_once_whichever_comes_first():
    console, stream, clock = _console()
    console.line(1, "[worker 1] ", "Epoch 1/2")  # before the lead's: held
    assert stream.getvalue() == ""
    console.line(0, "[worker 0] ", "Epoch 1/2")
    console.line(2, "[worker 2] ", "Epoch 1/2")  # after the lead's
    console.line(1, "[worker 1] ", "saved my own shard")
    _later(console, clock, 5)
    assert stream.getvalue().splitlines() == ["[worker 0] Epoch 1/2", "[worker 1] saved my own shard"]


def test_a_repeat_from_a_worker_whose_output_ended_before_the_lead_printed_it_is_shown_once():
    """Issue 45 point 9: `launch -n 2 -- python -c "print('hi')"`, worker 1 first: one line, the lead's."""
    console, stream, _ = _console()
    console.line(1, "[worker 1] ", "hi")
    console.flush(1)  # worker 1's output ended: its line still waits for the lead's
    assert stream.getvalue() == ""
    console.line(0, "[worker 0] ", "hi")
    console.flush(0)
    console.flush(2)
    assert stream.getvalue().splitlines() == ["[worker 0] hi"]


def test_a_line_of_a_worker_whose_output_ended_is_shown_once_the_leads_output_ends_without_it():
    console, stream, clock = _console()
    console.line(1, "[worker 1] ", "only me")
    console.flush(1)
    console.line(0, "[worker 0] ", "something else")
    console.flush(0)  # the lead will not print it: no wait for the hold
    assert stream.getvalue().splitlines() == ["[worker 0] something else", "[worker 1] only me"]


def test_a_workers_stderr_lines_go_to_the_launchers_stderr_and_repeat_only_there():
    """Issue 45 point 12: worker stdout -> launcher stdout, worker stderr -> launcher stderr."""
    out, err, clock = io.StringIO(), io.StringIO(), _FakeClock()
    console = Console(out, threading.Lock(), err=err, live=False, clock=clock)
    for index in range(2):
        console.register(index, streams=2)
    console.line(0, "[worker 0] ", "hi")
    console.line(0, "[worker 0] ", "a warning", err=True)
    console.line(1, "[worker 1] ", "a warning", err=True)  # the lead's line on the same stream: shown once
    console.line(1, "[worker 1] ", "hi", err=True)  # the same text on the other stream is no repeat
    _later(console, clock, 5)
    assert out.getvalue() == "[worker 0] hi\n"
    assert err.getvalue() == "[worker 0] a warning\n[worker 1] hi\n"


def test_a_line_only_another_worker_prints_appears_with_its_prefix_after_the_hold():
    from tfstrategy.launch.console import HOLD_SECONDS

    console, stream, clock = _console()
    console.line(1, "[worker 1] ", "only me")
    _later(console, clock, HOLD_SECONDS / 2)
    assert stream.getvalue() == ""
    _later(console, clock, HOLD_SECONDS)
    assert stream.getvalue() == "[worker 1] only me\n"


def test_a_flood_of_another_workers_lines_is_never_held_beyond_a_bound():
    from tfstrategy.launch.console import MAX_HELD

    console, stream, _ = _console()
    for number in range(3 * MAX_HELD):
        console.line(1, "[worker 1] ", f"line {number}")
    assert len(console._held[1]) <= MAX_HELD
    assert stream.getvalue().startswith("[worker 1] line 0\n[worker 1] line 1\n")


def test_console_workers_all_shows_every_repeat():
    console, stream, clock = _console(every_line=True)
    console.line(0, "[worker 0] ", "Epoch 1/2")
    console.line(1, "[worker 1] ", "Epoch 1/2")
    assert stream.getvalue().splitlines() == ["[worker 0] Epoch 1/2", "[worker 1] Epoch 1/2"]


def test_the_leads_progress_is_drawn_live_on_a_terminal_and_another_workers_line_goes_above_it():
    console, stream, clock = _console(live=True)
    console.progress(0, "[worker 0] ", " 1/39 ━")
    console.progress(1, "[worker 1] ", " 1/39 ━")  # not the lead: not drawn
    console.progress(0, "[worker 0] ", " 2/39 ━━")
    assert stream.getvalue() == "\r[worker 0]  1/39 ━\x1b[K\r[worker 0]  2/39 ━━\x1b[K"
    console.line(1, "[worker 1] ", "a note")
    _later(console, clock, 5)
    console.line(0, "[worker 0] ", "39/39 ━━━━ done")
    assert stream.getvalue().endswith("\r\x1b[K[worker 1] a note\n\r[worker 0]  2/39 ━━\x1b[K"
                                      "\r\x1b[K[worker 0] 39/39 ━━━━ done\n")


def test_without_a_terminal_the_leads_progress_is_a_line_now_and_then():
    from tfstrategy.launch.console import PLAIN_PROGRESS_SECONDS

    console, stream, clock = _console(live=False)
    console.progress(0, "[worker 0] ", "\x1b[1m 1/39\x1b[0m")
    assert stream.getvalue() == ""
    clock.now += PLAIN_PROGRESS_SECONDS
    console.progress(0, "[worker 0] ", "\x1b[1m 9/39\x1b[0m")
    console.progress(0, "[worker 0] ", "\x1b[1m10/39\x1b[0m")
    assert stream.getvalue() == "[worker 0]  9/39\n"


HEARTBEAT = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "E0000 00:00:1796321228.327018   19422 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort "
    "UNAVAILABLE: Failed to send RPC to coordination service.",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling "
    "/tensorflow.CoordinationService/Heartbeat:",
    ':UNKNOWN:Error received from peer  {grpc_message:"failed to connect to all addresses", grpc_status:14}',
]


@pytest.mark.parametrize(("peer", "shown"), [
    pytest.param(0, False, id="the-peer-exited-0-noise-is-off"),
    pytest.param(None, False, id="the-peers-output-ended-noise-is-off"),
    pytest.param(1, True, id="the-peer-failed-shown"),
    pytest.param("alive", True, id="the-peer-is-alive-shown-after-the-hold"),
])
def test_tensorflows_shutdown_noise_stays_off_the_console_once_a_peer_ended(peer, shown):
    console, stream, clock = _console()
    for text in HEARTBEAT:
        console.line(1, "[worker 1] ", text)
    console.line(1, "[worker 1] ", "final loss 0.5")
    if peer != "alive":
        console.ended(0, peer)
    _later(console, clock, 10)
    expected = [f"[worker 1] {text}" for text in HEARTBEAT[1:]] if shown else []
    assert stream.getvalue().splitlines() == [*expected, "[worker 1] final loss 0.5"]


def test_debug_shows_the_noise_as_it_comes():
    console, stream, _ = _console(debug=True)
    console.ended(0, 0)
    console.flush(0)  # the lead's output ended too: worker 1's lines wait for no repeat
    for text in HEARTBEAT:
        console.line(1, "[worker 1] ", text)
    console.flush(1)
    assert stream.getvalue().splitlines() == [f"[worker 1] {text}" for text in HEARTBEAT]


@pytest.mark.parametrize("debug", [False, True], ids=["default", "debug"])
def test_after_ctrl_c_the_workers_dying_output_stays_off_unless_debug(debug):
    console, stream, clock = _console(live=True, debug=debug)
    console.progress(0, "[worker 0] ", "12/39 ━━")
    console.stopping()
    console.line(0, "[worker 0] ", "Traceback (most recent call last):")
    console.line(1, "[worker 1] ", "KeyboardInterrupt")
    console.flush(1)
    shown = ["[worker 0] Traceback (most recent call last):", "[worker 1] KeyboardInterrupt"] if debug else []
    assert stream.getvalue().split("\n") == ["\r[worker 0] 12/39 ━━\x1b[K", *shown, ""]


def test_the_launchers_own_line_clears_the_live_progress_first():
    console, stream, _ = _console(live=True)
    err = io.StringIO()
    console.progress(0, "[worker 0] ", "3/39")
    console.say(err, "tfstrategy launch: stall: worker 1 ...")
    assert stream.getvalue().endswith("\r\x1b[K") and err.getvalue() == "tfstrategy launch: stall: worker 1 ...\n"


@pytest.mark.parametrize(("status", "signum", "line"), [
    pytest.param(130, signal.SIGINT, "worker 1: stopped by Ctrl-C (SIGINT)", id="sigint"),
    pytest.param(143, signal.SIGTERM, "worker 1: stopped by SIGTERM", id="sigterm"),
    pytest.param(137, signal.SIGINT, "worker 1: still running 10 s (--grace) after SIGINT; killed (SIGKILL)",
                 id="killed-after-grace"),
    pytest.param(75, signal.SIGTERM, "worker 1: saved and exited 75 (preempted)", id="preempted"),
    pytest.param(1, signal.SIGINT, "worker 1: stopped by Ctrl-C (SIGINT); exit status 1", id="own-status"),
    pytest.param(0, signal.SIGINT, "worker 1: exited 0 after Ctrl-C (SIGINT)", id="exited-0"),
    pytest.param(139, signal.SIGINT, "worker 1: killed by SIGSEGV after Ctrl-C (SIGINT)", id="other-signal"),
])
def test_each_worker_stopped_by_a_signal_is_one_line(status, signum, line):
    from tfstrategy.launch.console import stopped_line

    assert stopped_line(1, status, signum, grace=10.0) == line


def test_the_pump_hands_a_progress_bars_states_to_the_console_and_its_last_state_as_the_line():
    read, write = os.pipe()
    console, stream, _ = _console(live=True)
    pump = Pump(read, prefix="[worker 0] ", console=console, log=None, tail=Tail(), index=0)
    os.write(write, b"Epoch 1/1\n\r\x1b[1m1/3\x1b[0m")  # Keras: "\\r" and the first state
    for _ in range(3000):  # a hang guard: the pump thread hands the partial state over
        if "1/3" in stream.getvalue():
            break
        threading.Event().wait(0.01)
    os.write(write, b"\b\b\b\b\r\x1b[1m2/3\x1b[0m\b\b\b\b\r3/3 done\n")
    os.close(write)
    assert pump.join(timeout=30)
    assert stream.getvalue() == ("[worker 0] Epoch 1/1\n\r[worker 0] \x1b[1m1/3\x1b[0m\x1b[K"
                                 "\r\x1b[K[worker 0] 3/3 done\n")


@pytest.mark.parametrize(("text", "lead", "every", "workers"), [
    pytest.param(None, None, False, None, id="default-first-worker-leads"),
    pytest.param("1,0", 1, False, frozenset({0, 1}), id="first-named-leads"),
    pytest.param("all", None, True, None, id="all"),
])
def test_console_workers_names_the_lead(text, lead, every, workers):
    from tfstrategy.cli import build_parser
    from tfstrategy.cli.launch import _worker_list, console_view, options_from_args

    view = console_view(text)
    assert (view.lead, view.every_line, _worker_list(text)) == (lead, every, workers)
    flag = [] if text is None else ["--console-workers", text]
    options = options_from_args(build_parser().parse_args(["launch", "-n", "3", "--debug", *flag, "--", "true"]))
    assert options.console_view == dataclasses.replace(view, debug=True)
    assert options.console_workers == (frozenset({0, 1, 2}) if every else workers)  # all: with --log-dir too


def test_a_workers_stop_line_stays_off_the_console_the_launchers_headline_says_it_once():
    console, stream, clock = _console(every_line=True)
    line = "tfstrategy refused OneDeviceStrategy under a multi-worker TF_CONFIG (2 workers): it places ..."
    console.line(0, "[worker 0] ", "loading data")
    console.line(0, "[worker 0] ", line)
    console.line(1, "[worker 1] ", line)
    _later(console, clock, 5)
    assert stream.getvalue().splitlines() == ["[worker 0] loading data"]


def test_the_tail_keeps_a_workers_stop_line_whole_for_the_headline_and_bounds_it():
    from tfstrategy.launch.output import STOP_LINE_CHARS

    tail = Tail()
    stop = "tfstrategy refused OneDeviceStrategy " + "x" * (TAIL_LINE_CHARS + 100) + " Run the script as one process."
    tail.add(stop)
    tail.add("y" * (TAIL_LINE_CHARS + 1))
    tail.add("tfstrategy stopped MirroredStrategy(" + "z" * 3 * STOP_LINE_CHARS)
    kept = tail.lines()
    assert kept[0] == stop
    assert kept[1].endswith("[... 1 more characters]")
    assert len(kept[2]) < STOP_LINE_CHARS + 50 and kept[2].endswith("more characters]")


@pytest.mark.parametrize(("first", "count", "several_nodes", "restart", "line"), [
    (0, 2, False, (0, 3), "starting 2 worker(s) on a:1, b:2"),
    (2, 2, True, (1, 3), "starting 2 worker(s) (workers 2..3 of 4) on c:3, d:4 (restart 1 of 3)"),
    (3, 1, True, (0, 0), "starting 1 worker(s) (worker 3 of 4) on d:4"),
])
def test_the_starting_line_names_this_machines_workers_of_the_cluster_and_the_restart(first, count, several_nodes,
                                                                                       restart, line):
    from tfstrategy.launch.console import starting_line

    addresses = ["a:1", "b:2", "c:3", "d:4"]
    assert starting_line(addresses, first, count, several_nodes=several_nodes, restart=restart) == line
