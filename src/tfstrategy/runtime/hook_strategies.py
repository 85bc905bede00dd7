"""The hook's strategy steps: prepare the multi-worker runtime, join or refuse each strategy, name every one.

Each function here is one step of the hook's plan (:mod:`tfstrategy.runtime.plan`) and
installs its changes as :class:`~tfstrategy.runtime.rewrites.Rewrite` objects, so
they can be undone. What joins and what is refused is decided purely in
:mod:`tfstrategy.runtime.one_job`.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

from tfstrategy.contract.exits import EXIT_FAILURE, EXIT_STOPPED
from tfstrategy.errors import DeviceError, TFStrategyError
from tfstrategy.multiworker.cluster import ClusterConfig
from tfstrategy.runtime import device_lists, one_job
from tfstrategy.runtime.inputs import PlanInputs
from tfstrategy.runtime.rewrites import Rewrite, install_rewrite
from tfstrategy.selection.names import strategy_name
from tfstrategy.settings import DEVICE_CHECK
from tfstrategy.state.registry import KEY_STRIDE, RUNTIME
from tfstrategy.worker_contract import STOP_PREFIXES

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy

__all__ = ["chosen_devices", "keras_flavours", "prepare_collectives", "watch_strategies", "mirrored_devices",
           "refuse_unjoinable", "refuse_unjoined_fit", "stop"]


def _distribute() -> Any:
    import tensorflow as tf

    return tf.distribute


def _script_line() -> str:
    """``file:line`` of the user's code that called into TensorFlow (the first frame outside TF and tfstrategy)."""
    for frame in inspect.stack()[2:]:
        name = frame.filename
        if "tensorflow" not in name and "tfstrategy" not in name and "keras" not in name and not name.startswith("<"):
            return f"{os.path.relpath(name) if not os.path.relpath(name).startswith('..') else name}:{frame.lineno}"
    return "an unknown line"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _called_by_tfstrategy(depth: int = 2) -> bool:
    """Whether tfstrategy's own code (``select()``, the checks) is creating the strategy: it chose it explicitly."""
    caller = sys._getframe(depth).f_code.co_filename
    return os.path.abspath(caller).startswith(_PACKAGE + os.sep) and "hook_strategies" not in caller


def _made_by_a_probe() -> bool:
    """Whether a patch's probe (``tfstrategy/patches/``) creates the strategy, not the script or ``select()``.

    The first caller outside TensorFlow, Keras, this module's wrappers and the maker every
    tfstrategy strategy comes from (``selection/strategies.py``, whose caller is a probe or ``select()``) decides.
    """
    frame: FrameType | None = sys._getframe(1)
    probes = os.path.join(_PACKAGE, "patches") + os.sep
    maker = os.path.join(_PACKAGE, "selection", "strategies.py")
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        parts = name.split(os.sep)
        if "hook_strategies" not in name and name != maker and "tensorflow" not in parts and "keras" not in parts:
            return name.startswith(probes)
        frame = frame.f_back
    return False


def stop(message: str) -> NoReturn:
    """End the process on a user error: ``message`` as one line on stderr, exit status 2, nothing after it.

    A refused strategy or a missing device would fail the same way on every try, so the
    launcher makes this line its headline and does not restart the job (``STOP_PREFIXES``);
    no traceback, exit summary or second line follows, and the script cannot catch it.
    """
    if not message.startswith(STOP_PREFIXES):
        raise ValueError(f"a stop line starts with one of {STOP_PREFIXES}, not {message[:40]!r}")
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    os._exit(EXIT_STOPPED)


def prepare_collectives(config: ClusterConfig | None) -> str | None:
    """Configure collectives and the collective server before the first op, as MultiWorkerMirroredStrategy would."""
    from tfstrategy import _compat

    if config is None:
        return None
    cluster = {role: list(addresses) for role, addresses in config.cluster.items()}
    if not _compat.prepare_collective_runtime(cluster, config.task_type, config.task_index):
        return "the runtime had already started; left as it was"
    install_rewrite(Rewrite("collectives_enabled_once", _compat.eager_context_module,
                            {"Context.enable_collective_ops": _enable_once}))
    install_rewrite(Rewrite("collective_keys_per_strategy", _compat.collective_strategy_module,
                            {_compat.initialize_multi_worker_target(): _keys_of_its_own}))
    task = (config.task_type, config.task_index)
    install_rewrite(Rewrite("local_logical_devices", lambda: __import__("tensorflow").config,
                            {"list_logical_devices": lambda original: _local_devices(original, task)}))
    return (f"{config.task_type} {config.task_index} of {config.num_workers}: collectives configured before the first "
            "op; list_logical_devices() lists this worker's devices until it joins")


