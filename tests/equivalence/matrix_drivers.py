"""The drivers of the equivalence matrix: the data, the model, and one function per way of training.

Each driver takes a strategy, builds its model in the strategy's scope (same initial weights on every
strategy), runs one way of training or predicting, and returns what a user sees, for
:func:`matrix_cells.compare`: ``weights`` (the final weights), ``logs`` (History, or each call's logs),
``evaluate`` (``evaluate``'s dict), ``predictions`` and ``steps`` (the optimizer's ``iterations``).
TensorFlow and Keras are imported inside the functions, so the table imports without them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

FEATURES = 4
CLASSES = 3
#: The global batch, the same on one device and on 2 replicas (8 examples per replica).
BATCH = 16
EPOCHS = 2

# --------------------------------------------------------------------------- data and model


def data(examples: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A small regression problem: ``examples`` rows of FEATURES inputs, one target."""
    rng = np.random.RandomState(seed)
    x = rng.randn(examples, FEATURES).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1 * rng.randn(examples, 1)).astype("float32")
    return x, y


def labels(x: np.ndarray) -> np.ndarray:
    """Three classes from the inputs, for the classifier cells."""
    return np.argmax(x[:, :CLASSES], axis=1).astype("int32")


def _set_initial_weights(model: Any) -> Any:
    rng = np.random.RandomState(1)
    model.set_weights([(0.5 * rng.randn(*w.shape)).astype("float32") for w in model.get_weights()])
    return model


def model(outputs: int = 1, activation: str | None = None, cls: Any = None) -> Any:
    """A 4-8-``outputs`` MLP with fixed initial weights (build it in the strategy's scope)."""
    import keras

    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    out = keras.layers.Dense(outputs, activation=activation)(hidden)
    return _set_initial_weights((cls or keras.Model)(inputs, out))


def regressor(strategy: Any, optimizer: Any = None, cls: Any = None, **compile_options: Any) -> Any:
    import keras

    with strategy.scope():
        built = model(cls=cls)
        options: dict[str, Any] = {"loss": "mse", "metrics": ["mae"], **compile_options}
        built.compile(optimizer=optimizer() if optimizer else keras.optimizers.SGD(0.1), **options)
    return built


def _lists(logs: dict[str, Any]) -> dict[str, list[float]]:
    return {key: [float(v) for v in (value if isinstance(value, list) else [value])] for key, value in logs.items()}


def _trained(fitted: Any, history: Any, **extra: Any) -> dict[str, Any]:
    return {"weights": fitted.get_weights(), "logs": _lists(history.history),
            "steps": int(fitted.optimizer.iterations.numpy()), **extra}


# --------------------------------------------------------------------------- drivers: entry points


def fit_numpy(strategy: Any, examples: int = 64, optimizer: Any = None, **fit_options: Any) -> dict[str, Any]:
    x, y = data(examples)
    fitted = regressor(strategy, optimizer)
    history = fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, **fit_options)
    return _trained(fitted, history)


def evaluate(strategy: Any) -> dict[str, Any]:
    x, y = data()
    return {"evaluate": _lists(regressor(strategy).evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True))}


def predict(strategy: Any) -> dict[str, Any]:
    x, _ = data()
    return {"predictions": regressor(strategy).predict(x, batch_size=BATCH, verbose=0)}


def train_on_batch(strategy: Any) -> dict[str, Any]:
    x, y = data()
    fitted = regressor(strategy)
    logs = [fitted.train_on_batch(x[i:i + BATCH], y[i:i + BATCH], return_dict=True) for i in range(0, 48, BATCH)]
    return {"weights": fitted.get_weights(), "logs": {k: [float(one[k]) for one in logs] for k in logs[0]},
            "steps": int(fitted.optimizer.iterations.numpy())}


def test_on_batch(strategy: Any) -> dict[str, Any]:
    x, y = data()
    tested = regressor(strategy)
    logs = [tested.test_on_batch(x[i:i + BATCH], y[i:i + BATCH], return_dict=True) for i in (0, BATCH)]
    return {"logs": {k: [float(one[k]) for one in logs] for k in logs[0]}}


