"""One script per strategy kind, for "one job or a clear refusal" under `tfstrategy launch` and `run`.

``python one_job_script.py CASE OUT``: CASE picks what the script does before and when creating its
strategy; every case that trains prints ``final loss <value>`` and writes it to ``OUT/<pid>.txt``.
The data and the global batch are the same in every case, so a joined 2-worker job must report
the loss of the 1-process run.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

case = sys.argv[1]
GLOBAL_BATCH = 16
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = (x @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")).astype("float32")

if case == "ops_first":
    # A tutorial's preprocessing before the strategy: an op and an adapted TextVectorization.
    two = tf.constant(1) + 1
    vectorize = tf.keras.layers.TextVectorization(max_tokens=10, output_sequence_length=2)
    vectorize.adapt(tf.constant(["a b", "b c"]))
    print("preprocessed", int(two), vectorize(tf.constant(["a c"])).numpy().tolist(), flush=True)

if case in ("mirrored", "ops_first"):
    strategy = tf.distribute.MirroredStrategy()
elif case == "listed":
    strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
elif case == "gpu":
    strategy = tf.distribute.MirroredStrategy(devices=["device:GPU:0"])
elif case == "one_device":
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
elif case == "parameter_server":
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}), rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
elif case == "coordinator":
    tf.distribute.experimental.coordinator.ClusterCoordinator(strategy=None)
elif case == "tpu":
    strategy = tf.distribute.TPUStrategy()  # no TPU here: the refusal must come before TensorFlow looks for one
elif case == "default":
    strategy = tf.distribute.get_strategy()
elif case == "loop":  # a custom loop without any strategy
    w = tf.Variable(tf.zeros((4, 1)))
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - y) ** 2)
        w.assign_sub(0.05 * tape.gradient(loss, w))
    print(f"final loss {float(loss):.7f}", flush=True)
    raise SystemExit(0)
elif case == "child":  # a data-loader-like Python child inherits PYTHONPATH and TFSTRATEGY_HOOK
    import subprocess

    child = ("import tensorflow as tf\nfrom tfstrategy.state.registry import RUNTIME\n"
             "print('child hook steps', len(RUNTIME.hook.steps), tf.distribute.MirroredStrategy.__new__ is object.__new__)")
    print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout.strip())
    strategy = tf.distribute.MirroredStrategy()
else:
    raise SystemExit(f"unknown case {case}")

print("strategy", type(strategy).__name__, strategy.num_replicas_in_sync, flush=True)
tf.keras.utils.set_random_seed(1)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(tf.keras.optimizers.SGD(0.05), "mse")
history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3, verbose=0, shuffle=False)
print(f"final loss {history.history['loss'][-1]:.7f}", flush=True)
