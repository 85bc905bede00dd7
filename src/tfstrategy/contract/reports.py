"""What a worker tells its launcher through files: its first error, its progress.

Both sides of this small protocol live here, so they cannot drift apart:

- the **error file** (``TFSTRATEGY_ERROR_FILE``): the worker's first uncaught exception, as
  JSON (type, message, the user's frame, wall-clock time, traceback tail), like torchrun's
  ``@record`` error files. The launcher reads it to name the root cause.
- the **progress file** (``TFSTRATEGY_PROGRESS_FILE``): 40 bytes the worker updates in place
  through ``mmap`` (no system call per step): a heartbeat counter its own thread bumps
  about every :data:`HEARTBEAT_SECONDS` (:func:`sample_pause`), the number of train steps finished, whether it is
  inside a step (where it waits for its peers in collectives) or outside (callbacks, input,
  the script's own code), and whether its script has ended (its exit handlers run: from
  there TensorFlow's teardown may hold Python's lock, and the heartbeat stops). The launcher
  reads it to find a worker that stopped advancing, and not to call a finishing one frozen.

Nothing here imports TensorFlow (it moved here from ``tfstrategy.launch.reports``, which still
re-exports its names). Where the files are: :mod:`tfstrategy.contract.files`.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import struct
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["ErrorRecord", "write_error", "read_error", "Progress", "ProgressWriter", "read_progress", "HEARTBEAT_SECONDS",
           "LONGEST_HEARTBEAT_SECONDS", "SAMPLES_PER_HEARTBEAT", "sample_pause"]

#: How often, on average, a worker's heartbeat thread bumps its counter (and samples its ledger).
HEARTBEAT_SECONDS = 0.25
#: How many times a heartbeat the thread samples what the worker's threads run (its ledger's sample one of them):
#: what TensorFlow runs of the user's code (a ``py_function``, a generator) is measured from these samples.
SAMPLES_PER_HEARTBEAT = 5
#: The shortest and longest pause between two samples, as fractions of their mean (:func:`sample_pause`).
_PAUSE_RANGE = (0.5, 1.5)
#: The longest time between two heartbeats (each of its pauses at their longest).
LONGEST_HEARTBEAT_SECONDS = HEARTBEAT_SECONDS * _PAUSE_RANGE[1]
#: The pauses' own generator: Python's shared one (``random.random``) is the user's, which ``random.seed`` and
#: ``keras.utils.set_random_seed`` seed and Keras draws its layers' seeds from; a draw from it in our thread would
#: change what the script trains (measured: 13 tests' launched jobs trained to other weights than one process).
_PAUSES = random.Random()


def sample_pause(mean: float, draw: Callable[[], float] | None = None) -> float:
    """The next pause of a thread that samples what the process runs: ``mean`` on average, never the same twice.

    Samples at a fixed period alias with a step whose period is near a fraction or a multiple of it, and see the
    same moment of every step. Measured (CI, the straggler watch's planted slow step): one sample every 0.25 s
    against steps of 0.125 s, each of which sleeps 0.1 s in a ``numpy_function``, saw the function run in every
    sample of one worker's two-second window and in none of its peer's, and the worker was named a straggler for a
    function both ran alike. Drawn uniformly between half and one and a half times ``mean``, the samples fall on
    every moment of a step alike. ``draw`` gives a number in [0, 1) (a test's own; by default a generator of
    tfstrategy's own, never Python's shared one).
    """
    low, high = _PAUSE_RANGE
    return mean * (low + (high - low) * (draw or _PAUSES.random)())


_FORMAT = "<5q"  # version, heartbeat, steps, in_step, finishing
_SIZE = struct.calcsize(_FORMAT)
_VERSION = 2
#: Traceback lines kept in an error file.
_TRACEBACK_LINES = 30
#: Characters of an exception message kept.
_MESSAGE_CHARS = 2000


@dataclass(frozen=True, kw_only=True)
class ErrorRecord:
    """A worker's first uncaught exception."""

    type: str
    message: str
    #: ``file:line in function`` of the deepest frame in the user's code (not a library's).
    frame: str
    time: float
    traceback: tuple[str, ...] = ()

    def describe(self) -> str:
        message = self.message.strip().splitlines()[0] if self.message.strip() else ""
        where = f" (at {self.frame})" if self.frame else ""
        return f"{self.type}: {message}{where}" if message else f"{self.type}{where}"


def _library_dirs() -> tuple[str, ...]:
    import sysconfig

    dirs = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(str(Path(__file__).resolve().parents[1]))  # tfstrategy itself
    return tuple(sorted(d for d in dirs if d))


def user_frame(tb: TracebackType | None, library_dirs: Iterable[str] | None = None) -> str:
    """``file:line in function`` of the deepest traceback frame outside libraries (the user's code)."""
    libraries = tuple(library_dirs if library_dirs is not None else _library_dirs())
    found = ""
    for frame, line in traceback.walk_tb(tb):
        filename = os.path.abspath(frame.f_code.co_filename)
        if filename.startswith("<") or frame.f_code.co_filename.startswith("<frozen"):
            continue
        if any(filename.startswith(directory + os.sep) for directory in libraries) or "site-packages" in filename:
            continue
        found = f"{frame.f_code.co_filename}:{line} in {frame.f_code.co_name}"
    return found


def write_error(path: str | os.PathLike[str], error: BaseException, *, now: float | None = None) -> bool:
    """Record ``error`` in ``path`` unless an earlier one is there; whether it was written."""
    target = Path(path)
    if target.exists():
        return False
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    text = "".join(lines).splitlines()[-_TRACEBACK_LINES:]
    record = {
        "type": f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins."),
        "message": str(error)[:_MESSAGE_CHARS],
        "frame": user_frame(error.__traceback__),
        "time": time.time() if now is None else now,
        "traceback": text,
        "pid": os.getpid(),
    }
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, target)
    return True


