"""A report whose probes did not fit still concludes, from what cost nothing to watch (issue 45 point 3).

Pure policy: measurements built by hand, fake gauges and stacks; no TensorFlow. The real run is
``test_profile_cli.py::test_run_profile_names_a_slow_input_without_its_probes``.
"""

from __future__ import annotations

import sys

import pytest

from tfstrategy.cli import build_parser
from tfstrategy.cli.run import run_environment
from tfstrategy.errors import TrainingError
from tfstrategy.launch.options import worker_settings
from tfstrategy.launch.supervisor import LaunchOptions
from tfstrategy.performance.evidence import WAITING, infer
from tfstrategy.performance.job import combine, figures_of, figures_row, from_row
from tfstrategy.performance.sampler import StackSampler
from tfstrategy.performance.timing import StepTimes, plan_probes
from tfstrategy.performance.verdict import UNSPLIT, Measurements, suggested_share, verdict
from tfstrategy.stacks import TensorFlowRuns

#: What a plan too short for its probes says of them (the report's cost line).
SKIPPED = {"synthetic and input": "would cost about 4 s, past the probes' budget of 0.17 s (10% of the 1.67 s trained)"}


def unprobed(step: float = 0.025, **fields) -> Measurements:
    """80 steps of ``step`` on 2 replicas, 2 cores, whose probes did not fit their budget."""
    base = {"step_seconds": (step,) * 9, "steps": 80, "seconds": 80 * step, "global_batch": 32, "replicas": 2,
            "cores": 2, "not_probed": dict(SKIPPED), "probes_need_share": 2.3,
            "pipeline_ops": ("TensorSliceDataset", "BatchDatasetV2", "MapDataset")}
    return Measurements(**{**base, **fields})


def test_an_input_wait_of_20_of_25_ms_names_input_bound_and_how_sure():
    report = verdict(unprobed(sampled_input=0.020, cpu_seconds=0.004))
    assert report.bottleneck == UNSPLIT  # the probes did not split the step ...
    assert (report.inferred.bottleneck, report.inferred.certainty) == ("input", "likely")  # ... the samples conclude
    where = report.text().splitlines()[2]
    assert where.startswith("  where a step goes: not split by the probes; input-bound (from the stack samples and "
                            "CPU time, not probed: likely): the input pipeline ran 20 ms of each 25 ms step"), where
    assert "CPU 4 ms a step, 8% of 2 core(s)" in where and "see the last line" not in report.text()
    first, second = report.recommendations
    assert first.part == "input" and first.action.startswith("map(..., num_parallel_calls=tf.data.AUTOTUNE)")
    assert first.expected_gain is None and "not probed, so no gain is measured" in first.why
    # The way to let the probes run is a flag the user can pass, and the line it points at is named in words.
    assert second.part == UNSPLIT and "pass --profile-probes 3 to tfstrategy run or launch" in second.action
    assert "performance_report(probe_share=3)" in second.action and "TFSTRATEGY_PROFILE_PROBES=3" in second.action
    assert "about 2.3x the time trained" in second.why and "the report's cost line, its last" in second.why
    assert report.as_dict()["inferred"] == {"bottleneck": "input", "certainty": "likely",
                                            "evidence": report.inferred.evidence}


def test_a_py_function_in_the_pipelines_map_counts_as_input_and_one_elsewhere_does_not():
    in_map = verdict(unprobed(sampled_py_function=0.019, cpu_seconds=0.004)).inferred
    assert (in_map.bottleneck, in_map.certainty) == ("input", "likely")
    assert "a tf.py_function ran 19 ms of each 25 ms step (in the pipeline's map)" in in_map.evidence
    no_map = verdict(unprobed(sampled_py_function=0.019, cpu_seconds=0.004, pipeline_ops=("TensorSliceDataset",)))
    # Without a map it may be the step's own: the idle CPU says the step waits, for input or the all-reduce.
    assert no_map.inferred.bottleneck == WAITING and "the pipeline has no map" in no_map.inferred.evidence
    assert [r.part for r in no_map.recommendations] == [UNSPLIT]
    assert "waiting for input or the all-reduce (from the stack samples" in no_map.text()


