"""tfstrategy inside a process it did not write: the start-up hook of ``tfstrategy run`` and ``launch``.

Users arrive with scripts that create their own strategy (``tf.distribute.
MultiWorkerMirroredStrategy()``, ``MirroredStrategy()``) and never call
``tfstrategy.select()``. The launcher puts :mod:`tfstrategy.launch.startup`
first on ``PYTHONPATH`` and sets ``TFSTRATEGY_HOOK=1``; that directory's
``sitecustomize`` calls :func:`install` at interpreter start-up (for ``python
script.py``, ``python -m pkg`` and console scripts alike), then runs the
user's own ``sitecustomize``, if any. Without ``TFSTRATEGY_HOOK`` nothing of
tfstrategy is imported.

:func:`install` only registers an import watcher. The moment TensorFlow has
been imported, before the script can run a single op, :func:`on_tensorflow_imported`
takes these named steps, each recorded in :data:`STATE`:

1. ``split_cpu``: split the CPU into ``TFSTRATEGY_CPU_REPLICAS`` logical devices;
2. ``record_creation_sites``: remember where variables are created, for the audit;
3. ``slurm_tf_config``: in a Slurm job step of 2+ tasks without ``TF_CONFIG``,
   set it from the step (:mod:`tfstrategy.multiworker.slurm`), as ``select()`` does;
4. ``default_devices``: ``MirroredStrategy()`` without ``devices`` gets the
   rehearsed CPUs (or ``TFSTRATEGY_DEVICES``), as ``select()`` would choose; and
   when ``TF_CONFIG`` describes several workers (``tfstrategy launch -n N``), it
   becomes a ``MultiWorkerMirroredStrategy`` across them, so one script runs
   unchanged from a laptop to a multi-worker job;
5. ``watch_multi_worker``: every ``MultiWorkerMirroredStrategy`` tells the launcher
   "creating" and then "joined", and gets the collective timeout when the
   script set none;
6. ``apply_patches``: the Keras workarounds the installed release needs;
   ``keras2_aliases``: ``Metric.reset_states()``, which Keras 3 renamed
   ``reset_state()`` and TensorFlow's own distributed tutorials still call;
7. ``audit``: ``Model.fit``/``evaluate`` audit the model's scope first
   (``TFSTRATEGY_AUDIT``: ``warn``, the default, reports once; ``stop`` raises
   :class:`~tfstrategy.errors.ScopeError` before the first step; ``off``);
   ``precision``: ``TFSTRATEGY_PRECISION`` (``--precision``) sets the Keras global
   dtype policy before the script builds its model.

With ``TFSTRATEGY_HOOK_SUMMARY=1`` (``tfstrategy run``) one summary line goes to
stderr at exit.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfstrategy.errors import ScopeError, TFStrategyError
from tfstrategy.settings import (
    ENV_AUDIT,
    ENV_CPU_REPLICAS,
    ENV_DEVICES,
    ENV_HOOK,
    ENV_HOOK_SUMMARY,
    resolve_collective_timeout,
)

__all__ = ["AUDIT_MODES", "hook_environment", "validate_audit_mode", "install"]

AUDIT_MODES = ("warn", "stop", "off")
#: The directory whose ``sitecustomize`` installs this hook; first on the workers' PYTHONPATH.
STARTUP_DIR = Path(__file__).resolve().parent / "startup"


@dataclass
class HookState:
    """What the hook did in this process, for the exit summary and for tests."""

    steps: list[tuple[str, str]] = field(default_factory=list)
    strategies: list[str] = field(default_factory=list)
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
    """Run :func:`on_tensorflow_imported` once TensorFlow is imported (at once if it already is)."""
    if os.environ.get(ENV_HOOK_SUMMARY) == "1":
        atexit.register(_print_summary)
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
    _take((_split_cpu, _record_creation_sites, _slurm_tf_config, _watch_multi_worker, _default_devices))
    keras = sys.modules.get("keras")
    if keras is not None and getattr(getattr(keras, "__spec__", None), "_initializing", False):
        return  # keras is importing TensorFlow half-way through its own import: on_keras_imported follows
    on_keras_imported()


def on_keras_imported() -> None:
    """The steps that need Keras, once (after TensorFlow's own steps)."""
    if "tensorflow" not in sys.modules:
        return  # keras failed before importing TensorFlow; on_tensorflow_imported will call back
    _take((_apply_patches, _keras2_aliases, _audit, _precision))


_TAKEN: set[str] = set()


def _take(steps: tuple[Callable[[], str | None], ...]) -> None:
    for step in steps:
        if step.__name__ in _TAKEN:
            continue  # taken meanwhile (a step's own import of keras runs on_keras_imported)
        _TAKEN.add(step.__name__)
        try:
            done = step()
        except Exception as error:  # the user's script must run even if tfstrategy cannot help it
            message = f"{step.__name__.lstrip('_')}: {type(error).__name__}: {error}"
            STATE.errors.append(message)
            print(f"tfstrategy: hook step {message}", file=sys.stderr, flush=True)
            if isinstance(error, TFStrategyError) and step in (_split_cpu, _precision):
                raise  # a bad --cpu-replicas/precision must not silently train on one replica/in float32
        else:
            if done:
                STATE.steps.append((step.__name__.lstrip("_"), done))


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


def _chosen_devices() -> list[str] | None:
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


def _default_devices() -> str | None:
    import tensorflow as tf

    from tfstrategy.multiworker.cluster import load_cluster_config

    cls = tf.distribute.MirroredStrategy
    config = load_cluster_config()
    if config is not None and config.num_workers > 1:
        # Named as TensorFlow exports it (its class is CollectiveAllReduceStrategy).
        multi_worker = type("MultiWorkerMirroredStrategy", (tf.distribute.MultiWorkerMirroredStrategy,),
                            {"__module__": __name__})

        def __new__(klass: type, devices: Any = None, cross_device_ops: Any = None) -> Any:
            if klass is cls and devices is None:
                return multi_worker()
            return object.__new__(klass)

        cls.__new__ = __new__
        return f"MirroredStrategy() without devices is a MultiWorkerMirroredStrategy over {config.num_workers} workers"
    chosen = _chosen_devices()
    if chosen is None:
        return None
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, devices: Any = None, cross_device_ops: Any = None) -> None:
        original(self, chosen if devices is None else devices, cross_device_ops)

    cls.__init__ = __init__
    return f"MirroredStrategy() without devices uses {','.join(chosen)}"


