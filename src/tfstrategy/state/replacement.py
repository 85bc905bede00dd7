"""The undoable replacement of named functions of a library we do not own: what a patch and a rewrite share.

A :class:`Replacement` names its ``targets`` (attribute paths inside
:meth:`~Replacement.target_module`), installs a replacement for each target it
chooses (:meth:`~Replacement.apply`, idempotent), keeping each original and
whether its owner had it or only inherited it, puts exactly that back
(:meth:`~Replacement.remove`), reports a :class:`~tfstrategy.state.status.PatchStatus`,
and registers with :data:`~tfstrategy.state.registry.RUNTIME` while installed.
Two replacements of one function stack (each wraps the one below it), and either
comes off first: the layers above the one removed are rebuilt on what it had
replaced (:meth:`~Replacement.remove`), so none is lost with it.
A :class:`~tfstrategy.patches.mechanism.Patch` chooses its targets by a probe of
the installed library; a hook :class:`~tfstrategy.runtime.rewrites.Rewrite` takes
all of them.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

from tfstrategy.state.registry import RUNTIME
from tfstrategy.state.status import MISSING, PatchStatus

__all__ = ["ORIGINAL", "Replacement", "get_path"]

#: Set on every replacement: the function it replaced, so a probe always reaches the library's own.
ORIGINAL = "__tfstrategy_original__"
#: Set on every replacement: the :class:`Replacement` that installed it and its target, so that a replacement
#: removed from under another one can have that one rebuilt on what it had replaced.
LAYER = "__tfstrategy_layer__"


def get_path(root: object, path: str) -> Any:
    """``root.a.b`` for ``path="a.b"``; ``AttributeError`` if any part is missing."""
    value = root
    for part in path.split("."):
        value = getattr(value, part)
    return value


class Replacement:
    """Named targets of one module replaced undoably; subclasses say which module and what replaces each."""

    #: Short name used in statuses and messages.
    name: ClassVar[str]
    #: Attribute paths, inside :meth:`target_module`, that may be replaced.
    targets: ClassVar[tuple[str, ...]]

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._originals: dict[str, Any] = {}
        self._installed: dict[str, Any] = {}
        self._owned: dict[str, bool] = {}

    # -- to implement -----------------------------------------------------------------

    def target_module(self) -> ModuleType | None:
        """The module holding the targets, or ``None`` when the installed library has nothing to replace."""
        raise NotImplementedError

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        """The function installed in place of ``original`` (:data:`~tfstrategy.state.status.MISSING` if none)."""
        raise NotImplementedError

    def chosen_targets(self, module: ModuleType) -> list[str]:
        """The targets :meth:`apply` replaces in ``module`` (all of them; a patch: those its probe found broken)."""
        return list(self.targets)

    # -- the mechanism ------------------------------------------------------------------

    def library(self) -> str:
        """The library replaced, with its version when it says one (``tensorflow 2.21.0``)."""
        root = str(getattr(self.target_module(), "__name__", "?")).split(".", 1)[0]
        version = getattr(sys.modules.get(root), "__version__", None)
        return f"{root} {version}" if version else root

    def original(self, target: str) -> Callable[..., Any]:
        """The library's own function for ``target``, whether or not some replacement replaced it."""
        function = self._originals.get(target) or get_path(self.target_module(), target)
        while hasattr(function, ORIGINAL):
            function = getattr(function, ORIGINAL)
        found: Callable[..., object] = function
        return found

    def apply(self) -> PatchStatus:
        """Install replacements for the chosen targets (idempotent); register with the runtime if any."""
        with self._lock:
            module = self.target_module()
            if module is None:
                return self.status()
            for target in self.chosen_targets(module):
                if target not in self._originals:
                    owner, attribute = self._owner(module, target)
                    # A target the library lacks (a removed API a patch restores) has no original.
                    original = getattr(owner, attribute, MISSING)
                    # Whether the owner had its own attribute, or inherited it (or lacked it): remove() puts back
                    # exactly that, instead of copying an inherited function onto the owner.
                    self._owned[target] = attribute in vars(owner)
                    setattr(owner, attribute, self._layer(target, original))
            if self._originals:
                RUNTIME.register(self)
            return self.status()

    def remove(self) -> PatchStatus:
        """Put the library's original functions back."""
        with self._lock:
            module = self.target_module()
            for target, original in list(self._originals.items()):
                if module is not None:
                    owner, attribute = self._owner(module, target)
                    above = _layer_above(getattr(owner, attribute, MISSING), self._installed.get(target))
                    if above is not None:  # another replacement wraps this one: rebuilt on this one's original
                        layer, layer_target = above
                        layer._rebuild(owner, attribute, layer_target, original, self._owned.pop(target, False))
                    elif self._owned.pop(target, False):
                        setattr(owner, attribute, original)
                    elif attribute in vars(owner):
                        delattr(owner, attribute)
                        if attribute == "__new__" and original is object.__new__:
                            setattr(owner, attribute, staticmethod(_allocate))
                del self._originals[target]
                self._installed.pop(target, None)
            RUNTIME.unregister(self)
            return self.status()

    def _layer(self, target: str, original: Any) -> Any:
        """This replacement of ``target`` over ``original``, marked with both (:data:`ORIGINAL`, :data:`LAYER`)."""
        replacement = self.replacement(target, original)
        for mark, value in ((ORIGINAL, original), (LAYER, (self, target))):
            if mark == ORIGINAL and original is MISSING:
                continue
            try:
                setattr(replacement, mark, value)
            except (AttributeError, TypeError):  # a staticmethod or builtin cannot carry attributes
                pass
        self._originals[target] = original
        self._installed[target] = replacement
        return replacement

    def _rebuild(self, owner: object, attribute: str, target: str, original: Any, owned: bool) -> None:
        """Put this replacement of ``target`` over ``original`` (the layer below it came off), and so each above."""
        with self._lock:
            old = self._installed.get(target)
            self._owned[target] = owned
            new = self._layer(target, original)
            above = _layer_above(getattr(owner, attribute, MISSING), old)
            if above is None:
                setattr(owner, attribute, new)
            else:
                layer, layer_target = above
                layer._rebuild(owner, attribute, layer_target, new, layer._owned.get(layer_target, True))

    def status(self) -> PatchStatus:
        """What is installed now."""
        return PatchStatus(name=self.name, library=self.library(), needed=True, installed=tuple(self._originals))

    def installed(self, target: str) -> bool:
        return target in self._originals

    @staticmethod
    def _owner(module: ModuleType, target: str) -> tuple[Any, str]:
        """The object holding ``target`` (a module or a class) and the attribute's name."""
        owner_path, _, attribute = target.rpartition(".")
        return (get_path(module, owner_path) if owner_path else module), attribute

    def _has(self, module: ModuleType, target: str) -> bool:
        try:
            get_path(module, target)
        except AttributeError:
            return False
        return True


def _layer_above(top: Any, installed: Any) -> tuple[Replacement, str] | None:
    """The replacement (and its target) installed directly over ``installed``, going down from ``top``."""
    function = top
    while installed is not None and function is not installed and hasattr(function, ORIGINAL):
        below = getattr(function, ORIGINAL)
        if below is installed:
            layer: tuple[Replacement, str] | None = getattr(function, LAYER, None)
            return layer
        function = below
    return None


def _allocate(cls: type, *args: object, **kwargs: object) -> object:
    """``object.__new__`` as a class that inherits it calls it: the arguments are ``__init__``'s.

    CPython does not restore a class whose ``__new__`` was set and then deleted: its instances are
    then made through ``object.__new__`` with the class's arguments, which raises ``TypeError:
    object.__new__() takes exactly one argument`` (measured on 3.11, for ``MirroredStrategy`` after the
    hook's rewrite was removed). Setting ``object.__new__`` back explicitly fails the same way; this
    allocation, as ``__new__``, makes the class behave as before the replacement.
    """
    return object.__new__(cls)
