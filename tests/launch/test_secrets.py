"""The launch secret stays secret: the env report hides it, a shared secret file is refused.

(That no secret reaches a worker's environment, any argv or any log is checked with two real
launchers in test_rendezvous_adversarial.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT
from tfstrategy.diagnostics.env_report import collect_env_report, env_report_as_dict, format_env_report
from tfstrategy.errors import LaunchError
from tfstrategy.launch.exposure import describe_tf_config_exposure, exposure_warning, network_interfaces
from tfstrategy.launch.rendezvous import read_secret
from tfstrategy.settings import ENV_LAUNCH_SECRET

SECRET = "5ecret-value-that-must-never-be-printed-0123456789"


def test_the_env_report_says_set_and_the_length_never_the_value():
    report = collect_env_report({ENV_LAUNCH_SECRET: SECRET, "TFSTRATEGY_STRATEGY": "auto"})
    text, data = format_env_report(report), json.dumps(env_report_as_dict(report))
    assert SECRET not in text and SECRET not in data
    assert f"{ENV_LAUNCH_SECRET}=<set, {len(SECRET)} characters, not shown>" in text
    assert "TFSTRATEGY_STRATEGY=auto" in text  # other settings are shown as they are
    assert env_report_as_dict(report)["settings_env"][ENV_LAUNCH_SECRET] == f"<set, {len(SECRET)} characters, not shown>"


def test_tfstrategy_env_json_in_a_subprocess_hides_the_secret():
    result = subprocess.run([sys.executable, "-m", "tfstrategy", "env", "--json"], capture_output=True, text=True,
                            env={**os.environ, ENV_LAUNCH_SECRET: SECRET, "TF_CPP_MIN_LOG_LEVEL": "2"}, cwd=ROOT,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert json.loads(result.stdout)["settings_env"][ENV_LAUNCH_SECRET].startswith("<set, ")


@pytest.mark.parametrize(("mode", "verb"), [pytest.param(0o644, "read", id="0644"), pytest.param(0o640, "read", id="0640"),
                                            pytest.param(0o620, "write", id="0620"), pytest.param(0o602, "write", id="0602")])
def test_a_secret_file_others_may_read_or_write_is_refused_with_chmod_600(tmp_path, mode, verb):
    path = tmp_path / "secret"
    path.write_text(SECRET)
    path.chmod(mode)
    with pytest.raises(LaunchError) as raised:
        read_secret(path, {})
    message = str(raised.value)
    assert f"mode {mode:04o}, which other users may {verb}" in message and message.endswith(f"chmod 600 {path}")
    assert SECRET not in message


def test_a_private_secret_file_and_a_symlink_to_one_are_read(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    (tmp_path / "link").symlink_to(path)
    assert read_secret(path, {}) == read_secret(tmp_path / "link", {}) == SECRET.encode()


def test_the_cli_refuses_a_shared_secret_file_in_one_line_with_status_2(tmp_path):
    path = tmp_path / "secret"
    path.write_text(SECRET)
    path.chmod(0o644)
    result = subprocess.run(
        [sys.executable, "-m", "tfstrategy", "launch", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.2:1",
         "--secret-file", str(path), "-n", "1", "--", "true"], capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={key: value for key, value in os.environ.items() if key != ENV_LAUNCH_SECRET})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"chmod 600 {path}") and SECRET not in result.stderr


def test_exposure_is_reported_when_an_interface_beyond_loopback_is_up(tmp_path):
    for name, flags in (("lo", "0x9"), ("eth0", "0x1003"), ("eth1", "0x1002")):  # up+loopback, up, down
        (tmp_path / name).mkdir()
        (tmp_path / name / "flags").write_text(flags + "\n")
    assert network_interfaces(tmp_path) == ["eth0"]
    warning = exposure_warning([2222, 2223], ["eth0"])
    assert "listen on every interface ([::]:2222, [::]:2223" in warning and "over eth0" in warning
    assert exposure_warning([2222], []) is None
    config = {"cluster": {"worker": ["10.0.0.5:2222", "10.0.0.6:2223"]}, "task": {"type": "worker", "index": 1}}
    assert "listen on [::]:2223 (every interface), unauthenticated; reachable beyond loopback" in \
        describe_tf_config_exposure(config, ["eth0"])
    assert "only loopback is up" in describe_tf_config_exposure(config, [])
    assert describe_tf_config_exposure(None, ["eth0"]).startswith("none")


def test_launch_help_says_what_is_and_is_not_authenticated():
    from tfstrategy.cli.launch import DESCRIPTION

    text = " ".join(DESCRIPTION.split())
    assert "What is authenticated: only this control channel." in text
    assert "NOT authenticated: TensorFlow's own gRPC servers, the workers' ports." in text
    assert "listen on every interface (TensorFlow has no option to bind one address)" in text
    assert 'docs/guides/clusters.md, "Security model"' in text
