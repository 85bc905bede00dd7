"""The strategy check, in process and through the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from helpers import run_cli, run_example
from tfstrategy import run_check, select

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"
SCHEMA = json.loads((REFERENCE / "check.schema.json").read_text())

SEED_LINES = ["strategy MirroredStrategy", "replicas 1", "model_strategy True", "train_on_batch True"]


@pytest.mark.parametrize("replicas", [1, 4])
def test_check_passes_in_process(replicas):
    report = run_check(select(devices=[f"/cpu:{i}" for i in range(replicas)], env={}))
    values = report.as_dict()
    assert report.passed, report.lines()
    assert values["replicas"] == replicas
    assert values["all_reduce_sum"] == replicas * (replicas + 1) / 2
    assert values["per_replica_batch"] * replicas == values["global_batch"]
    assert values["replica_batches"] == [values["per_replica_batch"]] * replicas
    assert values["devices"] == [f"/cpu:{i}" for i in range(replicas)]
    # Typed, as documented: what --json prints validates against docs/reference/check.schema.json.
    jsonschema.validate(json.loads(json.dumps(values)), SCHEMA)
    assert f"replica_batches {','.join([str(values['per_replica_batch'])] * replicas)}" in report.lines()


def test_the_schema_rejects_numbers_as_strings() -> None:
    report = run_check(select(devices="cpu:0", env={}))
    values = report.as_dict()
    values["replica_batches"] = ",".join(str(size) for size in values["replica_batches"])  # main's shape
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, SCHEMA)


def test_the_json_reference_page_lists_every_key_of_the_schema() -> None:
    page = (REFERENCE / "check-json.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)`", page, re.M)) | set(re.findall(r"`(equivalence_\w+)`", page))
    keys = set(SCHEMA["properties"])
    assert keys <= listed, f"docs/reference/check-json.md does not describe {keys - listed}"
    pattern = next(iter(SCHEMA["patternProperties"]))
    documented = {key for key in listed - keys}
    assert documented and all(re.match(pattern, key) for key in documented), documented


def test_check_reports_a_failure_when_variables_escape_the_scope(monkeypatch):
    # A strategy whose scope does not own the variables: the check must say so.
    from tfstrategy.diagnostics import check

    monkeypatch.setattr(check, "_variables_in_scope", lambda strategy, model: (False, 1))
    report = run_check(select(env={}, devices="cpu:0"))
    assert not report.passed
    assert report.failures == ["variables_in_scope"]


@pytest.mark.slow
def test_cli_default_prints_the_seed_lines_first():
    result = run_cli("check")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:4] == SEED_LINES
    assert "devices /cpu:0" in lines
    assert "variables_in_scope True" in lines


@pytest.mark.slow
def test_cli_four_cpu_replicas_as_json():
    result = run_cli("check", "--cpu-replicas", "4", "--json")
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout)
    assert values["replicas"] == 4
    assert values["devices"] == ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"]
    assert values["replica_batches"] == [2, 2, 2, 2]
    jsonschema.validate(values, SCHEMA)
    assert values["passed"] is True and values["failed"] == []


@pytest.mark.slow
def test_cli_bad_devices_is_one_line_and_exit_2():
    result = run_cli("check", "--devices", "gpu0")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("tfstrategy")]
    assert error_lines == [
        "tfstrategy check: error: Received --devices gpu0; 'gpu0' is not a device. Expected 'all', 'cpu', 'gpu', "
        "'gpu:0,gpu:1', '/gpu:0', '/device:GPU:1' or GPU ids such as '0,1'. Did you mean 'gpu:0'?"
    ]


@pytest.mark.slow
def test_cli_debug_shows_the_traceback():
    result = run_cli("check", "--devices", "/gpu:0", "--debug")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "DeviceError" in result.stderr


@pytest.mark.slow
def test_cli_environment_variables_drive_the_check():
    result = run_cli("check", env={"TFSTRATEGY_CPU_REPLICAS": "2"})
    assert result.returncode == 0, result.stderr
    assert "replicas 2" in result.stdout.splitlines()


@pytest.mark.slow
def test_seed_script_runs_unchanged():
    result = run_example("strategy-demo.py")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == SEED_LINES


# What `tfstrategy check` loads before it runs TensorFlow: the parser of every command and
# the modules check_command imports. The launcher's start-up hook, the peer wait (multi-worker
# only) and the fit-only dataset refusals are not on its path.
_CHECK_PATH_MODULES = """
import sys
from tfstrategy.cli import build_parser
args = build_parser().parse_args(["check"])
assert args.command.__name__ == "check_command"
import tfstrategy.diagnostics.check, tfstrategy.errors, tfstrategy.multiworker.cluster, tfstrategy.runtime.select
off_path = ["tfstrategy.runtime.worker_hook", "tfstrategy.runtime.worker_watch", "tfstrategy.launch.reports",
            "tfstrategy.multiworker.peers", "tfstrategy.training.sentinel", "tfstrategy.training.datasets",
            "tfstrategy.training.batching"]
print(" ".join(name for name in off_path if name in sys.modules))
"""


def test_the_check_path_loads_no_launcher_or_fit_only_module():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CHECK_PATH_MODULES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""


def test_the_check_leaves_the_collector_as_it_found_it():
    import gc

    from tfstrategy.cli.check import _collector_skips_objects_so_far

    assert gc.get_freeze_count() == 0
    with _collector_skips_objects_so_far():
        assert gc.get_freeze_count() > 0  # the objects so far are out of the collector's sight
    assert gc.get_freeze_count() == 0
    gc.freeze()  # a process that froze objects itself keeps them frozen
    try:
        frozen = gc.get_freeze_count()
        with _collector_skips_objects_so_far():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


_CHECK_THEN_PLOT = """
import sys
from tfstrategy.cli import main
status = main(["check"])
loaded = "matplotlib" in sys.modules
import matplotlib.pyplot  # the check's block is gone: the process can still plot
print(status, loaded, "keras" in sys.modules)
"""


@pytest.mark.extras  # where matplotlib is installed (the bench extra), Keras 3 imports pyplot at start-up
def test_the_check_skips_keras_plotting_import_and_leaves_matplotlib_importable():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CHECK_THEN_PLOT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "0 False True"
