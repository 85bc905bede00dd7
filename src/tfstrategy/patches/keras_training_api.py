"""What the patches of Keras' training API on 2+ replicas share (issue 44's equivalence matrix).

:mod:`~tfstrategy.patches.keras_predict_on_batch`, :mod:`~tfstrategy.patches.keras_compute_loss`,
:mod:`~tfstrategy.patches.keras_clipping` and :mod:`~tfstrategy.patches.keras_gradient_accumulation` replace
functions of ``keras.src`` (:func:`tfstrategy._compat.keras3_training_api_root`), and each probes by running
Keras' own code on a 2-replica ``MirroredStrategy`` of this host, so lazily, once a model first needs it.
"""

from __future__ import annotations

from typing import Any

from tfstrategy import _compat
from tfstrategy.patches.keras_uneven_batches import probe_devices
from tfstrategy.patches.mechanism import Patch
from tfstrategy.selection.strategies import mirrored_strategy


def probe_strategy() -> Any:
    """A 2-replica MirroredStrategy over two devices of this host, with collective keys of its own."""
    return mirrored_strategy(probe_devices())


class TrainingApiPatch(Patch):
    """A patch of ``keras.src``'s training API, probed the first time a model on 2+ replicas needs it."""

    verified_up_to = "3.15.1"
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_training_api_root()
