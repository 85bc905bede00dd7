"""Say so when a script's own code made two workers write one path.

tfstrategy makes Keras' own writers write once (:mod:`tfstrategy.patches.keras_chief_files`),
but a script's own file code still runs on every worker: ``os.makedirs(d)``
without ``exist_ok``, ``h5py.File(p, "w")``, a zip or checkpoint another worker
is rewriting. The worker that loses the race fails with an error that names a
path but not the cause, and its peers only report a collective abort.
:func:`shared_path_message` turns such an error into one line that says what
happened and how to fix it; :func:`install_excepthook` prints that line after
the traceback of an uncaught error in a multi-worker job (the start-up hook
installs it; the launcher can pick the line up by its :data:`PREFIX`).
"""

from __future__ import annotations

import errno
import os
import re
import sys
import zipfile
from collections.abc import Iterator
from types import TracebackType
from typing import Any

__all__ = ["PREFIX", "shared_path_message", "install_excepthook"]

#: The start of the line; unique, so a supervisor can find it in a worker's output.
PREFIX = "tfstrategy: two workers wrote one path"

#: h5py's messages name the file as ``name = '...'``.
_H5_NAME = re.compile(r"name = '([^']+)'")
#: h5py errors when another process holds or is writing the same file.
_H5_RACE = ("unable to lock file", "truncated file", "file signature not found", "bad object header")
#: Locals of the frames a failing file operation ran in, that hold the path.
_PATH_LOCALS = ("filepath", "filename", "file_path", "path", "name", "file", "dirname")


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _frames(traceback: TracebackType | None) -> list[Any]:
    frames = []
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    return frames


def _path_from_frames(error: BaseException) -> str | None:
    """The innermost frame's local that names a file (zipfile errors do not say which archive)."""
    for frame in reversed(_frames(error.__traceback__)):
        if frame.f_globals.get("__name__") == "zipfile":
            continue  # its locals name archive members ('config.json'), not the archive
        for name in _PATH_LOCALS:
            value = frame.f_locals.get(name)
            if isinstance(value, (str, os.PathLike)) and os.fspath(value):
                return os.fspath(value)
            if isinstance(getattr(value, "filename", None), str):  # a ZipFile, an open file
                return str(value.filename)
    return None


def _in_function(error: BaseException, names: tuple[str, ...]) -> bool:
    return any(frame.f_code.co_name in names for frame in _frames(error.__traceback__))


def race_of(error: BaseException) -> tuple[str, str] | None:
    """``(path, what happened)`` if ``error`` (or an error it came from) is two processes on one path."""
    for cause in _chain(error):
        text = str(cause)
        if isinstance(cause, FileExistsError) or (isinstance(cause, OSError) and cause.errno == errno.EEXIST):
            return str(cause.filename or _path_from_frames(cause) or "?"), "it already existed (another worker probably created it)"
        if isinstance(cause, OSError) and any(marker in text.lower() for marker in _H5_RACE):
            match = _H5_NAME.search(text)
            path = match.group(1) if match else cause.filename or _path_from_frames(cause) or "?"
            return str(path), "another worker held or was writing the file"
        if isinstance(cause, zipfile.BadZipFile):
            return _path_from_frames(cause) or "?", "it was read while another worker rewrote it"
        if isinstance(cause, FileNotFoundError) and _in_function(cause, ("rmtree", "_rmtree_safe_fd", "_rmtree_unsafe")):
            return str(cause.filename or "?"), "another worker removed it at the same time"
    return None


def shared_path_message(error: BaseException, *, task: str | None = None) -> str | None:
    """One line for a shared-path race, or ``None`` if ``error`` is not one.

    Args:
        error: the exception a worker failed with.
        task: the worker's name (``worker-1``), put at the start of the explanation.
    """
    found = race_of(error)
    if found is None:
        return None
    path, what = found
    first = (str(error).strip().splitlines() or [""])[0]
    who = f" ({task})" if task else ""
    return (
        f"{PREFIX}{who}: {path}: {what} ({type(error).__name__}: {first}). Every worker runs the script's own "
        "file code and these workers share one filesystem; let one worker write it (`if tfstrategy.is_chief(): ...`) "
        "or give each worker its own path (e.g. with the task index of TF_CONFIG in the name)."
    )


def install_excepthook() -> None:
    """After an uncaught error's traceback, print :func:`shared_path_message` in a multi-worker job."""
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        previous(kind, error, traceback)
        try:
            from tfstrategy.multiworker.chief_files import shared_job

            config = shared_job()
            message = shared_path_message(error, task=config.task_name) if config is not None else None
        except Exception:  # reporting must never hide the user's own error
            message = None
        if message:
            print(message, file=sys.stderr, flush=True)

    from tfstrategy.state.registry import RUNTIME

    RUNTIME.override_attribute(sys, "excepthook", excepthook, name="shared_path_line",
                               note="after an uncaught error's traceback, the line naming a path two workers wrote")
