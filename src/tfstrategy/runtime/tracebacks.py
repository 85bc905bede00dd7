"""Tracebacks of the script's own errors start at the script's frames, not tfstrategy's (issue 35).

Under ``tfstrategy run`` and ``launch`` the hook wraps ``Model.fit``, strategy
constructors and the like (:mod:`~tfstrategy.runtime.rewrites`). An exception
the script's own code raises through such a wrapper (a callback, a loss, a
``build_model``) would show tfstrategy's wrapper frames in between, and make
tfstrategy look guilty. :func:`install` sets an excepthook, through
:meth:`~tfstrategy.state.registry.ProcessRuntime.override_attribute` (undone by
``reset()``), that drops them: the frames of tfstrategy's package that only
passed the call on (some frame after them is not tfstrategy's). An error raised
by tfstrategy's own code keeps the frames where it was raised. The exception's
type and message are never changed; ``--debug`` (``TFSTRATEGY_DEBUG=1``) keeps
every frame.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

from tfstrategy.state.registry import RUNTIME

__all__ = ["install", "user_traceback"]

#: tfstrategy's package directory: a frame whose file is under it is tfstrategy's own.
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _is_ours(tb: TracebackType) -> bool:
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(PACKAGE)


def user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without tfstrategy's pass-through frames (those followed by a frame that is not tfstrategy's)."""
    frames: list[TracebackType] = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    # The frames at the end that are all tfstrategy's are where tfstrategy itself raised: kept.
    last_foreign = max((i for i, frame in enumerate(frames) if not _is_ours(frame)), default=-1)
    kept = [frame for i, frame in enumerate(frames) if i > last_foreign or not _is_ours(frame)]
    rebuilt: TracebackType | None = None
    for frame in reversed(kept):
        rebuilt = TracebackType(rebuilt, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return rebuilt


def _trim_chain(error: BaseException) -> None:
    """Trim the tracebacks of the exceptions ``error`` was raised from (or during), once each."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error.__cause__, error.__context__]
    while pending:
        linked = pending.pop()
        if linked is None or id(linked) in seen:
            continue
        seen.add(id(linked))
        linked.__traceback__ = user_traceback(linked.__traceback__)
        pending += [linked.__cause__, linked.__context__]


def install() -> str | None:
    """Show uncaught exceptions without tfstrategy's pass-through frames (``None`` under ``--debug``)."""
    from tfstrategy.worker_contract import WorkerSettings

    try:
        debug = WorkerSettings.from_environ(os.environ).debug
    except Exception:  # a bad variable is reported by the supervision step; tracebacks stay whole
        return None
    if debug:
        return None
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        try:
            tb = user_traceback(tb)
            error.__traceback__ = tb  # Python's own hook prints the exception's traceback, not its argument
            _trim_chain(error)
        except Exception:  # never lose the user's traceback to a fault here
            pass
        previous(kind, error, tb)

    RUNTIME.override_attribute(sys, "excepthook", excepthook, name="user_tracebacks",
                               note="uncaught exceptions shown without tfstrategy's pass-through frames")
    return "uncaught exceptions shown from the script's frames (--debug shows tfstrategy's too)"