def test_a_step_that_keeps_the_cores_busy_is_compute_bound():
    report = verdict(unprobed(sampled_input=0.0, cpu_seconds=0.045))  # 45 ms of CPU in a 25 ms step on 2 cores
    assert (report.inferred.bottleneck, report.inferred.certainty) == ("compute", "likely")
    assert "compute-bound (from the stack samples and CPU time, not probed: likely)" in report.text()
    assert "CPU 45 ms a step, 90% of 2 core(s)" in report.inferred.evidence
    assert [r.part for r in report.recommendations] == ["compute", UNSPLIT]
    # On GPUs the compute burns no host CPU: the same figures say nothing.
    on_gpus = verdict(unprobed(sampled_input=0.0, cpu_seconds=0.001, accelerators=True))
    assert on_gpus.inferred.bottleneck is None and "says nothing" in on_gpus.inferred.evidence


def test_on_a_crowded_machine_an_idle_cpu_concludes_nothing():
    alone = verdict(unprobed(sampled_py_function=0.019, cpu_seconds=0.004, pipeline_ops=(), load_average=1.0))
    assert alone.inferred.bottleneck == WAITING
    # Load average 5 on 2 cores: the step may wait for a core, not for input or the all-reduce.
    crowded = verdict(unprobed(sampled_py_function=0.019, cpu_seconds=0.004, pipeline_ops=(), load_average=5.0))
    assert crowded.inferred.bottleneck is None
    assert "the machine is crowded (load average 5.0 on 2 core(s)): the step may wait for a core" in \
        crowded.inferred.evidence
    # The samples of input still conclude: they do not rest on the CPU (so the crowd goes unsaid).
    sampled = verdict(unprobed(sampled_input=0.020, cpu_seconds=0.004, load_average=5.0)).inferred
    assert sampled.bottleneck == "input" and "crowded" not in sampled.evidence


def test_without_evidence_it_says_it_cannot_tell_and_how_to_let_the_probes_run():
    report = verdict(unprobed())
    assert report.inferred.bottleneck is None
    assert "where a step goes: not split by the probes; cannot tell without the probes: no samples" in report.text()
    (only,) = report.recommendations
    assert only.part == UNSPLIT and "--profile-probes 3" in only.action and "or train longer" in only.action
    # Half-busy cores and a little input: no conclusion either.
    middle = verdict(unprobed(sampled_input=0.003, cpu_seconds=0.025))
    assert middle.inferred.bottleneck is None and [r.part for r in middle.recommendations] == [UNSPLIT]


def test_the_job_report_concludes_from_every_workers_samples():
    def worker(index: int, **fields):
        m = unprobed(worker=index, workers=2, replicas=2, **fields)
        return from_row(figures_row(figures_of(verdict(m), 1)), m)

    job = combine([worker(0, sampled_input=0.021, cpu_seconds=0.003, epoch_seconds=6.0, epoch_steps=80),
                   worker(1, sampled_input=0.019, cpu_seconds=0.005, epoch_seconds=5.0, epoch_steps=80)])
    assert job.bottleneck == UNSPLIT and job.inferred.bottleneck == "input"
    assert "the input pipeline ran 20 ms of each 25 ms step" in job.inferred.evidence  # the workers' mean
    text = job.text()
    assert "  the job: 1,280 in-step examples/s (512/s over the epochs' wall time" in text  # 80 x 32 / 5 s
    assert "worker 1: 1 replica, 50% of the examples (640 examples/s); step 25 ms median; not probed: input-bound" \
        in text
    assert job.as_dict()["inferred"]["certainty"] == "likely" and job.as_dict()["epoch_examples_per_second"] == 512
    assert [r.part for r in job.recommendations] == ["input", UNSPLIT]


@pytest.mark.parametrize(("need", "share"), [(0.08, 0.1), (0.4, 0.5), (2.3, 3.0), (3.82, 5.0), (None, 1.0)])
def test_the_suggested_share_is_round_and_above_the_need(need, share):
    assert suggested_share(need) == share


