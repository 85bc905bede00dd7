"""A dataset of fewer files than workers, sharded by element (the hook's ``data_sharding`` step, multi-worker only).

Under ``MultiWorkerMirroredStrategy`` the default ``AutoShardPolicy.AUTO`` first tries to give each
worker whole files. A script written for one machine often reads one file
(``tf.data.TFRecordDataset([path])``, TensorFlow's TFRecord tutorial), and then, run unchanged on
two workers, worker 0 fails with ``Could not apply FILE based sharding: the dataset only has 1
file(s), which is not enough for the required 2 shards/workers`` and worker 1 sees an empty shard
(``StopIteration`` in ``fit``), whichever comes first (measured on the corpus'
``tfrecord_pipeline.py`` under ``launch -n 2``). TensorFlow's error says what to do: set the policy
to ``DATA``. This step does that for such a dataset only, and says so once: each worker then reads
the file and keeps its share of every global batch, so the job trains on the same global batches
as one process would.

Files are counted as TensorFlow's sharding counts them (:func:`fewest_files`); a policy the script
set itself is left alone. Under ``launch`` the worker's ledger also keeps how the dataset is sharded
when each worker reads data of its own (by file, or not at all): the global batches then depend on
the number of workers, which an elastic job's launcher says at a re-formation.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from tfstrategy import _compat
from tfstrategy.runtime.ledger import current_keeper
from tfstrategy.runtime.rewrites import Rewrite, install_rewrite
from tfstrategy.state.registry import RUNTIME

if TYPE_CHECKING:
    from tfstrategy._protocols import Dataset

__all__ = ["data_sharding", "fewest_files"]



def fewest_files(dataset: Dataset) -> int | None:
    """The fewest files any file list of ``dataset`` holds, as TensorFlow's sharding by file counts them; else ``None``.

    TensorFlow's file readers (and ``list_files``) mark their list of names with an ``Identity``
    node named ``FileIdentity``, which its sharding by file looks for; the list reaches the
    dataset's serialized graph as a constant. ``None``: no such list, one that is not a constant,
    or a dataset that shards itself (``Dataset.shard``: sharding it again by element would drop data).
    """
    try:
        graph = _compat.dataset_graph_def(dataset)
    except Exception:  # a dataset TensorFlow cannot serialize: let TensorFlow decide, as without this step
        return None
    nodes = {node.name: node for node in graph.node}
    if any(node.op == "ShardDataset" for node in graph.node):
        return None
    counts = []
    for node in graph.node:
        if node.op != "Identity" or node.name.split("/")[0] != "FileIdentity" or not node.input:
            continue
        source = nodes.get(node.input[0].lstrip("^").split(":")[0])
        if source is None or source.op != "Const":
            return None
        counts.append(math.prod(dim.size for dim in source.attr["value"].tensor.tensor_shape.dim))  # () is 1 name
    return min(counts) if counts else None


def _by_element_when_too_few_files(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def _experimental_distribute_dataset(self: object, dataset: Dataset, options: object) -> object:
        import tensorflow as tf

        workers = _compat.collective_worker_count(self)
        policies = tf.data.experimental.AutoShardPolicy
        policy = dataset.options().experimental_distribute.auto_shard_policy
        files = fewest_files(dataset) if workers > 1 and policy == policies.AUTO else None
        keeper = current_keeper()
        if keeper is not None and workers > 1:
            # Each worker reads files of its own (or every worker all of it): the global batches depend on the
            # number of workers (what an elastic job's launcher says at a re-formation).
            own = (policy == policies.FILE or policy == policies.OFF
                   or (policy == policies.AUTO and files is not None and files >= workers))
            keeper.sharding = ("off" if policy == policies.OFF else "file") if own else keeper.sharding
        if workers > 1 and policy == policies.AUTO:
            if files is not None and files < workers:
                by_element = tf.data.Options()
                by_element.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
                dataset = dataset.with_options(by_element)
                RUNTIME.hook.changed("data_sharding", f"a dataset of {files} file(s) sharded by element")
                if RUNTIME.once("data_sharding"):
                    print(f"tfstrategy: a dataset reads {files} file(s) for {workers} workers, too few for "
                          "TensorFlow's sharding by file: each worker keeps its share of every batch instead "
                          "(AutoShardPolicy.DATA, as TensorFlow's error advises; set the dataset's "
                          "experimental_distribute.auto_shard_policy to choose yourself)", file=sys.stderr, flush=True)
        return original(self, dataset, options)

    return _experimental_distribute_dataset


def data_sharding() -> str:
    """Install the rewrite (the hook's ``data_sharding`` step, multi-worker only)."""
    install_rewrite(Rewrite("data_sharding", _compat.collective_strategy_module,
                            {_compat.distribute_dataset_target(): _by_element_when_too_few_files}))
    return "a dataset of fewer files than workers is sharded by element (AutoShardPolicy.DATA)"
