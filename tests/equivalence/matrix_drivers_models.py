"""The equivalence matrix's drivers for layers with state or randomness, and for compile's options.

Same contract as ``matrix_drivers.py`` (each driver takes a strategy and returns what a user sees). A random
layer cannot give one device's numbers on 2 replicas: its cells return what one device's documented
behaviour on the global batch guarantees, as 0/1 facts (:func:`random_facts`), and compare those exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from matrix_drivers import BATCH, EPOCHS, FEATURES, _lists, _set_initial_weights, _trained, data, regressor

#: The width of a random layer's input (a batch of ones, BATCH rows).
WIDTH = 8


# --------------------------------------------------------------------------- random layers


def _draws(strategy: Any, make_layer: Callable[[], Any], calls: int = 2) -> list[np.ndarray]:
    """The layer called in training mode on a global batch of ones, ``calls`` times, each call's whole output.

    The call runs inside ``strategy.run`` in a ``tf.function``, as ``fit``'s train step runs it; the replicas'
    rows are gathered in order, so row ``i`` is example ``i`` of the global batch on either strategy.
    """
    import tensorflow as tf

    with strategy.scope():
        layer = make_layer()
    ones = tf.data.Dataset.from_tensors(np.ones((BATCH, WIDTH), "float32")).repeat(calls)

    @tf.function
    def step(batch: Any) -> Any:
        return strategy.gather(strategy.run(lambda x: layer(x, training=True), args=(batch,)), axis=0)

    return [step(batch).numpy() for batch in strategy.experimental_distribute_dataset(ones)]


def random_facts(draws: list[np.ndarray], mean: float, std: float) -> dict[str, Any]:
    """What one device's random layer guarantees on the global batch, each fact 1.0 if it holds.

    - ``examples_differ``: the second half of the batch (replica 1's examples on 2 replicas) does not repeat
      the first half's draws (one device draws every example independently);
    - ``calls_differ``: the second call does not repeat the first (the seed generator advances);
    - ``mean``/``std``: the draws' statistics within 5 standard errors of the layer's documented ones.
    """
    first, second = draws
    half = BATCH // 2
    values = np.concatenate([d.ravel() for d in draws])
    bound = 5 * std / np.sqrt(values.size)
    return {"facts": {
        "examples_differ": [float(not np.array_equal(first[:half], first[half:]))],
        "calls_differ": [float(not np.array_equal(first, second))],
        "mean": [float(abs(values.mean() - mean) < bound)],
        "std": [float(abs(values.std() - std) < 0.2 * std)],
    }}


def dropout(strategy: Any) -> dict[str, Any]:
    import keras

    # Ones through Dropout(0.5): each value 0 or 2 (mean 1, standard deviation 1).
    return random_facts(_draws(strategy, lambda: keras.layers.Dropout(0.5, seed=3)), mean=1.0, std=1.0)


def gaussian_noise(strategy: Any) -> dict[str, Any]:
    import keras

    return random_facts(_draws(strategy, lambda: keras.layers.GaussianNoise(0.5, seed=3)), mean=1.0, std=0.5)


def _noise_layer_class() -> Any:
    import keras

    class Jitter(keras.layers.Layer):
        """keras.io's way of drawing random numbers in a layer: a SeedGenerator attribute, keras.random."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.seed_generator = keras.random.SeedGenerator(3)

        def call(self, x: Any, training: bool = False) -> Any:
            return x + keras.random.uniform(keras.ops.shape(x), seed=self.seed_generator) if training else x

    return Jitter


def seed_generator(strategy: Any) -> dict[str, Any]:
    jitter = _noise_layer_class()
    return random_facts(_draws(strategy, jitter), mean=1.5, std=float(np.sqrt(1 / 12)))


def dropout_rate_0(strategy: Any) -> dict[str, Any]:
    """A Dropout(0) model trained: nothing random, so the weights compare."""
    import keras

    x, y = data()
    with strategy.scope():
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dropout(0.0)(keras.layers.Dense(8, activation="tanh")(inputs))
        fitted = _set_initial_weights(keras.Model(inputs, keras.layers.Dense(1)(hidden)))
        fitted.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return _trained(fitted, fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0))


# --------------------------------------------------------------------------- layers with state


#: The replicas whose shares of the batch ``BatchNormalization(synchronized=False)`` normalizes separately.
REPLICAS = 2


