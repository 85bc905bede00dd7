"""The workers' output: pumped to the console and log files with bounded memory, and a bounded tail.

A worker may write anything: a ``\\r`` progress bar for hours without a newline, megabytes on
one line, bytes the launcher's terminal cannot encode. The pump reads fixed-size chunks,
coalesces ``\\r`` updates (the last state of a line is its line; the states on the way go to
:class:`~tfstrategy.launch.console.Console`, which draws the lead worker's live), splits a line longer than
:data:`MAX_LINE` bytes, replaces what the console cannot encode, and keeps the last
:data:`TAIL_LINES` lines of at most :data:`TAIL_LINE_CHARS` characters each for the failure
report. With ``--log-dir`` the bytes also go to the worker's own file, without terminal colour and
cursor codes (ANSI escape sequences), which the console keeps. :func:`status_line` is the launcher's
last line, in every output mode.
"""

from __future__ import annotations

import collections
import os
import re
import select
import threading
from pathlib import Path
from typing import BinaryIO

from tfstrategy.launch.console import Console
from tfstrategy.launch.states import Outcome
from tfstrategy.worker_contract import STOP_PREFIXES

__all__ = ["Console", "Tail", "Pump", "AnsiStripper", "status_line", "MAX_LINE", "TAIL_LINES", "TAIL_LINE_CHARS"]

#: Bytes of one line beyond which it is split (what a chunk of a newline-less stream becomes).
MAX_LINE = 16 * 1024
#: Lines of a failed worker's output repeated in the failure report, and their longest.
TAIL_LINES = 15
TAIL_LINE_CHARS = 400
#: Characters of a worker's stop line (``STOP_PREFIXES``) kept for the headline.
STOP_LINE_CHARS = 2000
_CHUNK = 64 * 1024
#: Seconds a pump waits for output before letting the console decide its held lines.
_TICK = 0.2
#: An ANSI escape sequence: CSI (colours, cursor moves: ESC [ ... final), OSC (ESC ] ... BEL or ESC \\),
#: or a two-byte escape.
_ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\^_])")
#: Bytes of an escape sequence held back at a chunk's end until it completes; longer is not one.
_MAX_ESCAPE = 256


class AnsiStripper:
    """Removes ANSI escape sequences from a byte stream fed in chunks (a sequence may span two)."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = _ANSI.sub(b"", self._held + chunk)
        cut = data.rfind(b"\x1b")
        if cut != -1 and len(data) - cut <= _MAX_ESCAPE:
            data, self._held = data[:cut], data[cut:]  # perhaps the start of a sequence the next chunk ends
        else:
            self._held = b""
        return data

    def flush(self) -> bytes:
        """What is held back, at the stream's end."""
        held, self._held = self._held, b""
        return held


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


#: How the status line words each way a job ends (by :class:`~tfstrategy.launch.states.Outcome` value).
_ENDINGS = {
    Outcome.FAILED.value: "failed",
    Outcome.JOIN_TIMEOUT.value: "did not start: not every worker joined within --timeout",
    Outcome.STALLED.value: "stalled",
    Outcome.INTERRUPTED.value: "was interrupted",
    Outcome.PREEMPTED.value: "was preempted (every worker saved; requeue it)",
    Outcome.LOST.value: "lost its connection to node 0",
    Outcome.STOPPED.value: "was stopped by a worker (the line above)",
}


def status_line(*, reason: str, returncode: int, workers: int, seconds: float, restarts: int = 0,
                nodes: int = 1, log_dir: Path | None = None) -> str:
    """The launcher's last line: ``2 workers exited 0 in 31 s``, or how the job ended and its status.

    Args:
        reason: how the run ended (an :class:`~tfstrategy.launch.states.Outcome` value).
        returncode: the launcher's exit status.
        workers: this machine's workers.
        seconds: from the launch to now.
        restarts: group restarts on the way.
        nodes: machines in the job (more than one: the line speaks of this node's workers).
        log_dir: where the workers' output went, if not only to the console.
    """
    whose = f"this node's {workers}" if nodes > 1 else str(workers)
    noun = "worker" if workers == 1 else "workers"
    if reason == Outcome.SUCCEEDED.value:
        text = f"{whose} {noun} exited 0 in {_duration(seconds)}"
    else:
        text = f"the job {_ENDINGS.get(reason, reason)} after {_duration(seconds)}; exit status {returncode}"
    if restarts:
        text += f", after {restarts} restart{'s' if restarts > 1 else ''}"
    if log_dir is not None:
        text += f"; output in {log_dir}"
    return text


