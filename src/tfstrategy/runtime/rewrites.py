"""What the start-up hook replaces in TensorFlow and Keras, each one undoable through the patch mechanism.

The hook's rewrites are not workarounds of upstream bugs, but they have the
same shape as one (:class:`~tfstrategy.patches.mechanism.Patch`): named targets,
an :meth:`~Rewrite.apply` that keeps the originals, a :meth:`~Rewrite.remove`
that puts them back (deleting what the class only inherited or never had), and
a status. Every installed rewrite registers with :data:`~tfstrategy.runtime.process.RUNTIME`
(listed with the patches, undone by its ``reset()``); :func:`remove_rewrites` undoes the rewrites alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from tfstrategy.patches.mechanism import _MISSING, Patch, PatchStatus, ProbeResult
from tfstrategy.runtime.process import RUNTIME

__all__ = ["Rewrite", "install_rewrite", "remove_rewrites", "rewrites"]

class Rewrite(Patch):
    """One rewrite of the hook: ``factories`` maps a target path to ``original -> replacement``."""

    upstream = "none: a rewrite of tfstrategy's start-up hook, not a workaround"
    verified_up_to = ""

    def __init__(self, name: str, module: Callable[..., ModuleType | None],
                 factories: Mapping[str, Callable[..., Any]], *, detail: str = "") -> None:
        super().__init__()
        # A rewrite's name and targets are its instance's (a Patch's are its class's).
        self.name = name  # type: ignore[misc]
        self.targets = tuple(factories)  # type: ignore[misc]
        self._module = module
        self._factories = factories
        self.detail = detail

    def target_module(self) -> ModuleType | None:
        return self._module()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        return ProbeResult({target: True for target in self.targets})

    def replacement(self, target: str, original: Any) -> Callable[..., Any]:
        # A target the owner lacks has no original: its factory receives None.
        replacement: Callable[..., Any] = self._factories[target](None if original is _MISSING else original)
        return replacement

    def library(self) -> str:
        root = str(getattr(self.target_module(), "__name__", "?")).split(".", 1)[0]
        version = getattr(sys.modules.get(root), "__version__", None)
        return f"{root} {version}" if version else root

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
