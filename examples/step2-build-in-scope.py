"""The how-to's step 2 in one call, then the audit catching the classic mistake.

    python examples/step2-build-in-scope.py
"""

import tempfile

import tfstrategy
from tfstrategy.errors import ScopeError

selection = tfstrategy.select(cpu_replicas=4)  # before anything else starts TensorFlow

import keras  # noqa: E402
import numpy as np  # noqa: E402


def build_model():
    inputs = keras.Input(shape=(4,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


x, y = np.ones((32, 4), "float32"), np.ones((32, 1), "float32")
with tempfile.TemporaryDirectory() as directory:
    # Train a little and save, as an earlier run would have.
    model, _ = tfstrategy.build_in_scope(selection, build_model, optimizer="adam", loss="mse", metrics=["mae"])
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    model.save_weights(f"{directory}/model.weights.h5")

    # Step 2: model, optimizer (slots built), metrics and restore, all in the scope, audited.
    model, report = tfstrategy.build_in_scope(
        selection, build_model, optimizer="adam", loss="mse", metrics=["mae"],
        checkpoint=f"{directory}/model.weights.h5",
    )
    print("\n".join(report.lines()))

# The mistake: an optimizer made outside the scope.
optimizer = keras.optimizers.Adam()
with selection.scope():
    model = build_model()
    model.compile(optimizer, "mse")
try:
    tfstrategy.require_scope(model, selection)
except ScopeError as error:
    print(f"ScopeError: {error}")
