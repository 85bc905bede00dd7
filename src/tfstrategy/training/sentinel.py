"""The divergence sentinel: do all replicas and workers still hold the same model?

Synchronous training keeps one model in N copies; nothing in TensorFlow checks
that the copies stay equal. A restart that restored different steps on
different workers, a variable made outside the scope (one copy per replica,
never synchronised), a NaN on one replica: training goes on, and the job's
result is whichever copy the chief saves. :class:`Sentinel` checks, at a chosen
interval, that every replica's weights have the same checksum and that they
and the loss are finite; the first time they are not, it raises
:class:`~tfstrategy.errors.DivergenceError` naming the step and the first
replica (and worker) that differs.

How: each replica sums its own copy of every weight (in float64) in
``strategy.run``, and one ``all_gather`` of those scalars gives every replica on
every worker all N checksums, so all of them reach the same verdict (spread =
max - min, the first replica whose sum differs from replica 0's) and stop at the
same step. (``ReplicaContext.all_reduce`` has no MIN or MAX.) That is one pass
over the weights and N scalars on the network per check: at the default interval (each epoch's end)
well under 1% of the training time (``benchmarks/sentinel_cost.py``).

Use :func:`divergence_sentinel` as a Keras callback, or ``make_train_step(...,
sentinel=True)`` for a custom loop; ``tfstrategy launch`` adds it to every
``fit`` (``--sentinel``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import DivergenceError, TrainingError
from tfstrategy.settings import ENV_SENTINEL, SENTINEL, received, resolve_setting, setting_name
from tfstrategy.state.registry import RUNTIME, Attachments

if TYPE_CHECKING:
    from tfstrategy._protocols import Logs, Model, Strategy

__all__ = ["Sentinel", "divergence_sentinel", "parse_sentinel", "resolve_sentinel"]

#: Relative checksum difference still counted as equal (copies are normally bit-identical).
RTOL = 1e-6


def parse_sentinel(value: object, *, name: str = "sentinel") -> int | str | None:
    """``"epoch"`` (each epoch's end), a step interval ``N``, or ``None`` for ``off``.

    Raises:
        TrainingError: anything else.
    """
    if isinstance(value, bool):
        return "epoch" if value else None
    text = str(value).strip().lower()
    if text in ("epoch", "on"):
        return "epoch"
    if text in ("off", "none", "0"):
        return None
    if text.isdigit() and len(text) < 10:
        return int(text)
    raise TrainingError(
        f"Received {received(name, value)}; expected 'epoch' (check at each epoch's end), a step interval such as 100, "
        "or 'off'."
    )


def resolve_sentinel(argument: object = None, env: Mapping[str, str] | None = None, default: str = "off") -> int | str | None:
    """The interval by argument > ``TFSTRATEGY_SENTINEL`` > ``default``.

    Raises:
        TrainingError: not an interval.
        SettingsConflictError: code and environment both set it and differ.
    """
    setting = resolve_setting("sentinel", argument, ENV_SENTINEL, default, env,
                              normalise=lambda v, n: str(parse_sentinel(v, name=n)))
    return parse_sentinel(setting.value, name=setting_name("sentinel", setting, ENV_SENTINEL))


def sentinel_environment(value: object) -> dict[str, str]:
    """``{TFSTRATEGY_SENTINEL: ...}`` for ``tfstrategy launch --sentinel`` (validated).

    Raises:
        TrainingError: not an interval.
    """
    parsed = parse_sentinel(value, name="--sentinel")
    return SENTINEL.to_environ("off" if parsed is None else str(parsed))


class Sentinel:
    """Checks that every replica of ``strategy`` holds the same ``variables``, all finite.

    Args:
        strategy: the strategy (or :class:`~tfstrategy.Selection`) the model trains under.
        variables: the weights to compare (e.g. ``model.weights``).
        rtol: relative checksum difference still counted as equal.
    """

    def __init__(self, strategy: Strategy, variables: Any, *, rtol: float = RTOL) -> None:
        self.strategy = getattr(strategy, "strategy", strategy)
        self.variables = [_compat.tf_variable(variable) for variable in variables]
        if not self.variables:
            raise TrainingError("Received no variables to watch; expected a built model's weights.")
        self.rtol = rtol
        self.checks = 0
        #: The step of the last check that found every replica equal and finite.
        self.last_equal_step: int | None = None
        self._function = tf().function(self._distributed_check, autograph=False)

    def _replica_check(self) -> object:
        tf_ = tf()
        context = tf_.distribute.get_replica_context()
        # Each replica reads its own copy in replica context.
        total = tf_.add_n([tf_.reduce_sum(tf_.cast(variable, tf_.float64)) for variable in self.variables])
        # One collective: every replica (on every worker) gets every replica's checksum.
        return context.all_gather(tf_.reshape(total, [1]), axis=0)

    def _distributed_check(self) -> object:
        values = self.strategy.run(self._replica_check)
        return self.strategy.experimental_local_results(values)[0]

    def check(self, step: int | None = None, loss: float | None = None) -> None:
        """Compare the replicas now (a collective: every worker must call it at the same point).

        Args:
            step: the step to name in the error (e.g. ``optimizer.iterations``).
            loss: the step's (reduced) loss, checked for finiteness.

        Raises:
            DivergenceError: replicas differ, or weights or loss are not finite.
        """
        totals = [float(value) for value in self._function().numpy()]
        self.checks += 1
        reference, low, high = totals[0], min(totals), max(totals)
        tolerance = self.rtol * max(1.0, abs(reference)) if math.isfinite(reference) else 0.0
        differing = [i for i, total in enumerate(totals)
                     if not math.isfinite(total) or abs(total - reference) > tolerance]
        first = differing[0] if differing else None
        first_total = totals[first] if first is not None else reference
        at = f"at step {step}" if step is not None else "at this check"
        replicas = int(self.strategy.num_replicas_in_sync)
        since = f" (they were equal at step {self.last_equal_step}, the previous check)" if self.last_equal_step is not None else ""
        if first is not None:
            where = self._where(first)
            if not math.isfinite(first_total):
                raise DivergenceError(
                    f"Received non-finite weights {at} on {where} (checksum {first_total}); expected finite weights "
                    f"on all {replicas} replicas. Training diverged: lower the learning rate, clip gradients, or with "
                    "mixed_float16 use a LossScaleOptimizer (tfstrategy's keras_loss_scale patch fixes Keras' own)."
                )
            raise DivergenceError(
                f"Received different weights {at}: {where} has checksum {first_total!r}, replica 0 {reference!r} "
                f"(spread {high - low:.3g} over {replicas} replicas); expected every replica to hold the same model{since}. "
                "A variable made outside the strategy's scope, a restart that restored different steps on different "
                "workers, or a replica that skipped an update makes copies drift: stop and restart from one checkpoint."
            )
        if loss is not None and not math.isfinite(float(loss)):
            raise DivergenceError(
                f"Received loss {float(loss)} {at}; expected a finite loss (the loss is reduced over all {replicas} "
                "replicas, so one replica's NaN makes it NaN). Lower the learning rate, clip gradients, or check "
                "the data of that step."
            )
        self.last_equal_step = step

    def _where(self, replica: int) -> str:
        per_worker = max(1, len(self.strategy.extended.worker_devices))
        if int(self.strategy.num_replicas_in_sync) <= per_worker:
            return f"replica {replica}"
        return f"replica {replica} (worker {replica // per_worker})"


#: Each model's sentinel, so each fit's new callback reuses the traced check; held by the process
#: runtime, so ``tfstrategy.reset()`` drops it with the rest of the job.
SENTINELS: Attachments[Sentinel] = RUNTIME.attachments("sentinel")


def sentinel_for(model: Model, strategy: Strategy) -> Sentinel:
    """The model's :class:`Sentinel` for ``strategy``, made once per model and set of weights."""
    weights = [_compat.tf_variable(variable) for variable in model.weights]
    found = SENTINELS.get(model)
    if (found is not None and found.strategy is getattr(strategy, "strategy", strategy)
            and len(found.variables) == len(weights) and all(a is b for a, b in zip(found.variables, weights))):
        return found
    sentinel = Sentinel(strategy, model.weights)
    SENTINELS.set(model, sentinel)
    return sentinel


@functools.lru_cache(maxsize=1)
def _callback_class(base: type) -> type:
    class DivergenceSentinel(base):
        """Keras callback: stop ``fit`` when replicas or workers stop holding the same weights."""

        def __init__(self, every: int | str = "epoch", strategy: Strategy | None = None) -> None:
            super().__init__()
            self.every = parse_sentinel(every, name="every") or "epoch"
            self.strategy = strategy
            self.sentinel: Sentinel | None = None

        def _check(self, logs: Logs) -> None:
            model = self.model
            if self.sentinel is None:
                strategy = self.strategy or _compat.model_strategy(model) or tf().distribute.get_strategy()
                self.sentinel = sentinel_for(model, strategy)
            optimizer = getattr(model, "optimizer", None)
            step = int(optimizer.iterations.numpy()) if optimizer is not None else None
            loss = (logs or {}).get("loss")
            try:
                self.sentinel.check(step=step, loss=None if loss is None else float(loss))
            except DivergenceError:
                model.stop_training = True
                raise

        def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
            if isinstance(self.every, int) and (batch + 1) % self.every == 0:
                self._check(logs)

        def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
            if self.every == "epoch":
                self._check(logs)

    return DivergenceSentinel


def divergence_sentinel(every: int | str = "epoch", *, strategy: Strategy | None = None) -> Any:
    """A Keras callback that raises :class:`~tfstrategy.errors.DivergenceError` when replicas disagree.

    Args:
        every: ``"epoch"`` (the default: each epoch's end) or a step interval.
        strategy: defaults to the model's.

    Example:
        >>> model.fit(train_ds, epochs=10, callbacks=[tfstrategy.divergence_sentinel()])
    """
    return _callback_class(tf().keras.callbacks.Callback)(every, strategy)


def add_sentinel(model: Model, kwargs: dict[str, Any], every: int | str | None) -> None:
    """Put a sentinel callback into ``fit``'s keyword arguments, unless off or already there (the hook's step)."""
    if every is None:
        return
    callbacks = list(kwargs.get("callbacks") or [])
    if any(type(callback).__name__ == "DivergenceSentinel" for callback in callbacks):
        return
    keras = _compat.keras_for(model)
    callbacks.append(_callback_class(keras.callbacks.Callback)(every))
    kwargs["callbacks"] = callbacks
