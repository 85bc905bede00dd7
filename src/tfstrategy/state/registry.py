"""The one object that owns what tfstrategy changed in this process, and the one ``reset()`` that undoes it.

The ground floor of the package: it imports nothing of tfstrategy but the status
shape beside it, so every layer (the patches, the scope, the strategies, the
start-up hook, ``select()``) registers here and none has to import upward.

Every replacement of upstream code (a :class:`~tfstrategy.patches.mechanism.Patch`
or a hook :class:`~tfstrategy.runtime.rewrites.Rewrite`, both a
:class:`~tfstrategy.state.replacement.Replacement`; an :class:`Override` of one
object's attribute) registers with :data:`RUNTIME` while it is installed, so
``patch_status()``, ``tfstrategy env`` and the hook's exit summary list them all.
State other modules keep for the life of a job (recorded creation sites, write
counters, once-only messages) is either held here or registered with
:meth:`ProcessRuntime.own_state`; what they keep for one user object (a model's
divergence sentinel, its tuned ``steps_per_execution``, its performance tracker)
is an :class:`Attachments` of the runtime, never an attribute written on the
object. :meth:`ProcessRuntime.reset` undoes every replacement, newest first, and
clears all of it, so a second job in the same process starts as the first one did.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from tfstrategy.state.status import MISSING, PatchStatus

__all__ = ["KEY_STRIDE", "RUNTIME", "Attachments", "HookState", "Override", "ProcessRuntime", "Undoable", "UndoablePlan",
           "reset"]

T = TypeVar("T")


class Undoable(Protocol):
    """Anything that replaced upstream code and can put it back."""

    @property
    def name(self) -> str: ...

    def remove(self) -> PatchStatus: ...

    def status(self) -> PatchStatus: ...


class UndoablePlan(Protocol):
    """A consumer's plan of process-wide steps (:class:`tfstrategy.runtime.plan.Plan`), as the reset sees it."""

    def undo(self) -> None: ...


class Override:
    """One attribute of one object (an instance's method, a class's, a module's) replaced, undoably.

    Instances are written with ``object.__setattr__`` (a Keras model does not track
    the replacement); :meth:`remove` restores the object's own attribute, or deletes
    the replacement if the attribute was only inherited.
    """

    def __init__(self, owner: object, attribute: str, replacement: object, *, name: str, note: str = "") -> None:
        self.name = name
        self.attribute = attribute
        self.note = note
        self.what = f"{getattr(owner, '__name__', type(owner).__name__)}.{attribute}"
        self._owner: Callable[[], Any]
        try:
            reference = weakref.ref(owner)  # a model's override must not keep the model alive
            self._owner = reference
        except TypeError:
            self._owner = lambda: owner
        own = vars(owner) if hasattr(owner, "__dict__") else {}
        self._original = own.get(attribute, MISSING)
        self._active = True
        _write(owner, attribute, replacement)

    @property
    def original(self) -> object:
        """The owner's own attribute before the override (``None`` if it was inherited or absent)."""
        return None if self._original is MISSING else self._original

    @property
    def active(self) -> bool:
        """Installed, on an owner that still exists."""
        return self._active and self._owner() is not None

    def remove(self) -> PatchStatus:
        """Put the owner's attribute back (idempotent); forget the override in :data:`RUNTIME`."""
        owner = self._owner()
        if self._active and owner is not None:
            if self._original is MISSING:
                if self.attribute in (vars(owner) if hasattr(owner, "__dict__") else {}):
                    _delete(owner, self.attribute)
            else:
                _write(owner, self.attribute, self._original)
        self._active = False
        RUNTIME.unregister(self)
        return self.status()

    def status(self) -> PatchStatus:
        installed = (self.what,) if self.active else ()
        return PatchStatus(name=self.name, library="instance override", needed=True, installed=installed,
                           note=self.note)


def _write(owner: object, attribute: str, value: object) -> None:
    if isinstance(owner, type):
        setattr(owner, attribute, value)
    else:
        object.__setattr__(owner, attribute, value)  # untracked by Keras


def _delete(owner: object, attribute: str) -> None:
    if isinstance(owner, type):
        delattr(owner, attribute)
    else:
        object.__delattr__(owner, attribute)