class Tail:
    """The last lines of a worker (all its streams), bounded in lines and characters."""

    def __init__(self, lines: int = TAIL_LINES, chars: int = TAIL_LINE_CHARS) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._chars = chars
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        # A worker's stop line is the launcher's headline: kept whole (its fix comes last), within a bound of its own.
        limit = STOP_LINE_CHARS if line.startswith(STOP_PREFIXES) else self._chars
        if len(line) > limit:
            line = f"{line[:limit]} [... {len(line) - limit} more characters]"
        with self._lock:
            self._lines.append(line)

    def lines(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._lines)


class Pump:
    """One thread copying one stream of one worker until its end.

    Args:
        fd: the read end of the worker's pipe (closed by the pump at the end).
        prefix: put before each console line, e.g. ``[worker 1] ``.
        console: where lines go (``None``: not on the console).
        index: the worker's index, for the console's view (``None``: every line as it comes).
        log: where the raw bytes go (``None``: no log file).
        tail: where the last lines are kept.
        err: the worker's stderr (its lines go to the console's stderr).
    """

    def __init__(self, fd: int, *, prefix: str, console: Console | None, log: BinaryIO | None, tail: Tail,
                 index: int | None = None, err: bool = False) -> None:
        self.fd, self.prefix, self.console, self.log, self.tail = fd, prefix, console, log, tail
        self.index, self.err = index, err
        self._progress = b""
        self._plain = AnsiStripper()
        #: The largest the pending buffer ever was (bytes), for the memory bound's tests.
        self.peak_buffer = 0
        self._thread = threading.Thread(target=self._run, name=f"tfstrategy-pump-{prefix.strip()}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pending = b""
        viewed = self.console is not None and self.index is not None
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        try:
            while True:
                if viewed and self.console is not None and not poller.poll(_TICK * 1000):
                    self.console.tick()  # nothing new: held lines may be due
                    continue
                chunk = os.read(self.fd, _CHUNK)
                if not chunk:
                    break
                if self.log is not None:
                    self._log(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._emit(self._split(line))
                if len(pending) > MAX_LINE:
                    pending = self._split(pending)
                if viewed and b"\r" in pending:
                    self._show_progress(pending)
                self.peak_buffer = max(self.peak_buffer, len(pending))
            if pending:
                self._emit(pending)
        except OSError:
            pass
        finally:
            if viewed and self.console is not None and self.index is not None:
                self.console.ended(self.index)
                self.console.flush(self.index)
            try:
                os.close(self.fd)
            except OSError:
                pass
            if self.log is not None:
                self._log(b"", end=True)
            if self.log is not None:
                try:
                    self.log.close()
                except OSError:
                    pass

    def _log(self, chunk: bytes, *, end: bool = False) -> None:
        assert self.log is not None
        try:
            self.log.write(self._plain.feed(chunk) + (self._plain.flush() if end else b""))
            self.log.flush()
        except (OSError, ValueError):
            self.log = None  # a full disk: the console copy and the tail go on

    def _split(self, raw: bytes) -> bytes:
        """Emit ``raw``'s pieces beyond :data:`MAX_LINE` as split lines; the rest."""
        trimmed = raw.rstrip(b"\r")
        raw = trimmed[trimmed.rfind(b"\r") + 1:] + raw[len(trimmed):]  # a progress bar: its last state
        while len(raw) > MAX_LINE:
            self._emit(raw[:MAX_LINE], split=True)
            raw = raw[MAX_LINE:]
        return raw

    def _emit(self, raw: bytes, *, split: bool = False) -> None:
        raw = raw.rstrip(b"\r")
        raw = raw[raw.rfind(b"\r") + 1:]  # "\r" updates of one line: the last is what a terminal shows
        text = raw.decode("utf-8", errors="replace") + (" [line split: longer than 16 KiB]" if split else "")
        self.tail.add(text)
        self._progress = b""
        if self.console is None:
            return
        if self.index is None:
            self.console.write_line(self.prefix, text, err=self.err)
        else:
            self.console.line(self.index, self.prefix, text, err=self.err)

    def _show_progress(self, pending: bytes) -> None:
        """The state a ``\\r`` progress bar shows now, to the console if it changed."""
        trimmed = pending.rstrip(b"\r")
        state = trimmed[trimmed.rfind(b"\r") + 1:].replace(b"\b", b"")
        if state and state != self._progress and self.console is not None and self.index is not None:
            self._progress = state
            self.console.progress(self.index, self.prefix, state.decode("utf-8", errors="replace"), err=self.err)

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the stream's end; whether it ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()
