"""``tfstrategy run/launch --profile`` on unchanged scripts: one report per worker, naming the bottleneck."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import ROOT, run_cli

SCRIPT = str(ROOT / "tests" / "workers" / "profile_script.py")
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _reports(directory, workers):
    found = sorted(directory.glob("worker-*.json"))
    assert [path.name for path in found] == [f"worker-{i}.json" for i in range(workers)]
    return [json.loads(path.read_text()) for path in found]


def test_run_profile_reports_an_input_bound_script(tmp_path):
    result = run_cli("run", "--profile", "--profile-dir", str(tmp_path), "--", sys.executable, SCRIPT, "input")
    assert result.returncode == 0, result.stderr[-3000:]
    (report,) = _reports(tmp_path, 1)
    assert report["bottleneck"] == "input", report
    assert report["recommendations"][0]["action"].startswith("map(..., num_parallel_calls=tf.data.AUTOTUNE)")
    assert "-> input-bound" in result.stderr and (tmp_path / "worker-0.txt").read_text().startswith(
        "tfstrategy performance report (one worker")
    assert "performance_report" in result.stderr.splitlines()[-1]  # the hook's summary names the step


def test_launch_profile_reports_a_reduction_bound_job_on_every_worker(tmp_path):
    result = run_cli("launch", "-n", "2", "--profile", "--profile-dir", str(tmp_path), "--", sys.executable, SCRIPT,
                     "reduction", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = _reports(tmp_path, 2)
    for index, report in enumerate(reports):
        assert (report["worker"], report["workers"], report["replicas"]) == (index, 2, 2)
        # The all-reduce probe (of zeros, after training) can under-measure the step's own on a loaded machine
        # (benchmarks/README.md): the reduction must be a large share, and the verdict reduction or compute.
        assert report["bottleneck"] in ("reduction", "compute") and report["shares"]["reduction"] >= 0.25, report
        assert report["probes"]["allreduce"] > 0
    for index in range(2):
        assert f"[worker {index}] tfstrategy performance report (worker {index} of 2" in result.stdout + result.stderr


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(("--profile-every", "0"), "Received --profile-every 0.0; expected a number of minutes above 0",
                 id="zero-minutes"),
    pytest.param(("--profile-dir", SCRIPT), "which is a file; expected a directory", id="dir-is-a-file"),
])
@pytest.mark.parametrize("command", ["run", "launch"])
def test_bad_profile_settings_are_one_line(command, args, message):
    workers = ("-n", "2") if command == "launch" else ()
    result = run_cli(command, *workers, "--profile", *args, "--", sys.executable, SCRIPT, "input")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and message in lines[0], lines[:5]
