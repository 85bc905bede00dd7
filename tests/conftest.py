"""Shared test set-up.

Logical devices can only be configured before the TensorFlow runtime starts,
so the CPU is split into ``CPU_REPLICAS`` logical devices once, here, before any
test runs. Tests then use 1, 2 or 4 of them as replicas.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from helpers import CPU_REPLICAS, PORT_RANGE_VARIABLE
from tfstrategy.selection.cpu_split import configure_cpu_replicas

pytest_plugins = ["budget", "iterator_lifetimes", "pytester"]  # budget: the per-test ceiling and the suite's time budget; iterator_lifetimes: each test's multi-device iterators freed when it ends; pytester: tests/test_budget.py runs a suite of its own

configure_cpu_replicas(CPU_REPLICAS)


def _ports_of_this_pytest_worker() -> None:
    """Under pytest-xdist, give each pytest worker 2000 ports of its own from 10000 (below the ephemeral range).

    TensorFlow's servers listen on every address, so a port one test picked on 127.0.0.3 could be taken on
    0.0.0.0 by the workers of a test running beside it. With a range each, the launches (``--port-range``
    from the variable) and the tests' own picks (``helpers.free_ports``) of the pytest workers never meet.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < 5:
        low = 10000 + 2000 * int(worker[2:])
        os.environ[PORT_RANGE_VARIABLE] = f"{low}-{low + 1999}"


_ports_of_this_pytest_worker()
WATCHED_ENV_PREFIXES = ("TFSTRATEGY_", "TF_CONFIG", "CUDA_VISIBLE_DEVICES", "SLURM_")


def _watched_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key.startswith(WATCHED_ENV_PREFIXES)}


def _missing_extras() -> list[str]:
    return [name for name in ("ray", "matplotlib") if importlib.util.find_spec(name) is None]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked ``extras`` run where Ray or matplotlib is missing is skipped with where it runs."""
    missing = _missing_extras()
    if missing:
        skip = pytest.mark.skip(reason=f"needs {' and '.join(missing)} (the ray and bench extras): make test runs "
                                       "it in .venvs/extras")
        for item in items:
            if item.get_closest_marker("extras") is not None:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_leaked_environment():
    """Fail a test that leaves TFSTRATEGY_*/TF_CONFIG/... changed (use monkeypatch.setenv)."""
    before = _watched_env()
    yield
    after = _watched_env()
    if after != before:
        for key in set(before) | set(after):
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)
        pytest.fail(f"test leaked environment variables: before={before} after={after}")
