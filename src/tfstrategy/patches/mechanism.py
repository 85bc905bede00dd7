"""The one shape every tfstrategy workaround of an upstream bug has.

A :class:`Patch` replaces named functions of a library we do not own, and only
while the installed library still has the bug:

- :meth:`Patch.probe` runs a *behaviour* probe of the installed library (never
  only its version number). It cannot raise: if probing itself fails, it warns
  once and the library is left alone.
- ``verified_up_to`` is the newest release the patch was checked against. On a
  newer one the probe still decides, and the status says the release is newer.
- :meth:`Patch.apply` installs replacements for the targets the probe found
  broken (idempotent), :meth:`Patch.remove` puts the originals back, and
  :meth:`Patch.status` reports what is installed as a :class:`PatchStatus`.

Some probes must run TensorFlow ops, which would start the runtime too early
(before a CPU split); such patches set ``probe_on_first_use``: :meth:`apply`
then installs a thin dispatcher that probes the first time a model needs the
fix, and runs the library's own code until then and whenever it is not needed.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar

from tfstrategy import _compat, _versions
from tfstrategy.state.replacement import Replacement
from tfstrategy.state.status import PatchStatus

__all__ = ["Patch", "PatchStatus", "ProbeResult"]


def _outside_the_callers_scopes(probe: Callable[[], Any]) -> Any:
    """``probe()`` in a thread of its own: eager, on the default strategy, whatever the caller is in.

    A lazy probe runs when a model first needs its patch, often inside the user's
    ``strategy.scope()`` or a step being traced. Strategy, device and graph scopes
    are per thread, so a fresh thread sees none of them: the probe's stand-in
    runs on one device and runs no collective (a probe run under a multi-worker
    scope failed or answered differently between workers, which then built
    different train functions whose collectives never met).
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = probe()
        except BaseException as error:  # handed to the caller's thread as is
            outcome["error"] = error

    thread = threading.Thread(target=run, name="tfstrategy-probe", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class ProbeResult(dict[str, bool]):
    """Target path -> whether the installed library's version of it is broken."""


class Patch(Replacement):
    """Base of every upstream workaround; subclasses fill in the class attributes and three methods.

    The replacing itself (originals kept, put back, registered with the runtime) is
    :class:`~tfstrategy.state.replacement.Replacement`'s; a patch adds the probe
    that chooses which targets are broken, and says what it changed for the script.
    """

    #: The upstream bug report(s).
    upstream: ClassVar[str]
    #: Newest library release this patch was verified against.
    verified_up_to: ClassVar[str]
    #: Probe lazily, the first time a model needs it (the probe runs TensorFlow ops).
    probe_on_first_use: ClassVar[bool] = False
    #: What the fix changed for a script that needed it, in the user's terms (the hook's exit summary).
    change_text: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self._probed: ProbeResult | None = None
        self._probe_error: str | None = None
        self._warned = False
        self._acted = False

    # -- to implement (with target_module and replacement) ------------------------------

    def run_probe(self, module: ModuleType) -> ProbeResult:
        """Exercise the *original* targets; may raise (the caller catches)."""
        raise NotImplementedError

    # -- the mechanism ------------------------------------------------------------------

    def library(self) -> str:
        keras = _compat.keras_for()
        return f"{keras.__name__} {_compat.keras_version(keras)}"

    def probe(self) -> ProbeResult | None:
        """Which targets are broken in the installed library; ``None`` if it could not tell (never raises)."""
        with self._lock:
            if self._probed is not None or self._probe_error is not None:
                return self._probed
            module = self.target_module()
            if module is None:
                self._probed = ProbeResult()
                return self._probed
            try:
                if self.probe_on_first_use:
                    self._probed = ProbeResult(_outside_the_callers_scopes(lambda: self.run_probe(module)))
                else:
                    self._probed = ProbeResult(self.run_probe(module))
            except Exception as error:  # a probe must never take the user's program down
                self._probe_error = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
                self._warn(
                    f"tfstrategy could not probe {self.library()} for {self.name} ({self._probe_error}); "
                    "leaving it unpatched. Please report this with `tfstrategy env` output."
                )
            return self._probed

    def needed(self) -> bool | None:
        """Whether any target is broken (probing now if not done yet)."""
        result = self.probe()
        return None if result is None else any(result.values())

    def chosen_targets(self, module: ModuleType) -> list[str]:
        """The targets the probe found broken (all of them as dispatchers if probing lazily)."""
        if self.probe_on_first_use:
            return [target for target in self.targets if self._has(module, target)]
        result: dict[str, bool] = self.probe() or {}
        return [target for target in self.targets if result.get(target)]

    def forget(self) -> None:
        """Forget the probe's answer and warnings (a new job probes again); remove first."""
        with self._lock:
            self._probed = None
            self._probe_error = None
            self._warned = False
            self._acted = False

    def status(self) -> PatchStatus:
        """What this patch found and installed, without probing anew."""
        library = self.library()
        notes = []
        module = self.target_module()
        if module is None:
            return PatchStatus(name=self.name, library=library, needed=None, verified_up_to=self.verified_up_to,
                               note="not applicable to this Keras")
        needed = None if self._probed is None else any(self._probed.values())
        if self._probe_error:
            notes.append(f"probe failed ({self._probe_error}); left unpatched")
        elif self._probed is None and self._originals:
            notes.append("probes when a model first needs it")
        version = _compat.keras_version(_compat.keras_for())
        if _versions.newer_than(version, self.verified_up_to):
            notes.append(f"{version} is newer than verified ({self.verified_up_to}); the probe decides")
        return PatchStatus(name=self.name, library=library, needed=needed, installed=tuple(self._originals),
                           verified_up_to=self.verified_up_to, note="; ".join(notes))

    def acted(self) -> None:
        """Called by a replacement each time it takes the fixed path instead of the library's own code."""
        self._acted = True

    def change(self) -> str | None:
        """What this fix changed for the script so far (``None``: installed, but never needed by it)."""
        return (self.change_text or f"{self.name} applied") if self._acted else None

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=3)


