"""The worker's ledger (issue 38): the keeper's counts, end of data, write throttling, and the traced fingerprints.

The keeper runs on fake clocks and a fake writer; the fingerprints and the Keras callbacks on real TensorFlow.
"""

from __future__ import annotations

import copy
import os
import sys
import sysconfig
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfstrategy.launch.ledger import Ledger, ledger_path, read_ledger
from tfstrategy.launch.reports import ProgressWriter
from tfstrategy.runtime import worker_watch
from tfstrategy.runtime.inputs import PlanInputs
from tfstrategy.runtime.ledger import LedgerKeeper, current_keeper
from tfstrategy.runtime.ledger_traces import summarize_graph
from tfstrategy.runtime.steps import KeepLedger
from tfstrategy.stacks import TensorFlowRuns, user_frame_of, users_code_tensorflow_runs
from tfstrategy.state.registry import RUNTIME


class Clock:
    """A settable clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def keeper_on_fakes(tmp_path: Path) -> tuple[LedgerKeeper, Clock, Clock, list[Ledger]]:
    clock, cpu, written = Clock(), Clock(), []
    keeper = LedgerKeeper(tmp_path / "w.progress.ledger", clock=clock, cpu_clock=cpu, wall=lambda: 1e9,
                          frame=lambda: "train.py:7 in main", write=lambda path, ledger: written.append(ledger))
    return keeper, clock, cpu, written


def test_batches_and_steps_are_counted_per_epoch_and_in_all(tmp_path):
    keeper, *_ = keeper_on_fakes(tmp_path)
    keeper.call_begins("fit")
    keeper.epoch_begins(0, planned=4)
    for _ in range(4):
        keeper.batch_begins()
        keeper.batch_ends()
    keeper.epoch_ends()
    keeper.epoch_begins(1, planned=4)
    keeper.batch_begins()
    keeper.batch_ends()
    keeper.batch_begins()  # inside the second batch of epoch 1
    ledger = keeper.ledger()
    assert (ledger.epoch, ledger.batches, ledger.steps, ledger.total_steps) == (1, 2, 1, 5)
    assert ledger.end_of_data == () and ledger.frame == "train.py:7 in main"
    assert ledger.extra == {"loop": "fit", "epoch_steps": 4, "in_batch": True, "call": "fit",
                            "tracing": None}


def test_keras_step_numbers_count_every_step_of_a_multi_step_batch(tmp_path):
    keeper, *_ = keeper_on_fakes(tmp_path)
    keeper.epoch_begins(0)
    keeper.batch_begins(0)
    keeper.batch_ends(3)  # steps_per_execution=4: one callback for steps 0-3
    keeper.batch_begins(4)
    keeper.batch_ends(7)
    assert (keeper.batches, keeper.steps, keeper.total_steps) == (5, 8, 8)


def test_a_batch_begun_and_never_ended_at_the_epochs_end_is_the_data_running_out(tmp_path):
    keeper, *_ = keeper_on_fakes(tmp_path)
    keeper.call_begins("fit")
    keeper.epoch_begins(2)
    for _ in range(31):
        keeper.batch_begins()
        keeper.batch_ends()
    keeper.batch_begins()  # batch 32 finds no data
    keeper.call_begins("evaluate")  # fit's validation runs before the epoch's end: it must not hide that
    keeper.call_ends("evaluate", normally=True)
    keeper.epoch_ends()
    assert keeper.ledger().end_of_data == ((2, 32),)
    # An epoch whose batches all ended: nothing more.
    keeper.epoch_begins(3)
    keeper.batch_begins()
    keeper.batch_ends()
    keeper.epoch_ends()
    assert keeper.ledger().end_of_data == ((2, 32),)


def test_fit_returning_inside_a_begun_batch_ran_out_of_data_but_an_abort_did_not(tmp_path):
    keeper, *_ = keeper_on_fakes(tmp_path)
    keeper.call_begins("fit")
    keeper.epoch_begins(0)
    keeper.batch_begins()
    keeper.call_ends("fit", normally=False)  # an exception (a collective abort) inside the step
    assert keeper.end_of_data == () and not keeper.in_batch
    keeper.call_begins("fit")
    keeper.epoch_begins(0)
    keeper.batch_begins()
    keeper.call_ends("fit", normally=True)
    assert keeper.end_of_data == ((0, 1),)


def test_the_file_is_written_at_most_once_a_second_and_only_on_change(tmp_path):
    keeper, clock, _, written = keeper_on_fakes(tmp_path)
    assert keeper.sample() and len(written) == 1  # the first sample writes at once
    keeper.epoch_begins(0)
    keeper.batch_begins()
    for now in (0.25, 0.5, 0.75):  # changed, but written less than a second ago
        clock.now = now
        assert not keeper.sample()
    clock.now = 1.0
    assert keeper.sample() and written[-1].batches == 1 and written[-1].time == 1e9
    for now in (2.0, 3.0):  # a second later, nothing changed
        clock.now = now
        assert not keeper.sample()
    keeper.batch_ends()
    clock.now = 3.1  # changed, and the last write is 2.1 s old: at once
    assert keeper.sample() and written[-1].steps == 1
    keeper.batch_begins()
    clock.now = 3.5
    assert not keeper.sample()
    assert keeper.flush() and written[-1].batches == 2  # at exit: at once
    assert not keeper.flush()
    assert keeper.writes == len(written) == 4


def test_step_input_and_cpu_seconds_per_step_come_from_the_samples(tmp_path):
    keeper, clock, cpu, _ = keeper_on_fakes(tmp_path)
    keeper.epoch_begins(0)
    assert keeper.ledger().step_seconds is None  # no steps sampled yet
    for _ in range(8):  # each step: 0.03 s waiting for input, 0.07 s inside; 0.05 s of CPU
        keeper.sample()
        clock.now += 0.03
        keeper.batch_begins()
        clock.now += 0.07
        cpu.now += 0.05
        keeper.batch_ends()
    keeper.sample()
    ledger = keeper.ledger()
    assert ledger.step_seconds == pytest.approx(0.1)
    assert ledger.input_seconds == pytest.approx(0.03 * 7 / 8)  # the first step had no step before it
    assert ledger.cpu_seconds == pytest.approx(0.05)


def _keeper_seeing(tmp_path: Path, runs: list[TensorFlowRuns]) -> tuple[LedgerKeeper, Clock, Clock]:
    """A keeper on fake clocks whose samples see ``runs[0]`` (set it between samples)."""
    clock, cpu = Clock(), Clock()
    keeper = LedgerKeeper(tmp_path / "w.progress.ledger", clock=clock, cpu_clock=cpu, wall=lambda: 1e9,
                          frame=lambda: "", runs=lambda: runs[0], write=lambda path, ledger: None)
    return keeper, clock, cpu


def test_input_read_inside_the_step_is_the_time_the_heartbeat_saw_tf_data_run_the_users_code(tmp_path):
    runs = [TensorFlowRuns()]
    keeper, clock, cpu = _keeper_seeing(tmp_path, runs)
    keeper.epoch_begins(0)
    for _ in range(8):  # fit: the next batch is read inside the step, no time between steps
        keeper.batch_begins()
        for tick in range(4):  # 4 samples a step, 0.1 s apart; the generator seen in 3 of them
            runs[0] = TensorFlowRuns(input=tick > 0)
            clock.now += 0.1
            keeper.sample()
        cpu.now += 0.01
        keeper.batch_ends()
    ledger = keeper.ledger()
    assert ledger.step_seconds == pytest.approx(0.4)
    assert ledger.input_seconds == pytest.approx(0.3)  # inside the step: the time between steps is 0
    assert ledger.cpu_seconds == pytest.approx(0.01)
    assert (ledger.py_function_seconds, ledger.py_function) == (0.0, "")


def test_a_py_function_is_timed_apart_from_input_with_the_function_seen_most(tmp_path):
    decode, scale = "/job/train.py:12 in decode", "/job/train.py:30 in scale"
    runs = [TensorFlowRuns()]
    keeper, clock, cpu = _keeper_seeing(tmp_path, runs)
    keeper.epoch_begins(0)
    for _ in range(8):
        keeper.batch_begins()
        # 4 samples a step: decode seen in 2 (once beside the generator), scale in 1, nothing in 1.
        for seen in (TensorFlowRuns(py_functions=(decode,)), TensorFlowRuns(input=True, py_functions=(decode,)),
                     TensorFlowRuns(py_functions=(scale,)), TensorFlowRuns()):
            runs[0] = seen
            clock.now += 0.1
            keeper.sample()
        cpu.now += 0.3  # (a py_function burns CPU too: the CPU seconds stay the CPU seconds)
        keeper.batch_ends()
    ledger = keeper.ledger()
    assert ledger.step_seconds == pytest.approx(0.4)
    assert ledger.py_function_seconds == pytest.approx(0.3)  # never added to the input's 0.1
    assert ledger.input_seconds == pytest.approx(0.1)
    assert ledger.cpu_seconds == pytest.approx(0.3)
    assert ledger.py_function == decode
    assert Ledger.from_json(ledger.to_json()) == ledger  # the file carries both


def test_a_stack_that_cannot_be_read_counts_as_nothing(tmp_path):
    clock = Clock()

    def broken() -> TensorFlowRuns:
        raise RuntimeError("no stacks")

    keeper = LedgerKeeper(tmp_path / "l", clock=clock, cpu_clock=Clock(), frame=lambda: "", runs=broken,
                          write=lambda path, ledger: None)
    for _ in range(3):
        clock.now += 0.1
        keeper.sample()
    assert keeper.input_seconds == keeper.py_function_seconds == 0.0


def test_a_from_generator_generator_is_input_and_a_plain_call_is_nothing():
    def examples():
        for _ in range(2):
            yield users_code_tensorflow_runs(sys._getframe()) == ("input", "")

    dataset = tf.data.Dataset.from_generator(examples, output_signature=tf.TensorSpec((), tf.bool))
    assert [bool(value) for value in dataset] == [True, True]
    assert users_code_tensorflow_runs(sys._getframe()) is None


def _place(function) -> str:
    code = function.__code__
    return f"{code.co_filename}:{code.co_firstlineno} in {code.co_name}"


def test_a_py_function_in_a_map_and_a_numpy_function_in_a_step_are_py_functions_named_by_the_users_function():
    # Neither is input: the stack cannot tell a map's from a step's (a slow numpy_function in the loss
    # must not be "waits for its input").
    seen = []

    def decode(value):
        seen.append(users_code_tensorflow_runs(sys._getframe()))
        return value

    list(tf.data.Dataset.range(2).map(lambda x: tf.py_function(decode, [x], tf.int64)))
    parallel = tf.data.Dataset.range(2).map(lambda x: tf.numpy_function(decode, [x], tf.int64), num_parallel_calls=2)
    list(parallel)

    @tf.function
    def step(x):
        return tf.numpy_function(decode, [x], tf.float32, stateful=True) * 2.0

    step(tf.constant(1.0))
    assert seen == [("py_function", _place(decode))] * 5


class _Frame:
    """A stand-in for a Python frame: its code's file name, first line and name, and its caller."""

    def __init__(self, filename: str, back: _Frame | None = None, name: str = "f", line: int = 1) -> None:
        self.f_code = type("Code", (), {"co_filename": filename, "co_name": name, "co_firstlineno": line})()
        self.f_back = back


