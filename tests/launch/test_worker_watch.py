"""The worker's side of supervision in a small real Python process (no TensorFlow: milliseconds each)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import ROOT
from tfstrategy.launch.reports import read_error, read_progress
from tfstrategy.runtime.worker_hook import hook_environment
from tfstrategy.worker_contract import FROZEN_STACK_SIGNAL

SCRIPT = """
import os, sys, time, subprocess
print("env", [k for k in os.environ if k in ("TFSTRATEGY_ERROR_FILE", "TFSTRATEGY_PROGRESS_FILE")], flush=True)
def users_function():
    raise RuntimeError("the user's own bug")
if sys.argv[1] == "raise":
    users_function()
if sys.argv[1] == "raise-watched":  # says on each traceback line whether the launcher could see the error file
    class Watched:
        def __init__(self, stream):
            self.stream = stream
        def write(self, text):
            seen = os.path.exists(os.environ.get("WATCHED_ERROR_FILE", ""))
            return self.stream.write(text.replace("\\n", " [file seen]\\n" if seen else " [file not yet]\\n"))
        def flush(self):
            self.stream.flush()
    os.environ["WATCHED_ERROR_FILE"] = os.path.join(os.path.dirname(sys.argv[0]), "error.json")
    sys.stderr = Watched(sys.stderr)
    users_function()
if sys.argv[1] == "child":
    child = subprocess.run([sys.executable, "-c", "import os; print('child env', os.environ.get('TFSTRATEGY_ERROR_FILE'))"],
                           capture_output=True, text=True)
    print(child.stdout.strip(), flush=True)
if sys.argv[1] == "busy":
    import threading
    def churn(n):
        return n if n == 0 else churn(n - 1)
    def forever():
        while True:
            churn(40)
    for _ in range(2):
        threading.Thread(target=forever, daemon=True).start()
    print("busy", flush=True)
    forever()
if sys.argv[1] == "late":
    import signal
    class Late:
        def __del__(self):  # runs as Python finalizes, after every exit handler
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.5)
            print("survived", flush=True)
    late = Late()
if sys.argv[1] == "frozen":  # a C call that keeps Python's lock: ctypes.PyDLL does not release it
    import ctypes
    def users_frozen_call():
        print("frozen", flush=True)
        ctypes.PyDLL(None).sleep(120)
    users_frozen_call()
if sys.argv[1] == "wait":
    print("waiting", flush=True)
    time.sleep(60)
if sys.argv[1] == "input":  # blocked reading its input: a FIFO nobody writes
    import pathlib, tempfile
    fifo = pathlib.Path(tempfile.mkdtemp()) / "input"
    os.mkfifo(fifo)
    print("waiting", flush=True)
    fifo.read_text()
