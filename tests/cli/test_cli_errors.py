"""Errors that teach (issue 35): a mistyped flag or choice prints one line naming it and the likely fix,
then the subcommand's own one-line usage, and exits 2. The parser fails before any TensorFlow loads."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tfstrategy.cli import main
from tfstrategy.errors import PrecisionError, StrategyError
from tfstrategy.settings import StrategyKind
from tfstrategy.training.precision import parse_precision


def _fail(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    with pytest.raises(SystemExit) as raised:
        main(list(argv))
    assert raised.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    return err.splitlines()


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [
        pytest.param(("launch", "--max-restrats", "1", "--", "python", "t.py"),
                     "tfstrategy launch: error: unknown option --max-restrats; did you mean --max-restarts?",
                     id="typo-while-n-is-missing"),
        pytest.param(("launch", "-n", "2", "--max-restrats", "1", "--", "python", "t.py"),
                     "tfstrategy launch: error: unknown option --max-restrats; did you mean --max-restarts?",
                     id="typo-with-n"),
        pytest.param(("launch", "--nproc", "2", "--", "python", "t.py"),
                     "tfstrategy launch: error: unknown option --nproc; did you mean -n/--num-workers?",
                     id="nproc"),
        pytest.param(("launch", "--nproc_per_node=2", "--", "python", "t.py"),
                     "tfstrategy launch: error: unknown option --nproc_per_node; did you mean -n/--num-workers?",
                     id="torchrun-nproc-per-node"),
        pytest.param(("launch", "-n", "2", "--log_dir", "logs", "--", "python", "t.py"),
                     "tfstrategy launch: error: unknown option --log_dir; did you mean --log-dir?",
                     id="underscore-for-hyphen"),
        pytest.param(("check", "--jsn"), "tfstrategy check: error: unknown option --jsn; did you mean --json?",
                     id="check-flag"),
        pytest.param(("run", "--cpu-replcas", "2", "--", "python", "t.py"),
                     "tfstrategy run: error: unknown option --cpu-replcas; did you mean --cpu-replicas?", id="run-flag"),
        pytest.param(("launch", "-n", "2", "--audit", "wran", "--", "python", "t.py"),
                     "tfstrategy launch: error: argument --audit: invalid choice 'wran'; expected one of warn, stop, "
                     "off. Did you mean 'warn'?", id="choice"),
        pytest.param(("lanch", "-n", "2"),
                     "tfstrategy: error: unknown command 'lanch'; expected one of check, env, run, launch, k8s. "
                     "Did you mean 'launch'?", id="command"),
        pytest.param(("run", "--cpu-replica", "2", "--", "python", "t.py"),
                     "tfstrategy run: error: unknown option --cpu-replica; did you mean --cpu-replicas?",
                     id="abbreviation-is-not-taken"),
        pytest.param(("launch", "-n", "2", "--max-restart", "1", "--", "python", "t.py"),
                     "tfstrategy launch: error: unknown option --max-restart; did you mean --max-restarts?",
                     id="abbreviation-of-max-restarts"),
        pytest.param(("launch", "--frobnicate", "--", "python", "t.py"),
                     "tfstrategy launch: error: unknown option --frobnicate", id="no-close-flag"),
        pytest.param(("launch", "-n", "2", "--tee=3", "--", "python", "t.py"),
                     "tfstrategy launch: error: --tee takes no value (received '--tee=3'); pass --tee alone",
                     id="tee-equals-a-value"),
    ],
)
def test_a_mistake_prints_one_line_then_the_commands_usage(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], first_line: str
) -> None:
    lines = _fail(capsys, *argv)
    assert lines[0] == first_line
    command = first_line.split(":")[0]
    assert len(lines) == 2, lines
    assert lines[1].startswith(f"usage: {command} ")
    assert "unrecognized arguments" not in "\n".join(lines)


def test_launch_usage_line_names_the_required_flag_and_the_program(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _fail(capsys, "launch")
    assert lines == [
        "tfstrategy launch: error: the following arguments are required: -n/--num-workers",
        "usage: tfstrategy launch -n N|MIN:MAX [options] -- COMMAND ...  ('tfstrategy launch --help' lists every option)",
    ]


def test_the_programs_own_flags_are_not_ours(capsys: pytest.CaptureFixture[str]) -> None:
    # Flags after the program (or after '--') belong to it, even when they look like typos of ours.
    lines = _fail(capsys, "launch", "python", "t.py", "--nproc", "3")
    assert lines[0] == "tfstrategy launch: error: the following arguments are required: -n/--num-workers"


def test_an_abbreviation_is_refused_and_the_whole_flag_still_parses(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45: argparse's prefix matching took --max-rest for --max-restarts silently; flags are spelled whole."""
    from tfstrategy.cli import build_parser

    lines = _fail(capsys, "launch", "-n", "2", "--max-rest", "1", "--", "python", "t.py")
    assert lines[0] == "tfstrategy launch: error: unknown option --max-rest; did you mean --max-restarts?"
    args = build_parser().parse_args(["launch", "-n", "2", "--max-restarts", "1", "--", "python", "t.py"])
    assert args.max_restarts == 1 and args.program == ["--", "python", "t.py"]


@pytest.mark.parametrize(
    ("parse", "value", "hint"),
    [
        pytest.param(StrategyKind.parse, "mirored", "Did you mean 'mirrored'?", id="strategy"),
        pytest.param(StrategyKind.parse, "multiworker", "Did you mean 'multi_worker'?", id="strategy-no-underscore"),
        pytest.param(parse_precision, "mixed_foat16", "Did you mean 'mixed_float16'?", id="precision"),
    ],
)
def test_library_choices_suggest_the_closest(parse: Callable[[str], object], value: str, hint: str) -> None:
    with pytest.raises((StrategyError, PrecisionError)) as raised:
        parse(value)
    assert hint in str(raised.value)