def _stack(*frames: str | tuple[str, str, int]) -> _Frame | None:
    """A fake stack, the innermost frame first: a file name, or (file name, function, first line)."""
    frame = None
    for item in reversed(frames):
        filename, name, line = (item, "f", 1) if isinstance(item, str) else item
        frame = _Frame(filename, frame, name, line)
    return frame


def test_the_sampled_stacks_tell_a_py_function_from_a_generator_the_step_and_tensorflows_own_py_functions():
    library = sysconfig.get_paths()["purelib"]
    script_ops = os.path.join(library, "tensorflow", "python", "ops", "script_ops.py")
    autograph = os.path.join(library, "tensorflow", "python", "autograph", "impl", "api.py")
    from_generator = os.path.join(library, "tensorflow", "python", "data", "ops", "from_generator_op.py")
    users = os.path.abspath("train.py")
    # The user's function (calling a helper of its own), called by TensorFlow through autograph: a map's
    # on a tf.data thread and a step's on the step's thread look the same, and are named by the outer one.
    assert users_code_tensorflow_runs(_stack((users, "helper", 40), (users, "decode", 12), autograph, script_ops,
                                             script_ops)) == ("py_function", f"{users}:12 in decode")
    # A from_generator generator: tf.data's code calls it (through a numpy_function of its own).
    assert users_code_tensorflow_runs(_stack((users, "examples", 5), from_generator, script_ops)) == ("input", "")
    # TensorFlow's own Python function (no user frame), and the user's script's main thread.
    assert users_code_tensorflow_runs(_stack(autograph, script_ops)) is None
    assert users_code_tensorflow_runs(_stack(os.path.join(library, "keras", "src", "trainer.py"), users)) is None
    assert users_code_tensorflow_runs(None) is None


