"""The suite's time budget (tests/budget.py): the rules of the per-test ceiling and its named exceptions."""

from __future__ import annotations

import pytest

from budget import CEILING_SECONDS, BudgetError, granted_seconds


@pytest.mark.parametrize(
    ("over_ceiling", "timeout", "granted"),
    [
        pytest.param(None, None, None, id="no-marker-the-ceiling"),
        pytest.param(None, pytest.mark.timeout(30).mark, None, id="a-shorter-timeout-needs-no-grant"),
        pytest.param(pytest.mark.over_ceiling(seconds=400, reason="one Ray cluster").mark, None, 400.0, id="granted"),
        pytest.param(pytest.mark.over_ceiling(400, reason="positional seconds").mark, None, 400.0, id="positional"),
    ],
)
def test_a_grant_is_the_ceiling_or_a_named_exception(over_ceiling, timeout, granted):
    assert granted_seconds("t", over_ceiling, timeout) == granted


@pytest.mark.parametrize(
    ("over_ceiling", "timeout", "message"),
    [
        pytest.param(None, pytest.mark.timeout(1200).mark, r"received timeout\(1200\), above the per-test ceiling of "
                     r"120 s\. Make the test faster, or grant it with over_ceiling\(seconds=1200", id="bare-timeout"),
        pytest.param(pytest.mark.over_ceiling(seconds=400).mark, None, r"without a reason", id="no-reason"),
        pytest.param(pytest.mark.over_ceiling(seconds=400, reason="  ").mark, None, r"without a reason", id="blank-reason"),
        pytest.param(pytest.mark.over_ceiling(seconds=60, reason="short").mark, None,
                     r"received over_ceiling\(seconds=60\); an exception grants more than the 120 s", id="not-above"),
        pytest.param(pytest.mark.over_ceiling(reason="no seconds").mark, None, r"over_ceiling\(seconds=None\)",
                     id="no-seconds"),
    ],
)
def test_a_grant_that_breaks_the_rules_is_refused_saying_how_to_fix_it(over_ceiling, timeout, message):
    with pytest.raises(BudgetError, match=message):
        granted_seconds("t", over_ceiling, timeout)


def test_pyproject_sets_the_ceiling_as_pytest_timeout(pytestconfig):
    assert float(pytestconfig.getini("timeout")) == CEILING_SECONDS


def test_the_readme_and_contributing_quote_the_measured_figures_word_for_word():
    from budget import MEASURED, MEASURED_TESTS
    from helpers import ROOT

    readme, contributing = ((ROOT / name).read_text() for name in ("README.md", "CONTRIBUTING.md"))
    assert MEASURED_TESTS > 0 and all(MEASURED.values()), MEASURED
    assert MEASURED["make test"] in readme
    for target, figure in MEASURED.items():
        assert figure in contributing, f"CONTRIBUTING.md does not quote {target}'s measured figure {figure!r}"


def test_a_whole_run_much_larger_than_the_measured_suite_says_to_measure_again():
    from budget import MEASURED_TESTS, REMEASURE_GROWTH, stale_figures

    assert stale_figures(MEASURED_TESTS) is None
    assert stale_figures(int(MEASURED_TESTS * REMEASURE_GROWTH)) is None
    said = stale_figures(int(MEASURED_TESTS * REMEASURE_GROWTH) + 1)
    assert said is not None and f"the {MEASURED_TESTS} that the README's and CONTRIBUTING's figures" in said
    assert "update tests/budget.py's MEASURED and the docs" in said


@pytest.mark.parametrize(
    ("source", "options", "whole"),
    [
        pytest.param("TESTPATHS", {}, True, id="everything"),
        pytest.param("TESTPATHS", {"markexpr": "not extras"}, True, id="make-test-first-session"),
        pytest.param("TESTPATHS", {"markexpr": "extras"}, False, id="make-test-extras-session"),
        pytest.param("ARGS", {}, False, id="a-path"),
        pytest.param("TESTPATHS", {"markexpr": "not slow"}, False, id="test-fast"),
        pytest.param("TESTPATHS", {"keyword": "ray"}, False, id="keyword"),
        pytest.param("TESTPATHS", {"deselect": ["tests/x.py"]}, False, id="deselect"),
        pytest.param("TESTPATHS", {"lf": True}, False, id="last-failed"),
    ],
)
def test_only_a_whole_run_is_held_to_the_measured_figures(source, options, whole):
    from types import SimpleNamespace

    from budget import whole_run

    option = SimpleNamespace(**{"markexpr": "", "keyword": "", "deselect": None, **options})
    config = SimpleNamespace(args_source=getattr(pytest.Config.ArgsSource, source), option=option)
    assert whole_run(config) is whole  # type: ignore[arg-type]


