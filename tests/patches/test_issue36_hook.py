"""Issue 36's six cases in one unchanged script under ``tfstrategy run --cpu-replicas 2`` and ``launch -n 2``.

``tests/workers/issue36_loop_script.py`` (a lazily built Adam in the custom-training tutorial's loop, the
mixed-precision guide's loop with the Keras 2 loss-scale calls and its silent port, ``compile(jit_compile=True)``
with ``fit``, and ``issue36_script``'s fit cases) runs once per mode, all cases in one process: on one device
with the library's patches (the reference, in the test's own process), under the start-up hook on 2 CPU replicas, on 2 workers, and as
plain TensorFlow on 2 CPU replicas (it must fail or differ, or this test could not fail).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, run_cli, run_script_on_one_cpu
from tfstrategy import _versions
from tfstrategy.diagnostics.equivalence import TOLERANCES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multiprocess,
    pytest.mark.skipif(_versions.legacy_keras_requested(), reason="the bugs are Keras 3's"),
]

SCRIPT = ROOT / "tests" / "workers" / "issue36_loop_script.py"
TOLERANCE = {"1-lazy-adam": TOLERANCES["float32"], "2-loss-scale-api": TOLERANCES["mixed_float16"],
             "3-jit-compile": TOLERANCES["mixed_float16"], "4-6-fit": TOLERANCES["float32"]}
REFUSED = "2-silent-port"
JIT_NOTICE = "XLA turned off (jit_compile=False)"
LEGACY_NOTICE = "tf.keras.optimizers.legacy.Adam does not exist in Keras 3"
PLAIN_ENV = {"CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}


def _cases(text: str) -> dict[str, dict]:
    lines = [json.loads(line[line.index("ISSUE36 ") + 8:]) for line in text.splitlines() if "ISSUE36 " in line]
    return {line.get("case", "replicas"): line for line in lines}


def _plain(split: int) -> subprocess.CompletedProcess:
    """The script as ``python`` runs it: plain TF on ``split`` CPUs."""
    env = {**os.environ, **PLAIN_ENV, "ISSUE36_CPU_SPLIT": str(split)}
    return subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


def _differences(got: dict[str, dict], reference: dict[str, dict]) -> dict[str, float]:
    return {case: float(np.max(np.abs(np.array(got[case]["weights"]) - reference[case]["weights"])))
            for case in TOLERANCE if "weights" in got.get(case, {})}


def _assert_like_one_device(got: dict[str, dict], reference: dict[str, dict], where: str) -> None:
    assert got["replicas"]["replicas"] == 2, where
    for case in TOLERANCE:
        assert "weights" in got[case], f"{where}: {case}: {got[case].get('error', '')[:2000]}"
    differences = _differences(got, reference)
    print(f"{where}: {differences}")
    assert all(differences[case] <= tolerance for case, tolerance in TOLERANCE.items()), (where, differences)
    for case in TOLERANCE:
        assert abs(got[case]["loss"] - reference[case]["loss"]) <= 10 * TOLERANCE[case], (where, case)
    assert "keras-team/keras#19479" in got[REFUSED].get("error", ""), f"{where}: the silent port was not refused"


def _assert_notices_once(stderr: str, where: str) -> None:
    assert stderr.count(JIT_NOTICE) == 1, f"{where}: {stderr.count(JIT_NOTICE)} jit_compile notices"
    assert stderr.count(LEGACY_NOTICE) == 1, f"{where}: {stderr.count(LEGACY_NOTICE)} legacy optimizer notices"


@pytest.fixture(scope="module")
def reference() -> dict[str, dict]:
    """The one-device answer: the script in this process, with the library's patches, on /cpu:0 alone."""
    import tfstrategy.patches

    tfstrategy.patches.apply_patches()
    out = run_script_on_one_cpu(SCRIPT)
    cases = _cases(out)
    assert cases["replicas"]["replicas"] == 1
    assert all("weights" in cases[case] for case in TOLERANCE), out[-3000:]
    assert "keras-team/keras#19479" in cases[REFUSED]["error"]  # refused on one device too: no weights to compare
    return cases


def test_run_cpu_replicas_2_gives_the_one_device_answer(reference):
    done = run_cli("run", "--cpu-replicas", "2", "--", sys.executable, str(SCRIPT), env=PLAIN_ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_like_one_device(_cases(done.stdout), reference, "run --cpu-replicas 2")
    _assert_notices_once(done.stderr, "run --cpu-replicas 2")
    assert "had no effect on it" not in done.stderr  # the patches' probes list their devices: not the script's doing


def test_launch_2_workers_give_the_one_device_answer(reference, tmp_path: Path):
    done = run_cli("launch", "-n", "2", "--timeout", "120", "--log-dir", str(tmp_path), "--",
                   sys.executable, str(SCRIPT), env=PLAIN_ENV, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    workers = sorted(tmp_path.glob("*/attempt-*/worker-*"))  # the run's folder, then its attempt
    assert len(workers) == 2, workers
    for worker in workers:
        where = f"launch -n 2, {worker.name}"
        _assert_like_one_device(_cases((worker / "stdout.log").read_text()), reference, where)
        _assert_notices_once((worker / "stderr.log").read_text(), where)


def test_plain_tensorflow_on_2_cpu_replicas_fails_or_differs(reference):
    """Without tfstrategy every case fails or leaves the one-device answer: the assertions above can fail."""
    done = _plain(split=2)
    cases = _cases(done.stdout)
    assert cases["replicas"]["replicas"] == 2, done.stderr[-3000:]
    differences = _differences(cases, reference)
    print(f"plain TensorFlow, 2 CPU replicas: {differences}; errors: "
          f"{ {case: line['error'][:120] for case, line in cases.items() if 'error' in line} }")
    for case, tolerance in TOLERANCE.items():
        assert "error" in cases[case] or differences[case] > tolerance, (case, differences)
    assert "keras-team/keras#19479" not in cases[REFUSED].get("error", "")  # never refused there
