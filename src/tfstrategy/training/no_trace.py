"""Training steps that leave no trace: measure on a model, then put everything back.

Tuning ``steps_per_execution`` and the performance report's probes run real
training steps. For the ``fit`` that follows to start exactly where it would
have without them, two things must be untouched:

- **the model's state**: weights, the optimizer's slots and step count, the
  metrics, and every random state a step draws from: Keras 3's seed
  generators (a ``Dropout`` layer's, the global one), TensorFlow's global
  ``tf.random.Generator``, Python's and NumPy's. :func:`snapshot` saves them
  and :meth:`Snapshot.restore` puts them back.
- **the data**: a ``shuffle`` reshuffles each time an iterator is made, from a
  seed generator shared by every iterator of that dataset, so merely iterating
  the user's dataset shifts the order of every later epoch. :func:`dataset_copy`
  rebuilds the pipeline from its graph with shuffles that draw from seed
  generators of their own, so iterating the copy leaves the original's order
  as it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.state.registry import RUNTIME

if TYPE_CHECKING:
    from tfstrategy._protocols import Dataset, Model

#: Shuffles that take a shared seed generator -> the same shuffle with a generator of its own.
_OWN_SEED_GENERATOR = {"ShuffleDatasetV3": "ShuffleDataset", "ShuffleAndRepeatDatasetV2": "ShuffleAndRepeatDataset"}
#: Other datasets that draw from a shared seed generator: a copy of one would still move the original.
_SHARED_SEED_GENERATOR = ("ShuffleDatasetV2", "RandomDatasetV2")


@dataclass
class Snapshot:
    """The values of every variable and random state a training step can change."""

    variables: list[Any]
    values: list[object]
    python_random: Any
    numpy_random: Any = None
    _numpy: Any = field(default=None, repr=False)

    def restore(self) -> None:
        """Put every saved value back."""
        for variable, value in zip(self.variables, self.values):
            variable.assign(value)
        random.setstate(self.python_random)
        if self._numpy is not None:
            self._numpy.random.set_state(self.numpy_random)


def _random_state_variables() -> list[Any]:
    states = []
    keras_generator = _compat.keras_global_seed_generator()
    if keras_generator is not None:
        states.append(keras_generator.state)
    tf_generator = _compat.tf_global_generator()
    if tf_generator is not None:
        states.append(tf_generator.state)
    return states


def snapshot(model: Model, *, metrics: bool = False) -> Snapshot:
    """Save the model's variables (weights, seed generators), its optimizer's, and the global random states.

    With ``metrics`` the metrics' variables too (a probe in the middle of a ``fit``); without, the caller
    resets them (``model.reset_metrics()``), as ``fit`` does at its start.
    """
    variables = [*_compat.model_state_variables(model), *_compat.optimizer_variables(model.optimizer),
                 *_random_state_variables(), *(_compat.model_metric_variables(model) if metrics else [])]
    unique = list({id(variable): variable for variable in variables}.values())
    numpy = _compat.numpy_if_imported()
    return Snapshot(variables=unique, values=[variable.numpy() for variable in unique],
                    python_random=random.getstate(),
                    numpy_random=numpy.random.get_state() if numpy is not None else None, _numpy=numpy)


def _graph(dataset: Dataset) -> Any:
    return _compat.dataset_graph_def(dataset)


def pipeline_ops(dataset: Dataset) -> tuple[str, ...]:
    """The operation types of a ``tf.data`` pipeline's graph (``MapDataset``, ``PrefetchDataset``, ...), or ()."""
    try:
        return tuple(sorted({node.op for node in _graph(dataset).node if "Dataset" in node.op}))
    except Exception:  # noqa: BLE001 - no graph, no list: the report then names no operation
        return ()


#: ``tf.data`` operations that batch, their batch size the second input.
_BATCH_OPS = ("BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2", "ParallelBatchDataset")


def _name(reference: str) -> str:
    return reference.lstrip("^").split(":")[0]


