"""steps_per_execution="auto": the choice as a pure function of injected timings, and one real tuning."""

from __future__ import annotations

import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from helpers import mirrored, run_cli
from tfstrategy.errors import TrainingError
from tfstrategy.training.steps_per_execution import choose_steps_per_execution, last_choice, steps_cap


def linear(dispatch: float, step: float):
    """An execution of K steps costs one dispatch plus K steps; records the Ks timed."""
    timed: list[int] = []

    def time_execution(k: int) -> float:
        timed.append(k)
        return dispatch + k * step

    time_execution.timed = timed
    return time_execution


SCREEN = [1, 4, 4, 1, 1, 4]  # three alternating rounds of K=1 and K=4 estimate the dispatch


def rounds_of(cap: int) -> list[int]:
    """Five rounds of K=1 and K=cap, the order swapped every round, so drift hits both alike."""
    return [1, cap, cap, 1, 1, cap, cap, 1, 1, cap]


@pytest.mark.parametrize(
    ("dispatch", "step", "cap", "expected", "timed"),
    [
        pytest.param(2e-3, 5e-4, 64, 64, SCREEN + rounds_of(64), id="dispatch-bound-takes-the-large-k"),
        pytest.param(2e-3, 1e-3, 64, 64, SCREEN + rounds_of(64), id="a-gain-of-3x-pays"),
        pytest.param(2e-3, 1e-2, 64, 64, SCREEN + rounds_of(64), id="a-gain-of-1.2x-pays"),
        pytest.param(2e-3, 1.6e-2, 64, 1, SCREEN + rounds_of(64), id="a-gain-of-1.12x-is-timed-and-stays-at-1"),
        pytest.param(2e-3, 5e-2, 64, 1, SCREEN, id="compute-bound-screened-out-without-long-executions"),
        pytest.param(2e-3, 5e-4, 10, 10, SCREEN + rounds_of(10), id="capped-by-a-short-epoch"),
        pytest.param(2e-3, 5e-4, 3, 3, [1, 3, 3, 1, 1, 3] + rounds_of(3), id="a-cap-under-4-is-its-own-screen"),
    ],
)
def test_choice_from_injected_timings(dispatch, step, cap, expected, timed):
    time_execution = linear(dispatch, step)
    choice = choose_steps_per_execution(time_execution, cap=cap)
    assert choice.steps == expected
    assert time_execution.timed == timed
    assert choice.line().startswith(f"steps_per_execution={expected} (")


def test_cap_1_times_nothing():
    time_execution = linear(2e-3, 5e-4)
    choice = choose_steps_per_execution(time_execution, cap=1)
    assert choice.steps == 1 and time_execution.timed == [] and choice.reason == "the cap is 1"


def test_rounds_go_on_until_min_seconds():
    time_execution = linear(0.01, 0.001)  # 11 ms + 74 ms a round
    choice = choose_steps_per_execution(time_execution, cap=64, min_seconds=1.0)
    assert choice.rounds == 3 + 12  # the screen, then 12 x 85 ms >= 1 s


def noisy(dispatch: float, step: float, seed: int):
    """Linear timings, each lengthened by a random share (exponential, mean 10%): other processes only add time."""
    rng = np.random.default_rng(seed)
    return lambda k: (dispatch + k * step) * (1 + rng.exponential(0.1))


def test_noise_that_only_adds_time_does_not_change_the_choice():
    # A neighbour steals the core for a random share of each execution: 100 runs, one answer each.
    for dispatch, step, expected in ((2e-3, 5e-4, 64), (2e-3, 5e-2, 1), (2e-3, 2.5e-2, 1)):
        choices = set()
        for seed in range(100):
            choices.add(choose_steps_per_execution(noisy(dispatch, step, seed), cap=64).steps)
        assert choices == {expected}


def test_agree_makes_the_decision_on_the_jobs_timings():
    # One worker alone would keep K=64; the job's timings (the same per step at every K) say 1.
    choice = choose_steps_per_execution(linear(2e-3, 5e-4), cap=64, agree=lambda seconds: 0.0025)
    assert choice.steps == 1 and "even K=64 could run a step only ~1.00x as fast" in choice.reason


def test_a_cap_below_1_is_an_error():
    with pytest.raises(TrainingError, match="Received a steps_per_execution cap of 0; expected 1 or more"):
        choose_steps_per_execution(lambda k: 1.0, cap=0)


class PerBatchCallback(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


class EpochCallback(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        pass


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"steps_per_epoch": None}, (64, "the largest K tried"), id="unknown-epoch"),
        pytest.param({"steps_per_epoch": 20}, (20, "the epoch has 20 steps"), id="short-epoch"),
        pytest.param({"steps_per_epoch": 500}, (64, "the largest K tried"), id="long-epoch"),
        pytest.param({"steps_per_epoch": 20, "callbacks": [EpochCallback(), keras.callbacks.History()]},
                     (20, "the epoch has 20 steps"), id="epoch-and-keras-callbacks-allow-K"),
    ],
)
def test_steps_cap(kwargs, expected):
    assert steps_cap(**kwargs) == expected