"""


def _worker(tmp_path, mode: str, **popen):
    env = {
        **hook_environment(env=dict(os.environ)),
        "TFSTRATEGY_ERROR_FILE": str(tmp_path / "error.json"),
        "TFSTRATEGY_PROGRESS_FILE": str(tmp_path / "progress"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src" / "tfstrategy" / "runtime" / "startup"), str(ROOT / "src")]),
    }
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return subprocess.Popen([sys.executable, str(script), mode], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **popen)


def test_the_first_uncaught_exception_is_recorded_with_the_users_frame(tmp_path):
    process = _worker(tmp_path, "raise")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "RuntimeError: the user's own bug" in err  # the usual traceback too
    record = read_error(tmp_path / "error.json")
    assert (record.type, record.message) == ("RuntimeError", "the user's own bug")
    assert record.frame == f"{tmp_path / 'script.py'}:5 in users_function"
    assert abs(record.time - time.time()) < 60


def test_the_traceback_is_out_before_the_error_file_that_makes_the_launcher_stop_the_group(tmp_path):
    """The launcher stops every worker once the error file is there: a worker that wrote it first was stopped
    with one line of its traceback shown (CI, 2026-12-07)."""
    process = _worker(tmp_path, "raise-watched")
    _, err = process.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.endswith(("[file seen]", "[file not yet]"))]
    assert lines[0].startswith("Traceback") and lines[-1].startswith("RuntimeError: the user's own bug"), err
    assert all(line.endswith("[file not yet]") for line in lines), err
    assert read_error(tmp_path / "error.json").message == "the user's own bug"


def test_a_python_process_the_worker_starts_does_not_inherit_its_supervision(tmp_path):
    process = _worker(tmp_path, "child")
    out, _ = process.communicate(timeout=60)
    assert "env []" in out and "child env None" in out
    # Its script ended: the exit handler said so (the launcher's monitor then takes a still heartbeat
    # for the teardown, not a freeze).
    assert read_progress(tmp_path / "progress").finishing


@pytest.mark.parametrize("mode", [pytest.param("wait", id="sleeping"), pytest.param("input", id="blocked-on-input")])
def test_the_heartbeat_beats_and_a_stack_signal_prints_every_threads_stack(tmp_path, mode):
    """A worker blocked in a call (a sleep, a read of its input nobody writes) beats and prints its stack on request.

    The launcher's side of a worker blocked on its input (a stall "outside its step", as a busy callback) is
    test_faults.py's busy case; this is the dump from inside the blocking read.
    """
    process = _worker(tmp_path, mode)
    try:
        assert process.stdout.readline().startswith("env") and process.stdout.readline() == "waiting\n"
        first = read_progress(tmp_path / "progress").heartbeat
        deadline = time.monotonic() + 30
        while read_progress(tmp_path / "progress").heartbeat == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read_progress(tmp_path / "progress").heartbeat > first
        assert not read_progress(tmp_path / "progress").finishing  # its script runs
        process.send_signal(signal.SIGUSR2)
        time.sleep(0.5)
    finally:
        process.kill()
    _, err = process.communicate(timeout=30)
    assert "tfstrategy-heartbeat" in err or "Thread 0x" in err
    assert 'script.py", line' in err and "in <module>" in err


def test_a_frozen_worker_holding_pythons_lock_prints_its_stack_on_the_frozen_stack_signal(tmp_path):
    """No thread of Python's runs in a frozen worker (its heartbeat is still), so the thread that answers
    STACK_SIGNAL cannot; faulthandler's handler answers FROZEN_STACK_SIGNAL without Python's lock."""
    process = _worker(tmp_path, "frozen")
    try:
        assert process.stdout.readline().startswith("env") and process.stdout.readline() == "frozen\n"
        process.send_signal(FROZEN_STACK_SIGNAL)
        lines = []
        while not any("in users_frozen_call" in line for line in lines):  # waits on the line, not on a time
            line = process.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
    finally:
        process.kill()
        process.communicate(timeout=30)
    assert any(line.startswith(("Current thread", "Thread 0x")) for line in lines), "".join(lines)


def test_stacks_are_printed_by_a_thread_holding_the_gil_and_a_busy_worker_survives_many_requests(tmp_path):
    # faulthandler's own handler read the other threads' frames while they ran: a worker tracing
    # its step died of SIGSEGV after the launcher asked for its stacks.
    import queue
    import threading

    process = _worker(tmp_path, "busy")
    dumps: queue.Queue[str] = queue.Queue()
    lines: list[str] = []

    def read() -> None:
        for line in process.stderr:
            lines.append(line)
            if line.startswith("Current thread"):
                dumps.put(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        assert process.stdout.readline().startswith("env") and process.stdout.readline() == "busy\n"
        for _ in range(25):
            process.send_signal(signal.SIGUSR2)
            dumps.get(timeout=60)  # each request answered before the next
        assert process.poll() is None
    finally:
        process.kill()
        process.wait(timeout=30)
    err = "".join(lines)
    assert "in _print_stacks_on_request" in err  # printed by our thread, not inside the signal handler
    assert "in churn" in err and "in forever" in err


def test_a_stack_request_while_python_finalizes_does_not_kill_the_worker(tmp_path):
    # Python resets its signal handlers to the default as it finalizes: a worker in TensorFlow's
    # teardown was killed by the launcher's request for stacks (SIGUSR2's default ends a process).
    process = _worker(tmp_path, "late")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and "survived" in out, (process.returncode, err[-2000:])


@pytest.fixture
def progress_file(tmp_path):
    """The hook's progress file, as under launch; the hook's state forgotten afterwards."""
    from tfstrategy.launch.reports import ProgressWriter
    from tfstrategy.state.registry import RUNTIME

    RUNTIME.progress.append(ProgressWriter(tmp_path / "progress"))
    yield tmp_path / "progress"
    RUNTIME.progress.clear()


def test_fit_counts_train_and_validation_batches_and_keeps_the_users_callbacks(tmp_path, progress_file):
    import keras
    import numpy as np

    from tfstrategy.runtime import worker_watch

    seen = []

    class Users(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(read_progress(tmp_path / "progress"))

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((12, 2), "float32"), np.zeros((12, 1), "float32")
    fit = worker_watch._with_progress(keras.Model.fit, keras, worker_watch._CALLBACKS_POSITION["fit"], "fit")
    fit(model, x, y, batch_size=4, epochs=2, verbose=0, callbacks=[Users()], validation_data=(x, y))
    progress = read_progress(tmp_path / "progress")
    assert progress.steps == 2 * (3 + 3) and not progress.in_step  # 3 train + 3 validation batches per epoch
    # The user's batch-end callback runs after the batch counted as ended: "outside the step".
    assert [(p.steps, p.in_step) for p in seen[:3]] == [(1, False), (2, False), (3, False)]


def test_a_dataset_of_unknown_length_leaves_no_step_begun_after_each_epoch_and_evaluate(tmp_path, progress_file):
    """Keras begins one more batch of such a dataset, finds the data over and breaks off: no step runs then."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfstrategy.runtime import worker_watch

    at_epoch_end = []

    class Users(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            at_epoch_end.append(read_progress(tmp_path / "progress"))

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    rows = tf.data.Dataset.from_tensor_slices((np.zeros((12, 2), "float32"), np.zeros((12, 1), "float32")))
    data = rows.filter(lambda x, y: True).batch(4)  # filter: the length is unknown until the data runs out
    assert data.cardinality() == tf.data.UNKNOWN_CARDINALITY
    fit = worker_watch._with_progress(keras.Model.fit, keras, worker_watch._CALLBACKS_POSITION["fit"], "fit")
    fit(model, data, epochs=2, verbose=0, callbacks=[Users()])
    evaluate = worker_watch._with_progress(keras.Model.evaluate, keras, worker_watch._CALLBACKS_POSITION["evaluate"],
                                          "evaluate")
    evaluate(model, data, verbose=0)
    assert [(p.steps, p.in_step) for p in at_epoch_end] == [(3, False), (6, False)]
    progress = read_progress(tmp_path / "progress")
    assert (progress.steps, progress.in_step) == (9, False)  # 2 x 3 train batches, 3 evaluated


def test_reset_forgets_the_hooks_state():
    from tfstrategy.state.registry import RUNTIME, reset

    RUNTIME.hook.steps.append(("x", "y"))
    RUNTIME.supervision["heartbeat"] = "in a file"
    reset()
    assert RUNTIME.hook.steps == [] and RUNTIME.supervision == {} and RUNTIME.plans == {}


def test_reset_runs_what_the_process_keeps_armed_after_clearing_the_job():
    from tfstrategy.state.registry import RUNTIME, ProcessRuntime

    runtime = ProcessRuntime()
    seen = []
    runtime.keep_armed("t:hook", lambda: seen.append(dict(runtime.supervision)) or runtime.supervision.update(hb="x"))
    runtime.supervision["hb"] = "old"
    runtime.hook.steps.append(("x", "y"))
    runtime.reset()
    assert seen == [{}]  # armed after the job's state was cleared
    assert runtime.supervision == {"hb": "x"} and runtime.hook.steps == []
    assert RUNTIME is not runtime


@pytest.mark.multiprocess
def test_a_launched_worker_that_resets_and_trains_again_keeps_its_batch_counts_and_ledger(tmp_path):
    import json

    from helpers import run_cli

    result = run_cli("launch", "-n", "1", "--timeout", "120", "--", sys.executable,
                     str(ROOT / "tests" / "workers" / "reset_worker.py"), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    seen = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("[worker 0] {"))[11:])
    assert (seen["first"], seen["second"]) == (4, 7)  # the second fit's 3 batches counted on
    assert seen["rearmed"] == seen["armed"] == ["die_with_launcher", "dump_stacks", "heartbeat", "record_errors"]
    assert seen["ledger"] == [3, "fit"]  # the second job's ledger, kept by the heartbeat


class _Enough(Exception):
    """Ends the heartbeat's loop."""


def test_the_heartbeats_drawn_pauses_leave_pythons_shared_random_numbers_to_the_script():
    """The full suite, when the pauses were first drawn from Python's shared generator: 13 launched jobs (the corpus,
    the launch and fault tests) trained to other weights than one process, as Keras draws its layers' seeds from it
    after the script's ``keras.utils.set_random_seed``. The heartbeat draws from a generator of its own."""
    import random

    from tfstrategy.runtime.worker_watch import heartbeat_loop

    pauses, calls = [], []

    def sleep(pause):
        pauses.append(pause)
        if len(pauses) == 20:
            raise _Enough

    random.seed(5)
    state = random.getstate()
    with pytest.raises(_Enough):
        heartbeat_loop(lambda: calls.append("beat"), lambda: calls.append("stacks"), sleep=sleep)
    assert random.getstate() == state
    assert calls == ["beat", "stacks", "stacks", "stacks", "stacks"] * 4  # 5 samples a beat, the beat's one of them
    assert len(set(pauses)) == 20 and all(0.025 <= pause <= 0.075 for pause in pauses)  # 0.05 s each on average