def _watch_multi_worker() -> str:
    import tensorflow as tf

    from tfstrategy.multiworker.worker_protocol import signal_joined, signal_starting

    cls = tf.distribute.MultiWorkerMirroredStrategy
    original = cls.__init__
    signature = inspect.signature(original)
    timeout, _ = resolve_collective_timeout(None)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        options = bound.arguments.get("communication_options")
        if timeout is not None and getattr(options, "timeout_seconds", None) is None:
            # A stalled peer then fails the job after the timeout instead of hanging it forever.
            default = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
            bound.arguments["communication_options"] = default if options is None else options.merge(default)
        signal_starting()
        original(*bound.args, **bound.kwargs)
        signal_joined()
        STATE.strategies.append(f"{type(self).__name__}, {self.num_replicas_in_sync} replicas")

    cls.__init__ = __init__
    _watch_mirrored(tf.distribute.MirroredStrategy)
    return f"MultiWorkerMirroredStrategy signals the launcher; collective timeout {timeout or 'none'}"


def _watch_mirrored(cls: type) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        STATE.strategies.append(f"{type(self).__name__}, {self.num_replicas_in_sync} replicas")

    cls.__init__ = __init__


def _apply_patches() -> str | None:
    from tfstrategy.patches import apply_patches

    installed = [status.name for status in apply_patches() if status.installed]
    STATE.patches = installed
    return ", ".join(installed) or None


def _precision() -> str | None:
    from tfstrategy.training.precision import resolve_precision, set_precision

    precision, _ = resolve_precision()
    return set_precision(precision) if precision else None


def _keras2_aliases() -> str | None:
    from tfstrategy import _compat

    metric = _compat.keras_for().metrics.Metric
    if hasattr(metric, "reset_states") or not hasattr(metric, "reset_state"):
        return None

    def reset_states(self: Any) -> None:
        """Keras 2's name of :meth:`reset_state` (added back by tfstrategy's start-up hook)."""
        self.reset_state()

    metric.reset_states = reset_states
    return "Metric.reset_states() calls reset_state() (Keras 2 name, used by TensorFlow's tutorials)"


def _audit() -> str | None:
    mode = validate_audit_mode(os.environ.get(ENV_AUDIT) or "warn", name=ENV_AUDIT)
    if mode == "off":
        return None
    from tfstrategy import _compat

    # tf.keras's Model, and Keras 3's too if the script imported it beside tf_keras.
    flavours = {_compat.keras_for(), sys.modules.get("keras")} - {None}
    for keras in flavours:
        for method in ("fit", "evaluate"):
            setattr(keras.Model, method, _audited(getattr(keras.Model, method), method, mode))
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
    STATE.audited += 1
    for advice in report.advice:
        print(f"tfstrategy: {advice}", file=sys.stderr, flush=True)
    if report.passed:
        return
    message = report.message()
    STATE.findings.append(message)
    if mode == "stop":
        raise ScopeError(f"tfstrategy stopped {method}() before its first step (--audit stop):\n{message}")
    print(f"tfstrategy: scope audit before {method}() (--audit warn, training goes on):\n{message}",
          file=sys.stderr, flush=True)


def _print_summary() -> None:
    print(STATE.summary(), file=sys.stderr, flush=True)
