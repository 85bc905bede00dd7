"""What a sample of this process's Python stacks shows of the user's code, and the counter that adds it up.

Which frames are the user's (not the standard library's, an installed package's or tfstrategy's), the
user's frame on the main thread, and what every thread shows TensorFlow running of the user's code
(:func:`users_code_tensorflow_runs`: a ``from_generator`` generator, input; a ``tf.py_function`` or
``tf.numpy_function``, a measure of its own). :class:`UsersCodeSeconds` adds the samples up as seconds;
the worker's ledger (:mod:`tfstrategy.runtime.ledger`) and the performance report's own sampler
(:mod:`tfstrategy.performance.sampler`) both count with it, and the one that samples already shares its
counter (:func:`share_counter`), so a process takes one set of samples. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
import sysconfig
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from tfstrategy.state.registry import RUNTIME

__all__ = ["TensorFlowRuns", "UsersCodeSeconds", "current_frames", "main_thread_user_frame", "share_counter", "shared_counter",
           "tensorflow_runs_users_code", "user_frame_of", "users_code_tensorflow_runs"]


@dataclass(frozen=True)
class TensorFlowRuns:
    """What one sample of every thread's stack shows TensorFlow running of the user's code."""

    #: A thread runs a ``from_generator`` generator for tf.data: input.
    input: bool = False
    #: The user's functions threads run as a ``tf.py_function``/``tf.numpy_function`` (``file:line in name``).
    py_functions: tuple[str, ...] = ()


class UsersCodeSeconds:
    """Seconds stack samples saw TensorFlow run the user's input and ``py_function`` s: each sample counts the
    time since the previous one by what runs now. The ledger's heartbeat samples with it, and the performance
    report's own sampler where no ledger is kept (:class:`~tfstrategy.performance.sampler.StackSampler`)."""

    def __init__(self, runs: Callable[[], TensorFlowRuns] | None = None) -> None:
        self._runs = runs if runs is not None else tensorflow_runs_users_code
        #: Seconds the samples saw tf.data run the user's code (a ``from_generator`` generator): the input a
        #: ``tf.function`` reads inside the step (Keras' ``fit``), which no batch callback can time.
        self.input_seconds = 0.0
        #: Seconds the samples saw TensorFlow run the user's ``tf.py_function``/``tf.numpy_function`` (in a
        #: ``dataset.map`` or in the step: the stack cannot tell which).
        self.py_function_seconds = 0.0
        self._sampled_at: float | None = None

    def _sample_users_code(self, now: float) -> TensorFlowRuns:
        """Count the time since the last sample as input, or ``py_function`` time, by what TensorFlow runs now."""
        try:
            runs = self._runs()
        except Exception:  # a stack that cannot be read must not stop the sampling
            runs = TensorFlowRuns()
        if self._sampled_at is not None:
            if runs.input:
                self.input_seconds += now - self._sampled_at
            if runs.py_functions:
                self.py_function_seconds += now - self._sampled_at
        self._sampled_at = now
        return runs


# -- the user's frame ------------------------------------------------------------------------------


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(str(Path(__file__).resolve().parent))  # tfstrategy itself
    return tuple(sorted(directory + os.sep for directory in dirs if directory))


#: Whether each file seen is the user's (not a library's), by its code's file name.
_USERS: dict[str, bool] = {}


def _is_users(filename: str) -> bool:
    known = _USERS.get(filename)
    if known is None:
        path = os.path.abspath(filename)
        known = not (filename.startswith("<") or "site-packages" in path or path.startswith(_library_dirs()))
        _USERS[filename] = known
    return known


def user_frame_of(frame: FrameType | None) -> str:
    """``file:line in function`` of the innermost frame of ``frame``'s stack in the user's code ("" if none)."""
    while frame is not None:
        code = frame.f_code
        if _is_users(code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return ""


#: Where tf.data's Python code lives (``from_generator`` calls the user's generator from there).
_TF_DATA = os.sep + os.path.join("tensorflow", "python", "data") + os.sep
#: Where TensorFlow calls a ``tf.py_function``'s or ``tf.numpy_function``'s Python code from (the
#: outermost frame of the thread that runs it: a tf.data thread in ``dataset.map``, the step's own).
_SCRIPT_OPS = os.sep + os.path.join("tensorflow", "python", "ops", "script_ops.py")


def users_code_tensorflow_runs(frame: FrameType | None) -> tuple[str, str] | None:
    """What TensorFlow runs of the user's code on ``frame``'s stack: ``("input", "")`` for a ``from_generator``
    generator (tf.data calls it), ``("py_function", "file:line in name")`` for a ``tf.py_function`` or
    ``tf.numpy_function`` (script_ops calls it; the place is the user's outermost frame under it, its
    function's first line), ``None`` for anything else (the script's own code, TensorFlow's own).

    A ``py_function`` is not input: one in ``dataset.map`` (tf.data's threads) and one in the model's
    step (the step's threads) leave the same Python stack, the user's function under script_ops and
    nothing above, and the threads cannot be told apart from here. (A generator is called through
    script_ops too, from tf.data's code first: input.)
    """
    outermost: FrameType | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if _is_users(filename):
            outermost = frame
        elif outermost is not None and _TF_DATA in filename:
            return "input", ""
        elif outermost is not None and filename.endswith(_SCRIPT_OPS):
            code = outermost.f_code
            return "py_function", f"{code.co_filename}:{code.co_firstlineno} in {code.co_name}"
        frame = frame.f_back
    return None


def current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, with the garbage collector off while it runs.

    CPython before 3.11.9 and 3.12.3 (python/cpython#106883) holds its lock of the thread list while it
    makes the frame objects; an allocation there may start a collection, and a ``threading.local`` the
    collection frees takes that same lock: the sampling thread then waits on itself holding the GIL, and the
    whole process freezes. Seen in launched workers, whose heartbeat samples the stacks every beat: one job
    in three froze in ``reset_metrics`` beside other jobs (`tests/test_stacks.py` reproduces it). The
    fix CPython made: no collection during the call (and none re-enabled that was off).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if enabled:
            gc.enable()


def tensorflow_runs_users_code() -> TensorFlowRuns:
    """What every thread runs of the user's code for TensorFlow now (its input, its ``py_function`` s)."""
    found = [users_code_tensorflow_runs(frame) for frame in current_frames().values()]
    return TensorFlowRuns(input=any(item is not None and item[0] == "input" for item in found),
                          py_functions=tuple(item[1] for item in found if item is not None and item[0] == "py_function"))


def main_thread_user_frame() -> str:
    """The user's innermost frame on the main thread, now."""
    return user_frame_of(current_frames().get(threading.main_thread().ident or 0))


# -- the counter this process shares ---------------------------------------------------------------

_SHARED: list[UsersCodeSeconds] = []
RUNTIME.own_state("stacks: the shared counter", _SHARED.clear)


def share_counter(counter: UsersCodeSeconds | None) -> None:
    """Offer ``counter``'s samples to whoever would take the same ones (``None``: it stopped sampling)."""
    _SHARED[:] = [] if counter is None else [counter]


def shared_counter() -> UsersCodeSeconds | None:
    """The counter that samples this process already (the worker's ledger under ``tfstrategy launch``), or ``None``."""
    return _SHARED[0] if _SHARED else None
