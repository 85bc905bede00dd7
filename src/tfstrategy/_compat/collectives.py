"""The multi-worker runtime: collective ops and the coordination service, prepared before the first op."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from tfstrategy._compat.registry import accessor
from tfstrategy._compat.runtime import runtime_started
from tfstrategy._tf import tf


@accessor("tensorflow.python.distribute.collective_all_reduce_strategy:CollectiveAllReduceExtended")
def collective_strategy_module() -> ModuleType:
    """TensorFlow's ``MultiWorkerMirroredStrategy`` module (``CollectiveAllReduceExtended``)."""
    from tensorflow.python.distribute import collective_all_reduce_strategy

    module: ModuleType = collective_all_reduce_strategy
    return module


@accessor("tensorflow.python.eager.context:Context._context_handle", "tensorflow.python.eager.context:Context.coordination_service")
def coordination_store() -> Any:
    """The eager context when this process's coordination service is configured (its key-value store), else ``None``.

    MultiWorkerMirroredStrategy configures the service when it is created in a
    multi-worker cluster; TensorFlow exposes its store only on the private context.
    """
    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.eager import context

    ctx = context.context()
    if getattr(ctx, "coordination_service", None) is None or ctx._context_handle is None:
        return None
    return ctx


def deadline_exceeded_error() -> type[BaseException]:
    """What a timed-out ``get_config_key_value`` raises."""
    error: type[BaseException] = tf().errors.DeadlineExceededError
    return error


def unavailable_error() -> type[BaseException]:
    """What ``get_config_key_value`` raises once the task hosting the coordination service has exited."""
    error: type[BaseException] = tf().errors.UnavailableError
    return error


@accessor("tensorflow.python.eager.context:Context._context_handle", "tensorflow.python.eager.context:Context._collective_ops_server_def")
def serves_already(ctx: Any, server_def: Any) -> bool:
    """Whether the running eager context ``ctx`` already serves this cluster as this task.

    The same cluster, job, task and protocol as the server it was started with
    (a ``ServerDef``); the session config may differ in what only matters before
    start-up.
    """
    enabled = ctx._collective_ops_server_def
    if ctx._context_handle is None or enabled is None or server_def is None:
        return False
    return all(getattr(enabled, field) == getattr(server_def, field)
               for field in ("cluster", "job_name", "task_index", "protocol"))


@accessor("tensorflow.python.distribute.multi_worker_util:normalize_cluster_spec", "tensorflow.python.distribute.multi_worker_util:collective_leader", "tensorflow.python.distribute.multi_worker_util:coordination_leader", "tensorflow.python.distribute.collective_all_reduce_strategy:coordination_config_pb2", "tensorflow.python.distribute.collective_all_reduce_strategy:rewriter_config_pb2", "tensorflow.python.distribute.collective_all_reduce_strategy:tensorflow_server_pb2", "tensorflow.python.eager.context:Context.configure_collective_ops", "tensorflow.python.eager.context:Context.configure_coordination_service", "tensorflow.python.eager.context:Context.enable_collective_ops")
def prepare_collective_runtime(cluster: dict[str, list[str]], task_type: str, task_index: int,
                               rpc_layer: str | None = None) -> bool:
    """Configure this process's eager context for collectives as ``MultiWorkerMirroredStrategy`` would.

    ``CollectiveAllReduceExtended._initialize_multi_worker`` configures collective
    ops, the coordination service and the collective server on the eager context,
    and ``configure_collective_ops`` raises "Collective ops must be configured at
    program startup" once any op started the runtime. Made here with the same
    values before the first op, the strategy's own calls later find them already
    made (identical values are accepted), and ``enable_collective_ops`` before the
    runtime starts only records the server: it starts with the runtime, so every
    tensor the script makes before its strategy already lives on this task's devices.

    Returns:
        False if the runtime had already started (nothing was changed).
    """
    import copy

    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if runtime_started():
        return False
    ctx = context.context()
    spec = multi_worker_util.normalize_cluster_spec(cluster)
    leader = multi_worker_util.collective_leader(spec, task_type, task_index)
    ctx.configure_collective_ops(
        collective_leader=leader,
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{task_type}/task:{task_index}",),
    )
    if ctx.coordination_service is None and task_type in ("chief", "worker"):
        jobs = [mwms.coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
                for job in ("chief", "worker") if job in spec.jobs]
        ctx.configure_coordination_service(service_type="standalone",
                                           service_leader=multi_worker_util.coordination_leader(spec),
                                           coordinated_jobs=jobs)
    config = copy.deepcopy(ctx.config)
    rewrite = config.graph_options.rewrite_options
    rewrite.scoped_allocator_optimization = mwms.rewriter_config_pb2.RewriterConfig.ON
    del rewrite.scoped_allocator_opts.enable_op[:]
    rewrite.scoped_allocator_opts.enable_op.append("CollectiveReduce")
    config.experimental.collective_group_leader = leader
    ctx.enable_collective_ops(mwms.tensorflow_server_pb2.ServerDef(
        cluster=spec.as_cluster_def(), default_session_config=config, job_name=task_type,
        task_index=task_index, protocol=rpc_layer or "grpc", port=0,
    ))
    return True


@accessor("tensorflow.python.distribute.collective_all_reduce_strategy:CollectiveAllReduceExtended._initialize_multi_worker")
def initialize_multi_worker_target() -> str:
    """``CollectiveAllReduceExtended._initialize_multi_worker`` (sets up a multi-worker strategy), as a path in
    :func:`collective_strategy_module`."""
    return "CollectiveAllReduceExtended._initialize_multi_worker"


@accessor("tensorflow.python.distribute.collective_all_reduce_strategy:CollectiveAllReduceExtended._experimental_distribute_dataset")
def distribute_dataset_target() -> str:
    """``CollectiveAllReduceExtended._experimental_distribute_dataset`` (shards a dataset across workers), as a
    path in :func:`collective_strategy_module`."""
    return "CollectiveAllReduceExtended._experimental_distribute_dataset"


@accessor("tensorflow.python.distribute.collective_all_reduce_strategy:CollectiveAllReduceExtended._num_workers")
def collective_worker_count(extended: object) -> int:
    """The number of workers a ``CollectiveAllReduceExtended`` spans (``_num_workers``; 1 if it has none)."""
    return int(getattr(extended, "_num_workers", 1))


@accessor("tensorflow.python.distribute.collective_all_reduce_strategy:CollectiveAllReduceExtended._collective_key_base")
def offset_collective_key_base(extended: Any, offset: int) -> None:
    """Move a ``CollectiveAllReduceExtended``'s collective keys (``_collective_key_base``) up by ``offset``.

    Called before its ``_initialize_multi_worker``, which derives the strategy's keys from it.
    """
    extended._collective_key_base += offset