def test_a_per_batch_callback_caps_at_1():
    cap, reason = steps_cap(steps_per_epoch=None, callbacks=[PerBatchCallback()])
    assert cap == 1 and "PerBatchCallback act on every batch" in reason


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 4)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")


def _model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


@pytest.mark.slow
def test_tuning_a_real_model_sets_k_and_leaves_its_state_alone():
    strategy = mirrored(2)
    model, _ = tfstrategy.build_in_scope(strategy, _model, optimizer="adam", loss="mse", metrics=["mae"])
    before = [w.copy() for w in model.get_weights()]
    dataset = tf.data.Dataset.from_tensor_slices(_data()).batch(64)  # 16 steps per epoch
    choice = tfstrategy.tune_steps_per_execution(model, dataset, min_seconds=0.0)
    assert choice.steps in (1, 16) and choice.cap == 16
    assert model.steps_per_execution == choice.steps and last_choice(model) is choice
    assert int(model.optimizer.iterations.numpy()) == 0
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    history = model.fit(dataset, epochs=1, verbose=0)  # trains with the chosen K (the fixed loop on 2 replicas)
    assert int(model.optimizer.iterations.numpy()) == 16 and np.isfinite(history.history["loss"][0])


@pytest.mark.slow
def test_build_in_scope_auto_tunes_at_the_first_fit(capsys):
    model, report = tfstrategy.build_in_scope(mirrored(1), _model, optimizer="sgd", loss="mse",
                                              steps_per_execution="auto")
    assert report.steps_per_execution == "auto" and "steps_per_execution auto (experimental: tuned at the first fit)" in report.lines()
    assert model.steps_per_execution == 1
    model.fit(*_data(), batch_size=128, epochs=1, verbose=2)
    choice = last_choice(model)
    assert choice is not None and model.steps_per_execution == choice.steps and choice.cap == 8
    assert f"tfstrategy: {choice.line()}" in capsys.readouterr().out
    assert int(model.optimizer.iterations.numpy()) == 8  # the measuring steps were undone


def test_build_in_scope_refuses_an_unknown_steps_per_execution_string():
    with pytest.raises(tfstrategy.errors.BuildError, match="Received steps_per_execution='fast'; expected a positive"):
        tfstrategy.build_in_scope(mirrored(1), _model, optimizer="sgd", loss="mse", steps_per_execution="fast")


def _shuffled(seed: int = 7):
    return tf.data.Dataset.from_tensor_slices(_data()).shuffle(1024, seed=seed).batch(64)


def _dropout_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.3),
                             keras.layers.Dense(1)])


def _seeded_fit(replicas: int, steps_per_execution: int | str):
    keras.utils.set_random_seed(1)
    dataset = _shuffled()
    model, _ = tfstrategy.build_in_scope(mirrored(replicas), _dropout_model, optimizer="adam", loss="mse",
                                         steps_per_execution=steps_per_execution)
    history = model.fit(dataset, epochs=2, verbose=0).history["loss"]
    return model, history


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_auto_then_fit_equals_the_fit_with_the_chosen_k_fixed(replicas):
    # Dropout draws from a seed generator and the shuffle reshuffles per iterator: tuning must move neither.
    tuned, tuned_losses = _seeded_fit(replicas, "auto")
    chosen = last_choice(tuned).steps
    fixed, fixed_losses = _seeded_fit(replicas, chosen)
    np.testing.assert_allclose(tuned_losses, fixed_losses, rtol=0, atol=1e-6)
    for a, b in zip(tuned.get_weights(), fixed.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert int(tuned.optimizer.iterations.numpy()) == int(fixed.optimizer.iterations.numpy()) == 32


def test_one_round_that_flatters_the_large_k_decides_nothing():
    # A real gain of ~1.12x (below 1.15x); in one round the large K ran alone on a quiet core, 20% faster.
    rounds_seen = {"cap": 0}

    def time_execution(k: int) -> float:
        seconds = 2e-3 + k * 1.6e-2
        if k == 64:
            rounds_seen["cap"] += 1
            if rounds_seen["cap"] == 3:
                seconds *= 0.8
        return seconds

    choice = choose_steps_per_execution(time_execution, cap=64)
    assert choice.steps == 1, choice.line()  # the fastest of each K alone would say 1.40x and keep K=64


class _NoBatchHere:
    """A Keras epoch iterator over a real distributed dataset that fails if Keras takes a batch from it."""

    def __init__(self, strategy):
        self._distributed_dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).batch(4))

    def __iter__(self):
        raise AssertionError("Keras took a batch to build a model that was built")


