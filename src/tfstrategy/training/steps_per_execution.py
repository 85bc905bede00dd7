"""``steps_per_execution="auto"``: pick K, the steps Keras runs per call, when a larger K measurably pays.

Each call of a Keras train function costs a fixed dispatch (Python, the
``tf.function`` call, callbacks, the iterator) on top of K steps of work. On
a small model the dispatch is most of a step, so K > 1 pays off; on a large one
it is a rounding error and K = 1 keeps per-step callbacks exact. The choice is
split as the rest of tfstrategy is:

- :func:`choose_steps_per_execution` decides (pure): given a function that
  times one execution of K steps, it times K = 1 and the largest K allowed in
  alternation, so that load on a shared machine hits both alike, and keeps the
  large K only if it runs a step at least 15% faster than K = 1 (the fastest
  execution of each counts: other processes only ever add time). Two
  candidates far apart, and a margin well above timing noise, make the same
  choice run after run; a K that does not clearly pay is never chosen.
- :func:`steps_cap` says what K may not exceed (pure): the epoch length and
  callbacks that act on every batch (Keras calls batch hooks once per
  execution, so such a callback would see one call per K steps).
- :func:`tune_steps_per_execution` measures a compiled model on a copy of its
  dataset, puts back every state the measuring steps changed, and sets K.

``build_in_scope(..., steps_per_execution="auto")`` compiles with K = 1 and
tunes at the model's first ``fit``, which knows the dataset and the callbacks.

**Experimental, opt-in.** Tuning runs real training steps before the user's
``fit``, so it needs :mod:`tfstrategy.training.no_trace` (a rebuilt copy of the
tf.data graph, snapshots of every variable and random state) and, on the tuned
model, an instance override of a private Keras method (the skipped build peek:
dropping the probe's iterator makes a later ``fit`` segfault in TensorFlow
2.21). The gain it finds is that of a fixed K: 1.27-1.48x per CPU-second over
K = 1 on a small MLP, none on a CNN, and one tuning costs as much as several
epochs (~3.8 CPU-s on the MLP, 6 of its epochs; ``benchmarks/README.md``).
Nothing on the default path imports this module: ``build_in_scope`` loads it
only for ``"auto"``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.state.registry import RUNTIME, Attachments
from tfstrategy.training.no_trace import dataset_copy, skip_build_peek, snapshot

if TYPE_CHECKING:
    from tfstrategy._protocols import Dataset, Model, Strategy

logger = logging.getLogger(__name__)

#: The large K timed against K = 1: past it the dispatch saved is below timing noise on any model measured.
MAX_STEPS = 64
#: The large K must run a step at least this much faster than K = 1 to be chosen.
MIN_GAIN = 0.15
#: Alternating rounds (one execution of each K per round) at least, and exactly, across workers.
ROUNDS = 5
#: Batch hooks of callbacks from these packages aggregate over an execution (progress bar, history, ...).
_EXECUTION_AWARE_PACKAGES = ("keras", "tf_keras", "tensorflow")
_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


@dataclass(frozen=True, kw_only=True)
class StepsPerExecutionChoice:
    """The K chosen, why, and the timings it came from."""

    steps: int
    reason: str
    cap: int
    cap_reason: str
    #: (K, seconds per step at K: the fastest execution's), K = 1 first.
    seconds_per_step: tuple[tuple[int, float], ...] = ()
    #: Alternating rounds timed (one execution of each K per round).
    rounds: int = 0

    def line(self) -> str:
        timings = ", ".join(f"K={k}: {seconds * 1000:.3g} ms/step" for k, seconds in self.seconds_per_step)
        measured = f"; {timings} (fastest of {self.rounds} rounds)" if timings else ""
        return f"steps_per_execution={self.steps} ({self.reason}; cap {self.cap}: {self.cap_reason}{measured})"


def _per_step_callbacks(callbacks: Iterable[object]) -> list[str]:
    base = None
    named = []
    for callback in callbacks:
        if base is None:
            base = next((k for k in type(callback).__mro__ if k.__name__ == "Callback"), object)
        package = type(callback).__module__.split(".", 1)[0]
        if package in _EXECUTION_AWARE_PACKAGES or getattr(callback, "_tfstrategy_execution_aware", False):
            continue
        if any(getattr(type(callback), hook, None) is not getattr(base, hook, None) for hook in _BATCH_HOOKS):
            named.append(type(callback).__name__)
    return named


def steps_cap(
    *, steps_per_epoch: int | None, callbacks: Iterable[object] = (), max_steps: int = MAX_STEPS
) -> tuple[int, str]:
    """The largest K allowed, and why.

    Args:
        steps_per_epoch: steps in one epoch, or ``None`` when unknown.
        callbacks: the callbacks ``fit`` will get; one outside Keras that
            overrides a batch hook needs every step, which caps K at 1.
        max_steps: the cap when nothing else limits K.

    Example:
        >>> steps_cap(steps_per_epoch=20)
        (20, 'the epoch has 20 steps')
    """
    per_step = _per_step_callbacks(callbacks)
    if per_step:
        return 1, f"callback(s) {', '.join(per_step)} act on every batch (Keras calls them once per execution)"
    if steps_per_epoch is not None and 0 < steps_per_epoch < max_steps:
        return int(steps_per_epoch), f"the epoch has {steps_per_epoch} steps"
    return max_steps, "the largest K tried"


def _alternate(time_execution: Callable[[int], float], ks: tuple[int, int], best: dict[int, float], *,
               rounds: int, min_seconds: float = 0.0, max_rounds: int = 50) -> list[float]:
    """Time one execution of each K per round, the order swapped every round; keep each K's fastest per step.

    Returns each round's gain: seconds per step at the first K over those at the second.
    """
    spent, gains = 0.0, list[float]()
    while len(gains) < rounds or (spent < min_seconds and len(gains) < max_rounds):
        per_step: dict[int, float] = {}
        for k in ks if len(gains) % 2 == 0 else ks[::-1]:
            seconds = float(time_execution(k))
            spent += seconds
            per_step[k] = seconds / k
            best[k] = min(best.get(k, float("inf")), per_step[k])
        gains.append(per_step[ks[0]] / per_step[ks[1]] if per_step[ks[1]] > 0 else 1.0)
    return gains


def choose_steps_per_execution(
    time_execution: Callable[[int], float],
    *,
    cap: int = MAX_STEPS,
    cap_reason: str = "the largest K tried",
    min_gain: float = MIN_GAIN,
    rounds: int = ROUNDS,
    min_seconds: float = 0.0,
    max_rounds: int = 50,
    agree: Callable[[float], float] = float,
) -> StepsPerExecutionChoice:
    """Keep K = ``cap`` only if, timed in alternation with K = 1, it runs a step ``min_gain`` faster.

    First a screen: three alternating rounds of K = 1 and K = 4 estimate the
    dispatch (t(K) = dispatch + K x step); if even K = ``cap`` could not gain
    half of ``min_gain``, K stays 1 without timing long executions of a heavy
    model. Otherwise K = 1 and K = ``cap`` are timed in alternating rounds (the
    order swapped every round, so drift in a neighbour's load hits both) until
    there are ``rounds`` of them and they took ``min_seconds``. Each round gives
    a gain (K = 1's time per step over the large K's, side by side in time); the
    large K is kept if the second-smallest round's gain is ``min_gain`` or more,
    so one round slowed by a neighbour decides nothing.

    Args:
        time_execution: the seconds one execution of K steps takes.
        cap: the largest K allowed (see :func:`steps_cap`); the K timed against 1.
        cap_reason: why, for the report.
        min_gain: the large K must be at least this much faster per step.
        rounds: alternating rounds of K = 1 and K = ``cap`` at least.
        min_seconds: keep timing rounds until they took this long (0: exactly ``rounds``, as
            workers running collectives must).
        max_rounds: the most rounds timed.
        agree: turns this process's seconds per step into the job's (a mean over workers), so
            every worker of a job takes the same decision.

    Example:
        >>> choose_steps_per_execution(lambda k: 0.002 + 0.0005 * k).steps
        64
    """
    if cap < 1:
        raise TrainingError(f"Received a steps_per_execution cap of {cap}; expected 1 or more.")
    if cap == 1:
        return StepsPerExecutionChoice(steps=1, reason="the cap is 1", cap=1, cap_reason=cap_reason)
    best: dict[int, float] = {}
    screen = min(4, cap)
    done = len(_alternate(time_execution, (1, screen), best, rounds=3))
    one, small = agree(best[1]), agree(best[screen])
    step = max((small * screen - one) / (screen - 1), 0.0)
    dispatch = max(one - step, 0.0)
    bound = one / (dispatch / cap + step) if dispatch / cap + step > 0 else 1.0
    if screen < cap and bound < 1 + min_gain / 2:
        return StepsPerExecutionChoice(
            steps=1, cap=cap, cap_reason=cap_reason, rounds=done, seconds_per_step=((1, one), (screen, small)),
            reason=f"the dispatch is ~{dispatch / one:.0%} of a step: even K={cap} could run a step only "
                   f"~{bound:.2f}x as fast as K=1 (below the {1 + min_gain:.2f}x that pays)")
    gains = sorted(_alternate(time_execution, (1, cap), best, rounds=rounds, min_seconds=min_seconds,
                              max_rounds=max_rounds))
    done += len(gains)
    per_step = {1: agree(best[1]), cap: agree(best[cap])}
    # The second-smallest round's gain: one round a neighbour slowed at K=1 cannot make the large K look better.
    gain = agree(gains[1] if len(gains) > 1 else gains[0])
    if gain >= 1 + min_gain:
        chosen, reason = cap, f"K={cap} runs a step {gain:.2f}x as fast as K=1"
    else:
        chosen = 1
        reason = f"K={cap} would run a step only {gain:.2f}x as fast as K=1 (below the {1 + min_gain:.2f}x that pays)"
    return StepsPerExecutionChoice(steps=chosen, reason=reason, cap=cap, cap_reason=cap_reason,
                                   seconds_per_step=tuple(per_step.items()), rounds=done)


# --- measuring a real model ------------------------------------------------------------


def _cardinality(dataset: Dataset) -> int | None:
    cardinality = getattr(dataset, "cardinality", None)
    if cardinality is None:
        return None
    value = int(cardinality())
    return value if value > 0 else None  # INFINITE (-1) and UNKNOWN (-2)


def job_mean(strategy: Strategy, values: list[float]) -> list[float]:
    """The mean of each value over the job's workers (the values themselves in one process), so every
    worker takes the same decisions."""
    if not _compat.in_multi_worker_mode(strategy):
        return values
    tf_ = tf()
    local = tf_.constant(values, tf_.float64)
    per_replica = strategy.experimental_distribute_values_from_function(lambda _: local)
    return [float(v) for v in strategy.reduce(tf_.distribute.ReduceOp.MEAN, per_replica, axis=None).numpy()]


class _Timer:
    """Times one execution of the model's own train function at K, on a repeating iterator of ``dataset``.

    Each K's function is traced once, with its first (tracing) call untimed, and
    kept, so that timings of two Ks can alternate.
    """

    def __init__(self, model: Model, dataset: Dataset) -> None:
        self.model = model
        strategy = model.distribute_strategy
        self.strategy = strategy
        self.multi_worker = _compat.in_multi_worker_mode(strategy)
        # In one process the dispatch K saves is CPU work, and this process's CPU
        # time is blind to other processes competing for the cores (wall time
        # favours short executions that slip between them). Across workers the
        # per-execution cost is mostly waiting for the network: wall time.
        self.clock = time.perf_counter if self.multi_worker else time.process_time
        if isinstance(dataset, tf().data.Dataset):
            dataset = strategy.experimental_distribute_dataset(dataset.repeat())
        self.iterator = iter(dataset)
        self.functions: dict[int, Any] = {}

    def __call__(self, k: int) -> float:
        function = self.functions.get(k)
        if function is None:
            _compat.set_steps_per_execution(self.model, k)
            self.model.make_train_function(force=True)
            function = self.functions[k] = self.model.train_function
            function(self.iterator)  # trace, and the first-call costs
        start = self.clock()
        function(self.iterator)
        return self.clock() - start


def tune_steps_per_execution(
    model: Model,
    dataset: Dataset,
    *,
    callbacks: Iterable[object] = (),
    steps_per_epoch: int | None = None,
    max_steps: int = MAX_STEPS,
    min_seconds: float = 0.4,
) -> StepsPerExecutionChoice:
    """Measure ``model`` training on ``dataset`` and set its ``steps_per_execution`` to the K that pays.

    Experimental (see the module's docstring): a fixed K needs none of its
    machinery. The model must be compiled (``build_in_scope`` does it). Training steps run
    to measure (tens to hundreds) on a copy of the dataset, then the weights,
    the optimizer state, the metrics and every random state are put back
    (:mod:`tfstrategy.training.no_trace`), so the next ``fit`` starts from the
    same state and sees the same data order as without tuning. In a
    multi-worker job every worker must call it (the timings are averaged over
    workers, so all choose the same K).

    Args:
        model: a compiled Keras model.
        dataset: the batched ``tf.data.Dataset`` (or distributed dataset) ``fit`` will get.
        callbacks: the callbacks ``fit`` will get (see :func:`steps_cap`).
        steps_per_epoch: steps per epoch; default: the dataset's length, if known.
        max_steps: the large K timed against K = 1 (when the epoch and callbacks allow it).
        min_seconds: time alternating rounds for at least this long (and 5 rounds; exactly 5 across
            workers, which must run the same collectives); the fastest execution of each K counts.

    Returns:
        The :class:`StepsPerExecutionChoice`; ``model.steps_per_execution`` is set to it.

    Example:
        >>> choice = tfstrategy.tune_steps_per_execution(model, dataset)
        >>> print(choice.line())
        steps_per_execution=64 (K=64 runs a step 2.71x as fast as K=1; cap 64: the largest K tried; K=1: 1.9 ms/step, ...)
    """
    if getattr(model, "optimizer", None) is None or getattr(model, "compiled", True) is False:
        raise TrainingError(
            f"Received model {getattr(model, 'name', model)!r} that is not compiled; expected a compiled model. "
            "Call model.compile(...) first, or build it with tfstrategy.build_in_scope(..., optimizer=..., loss=...)."
        )
    if getattr(model, "run_eagerly", False):
        return _set(model, StepsPerExecutionChoice(steps=1, reason="run_eagerly runs one step per call", cap=1,
                                                   cap_reason="run_eagerly"))
    cap, cap_reason = steps_cap(steps_per_epoch=steps_per_epoch or _cardinality(dataset), callbacks=callbacks,
                                max_steps=max_steps)
    if cap == 1:
        return _set(model, choose_steps_per_execution(float, cap=1, cap_reason=cap_reason))
    if not _compat.is_tf_keras_object(model):
        # K > 1 on 2+ replicas (and on 2+ workers) needs tfstrategy's multi-step loop.
        from tfstrategy.patches import apply_patches, keras_steps_per_execution

        apply_patches(keras_steps_per_execution.PATCH.name)
    copy, no_copy = dataset_copy(dataset)
    if no_copy is not None:
        logger.warning("tfstrategy: tuning steps_per_execution on the dataset itself, which moves its shuffle "
                       "order for the fit that follows: %s.", no_copy)
    if isinstance(copy, tf().data.Dataset):
        _compat.symbolic_build(model, next(iter(copy.take(1))))
    saved = snapshot(model)
    try:
        timer = _Timer(model, copy)
        choice = choose_steps_per_execution(timer, cap=cap, cap_reason=cap_reason,
                                            min_seconds=0.0 if timer.multi_worker else min_seconds,
                                            agree=lambda seconds: job_mean(timer.strategy, [seconds])[0])
    finally:
        saved.restore()
        model.reset_metrics()
        skip_build_peek(model)
    return _set(model, choice)


def _set(model: Model, choice: StepsPerExecutionChoice) -> StepsPerExecutionChoice:
    _compat.set_steps_per_execution(model, choice.steps)
    CHOICES.set(model, choice)
    logger.info("tfstrategy: %s", choice.line())
    return choice


#: Each tuned model's choice, held by the process runtime (``tfstrategy.reset()`` forgets it), not on the model.
CHOICES: Attachments[StepsPerExecutionChoice] = RUNTIME.attachments("steps_per_execution_choice")


def last_choice(model: Model) -> StepsPerExecutionChoice | None:
    """The choice :func:`tune_steps_per_execution` (or ``steps_per_execution="auto"``) made for ``model``."""
    return CHOICES.get(model)


def tune_at_first_fit(model: Model) -> None:
    """Make the model's next ``fit`` tune K on its own data and callbacks first (``steps_per_execution="auto"``).

    An instance override of ``model.fit`` registered with the process runtime, one shot: the first call removes
    it (the scope guard's wrapper, or Keras' own method, is back) and then tunes and fits.
    """
    fit = model.fit

    @functools.wraps(fit)
    def fit_tuning_first(*args: object, **kwargs: object) -> object:
        override.remove()  # one shot: later fits run as compiled
        _tune_for_fit(model, args, kwargs)
        return fit(*args, **kwargs)

    override = RUNTIME.override_attribute(model, "fit", fit_tuning_first, name=f"steps_per_execution_auto:{id(model)}",
                                          note="the model's next fit tunes steps_per_execution first")


def _tune_for_fit(model: Model, args: tuple[object, ...], kwargs: dict[str, Any]) -> None:
    """Tune K on ``fit(*args, **kwargs)``'s data and callbacks, and print the choice unless ``verbose=0``."""
    data = args[0] if args else kwargs.get("x")
    dataset = as_dataset(data, args[1] if len(args) > 1 else kwargs.get("y"), kwargs.get("batch_size"))
    if dataset is None:
        choice = _set(model, StepsPerExecutionChoice(
            steps=1, reason=f"fit received {type(data).__name__}, not a dataset or arrays: nothing to time",
            cap=1, cap_reason="no data to time"))
    else:
        choice = tune_steps_per_execution(model, dataset, callbacks=kwargs.get("callbacks") or (),
                                          steps_per_epoch=kwargs.get("steps_per_epoch"))
    if kwargs.get("verbose", "auto") != 0:
        print(f"tfstrategy: {choice.line()}", flush=True)


def as_dataset(data: object, labels: object, batch_size: int | None) -> Any:
    """fit's data as a dataset: a dataset as it is, arrays batched as fit batches them, else None."""
    tf_ = tf()
    if isinstance(data, (tf_.data.Dataset, tf_.distribute.DistributedDataset)):
        return data
    if hasattr(data, "shape") and hasattr(data, "dtype"):  # arrays, as fit batches them
        elements = data if labels is None else (data, labels)
        return tf_.data.Dataset.from_tensor_slices(elements).batch(batch_size or 32)
    return None
