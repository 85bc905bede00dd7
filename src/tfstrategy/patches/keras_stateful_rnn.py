"""Refuse a stateful RNN on 2+ replicas in one line, before its first step, instead of a traceback or a wrong state.

The bug (TensorFlow 2.21, Keras 3.15.1; keras-team/keras#21183 and #21742 are the batch-size check it meets):
``LSTM(stateful=True)`` (any Keras RNN with ``stateful=True``) on ``Input(batch_size=16)``, ``fit`` on batches of
16 under a MirroredStrategy of 2 replicas, fails at the first step: "If an RNN is stateful, the batch size of
the input sequences must be the same as the batch size of the initial state. Expected batch size: 16,
Received batch size: 8". Declaring the per-replica batch instead (``Input(batch_size=8)``) runs without an
error and is worse: both replicas write their final states into the one state variable, so the next batch
starts every row from one replica's rows (measured: no error, state rows of replica 0 or 1).

Root cause. A stateful RNN keeps one state row per row of its fixed batch, in variables ``build`` makes from
the ``Input``'s batch size, and carries row ``i`` of batch ``k`` into row ``i`` of batch ``k + 1``. Under a
strategy each replica calls the layer on its own part of the global batch; the state would have to be split
the same way, row for row, in every call, and Keras has no such per-replica state. No correct fix fits in
a patch (the state of a replica's rows would have to live on that replica and follow the data sharding).

The refusal. ``RNN.call`` of a stateful RNN under a strategy of 2+ replicas in sync raises a ``TrainingError``
saying what to write instead, on evidence of a replica's part: in a replica context (where the step is traced,
so before its first step runs), or outside the replicas on a batch of another size than the state's (Keras'
symbolic build of the model, from one replica's part of the first batch, which ``fit`` runs first). A
stateless RNN, any RNN on one device, and a stateful one called on its whole batch in the strategy's scope
run Keras' own code.

The probe. Keras' own ``RNN.call`` of a stateful ``SimpleRNN`` on ``Input(batch_size=2)``, called in a
2-replica ``strategy.run`` on each replica's one row, raises its batch-size ``ValueError``. The upstream canary
``test_upstream_keras_still_fails_a_stateful_rnn_on_two_replicas`` fails once that call works.
"""

from __future__ import annotations

import functools
from typing import Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.patches.keras_training_api import TrainingApiPatch
from tfstrategy.patches.mechanism import ProbeResult

TARGET = "layers.rnn.rnn.RNN.call"


def refusal(layer: Any, replicas: int) -> TrainingError:
    return TrainingError(
        f"Received {type(layer).__name__}(stateful=True) ({layer.name!r}) called on {replicas} replicas; a stateful "
        "RNN carries one state row per row of its fixed batch, and each replica runs its own part of the batch, "
        "which Keras' one state cannot follow (Keras raises a batch-size error, or carries one replica's rows into "
        "every replica's). Train this model on one device, or make the RNN stateless and carry the state yourself "
        "(stateful=False, return_state=True, initial_state= the previous batch's states).")


class StatefulRnnPatch(TrainingApiPatch):
    """``RNN.call`` of a stateful RNN in a replica context of 2+ replicas is refused in one line."""

    name = "keras_stateful_rnn"
    change_text = "a stateful RNN on 2+ replicas is refused in one line before its first step (Keras: a traceback)"
    upstream = ("keras-team/keras#21183 (a stateful RNN called with another batch size); no report of it under a "
                "distribution strategy found")
    targets = (TARGET,)

    def probe_on(self, strategy: Any) -> ProbeResult:
        import keras
        import numpy as np

        call = self.original(TARGET)
        with strategy.scope():
            layer = keras.layers.SimpleRNN(1, stateful=True)
            layer.build((2, 2, 1))  # a state of 2 rows: the global batch; each replica gets 1 row

        step = tf().function(lambda: strategy.run(lambda: call(layer, tf().constant(np.ones((1, 2, 1), "float32")))))
        try:
            step()
        except ValueError:
            return ProbeResult({TARGET: True})
        return ProbeResult({TARGET: False})

    def replacement(self, target: str, original: Any) -> Any:
        @functools.wraps(original)
        def call(layer: Any, sequences: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(layer, "stateful", False):
                strategy = tf().distribute.get_strategy()
                replicas = strategy.num_replicas_in_sync
                if replicas > 1 and (_in_a_replica(strategy) or _a_replicas_part(layer, sequences)) \
                        and PATCH.acts_on(strategy):
                    PATCH.acted()
                    raise _compat.keep_keras_error_message(refusal(layer, replicas))
            return original(layer, sequences, *args, **kwargs)

        return call


def _in_a_replica(strategy: Any) -> bool:
    context = tf().distribute.get_replica_context()
    return context is not None and context.strategy is strategy


def _a_replicas_part(layer: Any, sequences: Any) -> bool:
    """Whether a call outside the replicas (Keras' symbolic build of a distributed model) gets a batch of another
    size than the state's: the evidence that it was handed one replica's part. A call on the whole batch (the
    user's own, in the scope) is Keras' to run."""
    states = layer.states if isinstance(layer.states, (list, tuple)) else [layer.states]
    state_rows = getattr(states[0], "shape", (None,))[0] if states and states[0] is not None else None
    rows = getattr(sequences, "shape", (None,))[0]
    return state_rows is not None and rows is not None and int(rows) != int(state_rows)


PATCH = StatefulRnnPatch()
