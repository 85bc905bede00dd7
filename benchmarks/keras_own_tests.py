"""Keras' own tests, plain and under ``tfstrategy run --cpu-replicas N``: the bar is 0 newly failing (issue 44).

tfstrategy must do no harm to a correct program: a test of the installed Keras that passes in plain
TensorFlow must pass when ``tfstrategy run`` starts the same ``pytest`` (the start-up hook splits the
CPU and installs every patch; the tests make their own strategies, or none). Each side is one
``pytest -q -p no:cacheprovider --junitxml`` process over the same files, with an empty ini file of
its own (so no project's ``pyproject.toml`` configures Keras' tests) and the folder holding ``keras``
as root (test ids read ``keras.src.optimizers...``); the outcomes are compared test by test.

Usage (from the repository root; the default is the four directories of issue 44)::

    .venv/bin/python benchmarks/keras_own_tests.py
    .venv/bin/python benchmarks/keras_own_tests.py --json benchmarks/keras_own_tests.json
    .venv/bin/python benchmarks/keras_own_tests.py optimizers/loss_scale_optimizer_test.py

Paths are relative to the installed ``keras/src`` (or absolute). It prints a table per file
(tests; passed/failed/skipped plain and under ``run``; newly failing) and the newly failing tests,
and exits 1 if any test passing plain fails under ``run``. ``tests/patches/test_keras_own_tests.py``
runs the files that regressed in issue 44 with it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

#: The directories of ``keras/src`` issue 44 measured (449 tests there with Keras 3.15.1).
DEFAULT_PATHS = ("optimizers", "callbacks", "trainers", "backend/tensorflow")
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def keras_src() -> Path:
    """The installed ``keras/src`` directory, found without importing Keras (or TensorFlow)."""
    spec = importlib.util.find_spec("keras")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("Keras is not installed in this Python: install it, or run with the project's .venv")
    return Path(next(iter(spec.submodule_search_locations))) / "src"


def resolve(paths: list[str]) -> list[Path]:
    root = keras_src()
    resolved = [Path(p) if Path(p).is_absolute() else root / p for p in paths]
    missing = [str(p) for p in resolved if not p.exists()]
    if missing:
        raise SystemExit(f"Received paths that do not exist: {missing}; expected files or folders of {root}")
    return resolved


def outcomes(junit: Path) -> dict[str, str]:
    """Test id (``file::Class::name``) -> passed / failed / skipped, from a pytest JUnit XML report."""
    result: dict[str, str] = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        # pytest writes classname as a dotted "pkg.module.Class" (or "pkg.module"): whole, it is unique.
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = FAILED
        elif case.find("skipped") is not None:
            outcome = SKIPPED
        else:
            outcome = PASSED
        # A test reported twice (a teardown error after a pass) counts as failed.
        result[test_id] = FAILED if result.get(test_id) == FAILED else outcome
    return result


def module_of(test_id: str) -> str:
    """``pkg.module`` of a test id ``pkg.module.Class::name`` (test classes are capitalised)."""
    classname, _, name = test_id.partition("::")
    if not classname:  # a module that could not be collected: pytest names it in ``name``
        return name.removesuffix(".py").replace("/", ".")
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return ".".join(parts)


@dataclass
class Side:
    """One pytest process over the files: its outcomes, exit status and wall time."""

    label: str
    outcomes: dict[str, str] = field(default_factory=dict)
    returncode: int = 0
    seconds: float = 0.0
    tail: str = ""


def run_side(paths: list[Path], *, replicas: int | None, timeout: float, workdir: Path) -> Side:
    """Run ``pytest`` over ``paths`` in a fresh process: plain (``replicas=None``) or under ``tfstrategy run``."""
    label = "plain" if replicas is None else f"run --cpu-replicas {replicas}"
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\n")
    junit = workdir / f"{'plain' if replicas is None else 'run'}.xml"
    # A module that cannot be imported here (one needs jax, one Keras' own conftest) is an error on both
    # sides; the others still run.
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
              "-c", str(ini), "--rootdir", str(keras_src().parent.parent), f"--junitxml={junit}", *map(str, paths)]
    command = pytest if replicas is None else [sys.executable, "-m", "tfstrategy", "run", "--cpu-replicas",
                                               str(replicas), "--", *pytest]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.monotonic()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=workdir)
    side = Side(label=label, returncode=completed.returncode, seconds=time.monotonic() - start,
                tail=(completed.stdout + completed.stderr)[-3000:])
    if junit.exists():
        side.outcomes = outcomes(junit)
    return side


@dataclass
class Comparison:
    """Both sides over the same files, and the tests whose outcome got worse under ``run``."""

    plain: Side
    under_run: Side

    def newly_failing(self) -> list[str]:
        """Tests that passed plain and failed (or never ran) under ``run``."""
        return sorted(test for test, outcome in self.plain.outcomes.items()
                      if outcome == PASSED and self.under_run.outcomes.get(test, FAILED) != PASSED)

    def newly_passing(self) -> list[str]:
        return sorted(test for test, outcome in self.under_run.outcomes.items()
                      if outcome == PASSED and self.plain.outcomes.get(test) not in (PASSED, None))

    def table(self) -> str:
        """One row per test module, then the total: tests, plain p/f/s, run p/f/s, newly failing."""
        newly = set(self.newly_failing())
        modules = sorted({module_of(test) for test in self.plain.outcomes.keys() | self.under_run.outcomes.keys()})
        rows = ["| module | tests | plain passed/failed/skipped | run passed/failed/skipped | newly failing |",
                "| --- | --- | --- | --- | --- |"]

        def counts(side: Side, module: str | None) -> tuple[int, int, int]:
            chosen = [o for t, o in side.outcomes.items() if module is None or module_of(t) == module]
            return chosen.count(PASSED), chosen.count(FAILED), chosen.count(SKIPPED)

        for module in [*modules, None]:
            tests = len({t for t in self.plain.outcomes if module is None or module_of(t) == module})
            plain, run = counts(self.plain, module), counts(self.under_run, module)
            new = sum(1 for t in newly if module is None or module_of(t) == module)
            name = "**total**" if module is None else module.removeprefix("keras.src.")
            rows.append(f"| {name} | {tests} | {'/'.join(map(str, plain))} | {'/'.join(map(str, run))} | {new} |")
        return "\n".join(rows)

    def summary(self) -> dict[str, object]:
        return {
            "tests": len(self.plain.outcomes),
            "plain": {"passed": list(self.plain.outcomes.values()).count(PASSED), "seconds": round(self.plain.seconds, 1),
                      "returncode": self.plain.returncode},
            "run": {"passed": list(self.under_run.outcomes.values()).count(PASSED),
                    "seconds": round(self.under_run.seconds, 1), "returncode": self.under_run.returncode},
            "newly_failing": self.newly_failing(),
            "newly_passing": self.newly_passing(),
        }


def compare(paths: list[Path], *, replicas: int = 2, timeout: float = 3600) -> Comparison:
    """Run Keras' tests in ``paths`` plain, then under ``tfstrategy run --cpu-replicas replicas``."""
    with tempfile.TemporaryDirectory(prefix="keras-own-tests-") as tmp:
        workdir = Path(tmp)
        plain = run_side(paths, replicas=None, timeout=timeout, workdir=workdir)
        under_run = run_side(paths, replicas=replicas, timeout=timeout, workdir=workdir)
    return Comparison(plain=plain, under_run=under_run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_PATHS),
                        help=f"files or folders of the installed keras/src (default: {' '.join(DEFAULT_PATHS)})")
    parser.add_argument("--replicas", type=int, default=2, help="--cpu-replicas of the run side (default 2)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds each side may take (default 3600)")
    parser.add_argument("--json", type=Path, help="also write the summary as JSON to this file")
    args = parser.parse_args(argv)
    comparison = compare(resolve(args.paths), replicas=args.replicas, timeout=args.timeout)
    print(comparison.table())
    summary = comparison.summary()
    print(f"\nplain: {summary['plain']}; under run: {summary['run']}")
    for test in comparison.newly_failing():
        print(f"NEWLY FAILING: {test}")
    if not comparison.plain.outcomes or not comparison.under_run.outcomes:
        print(f"a side produced no report:\n{comparison.plain.tail}\n{comparison.under_run.tail}")
        return 2
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if comparison.newly_failing() else 0


if __name__ == "__main__":
    sys.exit(main())