def _local_devices(original: Callable[..., Any], task: device_lists.Task) -> Callable[..., object]:
    """``tf.config.list_logical_devices`` lists this worker's devices only, as in plain TensorFlow, until it joins.

    The cluster configured at import would otherwise show every worker's devices, and a
    script's ``MirroredStrategy(tf.config.list_logical_devices('CPU'))`` could not join.
    """

    @functools.wraps(original)
    def list_logical_devices(device_type: str | None = None) -> list[object]:
        found = original(device_type)
        if RUNTIME.hook.joined:
            return list(found)
        import tensorflow as tf

        pairs = device_lists.local_view([(device.name, device.device_type) for device in found], task)
        return [tf.config.LogicalDevice(name=name, device_type=kind) for name, kind in pairs]

    return list_logical_devices


def _enable_once(original: Callable[..., object]) -> Callable[..., object]:
    """The strategy's own enable, on a runtime that already started with the same server, does nothing.

    Called again on a running context, ``enable_collective_ops`` rebuilds the
    collective server; a peer that had already reached its first collective then
    waits for an answer that never comes (measured: 3 of 6 runs of a script with
    a dataset before its strategy hung at the first variable's broadcast).
    """
    from tfstrategy import _compat

    @functools.wraps(original)
    def enable_collective_ops(self: object, server_def: object) -> None:
        if _compat.serves_already(self, server_def):
            return
        original(self, server_def)

    return enable_collective_ops


def _keys_of_its_own(original: Callable[..., object]) -> Callable[..., object]:
    """Each MultiWorkerMirroredStrategy of the process starts its collective keys where no earlier one's are.

    Every strategy numbers its collectives from the same first group and instance
    key. TensorFlow's runtime remembers each key's collective (kind, dtype) until
    the collective server is rebuilt, which :func:`_enable_once` no longer does:
    a second strategy reusing the keys fails at its first collective with
    "Collective instance 124 expected type 0 and data_type 1 but got type 1 and
    data_type 9" (measured: the Keras guide's fault-tolerance recipe, 4 of 4 runs).
    Every worker creates its strategies in the same order, so the n-th strategy of
    each worker gets the same keys, apart from the n-1 before it.
    """
    from tfstrategy import _compat

    @functools.wraps(original)
    def _initialize_multi_worker(self: object, cluster_resolver: object) -> object:
        _compat.offset_collective_key_base(self, KEY_STRIDE * RUNTIME.next_number("multi_worker_strategies"))
        return original(self, cluster_resolver)

    return _initialize_multi_worker


def _note_unused_replicas(strategy: Strategy, cpu_replicas: str | None) -> None:
    """``--cpu-replicas`` with a strategy it cannot change (OneDevice, MultiWorkerMirrored): said once."""
    distribute = _distribute()
    kind = next((name for name in device_lists.FIXED_DEVICE_STRATEGIES
                 if isinstance(strategy, getattr(distribute, name))), None)
    if kind is None or _created_by_tfstrategy():
        return
    note = device_lists.replicas_note(kind, cpu_replicas, _script_line())
    if note and not any(known.startswith(f"{kind} at ") for known in RUNTIME.hook.notes):  # once per kind
        RUNTIME.hook.notes.append(note)
        print(f"tfstrategy: {note}", file=sys.stderr, flush=True)