def test_the_models_weights_are_in_the_ledger_as_keras_creates_them(tmp_path, monkeypatch):
    from tfstrategy.runtime import ledger as ledger_module
    from tfstrategy.runtime.ledger_traces import fingerprint_traces
    from tfstrategy.runtime.rewrites import remove_rewrites

    keeper, _, _, written = keeper_on_fakes(tmp_path)
    monkeypatch.setattr(ledger_module, "_KEEPER", [keeper])
    fingerprint_traces()
    try:
        with tf.distribute.get_strategy().scope():  # the first scope() hooks Keras' weights
            pass
        keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="hidden"), keras.layers.Dense(1, name="out")])
    finally:
        remove_rewrites()
    assert keeper.sample()  # a new weight is written at the next sample, not a second later
    weights = written[-1].extra["weights"]
    assert weights == {"count": 4, "last": [[1, "hidden/kernel", "(4, 8)"], [2, "hidden/bias", "(8,)"],
                                            [3, "out/kernel", "(8, 1)"], [4, "out/bias", "(1,)"]]}


def test_the_users_frame_is_the_innermost_outside_the_libraries():
    class Probe:
        def __deepcopy__(self, memo):
            return sys._getframe(1)  # a frame of copy.py (the standard library)

    library_frame = copy.deepcopy(Probe())
    assert library_frame.f_code.co_filename.endswith("copy.py")
    where = user_frame_of(library_frame)
    assert where.startswith(f"{__file__}:") and where.endswith("in test_the_users_frame_is_the_innermost_outside_the_libraries")
    assert user_frame_of(None) == ""


