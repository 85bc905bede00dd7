"""The report's verdict as a pure function of measurements: shares, the bottleneck, recommendations, text, JSON."""

from __future__ import annotations

import json

import pytest

from tfstrategy.errors import TrainingError
from tfstrategy.performance.report import StepTimes, Tracker, profile_environment, tracker_from_environment
from tfstrategy.performance.verdict import Measurements, percentile, shares, verdict


def measured(step: float = 0.010, **fields) -> Measurements:
    base = {"step_seconds": (step,) * 9, "steps": 900, "seconds": 900 * step, "global_batch": 64, "replicas": 1,
            "cores": 2}
    return Measurements(**{**base, **fields})


@pytest.mark.parametrize(
    ("fields", "bottleneck", "split"),
    [
        pytest.param({"synthetic": 0.002, "input_batch": 0.012}, "input",
                     {"input": 0.8, "reduction": 0.0, "dispatch": 0.0, "compute": 0.2}, id="slow-map"),
        pytest.param({"synthetic": 0.002, "input_batch": 0.003}, "input",
                     {"input": 0.6, "reduction": 0.0, "dispatch": 0.0, "compute": 0.4},
                     id="a-step-longer-than-its-probes-scales-them"),  # 10 ms against 2 + 3: each probe x2
        pytest.param({"synthetic": 0.0099, "input_batch": 0.001, "replicas": 2, "workers": 2, "allreduce": 0.007},
                     "reduction", {"input": 0.01, "reduction": 0.7, "dispatch": 0.0, "compute": 0.29},
                     id="wide-model-on-two-workers"),
        pytest.param({"synthetic": 0.010, "input_batch": 0.001, "replicas": 4, "allreduce": 0.0005}, "compute",
                     {"input": 0.0, "reduction": 0.05, "dispatch": 0.0, "compute": 0.95}, id="cnn-on-four-replicas"),
        pytest.param({"synthetic": 0.009, "synthetic_fastest": 0.009, "larger_k": (4, 0.003), "outside": 0.001},
                     "dispatch", {"input": 0.0, "reduction": 0.0, "dispatch": 0.9, "compute": 0.1},
                     id="dispatch-bound-mlp"),
        pytest.param({"waited": 0.006, "replicas": 2, "allreduce": 0.001}, "input",
                     {"input": 0.6, "reduction": 0.1, "dispatch": 0.0, "compute": 0.3}, id="custom-loop-timed-wait"),
    ],
)
def test_shares_and_bottleneck(fields, bottleneck, split):
    report = verdict(measured(**fields))
    assert report.bottleneck == bottleneck
    assert report.shares == pytest.approx(split, abs=1e-9)
    assert sum(report.shares.values()) == pytest.approx(1.0)


def test_an_unprobed_step_is_all_compute():
    assert shares(0.01, measured()) == {"input": 0.0, "reduction": 0.0, "dispatch": 0.0, "compute": 1.0}


@pytest.mark.parametrize(
    ("ops", "fix"),
    [
        pytest.param(("TensorSliceDataset", "MapDataset", "BatchDatasetV2", "PrefetchDataset"),
                     "map(..., num_parallel_calls=tf.data.AUTOTUNE)", id="sequential-map"),
        pytest.param(("TensorSliceDataset", "ParallelMapDatasetV2", "BatchDatasetV2"),
                     "end the pipeline with .prefetch(tf.data.AUTOTUNE)", id="no-prefetch"),
        pytest.param(("TensorSliceDataset", "ParallelMapDatasetV2", "PrefetchDataset"),
                     "cache() the data after its expensive steps", id="parallel-and-prefetched"),
    ],
)
def test_an_input_bound_step_names_the_pipelines_fix(ops, fix):
    report = verdict(measured(synthetic=0.002, input_batch=0.012, pipeline_ops=ops))
    first = report.recommendations[0]
    assert fix in first.action
    # Input spread over 2 cores and overlapped with the 2 ms step: 12 ms / 2 = 6 ms a step, 10 / 6 = 1.67x.
    assert first.expected_gain == pytest.approx(10 / 6)


def test_a_latency_bound_multi_worker_model_is_told_to_use_fewer_workers_and_bigger_batches():
    report = verdict(measured(synthetic=0.0099, input_batch=0.001, replicas=2, workers=2, allreduce=0.007))
    actions = [r.action for r in report.recommendations]
    assert actions[0].startswith("train on fewer workers") and actions[1].startswith("double the per-replica batch")
    r, c = 0.007, 0.0029
    assert report.recommendations[0].expected_gain == pytest.approx((r + c) / (2 * c))
    assert report.recommendations[1].expected_gain == pytest.approx(2 * (r + c) / (r + 2 * c))


def test_a_dispatch_bound_step_is_told_the_larger_k_it_was_timed_at():
    report = verdict(measured(synthetic=0.009, synthetic_fastest=0.009, larger_k=(4, 0.003), outside=0.001))
    first = report.recommendations[0]
    assert first.action == "compile with steps_per_execution=4"
    # Saved per step: 6 ms inside the call, and 3/4 of the 1 ms between calls.
    assert first.expected_gain == pytest.approx(0.010 / (0.010 - 0.006 - 0.00075))


