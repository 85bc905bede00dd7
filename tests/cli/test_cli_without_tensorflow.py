"""The CLI after ``pip install tfstrategy`` without an extra (issue 45): ``--help``, ``--version``, ``k8s`` and
``env`` work, and never import TensorFlow (``env`` reports it missing); the commands that need it refuse in one
line naming the extra to install. Bad flags are refused before TensorFlow loads.

A real Python without TensorFlow: a venv (no pip, no system site-packages, made in a fraction of a second) holding
only tfstrategy's source and its one dependency, ``packaging``. Each test is one process running the CLI's
``main()`` for every command in turn, with a finder that records every attempt to import TensorFlow or Keras.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import packaging
import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Runs ``tfstrategy.cli.main(argv)`` for each argv of ``sys.argv[1]`` (JSON) in this one process, and prints
#: per command: the exit status, stdout, stderr, the exception --debug let through, and the TensorFlow or Keras
#: imports attempted (a finder first on ``sys.meta_path`` that only records) and whether tensorflow loaded.
DRIVER = r"""
import contextlib, io, json, sys

attempts = []

class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
            attempts.append(name)
        return None

sys.meta_path.insert(0, Recorder())
from tfstrategy.cli import main

results = []
for argv in json.loads(sys.argv[1]):
    attempts.clear()
    out, err, raised = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit:
            status = exit.code
        except Exception as error:
            status, raised = None, type(error).__name__
    results.append({"argv": argv, "status": status, "out": out.getvalue(), "err": err.getvalue(),
                    "raised": raised, "attempts": sorted(set(attempts)), "loaded": "tensorflow" in sys.modules})
print(json.dumps(results))
"""

K8S = ["k8s", "-n", "2", "--image", "registry.example.com/train:1", "--", "python", "train.py"]


def _clean_env() -> dict[str, str]:
    keep = {key: value for key, value in os.environ.items()
            if not key.startswith(("TFSTRATEGY_", "SLURM_", "PYTHON")) and key not in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES")}
    return {**keep, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _drive(python: str, commands: list[list[str]], env: dict[str, str]) -> dict[str, dict]:
    done = subprocess.run([python, "-c", DRIVER, json.dumps(commands)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=110)
    assert done.returncode == 0, done.stderr[-3000:]
    return {" ".join(result["argv"]): result for result in json.loads(done.stdout.splitlines()[-1])}


@pytest.fixture(scope="module")
def python_without_tensorflow(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A venv with tfstrategy's source and ``packaging`` only (what ``pip install tfstrategy`` gives)."""
    home = tmp_path_factory.mktemp("no-tensorflow")
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(home)
    python = home / "bin" / "python"
    site = next((home / "lib").glob("python3*/site-packages"))
    (site / "tfstrategy-source.pth").write_text(f"{ROOT / 'src'}\n")
    (site / "packaging").symlink_to(Path(packaging.__file__).parent, target_is_directory=True)
    check = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('tensorflow'))"],
                           capture_output=True, text=True, env=_clean_env(), timeout=30)
    assert check.stdout.strip() == "None", check  # really without TensorFlow
    return str(python)


def test_without_tensorflow_help_version_k8s_and_env_work_and_the_rest_refuse_in_one_line(python_without_tensorflow):
    run = ["run", "--", "python", "train.py"]
    launch = ["launch", "-n", "2", "--", "python", "train.py"]
    results = _drive(python_without_tensorflow, [["--help"], ["--version"], K8S, ["env"], ["env", "--json"],
                                                 ["check"], run, launch, ["check", "--debug"]], _clean_env())

    for argv in ("--help", "--version", " ".join(K8S)):
        result = results[argv]
        assert result["status"] == 0 and result["err"] == "", result
        assert result["attempts"] == [], result  # never even tried to import TensorFlow or Keras
    assert "usage: tfstrategy" in results["--help"]["out"]
    assert results["--version"]["out"] == "tfstrategy 0.2.0\n"
    assert "kind: Job" in results[" ".join(K8S)]["out"]

    report = results["env"]
    assert report["status"] == 0 and report["err"] == "", report
    lines = report["out"].splitlines()
    assert "- TensorFlow: not installed (see the Problem line)" in lines
    problems = [line for line in lines if line.startswith("- Problem:")]
    assert problems == [f"- Problem: tfstrategy needs TensorFlow, which is not installed in this Python "
                        f"({python_without_tensorflow}). Install it with the extra that fits this host: pip install "
                        "'tfstrategy[cpu]' (CPU only, tensorflow-cpu) or pip install 'tfstrategy[gpu]' (tensorflow "
                        "with CUDA)."], lines
    assert json.loads(results["env --json"]["out"])["tensorflow"] is None

    for argv, command in (("check", "check"), (" ".join(run), "run"), (" ".join(launch), "launch")):
        result = results[argv]
        assert result["status"] == 2 and result["out"] == "", result
        assert result["err"].splitlines() == [
            f"tfstrategy {command}: error: this command needs TensorFlow, which is not installed in this Python "
            f"({python_without_tensorflow}). Install it with the extra that fits this host: pip install "
            "'tfstrategy[cpu]' (CPU only, tensorflow-cpu) or pip install 'tfstrategy[gpu]' (tensorflow with CUDA)."
        ], result
    assert results["check --debug"]["raised"] == "MissingDependencyError"  # the traceback, on demand


#: Refused flags: each one line, before TensorFlow loads (issue 45, points 8 and 11).
REFUSED = {
    ("check", "--devices", "cpu:9"):
        "tfstrategy check: error: Received --devices cpu:9; this host has ['/cpu:0'] (CUDA_VISIBLE_DEVICES is "
        "unset). Pass --cpu-replicas 10 to split the CPU into 10 logical devices (/cpu:0 to /cpu:9), or --devices cpu.",
    ("check", "--cpu-replicas", "4", "--devices", "cpu:0,cpu:7"):
        "tfstrategy check: error: Received --devices cpu:0,cpu:7 with --cpu-replicas 4, which splits the CPU into 4 "
        "logical devices (/cpu:0 to /cpu:3). Pass --devices cpu:0,cpu:1 or --cpu-replicas 8.",
    ("check", "--strategy", "mirored"):
        "tfstrategy check: error: Received --strategy mirored; expected one of: auto, mirrored, one_device, default, "
        "multi_worker, tpu. Did you mean 'mirrored'? Pass --strategy auto to let tfstrategy choose.",
    ("launch", "-n", "2", "--log-dir", "logs", "--tee", "3", "--", "python", "train.py"):
        "tfstrategy launch: error: --tee takes no value (received '--tee 3'); it copies every worker's output, both "
        "streams, to the console as well as to --log-dir. Drop the 3 and put the command after '--', e.g. "
        "tfstrategy launch -n 2 --log-dir logs --tee -- python train.py.",
}


def test_with_tensorflow_help_k8s_and_refused_flags_never_load_it():
    """TensorFlow installed: ``--help``, ``--version``, ``k8s`` and the refusals above never import it."""
    env = {**_clean_env(), "PYTHONPATH": str(ROOT / "src")}
    results = _drive(sys.executable, [["--help"], ["--version"], K8S, *map(list, REFUSED)], env)
    for result in results.values():
        assert not result["loaded"] and result["attempts"] == [], result
    for argv, line in REFUSED.items():
        result = results[" ".join(argv)]
        assert result["status"] == 2 and result["err"].splitlines() == [line], result
