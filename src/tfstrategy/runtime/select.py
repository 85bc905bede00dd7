"""``select()``: settings, choice, strategy, and every process-wide step, in one visible place.

:func:`select` derives its plan's inputs (argument > ``TFSTRATEGY_*`` >
default, and the cluster environment: :func:`resolve_request`), chooses purely
(:func:`~tfstrategy.selection.choose.choose`), builds the strategy (:func:`~tfstrategy.selection.strategies.build`),
and around those takes the steps of its plan (:class:`tfstrategy.runtime.plan.Plan`,
the same step objects ``tfstrategy env`` prints), each recorded on the
:class:`Selection`: ``split_cpu``, ``set_tf_config`` (a cluster environment
that derives the cluster, e.g. a Slurm job step, sets ``TF_CONFIG``),
``record_creation_sites``, ``ledger`` and ``signal_launcher`` (under ``tfstrategy launch``),
``apply_patches`` and ``set_precision``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfstrategy import _versions
from tfstrategy.patches.mechanism import PatchStatus
from tfstrategy.runtime.inputs import SELECT, PlanInputs, derive_inputs
from tfstrategy.runtime.plan import Plan
from tfstrategy.runtime.steps import ApplyPatches
from tfstrategy.selection.choose import Choice, choose
from tfstrategy.selection.devices import DeviceSpec
from tfstrategy.selection.host import HostInfo
from tfstrategy.selection.strategies import build
from tfstrategy.settings import StrategyKind, collective_timeout_cost

if TYPE_CHECKING:
    pass

__all__ = ["Request", "Selection", "resolve_request", "select"]


#: The steps whose result the short :meth:`Selection.explain` says: they change what the script itself reads.
_EXPLAINED_STEPS = ("set_tf_config",)


@dataclass(frozen=True, kw_only=True)
class Selection:
    """A ready strategy, why it was chosen, and what :func:`select` changed in the process to get it."""

    strategy: Any  # select() rebinds its `strategy` argument (a kind) to the strategy it builds: mypy sees str | Any there
    choice: Choice
    sources: Mapping[str, str] = field(default_factory=dict)
    #: The process-wide steps select() took, in order: ``(name, what it did)``.
    steps: tuple[tuple[str, str], ...] = ()
    #: What each Keras workaround found and installed (see :mod:`tfstrategy.patches`).
    patches: tuple[PatchStatus, ...] = ()
    #: The multi-worker collective timeout asked for (seconds), ``None`` when collectives wait without one.
    collective_timeout: float | None = None

    @property
    def kind(self) -> StrategyKind:
        return self.choice.kind

    @property
    def num_replicas(self) -> int:
        """Replicas in sync across the whole job (all workers)."""
        return int(self.strategy.num_replicas_in_sync)

    def scope(self) -> Any:
        """The strategy's scope: build model, optimizer and metrics inside it."""
        return self.strategy.scope()

    def explain(self, verbose: bool = False) -> str:
        """Why this strategy, in one short line: the rules that applied, the settings not left at their default
        and their sources, and a ``TF_CONFIG`` set for the script (it reads it). ``verbose=True`` adds every
        setting's source and every step taken, with the Keras workarounds installed (``tfstrategy run --debug``)."""
        parts = list(self.choice.reasons)
        settings = ", ".join(f"{name} from {source}" for name, source in self.sources.items()
                             if verbose or source != "default")
        if settings:
            parts.append(settings)
        parts.extend(f"{name}: {done}" if verbose else done for name, done in self.steps
                     if verbose or name in _EXPLAINED_STEPS)
        if self.collective_timeout is not None and self.kind is StrategyKind.MULTI_WORKER:
            parts.append(collective_timeout_cost(self.collective_timeout))
        return "; ".join(parts)


#: What :func:`select` was asked for, after precedence and validation, before any TensorFlow call.
Request = PlanInputs