def test_the_run_ends_with_its_cpu_against_its_cores_and_the_tests_that_used_the_most():
    from budget import CPU_LISTED, cpu_lines

    cpu = {f"tests/t.py::test_{i}": float(i) for i in range(CPU_LISTED + 5)}  # 0 + 1 + ... + 19 = 190 CPU-s
    lines = cpu_lines(cpu, wall=190.0, cores=2)
    assert lines[0].startswith("3.2 CPU-minutes in 3.2 min on 2 cores: the tests kept 50% of them busy")
    assert lines[1] == f"the {CPU_LISTED} tests that used the most CPU:"
    assert lines[2] == f"     {CPU_LISTED + 4:.1f} CPU-s tests/t.py::test_{CPU_LISTED + 4}" and len(lines) == 2 + CPU_LISTED
    assert cpu_lines({}, wall=10.0, cores=2) == []


def test_each_test_reports_the_cpu_of_the_processes_it_waited_for(pytester):
    from helpers import ROOT

    pytester.makeconftest(f'import sys\nsys.path.insert(0, {str(ROOT / "tests")!r})\npytest_plugins = ["budget"]')
    pytester.makepyfile(test_spin="""
        import subprocess, sys
        def test_child():
            subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.5\\n"
                            "while time.process_time() < end: pass"], check=True)
        def test_idle():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml=out.xml")
    result.assert_outcomes(passed=2)
    import xml.etree.ElementTree as ET

    spent = {case.get("name"): float(prop.get("value")) for case in ET.parse(pytester.path / "out.xml").iter("testcase")
             for prop in case.iter("property") if prop.get("name") == "cpu_seconds"}
    assert spent["test_child"] >= 0.5 and spent["test_idle"] < 0.2, spent


def test_a_test_still_running_at_three_quarters_of_its_time_leaves_its_stacks_in_the_run_s_end(pytester):
    from helpers import ROOT

    pytester.makeconftest(f'import sys\nsys.path.insert(0, {str(ROOT / "tests")!r})\npytest_plugins = ["budget"]')
    pytester.makepyfile(test_slow="""
        import time
        import pytest

        @pytest.mark.timeout(2)
        def test_waits_in_a_named_place():
            time.sleep(1.8)  # past 1.5 s, three quarters of its 2 s

        def test_quick():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    said = result.stdout.str()
    assert "still running at 75% of its time: test_slow.py::test_waits_in_a_named_place, after 2 s;" in said
    assert "threads in pytest process" in said and 'test_slow.py", line 6 in test_waits_in_a_named_place' in said
    assert "test_quick," not in said


def test_the_runs_end_tells_a_granted_test_from_one_the_timeout_could_not_stop_also_on_two_workers(pytester):
    """The grants are known where the items are collected: on two workers, the controller learns them from the
    reports (it once called every test past the ceiling "an over_ceiling exception", a grant it never had)."""
    from helpers import ROOT

    pytester.makeconftest(f'import sys\nsys.path.insert(0, {str(ROOT / "tests")!r})\nimport budget\n'
                          'budget.CEILING_SECONDS = 1\npytest_plugins = ["budget"]')
    pytester.makepyfile(test_over="""
        import time
        import pytest

        @pytest.mark.over_ceiling(seconds=30, reason="a named exception")
        def test_granted():
            time.sleep(1.2)

        def test_not_granted():
            time.sleep(1.2)  # past the 1 s ceiling, with no timeout to stop it here
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=2)
    said = result.stdout.str()
    assert "test_over.py::test_granted (granted 30 s: a named exception)" in said, said
    assert "test_over.py::test_not_granted (no grant: pytest-timeout could not stop it" in said, said
