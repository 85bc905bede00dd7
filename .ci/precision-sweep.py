"""Release sweep (issue 22): the multi-replica mixed-precision and step-count bugs on this TF/Keras pair.

Run in a venv of the pair with tfstrategy's source on the path, e.g.
``PYTHONPATH=src .venvs/tf216-k310/bin/python .ci/precision-sweep.py``; prints one ``SWEEP {json}``
line (CONTRIBUTING.md's "Mixed precision and step counts across releases" table).
"""

from __future__ import annotations

import json

from tfstrategy.selection.cpu_split import configure_cpu_replicas

configure_cpu_replicas(4)  # before TensorFlow starts

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfstrategy  # noqa: E402
from tfstrategy.diagnostics.equivalence import (  # noqa: E402
    initial_weights,
    max_difference,
    reference_model,
    replica_equivalence,
    synthetic_regression,
)
from tfstrategy.patches import apply_patches, keras_end_of_data, keras_loss_scale, remove_patches  # noqa: E402

_BASE = [0]


def strategy(replicas: int):
    # A fresh collective key range per strategy (see docs/reference/upstream-bugs.md#collective-keys).
    _BASE[0] += 1
    tf.distribute.MirroredStrategy._collective_key_base = 1000 * _BASE[0]
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def fit_float16(replicas: int, weights):
    """8 steps under mixed_float16 with Keras' default loss scale (compile wraps the optimizer)."""
    where = strategy(replicas)
    x, y = synthetic_regression(8 * 32)
    data = tfstrategy.prepare_dataset(tf.data.Dataset.from_tensor_slices((x, y)), where, global_batch=32)
    with where.scope():
        model = reference_model()
        model.set_weights(weights)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(data, epochs=1, verbose=0, shuffle=False)
    return model.get_weights(), history.history["loss"][-1]


def examples():
    for i in range(10):
        yield np.full((2,), i, "float32"), np.float32(i)


def optimizer_steps() -> int:
    """fit(epochs=2) on 10 generator examples in batches of 4, 2 replicas: 4 is right."""
    where = strategy(2)
    spec = (tf.TensorSpec((2,), tf.float32), tf.TensorSpec((), tf.float32))
    data = tf.data.Dataset.from_generator(examples, output_signature=spec).batch(4, drop_remainder=True)
    with where.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(data, epochs=2, verbose=0)
    return int(model.optimizer.iterations.numpy())


def main() -> None:
    out = {"tf": tf.__version__, "keras": keras.__version__,
           "probe_loss_scale_needed": keras_loss_scale.PATCH.needed(),
           "probe_end_of_data_needed": keras_end_of_data.PATCH.needed()}
    keras.mixed_precision.set_global_policy("mixed_float16")
    weights = initial_weights()
    remove_patches()
    reference, _ = fit_float16(1, weights)
    for replicas in (2, 4):
        trained, loss = fit_float16(replicas, weights)
        out[f"unpatched_fit16_{replicas}r_maxdiff"], out[f"unpatched_fit16_{replicas}r_loss"] = (
            max_difference(trained, reference), loss)
    apply_patches()
    for replicas in (2, 4):
        out[f"patched_fit16_{replicas}r_maxdiff"] = max_difference(fit_float16(replicas, weights)[0], reference)
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        keras.mixed_precision.set_global_policy(policy)
        report = replica_equivalence(strategy(4))
        out[f"equivalence_{policy}"] = {result.method: result.max_difference for result in report.results}
    keras.mixed_precision.set_global_policy("float32")
    remove_patches()
    out["unpatched_steps_x5"] = [optimizer_steps() for _ in range(5)]
    apply_patches()
    out["patched_steps_x5"] = [optimizer_steps() for _ in range(5)]
    print("SWEEP", json.dumps(out))


if __name__ == "__main__":
    main()