def read_error(path: str | os.PathLike[str]) -> ErrorRecord | None:
    """The record in ``path``; ``None`` when there is none (or it is unreadable)."""
    try:
        data = json.loads(Path(path).read_text())
        return ErrorRecord(type=str(data["type"]), message=str(data.get("message", "")),
                           frame=str(data.get("frame", "")), time=float(data["time"]),
                           traceback=tuple(str(line) for line in data.get("traceback", ())))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Progress:
    """One reading of a worker's progress file."""

    heartbeat: int
    steps: int
    in_step: bool
    #: Its script has ended (the exit handlers run): what follows is the interpreter's and TensorFlow's teardown.
    finishing: bool = False


def read_progress(path: str | os.PathLike[str]) -> Progress | None:
    """The progress in ``path``; ``None`` before the worker created it."""
    try:
        with open(path, "rb") as file:
            data = file.read(_SIZE)
    except OSError:
        return None
    if len(data) < _SIZE:
        return None
    version, heartbeat, steps, in_step, finishing = struct.unpack(_FORMAT, data)
    if version != _VERSION:
        return None
    return Progress(heartbeat=heartbeat, steps=steps, in_step=bool(in_step), finishing=bool(finishing))


class ProgressWriter:
    """The worker's side of the progress file: plain stores into a shared mapping."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        #: The progress file (its ledger is beside it: :func:`tfstrategy.contract.files.ledger_path`).
        self.path = str(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, _SIZE)
            self._map = mmap.mmap(fd, _SIZE)
        finally:
            os.close(fd)
        self.heartbeat = self.steps = 0
        struct.pack_into(_FORMAT, self._map, 0, _VERSION, 0, 0, 0, 0)

    # Each field is stored alone (an aligned 8-byte store), so the heartbeat thread and the
    # training loop never overwrite each other's fields.
    def beat(self) -> None:
        self.heartbeat += 1
        struct.pack_into("<q", self._map, 8, self.heartbeat)

    def step_begins(self) -> None:
        struct.pack_into("<q", self._map, 24, 1)

    def step_ends(self) -> None:
        self.steps += 1
        struct.pack_into("<q", self._map, 16, self.steps)
        struct.pack_into("<q", self._map, 24, 0)

    def finishing(self) -> None:
        """The script has ended (called from an exit handler): a still heartbeat from here on is the teardown."""
        struct.pack_into("<q", self._map, 24, 0)
        struct.pack_into("<q", self._map, 32, 1)

    def steps_over(self) -> None:
        """Outside any step, without a batch done: the data ran out inside a begun batch, or fit/evaluate ended."""
        struct.pack_into("<q", self._map, 24, 0)
