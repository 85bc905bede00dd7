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
Keras is importable those of phase ``keras``; each is recorded in :data:`STATE`.
Under a multi-worker ``TF_CONFIG`` they prepare the multi-worker runtime before
the first op and make every strategy the script creates part of the one job, or
stop it with one line (:mod:`tfstrategy.runtime.one_job`). Every replacement of
TensorFlow's or Keras' code is a :class:`~tfstrategy.runtime.rewrites.Rewrite`,
undone by :func:`~tfstrategy.runtime.rewrites.remove_rewrites`.

The hook acts only in the process it was installed for: it records its pid in
``TFSTRATEGY_HOOK_PID``, and a Python child of the script (a data loader, a
converter), which inherits the variable, stays unhooked.

With ``TFSTRATEGY_HOOK_SUMMARY=1`` (``tfstrategy run``) one summary line goes to
stderr at exit.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfstrategy.errors import ScopeError, TFStrategyError
from tfstrategy.runtime import worker_watch
from tfstrategy.settings import (
    AUDIT_MODES,
    ENV_AUDIT,
    ENV_CPU_REPLICAS,
    ENV_DEVICES,
    ENV_HOOK,
    ENV_HOOK_PID,
    ENV_HOOK_SUMMARY,
    ENV_JOIN_FILE,
    ENV_PROFILE,
)

__all__ = ["AUDIT_MODES", "hook_environment", "validate_audit_mode", "install"]

#: The directory whose ``sitecustomize`` installs this hook; first on the workers' PYTHONPATH.
STARTUP_DIR = Path(__file__).resolve().parent / "startup"


@dataclass
class HookState:
    """What the hook did in this process, for the exit summary and for tests."""

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

    def summary(self) -> str:
        strategies = ", ".join(self.strategies) or "no strategy created"
        patches = ", ".join(self.patches) or "none needed"
        if not self.audited:
            audit = "no fit/evaluate audited"
        elif self.findings:
            audit = f"{len(self.findings)} of {self.audited} audit(s) found variables outside the scope"
        else:
            audit = f"{self.audited} audit(s), every variable in its strategy's scope"
        line = f"tfstrategy: {strategies}; patches: {patches}; audit: {audit}"
        line += f"; steps: {', '.join(name for name, _ in self.steps) or 'none'}"
        line += "".join(f"; note: {note}" for note in self.notes)
        return line + (f"; hook errors: {'; '.join(self.errors)}" if self.errors else "")


STATE = HookState()


