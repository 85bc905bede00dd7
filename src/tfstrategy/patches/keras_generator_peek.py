"""Make Keras 3 ``fit``/``evaluate`` on a Python generator under a strategy train on the generator's batches in order.

The bug (TensorFlow 2.21, Keras 3.15.1; seen from 3.10; keras-team/keras#20394 is its cousin for arrays with
``steps_per_epoch``): a model built in a strategy's scope, ``fit(generator, steps_per_epoch=4, epochs=3)`` on an
endless generator of batches 0, 1, 2, 3, 0, ...: most runs train on 0 1 2 3 0 1 2 3 0 1 2 3, but under load some
train on 0 1 1 2 3 0 ... or 0 1 0 1 2 3 ... (4 runs in 30 on 2 busy cores; every run once building the model takes
a moment). A model made outside any scope never does. No error, no warning: the weights differ from run to run.

Root cause. Keras' ``GeneratorDataAdapter`` draws the generator's first two batches to learn their spec, and each
pass over its ``tf.data`` pipeline replays those two and then goes on with the generator itself, which passes
share. Under a strategy, ``TensorFlowTrainer._maybe_symbolic_build`` makes a pass only to take one batch to build
the model and drops it (``fit`` then resets the epoch iterator): while it builds, the pipeline's prefetch, and the
distributed iterator's, draw batches 2, 3, ... from the generator, and the training pass, after its replay of
0 and 1, continues from wherever that left the generator. How far it got is the threads' timing.

The fix. For data Keras drew from a Python generator, ``Model._maybe_symbolic_build`` hands Keras' own function
the first batch the adapter already holds (cut to the first replica's rows, the shape Keras' own pass gives)
instead of a pass over the data: nothing is drawn from the generator before training. Any other data (arrays, a
``tf.data.Dataset``, a ``PyDataset``, which a new pass restarts), or a batch that is not dense arrays or tensors,
runs Keras' own code.

The probe. Keras' own ``_maybe_symbolic_build`` on a stand-in model under a one-device strategy and an epoch
iterator over a generator of 3 batches: the bug leaves a pass over the data open (the one ``fit`` drops). It runs
TensorFlow ops, so it waits until a model first builds from a generator. The upstream canary
``test_upstream_keras_still_peeks_at_a_generator_through_a_pass`` fails once Keras fixes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.patches.mechanism import Patch, ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Model

TARGET = "models.model.Model._maybe_symbolic_build"


def first_replica_batch(batch: object, replicas: int) -> object:
    """``batch``'s rows that the first of ``replicas`` replicas gets, or ``None`` if a leaf is not a dense array
    or tensor of at least one dimension (Keras' own code then takes the data)."""
    import numpy as np

    tree = _compat.keras3_tree()
    leaves = [leaf for leaf in tree.flatten(batch) if leaf is not None]
    dense = (np.ndarray, tf().Tensor)  # a SparseTensor or RaggedTensor is not a tf.Tensor
    if not leaves or not all(isinstance(leaf, dense) and len(leaf.shape) > 0 for leaf in leaves):
        return None
    return tree.map_structure(lambda leaf: None if leaf is None else leaf[:-(-int(leaf.shape[0]) // replicas)], batch)


class GeneratorPeekPatch(Patch):
    """Build from the generator's first batch, already drawn, instead of a pass that draws more."""

    name = "keras_generator_peek"
    change_text = "fit on a Python generator builds the model from its first batch (no batch skipped)"
    upstream = ("no public report found: Keras 3 fit on a Python generator under a strategy skips batches "
                "(cousin of keras-team/keras#20394)")
    verified_up_to = "3.15.1"
    targets = (TARGET,)
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_training_api_root()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        import numpy as np

        tf_ = tf()
        strategy = tf_.distribute.OneDeviceStrategy(tf_.config.list_logical_devices("CPU")[0].name)
        built: list[object] = []

        class StandIn:  # what Keras' _maybe_symbolic_build uses of a model
            _distribute_strategy = distribute_strategy = strategy

            def _symbolic_build(self, data_batch: object = None) -> None:
                built.append(data_batch)

        def batches() -> Any:
            for index in range(3):
                yield np.full((2, 1), index, "float32"), np.full((2, 1), index, "float32")

        epoch_iterator = _compat.tf_epoch_iterator(strategy, batches(), steps_per_epoch=1)
        _compat.trainer_build_peek(StandIn(), iterator=epoch_iterator)
        if len(built) != 1:
            raise RuntimeError(f"the stand-in model was built {len(built)} times, expected once")
        return ProbeResult({TARGET: _compat.epoch_iterator_reader(epoch_iterator) is not None})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def _maybe_symbolic_build(model: Model, iterator: object = None, data_batch: object = None) -> object:
            if iterator is not None and data_batch is None:
                first = _compat.generator_first_batch(iterator)
                strategy = _compat.model_strategy(model)  # None: Keras builds nothing here
                if first is not None and strategy is not None and PATCH.needed() is True:
                    batch = first_replica_batch(first, strategy.num_replicas_in_sync)
                    if batch is not None:
                        PATCH.acted()
                        iterator, data_batch = None, batch
            # Keras' own function as installed now (keras_mwms may wrap it), never one captured at install.
            return _compat.trainer_build_peek(model, iterator=iterator, data_batch=data_batch)

        return _maybe_symbolic_build


PATCH = GeneratorPeekPatch()