def test_the_suggested_share_lets_every_probe_run():
    # The 80-step run: 79 steps of 21.7 ms in 1.67 s after a traced first step of 4 s.
    figures = {"trained": 1.67, "step": 0.0217, "setup": 4.0, "reduction_wanted": True}
    short = plan_probes(share=0.1, **figures)
    assert short.skipped and short.needed_share > 1
    assert plan_probes(share=suggested_share(short.needed_share), **figures).skipped == {}
    assert plan_probes(share=10, **figures).needed_share is None


def test_step_times_read_the_free_gauges_around_each_timed_step_only():
    readings = iter([(0.0, 0.0, 0.0), (1.0, 0.5, 0.25), (1.0, 0.5, 0.25), (1.5, 0.75, 0.25)])
    times = StepTimes(gauges=lambda: next(readings))
    times.new_run()
    times.epoch_begins()
    for _ in range(3):  # the first execution traces: not timed, no gauge read
        times.begin()
        times.end(2)
    times.epoch_ends()
    assert times.timed_steps() == 4 and times.per_step() == (0.375, 0.1875, 0.0625)
    assert times.epoch_steps == 6 and times.epoch_seconds > 0
    times.clear()
    assert times.per_step() == (None, None, None) and times.epoch_steps == 0
    assert StepTimes().per_step() == (None, None, None)


def test_the_samplers_count_the_time_tensorflow_runs_the_users_input():
    now = iter([0.0, 0.05, 0.10, 0.15, 0.20])
    seen = iter([TensorFlowRuns(), TensorFlowRuns(input=True), TensorFlowRuns(py_functions=("f.py:3 in read",)),
                 TensorFlowRuns(input=True), TensorFlowRuns()])
    sampler = StackSampler(runs=lambda: next(seen), clock=lambda: next(now))
    for _ in range(5):
        sampler.sample()
    assert sampler.input_seconds == pytest.approx(0.10) and sampler.py_function_seconds == pytest.approx(0.05)


def test_infer_needs_a_timed_step():
    assert infer(step=0.0, cores=2, cpu_seconds=None, sampled_input=None, sampled_py_function=None).bottleneck is None


# The option users pass.

def _run_env(*flags: str) -> dict[str, str]:
    return run_environment(build_parser().parse_args(["run", *flags, "--", sys.executable, "-c", "pass"]))[1]


def test_profile_probes_is_an_option_of_run_and_launch(tmp_path):
    env = _run_env("--profile", "--profile-dir", str(tmp_path), "--profile-probes", "2")
    assert env["TFSTRATEGY_PROFILE_PROBES"] == "2"
    assert "TFSTRATEGY_PROFILE_PROBES" not in _run_env("--profile", "--profile-dir", str(tmp_path))
    options = LaunchOptions(command=("python", "t.py"), num_workers=2, profile_dir=tmp_path, profile_probes="0.5")
    assert worker_settings(options, {}).to_environ()["TFSTRATEGY_PROFILE_PROBES"] == "0.5"
    args = build_parser().parse_args(["launch", "-n", "2", "--profile", "--profile-probes", "3", "--", "python", "t"])
    assert args.profile_probes == "3"


@pytest.mark.parametrize(("flags", "message"), [
    pytest.param(("--profile", "--profile-probes", "0"), "Received --profile-probes 0; expected the share of the "
                 "time trained the report's probes may take, a number above 0", id="zero"),
    pytest.param(("--profile", "--profile-probes", "lots"), "Received --profile-probes lots;", id="not-a-number"),
    pytest.param(("--profile-probes", "2"), "Received --profile-probes 2 without --profile; expected it with the "
                 "report it sets the probes' share of: add --profile", id="without-profile"),
])
def test_a_bad_profile_probes_says_what_to_pass(flags, message, tmp_path):
    with pytest.raises(TrainingError) as raised:
        _run_env("--profile-dir", str(tmp_path), *flags)
    assert message in str(raised.value)
    options = LaunchOptions(command=("python", "t.py"), num_workers=2, profile_probes=flags[-1],
                            profile_dir=tmp_path if "--profile" in flags else None)
    with pytest.raises(TrainingError, match="Received --profile-probes"):
        worker_settings(options, {})
