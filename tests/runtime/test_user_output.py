"""What `run` and `launch` tell a user at exit and on an error: user terms, the script's own frames (issue 35).

The summary and the traceback trimming are tested as pure functions with fake steps, patches and
real tracebacks; one process test runs `tfstrategy run` on a script whose callback raises.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from corpus.corpus_cases import SUMMARY_LINE
from helpers import ROOT
from tfstrategy.cli import build_parser
from tfstrategy.cli.launch import options_from_args
from tfstrategy.cli.run import run_environment
from tfstrategy.errors import DeviceError
from tfstrategy.launch.options import worker_settings
from tfstrategy.patches.mechanism import Patch, _outside_the_callers_scopes
from tfstrategy.runtime import tracebacks
from tfstrategy.runtime.inputs import PlanInputs
from tfstrategy.runtime.step import Step
from tfstrategy.runtime.worker_hook import changes
from tfstrategy.selection.devices import parse_devices
from tfstrategy.state.registry import RUNTIME, HookState, reset
from tfstrategy.worker_contract import WorkerContract

PACKAGE = str(Path(tracebacks.__file__).resolve().parent.parent)


class _FakeStep(Step):
    phase = "keras"

    def __init__(self, name: str, text: str | None) -> None:
        super().__init__(PlanInputs(consumer="hook"))
        self.name = name  # type: ignore[misc]
        self.text = text

    def detail(self) -> str:
        return f"would do {self.name}"

    def change(self) -> str | None:
        return self.text


def _state(strategies: list[str], audited: int = 1, steps: tuple[str, ...] = ()) -> HookState:
    return HookState(strategies=strategies, audited=audited, steps=[(name, "done") for name in steps],
                     patches=["keras_mwms", "keras_jit_compile"])


# --- the exit summary -------------------------------------------------------------------------


def test_a_script_nothing_was_changed_for_gets_one_short_line():
    steps = [_FakeStep("record_creation_sites", None), _FakeStep("apply_patches", None), _FakeStep("audit", None)]
    state = _state(["MirroredStrategy, 1 replica"], steps=("record_creation_sites", "apply_patches", "audit"))
    assert state.summary(changes(steps)) == "tfstrategy: MirroredStrategy, 1 replica; nothing changed; scope audit clean"


def test_under_launch_the_summary_says_what_changed_in_the_users_terms():
    steps = [_FakeStep("record_creation_sites", None), _FakeStep("watch_strategies", "2 workers joined one MultiWorkerMirroredStrategy"),
             _FakeStep("count_batches", "fit's batches counted for the launcher"),
             _FakeStep("apply_patches", "Keras 3's training step fixed for MultiWorkerMirroredStrategy (keras#20585)")]
    line = _state(["MultiWorkerMirroredStrategy, 2 replicas"]).summary(changes(steps))
    assert line == ("tfstrategy: MultiWorkerMirroredStrategy, 2 replicas; 2 workers joined one MultiWorkerMirroredStrategy; "
                    "fit's batches counted for the launcher; Keras 3's training step fixed for MultiWorkerMirroredStrategy "
                    "(keras#20585); scope audit clean")
    assert "CollectiveAllReduceStrategy" not in line and "steps:" not in line and "patches:" not in line


def test_without_debug_the_summary_names_the_workarounds_that_acted_and_with_debug_says_what_each_did(monkeypatch):
    """Issue 45 point 7: under launch the workarounds' sentences made a 383-character summary."""
    from types import SimpleNamespace

    import tfstrategy.patches
    from tfstrategy.runtime.steps import ApplyPatches

    monkeypatch.setattr(tfstrategy.patches, "PATCHES", {
        "keras_mwms": SimpleNamespace(change=lambda: "Keras 3's training step fixed for MultiWorkerMirroredStrategy "
                                                     "(keras#20585)"),
        "keras_loss_scale": SimpleNamespace(change=lambda: None),  # installed, never acted: not named
        "keras_chief_files": SimpleNamespace(change=lambda: "Keras' files written by the chief only"),
    })
    patched = ApplyPatches.__new__(ApplyPatches)  # its statuses and inputs play no part in what it says
    steps = [_FakeStep("watch_strategies", "2 workers joined one MultiWorkerMirroredStrategy"), patched]
    state = _state(["MultiWorkerMirroredStrategy, 2 replicas"])
    assert state.summary(changes(steps, debug=False)) == (
        "tfstrategy: MultiWorkerMirroredStrategy, 2 replicas; 2 workers joined one MultiWorkerMirroredStrategy; "
        "Keras workarounds acted: keras_mwms, keras_chief_files (--debug says what each changed); scope audit clean")
    assert state.summary(changes(steps), debug=True).startswith(
        "tfstrategy: MultiWorkerMirroredStrategy, 2 replicas; 2 workers joined one MultiWorkerMirroredStrategy; "
        "Keras 3's training step fixed for MultiWorkerMirroredStrategy (keras#20585); Keras' files written by the "
        "chief only; scope audit clean")


