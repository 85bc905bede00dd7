"""What of the workers' output reaches the launcher's console, as torchrun and Accelerate users expect.

One worker, the *lead* (worker 0 by default, the first of ``--console-workers``), has its ``\\r``
progress updates (Keras' bar) drawn live when the console is a terminal; without a terminal its
progress is printed as a line every :data:`PLAIN_PROGRESS_SECONDS` without another line. Every line
of the lead is shown. Another worker's line waits up to :data:`HOLD_SECONDS` for the lead to print
the same line, and is shown once (by the lead) if it did, whichever printed it first and even when
that worker's output ended first (``python -c "print('hi')"`` on every worker is one line); its other
lines keep their prefix. Known
shutdown noise (TensorFlow's gRPC and coordination-service errors once a peer's output ended,
absl's start-of-logging notice) and everything after Ctrl-C or SIGTERM stay off the console unless
``--debug``. The log files and failure reports keep every line: this decides only the console.

The streams stay apart, as torchrun's: a worker's stdout lines go to the launcher's stdout, its
stderr lines to the launcher's stderr (where the launcher's own lines go too); a line repeats the
lead's only on the same stream.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from tfstrategy.contract.exits import EXIT_PREEMPTED, SIGNAL_BASE, signal_status
from tfstrategy.native_log import ABSL_NOTICE as _ABSL_NOTICE  # boilerplate, whatever follows it
from tfstrategy.worker_contract import STOP_PREFIXES

__all__ = ["ConsoleView", "Console", "stopped_line", "HOLD_SECONDS", "PLAIN_PROGRESS_SECONDS"]

#: Seconds another worker's line waits for the lead's identical line.
HOLD_SECONDS = 1.0
#: Seconds a line of shutdown noise waits for a peer's end, which makes it noise.
NOISE_HOLD_SECONDS = 3.0
#: Seconds (and distinct lines) of the lead's output another worker's line is compared with.
REPEAT_SECONDS = 60.0
REPEAT_LINES = 4096
#: Lines of one worker held at most (a flood is decided at once, so memory stays bounded).
MAX_HELD = 1000
#: Keras' progress line (`` 12/12 ━━━━ 4s 184ms/step - loss: ...``, ``32/32 - 5s - 165ms/step - ...``).
_KERAS_PROGRESS = re.compile(r"^\s*\d+/\d+ .*\d(us|ms|s)/step\b")

#: Without a terminal: the lead's progress as a line after this many seconds without one.
PLAIN_PROGRESS_SECONDS = 30.0

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\^_])")
#: A TensorFlow C++ error or warning about the job's connections: what a worker logs when a peer is gone.
_NOISE = re.compile(r"^[EW]\d{4} [\d:. ]+\S+\] .*(UNAVAILABLE|CANCELLED|Socket closed|[Cc]oordination ?[Ss]ervice|"
                    r"failed to connect to all addresses|Connection reset|unhealthy)")
#: The lines such an error continues with (gRPC's details, the task names).
_NOISE_MORE = re.compile(r"^(Additional GRPC error information|:?\{|:UNKNOWN:|/job:|The tasks have crashed|"
                         r"\[type\.googleapis\.com|\s)")
_NOISE_MORE_LINES = 8


@dataclass(frozen=True, kw_only=True)
class ConsoleView:
    """How the console shows the workers (``--console-workers``, ``--debug``)."""

    #: The worker whose progress is live and whose lines others' repeats are compared with
    #: (``None``: this machine's first worker).
    lead: int | None = None
    #: Every line of every worker, repeats included (``--console-workers all``).
    every_line: bool = False
    #: Shutdown noise and the workers' output after Ctrl-C too (``--debug``).
    debug: bool = False


@dataclass
class _Held:
    prefix: str
    text: str
    due: float
    noise: int  # 0: a line; 1: shutdown noise; 2: its continuation
    err: bool = False  # from the worker's stderr


def _visible(text: str) -> str:
    return _ANSI.sub("", text)


def starting_line(addresses: Sequence[str], first: int, count: int, *, several_nodes: bool,
                  restart: tuple[int, int]) -> str:
    """``starting 2 worker(s) (workers 2..3 of 4) on ...``: this machine's ``count`` workers of the cluster
    ``addresses`` from ``first``, and ``restart`` (the restart's number, of ``--max-restarts``; 0 for none)."""
    span = f" {first}" if count == 1 else f"s {first}..{first + count - 1}"
    where = f" (worker{span} of {len(addresses)})" if several_nodes else ""
    number, most = restart
    return (f"starting {count} worker(s){where} on " + ", ".join(addresses[first:first + count])
            + (f" (restart {number} of {most})" if number else ""))


def stopped_line(index: int, status: int, signum: int, grace: float) -> str:
    """How worker ``index`` ended after the launcher passed ``signum`` on: ``worker 1: stopped by Ctrl-C (SIGINT)``.

    Args:
        status: its shell exit status (128+N for signal N).
        grace: the seconds it had before SIGKILL.
    """
    name = signal.Signals(signum).name
    what = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else name
    if status == signal_status(signum):
        return f"worker {index}: stopped by {what}"
    if status == signal_status(signal.SIGKILL):
        return f"worker {index}: still running {grace:g} s (--grace) after {name}; killed (SIGKILL)"
    if status == EXIT_PREEMPTED:
        return f"worker {index}: saved and exited {EXIT_PREEMPTED} (preempted)"
    if status > SIGNAL_BASE:
        try:
            return f"worker {index}: killed by {signal.Signals(status - SIGNAL_BASE).name} after {what}"
        except ValueError:
            pass
    if status == 0:
        return f"worker {index}: exited 0 after {what}"
    return f"worker {index}: stopped by {what}; exit status {status}"  # e.g. 1 after its KeyboardInterrupt


class Console:
    """The launcher's output streams, shared by every worker's pumps: whole lines, never an exception.

    Characters the stream cannot encode are replaced; a reader that went away (``| head``)
    makes every later line be discarded (the job goes on).

    Args:
        stream: where the workers' stdout lines go (and the live progress line).
        lock: held while writing (the launcher's own messages take it too).
        err: where the workers' stderr lines go (default: ``stream``).
        view: the policy (default: :class:`ConsoleView`'s).
        live: whether ``stream`` is a terminal that gets ``\\r`` progress (default: ``stream.isatty()``).
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(self, stream: TextIO, lock: threading.Lock, *, err: TextIO | None = None,
                 view: ConsoleView | None = None, live: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.lock = stream, lock
        self.err = stream if err is None else err
        self.view = view or ConsoleView()
        self.lost: OSError | None = None
        if live is None:
            try:
                live = stream.isatty()
            except (AttributeError, ValueError, OSError):
                live = False
        self.live = live
        self._clock = clock
        self._lead = self.view.lead
        self._held: dict[int, collections.deque[_Held]] = {}
        self._lead_lines: collections.OrderedDict[tuple[bool, str], float] = collections.OrderedDict()
        self._ended: dict[int, int | None] = {}  # a worker whose output ended: its exit status once known
        self._open: dict[int, int] = {}  # each registered worker's streams not ended yet
        self._noise_run: dict[int, int] = {}  # continuation lines left after a noise line, per worker
        self._dropping: dict[int, bool] = {}  # whether the worker's last noise line was kept off
        self._drawn: str | None = None  # the live progress line on the terminal
        self._last_lead = clock()
        self._stopping = False

    # --- the workers' side ----------------------------------------------------------------------

    def register(self, index: int, streams: int = 1) -> None:
        """A worker of this machine started with ``streams`` pumped streams; the first one is the lead unless the
        view names one."""
        with self.lock:
            if self._lead is None:
                self._lead = index
            self._ended.pop(index, None)
            self._open[index] = streams

    def line(self, index: int, prefix: str, text: str, *, err: bool = False) -> None:
        """One whole line of worker ``index`` (``err``: from its stderr): shown, held for the lead's repeat, or kept
        off."""
        with self.lock:
            now = self._clock()
            self._release(now)
            if self._stopping and not self.view.debug:
                return
            if not self.view.debug and _visible(text).strip() == _ABSL_NOTICE:
                return
            if _visible(text).strip().startswith(STOP_PREFIXES):
                return  # a worker's stop line: the launcher's headline says it, once
            if index != self._lead and not self.view.every_line and _KERAS_PROGRESS.match(_visible(text)):
                return  # another worker's copy of the lead's progress line (only its timings differ): in its log
            noise = self._noise_kind(index, _visible(text))
            queue = self._held.setdefault(index, collections.deque())
            if not queue and not noise and (index == self._lead or self.view.every_line):
                self._show(index, prefix, text, now, err)
                return
            queue.append(_Held(prefix, text, now + (NOISE_HOLD_SECONDS if noise else HOLD_SECONDS), noise, err))
            self._release(now, final=index if len(queue) > MAX_HELD else None)

    def progress(self, index: int, prefix: str, text: str, *, err: bool = False) -> None:
        """A ``\\r`` update of the line worker ``index`` is writing; only the lead's are shown (drawn on the
        terminal; without one, a line now and then on its stream)."""
        with self.lock:
            now = self._clock()
            self._release(now)
            if index != self._lead or self._held.get(index) or (self._stopping and not self.view.debug):
                return
            if self.live:
                self._draw(prefix + text)
            elif now - self._last_lead >= PLAIN_PROGRESS_SECONDS:
                self._last_lead = now
                self._write(prefix + _visible(text), err=err)

    def ended(self, index: int, status: int | None = None) -> None:
        """Worker ``index``'s output ended (``status`` None) or it exited with ``status``."""
        with self.lock:
            if status is not None or index not in self._ended:
                self._ended[index] = status
            self._release(self._clock())

    def tick(self) -> None:
        """Show or drop the held lines whose time came (the pumps call it while they wait)."""
        with self.lock:
            if any(self._held.values()):
                self._release(self._clock())

    def flush(self, index: int) -> None:
        """One of worker ``index``'s streams ended: its held lines still wait for the lead's repeat (until the
        lead's output ends too); once every worker's output ended, everything held is decided."""
        with self.lock:
            if self._open.get(index, 0) > 0:
                self._open[index] -= 1
            done = all(left == 0 for left in self._open.values())
            final = -1 if done else index if index == self._lead or self._stopping else None
            self._release(self._clock(), final=final)

    def settle(self) -> None:
        """Decide every held line now (the launcher is about to report the attempt's end)."""
        with self.lock:
            self._release(self._clock(), final=-1)

    # --- the launcher's side --------------------------------------------------------------------

    def stopping(self) -> None:
        """The launcher passes a signal on: what is held is decided, and later worker lines stay off."""
        with self.lock:
            self._stopping = True
            self._release(self._clock(), final=-1)
            if self._drawn is not None:
                self._put("\n")  # the last progress state stays on the screen
                self._drawn = None

    def resuming(self) -> None:
        """The workers stopped for an elastic re-formation: the next round's lines show again."""
        with self.lock:
            self._stopping = False

    def say(self, stream: TextIO, text: str) -> None:
        """Write the launcher's own line to ``stream``, clearing the live progress line first."""
        with self.lock:
            if self._drawn is not None:
                self._put("\r\x1b[K")
                self._drawn = None
            try:
                stream.write(f"{text}\n")
                stream.flush()
            except (OSError, ValueError):
                pass

    def write_line(self, prefix: str, text: str, *, err: bool = False) -> None:
        """Write one line now, whatever the view."""
        with self.lock:
            self._write(prefix + text, err=err)

    # --- inside the lock ------------------------------------------------------------------------

    def _noise_kind(self, index: int, text: str) -> int:
        if self.view.debug:
            return 0
        if _NOISE.match(text):
            self._noise_run[index] = _NOISE_MORE_LINES
            return 1
        left = self._noise_run.get(index, 0)
        if left and _NOISE_MORE.match(text):
            self._noise_run[index] = left - 1
            return 2
        self._noise_run[index] = 0
        return 0

    def _peer_done(self, index: int) -> bool:
        """Whether a peer's output ended without a known failure: TensorFlow's errors about it are noise."""
        return any(peer != index and status in (None, 0) for peer, status in self._ended.items())

    def _release(self, now: float, final: int | None = None) -> None:
        """Show or drop each worker's held lines, in order, that can be decided (all of ``final``'s, -1: all)."""
        for index, queue in self._held.items():
            last = final in (index, -1)
            while queue:
                held = queue[0]
                if held.noise == 1:
                    dropping = self._peer_done(index) or self._stopping
                    if not dropping and not last and now < held.due:
                        break
                    self._dropping[index] = dropping
                if held.noise:
                    if not self._dropping.get(index, False):
                        self._show(index, held.prefix, held.text, now, held.err)
                elif index == self._lead or self.view.every_line:
                    self._show(index, held.prefix, held.text, now, held.err)
                else:
                    seen = self._lead_lines.get((held.err, held.text))
                    if seen is None or now - seen > REPEAT_SECONDS:
                        lead_over = self._lead is not None and self._open.get(self._lead) == 0
                        if not last and not lead_over and now < held.due:
                            break
                        self._show(index, held.prefix, held.text, now, held.err)
                queue.popleft()

    def _show(self, index: int, prefix: str, text: str, now: float, err: bool = False) -> None:
        if index == self._lead:
            self._last_lead = now
            self._lead_lines[err, text] = now
            self._lead_lines.move_to_end((err, text))
            if len(self._lead_lines) > REPEAT_LINES:
                self._lead_lines.popitem(last=False)
        self._write(prefix + text, ends_progress=index == self._lead and not err, err=err)

    def _fit(self, text: str) -> str:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 80
        plain = _visible(text)
        # A line wider than the terminal would wrap, and "\r" would redraw only its last row.
        return text if columns <= 0 or len(plain) < columns else plain[:columns - 1]

    def _draw(self, text: str) -> None:
        self._put(f"\r{self._fit(text)}\x1b[K")
        self._drawn = text

    def _write(self, line: str, *, ends_progress: bool = True, err: bool = False) -> None:
        drawn = self._drawn
        if drawn is not None:
            self._put("\r\x1b[K")
            self._drawn = None
        self._put(f"{line}\n", self.err if err else self.stream)
        if drawn is not None and not ends_progress:
            self._draw(drawn)  # another worker's line went above the lead's progress

    def _put(self, text: str, stream: TextIO | None = None) -> None:
        if self.lost is not None:
            return
        stream = self.stream if stream is None else stream
        try:
            try:
                stream.write(text)
            except UnicodeEncodeError:
                encoding = getattr(stream, "encoding", None) or "ascii"
                stream.write(text.encode(encoding, errors="replace").decode(encoding))
            stream.flush()
        except (BrokenPipeError, ValueError, OSError) as error:  # the reader went away
            self.lost = error if isinstance(error, OSError) else BrokenPipeError(str(error))
