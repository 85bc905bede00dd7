"""The suite's time budget, enforced by the suite itself (a pytest plugin that ``conftest.py`` loads).

Two limits, so that growth is seen the day it is added, not a round later:

- **The per-test ceiling**: every test, its fixtures' set-up and tear-down included, must end within
  ``CEILING_SECONDS`` (pytest-timeout's ``timeout`` in ``pyproject.toml``, which must say the same).
  A test that needs longer is a named exception with its reason::

      @pytest.mark.over_ceiling(seconds=400, reason="one Ray cluster for every job of the module")

  A bare ``@pytest.mark.timeout(N)`` above the ceiling is refused at collection: the reason is the point.
- **The suite's budget**: a whole run of ``make test`` (every tier, two pytest workers) should take at most
  ``SUITE_MINUTES``. The run prints its wall time against it and each exception's measured time against
  its grant.
- **Where the time goes**: each test's CPU seconds (its process's and every child process it waited for, the
  workers a launcher ran included), which unlike its wall time do not depend on what ran beside it. The run ends
  with its CPU time against its wall time on this machine's cores (how busy the run kept them: a low share says
  tests wait, a high one that only less work makes the run shorter) and the tests that used the most.
- **Stalls, shown**: a test still running at ``STACKS_AT`` of its time (the ceiling or its grant) has every
  Python thread's stack and its process's thread count taken once, and the run's end prints them: a test that
  takes minutes once in many runs (seen: TensorFlow steps inside a long-lived pytest worker) leaves evidence.
- **The quoted figures**: the README and CONTRIBUTING quote ``MEASURED`` word for word (``tests/test_budget.py``),
  and a whole run that collects more than ``REMEASURE_GROWTH`` times the tests they were measured with fails,
  saying to measure them anew, so that they cannot go stale.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
import threading
import time

import pytest

#: Seconds one test may take (set-up, call and tear-down), unless granted more with ``over_ceiling``.
CEILING_SECONDS = 120
#: Minutes a whole ``make test`` run may take on 2 cores (pytest's part; lint adds about a minute).
SUITE_MINUTES = 30

#: The figures the README and CONTRIBUTING quote, each as they write it, measured on this project's 2-core
#: development machine with nothing else running (CONTRIBUTING: "Measuring the suite"). When the suite grows
#: past ``REMEASURE_GROWTH`` times ``MEASURED_TESTS``, measure again and update these and the docs together.
MEASURED_TESTS = 2428
MEASURED = {
    "make test": "27 min 14 s of pytest (2,441 tests: 24 min 18 s in .venv, then 2 min 56 s for the 13 marked extras)",
    "make test-fast": "2 min 3 s (2,091 tests)",
    "make test-extended": "about 19 minutes (its 53 tests' times in the measured make test)",
    ".ci/versions": "2 min 17 s (both venvs)",
}
REMEASURE_GROWTH = 1.15
#: How many of the tests that used the most CPU a run lists at its end.
CPU_LISTED = 15
#: The report property (``user_properties``, so it crosses from a pytest-xdist worker) holding a test's CPU seconds.
CPU_PROPERTY = "cpu_seconds"
_CPU_AT_SETUP = pytest.StashKey[float]()
#: The share of a test's time (the ceiling, or its grant) after which its process's stacks are taken.
STACKS_AT = 0.75
#: The report property holding those stacks.
STACKS_PROPERTY = "stacks_while_slow"
#: The report property holding a test's grant, ``(seconds, reason)``: a pytest-xdist controller collects no items,
#: so it learns the grants from the workers' reports.
GRANT_PROPERTY = "over_ceiling_grant"
_STACKS = pytest.StashKey["SlowTestStacks"]()


class SlowTestStacks:
    """Every Python thread's stack once ``seconds`` have passed, unless stopped first.

    faulthandler's watchdog is a C thread: it writes the stacks even while a C extension holds Python's lock (a stall
    inside TensorFlow may), where a Python timer would wait for the lock and show the stacks after the stall.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._file = tempfile.TemporaryFile("w+")
        faulthandler.dump_traceback_later(seconds, file=self._file)

    def stop(self) -> str | None:
        """The stacks taken, if the time passed (with the process's thread count now), else ``None``."""
        faulthandler.cancel_dump_traceback_later()
        self._file.seek(0)
        stacks = self._file.read()
        self._file.close()
        if not stacks:
            return None
        threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else threading.active_count()
        return (f"after {self.seconds:.0f} s; {threads} threads in pytest process {os.getpid()} when it ended; "
                f"Python stacks:\n{stacks}")


