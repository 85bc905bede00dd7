"""The job's one report from every worker's figures, its picture, and the probes' budget (pure: no TensorFlow)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from tfstrategy.errors import TrainingError
from tfstrategy.performance.environment import tracker_from_environment, valid_probe_share
from tfstrategy.performance.job import NUMBERS, ROW, combine, figures_of, figures_row, from_row
from tfstrategy.performance.picture import COLOURS, html, svg
from tfstrategy.performance.timing import StepTimes, plan_probes
from tfstrategy.performance.verdict import PARTS, UNSPLIT, Measurements, verdict

SVG = "{http://www.w3.org/2000/svg}"


def measured(step: float = 0.0276, **fields) -> Measurements:
    base = {"step_seconds": (step,) * 9, "steps": 116, "seconds": 4.2, "global_batch": 256, "replicas": 2,
            "workers": 2, "cores": 2, "synthetic": 0.9 * step, "data_step": step, "input_batch": 0.002,
            "allreduce": 0.006, "probe_seconds": 0.3}
    return Measurements(**{**base, **fields})


def worker(index: int, **fields):
    """A worker's figures as worker 0 sees them after the all-gather (its row, read back)."""
    m = measured(worker=index, **fields)
    return from_row(figures_row(figures_of(verdict(m), 1)), m)


def two_workers(**second):
    # The run of issue 35: the same 116 steps took 4.2 s on worker 0 and 9.1 s on worker 1.
    return combine([worker(1, seconds=9.1, **second), worker(0)])


def test_the_job_has_one_throughput_and_each_worker_its_share():
    job = two_workers()
    assert job.examples_per_second == pytest.approx(116 * 256 / 4.2)
    assert [figures.worker for figures in job.workers] == [0, 1]
    assert [job.worker_examples_per_second(figures) for figures in job.workers] == [
        pytest.approx(116 * 256 / 4.2 / 2)] * 2
    assert job.waited(job.workers[1]) == pytest.approx(4.9) and job.waited(job.workers[0]) == 0
    text = job.text()
    assert text.count(" examples/s;") == 1 and "  the job: 7,070 in-step examples/s;" in text
    assert "  worker 0: 1 replica, 50% of the examples (3,535 examples/s)" in text
    assert "4.9 s more in its steps than the job (waiting for another worker)" in text
    data = json.loads(job.json())
    assert data["examples_per_second"] == pytest.approx(7070.5, abs=0.1) and data["workers"] == 2
    assert [w["share_of_examples"] for w in data["per_worker"]] == [0.5, 0.5]


def test_a_worker_with_more_replicas_has_the_larger_share():
    m0, m1 = measured(worker=0, replicas=3), measured(worker=1, replicas=3)
    job = combine([figures_of(verdict(m0), 2), figures_of(verdict(m1), 1)])
    assert job.replicas == 3
    assert [round(job.worker_examples_per_second(f) / job.examples_per_second, 3) for f in job.workers] == [0.667,
                                                                                                             0.333]


def test_the_job_verdict_is_the_mean_of_the_workers_shares():
    # Worker 0 waits for input (its step on the data is twice its cached step); worker 1 does not.
    job = combine([worker(0, synthetic=0.0138, allreduce=0.0), worker(1, synthetic=0.0276, allreduce=0.0)])
    assert job.workers[0].bottleneck == "input" and job.workers[1].bottleneck == "compute"
    assert job.shares["input"] == pytest.approx(0.25) and job.shares["compute"] == pytest.approx(0.75)
    assert job.bottleneck == "compute"
    assert job.recommendations[0].part == "compute" and job.recommendations[1].part == "input"


def test_a_row_carries_every_number_and_the_probes_that_did_not_run():
    m = measured(worker=3, workers=4, replicas=8, waited=None, data_step=None, larger_k=(4, 0.001),
                 synthetic_fastest=0.02, pipeline_ops=("MapDataset",), not_probed={"reduction": "budget"})
    figures = figures_of(verdict(m), 2)
    row = figures_row(figures)
    assert len(row) == ROW and math.isnan(row[4 + len(PARTS) + NUMBERS.index("data_step")])
    back = from_row(row, measured())
    assert back.worker == 3 and back.replicas == 2 and back.measurements.workers == 4
    assert back.measurements.data_step is None and back.measurements.waited is None
    assert back.measurements.larger_k == (4, 0.001) and back.shares == figures.shares
    assert back.median == figures.median and back.split
    with pytest.raises(ValueError, match=f"Received a row of 3 numbers; expected {ROW}"):
        from_row([1.0, 2.0, 3.0], m)


