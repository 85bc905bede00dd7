"""Record where each TensorFlow variable was created (file:line in the user's code).

A ``tf.variable_creator_scope`` sees every ``tf.Variable`` as it is created,
inside or outside any strategy's scope. tfstrategy's creator remembers the
first stack frame that is not TensorFlow, Keras, tfstrategy, the standard
library or an installed package, so the audit can say *where* a stray
variable came from: ``train.py:12``, not ``keras/src/optimizers/base_optimizer.py``.

Recording is on inside :func:`recording` and, for the thread that called
:func:`tfstrategy.select`, from then on (:func:`start_recording`). It costs one
short stack walk per variable created (see the README for the measurement).
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.state.registry import RUNTIME

if TYPE_CHECKING:
    from tfstrategy._protocols import Variable

__all__ = ["site_of", "recording", "start_recording"]

# id(variable) -> (weak reference to it, "file:line"). Keyed by id because
# tf.Variable is unhashable; the weak reference guards against id reuse.
_SITES: dict[int, tuple[weakref.ref[Any], str]] = {}
_LIBRARY_CACHE: dict[str, bool] = {}
_STARTED = threading.local()
# A new job starts without the sites of the last one's variables. (Which threads record stays: the
# creator pushed on a thread's stack cannot be taken off.)
RUNTIME.own_state("creation_sites: recorded sites", _SITES.clear)
# The package root (this file is in tfstrategy/scope/).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    """Directories whose frames are never the user's code."""
    dirs = {_PACKAGE_DIR}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    dirs.update(getattr(site, "getsitepackages", lambda: [])())
    for name in ("tensorflow", "keras", "tf_keras"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            dirs.add(os.path.dirname(os.path.abspath(path)))
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def _is_library(filename: str) -> bool:
    known = _LIBRARY_CACHE.get(filename)
    if known is None:
        if filename.startswith("<frozen"):
            known = True
        else:
            real = os.path.realpath(filename)
            known = real.startswith(_library_dirs()) or os.sep + "site-packages" + os.sep in real
        _LIBRARY_CACHE[filename] = known
    return known



@functools.lru_cache(maxsize=1024)
def _display(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if relative.startswith("..") else relative


#: How autograph names the modules it generates from a user's ``tf.function``.
_AUTOGRAPH_MARKER = "__autograph_generated_file"


def user_site(skip: int = 1) -> str | None:
    """``file:line`` of the innermost caller frame that is the user's code.

    Inside a ``tf.function`` the user's code runs as autograph's generated copy
    (``__autograph_generated_file....py``); its lines are mapped back to the
    user's source through autograph's own source map.
    """
    frame: FrameType | None = sys._getframe(skip)
    source_map = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if _AUTOGRAPH_MARKER in filename:
            source_map = _compat.autograph_source_map() if source_map is None else source_map
            origin = source_map.get((filename, frame.f_lineno))
            if origin is not None and not _is_library(origin[0]):
                return f"{_display(origin[0])}:{origin[1]}"
        elif not _is_library(filename):
            return f"{_display(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _forget(key: int, ref: weakref.ref[Any]) -> None:
    entry = _SITES.get(key)
    if entry is not None and entry[0] is ref:
        del _SITES[key]


def _remember(variable: Variable, where: str) -> None:
    key = id(variable)
    try:
        ref: weakref.ref[Any] = weakref.ref(variable, functools.partial(_forget, key))
    except TypeError:  # not weak-referenceable; nothing to remember it by
        return
    _SITES[key] = (ref, where)


def _record_site(next_creator: Any, **kwargs: object) -> object:
    variable = next_creator(**kwargs)
    where = user_site(2)
    if where is not None:
        _remember(variable, where)
        # Under a MirroredStrategy an inner creator returns the mirrored
        # variable; remember its per-device components too.
        for component in getattr(variable, "values", ()) or ():
            _remember(component, where)
    return variable


def site_of(variable: Variable) -> str | None:
    """Where ``variable`` (a Keras or TensorFlow variable) was created, if recorded."""
    inner = _compat.tf_variable(variable)
    candidates = [variable, inner]
    for holder in (variable, inner):
        candidates.extend(getattr(holder, "values", ()) or ())
    for candidate in candidates:
        if candidate is None:
            continue
        entry = _SITES.get(id(candidate))
        if entry is not None and entry[0]() is candidate:
            return entry[1]
    return None


@contextmanager
def recording() -> Iterator[None]:
    """Record creation sites of every variable created in this block.

    Example:
        >>> with tfstrategy.recording():
        ...     optimizer = keras.optimizers.Adam()  # audit names this line
    """
    with tf().variable_creator_scope(_record_site):
        yield


def start_recording() -> bool:
    """Record creation sites in this thread from now on; return whether it is on.

    The creator is pushed at the bottom of the thread's creator stack and never
    popped, so it is only installed when no other creator scope is open (one
    left open inside another scope would break that scope's exit). No context
    manager is left open, so a thread that ends (Ray Train's training thread)
    has nothing to close.
    """
    if getattr(_STARTED, "on", False):
        return True
    if _compat.variable_creator_scope_open():
        return False
    _compat.install_variable_creator(_record_site)
    _STARTED.on = True
    return True