def hook_environment(
    *,
    audit: str = "warn",
    cpu_replicas: int | None = None,
    devices: str | None = None,
    summary: bool = False,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment that runs a process with this hook (what ``run`` and ``launch`` set).

    Raises:
        TFStrategyError: ``audit`` is not one of :data:`AUDIT_MODES`.
    """
    env = dict(os.environ if env is None else env)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(STARTUP_DIR) + (os.pathsep + path if path else "")
    env[ENV_HOOK] = "1"
    env.pop(ENV_HOOK_PID, None)  # the process started with this environment is the one to hook
    env[ENV_AUDIT] = validate_audit_mode(audit)
    if cpu_replicas is not None:
        env[ENV_CPU_REPLICAS] = str(cpu_replicas)
    if devices is not None:
        env[ENV_DEVICES] = devices
    if summary:
        env[ENV_HOOK_SUMMARY] = "1"
    return env


def validate_audit_mode(mode: object, *, name: str = "--audit") -> str:
    """``warn``, ``stop`` or ``off``.

    Raises:
        TFStrategyError: anything else.
    """
    text = str(mode).strip().lower()
    if text not in AUDIT_MODES:
        raise TFStrategyError(
            f"Received {name} {mode!r}; expected one of {', '.join(AUDIT_MODES)}: warn reports variables made outside "
            "the strategy's scope and trains on, stop refuses to train, off skips the audit."
        )
    return text


def install() -> None:
    """Run :func:`on_tensorflow_imported` once TensorFlow is imported (at once if it already is).

    Does nothing in a Python child of the hooked process (``TFSTRATEGY_HOOK_PID`` names another pid).
    """
    owner = os.environ.get(ENV_HOOK_PID)
    if owner and owner != str(os.getpid()):
        return
    os.environ[ENV_HOOK_PID] = str(os.getpid())
    if os.environ.get(ENV_HOOK_SUMMARY) == "1":
        atexit.register(_print_summary)
    worker_watch.install()  # supervision: die with the launcher, error file, stacks, heartbeat
    from tfstrategy.multiworker.file_races import install_excepthook

    install_excepthook()  # one line naming a path two workers wrote, after the traceback
    if "tensorflow" in sys.modules:
        on_tensorflow_imported()
    else:
        sys.meta_path.insert(0, _AfterImport("tensorflow", on_tensorflow_imported))
        # A script may import keras first; keras imports TensorFlow half-way through its own
        # import, so the Keras steps wait for keras to finish (see on_tensorflow_imported).
        sys.meta_path.insert(0, _AfterImport("keras", on_keras_imported))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of ``name`` so ``callback`` runs after it executed."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot; and the lookup below must not find this finder again
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _RunAfter(spec.loader, self.callback)
        return spec


class _RunAfter(importlib.abc.Loader):
    def __init__(self, loader: Any, callback: Callable[[], None]) -> None:
        self._loader, self._callback = loader, callback

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            self._callback()
        except TFStrategyError:
            raise  # a bad setting (e.g. TFSTRATEGY_CPU_REPLICAS) must not train on the wrong replicas
        except Exception as error:  # anything else must not break the user's import
            STATE.errors.append(f"{type(error).__name__}: {error}")
            print(f"tfstrategy: hook after importing {module.__name__}: {type(error).__name__}: {error}",
                  file=sys.stderr, flush=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def on_tensorflow_imported() -> None:
    """Take the hook's steps in this process; a step that fails is reported and skipped, never raised."""
    _take(_phase("tensorflow"))
    keras = sys.modules.get("keras")
    if keras is not None and getattr(getattr(keras, "__spec__", None), "_initializing", False):
        return  # keras is importing TensorFlow half-way through its own import: on_keras_imported follows
    on_keras_imported()


def on_keras_imported() -> None:
    """The steps that need Keras, once (after TensorFlow's own steps)."""
    if "tensorflow" not in sys.modules:
        return  # keras failed before importing TensorFlow; on_tensorflow_imported will call back
    _take(_phase("keras"))


_TAKEN: set[str] = set()
_PLAN: list[Any] = []


def hook_plan(env: Mapping[str, str] | None = None) -> tuple[Any, ...]:
    """The hook's steps for this environment (:func:`tfstrategy.runtime.plan.plan_steps`; ``tfstrategy env`` prints it).

    Raises:
        TFStrategyError: an invalid ``TFSTRATEGY_CPU_REPLICAS`` or ``TFSTRATEGY_AUDIT``.
    """
    from tfstrategy.multiworker.cluster import load_cluster_config
    from tfstrategy.multiworker.slurm import cluster_from_slurm_step
    from tfstrategy.runtime.plan import PlanInputs, plan_steps
    from tfstrategy.selection.cpu_split import validate_cpu_replicas
    from tfstrategy.training.precision import resolve_precision

    env = os.environ if env is None else env
    replicas = validate_cpu_replicas(env.get(ENV_CPU_REPLICAS) or None, name=ENV_CPU_REPLICAS)
    audit = validate_audit_mode(env.get(ENV_AUDIT) or "warn", name=ENV_AUDIT)
    tasks, source = 0, None
    try:
        config = load_cluster_config(env)
        slurm = None if config is not None else cluster_from_slurm_step(env)
    except TFStrategyError as error:  # TensorFlow reports a bad TF_CONFIG its own way; the hook adds nothing
        STATE.errors.append(f"plan: {type(error).__name__}: {error}")
        config = slurm = None
    if config is not None:
        tasks, source = config.num_workers, "TF_CONFIG"
    elif slurm is not None:
        tasks, source = slurm.config.num_workers, "Slurm"
    precision, _ = resolve_precision(None, env)
    return plan_steps(PlanInputs(consumer="hook", cpu_replicas=replicas, devices=env.get(ENV_DEVICES) or None,
                                 cluster_tasks=tasks, cluster_source=source, audit=audit,
                                 under_launcher=bool(env.get(ENV_JOIN_FILE)), precision=precision,
                                 profile=(env.get(ENV_PROFILE) or "").strip() or None))


def _phase(phase: str) -> list[Callable[[], str | None]]:
    if not _PLAN:
        _PLAN.extend(hook_plan())
    return [_STEPS[step.name] for step in _PLAN if step.phase == phase]


def _take(steps: list[Callable[[], str | None]]) -> None:
    for step in steps:
        name = step.__name__.lstrip("_")
        if name in _TAKEN:
            continue  # taken meanwhile (a step's own import of keras runs on_keras_imported)
        _TAKEN.add(name)
        try:
            done = step()
        except Exception as error:  # the user's script must run even if tfstrategy cannot help it
            message = f"{name}: {type(error).__name__}: {error}"
            STATE.errors.append(message)
            print(f"tfstrategy: hook step {message}", file=sys.stderr, flush=True)
            if isinstance(error, TFStrategyError) and step in (_split_cpu, _set_precision):
                raise  # a bad --cpu-replicas/precision must not silently train on one replica/in float32
        else:
            if done:
                STATE.steps.append((name, done))


def _split_cpu() -> str | None:
    from tfstrategy.selection.cpu_split import configure_cpu_replicas, validate_cpu_replicas

    count = validate_cpu_replicas(os.environ.get(ENV_CPU_REPLICAS) or None)
    if count is None:
        return None
    return f"{configure_cpu_replicas(count)} logical CPU devices"


def _record_creation_sites() -> str | None:
    from tfstrategy.scope.creation_sites import start_recording

    return "on in the main thread" if start_recording() else None


def _slurm_tf_config() -> str | None:
    from tfstrategy.multiworker.slurm import cluster_from_slurm_step

    cluster = cluster_from_slurm_step()
    if cluster is None:
        return None
    os.environ["TF_CONFIG"] = cluster.config.to_json()
    return f"set TF_CONFIG from {cluster.describe()}"


def chosen_devices() -> list[str] | None:
    """The devices ``select()`` would give a MirroredStrategy from the hook's settings, or ``None``."""
    from tfstrategy.selection.choose import choose
    from tfstrategy.selection.cpu_split import validate_cpu_replicas
    from tfstrategy.selection.devices import parse_devices
    from tfstrategy.selection.host import HostInfo
    from tfstrategy.settings import StrategyKind

    replicas = validate_cpu_replicas(os.environ.get(ENV_CPU_REPLICAS) or None)
    request = parse_devices(os.environ.get(ENV_DEVICES) or None)
    if replicas is None and request is None:
        return None
    choice = choose(kind=StrategyKind.MIRRORED, devices=request, cpu_replicas=replicas, host=HostInfo.detect())
    return [device.tf_name for device in choice.devices]


def _apply_patches() -> str | None:
    from tfstrategy.patches import apply_patches

    installed = [status.name for status in apply_patches() if status.installed]
    STATE.patches = installed
    return ", ".join(installed) or None


def _keras2_aliases() -> str | None:
    from tfstrategy import _compat
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite

    keras = _compat.keras_for()
    metric = keras.metrics.Metric
    if hasattr(metric, "reset_states") or not hasattr(metric, "reset_state"):
        return None

    def alias(original: Any) -> Callable[..., Any]:
        def reset_states(self: Any) -> None:
            """Keras 2's name of :meth:`reset_state` (added back by tfstrategy's start-up hook)."""
            self.reset_state()

        return reset_states

    install_rewrite(Rewrite("keras2_aliases", lambda: keras, {"metrics.Metric.reset_states": alias}))
    return "Metric.reset_states() calls reset_state() (Keras 2 name, used by TensorFlow's tutorials)"


def _audit() -> str | None:
    mode = validate_audit_mode(os.environ.get(ENV_AUDIT) or "warn", name=ENV_AUDIT)
    if mode == "off":
        return None
    from tfstrategy.runtime.hook_strategies import _keras_flavours
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite

    for keras in _keras_flavours():
        factories = {f"Model.{method}": functools.partial(_audited, method=method, mode=mode)
                     for method in ("fit", "evaluate")}
        install_rewrite(Rewrite(f"audit:{keras.__name__}", lambda k=keras: k, factories))
    return f"Model.fit and Model.evaluate audit the scope first ({mode})"


def _audited(original: Callable[..., Any], method: str, mode: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(model: Any, *args: Any, **kwargs: Any) -> Any:
        if method == "fit":
            from tfstrategy.training.datasets import refuse_endless_fit
            from tfstrategy.training.sentinel import add_sentinel, resolve_sentinel

            refuse_endless_fit(args, kwargs)
            add_sentinel(model, kwargs, resolve_sentinel())  # TFSTRATEGY_SENTINEL (launch: epoch)
        _audit_model(model, method, mode)
        return original(model, *args, **kwargs)

    return wrapper


_AUDITED: set[int] = set()


def _audit_model(model: Any, method: str, mode: str) -> None:
    import tensorflow as tf

    from tfstrategy import _compat
    from tfstrategy.scope.audit import audit_scope

    if id(model) in _AUDITED:
        return
    _AUDITED.add(id(model))
    strategy = _compat.model_strategy(model) or tf.distribute.get_strategy()
    report = audit_scope(model, strategy)
    for advice in report.advice:
        print(f"tfstrategy: {advice}", file=sys.stderr, flush=True)
    STATE.audited += 1
    if report.passed:
        return
    message = report.message()
    STATE.findings.append(message)
    if mode == "stop":
        raise ScopeError(f"tfstrategy stopped {method}() before its first step (--audit stop):\n{message}")
    print(f"tfstrategy: scope audit before {method}() (--audit warn, training goes on):\n{message}",
          file=sys.stderr, flush=True)


def _count_batches() -> str | None:
    from tfstrategy.runtime.hook_strategies import _keras_flavours

    return worker_watch.count_batches(_keras_flavours())


def reset() -> None:
    """Forget this process's hook state (tests; a second job in one process starts clean)."""
    fresh = HookState()
    for name in fresh.__dataclass_fields__:
        setattr(STATE, name, getattr(fresh, name))  # in place: other modules hold STATE itself
    _TAKEN.clear()
    _AUDITED.clear()
    worker_watch.reset()


def _prepare_collectives() -> str | None:
    from tfstrategy.runtime.hook_strategies import prepare_collectives

    return prepare_collectives()


def _watch_strategies() -> str | None:
    from tfstrategy.runtime.hook_strategies import watch_strategies

    return watch_strategies()


def _mirrored_devices() -> str | None:
    from tfstrategy.runtime.hook_strategies import mirrored_devices

    return mirrored_devices()


def _refuse_unjoinable() -> str | None:
    from tfstrategy.runtime.hook_strategies import refuse_unjoinable

    return refuse_unjoinable()


def _checkpoint_files() -> str | None:
    from tfstrategy.runtime.hook_checkpoints import checkpoint_files

    return checkpoint_files()


def _data_sharding() -> str | None:
    from tfstrategy.runtime.hook_datasets import data_sharding

    return data_sharding()


def _set_precision() -> str | None:
    from tfstrategy.training.precision import resolve_precision, set_precision

    precision, _ = resolve_precision()
    return set_precision(precision) if precision else None


def _performance_report() -> str | None:
    from tfstrategy.runtime.hook_strategies import _keras_flavours
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite
    from tfstrategy.performance.report import tracker_from_environment

    settings = tracker_from_environment()
    if settings is None:
        return None
    for keras in _keras_flavours():
        factories = {"Model.fit": functools.partial(_reported, settings=settings)}
        install_rewrite(Rewrite(f"performance_report:{keras.__name__}", lambda k=keras: k, factories))
    return f"Model.fit reports where each step's time goes, into {settings['directory']}"


def _reported(original: Callable[..., Any], settings: dict[str, Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(model: Any, *args: Any, **kwargs: Any) -> Any:
        from tfstrategy.performance.report import add_report

        if len(args) > 5:  # callbacks passed positionally: fit(x, y, batch_size, epochs, verbose, callbacks, ...)
            given = {"callbacks": args[5]}
            add_report(model, args, given, settings)
            args = (*args[:5], given["callbacks"], *args[6:])
        else:
            add_report(model, args, kwargs, settings)
        return original(model, *args, **kwargs)

    return wrapper


def _refuse_unjoined_fit() -> str | None:
    from tfstrategy.runtime.hook_strategies import refuse_unjoined_fit

    return refuse_unjoined_fit()


#: The function of each step name of the hook's plan (tfstrategy.runtime.plan).
_STEPS: dict[str, Callable[[], str | None]] = {
    step.__name__.lstrip("_"): step
    for step in (_split_cpu, _record_creation_sites, _slurm_tf_config, _prepare_collectives, _watch_strategies,
                 _mirrored_devices, _refuse_unjoinable, _checkpoint_files, _data_sharding, _apply_patches,
                 _keras2_aliases, _audit, _refuse_unjoined_fit, _count_batches, _set_precision,
                 _performance_report)
}


def _print_summary() -> None:
    if "tensorflow" not in sys.modules:
        return  # a process that never imported TensorFlow (a shell helper, a data tool): the hook did nothing
    print(STATE.summary(), file=sys.stderr, flush=True)