def resolve_request(
    strategy: StrategyKind | str | None = None,
    devices: DeviceSpec | None = None,
    cpu_replicas: int | None = None,
    *,
    collective_timeout: float | str | None = None,
    precision: str | None = None,
    env: Mapping[str, str] | None = None,
) -> PlanInputs:
    """Apply argument > ``TFSTRATEGY_*`` > default, validate each setting, and find the cluster.

    Pure apart from reading the environment; :func:`select` and ``tfstrategy env``
    share it (:func:`tfstrategy.runtime.inputs.derive_inputs`) so the report
    predicts exactly what ``select`` would do.

    Raises:
        TFStrategyError: a setting is invalid or code and environment conflict.
    """
    return derive_inputs(SELECT, strategy, devices, cpu_replicas, collective_timeout=collective_timeout,
                         precision=precision, env=env)


def select(
    strategy: StrategyKind | str | None = None,
    devices: DeviceSpec | None = None,
    cpu_replicas: int | None = None,
    *,
    collective_timeout: float | str | None = None,
    precision: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Selection:
    """Select, validate and build a distribution strategy in one call.

    Each argument left as ``None`` falls back to its ``TFSTRATEGY_*`` variable
    (``TFSTRATEGY_STRATEGY``, ``TFSTRATEGY_DEVICES``, ``TFSTRATEGY_CPU_REPLICAS``,
    ``TFSTRATEGY_COLLECTIVE_TIMEOUT``), then to the default: ``auto`` on every
    visible GPU or the CPU, and no collective timeout. Inside a Slurm job
    step of 2+ tasks without ``TF_CONFIG`` (``srun python train.py``), ``auto``
    is MultiWorkerMirroredStrategy over the step's tasks.

    Args:
        strategy: ``auto``, ``mirrored``, ``one_device``, ``default``,
            ``multi_worker`` or ``tpu``.
        devices: e.g. ``"gpu:0,gpu:1"``, ``[0, 1]``, ``"cpu"``; ``None`` for all.
        cpu_replicas: split the CPU into this many logical devices and use
            them as replicas. Must come before anything runs a TensorFlow op
            (importing TensorFlow first is fine).
        collective_timeout: seconds a multi-worker collective may wait for a
            peer before raising; ``"none"`` (the default) waits, as TensorFlow
            does: TensorFlow keeps a thread per collective op for that long.
        precision: the Keras global dtype policy to set before the model is
            built: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``
            (``TFSTRATEGY_PRECISION``; default: leave Keras' policy alone).
        env: environment to read instead of ``os.environ``.

    Raises:
        TFStrategyError: any invalid input, with a message saying how to fix it.
        UnsupportedVersionError: TensorFlow or Keras is older than supported.

    Example:
        >>> selection = tfstrategy.select(cpu_replicas=4)
        >>> with selection.scope():
        ...     model = build_model()
    """
    _versions.require_supported(env)
    request = resolve_request(strategy, devices, cpu_replicas, collective_timeout=collective_timeout,
                              precision=precision, env=env)
    plan = Plan(request)
    steps = plan.take("tensorflow")
    choice = choose(
        kind=request.kind or StrategyKind.AUTO,
        devices=request.devices,
        cpu_replicas=request.cpu_replicas,
        host=HostInfo.detect(),
        cluster_tasks=request.cluster_tasks,
        cluster_source=request.cluster_source or "TF_CONFIG",
    )
    steps += plan.take("strategy")
    strategy = build(choice, collective_timeout=request.collective_timeout)
    steps += [(step.name, done) for step in plan.steps if step.phase == "strategy" and (done := step.after_build())]
    steps += plan.take("keras")
    patched = plan.step("apply_patches")
    patches = patched.statuses if isinstance(patched, ApplyPatches) else ()
    return Selection(strategy=strategy, choice=choice, sources=request.sources, steps=tuple(steps), patches=patches,
                     collective_timeout=request.collective_timeout)
