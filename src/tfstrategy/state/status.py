"""What an installed replacement of upstream code reports about itself: one :class:`PatchStatus` shape.

A patch, a hook rewrite and an instance override all answer ``status()`` with it,
so ``patch_status()``, ``tfstrategy env`` and the exit summary print them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MISSING", "PatchStatus"]


@dataclass(frozen=True, kw_only=True)
class PatchStatus:
    """What one patch found in the installed library, and what it installed."""

    name: str
    library: str
    #: True: the bug is present; False: absent; None: not probed (yet) or not applicable.
    needed: bool | None
    installed: tuple[str, ...] = ()
    verified_up_to: str = ""
    note: str = ""

    def line(self) -> str:
        """``name: installed (...)`` / ``not needed`` / ``not applicable``, with the note."""
        if self.installed:
            state = f"installed ({', '.join(self.installed)})"
        elif self.needed is False:
            state = "not needed"
        else:
            state = "not installed"
        return f"{self.name}: {state}; {self.library}" + (f"; {self.note}" if self.note else "")


#: The "original" of an attribute its owner lacked: removing the replacement deletes the attribute again.
MISSING: Any = object()