def predict_on_batch(strategy: Any) -> dict[str, Any]:
    x, _ = data()
    return {"predictions": np.asarray(regressor(strategy).predict_on_batch(x[:BATCH]))}


@functools.cache
def _guide_model_class() -> Any:
    """A ``train_step``/``test_step`` in the shape of keras.io's "Customizing what happens in fit()" guide
    (TensorFlow backend): ``compute_loss``, a ``Mean`` loss tracker, a metric, and ``metrics`` listing both."""
    import keras
    import tensorflow as tf

    class GuideModel(keras.Model):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

        def train_step(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        def test_step(self, batch: Any) -> dict[str, Any]:
            x, y = batch
            y_pred = self(x, training=False)
            self.loss_tracker.update_state(self.compute_loss(y=y, y_pred=y_pred))
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        @property
        def metrics(self) -> list[Any]:
            return [self.loss_tracker, self.mae_metric]

    return GuideModel


def custom_train_step(strategy: Any) -> dict[str, Any]:
    x, y = data()
    fitted = regressor(strategy, cls=_guide_model_class(), metrics=None)
    history = fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    evaluated = fitted.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    return _trained(fitted, history, evaluate=_lists(evaluated))


def custom_loop(strategy: Any) -> dict[str, Any]:
    """TensorFlow's distributed custom-loop tutorial, in short: a loss object with ``reduction="none"``
    and ``tf.nn.compute_average_loss`` over the global batch, inside ``strategy.run`` (:func:`_loop`)."""
    import tensorflow as tf

    x, y = data()
    return _loop(strategy, strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)))


def loss_object(strategy: Any) -> dict[str, Any]:
    """A loss object with Keras' default reduction, as keras.io's "writing a training loop from scratch" calls it,
    inside ``strategy.run`` (each replica's value is its share of the global mean: the step SUMs them), and in the
    strategy's scope outside ``strategy.run`` after each epoch, on the whole data (a script's validation loss)."""
    import keras
    import tensorflow as tf

    x, y = data()
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))
    with strategy.scope():
        built = model()
        optimizer = keras.optimizers.SGD(0.1)
        loss_fn = keras.losses.MeanSquaredError()

    def replica_step(features: Any, targets: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(targets, built(features, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, built.trainable_variables), built.trainable_variables))
        return loss

    @tf.function
    def step(batch: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    losses, whole_data = [], []
    for _ in range(EPOCHS):
        losses.extend(float(step(batch)) for batch in dataset)
        with strategy.scope():
            whole_data.append(float(loss_fn(y, built(x))))
    return {"weights": built.get_weights(), "logs": {"loss": losses, "whole_data_loss": whole_data},
            "steps": int(optimizer.iterations.numpy())}


# --------------------------------------------------------------------------- drivers: inputs


def numpy_uneven(strategy: Any, examples: int) -> dict[str, Any]:
    """``fit``, ``evaluate`` and ``predict`` on NumPy arrays whose last batch is not BATCH."""
    x, y = data(examples)
    fitted = regressor(strategy)
    history = fitted.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return _trained(fitted, history, evaluate=_lists(fitted.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)),
                    predictions=fitted.predict(x, batch_size=BATCH, verbose=0))


def tf_data(strategy: Any) -> dict[str, Any]:
    import tensorflow as tf

    x, y = data()
    batched = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    fitted = regressor(strategy)
    history = fitted.fit(batched, epochs=EPOCHS, shuffle=False, verbose=0)
    return _trained(fitted, history, evaluate=_lists(fitted.evaluate(batched, verbose=0, return_dict=True)),
                    predictions=fitted.predict(tf.data.Dataset.from_tensor_slices(x).batch(BATCH), verbose=0))


def tf_data_infinite(strategy: Any) -> dict[str, Any]:
    import tensorflow as tf

    x, y = data()
    endless = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat()
    fitted = regressor(strategy)
    return _trained(fitted, fitted.fit(endless, steps_per_epoch=3, epochs=EPOCHS, shuffle=False, verbose=0))