def test_at_exit_the_ledger_keeps_the_last_frame_of_the_script_it_saw(tmp_path):
    frames = iter(["train.py:7 in main", ""])  # at exit no frame of the script is left
    keeper = LedgerKeeper(tmp_path / "l", clock=Clock(), cpu_clock=Clock(), frame=lambda: next(frames),
                          write=lambda path, ledger: None)
    assert keeper.ledger().frame == "train.py:7 in main"
    assert keeper.ledger().frame == "train.py:7 in main"


def _graph(fn, *specs):
    return tf.function(fn).get_concrete_function(*specs).graph


def test_fingerprints_tell_two_functions_apart_and_the_same_function_alike():
    w = tf.Variable(tf.ones((4, 2)))
    v = tf.Variable(tf.ones((4, 3)))

    def step(x):
        return tf.reduce_sum(tf.matmul(x, w))

    def other_loss(x):
        return tf.reduce_mean(tf.square(tf.matmul(x, w)))

    def other_model(x):
        return tf.reduce_sum(tf.matmul(x, v))

    spec = tf.TensorSpec((None, 4), tf.float32)
    first, again = summarize_graph(_graph(step, spec)), summarize_graph(_graph(step, spec))
    assert first.fingerprint() == again.fingerprint() and len(first.fingerprint()) == 16
    assert summarize_graph(_graph(other_loss, spec)).fingerprint() != first.fingerprint()
    assert summarize_graph(_graph(other_model, spec)).fingerprint() != first.fingerprint()  # same ops, other shape
    assert first.variables == [((4, 2), "float32")] and first.collectives == 0
    # Another batch size traces again, but computes the same: the same fingerprint.
    assert summarize_graph(_graph(step, tf.TensorSpec((8, 4), tf.float32))).fingerprint() == first.fingerprint()