def _random_measurements(rng: random.Random) -> Measurements:
    step = rng.uniform(0.001, 0.1)
    maybe = lambda value: value if rng.random() < 0.7 else None  # noqa: E731
    larger = (4, rng.uniform(0.0, step)) if rng.random() < 0.3 else None
    workers = rng.choice([1, 2])
    replicas = workers * rng.choice([1, 2])
    allreduce = maybe(rng.uniform(0.0, 1.0) * step) if replicas > 1 else None  # probed on 2+ replicas only
    return measured(step, synthetic=rng.uniform(0.1, 1.2) * step, data_step=maybe(rng.uniform(0.5, 1.5) * step),
                    input_batch=maybe(rng.uniform(0.0, 2.0) * step), allreduce=allreduce,
                    outside=rng.uniform(0.0, 0.3) * step, larger_k=larger,
                    synthetic_fastest=rng.uniform(0.5, 1.0) * step if larger else None,
                    replicas=replicas, workers=workers)


def test_the_first_recommendation_always_addresses_the_bottleneck():
    rng = random.Random(35)
    for _ in range(2000):
        single = verdict(_random_measurements(rng))
        assert single.recommendations and single.recommendations[0].part == single.bottleneck, single.text()
        assert len(single.recommendations) <= 2
        job = combine([from_row(figures_row(figures_of(verdict(_random_measurements(rng)), 1)), measured(worker=i))
                       for i in range(2)])
        assert job.recommendations[0].part == job.bottleneck, job.text()
        assert {r.part for r in job.recommendations} <= {*PARTS}


def test_a_job_whose_probes_did_not_run_says_so_instead_of_a_bottleneck():
    skipped = {"synthetic and input": "would cost about 6 s, past the probes' budget of 0.42 s"}
    job = two_workers(synthetic=None, data_step=None, input_batch=None, allreduce=None)
    assert job.bottleneck == "compute"  # worker 0 was split: the job's verdict rests on it
    unsplit = combine([worker(i, synthetic=None, data_step=None, input_batch=None, allreduce=None,
                              not_probed=skipped) for i in range(2)])
    assert unsplit.bottleneck == UNSPLIT and [r.part for r in unsplit.recommendations] == [UNSPLIT]
    text = unsplit.text()
    assert "where a step goes: not split" in text and "not probed: synthetic and input: would cost about 6 s" in text


def test_the_report_states_what_the_probes_cost_and_were_allowed():
    job = combine([worker(0, probe_seconds=0.21, seconds=4.2)], probe_share=0.1)
    assert job.probe_cost() == pytest.approx(0.05)
    assert job.text().splitlines()[-1].startswith("  report cost: probes 0.21 s (5.0% of the 4.2 s trained; "
                                                  "allowed 10%)")
    assert json.loads(job.json())["cost"]["allowed_share"] == 0.1


# The probes' budget.

def test_a_short_run_gets_no_probe_that_would_cost_more_than_its_share():
    # Issue 35's run: 2.6 s trained, a 27 ms step, a 4 s traced first execution: probes cost 4 s (152%).
    plan = plan_probes(trained=2.6, share=0.1, step=0.0276, setup=4.0, reduction_wanted=True, larger_k_wanted=True)
    assert not (plan.input or plan.reduction or plan.larger_k) and plan.estimate == 0
    assert set(plan.skipped) == {"input", "reduction"}
    assert plan.skipped["input"] == "would cost about 4.3 s, past the probes' budget of 0.26 s (10% of the 2.6 s trained)"


def test_a_probe_skipped_after_others_says_what_they_took_of_the_budget():
    # A 1 s probe is not past a 5.5 s budget alone: past what the probes before it left of it (the guide's report).
    plan = plan_probes(trained=3.0, share=1.0, step=0.02, setup=1.0, reduction_wanted=True, larger_k_wanted=True)
    assert plan.input and plan.reduction and not plan.larger_k, plan
    said = plan.skipped["larger K"]
    cost, spent, budget = (float(x) for x in re.match(
        r"would cost about ([0-9.]+) s after the ([0-9.]+) s planned for the probes before it, past the probes' "
        r"budget of ([0-9.]+) s \(100% of the 3 s trained\)$", said).groups())
    assert cost < budget < cost + spent + 0.05, said


def test_a_long_run_gets_every_probe_and_a_larger_share_allows_a_short_one():
    long = plan_probes(trained=300, share=0.1, step=0.0276, setup=4.0, reduction_wanted=True, larger_k_wanted=True)
    assert long.input and long.reduction and long.larger_k and not long.skipped
    assert long.executions == 10  # 0.25 s of 27.6 ms calls
    short = plan_probes(trained=2.6, share=3.0, step=0.0276, setup=4.0, reduction_wanted=True)
    assert short.input and short.reduction


@pytest.mark.parametrize(("trained", "share", "step", "setup"),
                         list(itertools.product([0.5, 3, 30, 600], [0.05, 0.1, 1.0], [0.001, 0.03, 0.5], [0, 2])))
def test_the_planned_probes_fit_their_budget_and_the_most_telling_come_first(trained, share, step, setup):
    plan = plan_probes(trained=trained, share=share, step=step, setup=setup, reduction_wanted=True,
                       larger_k_wanted=True)
    assert plan.estimate <= plan.budget == pytest.approx(share * trained)
    assert plan.input or not plan.larger_k  # the larger K times against the cached step
    assert plan.executions >= 3 and plan.input_batches >= 3 and plan.reduce_rounds >= 3