def test_step_names_patches_and_replacements_only_under_debug():
    state = _state(["MirroredStrategy, 4 replicas"], steps=("split_cpu", "mirrored_devices"))
    quiet = state.summary(("the CPU split into 4 logical devices",), replacements=("scope_guard:fit:1",))
    loud = state.summary(("the CPU split into 4 logical devices",), debug=True, replacements=("scope_guard:fit:1",))
    assert quiet == "tfstrategy: MirroredStrategy, 4 replicas; the CPU split into 4 logical devices; scope audit clean"
    assert loud == (quiet + "; steps: split_cpu, mirrored_devices; patches: keras_mwms, keras_jit_compile; "
                    "replaced: scope_guard:fit:1")


def test_audit_findings_notes_and_hook_errors_are_always_said():
    state = HookState(strategies=[], audited=2, findings=["x"], notes=["a note"], errors=["mirrored_devices: boom"])
    assert state.summary() == ("tfstrategy: no strategy created; nothing changed; scope audit: 1 of 2 found variables "
                               "outside the scope; note: a note; hook errors: mirrored_devices: boom")
    assert _state(["MirroredStrategy, 1 replica"], audited=0).summary() == (
        "tfstrategy: MirroredStrategy, 1 replica; nothing changed")  # no fit: nothing audited, nothing said


def test_the_corpus_recognises_the_summary_and_only_it():
    assert SUMMARY_LINE.match(_state(["MirroredStrategy, 2 replicas", "OneDeviceStrategy (refused)"]).summary())
    assert SUMMARY_LINE.match(HookState().summary())
    for other in ("tfstrategy: MirroredStrategy(devices=['/cpu:0']) at t.py:3 names its own devices",
                  "tfstrategy: hook step mirrored_devices: DeviceError: x", "tfstrategy: audit: 3 of 7 variables"):
        assert not SUMMARY_LINE.match(other), other


def test_a_step_reports_what_its_code_recorded_when_it_acted_the_first_time_only():
    reset()
    try:
        step = _FakeStep("mirrored_devices", None)
        assert Step.change(step) is None  # installed, never acted
        RUNTIME.hook.changed("mirrored_devices", "MirroredStrategy() given 4 devices")
        RUNTIME.hook.changed("mirrored_devices", "MirroredStrategy() given 2 devices")
        assert Step.change(step) == "MirroredStrategy() given 4 devices"
    finally:
        reset()
    assert Step.change(step) is None  # reset() forgets it with the rest of the job


class _FakePatch(Patch):
    name = "fake_fix"
    change_text = "the fake bug fixed"
    upstream = "none"
    verified_up_to = "3.15.1"
    targets = ()


def test_a_patch_says_what_it_changed_only_once_its_fix_ran():
    patch = _FakePatch()
    assert patch.change() is None
    patch.acted()
    assert patch.change() == "the fake bug fixed"
    patch.forget()  # a new job in the process
    assert patch.change() is None


# --- --debug reaches the hook -----------------------------------------------------------------


