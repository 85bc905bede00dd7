"""One-line refusals: endless fit, batches captured by interleave/flat_map, impossible batches, unknown names."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

import tfstrategy
from helpers import mirrored
from tfstrategy.errors import BatchError, BuildError
from tfstrategy.runtime import hook_keras
from tfstrategy.training.datasets import batched_by, refuse_endless_fit

BATCHED = tf.data.Dataset.range(10).batch(2)


def _build_model():
    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])


def _endless():
    return tf.data.Dataset.from_tensor_slices((tf.ones((8, 2)), tf.ones((8, 1)))).repeat().batch(4)


def test_fit_on_an_infinite_dataset_without_steps_is_refused_by_the_guard():
    model, _ = tfstrategy.build_in_scope(mirrored(2), _build_model, optimizer="sgd", loss="mse")
    with pytest.raises(BatchError, match="infinite dataset .* no steps_per_epoch"):
        model.fit(_endless(), epochs=1, verbose=0)
    model.fit(_endless(), epochs=1, steps_per_epoch=2, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2


def test_the_hooks_fit_refuses_it_too():
    strategy = mirrored(2)
    with strategy.scope():
        model = _build_model()
        model.compile(optimizer="sgd", loss="mse")
    wrapped = hook_keras._audited(type(model).fit, "fit", "warn")
    with pytest.raises(BatchError, match="infinite dataset"):
        wrapped(model, _endless(), epochs=1, verbose=0)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        pytest.param((), {"x": tf.data.Dataset.range(4)}, id="finite"),
        pytest.param((), {"x": tf.data.Dataset.range(4).repeat(), "steps_per_epoch": 3}, id="bounded"),
        pytest.param((None,), {}, id="arrays"),
    ],
)
def test_refuse_endless_fit_lets_bounded_data_through(args, kwargs):
    refuse_endless_fit(args, kwargs)


@pytest.mark.parametrize(
    ("dataset", "found"),
    [
        pytest.param(tf.data.Dataset.range(2).interleave(lambda i: BATCHED), "captured by InterleaveDataset", id="interleave"),
        pytest.param(tf.data.Dataset.range(2).flat_map(lambda i: BATCHED), "captured by FlatMapDataset", id="flat_map"),
        pytest.param(tf.data.Dataset.range(2).interleave(lambda i: BATCHED, num_parallel_calls=2),
                     "captured by ParallelInterleaveDataset", id="parallel-interleave"),
    ],
)
def test_batches_captured_by_interleave_or_flat_map_are_found(dataset, found):
    assert found in batched_by(dataset)
    with pytest.raises(BatchError, match="already batched"):
        tfstrategy.plan_dataset(dataset, mirrored(2), global_batch=4)


def test_an_unbatch_inside_the_function_is_not_a_batch():
    assert batched_by(tf.data.Dataset.range(2).interleave(lambda i: BATCHED.unbatch())) is None


@pytest.mark.parametrize("value", [2**63, 2**70])
def test_impossible_global_batches_are_refused_in_one_line(value):
    with pytest.raises(BatchError, match=r"expected at most 2\*\*63-1"):
        tfstrategy.prepare_dataset(tf.data.Dataset.range(10), mirrored(2), global_batch=value)


@pytest.mark.parametrize(
    ("compile_args", "message"),
    [
        pytest.param({"optimizer": "sgd", "loss": "nonsense"}, "loss='nonsense'; expected the name of a Keras loss", id="loss"),
        pytest.param({"optimizer": "nonsense", "loss": "mse"}, "optimizer='nonsense'; expected the name of a Keras optimizer", id="optimizer"),
        pytest.param({"optimizer": "sgd", "loss": "mse", "metrics": ["mae", "nonsense"]}, "metrics='nonsense'", id="metric"),
        pytest.param({"optimizer": "sgd", "loss": {"out": "nonsense"}}, "loss='nonsense'", id="loss-dict"),
    ],
)
def test_unknown_compile_names_are_refused_at_build_in_scope(compile_args, message):
    with pytest.raises(BuildError, match=message):
        tfstrategy.build_in_scope(mirrored(2), _build_model, **compile_args)


def test_compile_metric_aliases_are_accepted():
    model, _ = tfstrategy.build_in_scope(mirrored(2), _build_model, optimizer="sgd", loss="mse", metrics=["acc", "mae"])
    assert model.optimizer is not None
