"""Replica equivalence: does training on N replicas give the answer of 1 replica?

Synchronous data parallelism is meant to be invisible: N replicas each taking
``global_batch / N`` examples and summing gradients must update the weights
exactly as one replica taking the whole global batch (up to float rounding).
:func:`replica_equivalence` checks that on this host: it trains the same small
model from the same initial weights on the same data for a few steps, once on
one replica and once on the strategy's N replicas, and reports the largest
weight difference for Keras ``fit`` (``steps_per_execution`` 1 and more) and
for :func:`~tfstrategy.make_train_step`.

A check that always passes proves nothing, so it also trains a *planted* bug,
the classic custom-loop mistake of averaging the loss over each replica's own
batch, and expects that one to differ. ``tfstrategy check --equivalence`` runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tfstrategy._tf import tf
from tfstrategy.errors import StrategyError
from tfstrategy.patches.keras_steps_per_execution import fix_steps_per_execution
from tfstrategy.training.batching import plan_batch, replicas_of
from tfstrategy.training.custom_loop import make_train_step
from tfstrategy.training.datasets import prepare_dataset
from tfstrategy.training.precision import computes_in, global_policy, loss_scale_optimizer

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Optimizer, Strategy

__all__ = ["EquivalenceReport", "replica_equivalence", "add_equivalence"]

#: Largest weight difference still counted as "the same answer" (float32 sums
#: in a different order differ by ~1e-7 per step).
DEFAULT_TOLERANCE = 1e-5
#: The same, per Keras global policy (what ``--precision`` sets). Measured on
#: TF 2.21 / Keras 3.15.1, 8 steps, 2 and 4 CPU replicas against 1 (largest
#: difference seen): float32 1.8e-7, mixed_float16 1.0e-4, mixed_bfloat16 6.1e-4. Half
#: precision rounds each replica's partial sums; the planted bug still differs by > 0.1.
TOLERANCES = {"float32": DEFAULT_TOLERANCE, "mixed_float16": 1e-3, "mixed_bfloat16": 5e-3}
#: Dynamic loss scaling skips a step whose float16 gradients overflow. One replica
#: sums the whole global batch, N replicas a share each, so at Keras' initial
#: scale (2**15) the equivalence model overflows on 1 and 2 replicas but not on 4:
#: a skipped step, not a distribution bug. The check starts lower, where none overflow.
EQUIVALENCE_LOSS_SCALE = 2.0**8
FEATURES = 4
METHODS = ("fit", "loop", "planted")


def synthetic_regression(examples: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed linear-plus-noise regression problem: ``(x, y)`` as float32 arrays."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(examples, FEATURES)).astype("float32")
    true_weights = np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
    y = (x @ true_weights + 0.1 * rng.normal(size=(examples, 1))).astype("float32")
    return x, y


def reference_model() -> Any:
    """The small regression model every equivalence run trains (4 -> 8 tanh with L2 -> 1)."""
    keras = tf().keras
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            # The L2 penalty makes the check cover regularisation scaling too.
            keras.layers.Dense(8, activation="tanh", kernel_regularizer=keras.regularizers.L2(1e-3)),
            # float32 under any policy: the loss must not receive float16 outputs (the audit's rule).
            keras.layers.Dense(1, dtype="float32"),
        ]
    )


def initial_weights(seed: int = 0) -> list[np.ndarray]:
    """The starting weights every run shares, from a seeded build."""
    tf().keras.utils.set_random_seed(seed)
    return list(reference_model().get_weights())


def _optimizer() -> Any:
    return tf().keras.optimizers.SGD(learning_rate=0.05)


def _planted_per_replica_mean_step(model: Model, strategy: Strategy, optimizer: Optimizer) -> Any:
    """The bug the check must catch: each replica averages over its own batch."""
    tf_ = tf()

    def replica_step(features: Any, labels: Any) -> None:
        with tf_.GradientTape() as tape:
            predictions = model(features, training=True)
            # Wrong under N replicas: the optimizer sums N per-replica means.
            loss = tf_.reduce_mean(tf_.square(labels - tf_.cast(predictions, labels.dtype)))
            loss += tf_.cast(tf_.add_n(model.losses), loss.dtype)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    def run_step(batch: Any) -> None:
        strategy.run(replica_step, args=batch)

    step: Any = tf_.function(run_step)

    return step


def train_weights(
    strategy: Strategy,
    method: str,
    weights: list[np.ndarray],
    *,
    global_batch: int,
    steps: int,
    steps_per_execution: int = 1,
    seed: int = 0,
) -> list[np.ndarray]:
    """Train ``steps`` steps from ``weights`` with ``method`` and return the new weights.

    Args:
        strategy: where to train.
        method: ``fit`` (Keras, with the steps_per_execution fix), ``loop``
            (:func:`make_train_step`) or ``planted`` (the per-replica-mean bug).
        weights: initial weights, from :func:`initial_weights`.
        global_batch: examples per step across all replicas.
        steps: steps to train (one pass over ``steps * global_batch`` examples).
        steps_per_execution: for ``fit``.
        seed: the data's seed.
    """
    if method not in METHODS:
        raise StrategyError(f"Received method={method!r}; expected one of {', '.join(METHODS)}.")
    x, y = synthetic_regression(steps * global_batch, seed=seed)
    source = tf().data.Dataset.from_tensor_slices((x, y))
    dataset = prepare_dataset(source, strategy, global_batch=global_batch)
    with strategy.scope():
        model = reference_model()
        model.set_weights(weights)
        optimizer = _optimizer()
        if method != "planted" and computes_in(model, "float16"):
            optimizer = loss_scale_optimizer(optimizer, initial_scale=EQUIVALENCE_LOSS_SCALE)
        if method == "fit":
            model.compile(optimizer=optimizer, loss="mse", steps_per_execution=steps_per_execution)
    if method == "fit":
        fix_steps_per_execution(model)
        model.fit(dataset, epochs=1, shuffle=False, verbose=0)
        return list(model.get_weights())
    distributed = strategy.experimental_distribute_dataset(dataset)
    if method == "loop":
        # "none" means per-example losses in Keras 3 and tf_keras alike (tf_keras refuses None).
        loss = tf().keras.losses.MeanSquaredError(reduction="none")
        make_train_step(model, strategy=strategy, global_batch=global_batch, loss=loss, optimizer=optimizer).run_epoch(distributed)
    else:
        step = _planted_per_replica_mean_step(model, strategy, optimizer)
        for batch in distributed:
            step(batch)
    return list(model.get_weights())


def max_difference(first: list[np.ndarray], second: list[np.ndarray]) -> float:
    """The largest absolute difference between two lists of weights."""
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second, strict=True))


@dataclass(frozen=True, kw_only=True)
class EquivalenceResult:
    """One method trained on N replicas, compared with one replica."""

    method: str
    replicas: int
    max_difference: float
    tolerance: float
    expect_equal: bool = True

    @property
    def equal(self) -> bool:
        return self.max_difference <= self.tolerance

    @property
    def passed(self) -> bool:
        """Equal when it should be; for the planted bug, different."""
        return self.equal == self.expect_equal

    @property
    def key(self) -> str:
        return f"equivalence_{self.method}"

    def line(self) -> str:
        verdict = "equal" if self.equal else "DIFFERENT"
        if not self.passed:
            expected = f" (expected {'equal' if self.expect_equal else 'different'})"
        else:
            expected = "" if self.expect_equal else " (the planted bug is caught)"
        return f"{self.key} {verdict} max_weight_difference={self.max_difference:.1e}{expected}"


@dataclass
class EquivalenceReport:
    """Every method's result and what it was compared against."""

    replicas: int
    reference_device: str
    global_batch: int
    steps: int
    policy: str = "float32"
    tolerance: float = DEFAULT_TOLERANCE
    results: list[EquivalenceResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.results)

    def lines(self) -> list[str]:
        header = (
            f"equivalence {self.replicas} replicas vs 1 on {self.reference_device}, "
            f"{self.steps} steps of global batch {self.global_batch}"
        )
        if self.policy != "float32":
            header += f", policy {self.policy} (tolerance {self.tolerance:.0e})"
        return [header] + [result.line() for result in self.results]