def cpu_seconds() -> float:
    """CPU seconds this process and its waited-for children used so far (user and system)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class BudgetError(pytest.UsageError):
    """A test's time grant that breaks the budget's rules (raised at collection)."""


def granted_seconds(name: str, over_ceiling: pytest.Mark | None, timeout: pytest.Mark | None) -> float | None:
    """The timeout a test gets: ``None`` for the ceiling, else its exception's grant.

    Raises:
        BudgetError: an ``over_ceiling`` without its reason or not above the ceiling, or a bare
            ``timeout`` above the ceiling.
    """
    if over_ceiling is not None:
        seconds = over_ceiling.kwargs.get("seconds", over_ceiling.args[0] if over_ceiling.args else None)
        reason = str(over_ceiling.kwargs.get("reason", "")).strip()
        if not isinstance(seconds, (int, float)) or seconds <= CEILING_SECONDS:
            raise BudgetError(f"{name}: received over_ceiling(seconds={seconds!r}); an exception grants more than the "
                              f"{CEILING_SECONDS} s ceiling. Pass seconds=N with N > {CEILING_SECONDS}, or drop the marker.")
        if not reason:
            raise BudgetError(f"{name}: received over_ceiling(seconds={seconds}) without a reason; each exception to the "
                              f"{CEILING_SECONDS} s ceiling says why: over_ceiling(seconds={seconds}, reason='...').")
        return float(seconds)
    if timeout is not None:
        seconds = timeout.kwargs.get("timeout", timeout.args[0] if timeout.args else None)
        if isinstance(seconds, (int, float)) and seconds > CEILING_SECONDS:
            raise BudgetError(f"{name}: received timeout({seconds}), above the per-test ceiling of {CEILING_SECONDS} s. "
                              f"Make the test faster, or grant it with over_ceiling(seconds={seconds}, reason='...').")
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"over_ceiling(seconds, reason): a named exception to the {CEILING_SECONDS} s per-test ceiling, with its reason",
    )
    configured = config.getini("timeout")
    if configured and float(configured) != CEILING_SECONDS:
        raise BudgetError(f"pyproject.toml sets timeout = {configured}; tests/budget.py's ceiling is {CEILING_SECONDS} s. "
                          "Make them agree (the ceiling is the budget's, pytest-timeout enforces it).")
    config.pluginmanager.register(BudgetWatch(), "tfstrategy-budget")


class BudgetWatch:
    """Grants the exceptions their time at collection; says the run's time against the budget at its end."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.granted: dict[str, tuple[float, str]] = {}
        self.taken: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.stacks: dict[str, str] = {}
        #: Set at a whole run's end when the quoted figures were measured on a much smaller suite.
        self.stale: str | None = None

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            over = item.get_closest_marker("over_ceiling")
            seconds = granted_seconds(item.nodeid, over, item.get_closest_marker("timeout"))
            if seconds is not None and over is not None:
                item.add_marker(pytest.mark.timeout(seconds))
                self.granted[item.nodeid] = (seconds, str(over.kwargs["reason"]))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        item.stash[_CPU_AT_SETUP] = cpu_seconds()
        timeout = item.get_closest_marker("timeout")
        limit = float(timeout.args[0]) if timeout is not None and timeout.args else float(CEILING_SECONDS)
        item.stash[_STACKS] = SlowTestStacks(limit * STACKS_AT)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        if call.when == "teardown" and _CPU_AT_SETUP in item.stash:  # before the report copies the properties
            item.user_properties.append((CPU_PROPERTY, round(cpu_seconds() - item.stash[_CPU_AT_SETUP], 2)))
            stacks = item.stash[_STACKS].stop() if _STACKS in item.stash else None
            if stacks is not None:
                item.user_properties.append((STACKS_PROPERTY, stacks))
            if item.nodeid in self.granted:
                item.user_properties.append((GRANT_PROPERTY, list(self.granted[item.nodeid])))
        yield

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.taken[report.nodeid] = self.taken.get(report.nodeid, 0.0) + report.duration
        for name, value in report.user_properties:
            if name == CPU_PROPERTY:
                self.cpu[report.nodeid] = float(value)
            elif name == STACKS_PROPERTY:
                self.stacks[report.nodeid] = str(value)
            elif name == GRANT_PROPERTY:
                self.granted[report.nodeid] = (float(value[0]), str(value[1]))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
        if hasattr(config, "workerinput") or not self.taken:  # a pytest-xdist worker: the controller says it, once
            return
        wall = time.monotonic() - self.started
        terminalreporter.section("time budget")
        terminalreporter.write_line(
            f"{len(self.taken)} tests in {wall // 60:.0f} min {wall % 60:02.0f} s of wall time; the budget: "
            f"{SUITE_MINUTES} min for a whole make test, {CEILING_SECONDS} s a test (tests/budget.py)"
        )
        over = sorted(((seconds, nodeid) for nodeid, seconds in self.taken.items() if seconds > CEILING_SECONDS),
                      reverse=True)
        for seconds, nodeid in over:
            grant = self.granted.get(nodeid)
            why = (f"granted {grant[0]:.0f} s: {grant[1]}" if grant else
                   "no grant: pytest-timeout could not stop it, a thread held Python's lock in C code")
            terminalreporter.write_line(f"  over the ceiling: {seconds:6.1f} s {nodeid} ({why})")
        for line in cpu_lines(self.cpu, wall, os.cpu_count() or 1):
            terminalreporter.write_line(line)
        for nodeid, stacks in self.stacks.items():
            terminalreporter.write_line(f"still running at {STACKS_AT:.0%} of its time: {nodeid}, {stacks}")
        if self.stale is not None:
            terminalreporter.write_line(self.stale, red=True)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = session.config
        if hasattr(config, "workerinput") or not whole_run(config):
            return
        self.stale = stale_figures(len(self.taken))
        if self.stale is not None and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def cpu_lines(cpu: dict[str, float], wall: float, cores: int) -> list[str]:
    """The run's CPU time against its wall time on ``cores``, then the tests that used the most CPU."""
    if not cpu:
        return []
    total = sum(cpu.values())
    lines = [f"{total / 60:.1f} CPU-minutes in {wall / 60:.1f} min on {cores} cores: the tests kept "
             f"{total / (wall * cores):.0%} of them busy (CPU of each test's process and the processes it waited for)",
             f"the {min(CPU_LISTED, len(cpu))} tests that used the most CPU:"]
    lines.extend(f"  {seconds:7.1f} CPU-s {nodeid}" for seconds, nodeid in
                 sorted(((seconds, nodeid) for nodeid, seconds in cpu.items()), reverse=True)[:CPU_LISTED])
    return lines


#: The marker expression of ``make test``'s first session (``.venv``: every test but the few marked ``extras``, which
#: its second session runs in ``.venvs/extras``); for the figures, that session is the whole run.
MAIN_SESSION = "not extras"


def whole_run(config: pytest.Config) -> bool:
    """Whether this run is all of ``make test`` (or its first session): no paths, keywords or other markers select a
    part."""
    option = config.option
    return (config.args_source is pytest.Config.ArgsSource.TESTPATHS and option.markexpr in ("", MAIN_SESSION)
            and not option.keyword and not option.deselect and not getattr(option, "lf", False))


def stale_figures(collected: int) -> str | None:
    """What a whole run of ``collected`` tests says when the quoted figures are older than the suite."""
    if collected <= MEASURED_TESTS * REMEASURE_GROWTH:
        return None
    return (f"time budget: this run has {collected} tests, more than {REMEASURE_GROWTH:g}x the {MEASURED_TESTS} "
            "that the README's and CONTRIBUTING's figures were measured with; measure make test, make test-fast "
            "and .ci/versions again and update tests/budget.py's MEASURED and the docs (CONTRIBUTING: 'Measuring "
            "the suite')")
