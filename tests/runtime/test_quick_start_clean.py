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
