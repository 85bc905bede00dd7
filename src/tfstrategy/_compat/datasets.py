"""``tf.data`` internals: the datasets a pipeline reads from, through its transformations' functions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfstrategy._compat.registry import accessor
from tfstrategy._tf import tf

if TYPE_CHECKING:
    from tfstrategy._protocols import Dataset


@accessor("tensorflow.python.data.ops.dataset_ops:_VariantDataset")
def dataset_from_variant(variant: object, element_spec: object) -> object:
    """A ``tf.data.Dataset`` over a dataset variant tensor (from ``DatasetFromGraph``, say)."""
    from tensorflow.python.data.ops import dataset_ops

    return dataset_ops._VariantDataset(variant, element_spec)


@accessor("tensorflow.python.data.ops.dataset_ops:DatasetV2._inputs")
def dataset_inputs(dataset: Any) -> list[Any]:
    """The datasets ``dataset`` reads from (tf.data's own ``_inputs()``); ``[]`` for a source."""
    try:
        return list(dataset._inputs())
    except (AttributeError, NotImplementedError):
        return []


@accessor("tensorflow.python.data.ops.structured_function:StructuredFunctionWrapper.function")
def dataset_function_outputs(dataset: Dataset) -> list[Any]:
    """The variant (dataset) outputs of the functions a transformation holds.

    ``interleave``/``flat_map`` keep their ``map_func`` and ``group_by_window``
    (behind ``bucket_by_sequence_length``) its ``reduce_func`` as
    ``StructuredFunctionWrapper`` attributes; the datasets those functions return
    are where their elements come from, yet ``_inputs()`` does not list them.
    """
    variant = tf().variant
    outputs: list[object] = []
    for value in vars(dataset).values():
        graph = getattr(getattr(value, "function", None), "graph", None)
        if graph is not None:
            outputs.extend(tensor for tensor in graph.outputs if tensor.dtype == variant)
    return outputs


@accessor("tensorflow.python.data.ops.structured_function:StructuredFunctionWrapper._func")
def dataset_function_captures(dataset: Dataset) -> list[object]:
    """The ``tf.data.Dataset`` objects the Python functions of a transformation capture.

    ``ds.interleave(lambda i: batched)`` returns a dataset made *outside* the
    function: its graph output is a captured placeholder, with nothing to walk.
    The wrapper keeps the user's function (``StructuredFunctionWrapper._func``);
    the datasets it closes over, takes as defaults or names as globals are the ones
    whose elements come out.
    """
    dataset_type = tf().data.Dataset
    variant = tf().variant
    found: list[object] = []
    for value in vars(dataset).values():
        func: Any = getattr(value, "_func", None)  # the user's Python function
        code = getattr(func, "__code__", None)
        graph = getattr(getattr(value, "function", None), "graph", None)
        if code is None or graph is None:
            continue
        if not any(_is_captured(tensor) for tensor in graph.outputs if tensor.dtype == variant):
            continue  # the function builds its output itself; dataset_function_outputs walks it
        candidates = [cell.cell_contents for cell in (func.__closure__ or ()) if _cell_filled(cell)]
        candidates += list(func.__defaults__ or ())
        candidates += [func.__globals__[name] for name in code.co_names if name in func.__globals__]
        found.extend(candidate for candidate in candidates if isinstance(candidate, dataset_type))
    return found


def _is_captured(tensor: Any) -> bool:
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    return bool(op.type == "Placeholder")


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


@accessor("tensorflow.python.framework.ops:Graph._get_function")
def op_function_outputs(op: Any) -> list[object]:
    """The variant outputs of the functions a dataset op inside a function graph calls (nested interleave)."""
    variant = tf().variant
    outputs: list[object] = []
    for attr in op.node_def.attr.values():
        name = attr.func.name if attr.HasField("func") else None
        function = op.graph._get_function(name) if name else None
        graph = getattr(function, "graph", None)
        if graph is not None:
            outputs.extend(tensor for tensor in graph.outputs if tensor.dtype == variant)
    return outputs


@accessor("tensorflow.python.data.ops.dataset_ops:DatasetV2._as_serialized_graph")
def dataset_graph_def(dataset: Any) -> Any:
    """A ``tf.data`` pipeline's graph as a ``GraphDef`` (``Dataset._as_serialized_graph``, stateful ops kept).

    Raises whatever TensorFlow raises for a pipeline it cannot serialize.
    """
    tf_ = tf()
    serialized = dataset._as_serialized_graph(external_state_policy=tf_.data.experimental.ExternalStatePolicy.IGNORE)
    graph = tf_.compat.v1.GraphDef()
    graph.ParseFromString(serialized.numpy())
    return graph