def replica_equivalence(
    strategy: Strategy,
    *,
    steps: int = 8,
    global_batch: int | None = None,
    steps_per_execution: int = 8,
    tolerance: float | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> EquivalenceReport:
    """Train on 1 replica and on ``strategy``'s N replicas; compare the weights.

    Runs ``fit`` (``steps_per_execution`` 1 and ``steps_per_execution``),
    :func:`make_train_step`, and the planted per-replica-mean bug, which must
    come out different when N > 1.

    Args:
        strategy: a single-host strategy (or :class:`~tfstrategy.Selection`);
            the reference replica is its first device.
        steps: training steps per run.
        global_batch: defaults to 8 examples per replica.
        steps_per_execution: the ``fit`` setting checked besides 1.
        tolerance: largest weight difference counted as equal; by default
            :data:`TOLERANCES` of the Keras global policy in effect (the
            check trains under it: ``select(precision=...)``, ``--precision``).
        seed: for the initial weights and the data.
        progress: called with a short message before each training run
            (the CLI prints them to stderr: the check takes tens of seconds).

    Raises:
        StrategyError: a multi-worker strategy (run it per worker instead).

    Example:
        >>> report = replica_equivalence(tfstrategy.select(cpu_replicas=4))
        >>> report.passed
        True
    """
    strategy = getattr(strategy, "strategy", strategy)
    if isinstance(strategy, tf().distribute.MultiWorkerMirroredStrategy):
        raise StrategyError(
            "Received a MultiWorkerMirroredStrategy; the equivalence check compares replicas inside one process. "
            "Run it with --cpu-replicas N or on a multi-GPU host's MirroredStrategy."
        )
    replicas = replicas_of(strategy)
    policy = global_policy()
    if tolerance is None:
        tolerance = TOLERANCES.get(policy, TOLERANCES["mixed_float16"] if "16" in policy else DEFAULT_TOLERANCE)
    plan = plan_batch(replicas, global_batch=global_batch or 8 * replicas)
    first_device = strategy.extended.worker_devices[0]
    reference = tf().distribute.MirroredStrategy([first_device])
    weights = initial_weights(seed)
    common = {"global_batch": plan.global_batch, "steps": steps, "seed": seed}

    say = progress or (lambda message: None)
    total = 6
    say(f"[1/{total}] fit on 1 replica (reference)")
    fit_reference = train_weights(reference, "fit", weights, **common)
    say(f"[2/{total}] custom loop on 1 replica (reference)")
    loop_reference = train_weights(reference, "loop", weights, **common)
    report = EquivalenceReport(
        replicas=replicas, reference_device=first_device.rsplit("device:", 1)[-1], global_batch=plan.global_batch,
        steps=steps, policy=policy, tolerance=tolerance,
    )
    runs = [("fit", "fit", 1, fit_reference), ("fit", f"fit_spe{steps_per_execution}", steps_per_execution, fit_reference)]
    runs += [("loop", "loop", 1, loop_reference), ("planted", "planted_per_replica_mean", 1, loop_reference)]
    for number, (method, name, spe, expected) in enumerate(runs, start=3):
        say(f"[{number}/{total}] {name} on {replicas} replicas")
        trained = train_weights(strategy, method, weights, steps_per_execution=spe, **common)
        report.results.append(
            EquivalenceResult(
                method=name,
                replicas=replicas,
                max_difference=max_difference(trained, expected),
                tolerance=tolerance,
                # On one replica the planted bug is harmless, so it must match there.
                expect_equal=method != "planted" or replicas == 1,
            )
        )
    return report


def add_equivalence(report: Any, selection: Any, **options: Any) -> EquivalenceReport:
    """Run :func:`replica_equivalence` and append its lines to a check report."""
    equivalence = replica_equivalence(selection, **options)
    header = {"replicas": equivalence.replicas, "reference_device": equivalence.reference_device,
              "steps": equivalence.steps, "global_batch": equivalence.global_batch, "policy": equivalence.policy,
              "tolerance": equivalence.tolerance}
    report.add("equivalence", header, text=equivalence.lines()[0].removeprefix("equivalence "))
    for result in equivalence.results:
        verdict = {"equal": result.equal, "expected_equal": result.expect_equal,
                   "max_weight_difference": result.max_difference, "passed": result.passed}
        report.add(result.key, verdict, result.passed, text=result.line().removeprefix(f"{result.key} "))
    if equivalence.replicas == 1:
        report.add("equivalence_note", "1 replica compares with itself; pass --cpu-replicas 4 to rehearse 4")
    return equivalence