@pytest.fixture
def kept(tmp_path):
    """The ``ledger`` step taken as under ``tfstrategy launch`` (a progress file), undone afterwards."""
    RUNTIME.progress.append(ProgressWriter(tmp_path / "worker-0.progress"))
    step = KeepLedger(PlanInputs(consumer="hook", under_launcher=True))
    assert step.take() is not None
    yield step
    step.undo()
    RUNTIME.progress.clear()


def test_the_step_fingerprints_each_traced_strategy_run_and_is_undone(kept, tmp_path):
    keeper = current_keeper()
    assert keeper is not None and keeper.path == ledger_path(tmp_path / "worker-0.progress")
    assert RUNTIME.replacement("ledger_traces") is not None
    strategy = tf.distribute.get_strategy()
    w = tf.Variable(tf.ones((3, 1)))

    tracing = []

    def replica_step(x):
        tracing.append(keeper.ledger().extra["tracing"])  # (runs while the function is traced)
        return tf.reduce_sum(tf.matmul(x, w))

    @tf.function
    def loop_step(x):
        return strategy.run(replica_step, args=(x,))

    @tf.function
    def same_step(x):
        return strategy.run(replica_step, args=(x,))

    @tf.function
    def other_step(x):
        return strategy.run(lambda x: tf.reduce_max(tf.matmul(x, w)), args=(x,))

    x = tf.ones((2, 3))
    loop_step(x)
    loop_step(x)  # no new trace: no new record
    same_step(x)
    keeper.call_begins("fit")
    other_step(x)
    strategy.run(replica_step, args=(x,))  # eager: nothing traced
    traces = keeper.functions
    assert tracing == ["custom", "custom", None] and keeper.tracing is None  # a trace in progress says so
    assert [trace.kind for trace in traces] == ["custom", "custom", "train"]
    assert traces[0].fingerprint == traces[1].fingerprint != traces[2].fingerprint
    assert traces[0].collectives == 0 and traces[0].summary.endswith(" ops, 1 variable read")
    assert keeper.ledger().extra["loop"] == "custom"
    keeper.flush()
    assert read_ledger(keeper.path).functions == traces
    kept.undo()
    assert current_keeper() is None and RUNTIME.replacement("ledger_traces") is None
    assert "run" not in vars(tf.distribute.Strategy)  # inherited again, as before the step


@pytest.fixture
def counted(kept):
    """The hook's ``count_batches`` rewrites of ``Model.fit``/``evaluate``/``predict``, removed afterwards."""
    assert worker_watch.count_batches([keras]) is not None
    yield
    RUNTIME.replacement(f"count_batches:{keras.__name__}").remove()


def test_the_keras_callbacks_feed_the_ledger_in_a_real_fit(counted):
    keeper = current_keeper()
    with tf.distribute.get_strategy().scope():  # where a model is built (the first scope() hooks its weights)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="dense")])
    model.compile(optimizer="sgd", loss="mse")
    fit = model.fit
    x, y = np.zeros((40, 3), "float32"), np.zeros((40, 1), "float32")
    fit(x, y, batch_size=8, epochs=2, verbose=0)
    ledger = keeper.ledger()
    assert (ledger.epoch, ledger.batches, ledger.steps, ledger.total_steps) == (1, 5, 5, 10)
    assert ledger.extra == {"loop": "fit", "epoch_steps": 5, "in_batch": False, "call": None,
                            "tracing": None, "weights": {"count": 2, "last": [[1, "dense/kernel", "(3, 1)"],
                                                                              [2, "dense/bias", "(1,)"]]}}
    assert ledger.end_of_data == ()
    # One train function, or two when an earlier select() applied the steps_per_execution patch
    # (it traces a one-step and a multi-step function): all traced before the first step.
    assert {trace.kind for trace in ledger.functions} == {"train"}
    assert all(trace.step == 0 for trace in ledger.functions)

    # A dataset of unknown length: each epoch ends inside a begun batch (after fit's validation, too).
    rows = tf.data.Dataset.from_tensor_slices((x[:12], y[:12]))
    data = rows.filter(lambda x, y: True).batch(4)
    fit(data, epochs=2, verbose=0, validation_data=(x, y))
    assert keeper.ledger().end_of_data == ((0, 4), (1, 4))  # batch 4 found no data
    assert [trace.kind for trace in keeper.functions][-1] == "test"  # the validation's function
