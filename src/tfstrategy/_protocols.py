"""The TensorFlow and Keras objects tfstrategy handles, as the protocols its code uses (types only).

TensorFlow and Keras ship no types, so every object of theirs is ``Any`` to mypy. These protocols
declare only the attributes and methods tfstrategy reads, calls or writes, so mypy checks those
uses (a misspelt attribute, a missing argument) while any real strategy, model or optimizer, of
Keras 2, Keras 3 or tf_keras, still fits. A value TensorFlow computes and tfstrategy only passes
back to TensorFlow (a tensor, a per-replica value) stays ``Any``: nothing better can be said of it.

Beneath the ground floor: it imports nothing of tfstrategy and nothing of TensorFlow, and every other
module imports it only under ``TYPE_CHECKING``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

#: A value TensorFlow computes (a tensor, a per-replica value, a nest of them).
Tensor = Any


class Variable(Protocol):
    """A ``tf.Variable`` or a Keras variable (what ``model.weights`` holds)."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> Sequence[int | None]: ...

    def numpy(self) -> Any: ...

    def assign(self, value: object) -> object: ...


class StrategyExtended(Protocol):
    """``strategy.extended``: the replica devices, and whether a variable was created in scope."""

    @property
    def worker_devices(self) -> Sequence[str]: ...

    def variable_created_in_scope(self, variable: object) -> bool: ...

    def batch_reduce_to(self, reduce_op: object, value_destination_pairs: object, options: object = ...) -> Any: ...


class Strategy(Protocol):
    """A ``tf.distribute.Strategy`` (or the default strategy)."""

    @property
    def num_replicas_in_sync(self) -> int: ...

    @property
    def extended(self) -> StrategyExtended: ...

    @property
    def cluster_resolver(self) -> Any: ...

    def scope(self) -> AbstractContextManager[object]: ...

    def run(self, fn: Callable[..., object], args: tuple[object, ...] = ...,
            kwargs: dict[str, object] | None = ..., options: object = ...) -> Tensor: ...

    def reduce(self, reduce_op: object, value: object, axis: object) -> Tensor: ...

    def experimental_local_results(self, value: object) -> tuple[Tensor, ...]: ...

    def experimental_distribute_dataset(self, dataset: Dataset, options: object = ...) -> Any: ...

    def distribute_datasets_from_function(self, dataset_fn: Callable[..., Dataset],
                                          options: object = ...) -> Any: ...

    def experimental_distribute_values_from_function(self, value_fn: Callable[..., object]) -> Tensor: ...


class Optimizer(Protocol):
    """A Keras optimizer (Keras 3's, tf_keras' or a legacy one): what tfstrategy reads of it.

    The members after ``apply_gradients`` exist only on some releases or on a loss-scale optimizer;
    the code asks which (the release, ``hasattr``, the precision setting) before it uses them.
    """

    @property
    def iterations(self) -> Variable: ...

    @property
    def variables(self) -> Any: ...  # a list (Keras 3), a method (tf_keras' legacy optimizers): _compat reads it

    def build(self, var_list: Sequence[Variable]) -> None: ...

    def apply_gradients(self, grads_and_vars: Any) -> object: ...

    @property
    def built(self) -> bool: ...

    @property
    def use_ema(self) -> bool: ...

    @property
    def gradient_accumulation_steps(self) -> int | None: ...

    # A loss-scale optimizer's: Keras 3's ``scale_loss``, tf_keras' ``get_scaled_loss``/``get_unscaled_gradients``.
    @property
    def dynamic_scale(self) -> Any: ...

    @property
    def initial_scale(self) -> float: ...

    def scale_loss(self, loss: Tensor) -> Tensor: ...

    def get_scaled_loss(self, loss: Tensor) -> Tensor: ...

    def get_unscaled_gradients(self, grads: Sequence[Tensor]) -> list[Tensor]: ...


class Model(Protocol):
    """A Keras model (Keras 3's or tf_keras'): what tfstrategy reads, calls or overrides of it."""

    name: str
    optimizer: Optimizer  # None on a tf_keras model not compiled: the code checks before it relies on it
    train_function: Any  # None until make_train_function builds it; the code builds it first
    test_function: Any
    steps_per_execution: Any  # an int (Keras 3), a tf.Variable (tf_keras)
    jit_compile: bool | str

    @property
    def built(self) -> bool: ...

    @property
    def weights(self) -> list[Variable]: ...

    @property
    def variables(self) -> list[Variable]: ...

    @property
    def trainable_variables(self) -> list[Variable]: ...

    @property
    def losses(self) -> list[Tensor]: ...

    @property
    def distribute_strategy(self) -> Strategy: ...

    def __call__(self, inputs: object, *args: object, **kwargs: object) -> Tensor: ...

    def train_step(self, data: object) -> Any: ...

    def reset_metrics(self) -> None: ...

    def fit(self, *args: object, **kwargs: object) -> object: ...

    def compile(self, *args: object, **kwargs: object) -> None: ...

    def make_train_function(self, force: bool = ...) -> object: ...

    def save_weights(self, filepath: str, *args: object, **kwargs: object) -> None: ...

    def load_weights(self, filepath: str, *args: object, **kwargs: object) -> object: ...


class Dataset(Protocol):
    """A ``tf.data.Dataset``: what tfstrategy calls on one."""

    def __iter__(self) -> Iterator[Any]: ...

    def options(self) -> Any: ...

    def with_options(self, options: object) -> Dataset: ...

    def map(self, map_func: Callable[..., object], *args: object, **kwargs: object) -> Dataset: ...

    def batch(self, batch_size: object, *args: object, **kwargs: object) -> Dataset: ...

    def rebatch(self, batch_size: object, *args: object, **kwargs: object) -> Dataset: ...

    def repeat(self, count: object = ...) -> Dataset: ...

    def prefetch(self, buffer_size: object) -> Dataset: ...

    def cardinality(self) -> Tensor: ...


class HoldsStrategy(Protocol):
    """What holds a strategy: a :class:`tfstrategy.Selection` (known by its ``strategy``, not its class)."""

    @property
    def strategy(self) -> Strategy: ...


#: What the scope functions accept: a strategy, or a selection that holds one.
StrategyOrSelection = Strategy | HoldsStrategy


#: What Keras hands a callback's ``on_*`` methods: metric names to what the metrics returned (floats, tensors), or ``None``.
Logs = Mapping[str, Any] | None