class Attachments(Generic[T]):
    """One kind of value tfstrategy keeps per user object (a model's sentinel), held here rather than on the object.

    Keyed weakly, so an entry goes with its object (Keras models hash by identity); the value must not refer
    back to its object, or the object would live as long as the entry. :meth:`ProcessRuntime.reset` clears
    every kind, so nothing tfstrategy kept for a model outlives the job that made it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._values: weakref.WeakKeyDictionary[object, T] = weakref.WeakKeyDictionary()

    def get(self, owner: object) -> T | None:
        return self._values.get(owner)

    def set(self, owner: object, value: T) -> None:
        self._values[owner] = value

    def clear(self) -> None:
        self._values.clear()


@dataclass
class HookState:
    """What the start-up hook did in this process, for the exit summary and for tests."""

    steps: list[tuple[str, str]] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)
    #: A MultiWorkerMirroredStrategy of this process joined the job.
    joined: bool = False
    #: Things the script did that overrode a setting (e.g. its own device list over --cpu-replicas).
    notes: list[str] = field(default_factory=list)
    patches: list[str] = field(default_factory=list)
    audited: int = 0
    findings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: What changed for the script, in its terms, by the step that changed it (the first text of each).
    changes: dict[str, str] = field(default_factory=dict)

    def changed(self, step: str, text: str) -> None:
        """Record that ``step`` acted on the script: ``text`` says what changed, in the user's terms."""
        self.changes.setdefault(step, text)

    def audit_phrase(self) -> str | None:
        """The scope audit's outcome in a few words (``None``: nothing was audited)."""
        if not self.audited:
            return None
        if self.findings:
            return f"scope audit: {len(self.findings)} of {self.audited} found variables outside the scope"
        return "scope audit clean"

    def summary(self, changes: tuple[str, ...] = (), *, debug: bool = False,
                replacements: tuple[str, ...] = ()) -> str:
        """The exit line: strategies, what changed for the script, the audit; the step names only with ``debug``.

        ``changes`` are the steps' and patches' own :meth:`change` texts, in plan order.
        """
        parts = [", ".join(self.strategies) or "no strategy created", "; ".join(changes) or "nothing changed"]
        audit = self.audit_phrase()
        if audit:
            parts.append(audit)
        parts += [f"note: {note}" for note in self.notes]
        if debug:
            parts.append(f"steps: {', '.join(name for name, _ in self.steps) or 'none'}")
            parts.append(f"patches: {', '.join(self.patches) or 'none needed'}")
            if replacements:
                parts.append(f"replaced: {', '.join(replacements)}")
        if self.errors:
            parts.append(f"hook errors: {'; '.join(self.errors)}")
        return "tfstrategy: " + "; ".join(parts)


#: How far apart the collective keys of two strategies of one process start (TensorFlow's own tests use it).
KEY_STRIDE = 100_000