def _created_by_tfstrategy() -> bool:
    """Whether the first caller outside TensorFlow, Keras and this module is tfstrategy's own code (``select()``)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        parts = name.split(os.sep)
        if "hook_strategies" not in name and "tensorflow" not in parts and "keras" not in parts:
            return name.startswith(_PACKAGE + os.sep)
        frame = frame.f_back
    return False


def _describe(strategy: Strategy) -> str:
    try:
        replicas = int(strategy.num_replicas_in_sync)
    except Exception:  # e.g. a ParameterServerStrategy before its cluster answers
        return strategy_name(strategy)
    return f"{strategy_name(strategy)}, {replicas} replica{'' if replicas == 1 else 's'}"


def watch_strategies(timeout: float | None, cpu_replicas: str | None = None) -> str:
    """Every strategy is named in the summary; MultiWorkerMirroredStrategy signals the launcher and gets a timeout.

    ``cpu_replicas`` is ``--cpu-replicas`` as given (noted once where a strategy cannot use it).
    """
    from tfstrategy import _compat
    from tfstrategy.multiworker.worker_protocol import signal_joined, signal_starting

    distribute = _distribute()
    signature = inspect.signature(distribute.MultiWorkerMirroredStrategy.__init__)

    def base_init(original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def __init__(self: Any, *args: object, **kwargs: object) -> None:
            original(self, *args, **kwargs)
            if not _compat.is_default_strategy(self) and not _made_by_a_probe():
                RUNTIME.hook.strategies.append(_describe(self))
                _note_unused_replicas(self, cpu_replicas)

        return __init__

    def mwms_init(original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def __init__(self: object, *args: object, **kwargs: object) -> None:
            bound = signature.bind(self, *args, **kwargs)
            options = bound.arguments.get("communication_options")
            if timeout is not None and getattr(options, "timeout_seconds", None) is None:
                # Only when asked for (TFSTRATEGY_COLLECTIVE_TIMEOUT): TensorFlow holds a thread per collective for
                # the timeout, so a default one would exhaust a fast job's threads (docs/reference/upstream-bugs.md).
                default = distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
                bound.arguments["communication_options"] = default if options is None else options.merge(default)
            signal_starting()
            original(*bound.args, **bound.kwargs)
            signal_joined()
            RUNTIME.hook.joined = True

        return __init__

    install_rewrite(Rewrite("watch_strategies", _distribute,
                            {"Strategy.__init__": base_init, "MultiWorkerMirroredStrategy.__init__": mwms_init}))
    return f"every strategy named in the summary; MultiWorkerMirroredStrategy signals the launcher; collective " \
           f"timeout {timeout or 'none'}"


def mirrored_devices(inputs: PlanInputs) -> str:
    """``MirroredStrategy``: join the job or be refused (multi-worker), else defaults and a checked device list."""
    distribute = _distribute()
    config = inputs.cluster if inputs.multi_worker else None
    cls = distribute.MirroredStrategy
    if config is not None:
        from tfstrategy.selection.host import HostInfo

        multi_worker = type("MultiWorkerMirroredStrategy", (distribute.MultiWorkerMirroredStrategy,),
                            {"__module__": __name__})
        gpus = len(__import__("tensorflow").config.list_physical_devices("GPU"))
        local = one_job.worker_devices(gpus)

        def new(original: object) -> Callable[..., object]:
            def __new__(klass: type, devices: object = None, cross_device_ops: object = None) -> object:
                if klass is not cls or (devices is not None and _called_by_tfstrategy()):
                    return object.__new__(klass)
                task = (config.task_type, config.task_index)
                listed = None if devices is None else device_lists.read_device_list(devices, task)
                decision = one_job.decide_mirrored(listed, local, config.num_workers, host=HostInfo.detect(),
                                                   where=_script_line())
                if decision.action == one_job.REFUSE:
                    stop(decision.message)
                RUNTIME.hook.changed("mirrored_devices", "MirroredStrategy() made the job's MultiWorkerMirroredStrategy")
                return multi_worker()

            return __new__

        install_rewrite(Rewrite("mirrored_devices", _distribute, {"MirroredStrategy.__new__": new}))
        return f"MirroredStrategy() is a MultiWorkerMirroredStrategy over {config.num_workers} workers; other device " \
               "lists are refused"

    try:
        chosen = chosen_devices(inputs)
    except DeviceError as error:  # TFSTRATEGY_DEVICES naming a device this host lacks: never the CPU instead
        stop(f"tfstrategy stopped the script before its strategy: {error}")

    def init(original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def __init__(self: object, devices: object = None, cross_device_ops: object = None) -> None:
            if devices is None:
                if chosen is not None:
                    RUNTIME.hook.changed("mirrored_devices", f"MirroredStrategy() given {len(chosen)} devices")
                original(self, chosen, cross_device_ops)
                return
            if not _called_by_tfstrategy():  # select() and the patches' probes list their devices on purpose
                devices = _check_listed(devices, chosen, inputs)
            original(self, devices, cross_device_ops)

        return __init__

    install_rewrite(Rewrite("mirrored_devices", _distribute, {"MirroredStrategy.__init__": init}))
    head = f"MirroredStrategy() without devices uses {','.join(chosen)}; " if chosen else ""
    return head + "a device list is checked against this host"


def chosen_devices(inputs: PlanInputs) -> list[str] | None:
    """The devices ``select()`` would give a MirroredStrategy from the hook's settings, or ``None``."""
    from tfstrategy.selection.choose import choose
    from tfstrategy.selection.host import HostInfo
    from tfstrategy.settings import StrategyKind

    if inputs.cpu_replicas is None and inputs.devices is None:
        return None
    choice = choose(kind=StrategyKind.MIRRORED, devices=inputs.devices, cpu_replicas=inputs.cpu_replicas,
                    host=HostInfo.detect())
    return [device.tf_name for device in choice.devices]


