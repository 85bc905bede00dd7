"""Device specs: every form users write, and a clear error for every bad one."""

from __future__ import annotations

import pytest

from tfstrategy.errors import DeviceError
from tfstrategy.selection.devices import Device, parse_devices, resolve_devices
from tfstrategy.selection.host import HostInfo

GPU0, GPU1 = Device("GPU", 0), Device("GPU", 1)


@pytest.mark.parametrize(
    ("spec", "keyword", "devices"),
    [
        pytest.param("all", "all", (), id="all"),
        pytest.param("CPU", "cpu", (), id="cpu-keyword-any-case"),
        pytest.param(" gpu ", "gpu", (), id="gpu-keyword-padded"),
        pytest.param("gpu:0,gpu:1", None, (GPU0, GPU1), id="comma-list"),
        pytest.param("/gpu:0", None, (GPU0,), id="slash-form"),
        pytest.param("/device:GPU:1", None, (GPU1,), id="device-form"),
        pytest.param("GPU:1, /gpu:0", None, (GPU1, GPU0), id="order-kept"),
        pytest.param("0,1", None, (GPU0, GPU1), id="gpu-ids"),
        pytest.param([0, 1], None, (GPU0, GPU1), id="int-list"),
        pytest.param(["/gpu:0", "/gpu:1"], None, (GPU0, GPU1), id="seed-list"),
        pytest.param(("/cpu:0", "cpu:1"), None, (Device("CPU", 0), Device("CPU", 1)), id="cpu-tuple"),
        pytest.param("/job:localhost/replica:0/task:0/device:GPU:1", None, (GPU1,), id="full-local-name"),
    ],
)
def test_parse_accepts(spec, keyword, devices):
    request = parse_devices(spec)
    assert request.keyword == keyword
    assert request.devices == devices


def test_parse_none_means_no_preference():
    assert parse_devices(None) is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param("gpu0", "Did you mean 'gpu:0'?", id="missing-colon"),
        pytest.param("cuda:0", "is not a device", id="unknown-kind"),
        pytest.param("", "Omit devices", id="empty-string"),
        pytest.param("gpu:0,,gpu:1", "empty entry", id="empty-entry"),
        pytest.param([], "empty list selects no device", id="empty-list"),
        pytest.param(["gpu:0,gpu:1"], "holds several", id="comma-string-in-list"),
        pytest.param(["all"], "stands alone", id="keyword-in-list"),
        pytest.param(["/gpu:0", "/gpu:0"], "appears twice", id="duplicate"),
        pytest.param(["/gpu:0", "/device:GPU:0"], "appears twice", id="duplicate-other-spelling"),
        pytest.param(["/cpu:0", "/gpu:0"], "mixes CPU and GPU", id="mixed"),
        pytest.param(["/tpu:0"], "strategy='tpu'", id="tpu-device"),
        pytest.param("tpu", "strategy='tpu'", id="tpu-keyword"),
        pytest.param("/job:worker/replica:0/task:1/device:GPU:0", "another task", id="remote-job"),
        pytest.param([-1], "0 or more", id="negative-id"),
        pytest.param([True], "not bool", id="bool"),
        pytest.param([0.5], "not float", id="float"),
        pytest.param({"gpu": 0}, "expected a string or a list", id="dict"),
    ],
)
def test_parse_rejects(spec, message):
    with pytest.raises(DeviceError, match="Received devices=") as error:
        parse_devices(spec)
    assert message in str(error.value)


CPU_ONLY = HostInfo(cpus=1)
FOUR_CPUS = HostInfo(cpus=4)
TWO_GPUS = HostInfo(cpus=1, gpus=2, cuda_visible_devices="0,1")


@pytest.mark.parametrize(
    ("spec", "host", "expected"),
    [
        pytest.param(None, CPU_ONLY, ["/cpu:0"], id="default-cpu-only"),
        pytest.param(None, TWO_GPUS, ["/gpu:0", "/gpu:1"], id="default-every-gpu"),
        pytest.param("all", FOUR_CPUS, ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"], id="all-logical-cpus"),
        pytest.param("cpu", TWO_GPUS, ["/cpu:0"], id="cpu-on-gpu-host"),
        pytest.param("gpu", TWO_GPUS, ["/gpu:0", "/gpu:1"], id="gpu-keyword"),
        pytest.param("1", TWO_GPUS, ["/gpu:1"], id="one-gpu-id"),
        pytest.param("/cpu:3", FOUR_CPUS, ["/cpu:3"], id="logical-cpu"),
    ],
)
def test_resolve(spec, host, expected):
    assert [str(d) for d in resolve_devices(parse_devices(spec), host)] == expected


@pytest.mark.parametrize(
    ("spec", "host", "message"),
    [
        pytest.param(
            ["/gpu:0"],
            CPU_ONLY,
            "Received devices=['/gpu:0']; this host has ['/cpu:0'] (CUDA_VISIBLE_DEVICES is unset). "
            "Pass --devices cpu (devices='cpu') or omit devices.",
            id="gpu-on-cpu-host",
        ),
        pytest.param("gpu:2", TWO_GPUS, "CUDA_VISIBLE_DEVICES is '0,1'). Pass GPU ids below 2", id="gpu-out-of-range"),
        pytest.param(["/cpu:0", "/cpu:7"], CPU_ONLY, "cpu_replicas=8", id="cpu-out-of-range-would-hang"),
        pytest.param("cpu:9", CPU_ONLY, "Pass cpu_replicas=10 (--cpu-replicas 10) to split the CPU into 10 logical "
                     "devices before TensorFlow starts, or name devices below /cpu:1.", id="one-cpu-past-the-split"),
        pytest.param("gpu", CPU_ONLY, "no GPU TensorFlow can see", id="gpu-keyword-no-gpu"),
    ],
)
def test_resolve_rejects(spec, host, message):
    with pytest.raises(DeviceError) as error:
        resolve_devices(parse_devices(spec), host)
    assert message in str(error.value)
