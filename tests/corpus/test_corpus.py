"""The corpus of real-shaped public scripts, each run plain, under ``run --cpu-replicas 2`` and under
``launch -n 2`` (``corpus_cases.py`` states what each must do).

One test per case runs its modes in order (plain first, where the others compare with it), each
in a fresh working directory, and reports every mode that went wrong at once. The checker itself
is tested without processes. ``python tests/corpus/measure.py`` runs every mode of every case, plain
TensorFlow's own two-worker run included, and prints the table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from corpus_cases import (
    CASES,
    MODES,
    SCRIPTS,
    Case,
    Fails,
    Final,
    Refused,
    Result,
    Trains,
    check,
    describe,
    guide_table,
    run_case,
)

from helpers import ROOT

#: Scripts in scripts/ that are helpers of a corpus script, not corpus entries.
HELPERS = {"convert_to_tfrecord.py"}


def _needed_modes(case: Case) -> list[str]:
    """The modes CI runs: ``run`` and ``launch`` (tfstrategy's), and ``plain`` only where another mode
    is compared with it. The plain run is plain TensorFlow's behaviour, not tfstrategy's; its stated
    outcome is measured with ``measure.py`` (every mode), which keeps the corpus within minutes on 2 cores."""
    wanted = {mode for mode in ("run", "launch") if case.outcome(mode) is not None}
    for mode in list(wanted):
        outcome = case.outcome(mode)
        if isinstance(outcome, Trains) and outcome.same_as:
            wanted.add(outcome.same_as)
    if any(count == "plain" for count in case.files.values()):
        wanted.add("plain")
    return [mode for mode in MODES if mode in wanted]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.over_ceiling(seconds=280, reason="a case runs its script in two or three modes in turn")
@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_script_runs_as_stated_in_every_mode(case: Case, tmp_path: Path):
    results: dict[str, Result] = {}
    problems: dict[str, list[str]] = {}
    for mode in _needed_modes(case):
        results[mode] = run_case(case, mode, tmp_path / mode)
        if case.outcome(mode) is None:
            continue
        found = check(case, mode, results[mode], plain_result=results.get("plain"), references=results)
        if mode in case.known:
            pattern, why = case.known[mode]
            if not found:
                problems[mode] = [f"stated as a known failure ({why}) but now does what the table says: "
                                  "remove it from Case.known and update docs/guides/unchanged-scripts.md"]
            elif not re.search(pattern, "\n".join(found)):
                problems[mode] = [f"known failure ({why}) expected to match {pattern!r}, failed otherwise:", *found]
        elif found:
            problems[mode] = found
    report = "\n\n".join(f"== {mode} (stated: {describe(case, mode)})\n" + "\n".join(found)
                         for mode, found in problems.items())
    assert not problems, report


# --- the table and the checker, without processes (fast) ------------------------------------------


def test_every_script_is_in_the_table_and_names_its_source():
    scripts = {path.name for path in SCRIPTS.glob("*.py")} - HELPERS
    assert scripts == {case.script for case in CASES}
    for name in scripts | HELPERS:
        docstring = ast.get_docstring(ast.parse((SCRIPTS / name).read_text())) or ""
        assert "Shaped like" in docstring and "Changed:" in docstring or name in HELPERS, name
        assert "(" in docstring and "/" in docstring, f"{name}: the docstring names no repository path"


def test_guide_lists_the_corpus_as_the_table_states_it():
    guide = (ROOT / "docs" / "guides" / "unchanged-scripts.md").read_text()
    assert guide_table() in guide, "regenerate it: python tests/corpus/measure.py --update-guide"


def test_table_is_complete():
    assert len({case.id for case in CASES}) == len(CASES) >= 12
    for case in CASES:
        for mode in MODES:
            assert case.outcome(mode) is not None or case.skip_reason.startswith(f"{mode}:"), (case.id, mode)
            outcome = case.outcome(mode)
            if isinstance(outcome, Trains) and outcome.same_as:
                assert outcome.same_as in MODES and outcome.same_as != mode


def _result(tmp_path: Path, mode: str, returncode: int = 0, stdout: str = "", stderr: str = "",
            finals: dict | None = None, files: dict[str, bytes] | None = None) -> Result:
    workdir = tmp_path / mode
    workdir.mkdir(parents=True, exist_ok=True)
    for name, content in (files or {}).items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_bytes(content)
    kind = "MultiWorkerMirroredStrategy" if mode == "launch" else "MirroredStrategy"
    finals = {worker: Final(*values) if len(values) == 4 else Final(*values, 2, kind)
              for worker, values in (finals or {}).items()}
    return Result(mode, returncode, stdout, stderr, 1.0, workdir, finals)


CASE = Case(id="t", script="t.py", source="s", plain=Trains(), run=Trains(same_as="plain"),
            launch=Trains(workers=2, replicas=2, same_as="run"), files={"out/*.log": 1})
SUMMARY = "tfstrategy: MirroredStrategy, 2 replicas; the CPU split into 2 logical devices; scope audit clean"


def test_checker_accepts_a_correct_launch(tmp_path):
    run = _result(tmp_path, "run", finals={0: (0.5, 10.0)}, stderr=SUMMARY, files={"out/a.log": b"x\ny\n"})
    plain = _result(tmp_path, "plain", finals={0: (0.5, 10.0)}, files={"out/a.log": b"x\ny\n"})
    launch = _result(tmp_path, "launch", finals={0: (0.50001, 10.0), 1: (0.50001, 10.0)}, files={"out/a.log": b"1\n2\n"})
    assert check(CASE, "launch", launch, plain, {"run": run, "plain": plain}) == []
    assert check(CASE, "run", run, plain, {"plain": plain}) == []


@pytest.mark.parametrize(
    ("finals", "files", "stderr", "expected"),
    [
        pytest.param({0: (0.5, 10.0), 1: (0.6, 10.0)}, {"out/a.log": b"x\n"}, "", "same final loss and weights on every worker",
                     id="workers-disagree"),
        pytest.param({0: (0.5, 10.0)}, {"out/a.log": b"x\n"}, "", "final line from worker(s) [0, 1]", id="one-worker-only"),
        pytest.param({0: (0.5, 10.0, 2, "MirroredStrategy"), 1: (0.5, 10.0, 2, "MirroredStrategy")}, {"out/a.log": b"x\n"},
                     "", "each worker training alone with MirroredStrategy", id="independent-trainings"),
        pytest.param({0: (0.5, 10.0, 4, "MultiWorkerMirroredStrategy"), 1: (0.5, 10.0, 4, "MultiWorkerMirroredStrategy")},
                     {"out/a.log": b"x\n"}, "", "expected 2 replica(s) in sync, got 4", id="wrong-replica-count"),
        pytest.param({0: (0.7, 10.0), 1: (0.7, 10.0)}, {"out/a.log": b"x\n"}, "", "as run (same global batch)",
                     id="differs-from-one-process"),
        pytest.param({0: (0.5, 10.0), 1: (0.5, 10.0)}, {"out/a.log": b"x\n", "out/workertemp_1/a.tmp": b"x"}, "",
                     "files no one asked for", id="temporary-leftover"),
        pytest.param({0: (0.5, 10.0), 1: (0.5, 10.0)}, {"out/a.log": b"x\n", "out/b.log": b"x\n"}, "",
                     "expected 1 file(s) out/*.log", id="second-copy"),
        pytest.param({0: (0.5, 10.0), 1: (0.5, 10.0)}, {}, "", "expected 1 file(s) out/*.log", id="file-missing"),
        pytest.param({0: (0.5, 10.0), 1: (0.5, 10.0)}, {"out/a.log": b"x\n"},
                     "tfstrategy: audit: 3 of 7 variables were not created in the scope of the default strategy",
                     "the audit reported a finding", id="false-audit-finding"),
        pytest.param({0: (0.5, 10.0), 1: (0.5, 10.0)}, {"out/a.log": b"x\n"},
                     "tfstrategy launch: warning: worker 1 is a straggler: its steps take 2.0x its peers' CPU\n",
                     "named a stall or a straggler", id="false-straggler"),
        pytest.param({0: (0.5, 10.0), 1: (0.5, 10.0)}, {"out/a.log": b"x\n"},
                     "tfstrategy launch: stall: worker 0 has not beaten its heartbeat for 10 s: frozen\n",
                     "named a stall or a straggler", id="false-stall"),
    ],
)
def test_checker_catches_a_wrong_launch(tmp_path, finals, files, stderr, expected):
    run = _result(tmp_path, "run", finals={0: (0.5, 10.0)}, stderr=SUMMARY)
    launch = _result(tmp_path, "launch", finals=finals, files=files, stderr=stderr)
    problems = check(CASE, "launch", launch, None, {"run": run})
    assert any(expected in problem for problem in problems), problems


def test_checker_catches_an_incomplete_keras_archive_and_two_csv_writers(tmp_path):
    case = Case(id="k", script="k.py", source="s", plain=Trains(), run=Trains(), launch=Trains(workers=2),
                files={"m.keras": 1, "training.log": 1})
    plain = _result(tmp_path, "plain", finals={0: (1.0, 1.0)}, files={"training.log": b"epoch,loss\n0,1\n"})
    launch = _result(tmp_path, "launch", finals={0: (1.0, 1.0), 1: (1.0, 1.0)},
                     files={"m.keras": b"PK\x03\x04 half an archive", "training.log": b"epoch,loss\n0,1\nepoch,loss\n0,1\n"})
    problems = check(case, "launch", launch, plain, {})
    assert any("m.keras: not a complete .keras archive" in problem for problem in problems), problems
    assert any("training.log: 4 lines where the plain run wrote 2" in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("returncode", "stderr", "expected"),
    [
        pytest.param(0, "", "expected a refusal", id="exit-0"),
        pytest.param(1, "Traceback (most recent call last):\nValueError: x\n", "first tfstrategy line", id="no-tfstrategy-line"),
        pytest.param(1, "tfstrategy launch: worker 1 exited with status 1: KeyError\n", "first tfstrategy line",
                     id="other-cause"),
        pytest.param(1, "tfstrategy launch: starting 2 worker(s) on 127.0.0.1:1\nTraceback (most recent call last):\n"
                        "RuntimeError: ParameterServerStrategy\n", "first tfstrategy line", id="only-the-starting-notice"),
    ],
)
def test_checker_catches_a_refusal_that_does_not_name_its_cause(tmp_path, returncode, stderr, expected):
    case = Case(id="p", script="p.py", source="s", plain=Trains(), run=Trains(),
                launch=Refused(r"ParameterServerStrategy"))
    problems = check(case, "launch", _result(tmp_path, "launch", returncode, stderr=stderr), None, {})
    assert any(expected in problem for problem in problems), problems


def test_checker_accepts_a_one_line_refusal_and_the_scripts_own_error(tmp_path):
    case = Case(id="p", script="p.py", source="s", plain=Fails(r"KeyError: 'task'"), run=None,
                launch=Refused(r"ParameterServerStrategy"), skip_reason="run: x")
    refused = _result(tmp_path, "launch", 2, stderr="a warning\ntfstrategy launch: ParameterServerStrategy is not supported\n")
    assert check(case, "launch", refused, None, {}) == []
    failed = _result(tmp_path, "plain", 1, stderr="Traceback (most recent call last):\nKeyError: 'task'\n")
    assert check(case, "plain", failed, None, {}) == []


def test_checker_accepts_the_scripts_own_race_only_when_named(tmp_path):
    case = Case(id="r", script="r.py", source="s", plain=Trains(), run=Trains(), launch=Trains(workers=2, race="ckpt"))
    named = _result(tmp_path, "launch", 1, stderr="tfstrategy launch: workers 0 and 1 both created ckpt; use exist_ok\n")
    assert check(case, "launch", named, None, {}) == []
    peer_abort = _result(tmp_path, "launch", 1, stderr="tfstrategy launch: worker 0 exited: [Op:CollectiveBcastRecv]\n")
    assert check(case, "launch", peer_abort, None, {}) != []