def _check_listed(devices: object, chosen: list[str] | None, inputs: PlanInputs) -> object:
    """The devices a script's ``MirroredStrategy(devices)`` gets under ``run``: the policy of :func:`device_lists.decide_listed`.

    ``[]`` is every device tfstrategy would use; a listed device the host lacks stops the
    script with one line (``TFSTRATEGY_DEVICE_CHECK=warn``: a note, and it goes on); a list
    that differs from ``--devices``/``--cpu-replicas`` is noted once.
    """
    from tfstrategy.selection.devices import parse_devices
    from tfstrategy.selection.host import HostInfo

    mode = DEVICE_CHECK.value(inputs.device_check, error=TFStrategyError)
    settings = [f"{flag} {text}" for flag, text in inputs.flags.items()]
    chosen_parsed = parse_devices(chosen) if chosen else None
    decision = device_lists.decide_listed(
        device_lists.read_device_list(devices), where=_script_line(), host=HostInfo.detect(), settings=settings,
        chosen=chosen_parsed.devices if chosen_parsed is not None else None, warn_only=mode == "warn")
    if decision.stop:
        stop(f"{decision.stop} ({DEVICE_CHECK.name}=warn lets the script go on as plain TensorFlow would)")
    if decision.note:
        warned = f" ({DEVICE_CHECK.name}=warn: going on as plain TensorFlow would)" if mode == "warn" else ""
        RUNTIME.hook.notes.append(decision.note)
        print(f"tfstrategy: {decision.note}{warned}", file=sys.stderr, flush=True)
    if decision.change:
        RUNTIME.hook.changed("mirrored_devices", decision.change)
    return list(decision.use) if decision.use is not None else devices


def refuse_unjoinable(config: ClusterConfig | None) -> str | None:
    """Strategies that cannot be part of one job stop at creation; a worker that never joined cannot exit 0."""
    if config is None:
        return None
    targets = {
        "OneDeviceStrategy.__init__": "OneDeviceStrategy",
        "experimental.CentralStorageStrategy.__init__": "CentralStorageStrategy",
        "experimental.ParameterServerStrategy.__init__": "ParameterServerStrategy",
        "experimental.coordinator.ClusterCoordinator.__new__": "ClusterCoordinator",
        "TPUStrategy.__init__": "TPUStrategy",
        "experimental.TPUStrategy.__init__": "TPUStrategy",
    }

    def refusing(what: str) -> Callable[[Any], Callable[..., object]]:
        def factory(original: Callable[..., object]) -> Callable[..., object]:
            def refused(self: object, *args: object, **kwargs: object) -> object:  # __init__, or ClusterCoordinator's __new__
                if _called_by_tfstrategy():
                    return original(self, *args, **kwargs)
                stop(one_job.refusal(what, config.num_workers))

            return refused

        return factory

    install_rewrite(Rewrite("refuse_unjoinable", _distribute, {path: refusing(what) for path, what in targets.items()}))
    atexit.register(_fail_if_never_joined, config.num_workers)
    return f"{', '.join(sorted(set(targets.values())))} refused under {config.num_workers} workers"


def _fail_if_never_joined(num_workers: int) -> None:
    from tfstrategy import _compat

    state = RUNTIME.hook
    if state.joined or not _compat.runtime_started():
        return
    print(f"tfstrategy: this worker ran TensorFlow ops under a multi-worker TF_CONFIG ({num_workers} workers) but "
          "never created a strategy that joined the job, so each worker trained (if at all) alone; exiting 1. Create "
          "tf.distribute.MultiWorkerMirroredStrategy() (or MirroredStrategy()) and build the model in its scope, or "
          "run the script as one process.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_FAILURE)


def refuse_unjoined_fit(config: ClusterConfig | None) -> str | None:
    """``Model.fit`` without any strategy, when no strategy joined: stopped before its first step."""
    if config is None:
        return None
    from tfstrategy import _compat

    def factory(original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def fit(model: Model, *args: object, **kwargs: object) -> object:
            strategy = _compat.model_strategy(model)
            if not RUNTIME.hook.joined and (strategy is None or _compat.is_default_strategy(strategy)):
                import tensorflow as tf

                if not tf.distribute.has_strategy():
                    stop(one_job.refusal("fit", config.num_workers))
            return original(model, *args, **kwargs)

        return fit

    for keras in keras_flavours():
        install_rewrite(Rewrite(f"refuse_unjoined_fit:{keras.__name__}", lambda k=keras: k, {"Model.fit": factory}))
    return "Model.fit() without a strategy stops before its first step"


def keras_flavours() -> list[Any]:
    from tfstrategy import _compat

    # tf.keras's Model, and Keras 3's too if the script imported it beside tf_keras.
    flavours = [_compat.keras_for()]
    other = sys.modules.get("keras")
    if other is not None and other not in flavours:
        flavours.append(other)
    return flavours

