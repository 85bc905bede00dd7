"""Make Keras 3's random layers draw different numbers on each replica, as one device does for each example.

The bug (TensorFlow 2.21, Keras 3.15.1; no public report found): under a MirroredStrategy of 2 replicas,
``Dropout``, ``GaussianNoise`` and any layer drawing from ``keras.random`` with a ``SeedGenerator`` give every
replica the same random numbers: on a global batch of 16, examples 8-15 (replica 1's) get exactly the masks
of examples 0-7 (replica 0's). No error. One device draws all 16 independently, so on 2 replicas half of
the batch's noise is a copy (on N replicas, N copies): Dropout regularizes less than the user asked for.

Root cause. Keras' TensorFlow backend draws with stateless ops (``tf.random.stateless_*``) whose seed
``draw_seed`` takes from the layer's ``SeedGenerator``: its state is one variable, mirrored, the same on
every replica, and each replica asks for a part of the batch of the same shape. Same seed, same shape, same
numbers. Unseeded calls (``seed=None``, the global generator) and integer seeds are the same.

The fix. In the replica context of a strategy of 2+ replicas in sync (decided where ``draw_seed`` runs, at
trace time), the seed's first word is offset by the replica's id in its sync group (its global id, so
workers differ too), so each replica draws its own numbers; the generator's state, and so every later
seed, stays the same on every replica. One device (the default strategy, or any strategy of 1 replica),
and any draw outside a replica context (weight initializers run in the cross-replica context), keep
Keras' seed unchanged: their numbers are Keras' own, bit for bit. Replica 0's numbers are Keras' own too.

What it cannot give: one device's numbers. A random layer on 2 replicas draws other numbers than one
device on the same batch (each replica draws its part's shape); what matches is the documented behaviour,
independent draws per example. A layer that draws one number per batch (a random contrast factor for
the whole batch) draws one per replica's part: as a per-example layer on one device would.

The probe. Keras' own ``draw_seed`` of a ``SeedGenerator`` made in the scope of a 2-replica
``MirroredStrategy`` over two devices of this host, inside ``strategy.run``: the bug gives both replicas
the same seed. It runs TensorFlow ops, so it waits until a random op first runs on 2+ replicas. The
upstream canary ``test_upstream_keras_still_draws_the_same_seed_on_every_replica`` fails once Keras draws
a seed per replica.
"""

from __future__ import annotations

import functools
from typing import Any

from tfstrategy._tf import tf
from tfstrategy.patches.keras_training_api import TrainingApiPatch
from tfstrategy.patches.mechanism import ProbeResult

RANDOM = "backend.tensorflow.random.draw_seed"
IMAGE = "backend.tensorflow.image.draw_seed"  # elastic_transform's per-image displacements

#: The offset of the seed's first word per replica: a prime, so replicas' seeds never meet another
#: generator's seed a small step away.
STRIDE = 1_000_003


def replica_seed(seed: Any, replica: Any) -> Any:
    """``seed`` (Keras' ``[seed, counter]``) with its first word offset by ``replica`` times ``STRIDE``."""
    tf_ = tf()
    seed = tf_.convert_to_tensor(seed)
    offset = tf_.cast(replica, seed.dtype) * tf_.constant(STRIDE, seed.dtype)
    return seed + tf_.stack([offset, tf_.zeros_like(offset)])


class ReplicaSeedsPatch(TrainingApiPatch):
    """``draw_seed`` in a replica context of 2+ replicas gives each replica a seed of its own."""

    name = "keras_replica_seeds"
    change_text = ("random layers (Dropout, noise, keras.random with a SeedGenerator) draw different numbers on each "
                   "replica, as one device does for each example, not the same numbers on every replica")
    upstream = "no public report found: Keras 3 random ops draw the same numbers on every replica of a strategy"
    targets = (RANDOM, IMAGE)

    def probe_on(self, strategy: Any) -> ProbeResult:
        import keras
        import numpy as np

        draw = self.original(RANDOM)
        with strategy.scope():
            generator = keras.random.SeedGenerator(7)

        seeds = tf().function(lambda: strategy.run(lambda: draw(generator)))
        parts = [np.asarray(part) for part in strategy.experimental_local_results(seeds())]
        if len(parts) != 2:
            raise RuntimeError(f"the probe's strategy has {len(parts)} replicas, expected 2")
        same = bool(np.array_equal(parts[0], parts[1]))
        return ProbeResult({target: same for target in self.targets})

    def replacement(self, target: str, original: Any) -> Any:
        @functools.wraps(original)
        def draw_seed(seed: Any) -> Any:
            drawn = original(seed)
            context = tf().distribute.get_replica_context()
            if context is None or context.num_replicas_in_sync < 2 or not PATCH.acts_on(context.strategy):
                return drawn
            PATCH.acted()
            return replica_seed(drawn, context.replica_id_in_sync_group)

        return draw_seed


PATCH = ReplicaSeedsPatch()
