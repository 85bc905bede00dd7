"""Kubernetes' name rules, which the schemas do not check and the API server does: every generated name keeps them.

kubernetes-validate accepts a Service named 2-train (a name is a string to the schema); the API
server refuses it. These are the API server's rules (apimachinery's validation), table-driven.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tfstrategy.cli import main
from tfstrategy.errors import LaunchError
from tfstrategy.kubernetes import K8sOptions, manifests
from tfstrategy.kubernetes.names import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    JOB_NAME,
    check_generated_names,
    derive_name,
    label_key_problem,
    label_value_problem,
    name_from_command,
    name_problem,
)

RULES = {"1035": DNS1035_LABEL, "1123": DNS1123_LABEL, "subdomain": DNS1123_SUBDOMAIN, "job": JOB_NAME}


@pytest.mark.parametrize(("rule", "value", "problem"), [
    pytest.param("1035", "train", None, id="1035-word"),
    pytest.param("1035", "job-2-train", None, id="1035-digits-inside"),
    pytest.param("1035", "2-train", "starts with '2'", id="1035-leading-digit"),
    pytest.param("1035", "Train", "upper-case letter 'T'", id="1035-upper-case"),
    pytest.param("1035", "train_1", "character '_'", id="1035-underscore"),
    pytest.param("1035", "a.b", "character '.'", id="1035-dot"),
    pytest.param("1035", "train-", "ends with '-'", id="1035-trailing-dash"),
    pytest.param("1035", "a" * 63, None, id="1035-63"),
    pytest.param("1035", "a" * 64, "64 characters", id="1035-64"),
    pytest.param("1035", "", "is empty", id="1035-empty"),
    pytest.param("1123", "2-train", None, id="1123-leading-digit-ok"),
    pytest.param("1123", "-a", "starts with '-'", id="1123-leading-dash"),
    pytest.param("subdomain", "backups.team-a", None, id="subdomain-dots"),
    pytest.param("subdomain", "a..b", "is not a DNS-1123 subdomain", id="subdomain-empty-part"),
    pytest.param("subdomain", "a.-b", "is not a DNS-1123 subdomain", id="subdomain-part-starts-with-dash"),
    pytest.param("subdomain", "a" * 253, None, id="subdomain-253"),
    pytest.param("subdomain", "a" * 254, "254 characters", id="subdomain-254"),
    pytest.param("job", "a" * 64, "64 characters", id="job-name-label-63"),
])
def test_each_rule_accepts_and_refuses_what_the_api_server_does(rule, value, problem):
    found = name_problem(value, RULES[rule])
    assert found is None if problem is None else problem in found


@pytest.mark.parametrize(("key", "ok"), [
    ("pool", True), ("cloud.google.com/gke-accelerator", True), ("nvidia.com/gpu", True), ("A_b.c-D", True),
    ("/gpu", False), ("Example.com/gpu", False), ("nvidia.com/", False), ("-pool", False), ("a" * 64, False),
    ("a/b/c", False),
])
def test_label_keys(key, ok):
    assert (label_key_problem(key) is None) == ok


@pytest.mark.parametrize(("value", "ok"), [("", True), ("nvidia-l4", True), ("A_1.b", True), ("-a", False),
                                           ("a b", False), ("a=b", False), ("a" * 64, False)])
def test_label_values(value, ok):
    assert (label_value_problem(value) is None) == ok


@pytest.mark.parametrize(("text", "workers", "name"), [
    pytest.param("train", 4, "train", id="kept"),
    pytest.param("Train_V2", 4, "train-v2", id="lower-dashes"),
    pytest.param("2_train", 4, "job-2-train", id="leading-digit-prefixed"),
    pytest.param("__2__", 4, "job-2", id="leading-junk-then-digit"),
    pytest.param("ünïcode", 2, "n-code", id="non-ascii-dropped"),
    pytest.param("___", 2, "tfstrategy-job", id="nothing-left"),
    pytest.param("a" * 80, 1, "a" * 61, id="cut-for-hostname-a-0"),
    pytest.param("a" * 80, 1000, "a" * 59, id="cut-for-hostname-a-999"),
    pytest.param("ab-" + "c" * 57 + "-d", 100, "ab-" + "c" * 57, id="cut-then-trailing-dash-trimmed"),
])
def test_a_derived_name_starts_with_a_letter_and_fits_every_hostname(text, workers, name):
    assert derive_name(text, workers) == name
    assert name_problem(name, DNS1035_LABEL) is None
    assert name_problem(f"{name}-{workers - 1}", DNS1123_LABEL) is None


def test_any_script_name_gives_a_name_every_kind_accepts():
    for stem in ["2_train", "0", "-", "9lives", "x" * 300, "Ä-b", "a.b.c", "__init__", "1" * 70, "train.v2"]:
        for workers in (1, 10, 10_000):
            objects = manifests(K8sOptions(command=("python", f"{stem}.py"), num_workers=workers, image="x",
                                           name=name_from_command(("python", f"{stem}.py"), workers)))
            check_generated_names(objects)  # would raise


def test_the_default_name_comes_from_the_script_and_starts_with_a_letter():
    assert name_from_command(["python", "src/2_train.py"], 4) == "job-2-train"
    assert name_from_command(["python", "-m", "pkg"], 4) == "tfstrategy-job"


@pytest.mark.parametrize(("name", "suggestion"), [
    pytest.param("2-train", "job-2-train", id="leading-digit"),
    pytest.param("Train_1", "train-1", id="upper-case-underscore"),
    pytest.param("train.v2", "train-v2", id="dot"),
    pytest.param("a" * 62, "a" * 61, id="hostname-too-long"),
])
def test_an_explicit_name_the_api_server_would_refuse_is_one_line_with_the_rule_and_a_valid_suggestion(
        name, suggestion, capsys):
    assert main(["k8s", "-n", "2", "--image", "x", "--name", name, "--", "python", "t.py"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"tfstrategy k8s: error: Received --name {name!r}, which ")
    assert "DNS-1035 label" in line and line.endswith(f"Use e.g. --name {suggestion}.")
    assert main(["k8s", "-n", "2", "--image", "x", "--name", suggestion, "--", "python", "t.py"]) == 0
    capsys.readouterr()


def test_the_library_refuses_the_same_names_as_the_cli():
    with pytest.raises(LaunchError, match="Received --name '2-train'"):
        manifests(K8sOptions(command=("python", "t.py"), num_workers=2, image="x", name="2-train"))


def _objects() -> list[dict]:
    return manifests(K8sOptions(command=("python", "t.py"), num_workers=4, image="x", name="train",
                                backup_pvc="backups"))


@pytest.mark.parametrize(("path", "value", "named"), [
    pytest.param((0, "metadata", "name"), "2-train", "the Service's name '2-train' starts with '2'", id="service"),
    pytest.param((-1, "metadata", "name"), "a" * 64, "the Job's name", id="job-over-label-limit"),
    pytest.param((-1, "spec", "completions"), 10 ** 60, "the last pod's hostname", id="hostname"),
    pytest.param((-1, "spec", "template", "spec", "subdomain"), "a.b", "the pods' subdomain", id="subdomain"),
    pytest.param((1, "metadata", "labels", "app.kubernetes.io/name"), "-x", "the NetworkPolicy's label", id="label"),
    pytest.param((-1, "spec", "template", "spec", "volumes", 0, "persistentVolumeClaim", "claimName"), "B",
                 "the PersistentVolumeClaim 'B'", id="claim"),
])
def test_the_last_check_finds_a_generated_name_any_kind_would_refuse(path, value, named):
    objects = _objects()
    check_generated_names(objects)
    target = objects
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(LaunchError, match="API server would refuse") as caught:
        check_generated_names(objects)
    assert named in str(caught.value)


def test_the_guide_shows_the_refusal_the_cli_prints(capsys):
    # The guide's block is checked for its exit status only; this holds its text to the real line.
    page = (Path(__file__).parents[2] / "docs" / "guides" / "clusters.md").read_text()
    (shown,) = [line for line in page.splitlines() if line.startswith("tfstrategy k8s: error: Received --name")]
    assert main(["k8s", "-n", "4", "--image", "registry.example.com/train:1", "--name", "2-train", "--",
                 "python", "train.py"]) == 2
    assert capsys.readouterr().err.strip() == shown
