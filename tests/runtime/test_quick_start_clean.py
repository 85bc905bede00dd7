"""A fresh clone's quick start prints no warning and no note: the README's ``train.py`` under ``run --cpu-replicas 4``.

Issue 35: the first rehearsal printed Keras' ``shuffle=True was passed, but will be ignored`` and a
false "names its own devices" note for the list ``select()`` itself passes. One process test (about 40 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

_TRAIN = re.compile(r"<!-- docs-test: file train\.py -->\n```python\n(.*?)^```", re.S | re.M)


@pytest.mark.slow
def test_the_readme_train_py_under_run_cpu_replicas_4_prints_no_warning_and_no_note(tmp_path):
    (tmp_path / "train.py").write_text(_TRAIN.search((ROOT / "README.md").read_text()).group(1))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TFSTRATEGY_", "TF_CONFIG"))}
    env.update(PYTHONPATH=str(ROOT / "src"), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-m", "tfstrategy", "run", "--cpu-replicas", "4", "--", sys.executable,
                           "train.py"], capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "replicas 4 final loss" in done.stdout
    lines = (done.stdout + done.stderr).splitlines()
    assert [line for line in lines if "Warning" in line or "warnings.warn" in line] == []
    notes = [line for line in done.stderr.splitlines() if line.startswith("tfstrategy:")]
    assert len(notes) == 1 and "4 replicas" in notes[0], notes  # the exit summary alone
    assert "note:" not in notes[0] and "no effect" not in done.stderr


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_readme_train_py_under_launch_n_2_prints_nine_true_lines_and_no_tensorflow_start_up(tmp_path):
    """Issue 45: with TF_CPP_MIN_LOG_LEVEL unset (a user's default) a clean ``launch -n 2`` printed oneDNN's and
    absl's start-up lines twice per worker. Now: the launcher's two lines, worker 0's run (its strategy line, two
    epochs, the final loss) and its one-line summary. Worker 1 trains the same steps; a line of it reaches the console
    only when it is more than the console's hold ahead of worker 0 on a loaded machine, and then says the same."""
    (tmp_path / "train.py").write_text(_TRAIN.search((ROOT / "README.md").read_text()).group(1))
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("TFSTRATEGY_", "TF_CONFIG", "TF_CPP_"))}
    env.update(PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-m", "tfstrategy", "launch", "-n", "2", "--", sys.executable, "train.py"],
                          capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out, err = done.stdout.splitlines(), done.stderr.splitlines()
    shapes = [r"\[worker 0\] auto: TF_CONFIG describes 2 tasks, so MultiWorkerMirroredStrategy; .*",
              r"\[worker 0\] Epoch 1/2", r"\[worker 0\] 32/32 - \d+s - \d+ms/step - loss: [0-9.]+", r"\[worker 0\] Epoch 2/2",
              r"\[worker 0\] 32/32 - \d+s - \d+ms/step - loss: 8\.2567", r"\[worker 0\] replicas 2 final loss 8\.2567"]
    lead = [line for line in out if line.startswith("[worker 0]")]
    assert len(lead) == len(shapes) and all(re.fullmatch(s, line) for s, line in zip(shapes, lead)), out
    echoes = [line.replace("[worker 1]", "[worker 0]", 1) for line in out if line.startswith("[worker 1]")]
    assert all(any(re.fullmatch(s, echo) for s in shapes) for echo in echoes) and len(out) == len(lead) + len(echoes)
    assert len(err) == 3, err
    assert re.fullmatch(r"tfstrategy launch: starting 2 worker\(s\) on 127\.0\.0\.1:\d+, 127\.0\.0\.1:\d+", err[0])
    assert err[1].startswith("[worker 0] tfstrategy: MultiWorkerMirroredStrategy, 2 replicas; 2 workers joined")
    assert re.fullmatch(r"tfstrategy launch: 2 workers exited 0 in [0-9.]+ s", err[2])
    assert not [line for line in out + err if "I0000" in line or "oneDNN" in line or "absl" in line]
