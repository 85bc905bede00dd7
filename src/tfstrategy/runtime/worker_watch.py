"""The worker's side of supervision, installed by the start-up hook in every launched Python worker.

Each part is one small named step, recorded in ``RUNTIME.supervision`` (:mod:`tfstrategy.state.registry`):

- ``die_with_launcher``: the worker ends when its launcher does, however it ends (SIGKILL
  included): ``PR_SET_PDEATHSIG`` (Linux) kills it when the launcher's thread that started it
  exits, and a thread blocked on the launcher's lifeline pipe (every platform) kills the
  worker's whole process group when that pipe reaches end-of-file. The launcher's reaper
  (:mod:`tfstrategy.launch.reaper`) stops whatever escaped both.
- ``record_errors``: the first uncaught exception goes to ``TFSTRATEGY_ERROR_FILE``
  (:func:`tfstrategy.contract.reports.write_error`), so the launcher names the root cause.
- ``dump_stacks``: every thread's Python stack goes to stderr on :data:`STACK_SIGNAL` (the
  launcher sends it to every worker when one stalls) and on a crash. On the signal, a thread of
  ours prints them while holding the GIL (woken by the signal's wakeup byte), because
  ``faulthandler``'s own handler reads the other threads' frames from inside the signal, while
  they run: a worker tracing its step was seen to die of SIGSEGV there. A frozen worker (a
  thread holding the GIL in a C extension) cannot run that thread: on
  :data:`FROZEN_STACK_SIGNAL`, which the launcher sends it instead, faulthandler's handler prints
  them, and then no Python frame moves under it.
- ``heartbeat``: a thread bumps the progress file's heartbeat (a frozen or stopped process
  stops beating); :func:`progress_callbacks` count batches and marks "inside a step". An exit
  handler marks the worker "finishing" once its script ended: the heartbeat then stops while
  the interpreter and TensorFlow tear down (slowly on a loaded machine), which is not a freeze.

Nothing here imports TensorFlow; the Keras callback class is made when Keras is imported.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import functools
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tfstrategy.contract.reports import (
    HEARTBEAT_SECONDS,
    SAMPLES_PER_HEARTBEAT,
    ProgressWriter,
    sample_pause,
    write_error,
)
from tfstrategy.errors import TFStrategyError
from tfstrategy.runtime.ledger import LedgerKeeper, current_keeper
from tfstrategy.state.registry import RUNTIME
from tfstrategy.worker_contract import FROZEN_STACK_SIGNAL, STACK_SIGNAL, SUPERVISION_VARIABLES, WorkerContract

if TYPE_CHECKING:
    from tfstrategy._protocols import Logs, Model

__all__ = ["STACK_SIGNAL", "install", "progress_callbacks", "count_batches", "heartbeat_loop"]

_PR_SET_PDEATHSIG = 1


def install(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Take every step this process's environment asks for (a no-op outside ``tfstrategy launch``).

    Called again after :func:`tfstrategy.reset` (the hook's :meth:`~tfstrategy.state.registry.ProcessRuntime.keep_armed`),
    it re-arms the job's side (the progress writer in ``RUNTIME.progress``, the error file's excepthook) from the
    contract read the first time; what lives as long as the process (threads, signal handlers) is set up once.
    """
    own = env is None or env is os.environ
    env = os.environ if env is None else env
    try:
        contract = _CONTRACT[0] if own and _CONTRACT else WorkerContract.from_environ(env)
    except TFStrategyError as error:  # supervision must never stop the user's program from starting
        print(f"tfstrategy: hook: {error}", file=sys.stderr, flush=True)
        return dict(RUNTIME.supervision)
    if own and not _CONTRACT:
        _CONTRACT.append(contract)  # the variables leave the environment below; a re-arm reads them here
    steps: tuple[tuple[str, Callable[[WorkerContract], str | None]], ...] = (
        ("die_with_launcher", _once(_die_with_launcher)), ("record_errors", _record_errors),
        ("dump_stacks", _once(_dump_stacks)), ("heartbeat", _heartbeat),
    )
    for name, step in steps:
        if name in RUNTIME.supervision:
            continue
        try:
            done = step(contract)
        except Exception as error:  # supervision must never stop the user's program from starting
            print(f"tfstrategy: hook step {name}: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            continue
        if done:
            RUNTIME.supervision[name] = done
    if env is os.environ:
        # This process is the worker: a Python process it starts (a helper, `python other.py`)
        # must not write its error file, reset its progress or die for its lifeline.
        for name in SUPERVISION_VARIABLES:
            os.environ.pop(name, None)
    return dict(RUNTIME.supervision)


# What supervision set up for the life of the process, which reset() leaves alone: the contract this
# process was started with, what each once-only step did, the progress file's one writer.
_CONTRACT: list[WorkerContract] = []
_DONE_ONCE: dict[str, str | None] = {}
_WRITER: list[ProgressWriter] = []


def _once(step: Callable[[WorkerContract], str | None]) -> Callable[[WorkerContract], str | None]:
    """``step`` taken once per process (a thread, a signal handler); later calls say what it did."""

    def once(contract: WorkerContract) -> str | None:
        if step.__name__ not in _DONE_ONCE:
            _DONE_ONCE[step.__name__] = step(contract)
        return _DONE_ONCE[step.__name__]

    return once


def _die_with_launcher(contract: WorkerContract) -> str | None:
    launcher = contract.launcher_pid
    if launcher is None:
        return None
    done = []
    # Only when the launcher started this process itself (not through `sh -c ...`, whose death
    # would then kill it); and armed before the check, so a launcher dying in between is seen.
    if sys.platform.startswith("linux") and os.getppid() == launcher:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
            done.append("PR_SET_PDEATHSIG")
            if os.getppid() != launcher:
                os.killpg(os.getpgrp(), signal.SIGKILL)  # the launcher died before the signal was armed
    fd = contract.lifeline_fd
    if fd is not None:
        threading.Thread(target=_wait_for_end_of_file, args=(fd,), name="tfstrategy-lifeline",
                         daemon=True).start()
        done.append("lifeline")
    return " + ".join(done) or None


def _wait_for_end_of_file(fd: int) -> None:
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    # The launcher is gone: end this worker and everything in its process group.
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _record_errors(contract: WorkerContract) -> str | None:
    if contract.error_file is None:
        return None
    path = str(contract.error_file)
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        # The traceback first: the launcher stops the group as soon as the file is there, and a worker
        # stopped mid-traceback showed its first line only (CI, 2026-12-07).
        try:
            previous(kind, error, tb)
            with contextlib.suppress(OSError, ValueError, AttributeError):  # a closed or missing stderr
                sys.stderr.flush()
        finally:
            try:
                write_error(path, error.with_traceback(tb))
            except Exception:  # a full disk must not lose the launcher its report; the traceback is out
                pass

    RUNTIME.override_attribute(sys, "excepthook", excepthook, name="record_errors",
                               note="the first uncaught exception goes to the launcher's error file")
    return f"the first uncaught exception goes to {path}"


def _dump_stacks(contract: WorkerContract) -> str | None:
    if contract.progress_file is None:
        return None
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a crash: the process is ending anyway
    stderr_fd = sys.stderr.fileno()
    faulthandler.register(FROZEN_STACK_SIGNAL, file=stderr_fd, all_threads=True, chain=False)
    if threading.current_thread() is not threading.main_thread():
        # Only the main thread can set the wakeup descriptor: faulthandler's handler, unsafe as it is.
        faulthandler.register(STACK_SIGNAL, file=stderr_fd, all_threads=True, chain=False)
        return f"every thread's stack on {STACK_SIGNAL.name} (from the signal handler) and on a crash"
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.signal(STACK_SIGNAL, _stack_request)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if previous != -1:  # somebody's event loop owns the wakeup descriptor: leave it theirs
        signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        faulthandler.register(STACK_SIGNAL, file=stderr_fd, all_threads=True, chain=False)
        return f"every thread's stack on {STACK_SIGNAL.name} (from the signal handler) and on a crash"
    threading.Thread(target=_print_stacks_on_request, args=(read_end, stderr_fd),
                     name="tfstrategy-stacks", daemon=True).start()
    # Registered before TensorFlow's, so it runs after them (atexit is last in, first out).
    atexit.register(_stacks_at_exit, stderr_fd)
    return f"every thread's stack on {STACK_SIGNAL.name} and on a crash"


def _stacks_at_exit(stderr_fd: int) -> None:
    """After the last exit handler, Python resets its handlers to the default, and the default of
    :data:`STACK_SIGNAL` ends the process: a worker still in TensorFlow's teardown (waiting for its
    peers) would be killed by the launcher's request for stacks. From here faulthandler answers it
    (our thread no longer runs once Python finalizes), over an ignored signal Python leaves alone."""
    signal.signal(STACK_SIGNAL, signal.SIG_IGN)
    faulthandler.register(STACK_SIGNAL, file=stderr_fd, all_threads=True, chain=False)


def _stack_request(signum: int, frame: object) -> None:
    """The Python-level handler the wakeup descriptor needs; the printing is done by our thread."""


def _print_stacks_on_request(read_end: int, stderr_fd: int) -> None:
    """Print every thread's stack each time :data:`STACK_SIGNAL`'s number arrives on ``read_end``.

    Python writes each caught signal's number to the wakeup descriptor from its C handler, at
    once, even while the main thread is blocked in TensorFlow; this thread then takes the GIL, so
    no other thread's frames change while they are read.
    """
    while True:
        try:
            numbers = os.read(read_end, 512)
        except OSError:
            return
        if not numbers:
            return
        if int(STACK_SIGNAL) in numbers:
            faulthandler.dump_traceback(file=stderr_fd, all_threads=True)


def _heartbeat(contract: WorkerContract) -> str | None:
    if contract.progress_file is None:
        return None
    path = str(contract.progress_file)
    if not _WRITER:  # the file, its thread and its exit handler: once per process
        writer = ProgressWriter(path)
        _WRITER.append(writer)

        def beat() -> None:
            writer.beat()
            _sample_ledger()

        threading.Thread(target=heartbeat_loop, args=(beat, _sample_stacks), name="tfstrategy-heartbeat",
                         daemon=True).start()
        # Exit handlers run once every non-daemon thread has ended: the script is done. Registered before
        # TensorFlow is imported, this one runs after TensorFlow's own handlers (quick); the slow part, the
        # interpreter's and TensorFlow's teardown, comes after every handler, while the heartbeat is still.
        atexit.register(writer.finishing)
    if _WRITER[0] not in RUNTIME.progress:
        RUNTIME.progress.append(_WRITER[0])  # job state: reset() clears it, the re-arm puts it back
    return f"heartbeat and batches in {path}"


def heartbeat_loop(beat: Callable[[], None], sample_stacks: Callable[[], None], *,
                   sleep: Callable[[float], None] = time.sleep, draw: Callable[[], float] | None = None) -> None:
    """The heartbeat thread's schedule: ``beat()`` every :data:`~tfstrategy.contract.reports.HEARTBEAT_SECONDS` or
    so, ``sample_stacks()`` between, :data:`~tfstrategy.contract.reports.SAMPLES_PER_HEARTBEAT` samples a heartbeat
    in all, each pause drawn (:func:`~tfstrategy.contract.reports.sample_pause`); runs until ``sleep`` raises."""
    for sample in itertools.count():
        if sample % SAMPLES_PER_HEARTBEAT == 0:
            beat()
        else:
            sample_stacks()
        sleep(sample_pause(HEARTBEAT_SECONDS / SAMPLES_PER_HEARTBEAT, draw))


def _sample_stacks() -> None:
    """Sample what the worker's threads run for its ledger, if kept (between two of its samples); never raises."""
    _with_keeper(LedgerKeeper.sample_stacks)


def _sample_ledger() -> None:
    """Sample the worker's ledger, if kept (it writes its file at most once a second); never raises."""
    _with_keeper(LedgerKeeper.sample)


def _with_keeper(sample: Callable[[LedgerKeeper], object]) -> None:
    keeper = current_keeper()
    if keeper is not None:
        try:
            sample(keeper)
        except Exception:  # the heartbeat must go on whatever the ledger does
            pass


def progress_callbacks(keras: object) -> tuple[Any, Any] | None:
    """Two ``keras.callbacks.Callback``: one to put first (a batch ended), one last (a batch begins).

    So a batch counts as ended before the script's own ``on_*_batch_end`` callbacks run, and as
    begun only after its ``on_*_batch_begin`` ones: time spent in the script's callbacks is
    "outside the step", where the launcher looks for a worker its peers wait for.
    ``None`` outside ``tfstrategy launch``.
    """
    if not RUNTIME.progress:
        return None
    writer = RUNTIME.progress[0]
    keeper = current_keeper()
    if keeper is None:
        return _counting_callbacks(keras, writer)
    return _ledger_callbacks(keras, writer, keeper)


def _counting_callbacks(keras: Any, writer: ProgressWriter) -> tuple[Any, Any]:
    """The two callbacks without a ledger: the progress file only."""

    class BatchEnded(keras.callbacks.Callback):
        """Counts finished batches for ``tfstrategy launch`` (stall detection); added by its start-up hook."""

        # Never asks for the logs as numbers, so it adds no synchronisation to a step.
        _supports_tf_logs = True

        def _end(self, batch: int, logs: Logs = None) -> None:
            writer.step_ends()

        on_train_batch_end = on_test_batch_end = on_predict_batch_end = _end

        # A dataset of unknown length ends inside a begun batch (Keras calls on_*_batch_begin, then
        # the data runs out and it breaks off): the epoch's end says the step is over (the call's
        # end says it in _with_progress).
        def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
            writer.steps_over()

    class BatchBegins(keras.callbacks.Callback):
        """Marks "inside a step" for ``tfstrategy launch``; added by its start-up hook."""

        _supports_tf_logs = True

        def _begin(self, batch: int, logs: Logs = None) -> None:
            writer.step_begins()

        on_train_batch_begin = on_test_batch_begin = on_predict_batch_begin = _begin

    return BatchEnded(), BatchBegins()


def _ledger_callbacks(keras: Any, writer: ProgressWriter, keeper: LedgerKeeper) -> tuple[Any, Any]:
    """The two callbacks with the worker's ledger: its train batches, epochs and end of data too."""

    class BatchEnded(keras.callbacks.Callback):
        """Counts finished batches for ``tfstrategy launch`` (stall detection, the ledger); added by its start-up hook."""

        _supports_tf_logs = True

        def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
            writer.step_ends()
            keeper.batch_ends(batch)

        def _end(self, batch: int, logs: Logs = None) -> None:
            writer.step_ends()

        on_test_batch_end = on_predict_batch_end = _end

        def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
            writer.steps_over()
            keeper.epoch_ends()  # a batch begun and never ended: its data ran out

    class BatchBegins(keras.callbacks.Callback):
        """Marks "inside a step" for ``tfstrategy launch`` (and the ledger's epochs); added by its start-up hook."""

        _supports_tf_logs = True

        def on_epoch_begin(self, epoch: int, logs: Logs = None) -> None:
            planned = steps if isinstance(steps := (self.params or {}).get("steps"), int) else None
            keeper.epoch_begins(epoch, planned)

        def on_train_batch_begin(self, batch: int, logs: Logs = None) -> None:
            keeper.batch_begins(batch)
            writer.step_begins()

        def _begin(self, batch: int, logs: Logs = None) -> None:
            writer.step_begins()

        on_test_batch_begin = on_predict_batch_begin = _begin

    return BatchEnded(), BatchBegins()


def count_batches(flavours: list[Any]) -> str | None:
    """Make ``Model.fit``/``evaluate``/``predict`` of each Keras in ``flavours`` report batches to the launcher.

    Installed as undoable rewrites (:mod:`tfstrategy.runtime.rewrites`); ``None`` outside ``tfstrategy launch``.
    """
    if not RUNTIME.progress:
        return None
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite

    for keras in flavours:
        factories = {f"Model.{method}": functools.partial(_with_progress, keras=keras, method=method,
                                                          position=_CALLBACKS_POSITION[method])
                     for method in _CALLBACKS_POSITION}
        install_rewrite(Rewrite(f"count_batches:{keras.__name__}", lambda k=keras: k, factories))
    return "Model.fit, evaluate and predict report their batches to the launcher"


#: Where ``callbacks`` is among the positional arguments (after ``self``).
_CALLBACKS_POSITION = {"fit": 5, "evaluate": 6, "predict": 4}


def _with_progress(original: Callable[..., object], keras: object, position: int, method: str) -> Callable[..., object]:
    def wrapper(model: Model, *args: Any, **kwargs: Any) -> object:
        keeper = current_keeper()
        if keeper is not None:
            keeper.call_begins(method)
        given = args[position] if len(args) > position else kwargs.get("callbacks")
        # A CallbackList is fit's own, handed to its validation's evaluate: already counted.
        pair = progress_callbacks(keras) if given is None or isinstance(given, (list, tuple)) else None
        if pair is not None:
            RUNTIME.hook.changed("count_batches", f"{getattr(original, '__name__', 'fit')}'s batches counted for the launcher")
            first, last = pair
            if len(args) > position:  # callbacks passed positionally
                args = (*args[:position], [first, *(given or []), last], *args[position + 1:])
            else:
                kwargs["callbacks"] = [first, *(given or []), last]
        normally = False
        try:
            result = original(model, *args, **kwargs)
            normally = True
            return result
        finally:
            if pair is not None and RUNTIME.progress:  # however it ended, no step of this call is running now
                RUNTIME.progress[0].steps_over()
            if keeper is not None:
                keeper.call_ends(method, normally=normally)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    wrapper.__doc__ = original.__doc__
    return wrapper
