"""The one plan of process-wide steps that ``select()``, the start-up hook and ``tfstrategy env`` read.

What tfstrategy does to a process (split the CPU, set ``TF_CONFIG`` from a
Slurm step, record creation sites, prepare the multi-worker runtime, rewrite
``MirroredStrategy``, refuse what cannot join, patch Keras, audit ``fit``) is
decided here, once, by :func:`plan_steps` from plain values: no TensorFlow, no
environment. :func:`tfstrategy.select` and :mod:`tfstrategy.runtime.worker_hook`
take exactly the steps of their plan, in its order, and ``tfstrategy env``
prints both plans, so the preview cannot disagree with what happens.

Every :class:`Step` says in which ``phase`` it runs (``tensorflow``: as soon as
TensorFlow is imported, before the script's first op or before ``select()``
chooses; ``strategy``: around building the strategy; ``keras``: once Keras is
importable) and whether it ``rewrites`` something of TensorFlow's or Keras'
(those are undoable through :mod:`tfstrategy.patches.mechanism`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tfstrategy.settings import StrategyKind

__all__ = ["PlanInputs", "Step", "plan_steps", "resolved_kind"]

SELECT, HOOK = "select", "hook"
#: ``select()`` splits the CPU only for the kinds that replicate over local devices.
_SPLITTING_KINDS = (StrategyKind.MIRRORED, StrategyKind.ONE_DEVICE)


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """Everything the plan depends on, as plain values (read by each consumer from its settings)."""

    #: ``"select"`` or ``"hook"``.
    consumer: str
    #: The requested kind for ``select()``; ``None`` for the hook (the script creates its own strategy).
    kind: StrategyKind | None = None
    cpu_replicas: int | None = None
    #: The ``devices`` setting as text (``TFSTRATEGY_DEVICES`` / ``--devices``), or ``None``.
    devices: str | None = None
    #: Training tasks of the cluster (``TF_CONFIG`` or the Slurm step), 0 for none.
    cluster_tasks: int = 0
    #: ``"TF_CONFIG"``, ``"Slurm"`` or ``None``.
    cluster_source: str | None = None
    #: ``tfstrategy launch`` started this process (it has a join file to write).
    under_launcher: bool = False
    #: The hook's ``--audit`` mode.
    audit: str = "warn"
    #: The Keras global dtype policy to set (``select(precision=...)``/``TFSTRATEGY_PRECISION``), or ``None``.
    precision: str | None = None
    #: The performance report's directory (``--profile``/``TFSTRATEGY_PROFILE``), or ``None``.
    profile: str | None = None


@dataclass(frozen=True, kw_only=True)
class Step:
    """One named process-wide step: what it does here and when."""

    name: str
    phase: str
    detail: str
    #: It replaces something of TensorFlow's or Keras' (undoable: see tfstrategy.runtime.rewrites).
    rewrites: bool = False

    def line(self) -> str:
        return f"{self.name}: {self.detail}"


def resolved_kind(kind: StrategyKind, cluster_tasks: int) -> StrategyKind:
    """What ``auto`` becomes: multi-worker when a cluster of 2+ tasks exists, else MirroredStrategy."""
    if kind is StrategyKind.AUTO:
        return StrategyKind.MULTI_WORKER if cluster_tasks > 1 else StrategyKind.MIRRORED
    return kind


def plan_steps(inputs: PlanInputs) -> tuple[Step, ...]:
    """The ordered steps ``inputs.consumer`` takes in this process (pure).

    Example:
        >>> [s.name for s in plan_steps(PlanInputs(consumer="hook", cpu_replicas=2))][:2]
        ['split_cpu', 'record_creation_sites']
    """
    multi = inputs.cluster_tasks > 1
    if inputs.consumer == SELECT:
        kind = resolved_kind(inputs.kind or StrategyKind.AUTO, inputs.cluster_tasks)
        return _select_steps(inputs, kind)
    if inputs.consumer != HOOK:
        raise ValueError(f"unknown consumer {inputs.consumer!r}")
    return _hook_steps(inputs, multi)


def _select_steps(inputs: PlanInputs, kind: StrategyKind) -> tuple[Step, ...]:
    steps = []
    if inputs.cpu_replicas is not None and kind in _SPLITTING_KINDS:
        steps.append(Step(name="split_cpu", phase="tensorflow",
                          detail=f"split the CPU into {inputs.cpu_replicas} logical devices"))
    if inputs.cluster_source == "Slurm" and kind is StrategyKind.MULTI_WORKER:
        steps.append(Step(name="slurm_tf_config", phase="tensorflow", detail="set TF_CONFIG from the Slurm job step"))
    steps.append(Step(name="record_creation_sites", phase="tensorflow",
                      detail="record where variables are created, for the scope audit"))
    if inputs.under_launcher:
        steps.append(Step(name="signal_launcher", phase="strategy",
                          detail="tell tfstrategy launch 'creating' before the strategy and 'joined' after"))
    steps.append(Step(name="apply_patches", phase="keras", detail="the Keras workarounds the installed release needs",
                      rewrites=True))
    steps.extend(_precision_steps(inputs))
    if inputs.profile is not None:
        steps.append(Step(name="performance_report", phase="keras", rewrites=True,
                          detail="Model.fit reports where each step's time goes (tfstrategy.performance), "
                                 f"into {inputs.profile}"))
    return tuple(steps)


def _hook_steps(inputs: PlanInputs, multi: bool) -> tuple[Step, ...]:
    steps = []
    if inputs.cpu_replicas is not None and not multi:
        steps.append(Step(name="split_cpu", phase="tensorflow",
                          detail=f"split the CPU into {inputs.cpu_replicas} logical devices"))
    steps.append(Step(name="record_creation_sites", phase="tensorflow",
                      detail="record where variables are created, for the scope audit"))
    if inputs.cluster_source == "Slurm":
        steps.append(Step(name="slurm_tf_config", phase="tensorflow", detail="set TF_CONFIG from the Slurm job step"))
    if multi:
        steps.append(Step(name="prepare_collectives", phase="tensorflow",
                          detail=f"configure the multi-worker runtime of {inputs.cluster_tasks} workers before the "
                                 "script's first op, so ops before the strategy do not stop it joining"))
    steps.append(Step(name="watch_strategies", phase="tensorflow", rewrites=True,
                      detail="name every strategy created in the summary; MultiWorkerMirroredStrategy signals the "
                             "launcher and gets the collective timeout"))
    steps.append(Step(name="mirrored_devices", phase="tensorflow", rewrites=True, detail=_mirrored_detail(inputs, multi)))
    if multi:
        steps.append(Step(name="refuse_unjoinable", phase="tensorflow", rewrites=True,
                          detail="OneDeviceStrategy, CentralStorageStrategy, ParameterServerStrategy, "
                                 "ClusterCoordinator and TPUStrategy stop at creation with one line; a worker that "
                                 "ran ops but never joined exits 1"))
        steps.append(Step(name="checkpoint_files", phase="tensorflow", rewrites=True,
                          detail="tf.train.Checkpoint and CheckpointManager files are written by the chief only "
                                 "(the other workers write a private copy and wait for the chief's)"))
        steps.append(Step(name="data_sharding", phase="tensorflow", rewrites=True,
                          detail="a dataset reading fewer files than there are workers is sharded by element "
                                 "(AutoShardPolicy.DATA), where TensorFlow's sharding by file fails"))
    steps.append(Step(name="apply_patches", phase="keras", rewrites=True,
                      detail="the Keras workarounds the installed release needs"))
    steps.append(Step(name="keras2_aliases", phase="keras", rewrites=True,
                      detail="Metric.reset_states() calls reset_state() (the Keras 2 name TensorFlow's tutorials use)"))
    if inputs.audit != "off":
        steps.append(Step(name="audit", phase="keras", rewrites=True,
                          detail=f"Model.fit and Model.evaluate audit the scope first ({inputs.audit})"))
    if multi:
        steps.append(Step(name="refuse_unjoined_fit", phase="keras", rewrites=True,
                          detail="Model.fit() without any strategy, when none joined, stops before its first step"))
    if inputs.under_launcher:
        steps.append(Step(name="count_batches", phase="keras", rewrites=True,
                          detail="Model.fit, evaluate and predict count their batches for the launcher's stall "
                                 "detection (tfstrategy.runtime.worker_watch)"))
    steps.extend(_precision_steps(inputs))
    if inputs.profile is not None:
        steps.append(Step(name="performance_report", phase="keras", rewrites=True,
                          detail="Model.fit reports where each step's time goes (tfstrategy.performance), "
                                 f"into {inputs.profile}"))
    return tuple(steps)


def _precision_steps(inputs: PlanInputs) -> list[Step]:
    if inputs.precision is None:
        return []
    return [Step(name="set_precision", phase="keras",
                 detail=f"set the Keras global dtype policy to {inputs.precision} before the model is built")]


def _mirrored_detail(inputs: PlanInputs, multi: bool) -> str:
    if multi:
        return ("MirroredStrategy() becomes a MultiWorkerMirroredStrategy over the workers; a device list joins only "
                "if it names this worker's devices, else it is refused")
    chosen = []
    if inputs.devices is not None:
        chosen.append(f"devices {inputs.devices}")
    if inputs.cpu_replicas is not None:
        chosen.append(f"{inputs.cpu_replicas} CPU replicas")
    head = f"MirroredStrategy() without devices uses {' and '.join(chosen)}; " if chosen else ""
    overrides = "; a list that overrides these settings is reported" if chosen else ""
    return head + "an explicit device list must exist on this host (as in select(devices=...))" + overrides
