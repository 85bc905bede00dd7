"""The benchmark runner in quick mode, once, so it cannot rot. No timing is asserted."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import auto_k  # noqa: E402
from stats import Comparison, SuiteResult, format_table, interleaved_order  # noqa: E402
from suites import Budget  # noqa: E402


@pytest.mark.parametrize(
    ("repeat", "order"),
    [
        pytest.param(0, ["a", "b", "c"], id="first"),
        pytest.param(1, ["b", "c", "a"], id="rotated-once"),
        pytest.param(3, ["a", "b", "c"], id="wraps-around"),
    ],
)
def test_interleaved_order_rotates(repeat, order):
    assert interleaved_order(["a", "b", "c"], repeat) == order


def test_comparison_summarises_pair_ratios():
    row = Comparison(name="x", unit="s", better="lower", baseline_label="plain", candidate_label="tfs",
                     baseline=(2.0, 4.0, 10.0), candidate=(3.0, 4.0, 5.0))
    summary = row.summary()
    assert summary["ratios"] == [1.5, 1.0, 0.5]
    assert (summary["ratio_median"], summary["ratio_min"], summary["ratio_max"]) == (1.0, 0.5, 1.5)
    assert summary["baseline_median"] == 4.0 and summary["candidate_median"] == 4.0
    machine = {"usable_cores": 2, "cores": 2, "cpu": "cpu", "platform": "p", "python": "3", "tensorflow": "2.21.0",
               "keras": "3.15.1", "load_average_1m": 0.5}
    table = format_table(SuiteResult(name="s", title="T", rows=(row,)), machine).splitlines()
    assert table[2].startswith("machine: 2 of 2 cores") and "TensorFlow 2.21.0" in table[2]
    assert table[-1] == "| x | plain: 4.00 s | tfs: 4.00 s | **1.000** | 0.500-1.500 | 3 | lower |"


def test_auto_k_load_starts_its_busy_processes_and_stops_them(monkeypatch):
    # The quick run below is at load 0; a load of N starts N busy loops for the phase's workers, then kills them.
    compile(auto_k.BUSY_LOOP, "busy", "exec")
    started = []
    popen = subprocess.Popen

    def recording(*args, **kwargs):
        started.append((args[0], popen(*args, **kwargs)))
        return started[-1][1]

    monkeypatch.setattr(auto_k.subprocess, "Popen", recording)
    phase = auto_k.run_at_load(2, dataclasses.replace(Budget.quick(), auto_k_workloads=()))
    assert phase["runs"] == {} and phase["seconds"] >= 0
    assert [command for command, _ in started] == [[sys.executable, "-c", auto_k.BUSY_LOOP]] * 2
    assert [process.returncode for _, process in started] == [-signal.SIGKILL] * 2  # busy until the phase ended


@pytest.mark.slow
@pytest.mark.extended  # runs every benchmark workload for real; make bench runs them too
@pytest.mark.extras  # the plot needs matplotlib (the bench extra)
@pytest.mark.over_ceiling(seconds=380, reason="every benchmark suite once on its smallest sizes: 14 TensorFlow processes in turn")
def test_quick_run_writes_tables_json_and_plot(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=1400, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results["quick"] is True
    assert [suite["name"] for suite in results["suites"]] == [
        "process", "fit_overhead", "reference_mlp", "multi_worker_scaling", "multi_worker_allreduce", "auto_k",
        "profile_report",
    ]
    # The machine is stated beside every table.
    assert result.stdout.count("machine: ") == len(results["suites"])
    assert results["machine"]["tensorflow"] == __import__("tensorflow").__version__
    budget = Budget.quick()
    for suite in results["suites"]:
        expected_pairs = {"process": budget.process_repeats, "fit_overhead": budget.fit_repeats,
                          "reference_mlp": budget.fit_repeats,
                          "auto_k": budget.auto_k_pairs,
                          "profile_report": budget.profile_pairs}.get(suite["name"], budget.mw_rounds)
        for row in suite["rows"]:
            if suite["name"] == "profile_report" and "probes" in row["name"]:
                continue  # one sample per setting: checked below
            assert row["pairs"] == expected_pairs == len(row["baseline"]) == len(row["candidate"])
            assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
    fit = results["suites"][1]
    assert budget.replica_counts == (1, 2)  # quick: the unsplit CPU and a split one (2 replicas trace half of 4's)
    assert [(row["name"], row["unit"]) for row in fit["rows"]] == [
        ("1 replica, wall time", "examples/s"), ("1 replica, per CPU-second", "examples/CPU-s"),
        ("2 replicas, wall time", "examples/s"), ("2 replicas, per CPU-second", "examples/CPU-s"),
    ]
    # The recommended input drops the partial last batch; the seed recipe trains on it.
    examples = fit["details"]["examples"]
    for replicas in ("1", "2"):
        assert set(fit["details"]["replicas_in_sync"][replicas].values()) == {int(replicas)}
        assert examples[replicas]["recommended"] == budget.steps * 256 * budget.epochs
        assert examples[replicas]["seed"] == examples[replicas]["tfstrategy"] == (budget.steps * 256 + 128) * budget.epochs
    # The recommended settings tune steps_per_execution (capped by the epoch), which runs on 2+ replicas with the fix.
    for replicas, chosen in fit["details"]["steps_per_execution"].items():
        assert chosen["seed"] == chosen["tfstrategy"] == 1 and 1 <= chosen["recommended"] <= budget.steps, replicas
    scaling, allreduce, auto_k = results["suites"][3:6]
    jobs = scaling["details"]["jobs"]
    assert jobs["plain, 2 worker(s)"]["strategy"] == jobs["tfstrategy, 2 worker(s)"]["strategy"] == "CollectiveAllReduceStrategy"
    assert jobs["tfstrategy, 2 worker(s)"]["replicas_in_sync"] == 2 and jobs["plain, 1 worker(s)"]["replicas_in_sync"] == 1
    # Both workloads, every side against the same 1-worker baseline, and the K the recommended fit chose.
    assert [row["name"].split(":")[0] for row in scaling["rows"]] == ["MLP (latency-bound)"] * 3 + ["CNN 28x28 (compute-bound)"] * 3
    assert scaling["rows"][0]["baseline"] == scaling["rows"][1]["baseline"]
    assert all(1 <= k <= budget.mw_steps for runs in scaling["details"]["recommended_steps_per_execution"].values()
               for ks in runs.values() for k in ks)
    assert scaling["details"]["curve"]["x"] == [1, 2]
    assert results["suites"][2]["details"]["curve"]["x"] == list(budget.replica_counts)
    # Each worker pinned to its own core (where the machine has two).
    assert len(set(jobs["plain, 2 worker(s)"]["cores"])) == min(2, results["machine"]["usable_cores"])
    curve = allreduce["details"]["loglog"]
    assert curve["bytes"] == list(budget.allreduce_bytes)
    assert all(len(values) == len(curve["bytes"]) and min(values) > 0 for values in curve["series"].values())
    # Suite 5: every workload tuned at every load, each tuning choosing K=1 or the cap (the epoch's steps here).
    runs = auto_k["details"]["runs"]
    assert list(runs) == ["MLP, 1 replica"]  # quick mode: the 1-replica MLP only
    assert len(auto_k["rows"]) == 4 * len(runs) * len(budget.auto_k_loads)
    for label, by_load in runs.items():
        assert list(by_load) == [str(load) for load in budget.auto_k_loads], label
        for load, run in by_load.items():
            cap = min(budget.auto_k_steps, 64)
            assert run["cap"] == cap and len(run["chosen"]) == len(run["lines"]) == budget.auto_k_tunings, (label, load)
            assert set(run["chosen"]) <= {1, cap} and run["steps_per_execution"] in run["chosen"], (label, load)
            assert run["all_equal"] == (len(set(run["chosen"])) == 1)
            assert run["examples"]["auto"] == run["examples"]["k1"] == budget.auto_k_steps * (128 if "CNN" in label else 256)
    assert set(auto_k["details"]["phases"]) == {str(load) for load in budget.auto_k_loads}
    # The performance report's suite: every workload x setting ran through the CLI, on this tree's tfstrategy,
    # each worker's verdict recorded; the probes' rows have one sample per setting.
    profile = next(suite for suite in results["suites"] if suite["name"] == "profile_report")
    verdicts = profile["details"]["verdicts"]
    assert list(verdicts) == list(budget.profile_workloads)
    for settings in verdicts.values():
        assert list(settings) == list(budget.profile_settings)
        for setting, entry in settings.items():
            assert len(entry["bottleneck"]) == (2 if setting == "2 workers" else 1)
            assert all(abs(sum(shares.values()) - 1) < 1e-6 for shares in entry["shares"])
            assert min(entry["probe_seconds"]) > 0
    probe_rows = [row for row in profile["rows"] if "probes" in row["name"]]
    assert len(probe_rows) == len(budget.profile_workloads)
    assert all(row["pairs"] == len(budget.profile_settings) for row in probe_rows)
    assert profile["details"]["cost"]["tfstrategy"] == str(ROOT / "src" / "tfstrategy")