def test_after_tuning_fit_takes_no_batch_to_build_a_built_model():
    # Keras' build peek is the iterator drop that segfaults after the tuner (benchmarks/README.md).
    strategy = mirrored(1)
    model, _ = tfstrategy.build_in_scope(strategy, _model, optimizer="sgd", loss="mse")
    with pytest.raises(AssertionError, match="took a batch"):  # Keras' own code peeks even when built
        model._maybe_symbolic_build(iterator=_NoBatchHere(strategy))
    tfstrategy.tune_steps_per_execution(model, tf.data.Dataset.from_tensor_slices(_data()).batch(128))
    model._maybe_symbolic_build(iterator=_NoBatchHere(strategy))
    history = model.fit(*_data(), batch_size=128, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and int(model.optimizer.iterations.numpy()) == 16


def test_the_skipped_peek_draws_the_shuffle_seeds_the_peek_would():
    # The peek's iterator moves a reshuffling shuffle's order for the epochs after it; its stand-in must too.
    from tfstrategy._compat import symbolic_build
    from tfstrategy.training.no_trace import skip_build_peek

    def trained_weights(peek):
        tf.keras.utils.set_random_seed(3)
        model, _ = tfstrategy.build_in_scope(mirrored(1), _model, optimizer="sgd", loss="mse")
        x, y = _data()
        symbolic_build(model, (tf.constant(x[:8]), tf.constant(y[:8])))  # as the tuner does: nothing left to build
        if peek == "skipped":
            skip_build_peek(model)
        elif peek == "none":  # what a skip that drew nothing would do
            object.__setattr__(model, "_maybe_symbolic_build",
                               lambda iterator=None, data_batch=None: type(model)._maybe_symbolic_build(model))
        data = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).shuffle(64, seed=5).batch(8)
        model.fit(data, epochs=2, verbose=0)
        return np.concatenate([w.ravel() for w in model.get_weights()])

    keras_own = trained_weights("keras")
    np.testing.assert_array_equal(trained_weights("skipped"), keras_own)
    assert not np.array_equal(trained_weights("none"), keras_own)  # the order did depend on the peek's draw


def test_a_model_with_something_left_to_build_still_takes_its_batch():
    from tfstrategy.training.no_trace import skip_build_peek

    strategy = mirrored(1)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1)])  # no Input: unbuilt until it sees a batch
        model.compile(optimizer="sgd", loss="mse")
    skip_build_peek(model)
    with pytest.raises(AssertionError, match="took a batch"):
        model._maybe_symbolic_build(iterator=_NoBatchHere(strategy))
    model.fit(*_data(), batch_size=128, epochs=1, verbose=0)
    assert model.built and model.layers[0].kernel.shape == (4, 1)


# The default path (the hook of `tfstrategy run`, select(), build_in_scope with an int K, fit, a custom loop's
# step) in a fresh process, then "auto" in the same process: the experimental tuner's modules and instance
# overrides appear only with "auto".
_DEFAULT_PATH = """
import sys
import keras
import numpy as np
import tfstrategy
from tfstrategy.state.registry import RUNTIME

MACHINERY = ("tfstrategy.training.no_trace", "tfstrategy.training.steps_per_execution",
             "tfstrategy.performance.report", "tfstrategy.performance.probes")


def loaded():
    return [name for name in MACHINERY if name in sys.modules]


def overridden(model):
    names = [name for name in ("_maybe_symbolic_build",) if name in vars(model)]
    names += [kind for kind in RUNTIME.attached(model) if kind == "steps_per_execution_choice"]
    fit = vars(model).get("fit")
    return names + (["fit"] if fit is not None and not getattr(fit, "__tfstrategy_guard__", False) else [])


def build(steps_per_execution):
    model, _ = tfstrategy.build_in_scope(selection, lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
                                         optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model


selection = tfstrategy.select()
x = np.ones((64, 4), "float32")
model = build(8)
model.fit(x, x[:, :1], batch_size=16, epochs=2, verbose=0)
step = tfstrategy.make_train_step(model, strategy=selection, global_batch=16, loss=keras.losses.MeanSquaredError(reduction="none"))
print("default", loaded(), overridden(model))
tuned = build("auto")
tuned.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
print("auto", loaded(), overridden(tuned))
"""


@pytest.mark.slow
def test_the_default_path_loads_none_of_the_auto_k_machinery():
    done = run_cli("run", "--", sys.executable, "-c", _DEFAULT_PATH)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "default [] []" in lines, done.stdout
    assert ("auto ['tfstrategy.training.no_trace', 'tfstrategy.training.steps_per_execution'] "
            "['_maybe_symbolic_build', 'steps_per_execution_choice']") in lines, done.stdout
