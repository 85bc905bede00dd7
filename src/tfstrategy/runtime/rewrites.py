"""What the start-up hook replaces in TensorFlow and Keras, each one undoable through the patch mechanism.

The hook's rewrites are not workarounds of upstream bugs (no probe, no canary:
they are what the hook is for), but they are undoable replacements of the same
shape as a patch (:class:`~tfstrategy.state.replacement.Replacement`): named targets,
an :meth:`~Rewrite.apply` that keeps the originals, a :meth:`~Rewrite.remove`
that puts them back (deleting what the class only inherited or never had), and
a status. Every installed rewrite registers with :data:`~tfstrategy.state.registry.RUNTIME`
(listed with the patches, undone by its ``reset()``); :func:`remove_rewrites` undoes the rewrites alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from tfstrategy.state.registry import RUNTIME
from tfstrategy.state.replacement import Replacement
from tfstrategy.state.status import MISSING, PatchStatus

__all__ = ["Rewrite", "install_rewrite", "remove_rewrites", "rewrites"]


class Rewrite(Replacement):
    """One rewrite of the hook: ``factories`` maps a target path to ``original -> replacement``."""

    def __init__(self, name: str, module: Callable[..., ModuleType | None],
                 factories: Mapping[str, Callable[[Any], Callable[..., object]]], *, detail: str = "") -> None:
        super().__init__()
        # A rewrite's name and targets are its instance's (a Patch's are its class's).
        self.name = name  # type: ignore[misc]
        self.targets = tuple(factories)  # type: ignore[misc]
        self._module = module
        self._factories = factories
        self.detail = detail

    def target_module(self) -> ModuleType | None:
        return self._module()

    def replacement(self, target: str, original: object) -> Callable[..., object]:
        # A target the owner lacks has no original: its factory receives None.
        replacement: Callable[..., object] = self._factories[target](None if original is MISSING else original)
        return replacement

    def status(self) -> PatchStatus:
        return PatchStatus(name=self.name, library=self.library(), needed=True, installed=tuple(self._originals),
                           note=self.detail)


def rewrites() -> tuple[Rewrite, ...]:
    """Every rewrite installed in this process, in installation order."""
    return tuple(item for item in RUNTIME.replacements() if isinstance(item, Rewrite))


def install_rewrite(rewrite: Rewrite) -> PatchStatus:
    """Apply ``rewrite`` and register it with the runtime (a rewrite of the same name is replaced)."""
    previous = RUNTIME.replacement(rewrite.name)
    if previous is not None:
        previous.remove()
    return rewrite.apply()


def remove_rewrites() -> tuple[PatchStatus, ...]:
    """Undo every rewrite, newest first; TensorFlow and Keras are then as the script would find them unhooked."""
    return tuple(rewrite.remove() for rewrite in reversed(rewrites()))
