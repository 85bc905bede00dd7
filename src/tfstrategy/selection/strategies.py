"""Build the strategy a :class:`~tfstrategy.selection.choose.Choice` describes (TensorFlow)."""

from __future__ import annotations

from typing import Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import StrategyError
from tfstrategy.multiworker.cluster import load_cluster_config
from tfstrategy.selection.choose import Choice
from tfstrategy.settings import DEFAULT_COLLECTIVE_TIMEOUT, StrategyKind
from tfstrategy.state.registry import KEY_STRIDE, RUNTIME

__all__ = ["LOCAL_KEY_BASE", "build", "mirrored_strategy"]

#: The n-th MirroredStrategy tfstrategy makes in a process starts its collective keys at
#: ``LOCAL_KEY_BASE + KEY_STRIDE * n``: far above TensorFlow's own (a plain strategy starts at group 1)
#: and the multi-worker strategies' (``KEY_STRIDE * n`` from 0, numbered alike on every worker), and
#: below 2**31, as TensorFlow's collective keys are int32 (room for 11,474 strategies).
LOCAL_KEY_BASE = 1_000_000_000


def mirrored_strategy(devices: list[str], cross_device_ops: object = None) -> Any:
    """A MirroredStrategy whose collective keys no other strategy in this process uses.

    Every MirroredStrategy starts its collective group and instance keys at the
    same numbers, so a second one over the same devices reuses the first one's
    keys, and training another model fails with "Shape mismatch in the collective
    instance 100"; from then on every collective of the process fails with the
    same error, whatever its keys (measured on TF 2.21 with 2 and 4 CPU replicas).
    TensorFlow's own tests give each strategy a key base; tfstrategy does the
    same, from one sequence for every strategy it makes (the selection's and the
    patches' probes), and puts the class default back so strategies made
    directly are unaffected.

    Raises:
        StrategyError: the process made so many that no keys are left.
    """
    number = RUNTIME.next_number("local_collective_keys")
    base = LOCAL_KEY_BASE + KEY_STRIDE * number
    if base + KEY_STRIDE > 2**31 - 1:
        raise StrategyError(
            f"Received a request for MirroredStrategy number {number + 1:,} of this process; TensorFlow's collective "
            f"keys are int32, which leaves room for {(2**31 - 1 - LOCAL_KEY_BASE) // KEY_STRIDE:,} with keys of "
            "their own. Reuse one strategy for several models, or start a new process."
        )
    with _compat.mirrored_collective_key_base(base):
        return tf().distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)


def build(choice: Choice, *, collective_timeout: float | None = DEFAULT_COLLECTIVE_TIMEOUT) -> Any:
    """Instantiate the strategy a :class:`Choice` describes, and nothing else.

    Args:
        choice: the output of :func:`~tfstrategy.selection.choose.choose`.
        collective_timeout: for multi-worker, seconds a collective may wait for
            a peer before raising (``None``: wait forever, as TensorFlow does).

    Raises:
        StrategyError: TensorFlow cannot create it here (e.g. no TPU reachable,
            or the multi-worker server's port is taken).

    Example:
        >>> strategy = build(choose(kind=StrategyKind.MIRRORED, devices=None, cpu_replicas=None, host=HostInfo.detect()))
    """
    distribute = tf().distribute
    if choice.kind is StrategyKind.MIRRORED:
        return mirrored_strategy([device.tf_name for device in choice.devices])
    if choice.kind is StrategyKind.ONE_DEVICE:
        return distribute.OneDeviceStrategy(choice.devices[0].tf_name)
    if choice.kind is StrategyKind.DEFAULT:
        return distribute.get_strategy()
    if choice.kind is StrategyKind.MULTI_WORKER:
        options = distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout)
        try:
            # Returns once every worker in TF_CONFIG has connected.
            strategy = distribute.MultiWorkerMirroredStrategy(communication_options=options)
        except tf().errors.UnknownError as error:
            if "Could not start gRPC server" not in str(error):
                raise
            config = load_cluster_config()
            where = f"{config.task_name} at {config.address}" if config else "this task"
            raise StrategyError(
                f"Received TF_CONFIG placing {where}, but TensorFlow could not start its server there ({error}); "
                "the port is most likely held by another process. Free it or pick another port in TF_CONFIG "
                "(tfstrategy launch picks free ports itself)."
            ) from error
        return strategy
    if choice.kind is StrategyKind.TPU:
        try:
            resolver = distribute.cluster_resolver.TPUClusterResolver()
            tf().config.experimental_connect_to_cluster(resolver)
            tf().tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError) as error:
            raise StrategyError(
                f"Received strategy='tpu', but TensorFlow could not reach a TPU ({error}). "
                "Check TPU_NAME and that this VM has TPU access, or pass strategy='auto'."
            ) from error
        return distribute.TPUStrategy(resolver)
    raise StrategyError(f"Received a choice of kind {choice.kind!r}, which cannot be built; resolve 'auto' with choose() first.")