def test_a_compute_bound_step_says_nothing_needs_fixing():
    report = verdict(measured(synthetic=0.0099, input_batch=0.001))
    assert report.bottleneck == "compute"
    assert [r.action.split(":")[0] for r in report.recommendations] == ["nothing in the input or the reduction to fix"]
    assert [r.part for r in report.recommendations] == ["compute"]


def test_a_compute_bound_step_with_a_large_input_share_recommends_for_compute_first():
    # Today's contradiction: compute 70%, input 30%: "compute-bound", and the only recommendation was input's.
    report = verdict(measured(synthetic=0.007, data_step=0.010, input_batch=0.004))
    assert report.bottleneck == "compute" and report.shares["input"] == pytest.approx(0.3)
    assert [r.part for r in report.recommendations] == ["compute", "input"]
    assert report.recommendations[0].action.startswith("the model's own work is the largest part")


def test_an_unprobed_step_has_no_bottleneck_and_says_how_to_get_one():
    report = verdict(measured(not_probed={"synthetic and input": "would cost about 3 s, past the probes' budget"}))
    assert report.bottleneck == "unsplit"
    (only,) = report.recommendations
    assert only.part == "unsplit" and "TFSTRATEGY_PROFILE_PROBES" in only.action
    assert only.why.startswith("the step was timed but not split: the probes would have cost more than they may")
    assert "where a step goes: not split" in report.text()


def test_the_text_and_json_say_the_same():
    m = measured(synthetic=0.002, input_batch=0.012, pipeline_ops=("MapDataset",), replicas=2, workers=2, worker=1,
                 probe_seconds=0.45, not_probed={"larger K": "a short job"})
    report = verdict(m)
    text = report.text().splitlines()
    assert text[0] == ("tfstrategy performance report (worker 1 of 2, 2 replicas in sync, steps_per_execution=1): "
                       "900 steps in 9.0 s")
    # A worker's own pace, named as such: the job's throughput, once, is the job report's (test_job_report.py).
    assert text[1] == "  6,400 in-step examples/s as this worker timed its steps; step 10 ms median, 10 ms p90 (global batch 64)"
    assert text[2] == "  where a step goes: input 80%, reduction 0%, dispatch 0%, compute 20% -> input-bound"
    assert text[-1] == "  report cost: probes 0.45 s (5.0% of the 9.0 s trained); not probed: larger K: a short job"
    assert text[3].startswith("  recommendation (input): map(..., num_parallel_calls")
    data = json.loads(report.json())
    assert data["bottleneck"] == "input" and data["worker"] == 1 and data["timed_examples_per_second"] == 6400
    assert "examples_per_second" not in data and "worker_examples_per_second" not in data
    assert data["cost"] == {"probe_seconds": 0.45, "share_of_training": 0.05}
    assert data["recommendations"][0]["action"].startswith("map(..., num_parallel_calls")
    assert data["recommendations"][0]["part"] == "input"


def test_percentile_interpolates_and_refuses_nothing():
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert percentile([7.0], 50) == 7.0
    with pytest.raises(ValueError, match="Received no values"):
        percentile([], 50)


def test_step_times_skip_the_tracing_execution_and_the_time_between_epochs():
    times = StepTimes()
    times.new_run()
    for steps in (1, 4, 4):
        times.begin()
        times.end(steps)
    times.pause()  # validation and epoch callbacks: not a gap between steps
    times.begin()
    times.end(4)
    assert times.steps == [4, 4, 4] and times.gaps[2] == 0.0 and len(times.calls) == 3
    times.new_run(warm_up=False)  # a later fit with the same train function: nothing traces
    times.begin()
    times.end(2)
    assert times.steps == [4, 4, 4, 2]


@pytest.mark.parametrize("minutes", [0, -1, True, "10"])
def test_the_tracker_refuses_minutes_that_are_not_above_0(minutes):
    with pytest.raises(TrainingError, match=r"Received every_minutes=.*; expected a number of minutes above 0"):
        Tracker(every_minutes=minutes)


def test_profile_environment_validates_and_reads_back(tmp_path):
    assert profile_environment(False, tmp_path, 10) == {}
    env = profile_environment(True, tmp_path / "reports", 2.5)
    assert env == {"TFSTRATEGY_PROFILE": str(tmp_path / "reports"), "TFSTRATEGY_PROFILE_EVERY": "2.5"}
    assert tracker_from_environment(env) == {"directory": str(tmp_path / "reports"), "every_minutes": 2.5}
    assert tracker_from_environment({"TFSTRATEGY_PROFILE": "off"}) is None
    with pytest.raises(TrainingError, match="Received --profile-every 0; expected a number of minutes above 0"):
        profile_environment(True, tmp_path, 0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrainingError, match="Received --profile-dir .*, which is a file; expected a directory"):
        profile_environment(True, tmp_path / "file", 10)
    with pytest.raises(TrainingError, match="Received TFSTRATEGY_PROFILE_EVERY='soon'; expected a number of minutes"):
        tracker_from_environment({"TFSTRATEGY_PROFILE": str(tmp_path), "TFSTRATEGY_PROFILE_EVERY": "soon"})
