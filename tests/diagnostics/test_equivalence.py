"""Replica equivalence: the library call, the CLI flag, and the planted bug it must catch."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from docs_samples import assert_sample
from helpers import mirrored
from tfstrategy.cli import main
from tfstrategy.diagnostics.equivalence import EquivalenceResult, initial_weights, max_difference, train_weights

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"
SEED_LINES = ["strategy MirroredStrategy", "replicas 4", "model_strategy True", "train_on_batch True"]


@pytest.mark.parametrize(
    ("difference", "expect_equal", "passed", "verdict"),
    [
        pytest.param(1e-7, True, True, "equal max_weight_difference=1.0e-07", id="equal-as-expected"),
        pytest.param(2e-3, True, False, "DIFFERENT max_weight_difference=2.0e-03 (expected equal)", id="regression-caught"),
        pytest.param(0.6, False, True, "DIFFERENT max_weight_difference=6.0e-01 (the planted bug is caught)", id="planted-caught"),
        pytest.param(1e-7, False, False, "equal max_weight_difference=1.0e-07 (expected different)", id="planted-missed"),
    ],
)
def test_result_verdicts(difference, expect_equal, passed, verdict):
    result = EquivalenceResult(method="fit", replicas=4, max_difference=difference, tolerance=1e-5, expect_equal=expect_equal)
    assert result.passed is passed
    assert result.line() == f"equivalence_fit {verdict}"


@pytest.mark.slow
def test_cli_equivalence_passes_on_4_replicas_and_flags_the_planted_bug(capsys):
    status = main(["check", "--cpu-replicas", "4", "--equivalence"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert status == 0, lines
    assert_sample("check-equivalence-4-replicas", out)  # docs/guides/equivalence.md shows this output
    assert lines[:4] == SEED_LINES
    results = {line.split()[0]: line for line in lines if line.startswith("equivalence_")}
    assert list(results) == ["equivalence_fit", "equivalence_fit_spe8", "equivalence_loop", "equivalence_planted_per_replica_mean"]
    for key in ("equivalence_fit", "equivalence_fit_spe8", "equivalence_loop"):
        assert results[key].split()[1] == "equal", results[key]
        assert float(results[key].split("=")[1]) <= 1e-5
    planted = results["equivalence_planted_per_replica_mean"]
    assert planted.split()[1] == "DIFFERENT" and planted.endswith("(the planted bug is caught)")
    assert float(planted.split("=")[1].split()[0]) > 1e-2


def test_cli_equivalence_json_exits_1_when_a_method_diverges(capsys, monkeypatch):
    # The CLI's plumbing: a diverging method fails the check. The training itself
    # is covered above, so a report with one regressed method stands in for it.
    from tfstrategy.diagnostics import equivalence

    def regressed(selection, **options):
        report = equivalence.EquivalenceReport(replicas=4, reference_device="CPU:0", global_batch=32, steps=8)
        report.results.append(EquivalenceResult(method="loop", replicas=4, max_difference=0.3, tolerance=1e-5))
        return report

    monkeypatch.setattr(equivalence, "replica_equivalence", regressed)
    status = main(["check", "--cpu-replicas", "4", "--equivalence", "--json"])
    captured = capsys.readouterr()
    values = json.loads(captured.out)
    assert status == 1
    assert values["failed"] == ["equivalence_loop"]
    assert values["equivalence_loop"] == {"equal": False, "expected_equal": True, "max_weight_difference": 0.3,
                                          "passed": False}
    assert values["equivalence"]["replicas"] == 4 and values["equivalence"]["steps"] == 8
    jsonschema.validate(values, json.loads((REFERENCE / "check.schema.json").read_text()))
    assert "failed: equivalence_loop" in captured.err


def test_the_planted_bug_is_harmless_on_one_replica():
    # So "different on N" really is the replicas' doing, not a different model.
    start = initial_weights()
    loop = train_weights(mirrored(1), "loop", start, global_batch=16, steps=4)
    planted = train_weights(mirrored(1), "planted", start, global_batch=16, steps=4)
    assert max_difference(loop, planted) <= 1e-5