class ProcessRuntime:
    """Everything tfstrategy changed or remembers in this process (one per process: :data:`RUNTIME`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._replacements: dict[str, Undoable] = {}
        self._step_of: dict[str, str] = {}
        self._taking: list[str] = []
        self._states: dict[str, Callable[[], None]] = {}
        self._counters: dict[str, Iterator[int]] = {}
        self._armed: dict[str, Callable[[], None]] = {}
        self._attachments: dict[str, Attachments[Any]] = {}
        self._fresh()

    def _fresh(self) -> None:
        #: What the start-up hook did (the exit summary).
        self.hook = HookState()
        #: The plan of each consumer last derived here (``"select"``, ``"hook"``).
        self.plans: dict[str, UndoablePlan] = {}
        #: Hook steps taken (or being taken) in this process.
        self.taken: set[str] = set()
        #: Models whose scope the hook audited already (by id).
        self.audited: set[int] = set()
        #: The supervision steps installed (tfstrategy.runtime.worker_watch), with what each did.
        self.supervision: dict[str, str] = {}
        #: The progress file's writer under ``tfstrategy launch`` (at most one).
        self.progress: list[Any] = []
        self._said: set[str] = set()

    # -- replacements ---------------------------------------------------------------------

    def register(self, replacement: Undoable) -> None:
        """Remember an installed replacement (its name is its key: a new one of the same name replaces it)."""
        with self._lock:
            self._replacements.pop(replacement.name, None)
            self._replacements[replacement.name] = replacement
            if self._taking:
                self._step_of[replacement.name] = self._taking[-1]

    def unregister(self, replacement: Undoable) -> None:
        with self._lock:
            if self._replacements.get(replacement.name) is replacement:
                del self._replacements[replacement.name]
                self._step_of.pop(replacement.name, None)

    def replacement(self, name: str) -> Undoable | None:
        return self._replacements.get(name)

    def replacements(self, *, step: str | None = None) -> tuple[Undoable, ...]:
        """The installed replacements, oldest first (only those a plan step installed, with ``step``)."""
        with self._lock:
            for key in [key for key, item in self._replacements.items()
                        if isinstance(item, Override) and not item.active]:
                del self._replacements[key]  # its object is gone: nothing is replaced any more
                self._step_of.pop(key, None)
            return tuple(item for key, item in self._replacements.items()
                         if step is None or self._step_of.get(key) == step)

    def unowned(self) -> tuple[Undoable, ...]:
        """The replacements no plan step installed (an instance override, a patch applied directly)."""
        with self._lock:
            return tuple(item for key, item in self._replacements.items() if key not in self._step_of)

    def override_attribute(self, owner: object, attribute: str, replacement: object, *, name: str,
                           note: str = "") -> Override:
        """Set ``owner.attribute = replacement``, recorded so :meth:`reset` (or the result's ``remove``) undoes it."""
        override = Override(owner, attribute, replacement, name=name, note=note)
        self.register(override)
        return override

    @contextmanager
    def taking(self, step: str) -> Iterator[None]:
        """Replacements registered inside belong to plan step ``step`` (its ``undo`` removes them)."""
        self._taking.append(step)
        try:
            yield
        finally:
            self._taking.pop()

    def statuses(self) -> tuple[PatchStatus, ...]:
        return tuple(item.status() for item in self.replacements())

    def lines(self) -> tuple[str, ...]:
        """One line per installed replacement (``tfstrategy env``, the exit summary)."""
        return tuple(status.line() for status in self.statuses())

    # -- state of other modules -------------------------------------------------------------

    def own_state(self, name: str, clear: Callable[[], None]) -> None:
        """Have :meth:`reset` call ``clear`` (a module's job state: caches, counters, records)."""
        self._states[name] = clear

    def state_names(self) -> tuple[str, ...]:
        return tuple(self._states)

    def attachments(self, name: str) -> Attachments[Any]:
        """The per-object values of kind ``name`` (made at the first ask; :meth:`reset` empties them)."""
        with self._lock:
            return self._attachments.setdefault(name, Attachments(name))

    def attached(self, owner: object) -> tuple[str, ...]:
        """The kinds of value kept for ``owner`` in this job, so a test or a debugging session can see them."""
        with self._lock:
            return tuple(name for name, attachments in self._attachments.items() if attachments.get(owner) is not None)

    def keep_armed(self, name: str, arm: Callable[[], None]) -> None:
        """Have :meth:`reset` call ``arm`` once it cleared the job state: what lives as long as the process.

        The start-up hook of ``tfstrategy run``/``launch`` registers here: its supervision (the heartbeat thread,
        the signal handlers, the launcher's files) outlives a job, so a second job in a launched worker is
        supervised, counted and ledgered as the first was.
        """
        self._armed[name] = arm

    def once(self, key: str) -> bool:
        """True the first time ``key`` is asked for in this job (a message said once)."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
            return True

    def next_number(self, counter: str, start: int = 0) -> int:
        """The next number of ``counter``; never reset, as TensorFlow's runtime remembers what was numbered.

        (Collective keys: a strategy made after :meth:`reset` must still not reuse an earlier one's.)
        """
        with self._lock:
            return next(self._counters.setdefault(counter, itertools.count(start)))

    # -- the one reset ------------------------------------------------------------------------

    def reset(self) -> tuple[PatchStatus, ...]:
        """Undo every plan's steps and every replacement (newest first), clear every job state; return what was removed.

        Logical CPU devices and collective keys stay: TensorFlow's runtime cannot forget them; what
        :meth:`keep_armed` registered is armed again afterwards.
        """
        with self._lock:
            removed = tuple(item.status() for item in reversed(self.replacements()))
            for plan in reversed(list(self.plans.values())):
                plan.undo()  # what a step changed outside any replacement (TF_CONFIG, the dtype policy)
            for item in reversed(self.replacements()):
                item.remove()
            self._replacements.clear()
            self._step_of.clear()
            for clear in self._states.values():
                clear()
            for attachments in self._attachments.values():
                attachments.clear()
            self._fresh()
        for arm in list(self._armed.values()):
            arm()  # what the process keeps (the hook's supervision and plan), armed again for the next job
        return removed


#: The runtime of this process.
RUNTIME = ProcessRuntime()


def reset() -> None:
    """Undo every replacement tfstrategy installed in this process and clear every job state.

    A second job in the same process then starts as the first did (its plan is derived anew; under
    ``tfstrategy run``/``launch`` the start-up hook re-arms its supervision and takes its plan again).
    """
    RUNTIME.reset()
