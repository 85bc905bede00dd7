"""``tfstrategy run --devices``: checked in the parent before the script starts; one line, exit 2 (issue 35).

Only the GPU count is faked (this host has none to add); the parent never execs the script on a bad request.
"""

from __future__ import annotations

import os

import pytest

from tfstrategy.cli import main
from tfstrategy.cli import run as run_cli
from tfstrategy.selection.devices import parse_devices
from tfstrategy.selection.host import HostInfo


class _Started(BaseException):
    """The script would have started (``os.execvpe`` was reached)."""


@pytest.fixture
def no_exec(monkeypatch):
    def execvpe(*args):
        raise _Started(args)

    monkeypatch.setattr(os, "execvpe", execvpe)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _gpus(monkeypatch, count):
    asked = []

    def visible_gpus(environ=None):
        asked.append(True)
        return count

    monkeypatch.setattr(run_cli, "visible_gpus", visible_gpus)
    monkeypatch.setattr(run_cli.check_device_flag, "__defaults__", (visible_gpus,))
    return asked


@pytest.mark.parametrize(
    ("flags", "gpus", "line"),
    [
        pytest.param(["--devices", "/gpu:0"], 0,
                     "tfstrategy run: error: Received --devices /gpu:0; this host has ['/cpu:0'] (CUDA_VISIBLE_DEVICES "
                     "is unset). Pass --devices cpu or omit --devices.", id="gpu-on-a-cpu-host"),
        pytest.param(["--devices", "gpu"], 0,
                     "tfstrategy run: error: Received --devices gpu; this host has ['/cpu:0'] (CUDA_VISIBLE_DEVICES "
                     "is unset). Pass --devices cpu or omit --devices.", id="keyword-gpu-on-a-cpu-host"),
        pytest.param(["--devices", "0,1,2"], 2,
                     "tfstrategy run: error: Received --devices 0,1,2; this host has ['/cpu:0', '/gpu:0', '/gpu:1'] "
                     "(CUDA_VISIBLE_DEVICES is unset). Pass GPU ids below 2, or --devices gpu for all of them.",
                     id="a-gpu-past-the-last"),
        pytest.param(["--devices", "cpu:0,cpu:3", "--cpu-replicas", "2"], 0,
                     "tfstrategy run: error: Received --devices cpu:0,cpu:3 with --cpu-replicas 2, which splits the CPU "
                     "into 2 logical devices (/cpu:0 to /cpu:1). Pass --devices cpu:0,cpu:1 or --cpu-replicas 4.",
                     id="a-cpu-past-the-split"),
        pytest.param(["--devices", "cpu:9"], 0,
                     "tfstrategy run: error: Received --devices cpu:9; this host has ['/cpu:0'] (CUDA_VISIBLE_DEVICES "
                     "is unset). Pass --cpu-replicas 10 to split the CPU into 10 logical devices (/cpu:0 to /cpu:9), "
                     "or --devices cpu.", id="a-cpu-without-a-split"),
    ],
)
def test_a_device_the_host_lacks_is_one_line_and_exit_2_before_the_script(flags, gpus, line, no_exec, monkeypatch,
                                                                           capsys):
    _gpus(monkeypatch, gpus)
    assert main(["run", *flags, "--", "python", "x.py"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [line] and captured.out == ""


@pytest.mark.parametrize(
    ("flags", "gpus", "counted"),
    [
        pytest.param(["--devices", "gpu:0,gpu:1"], 2, True, id="gpus-the-host-has"),
        pytest.param(["--devices", "cpu", "--cpu-replicas", "4"], 0, False, id="cpu"),
        pytest.param(["--devices", "cpu:0,cpu:1", "--cpu-replicas", "2"], 0, False, id="split-cpus"),
        pytest.param(["--devices", "all"], 0, False, id="all"),
    ],
)
def test_devices_the_host_has_start_the_script_and_gpus_are_counted_only_when_named(flags, gpus, counted, no_exec,
                                                                                     monkeypatch):
    asked = _gpus(monkeypatch, gpus)
    with pytest.raises(_Started):
        main(["run", *flags, "--", "python", "x.py"])
    assert bool(asked) == counted


def test_a_gpu_count_that_cannot_be_read_leaves_the_check_to_the_hook(no_exec, monkeypatch):
    _gpus(monkeypatch, None)
    with pytest.raises(_Started):
        main(["run", "--devices", "/gpu:0", "--", "python", "x.py"])


@pytest.mark.parametrize(
    ("spec", "host", "expected"),
    [
        pytest.param("/gpu:1", HostInfo(cpus=1, gpus=2), None, id="present"),
        pytest.param("/gpu:2", HostInfo(cpus=1, gpus=2, cuda_visible_devices="0,1"),
                     "Received --devices /gpu:2; this host has ['/cpu:0', '/gpu:0', '/gpu:1'] (CUDA_VISIBLE_DEVICES is "
                     "'0,1'). Pass GPU ids below 2, or --devices gpu for all of them.", id="names-cuda-visible-devices"),
        pytest.param("cpu", HostInfo(cpus=1), None, id="cpu-keyword"),
    ],
)
def test_device_flag_error_is_pure(spec, host, expected):
    assert run_cli.device_flag_error(spec, parse_devices(spec), host) == expected


@pytest.mark.slow
def test_the_parent_counts_this_hosts_gpus_without_running_the_script():
    assert run_cli.visible_gpus() == 0  # a CPU host (no GPU in CI)
