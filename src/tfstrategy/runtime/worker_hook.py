"""tfstrategy inside a process it did not write: the start-up hook of ``tfstrategy run`` and ``launch``.

Users arrive with scripts that create their own strategy (``tf.distribute.
MultiWorkerMirroredStrategy()``, ``MirroredStrategy()``) and never call
``tfstrategy.select()``. The launcher puts :mod:`tfstrategy.runtime.startup`
first on ``PYTHONPATH`` and sets ``TFSTRATEGY_HOOK=1``; that directory's
``sitecustomize`` calls :func:`install` at interpreter start-up (for ``python
script.py``, ``python -m pkg`` and console scripts alike), then runs the
user's own ``sitecustomize``, if any. Without ``TFSTRATEGY_HOOK`` nothing of
tfstrategy is imported.

:func:`install` only registers an import watcher. The moment TensorFlow has
been imported, before the script can run a single op, :func:`on_tensorflow_imported`
takes the steps of the hook's plan (:func:`tfstrategy.runtime.plan.plan_steps`, the
same plan ``tfstrategy env`` prints) whose phase is ``tensorflow``, and once
Keras is importable those of phase ``keras``; the plan and what each step did
are kept by :data:`tfstrategy.state.RUNTIME`.
Under a multi-worker ``TF_CONFIG`` they prepare the multi-worker runtime before
the first op and make every strategy the script creates part of the one job, or
stop it with one line (:mod:`tfstrategy.runtime.one_job`). Every replacement of
TensorFlow's or Keras' code is a :class:`~tfstrategy.runtime.rewrites.Rewrite`,
undone by :func:`tfstrategy.runtime.reset`.

The hook acts only in the process it was installed for: it records its pid in
``TFSTRATEGY_HOOK_PID``, and a Python child of the script (a data loader, a
converter), which inherits the variable, stays unhooked.

With ``TFSTRATEGY_HOOK_SUMMARY=1`` (``tfstrategy run`` and ``launch``) one summary line goes to
stderr at exit, in the user's terms: the strategies, what changed for the script (each
step's and patch's ``change()``, "nothing changed" if none acted), the scope audit; the
step names, patches and replacements only with ``TFSTRATEGY_DEBUG=1`` (``--debug``). An
uncaught exception is shown from the script's frames (:mod:`tfstrategy.runtime.tracebacks`).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import native_log
from tfstrategy.errors import TFStrategyError
from tfstrategy.runtime import tracebacks, worker_watch
from tfstrategy.settings import (
    AUDIT_MODES,
    DEBUG,
    HOOK_PID,
    HOOK_SUMMARY,
    validate_audit_mode,
)
from tfstrategy.state.registry import RUNTIME
from tfstrategy.worker_contract import STARTUP_DIR as STARTUP_DIR  # re-exported: it moved there
from tfstrategy.worker_contract import hook_environment as hook_environment

if TYPE_CHECKING:
    from tfstrategy.runtime.plan import Plan
    from tfstrategy.runtime.step import Step

__all__ = ["AUDIT_MODES", "hook_environment", "validate_audit_mode", "install"]

def install() -> None:
    """Run :func:`on_tensorflow_imported` once TensorFlow is imported (at once if it already is).

    Does nothing in a Python child of the hooked process (``TFSTRATEGY_HOOK_PID`` names another pid).
    """
    owner = HOOK_PID.text(os.environ)
    if owner and owner != str(os.getpid()):
        return
    os.environ.update(HOOK_PID.to_environ(os.getpid()))
    if HOOK_SUMMARY.read(os.environ):
        atexit.register(_print_summary)
    _supervise()
    # The hook lives as long as the process: after tfstrategy.reset() a second job is supervised and
    # planned as the first was (batches counted, ledger kept, strategies joined).
    RUNTIME.keep_armed("hook", _rearm)
    if "tensorflow" in sys.modules:
        on_tensorflow_imported()
    else:
        # TensorFlow's C++ start-up lines come before it reads TF_CPP_MIN_LOG_LEVEL: held to it here.
        sys.meta_path.insert(0, _AfterImport("tensorflow", on_tensorflow_imported, hold_native_lines=True))
        # A script may import keras first; keras imports TensorFlow half-way through its own
        # import, so the Keras steps wait for keras to finish (see on_tensorflow_imported).
        sys.meta_path.insert(0, _AfterImport("keras", on_keras_imported))


def _supervise() -> None:
    from tfstrategy.multiworker.file_races import install_excepthook

    with RUNTIME.taking("supervision"):  # listed by patch_status() and env; the summary names the steps
        worker_watch.install()  # die with the launcher, error file, stacks, heartbeat
        install_excepthook()  # one line naming a path two workers wrote, after the traceback
        tracebacks.install()  # last, so the error file and the line above get the trimmed traceback too


#: The plan's phases this process reached (TensorFlow imported, Keras imported): taken again after a reset.
_REACHED: list[str] = []


def _rearm() -> None:
    """After :func:`reset`: supervision re-armed, then the hook's plan derived anew and taken up to where it was."""
    _supervise()
    for phase in tuple(_REACHED):
        RUNTIME.hook.steps += _plan().take(phase, on_error=_report)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of ``name`` so ``callback`` runs after it executed."""

    def __init__(self, name: str, callback: Callable[[], None], *, hold_native_lines: bool = False) -> None:
        self.name, self.callback, self.hold_native_lines = name, callback, hold_native_lines

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; and the lookup below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            level = native_log.log_level(os.environ) if self.hold_native_lines else 0
            spec.loader = _RunAfter(spec.loader, self.callback, level)
        return spec


class _RunAfter(importlib.abc.Loader):
    def __init__(self, loader: Any, callback: Callable[[], None], log_level: int = 0) -> None:
        self._loader, self._callback, self._log_level = loader, callback, log_level

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with native_log.native_start_up_held(self._log_level):
            self._loader.exec_module(module)
        try:
            self._callback()
        except TFStrategyError:
            raise  # a bad setting (e.g. TFSTRATEGY_CPU_REPLICAS) must not train on the wrong replicas
        except Exception as error:  # anything else must not break the user's import
            RUNTIME.hook.errors.append(f"{type(error).__name__}: {error}")
            print(f"tfstrategy: hook after importing {module.__name__}: {type(error).__name__}: {error}",
                  file=sys.stderr, flush=True)

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


def on_tensorflow_imported() -> None:
    """Take the hook's steps in this process; a step that fails is reported and skipped, never raised."""
    for phase in ("tensorflow", "strategy"):
        if phase not in _REACHED:
            _REACHED.append(phase)
        RUNTIME.hook.steps += _plan().take(phase, on_error=_report)
    keras = sys.modules.get("keras")
    if keras is not None and getattr(getattr(keras, "__spec__", None), "_initializing", False):
        return  # keras is importing TensorFlow half-way through its own import: on_keras_imported follows
    on_keras_imported()


