"""``tf.keras.optimizers.legacy.SGD``/``Adam`` under Keras 3 take the legacy optimizers' step, on 2 replicas.

The shape of tensorflow/tensorflow#72686 (TensorFlow's distributed custom-training tutorial with a legacy
optimizer): model and ``tf.keras.optimizers.legacy.*`` created in ``strategy.scope()``, a per-replica step
with ``tf.nn.compute_average_loss`` and ``apply_gradients`` through ``strategy.run`` in a ``tf.function``.
The one-device answer applies each step with the TensorFlow kernel the legacy optimizer ran
(``ResourceApplyKerasMomentum``, ``ResourceApplyAdam``).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.patches import keras_legacy_optimizers as legacy

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or legacy.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow: tf_keras has its legacy optimizers",
    ),
]

GLOBAL_BATCH = 8
STEPS = 3


def _model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])


def _batches():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * GLOBAL_BATCH, 4)).astype("float32")
    y = rng.normal(size=(STEPS * GLOBAL_BATCH, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def _tutorial_loop(strategy, make_optimizer):
    with strategy.scope():
        model = _model()
        optimizer = make_optimizer()
        loss_object = keras.losses.MeanSquaredError(reduction="none")

    def train_step(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)), global_batch_size=GLOBAL_BATCH)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    @tf.function
    def distributed_train_step(inputs):
        strategy.run(train_step, args=(inputs,))

    for batch in strategy.experimental_distribute_dataset(_batches()):
        distributed_train_step(batch)
    return model.get_weights()


def _legacy_kernels(name: str, **hyper):
    """One device, each step applied by the kernel tf.keras' legacy optimizer called."""
    model = _model()
    variables = [tf.Variable(w) for w in model.get_weights()]
    model.set_weights([v.numpy() for v in variables])
    first = [tf.Variable(tf.zeros_like(v)) for v in variables]
    second = [tf.Variable(tf.zeros_like(v)) for v in variables]
    loss_object = keras.losses.MeanSquaredError()
    for step, (x, y) in enumerate(_batches(), start=1):
        model.set_weights([v.numpy() for v in variables])
        with tf.GradientTape() as tape:
            loss = loss_object(y, model(x, training=True))
        for var, m, v, grad in zip(variables, first, second, tape.gradient(loss, model.trainable_variables)):
            if name == "SGD":
                tf.raw_ops.ResourceApplyKerasMomentum(var=var.handle, accum=m.handle, lr=hyper["learning_rate"], grad=grad,
                                                      momentum=hyper["momentum"], use_nesterov=hyper["nesterov"])
            else:
                tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle, beta1_power=0.9 ** step,
                                             beta2_power=0.999 ** step, lr=hyper["learning_rate"], beta1=0.9, beta2=0.999,
                                             epsilon=1e-7, grad=grad)
    return [v.numpy() for v in variables]


def _difference(left, right) -> float:
    return max(float(np.max(np.abs(a - b))) for a, b in zip(left, right))


@pytest.mark.parametrize(("name", "hyper"), [
    pytest.param("SGD", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}, id="sgd-nesterov"),
    pytest.param("Adam", {"learning_rate": 0.05}, id="adam"),
])
def test_legacy_optimizer_on_two_replicas_takes_the_legacy_step(name, hyper):
    strategy = tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches
    with pytest.warns(UserWarning, match=rf"tf.keras.optimizers.legacy.{name} does not exist in Keras 3 .*#72686.*"
                                         rf"keras.optimizers.{name}\(learning_rate="):
        trained = _tutorial_loop(strategy, lambda: getattr(tf.keras.optimizers.legacy, name)(**hyper))
    reference = _legacy_kernels(name, **hyper)
    assert _difference(trained, reference) <= 1e-5
    assert _difference(reference, _model().get_weights()) > 1e-2  # it trained


def test_legacy_arguments_map_to_keras3_ones():
    legacy.PATCH.apply()
    from tensorflow.keras.optimizers.legacy import SGD  # the module tensorflow.keras loads of its own

    with pytest.warns(UserWarning, match=r"lr= as learning_rate=; decay=0.5 as InverseTimeDecay\(0.2"):
        optimizer = SGD(lr=0.2, decay=0.5, clipnorm=1.0)
    assert isinstance(optimizer, keras.optimizers.SGD) and optimizer.clipnorm == 1.0
    assert float(optimizer.learning_rate) == pytest.approx(0.2)  # iterations 0: lr / (1 + 0.5 * 0)
    with pytest.raises(TypeError, match="Keras 3's SGD does not take: foo"):
        SGD(0.1, foo=1)


def test_upstream_keras_still_refuses_legacy_optimizers():
    """Fails once Keras' own keras.optimizers.legacy.SGD/Adam work again: drop keras_legacy_optimizers."""
    found = legacy.LegacyOptimizersPatch().probe()
    assert found is not None and found["keras.SGD"] and found["keras.Adam"]
