"""Every console sample of the docs is checked by the process test that produces it (``docs_samples.py``)."""

from __future__ import annotations

import re

import pytest

from docs_samples import all_samples, line_pattern, unmatched
from helpers import ROOT


def _claims() -> dict[str, list[str]]:
    """Each sample name and the test files that call ``assert_sample`` with it."""
    claims: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for name in re.findall(r"assert_sample\(\s*\"([^\"]+)\"", path.read_text(encoding="utf-8")):
            claims.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return claims


def test_every_sample_of_the_docs_is_checked_by_a_test_and_every_check_has_its_sample():
    samples, claims = all_samples(), _claims()
    assert samples, "no docs-sample found: the marker or the pages moved"
    unclaimed = sorted(set(samples) - set(claims))
    assert not unclaimed, f"samples no test produces (call docs_samples.assert_sample in the test that runs it): {unclaimed}"
    assert not sorted(set(claims) - set(samples)), f"tests check samples no page has: {claims}"


@pytest.mark.parametrize(
    ("sample", "real", "fits"),
    [
        pytest.param("stopped every worker 0.2 s after the failure", "stopped every worker 1.7 s after the failure", True,
                     id="decimal-seconds"),
        pytest.param("the job failed after 23 s; exit status 1", "the job failed after 131 s; exit status 1", True,
                     id="whole-seconds"),
        pytest.param("the job failed after 23 s; exit status 1", "the job failed after 23 s; exit status 2", False,
                     id="exit-status-exact"),
        pytest.param("worker 1 plans 7 batch(es)", "worker 0 plans 7 batch(es)", False, id="worker-exact"),
        pytest.param("worker 1 plans 7 batch(es)", "worker 1 plans 8 batch(es)", False, id="count-exact"),
        pytest.param("on 127.0.0.1:36425", "on 127.0.0.1:41007", True, id="port"),
        pytest.param("on 127.0.0.1:36425, 127.0.0.1:49167", "on 127.0.0.1:39309, 127.0.0.1:36579", True,
                     id="ports-in-a-list"),
        pytest.param("on 127.0.0.1:36425", "on 127.0.0.2:36425", False, id="address-exact"),
        pytest.param("what the launcher saw: worker 1 exited ...", "what the launcher saw: worker 1 exited with 1", True,
                     id="prefix"),
        pytest.param("what the launcher saw: worker 1 exited", "what the launcher saw: worker 1 exited with 1", False,
                     id="whole-line"),
        pytest.param("output in DIR", "output in /tmp/x/run-1", True, id="dir"),
        pytest.param("restored /tmp/tmp_85rw6c4/model.weights.h5 (weights.h5)",
                     "restored /tmp/tmpab12/model.weights.h5 (weights.h5)", True, id="file-any-directory"),
        pytest.param("max_weight_difference=1.2e-07", "max_weight_difference=0.0e+00", True, id="exponent"),
        pytest.param("(at tests/workers/fault_worker.py:65 in f)", "(at /work/tests/workers/fault_worker.py:63 in f)",
                     True, id="python-file-any-path-and-line"),
        pytest.param("(at tests/workers/fault_worker.py:65 in f)", "(at /work/tests/workers/fit_worker.py:65 in f)",
                     False, id="python-file-name-exact"),
        pytest.param("it waits 0.10 s a step, 50.0x its peers'", "it waits 0.09 s a step, 87.7x its peers'", True,
                     id="ratio"),
        pytest.param("CPU 4.95 ms a step, 12% of 2 core(s)", "CPU 3.10 ms a step, 9% of 2 core(s)", True, id="percent"),
        pytest.param("CPU 12% of 2 core(s)", "CPU 12% of 4 core(s)", False, id="cores-exact"),
        pytest.param("the job: 1,494 in-step examples/s", "the job: 873 in-step examples/s", True, id="thousands"),
        pytest.param("from step 1,200", "from step 1,300", True, id="thousands-any"),
        pytest.param("(561/s over the epochs' wall time)", "(498/s over the epochs' wall time)", True, id="rate"),
        pytest.param("a step, 3x its peers'", "a step, 12x its peers'", True, id="whole-ratio"),
    ],
)
def test_a_sample_line_matches_measurements_and_keeps_the_rest_exact(sample, real, fits):
    assert bool(line_pattern(sample).match(real)) is fits


def test_the_sample_must_appear_in_order_with_other_lines_between():
    console = "a 1\n[worker 0] noise\nb 2\nc 3\n"
    assert unmatched(["a 1", "b 2", "...", "c 3"], console) == []
    assert unmatched(["b 2", "a 1"], console) == ["a 1"]
    assert unmatched(["a 1", "d 4"], console) == ["d 4"]