@functools.cache
def per_replica_batch_normalization() -> Any:
    """The documented behaviour of ``BatchNormalization(synchronized=False)`` on REPLICAS replicas, on one device.

    Keras' docs: with ``synchronized=False`` "each replica uses its own local batch statistics". In training this
    layer splits the global batch into the REPLICAS consecutive shares the replicas get, normalizes each share by
    its own mean and variance (``ops.moments``, ``ops.batch_normalization``, as Keras' layer does for the whole
    batch), and moves the moving statistics, which a ``MirroredVariable`` keeps the same on every replica, by the
    replicas' mean of their statistics (what tf.keras' ``MEAN``-aggregated moving statistics held). Gradients flow
    through each share's statistics, as on each replica. Inference is Keras' own (the moving statistics).
    """
    import keras
    from keras import ops

    class PerReplicaBatchNormalization(keras.layers.BatchNormalization):
        def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
            if mask is not None:
                raise NotImplementedError("Received a mask; the per-replica reference computes unmasked statistics.")
            if not training:
                return super().call(inputs, training=training)
            shares = ops.split(ops.cast(inputs, "float32"), REPLICAS, axis=0)
            axes = [i for i in range(len(inputs.shape)) if i != self.axis % len(inputs.shape)]
            moments = [ops.moments(share, axes=axes) for share in shares]
            outputs = [ops.batch_normalization(share, mean, variance, axis=self.axis, offset=self.beta,
                                               scale=self.gamma, epsilon=self.epsilon)
                       for share, (mean, variance) in zip(shares, moments, strict=True)]
            for moving, index in ((self.moving_mean, 0), (self.moving_variance, 1)):
                replicas_mean = ops.mean(ops.stack([one[index] for one in moments]), axis=0)
                moving.assign(moving * self.momentum + replicas_mean * (1.0 - self.momentum))
            return ops.cast(ops.concatenate(outputs, axis=0), self.compute_dtype)

    return PerReplicaBatchNormalization


def _batch_norm_model(strategy: Any, synchronized: bool, layer: Any = None) -> Any:
    import keras

    with strategy.scope():
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(8, activation="tanh")(inputs)
        normal = (layer or keras.layers.BatchNormalization)(momentum=0.5, synchronized=synchronized)(hidden)
        built = _set_initial_weights(keras.Model(inputs, keras.layers.Dense(1)(normal)))
        variance = built.layers[2].moving_variance
        variance.assign(np.abs(variance.numpy()) + 0.5)  # a variance, positive
        built.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return built


def batch_norm(strategy: Any, synchronized: bool = False) -> dict[str, Any]:
    """Train (batch statistics), then predict (the moving statistics; ``evaluate`` is the inference cell's)."""
    x, y = data()
    fitted = _batch_norm_model(strategy, synchronized)
    history = fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return _trained(fitted, history, predictions=fitted.predict(x, batch_size=BATCH, verbose=0))


@functools.cache
def _batch_norm_per_replica(strategy: Any, reference: bool) -> dict[str, Any]:
    """``BatchNormalization()`` (``synchronized=False``) trained, then ``predict``: everything both cells compare.

    ``reference``: on one device with :func:`per_replica_batch_normalization`, the documented per-replica
    behaviour, whose moving statistics every replica holds (so the one device's copy stands for each of REPLICAS).
    Else Keras' own layer on ``strategy``, each replica's copy of the moving statistics (:func:`replica_copies`:
    a ``MirroredVariable``'s copies should be one value).
    """
    x, y = data()
    fitted = _batch_norm_model(strategy, False, per_replica_batch_normalization() if reference else None)
    history = fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    layer = fitted.layers[2]
    copies = replica_copies(strategy, (layer.moving_mean, layer.moving_variance))  # (replica, mean/var, unit)
    return {"trainable": [np.asarray(w) for w in fitted.trainable_weights], "logs": _lists(history.history),
            "steps": int(fitted.optimizer.iterations.numpy()),
            "moving_statistics": np.concatenate([copies] * REPLICAS) if reference else copies,
            "predictions": fitted.predict(x, batch_size=BATCH, verbose=0)}


