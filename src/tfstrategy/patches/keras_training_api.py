"""What the patches of Keras' training API on 2+ replicas share (issue 44's equivalence matrix).

:mod:`~tfstrategy.patches.keras_predict_on_batch`, :mod:`~tfstrategy.patches.keras_compute_loss`,
:mod:`~tfstrategy.patches.keras_clipping` and :mod:`~tfstrategy.patches.keras_gradient_accumulation` replace
functions of ``keras.src`` (:func:`tfstrategy._compat.keras3_training_api_root`), and each probes by running
Keras' own code on a 2-replica ``MirroredStrategy`` of this host, so lazily, once a model first needs it. In a
multi-worker job no probe decides (a worker may have one device, and every worker must build the same step): up
to the verified release each fix acts there without one, as :mod:`~tfstrategy.patches.keras_uneven_batches` does.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat, _versions
from tfstrategy.patches.keras_uneven_batches import probe_devices
from tfstrategy.patches.mechanism import Patch, ProbeResult
from tfstrategy.selection.strategies import mirrored_strategy

if TYPE_CHECKING:
    from tfstrategy._protocols import Strategy


def probe_strategy() -> Any:
    """A 2-replica MirroredStrategy over two devices of this host, with collective keys of its own."""
    return mirrored_strategy(probe_devices())


class TrainingApiPatch(Patch):
    """A patch of ``keras.src``'s training API, probed the first time a model on 2+ replicas needs it."""

    verified_up_to = "3.15.1"
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_training_api_root()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        return self.probe_on(probe_strategy())

    def probe_on(self, strategy: Strategy) -> ProbeResult:
        """Run Keras' own code on ``strategy`` (2 replicas of this host); may raise (the mechanism catches)."""
        raise NotImplementedError

    def acts_on(self, strategy: Strategy) -> bool:
        """Whether the fix acts for a step on ``strategy`` (of 2+ replicas): the probe's answer, or, across
        workers, whether the installed Keras is not newer than the release the fix was verified against."""
        if _compat.in_multi_worker_mode(strategy):
            return not _versions.newer_than(_compat.keras_version(_compat.keras_for()), self.verified_up_to)
        return self.needed() is True