def test_the_traced_first_execution_is_kept_as_the_probes_fixed_cost():
    times = StepTimes()
    times.new_run()
    times.begin(0.0)
    times.end(1)  # untimed: it traced
    assert times.warm_up_seconds > 0 and times.steps == []
    times.clear()
    assert times.warm_up_seconds > 0


@pytest.mark.parametrize("value", [0, -0.1, "soon", True, float("nan"), float("inf")])
def test_a_probe_share_must_be_a_number_above_0(value):
    with pytest.raises(TrainingError, match=r"Received probe_share=.*; expected the share of the time trained"):
        valid_probe_share(value)


def test_the_probe_share_variable_is_read_and_checked(tmp_path):
    env = {"TFSTRATEGY_PROFILE": str(tmp_path), "TFSTRATEGY_PROFILE_PROBES": "0.25"}
    assert tracker_from_environment(env)["probe_share"] == 0.25
    assert "probe_share" not in tracker_from_environment({"TFSTRATEGY_PROFILE": str(tmp_path)})
    with pytest.raises(TrainingError, match="Received TFSTRATEGY_PROFILE_PROBES='a lot'"):
        tracker_from_environment({**env, "TFSTRATEGY_PROFILE_PROBES": "a lot"})


# The picture.

class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_the_picture_is_one_well_formed_self_contained_file():
    page = html(two_workers())
    root = ET.fromstring(page.encode())  # well-formed XML (XHTML)
    assert root.tag == "{http://www.w3.org/1999/xhtml}html"
    parser = _Tags()
    parser.feed(page)
    tags = [tag for tag, _ in parser.tags]
    assert "svg" in tags and "script" not in tags and "img" not in tags and "link" not in tags
    assert not [attrs for _, attrs in parser.tags if {"src", "href"} & set(attrs)]
    assert "url(" not in page and "@import" not in page
    assert [ns for ns in ("http://", "https://") if page.count(ns) != page.count(f'xmlns="{ns}')] == []


def test_the_picture_draws_each_workers_step_split_into_its_parts():
    job = two_workers(synthetic=0.0138, step_seconds=(0.0552,) * 9)
    drawing = ET.fromstring(svg(job))
    bars: dict[str, float] = {}
    for rect in drawing.iter(f"{SVG}rect"):
        title = rect.find(f"{SVG}title")
        if title is not None:
            part = title.text.split(":")[0]
            bars.setdefault(part, 0.0)
            assert rect.get("fill") == COLOURS[part]
    labels = [text.text for text in drawing.iter(f"{SVG}text")]
    assert "worker 0 (50% of examples)" in labels and "worker 1 (50% of examples)" in labels
    assert "55.2 ms" in labels and "27.6 ms" in labels
    # Worker 1's bar is twice worker 0's: the widths of its segments sum to twice.
    rows: dict[str, float] = {}
    for rect in drawing.iter(f"{SVG}rect"):
        if rect.find(f"{SVG}title") is not None:
            rows[rect.get("y")] = rows.get(rect.get("y"), 0.0) + float(rect.get("width"))
    widths = sorted(rows.values())
    assert widths[-1] == pytest.approx(2 * widths[0], rel=0.01)
    assert set(bars) <= set(COLOURS)


def test_an_unsplit_step_is_drawn_as_one_grey_bar():
    job = combine([worker(0, synthetic=None, data_step=None, input_batch=None, allreduce=None)])
    drawing = ET.fromstring(svg(job))
    titles = [rect.find(f"{SVG}title").text for rect in drawing.iter(f"{SVG}rect")
              if rect.find(f"{SVG}title") is not None]
    assert titles == ["not split: the probes did not run"] * 2  # the job's bar, and the worker's
    assert dataclasses.asdict(job.recommendations[0])["part"] == UNSPLIT


@pytest.mark.extras  # matplotlib measures the font
def test_every_label_of_the_picture_fits_inside_it():
    """The labels were clipped on the left (``rker 0 (50% of examples)``): measured with a real font's metrics
    (DejaVu Sans, as wide as common sans-serif fonts get), every text lies within the drawing."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    font, measure = FontProperties(family="DejaVu Sans", size=13), TextToPath()
    for job in (two_workers(), combine([worker(i, replicas=24) for i in range(12)])):  # "worker 11 (8% of examples)"
        drawing = ET.fromstring(svg(job))
        width = float(drawing.get("width"))
        for text in drawing.iter(f"{SVG}text"):
            wide, _, _ = measure.get_text_width_height_descent(text.text, font, ismath=False)
            x = float(text.get("x"))
            left = {"end": x - wide, "middle": x - wide / 2}.get(text.get("text-anchor") or "", x)
            assert 0 <= left and left + wide <= width, (text.text, left, wide, width)


def test_the_picture_says_which_examples_per_second_it_shows():
    job = combine([worker(0, epoch_seconds=8.0, epoch_steps=116)])
    page = html(job)
    assert "in-step examples/s</b> (3,712/s over the epochs' wall time" in page  # 116 x 256 / 8 s
    assert "examples/s</b>" not in page.replace("in-step examples/s</b>", "")