def test_no_suggestion_for_a_far_value() -> None:
    with pytest.raises(StrategyError) as raised:
        StrategyKind.parse("banana")
    assert "Did you mean" not in str(raised.value)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        pytest.param(("check", "--devices", "cpu:9"),
                     "tfstrategy check: error: Received --devices cpu:9; this host has ['/cpu:0'] (CUDA_VISIBLE_DEVICES "
                     "is unset). Pass --cpu-replicas 10 to split the CPU into 10 logical devices (/cpu:0 to /cpu:9), or "
                     "--devices cpu.", id="check-cpu-past-the-host"),
        pytest.param(("check", "--cpu-replicas", "4", "--devices", "cpu:0,cpu:7"),
                     "tfstrategy check: error: Received --devices cpu:0,cpu:7 with --cpu-replicas 4, which splits the "
                     "CPU into 4 logical devices (/cpu:0 to /cpu:3). Pass --devices cpu:0,cpu:1 or --cpu-replicas 8.",
                     id="check-cpu-past-the-split"),
        pytest.param(("check", "--cpu-replicas", "2", "--devices", "cpu:0,cpu:1,cpu:2"),
                     "tfstrategy check: error: Received --devices cpu:0,cpu:1,cpu:2 with --cpu-replicas 2, which splits "
                     "the CPU into 2 logical devices (/cpu:0 to /cpu:1). Pass --cpu-replicas 3.",
                     id="check-more-cpus-than-the-split"),
        pytest.param(("check", "--strategy", "mirored"),
                     "tfstrategy check: error: Received --strategy mirored; expected one of: auto, mirrored, one_device, "
                     "default, multi_worker, tpu. Did you mean 'mirrored'? Pass --strategy auto to let tfstrategy "
                     "choose.", id="check-strategy"),
        pytest.param(("check", "--cpu-replicas", "two"),
                     "tfstrategy check: error: Received --cpu-replicas two; expected a whole number of at least 1, e.g. "
                     "--cpu-replicas 4 to rehearse 4 replicas on the CPU.", id="check-cpu-replicas"),
        pytest.param(("check", "--strategy", "default", "--cpu-replicas", "2"),
                     "tfstrategy check: error: Received --cpu-replicas 2 with --strategy default; the default strategy "
                     "has one replica. Drop --cpu-replicas, or pass --strategy mirrored.", id="check-default-with-replicas"),
        pytest.param(("check", "--strategy", "multi_worker", "--devices", "cpu"),
                     "tfstrategy check: error: Received --devices cpu with --strategy multi_worker, which takes no "
                     "devices. Drop --devices, or pass --strategy mirrored (or one_device) to choose devices.",
                     id="check-multi-worker-with-devices"),
        pytest.param(("check", "--cpu-replicas", "2", "--devices", "gpu:0"),
                     "tfstrategy check: error: Received --cpu-replicas 2 with --devices gpu:0; CPU replicas and GPU "
                     "devices exclude each other. Drop --cpu-replicas to train on GPUs, or pass --devices cpu.",
                     id="check-cpu-replicas-with-gpus"),
        pytest.param(("check", "--precision", "mixed_foat16"),
                     "tfstrategy check: error: Received --precision mixed_foat16; expected one of float32, mixed_float16, "
                     "mixed_bfloat16. Did you mean 'mixed_float16'? mixed_float16 suits GPUs with tensor cores, "
                     "mixed_bfloat16 TPUs and recent CPUs; float32 is Keras' default.", id="check-precision"),
        pytest.param(("run", "--cpu-replicas", "two", "--", "python", "t.py"),
                     "tfstrategy run: error: Received --cpu-replicas two; expected a whole number of at least 1, e.g. "
                     "--cpu-replicas 4 to rehearse 4 replicas on the CPU.", id="run-cpu-replicas"),
        pytest.param(("launch", "-n", "2", "--log-dir", "logs", "--tee", "3", "--", "python", "t.py"),
                     "tfstrategy launch: error: --tee takes no value (received '--tee 3'); it copies every worker's "
                     "output, both streams, to the console as well as to --log-dir. Drop the 3 and put the command "
                     "after '--', e.g. tfstrategy launch -n 2 --log-dir logs --tee -- python t.py.", id="tee-3"),
        pytest.param(("launch", "-n", "4", "--tee", "0,1", "python", "t.py"),
                     "tfstrategy launch: error: --tee takes no value (received '--tee 0,1'); it copies every worker's "
                     "output, both streams, to the console as well as to --log-dir. Drop the 0,1 and put the command "
                     "after '--', e.g. tfstrategy launch -n 4 --log-dir logs --tee -- python t.py.",
                     id="tee-list-without-dashes"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_flag(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                                 argv: tuple[str, ...], line: str) -> None:
    """Issue 45: one wording in flags for check, run and launch; check refuses these before importing TensorFlow
    (tests/cli/test_cli_without_tensorflow.py shows it never loads)."""
    for name in ("TFSTRATEGY_CPU_REPLICAS", "TFSTRATEGY_DEVICES", "TFSTRATEGY_STRATEGY", "TFSTRATEGY_PRECISION",
                 "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    assert main(list(argv)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [line]


def test_a_cpu_past_a_split_from_the_environment_names_the_variable(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFSTRATEGY_CPU_REPLICAS", "4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(["check", "--devices", "cpu:5"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "tfstrategy check: error: Received --devices cpu:5 with TFSTRATEGY_CPU_REPLICAS=4, which splits the CPU into 4 "
        "logical devices (/cpu:0 to /cpu:3). Pass --devices cpu:0, or set TFSTRATEGY_CPU_REPLICAS=6."
    ]