def pipeline_batch(dataset: Dataset) -> int | None:
    """The batch size of a ``tf.data`` pipeline's outermost batch, read from its graph (no element made), or None.

    Reading a batch would run the pipeline (on a slow ``map``, a fifth of a second to make its iterator and batch).
    """
    try:
        graph = _graph(dataset)
        nodes = {node.name: node for node in graph.node}
        consumed = {_name(reference) for node in graph.node for reference in node.input}
        node = next((node for node in graph.node if node.op == "_Retval" or "Dataset" in node.op
                     and node.name not in consumed), None)  # the pipeline's output, then down its inputs
        while node is not None and node.op not in _BATCH_OPS:
            node = nodes.get(_name(node.input[0])) if node.input else None
        if node is None:
            return None
        size = int(tf().make_ndarray(nodes[_name(node.input[1])].attr["value"].tensor))
        return size if size > 0 else None
    except Exception:  # noqa: BLE001 - no graph, no batch size: the caller reads a batch when it probes
        return None


def dataset_copy(dataset: Dataset) -> tuple[Any, str | None]:
    """A copy of ``dataset`` whose iteration leaves the original's shuffle order alone, or why there is none.

    Returns:
        ``(copy, None)``, or ``(dataset, reason)`` when no such copy can be made
        (a distributed dataset, a pipeline TensorFlow cannot serialize, a
        sampler that shares its seed generator): the caller then iterates the
        original and says so.
    """
    tf_ = tf()
    if not isinstance(dataset, tf_.data.Dataset):
        return dataset, f"a {type(dataset).__name__} cannot be copied, only a tf.data.Dataset"
    try:
        graph = _graph(dataset)
    except Exception as error:  # noqa: BLE001 - TensorFlow raises many kinds here; each means "no copy"
        return dataset, f"TensorFlow cannot serialize this pipeline ({type(error).__name__})"
    shared = sorted({node.op for node in graph.node if node.op in _SHARED_SEED_GENERATOR})
    if shared:
        return dataset, f"its {', '.join(shared)} shares a seed generator with the original"
    generators = set()
    for node in graph.node:
        if node.op in _OWN_SEED_GENERATOR:
            node.op = _OWN_SEED_GENERATOR[node.op]
            generators.add(node.input.pop().split(":")[0])  # the shared seed generator, the last input
    kept = [node for node in graph.node if node.name not in generators]
    del graph.node[:]
    graph.node.extend(kept)
    variant = tf_.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString())
    return _compat.dataset_from_variant(variant, dataset.element_spec), None


def skip_build_peek(model: Model) -> None:
    """Make the model's later ``fit`` calls skip Keras' peek at one batch once nothing is left to build.

    Under a strategy, Keras 3 starts every ``fit`` by making a distributed
    iterator, taking one batch to build the model symbolically, and dropping
    the iterator, even when every layer, loss and metric is built and the
    batch builds nothing. On TensorFlow 2.21 / Keras 3.15 that drop
    sometimes segfaults once a distributed iterator that a ``tf.function``
    consumed was dropped mid-stream, as the tuner's and the report's probes
    do (``benchmarks/upstream_iterator_crash.py``; measured in
    ``benchmarks/README.md``). Skipping the peek removes the crash site.

    The peek is not free of effects on the data: making its iterator draws
    the next seeds of every reshuffling ``shuffle``, so the epochs after it
    see the order they see. In its place the skip makes (and drops, unread)
    a plain iterator over the same dataset, which draws the same seeds: a
    ``fit`` after tuning sees the order it would have seen without it. A
    model with something left to build, data Keras cannot trace back to one
    ``tf.data.Dataset``, and tf_keras (which has no such step) run Keras' own code.
    """
    if not _compat.has_class_build_peek(model):
        return

    def _maybe_symbolic_build(iterator: object = None, data_batch: object = None) -> object:
        source = None if iterator is None else _compat.epoch_iterator_source(iterator)
        if source is not None and _compat.keras3_nothing_left_to_build(model):
            iter(source)  # the shuffle seeds the peek's iterator would have drawn; no element is read
            iterator = None
        # Looked up at each call: another patch may wrap the class's method later.
        return _compat.class_build_peek(model, iterator=iterator, data_batch=data_batch)

    RUNTIME.override_attribute(model, _compat.build_peek_attribute(), _maybe_symbolic_build,
                               name=f"skip_build_peek:{id(model)}", note="fit skips Keras' peek at one batch")
