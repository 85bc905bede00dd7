"""The worker's ledger: what this worker trained, kept for its launcher (the start-up hook's ``ledger`` step).

A :class:`LedgerKeeper` has two sides, and they never wait for each other:

- the **training loop's** side, called from the Keras callbacks of
  :func:`tfstrategy.runtime.worker_watch.progress_callbacks` and from the traced
  ``Strategy.run`` (:mod:`tfstrategy.runtime.ledger_traces`): plain integer and
  attribute stores (an epoch begins, a batch begins, a batch ends, the data ran
  out, a function was traced), a monotonic clock read per batch and nothing else;
- the **heartbeat's** side, :meth:`LedgerKeeper.sample`, called by the heartbeat
  thread the launcher already relies on (about 4 times a second): it reads those
  counters, the process CPU time, the main thread's deepest frame in the user's
  code and what every thread's Python stack shows TensorFlow running of the
  user's code (:func:`tfstrategy.stacks.users_code_tensorflow_runs`: a ``from_generator`` generator,
  input; a ``tf.py_function``/``tf.numpy_function``, neither input nor the step's
  own work: a measure of its own; the stacks also between two samples,
  :meth:`LedgerKeeper.sample_stacks`, 20 times a second in all, each pause drawn), and writes the ledger file
  (:func:`tfstrategy.contract.ledger.write_ledger`, next to the progress file) at most once a second, only when something changed;
  :meth:`LedgerKeeper.flush` writes the last state at exit.

The file format is :mod:`tfstrategy.contract.ledger` (a pure module both sides share,
like :mod:`tfstrategy.contract.reports`). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import atexit
import os
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tfstrategy.contract.ledger import WRITE_SECONDS, FunctionTrace, Ledger, ledger_path, write_ledger
from tfstrategy.stacks import TensorFlowRuns, UsersCodeSeconds, main_thread_user_frame, share_counter
from tfstrategy.state.registry import RUNTIME

__all__ = ["LedgerKeeper", "current_keeper", "keep_ledger", "stop_ledger"]

#: The samples the step statistics span (about two seconds at the heartbeat's 4 a second; the stacks' between them count).
_WINDOW = 9
#: The last end-of-data events and traced functions kept.
_KEPT = 8
#: The distinct ``py_function`` places counted (a script has a few; more are not counted).
_PLACES = 32


class LedgerKeeper(UsersCodeSeconds):
    """One worker's ledger in memory, its counters fed by the training loop, sampled and written by the heartbeat.

    ``clock`` (monotonic seconds), ``cpu_clock`` (process CPU seconds), ``wall`` (epoch seconds),
    ``frame`` (the user's frame, as ``file:line in function``), ``runs`` (what TensorFlow runs of
    the user's code now: :func:`tfstrategy.stacks.tensorflow_runs_users_code`) and ``write`` are parameters so
    tests drive the keeper with fakes.
    """

    def __init__(self, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time, wall: Callable[[], float] = time.time,
                 frame: Callable[[], str] | None = None, runs: Callable[[], TensorFlowRuns] | None = None,
                 write: Callable[[Path, Ledger], None] = write_ledger) -> None:
        self.path = Path(path)
        self._clock, self._cpu_clock, self._wall = clock, cpu_clock, wall
        super().__init__(runs)
        self._frame = frame if frame is not None else main_thread_user_frame
        self._write = write
        # The training loop's side (written by one thread, read by the heartbeat's).
        self.epoch = -1
        self.epoch_steps: int | None = None
        self.batches = 0
        self.steps = 0
        self.total_steps = 0
        self.in_batch = False
        self.outside_seconds = 0.0
        self._last_end: float | None = None
        self.end_of_data: tuple[tuple[int, int], ...] = ()
        self.functions: tuple[FunctionTrace, ...] = ()
        self.loop: str | None = None
        #: The Keras calls in progress, innermost last (a tuple: the heartbeat reads it while it changes).
        self.calls: tuple[str, ...] = ()
        #: The kind of function being traced now (``None``: none): a worker stuck in its trace (creating a
        #: variable the other workers never create, which waits on them) has no fingerprint, but this.
        self.tracing: str | None = None
        #: The model's weights created so far: their count and the last few ``(ordinal, name, shape)``.
        #: Workers that build different models abort (or hang) in the broadcast of the first weight that
        #: differs, before any function is traced: the last weight each created names the difference.
        self.weights = 0
        self.last_weights: tuple[tuple[int, str, str], ...] = ()
        #: ``"file"`` or ``"off"``: a dataset distributed so that each worker reads data of its own (by file) or all of
        #: it; the global batches then depend on the number of workers (``None``: by element, or not known).
        self.sharding: str | None = None
        self._urgent = False
        # The heartbeat's side: samples of (clock, total steps, outside, CPU, input and py_function seconds).
        self._samples: deque[tuple[float, int, float, float, float, float]] = deque(maxlen=_WINDOW)
        #: How often the heartbeat saw each of the user's ``py_function`` s run (its seconds: ``py_function_seconds``).
        self.py_function_places: Counter[str] = Counter()
        self._written: Ledger | None = None
        self._last_frame = ""
        self._written_at = float("-inf")
        self.writes = 0

    # -- the training loop's side: cheap stores only ------------------------------------------

    def epoch_begins(self, epoch: int, planned: int | None = None) -> None:
        """A Keras epoch begins (``planned``: its steps, when Keras knows them)."""
        self.epoch, self.epoch_steps = epoch, planned
        self.batches = self.steps = 0
        self.in_batch = False
        self.loop = "fit"

    def batch_begins(self, first: int | None = None) -> None:
        """A train batch begins (its data may still run out); ``first``: Keras' 0-based number of its first step."""
        now = self._clock()
        if self._last_end is not None:
            self.outside_seconds += now - self._last_end  # input, callbacks: everything between two steps
        self.batches = self.batches + 1 if first is None else first + 1
        self.in_batch = True

    def batch_ends(self, last: int | None = None) -> None:
        """A train batch's step ended; ``last``: Keras' 0-based number of its last step (``steps_per_execution``)."""
        steps = self.steps + 1 if last is None else last + 1
        self.total_steps += max(steps - self.steps, 1)
        self.steps = steps
        self.in_batch = False
        self._last_end = self._clock()

    def epoch_ends(self) -> None:
        """The epoch ended: a batch begun and never ended means its data ran out."""
        self._data_ran_out_if_in_batch()
        self._last_end = None  # the time until the next epoch's first batch is not input wait

    def call_begins(self, method: str) -> None:
        """``Model.fit``/``evaluate``/``predict`` begins (``method``: its name)."""
        self.calls = (*self.calls, method)

    def call_ends(self, method: str, *, normally: bool) -> None:
        """The call of ``method`` ended; a begun batch left behind on a normal return means the data ran out."""
        if method in self.calls:
            innermost = len(self.calls) - 1 - self.calls[::-1].index(method)
            self.calls = self.calls[:innermost] + self.calls[innermost + 1:]
        if method == "fit":  # (evaluate and predict count no train batches: fit's validation leaves them be)
            if normally:
                self._data_ran_out_if_in_batch()
            self.in_batch = False
            self._last_end = None

    def _data_ran_out_if_in_batch(self) -> None:
        if self.in_batch:
            # (epoch, the batch begun that found no data): "ran out after batches - 1 batches".
            self.end_of_data = (*self.end_of_data, (self.epoch, self.batches))[-_KEPT:]
            self.in_batch = False

    def function_kind(self) -> str:
        """What a function traced now serves: ``train``/``test``/``predict`` inside a Keras call, else ``custom``."""
        kinds = {"fit": "train", "evaluate": "test", "predict": "predict"}
        calls = self.calls
        return kinds.get(calls[-1], "custom") if calls else "custom"

    def traced(self, trace: FunctionTrace) -> None:
        """A train/eval function was traced (its fingerprint, at this epoch and step)."""
        if trace.kind == "custom" and self.loop is None:
            self.loop = "custom"
        self.functions = (*self.functions, trace)[-_KEPT:]

    def weight_created(self, name: str, shape: str) -> None:
        """A model's weight ``name`` of ``shape`` (``"(4, 8)"``) is being created (written at the next sample)."""
        self.weights += 1
        self.last_weights = (*self.last_weights, (self.weights, name, shape))[-_KEPT:]
        self._urgent = True  # its creation may be the one that waits forever (or aborts): say it at once

    # -- the heartbeat's side ------------------------------------------------------------------

    def ledger(self) -> Ledger:
        """The ledger as of now (its step statistics from the last samples)."""
        step, inside_input, cpu, py_function = self._rates()
        calls = self.calls
        extra: dict[str, object] = {"loop": self.loop, "epoch_steps": self.epoch_steps,
                                    "in_batch": self.in_batch, "call": calls[-1] if calls else None,
                                    "tracing": self.tracing}
        if self.sharding is not None:
            extra["sharding"] = self.sharding
        if self.weights:
            extra["weights"] = {"count": self.weights, "last": [list(weight) for weight in self.last_weights]}
        return Ledger(epoch=self.epoch, batches=self.batches, steps=self.steps, total_steps=self.total_steps,
                      end_of_data=self.end_of_data, functions=self.functions, frame=self._safe_frame(),
                      step_seconds=step, input_seconds=inside_input, cpu_seconds=cpu,
                      py_function_seconds=py_function, py_function=self._py_function_place(), extra=extra)

    def _py_function_place(self) -> str:
        """The user's ``py_function`` the heartbeat saw most often (``""``: none)."""
        places = self.py_function_places.most_common(1)
        return places[0][0] if places else ""

    def _safe_frame(self) -> str:
        """The user's frame now; at exit (no frame of the script's left), the last one seen."""
        try:
            frame = self._frame()
        except Exception:  # a frame that cannot be read must not stop the heartbeat
            frame = ""
        if frame:
            self._last_frame = frame
        return self._last_frame

    def _rates(self) -> tuple[float | None, float | None, float | None, float | None]:
        """Seconds per step, and of them input, CPU and ``py_function`` seconds per step, over the window.

        The input seconds are the larger of the time between steps (a custom loop's ``next()``, Keras'
        callbacks) and the time the heartbeat saw tf.data run a generator of the user's (read inside the
        step): one of the two sees a slow input, whichever loop reads it. The ``py_function`` seconds are
        apart: a custom loop's time between steps may include a ``map``'s ``py_function``, and the CPU
        seconds the CPU it burns; they are other views of one cost, never added to it.
        """
        if len(self._samples) < 2:
            return None, None, None, None
        first, last = self._samples[0], self._samples[-1]
        steps = last[1] - first[1]
        if steps <= 0:
            return None, None, None, None
        waited = max(last[2] - first[2], last[4] - first[4])
        return (round((last[0] - first[0]) / steps, 6), round(waited / steps, 6),
                round((last[3] - first[3]) / steps, 6), round((last[5] - first[5]) / steps, 6))

    def _sample_users_code(self, now: float) -> TensorFlowRuns:
        """The shared count, and how often each ``py_function`` place was seen."""
        runs = super()._sample_users_code(now)
        for place in runs.py_functions:
            if place in self.py_function_places or len(self.py_function_places) < _PLACES:
                self.py_function_places[place] += 1
        return runs

    def sample_stacks(self) -> None:
        """Sample what the threads run of the user's code only (more often than :meth:`sample`: its measures of a
        ``py_function``'s and the input's seconds are counts of samples, and more samples are closer to the truth)."""
        self._sample_users_code(self._clock())

    def sample(self) -> bool:
        """Take one sample; write the ledger if it changed and the last write is old enough. Whether it wrote."""
        now = self._clock()
        self._sample_users_code(now)
        self._samples.append((now, self.total_steps, self.outside_seconds, self._cpu_clock(), self.input_seconds,
                              self.py_function_seconds))
        if now - self._written_at < WRITE_SECONDS and not self._urgent:
            return False
        self._urgent = False
        return self._write_if_changed(now)

    def flush(self) -> bool:
        """Write the ledger now if it changed since the last write (at exit). Whether it wrote."""
        return self._write_if_changed(self._clock())

    def _write_if_changed(self, now: float) -> bool:
        ledger = self.ledger()
        if ledger == self._written:
            return False
        try:
            self._write(self.path, replace(ledger, time=self._wall()))
        except OSError:  # a full disk or a removed directory must not stop the worker
            return False
        self._written, self._written_at = ledger, now
        self.writes += 1
        return True


# -- the keeper of this process --------------------------------------------------------------------

_KEEPER: list[LedgerKeeper] = []


def _forget() -> None:
    _KEEPER.clear()


RUNTIME.own_state("ledger", _forget)


def current_keeper() -> LedgerKeeper | None:
    """This process's keeper (``None`` until the ``ledger`` step took it)."""
    return _KEEPER[0] if _KEEPER else None


def keep_ledger(traces: Callable[[], str] = lambda: "") -> str | None:
    """Keep a ledger beside this worker's progress file (``None`` outside ``tfstrategy launch``).

    The heartbeat thread samples and writes it (:mod:`tfstrategy.runtime.worker_watch`); ``traces``
    installs what fingerprints traced functions (the ``ledger`` step passes
    :func:`tfstrategy.runtime.ledger_traces.fingerprint_traces`, which reads the keeper back) and
    returns what it adds to the step's line.
    """
    if not RUNTIME.progress:
        return None
    if _KEEPER:
        return None  # already kept (the hook took the step before select() did)
    progress = getattr(RUNTIME.progress[0], "path", None)
    if progress is None:
        return None
    keeper = LedgerKeeper(ledger_path(progress))
    _KEEPER.append(keeper)
    share_counter(keeper)  # the performance report counts from the heartbeat's samples, not a thread of its own
    atexit.register(_flush_at_exit, keeper)
    return f"per-epoch batches, end of data, the user's frame{traces()} in {keeper.path}"


def stop_ledger() -> None:
    """Write the last state and stop keeping the ledger (the ``ledger`` step's undo)."""
    keeper = current_keeper()
    if keeper is not None:
        keeper.flush()
    _KEEPER.clear()
    share_counter(None)


def _flush_at_exit(keeper: LedgerKeeper) -> None:
    if current_keeper() is keeper:
        keeper.flush()
