"""Shares when the probes and the steps disagree: the probes are scaled to the step.

The figures are runs of benchmarks/profile_report.py (2 cores shared with other jobs).
"""

from __future__ import annotations

import pytest

from tfstrategy.performance.verdict import Measurements, shares, verdict


def measured(step: float, **fields) -> Measurements:
    return Measurements(**{"step_seconds": (step,) * 9, "steps": 900, "seconds": 900 * step, "global_batch": 64,
                           "replicas": 1, "cores": 2, **fields})


def test_a_step_longer_than_cached_step_plus_input_is_shared_in_the_probes_proportions():
    # Slow sequential map, 1 replica: 33.3 ms a step, 2.86 ms on a cached batch, the input alone 15.1 ms (at a
    # quieter moment). Capping the wait at 15.1 ms left 18 ms of "compute" to a step whose whole cached run is 2.86 ms.
    report = verdict(measured(0.03326, synthetic=0.00286, input_batch=0.01511))
    assert report.bottleneck == "input"
    assert report.shares["input"] == pytest.approx(0.01511 / (0.00286 + 0.01511))


def test_a_step_shorter_than_the_cached_step_is_not_scaled():
    # Wide MLP on 4 logical replicas: 20.3 ms a step, 35.8 ms on a cached batch of which 12.7 ms all-reduce: the
    # all-reduce as measured, compute the rest (scaling it down too flipped a 2-worker verdict, 54% -> 49% reduction).
    split = shares(0.02032, measured(0.02032, replicas=4, synthetic=0.03575, input_batch=0.0024, allreduce=0.01268))
    assert split == pytest.approx({"input": 0.0, "reduction": 0.01268 / 0.02032, "dispatch": 0.0,
                                   "compute": 1 - 0.01268 / 0.02032})


def test_a_step_the_probes_explain_is_split_as_measured():
    split = shares(0.010, measured(0.010, replicas=2, workers=2, synthetic=0.0099, input_batch=0.001, allreduce=0.007))
    assert split == pytest.approx({"input": 0.01, "reduction": 0.7, "dispatch": 0.0, "compute": 0.29})


def test_the_step_on_the_data_beside_the_cached_step_names_input_the_pipeline_alone_hides():
    # Slow sequential map on 4 logical replicas: the pipeline alone is fast (3.5 ms) but competes with the
    # replicas for the 2 cores while training (30 ms a step). Timed beside the cached step (8 ms), the step on
    # the data (27 ms) shows the wait; scaled to the pipeline alone, the same step read as compute-bound.
    fields = {"replicas": 4, "synthetic": 0.008, "input_batch": 0.0035}
    with_twin = verdict(measured(0.030, data_step=0.027, **fields))
    assert with_twin.bottleneck == "input"
    assert with_twin.shares["input"] == pytest.approx(1 - 0.008 * 0.030 / 0.027 / 0.030)
    assert verdict(measured(0.030, **fields)).bottleneck == "compute"