def test_debug_reaches_the_hook_under_run_and_launch():
    program = ["--", sys.executable, "train.py"]
    _, env = run_environment(build_parser().parse_args(["run", "--debug", *program]))
    _, quiet = run_environment(build_parser().parse_args(["run", *program]))
    assert env["TFSTRATEGY_DEBUG"] == "1" and "TFSTRATEGY_DEBUG" not in quiet
    launched = worker_settings(options_from_args(build_parser().parse_args(["launch", "-n", "2", "--debug", *program])), {})
    assert launched.debug and WorkerContract(settings=launched).to_environ()["TFSTRATEGY_DEBUG"] == "1"
    assert WorkerContract.from_environ({"TFSTRATEGY_DEBUG": "1"}).settings.debug
    assert not worker_settings(options_from_args(build_parser().parse_args(["launch", "-n", "2", *program])), {}).debug


# --- tracebacks -------------------------------------------------------------------------------


def _users_code() -> None:
    raise ValueError("the user's own mistake")


def _through_tfstrategy() -> BaseException:
    """A user error raised through tfstrategy's code (a probe's thread, as a wrapper would pass it on)."""
    try:
        _outside_the_callers_scopes(_users_code)
    except ValueError as error:
        return error
    raise AssertionError("the user's code did not raise")


def _files(tb) -> list[str]:
    return [frame.filename for frame in traceback.extract_tb(tb)]


def test_tfstrategys_pass_through_frames_are_dropped_and_the_users_kept():
    error = _through_tfstrategy()
    assert any(name.startswith(PACKAGE) for name in _files(error.__traceback__))  # mechanism.py passed it on
    trimmed = tracebacks.user_traceback(error.__traceback__)
    assert _files(trimmed) == [__file__, __file__]
    assert [frame.name for frame in traceback.extract_tb(trimmed)] == ["_through_tfstrategy", "_users_code"]


def test_an_error_tfstrategy_raised_itself_keeps_the_frames_where_it_was_raised():
    with pytest.raises(DeviceError) as raised:
        parse_devices("gpu:x")
    trimmed = tracebacks.user_traceback(raised.value.__traceback__)
    assert _files(trimmed)[0] == __file__ and _files(trimmed)[-1].startswith(PACKAGE)


def test_the_excepthook_prints_the_users_frames_with_the_same_exception(monkeypatch, capsys):
    monkeypatch.delenv("TFSTRATEGY_DEBUG", raising=False)
    reset()
    try:
        assert tracebacks.install() is not None
        error = _through_tfstrategy()
        sys.excepthook(type(error), error, error.__traceback__)
    finally:
        reset()  # puts Python's own excepthook back
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "ValueError: the user's own mistake"
    assert PACKAGE not in err and err.count(__file__) == 2
    monkeypatch.setenv("TFSTRATEGY_DEBUG", "1")
    assert tracebacks.install() is None  # --debug: every frame


# --- one process ------------------------------------------------------------------------------

RAISES = '''\
import numpy as np
import tensorflow as tf


class Broken(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        raise ValueError("the user's own mistake")


strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.zeros((16, 4), "float32")
model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[Broken()])
'''


@pytest.mark.slow
def test_run_shows_a_users_error_from_the_users_frames_and_one_summary_line(tmp_path):
    script = tmp_path / "raises.py"
    script.write_text(RAISES)
    result = subprocess.run([sys.executable, "-m", "tfstrategy", "run", "--", sys.executable, str(script)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    assert lines[start + 1] == f'  File "{script}", line 15, in <module>'
    frames = [line for line in lines[start:] if line.startswith('  File "')]
    assert not any(PACKAGE in line for line in frames), "\n".join(frames)  # no wrapper of tfstrategy's
    assert frames[-1] == f'  File "{script}", line 7, in on_train_batch_end'
    assert "ValueError: the user's own mistake" in lines
    assert lines[-1] == "tfstrategy: MirroredStrategy, 1 replica; nothing changed; scope audit clean"