def on_keras_imported() -> None:
    """The steps that need Keras, once (after TensorFlow's own steps)."""
    if "tensorflow" not in sys.modules:
        return  # keras failed before importing TensorFlow; on_tensorflow_imported will call back
    if "keras" not in _REACHED:
        _REACHED.append("keras")
    RUNTIME.hook.steps += _plan().take("keras", on_error=_report)


def hook_plan(env: Mapping[str, str] | None = None) -> tuple[Step, ...]:
    """The hook's steps for this environment (the same step objects ``tfstrategy env`` prints).

    Raises:
        TFStrategyError: an invalid setting (``TFSTRATEGY_CPU_REPLICAS``, ``TFSTRATEGY_AUDIT``, ...) or cluster.
    """
    from tfstrategy.runtime.inputs import HOOK, derive_inputs
    from tfstrategy.runtime.plan import plan_steps

    return plan_steps(derive_inputs(HOOK, env=env))


def _plan() -> Plan:
    """The hook's plan in this process, derived once (again after :func:`reset`)."""
    from tfstrategy.runtime.inputs import HOOK, derive_inputs
    from tfstrategy.runtime.plan import Plan, current_plan

    plan = current_plan(HOOK)
    return plan if plan is not None else Plan(derive_inputs(HOOK))


def _report(step: Step, error: Exception) -> None:
    message = f"{step.name}: {type(error).__name__}: {error}"
    RUNTIME.hook.errors.append(message)
    print(f"tfstrategy: hook step {message}", file=sys.stderr, flush=True)


def reset() -> None:
    """Undo everything tfstrategy did in this process and forget it (tests; a second job in one process)."""
    RUNTIME.reset()


def changes(steps: Iterable[Step], *, debug: bool = True) -> tuple[str, ...]:
    """What ``steps`` (and, through ``apply_patches``, the patches) changed for the script, in the user's terms;
    without ``debug`` the workarounds only by name (what each did is a sentence each: the line would run past 300)."""
    from tfstrategy.runtime.steps import ApplyPatches

    texts = (step.change_in_short() if isinstance(step, ApplyPatches) and not debug else step.change()
             for step in steps)
    return tuple(text for text in texts if text)


def _print_summary() -> None:
    if "tensorflow" not in sys.modules:
        return  # a process that never imported TensorFlow (a shell helper, a data tool): the hook did nothing
    from tfstrategy.runtime.inputs import HOOK
    from tfstrategy.runtime.plan import current_plan

    plan = current_plan(HOOK)
    debug = bool(DEBUG.read(os.environ))
    line = RUNTIME.hook.summary(changes(plan.steps if plan is not None else (), debug=debug), debug=debug,
                                replacements=tuple(item.name for item in RUNTIME.unowned()))
    print(line, file=sys.stderr, flush=True)