def replica_copies(strategy: Any, variables: tuple[Any, ...]) -> np.ndarray:
    """Each replica's copy of ``variables`` (of one shape), every replica of the job in order: (replica, variable, ...).

    Each replica reads its own copy inside ``strategy.run`` and ``strategy.gather`` collects them, so on several
    workers the result holds every worker's copies (``experimental_local_results`` gives this process's only).
    """
    import tensorflow as tf

    @tf.function
    def read() -> Any:
        return strategy.gather(strategy.run(lambda: tf.stack([tf.identity(one) for one in variables])[None]), axis=0)

    return read().numpy()


def batch_norm_training(strategy: Any, reference: bool = False) -> dict[str, Any]:
    """``BatchNormalization()`` trained: its trainable weights, History logs, steps (the moving statistics and the
    predictions on them are :func:`batch_norm_moving_statistics`')."""
    trained = _batch_norm_per_replica(strategy, reference)
    return {"weights": trained["trainable"], "logs": trained["logs"], "steps": trained["steps"]}


def batch_norm_moving_statistics(strategy: Any, reference: bool = False) -> dict[str, Any]:
    """The same training's moving statistics, each replica's copy, and ``predict`` on them."""
    trained = _batch_norm_per_replica(strategy, reference)
    return {"moving_statistics": trained["moving_statistics"], "predictions": trained["predictions"]}


def batch_norm_inference(strategy: Any) -> dict[str, Any]:
    """Inference only: set moving statistics, then evaluate and predict."""
    x, y = data()
    used = _batch_norm_model(strategy, synchronized=False)
    return {"evaluate": _lists(used.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)),
            "predictions": used.predict(x, batch_size=BATCH, verbose=0)}


def fixed_batch_input(strategy: Any) -> dict[str, Any]:
    """A model whose ``Input`` declares ``batch_size=BATCH``, ``fit`` and ``predict`` on whole batches."""
    import keras

    x, y = data()
    with strategy.scope():
        inputs = keras.Input((FEATURES,), batch_size=BATCH)
        hidden = keras.layers.Dense(8, activation="tanh")(inputs)
        fitted = _set_initial_weights(keras.Model(inputs, keras.layers.Dense(1)(hidden)))
        fitted.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    history = fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return _trained(fitted, history, predictions=fitted.predict(x, batch_size=BATCH, verbose=0))


def stateful_lstm(strategy: Any) -> dict[str, Any]:
    """``LSTM(stateful=True)`` on ``Input(batch_size=BATCH)``: 4 batches of sequences, the state carried."""
    import keras

    rng = np.random.RandomState(0)
    x = rng.randn(4 * BATCH, 3, 2).astype("float32")
    y = x.sum(axis=(1, 2))[:, None].astype("float32")
    with strategy.scope():
        inputs = keras.Input((3, 2), batch_size=BATCH)
        fitted = _set_initial_weights(keras.Model(inputs, keras.layers.Dense(1)(keras.layers.LSTM(4, stateful=True)(inputs))))
        fitted.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return _trained(fitted, history, predictions=fitted.predict(x, batch_size=BATCH, verbose=0))


# --------------------------------------------------------------------------- compile options


def fit_compiled(optimizer: Any = None, **compile_options: Any) -> Callable[[Any], dict[str, Any]]:
    def run(strategy: Any) -> dict[str, Any]:
        x, y = data()
        fitted = regressor(strategy, optimizer, **compile_options)
        history = fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
        return _trained(fitted, history, predictions=fitted.predict(x, batch_size=BATCH, verbose=0))

    return run


def mixed_precision(**compile_options: Any) -> Callable[[Any], dict[str, Any]]:
    """``fit_compiled`` under the ``mixed_float16`` policy (compile wraps the optimizer in a LossScaleOptimizer),
    the global policy put back after."""

    def run(strategy: Any) -> dict[str, Any]:
        import keras

        before = keras.config.dtype_policy()
        keras.config.set_dtype_policy("mixed_float16")
        try:
            # An initial loss scale that overflows nowhere: the default, 32768, overflows float16 in the first
            # steps, and where depends on how the batch is split (one device sums 16 rows' float16 gradients,
            # a replica 8), so one device and 2 replicas would skip different steps while the scale settles.
            def optimizer() -> Any:
                return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=128)

            return fit_compiled(optimizer=optimizer, **compile_options)(strategy)
        finally:
            keras.config.set_dtype_policy(before)

    return run