def sample_weight(strategy: Any) -> dict[str, Any]:
    x, y = data()
    weights = np.linspace(0.1, 2.0, len(x)).astype("float32")
    fitted = regressor(strategy, weighted_metrics=["mae"])
    history = fitted.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    evaluated = fitted.evaluate(x, y, sample_weight=weights, batch_size=BATCH, verbose=0, return_dict=True)
    return _trained(fitted, history, evaluate=_lists(evaluated))


def class_weight(strategy: Any) -> dict[str, Any]:
    import keras

    x, _ = data()
    with strategy.scope():
        fitted = model(outputs=CLASSES, activation="softmax")
        fitted.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = fitted.fit(x, labels(x), class_weight={0: 1.0, 1: 3.0, 2: 0.5}, batch_size=BATCH, epochs=EPOCHS,
                         shuffle=False, verbose=0)
    return _trained(fitted, history)


def validation_data(strategy: Any) -> dict[str, Any]:
    return fit_numpy(strategy, validation_data=data(20, seed=2))  # 20 examples: a last validation batch of 4


def validation_split(strategy: Any) -> dict[str, Any]:
    return fit_numpy(strategy, validation_split=0.25)


def generator(strategy: Any) -> dict[str, Any]:
    """A Python generator of (x, y) batches of BATCH, endless, with ``steps_per_epoch``."""
    x, y = data()

    def batches() -> Any:
        while True:
            for start in range(0, len(x), BATCH):
                yield x[start:start + BATCH], y[start:start + BATCH]

    fitted = regressor(strategy)
    return _trained(fitted, fitted.fit(batches(), steps_per_epoch=len(x) // BATCH, epochs=EPOCHS, verbose=0))


def py_dataset(strategy: Any) -> dict[str, Any]:
    """A ``keras.utils.PyDataset`` of 4 batches, ``fit``, ``evaluate`` and ``predict``."""
    import keras

    x, y = data()

    class Batches(keras.utils.PyDataset):
        def __init__(self, with_targets: bool) -> None:
            super().__init__()
            self.with_targets = with_targets

        def __len__(self) -> int:
            return len(x) // BATCH

        def __getitem__(self, index: int) -> Any:
            rows = slice(index * BATCH, (index + 1) * BATCH)
            return (x[rows], y[rows]) if self.with_targets else x[rows]

    fitted = regressor(strategy)
    history = fitted.fit(Batches(True), epochs=EPOCHS, shuffle=False, verbose=0)
    return _trained(fitted, history, evaluate=_lists(fitted.evaluate(Batches(True), verbose=0, return_dict=True)),
                    predictions=fitted.predict(Batches(False), verbose=0))


def dict_inputs(strategy: Any) -> dict[str, Any]:
    """A two-input functional model fed a dict of NumPy arrays by name."""
    import keras

    x, y = data()
    with strategy.scope():
        left, right = keras.Input((2,), name="left"), keras.Input((2,), name="right")
        hidden = keras.layers.Dense(8, activation="tanh")(keras.layers.Concatenate()([left, right]))
        fitted = _set_initial_weights(keras.Model({"left": left, "right": right}, keras.layers.Dense(1)(hidden)))
        fitted.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    features = {"left": x[:, :2], "right": x[:, 2:]}
    history = fitted.fit(features, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return _trained(fitted, history, predictions=fitted.predict(features, batch_size=BATCH, verbose=0))


def string_lookup(strategy: Any) -> dict[str, Any]:
    """Strings in: a ``StringLookup`` (fixed vocabulary, one-hot) inside the model, then Dense, on ``tf.data``
    (Keras 3's NumPy adapter takes no string arrays, on one device either)."""
    import keras
    import tensorflow as tf

    words = np.array(["red", "green", "blue", "other"])
    x, y = data()
    strings = words[labels(x)].reshape(-1, 1)
    with strategy.scope():
        inputs = keras.Input((1,), dtype="string")
        coded = keras.layers.StringLookup(vocabulary=["red", "green", "blue"], output_mode="one_hot")(inputs)
        hidden = keras.layers.Dense(8, activation="tanh")(coded)
        fitted = _set_initial_weights(keras.Model(inputs, keras.layers.Dense(1)(hidden)))
        fitted.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    history = fitted.fit(tf.data.Dataset.from_tensor_slices((strings, y)).batch(BATCH), epochs=EPOCHS, verbose=0)
    return _trained(fitted, history,
                    predictions=fitted.predict(tf.data.Dataset.from_tensor_slices(strings).batch(BATCH), verbose=0))


def ragged(strategy: Any) -> dict[str, Any]:
    """Rows of 1 to 5 numbers as ``keras.Input(shape=(None,), ragged=True)``, averaged per row inside the model,
    from a ``tf.data`` of ragged rows batched by 16."""
    import keras
    import tensorflow as tf

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, size=64)
    values = rng.normal(size=int(lengths.sum())).astype("float32")
    rows = tf.RaggedTensor.from_row_lengths(values, lengths)
    targets = np.array([row.mean() for row in np.split(values, np.cumsum(lengths)[:-1])], "float32")[:, None] * 2 + 1

    class RowMean(keras.layers.Layer):
        def call(self, inputs: Any) -> Any:
            return tf.expand_dims(tf.reduce_mean(inputs, axis=1), -1)

    with strategy.scope():
        inputs = keras.Input(shape=(None,), ragged=True)
        hidden = keras.layers.Dense(8, activation="tanh")(RowMean()(inputs))
        fitted = _set_initial_weights(keras.Model(inputs, keras.layers.Dense(1)(hidden)))
        fitted.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = fitted.fit(tf.data.Dataset.from_tensor_slices((rows, targets)).batch(BATCH), epochs=EPOCHS, verbose=0)
    return _trained(fitted, history, predictions=fitted.predict(tf.data.Dataset.from_tensor_slices(rows).batch(BATCH),
                                                                verbose=0))


def _loop(strategy: Any, dataset: Any) -> dict[str, Any]:
    """The custom loop's step (TensorFlow's tutorial) over an already distributed dataset."""
    import keras
    import tensorflow as tf

    with strategy.scope():
        built = model()
        optimizer = keras.optimizers.SGD(0.1)
        loss_object = keras.losses.MeanSquaredError(reduction="none")

    def replica_step(features: Any, targets: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(targets, built(features, training=True)),
                                              global_batch_size=BATCH)
        optimizer.apply_gradients(zip(tape.gradient(loss, built.trainable_variables), built.trainable_variables))
        return loss

    @tf.function
    def step(batch: Any) -> Any:
        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    losses = [float(step(batch)) for _ in range(EPOCHS) for batch in dataset]
    return {"weights": built.get_weights(), "logs": {"loss": losses}, "steps": int(optimizer.iterations.numpy())}


def distribute_dataset_uneven(strategy: Any) -> dict[str, Any]:
    """``experimental_distribute_dataset`` of 50 examples by 16 (a last batch of 2, one per replica)."""
    import tensorflow as tf

    x, y = data(50)
    return _loop(strategy, strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)))


def datasets_from_function(strategy: Any) -> dict[str, Any]:
    """``distribute_datasets_from_function``: each input pipeline batches by the per-replica batch size
    (``InputContext.get_per_replica_batch_size(BATCH)``), shards by pipeline; the replicas take consecutive
    batches, so a step's global batch is the same 16 rows as one device's."""
    import tensorflow as tf

    x, y = data()

    def dataset_fn(context: Any) -> Any:
        rows = tf.data.Dataset.from_tensor_slices((x, y))
        rows = rows.shard(context.num_input_pipelines, context.input_pipeline_id)
        return rows.batch(context.get_per_replica_batch_size(BATCH))

    return _loop(strategy, strategy.distribute_datasets_from_function(dataset_fn))


# --------------------------------------------------------------------------- drivers: optimizers


def sgd(**options: Any) -> Callable[[], Any]:
    def make() -> Any:
        import keras

        return keras.optimizers.SGD(options.pop("learning_rate", 0.1), **options)

    return make


def schedule() -> Any:
    import keras

    return keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.7))


def fit_with(make_optimizer: Callable[[], Any]) -> Callable[[Any], dict[str, Any]]:
    return lambda strategy: fit_numpy(strategy, optimizer=make_optimizer)
