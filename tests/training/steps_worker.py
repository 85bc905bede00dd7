"""One fresh process: 10 generator examples, global batch 4, 2 replicas, 2 epochs; print the optimizer steps."""

import sys

import tensorflow as tf

import tfstrategy

selection = tfstrategy.select(cpu_replicas=2, env={})
import keras  # noqa: E402
import numpy as np  # noqa: E402


def examples():
    for i in range(10):
        yield np.full((2,), i, "float32"), np.float32(i)


source = tf.data.Dataset.from_generator(
    examples, output_signature=(tf.TensorSpec((2,), tf.float32), tf.TensorSpec((), tf.float32))
)
data = tfstrategy.prepare_dataset(source, selection, global_batch=4)
with selection.scope():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.001)
if sys.argv[1] == "fit":
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(data, epochs=2, verbose=0)
else:
    step = tfstrategy.make_train_step(model, strategy=selection, global_batch=4,
                                      loss=keras.losses.MeanSquaredError(reduction="none"), optimizer=optimizer)
    distributed = selection.strategy.experimental_distribute_dataset(data)
    for _ in range(2):
        step.run_epoch(distributed)
print("optimizer_steps", int(optimizer.iterations.numpy()))
