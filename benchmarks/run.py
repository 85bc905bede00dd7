"""Run every tfstrategy benchmark on this CPU: tables, JSON and a PNG plot.

Each figure is a ratio of tfstrategy against plain TensorFlow doing the same
work in the same run, from interleaved repeats (median and min-max). The
machine (cores, CPU, TensorFlow and Keras versions, load) is stated beside
every table, since the machine may be shared.

examples:
  python benchmarks/run.py                         # the full run, as in the README
  python benchmarks/run.py --quick                 # every suite with a tiny budget, for CI
  python benchmarks/run.py --only process --out /tmp/bench
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from plot import plot_results
from stats import SuiteResult, format_table, machine_info
from suites import SUITES, Budget

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny budget: checks the suites run, not for numbers")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for results.json and results.png")
    names = [suite.name for suite in SUITES]
    parser.add_argument("--only", action="append", choices=names, help="run only this suite (repeatable)")
    return parser.parse_args(argv)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that ended (a shared machine's load moves
    wall time, far less CPU time)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budget = Budget.quick() if args.quick else Budget()
    machine = machine_info()
    started = time.perf_counter()
    results: list[SuiteResult] = []
    for suite in SUITES:
        if args.only and suite.name not in args.only:
            continue
        print(f"running {suite.name} ...", file=sys.stderr, flush=True)
        began, cpu = time.perf_counter(), _cpu_seconds()
        produced = suite.run(budget)
        print(f"{suite.name} took {time.perf_counter() - began:.1f} s ({_cpu_seconds() - cpu:.1f} CPU-s)", file=sys.stderr,
              flush=True)
        for result in produced if isinstance(produced, list) else [produced]:
            results.append(result)
            print(format_table(result, machine), flush=True)
    payload = {
        "machine": machine,
        "quick": args.quick,
        "budget": vars(budget),
        "seconds": round(time.perf_counter() - started, 1),
        "suites": [result.as_dict() for result in results],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "results.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    png_path = plot_results(payload, args.out / "results.png")
    print(f"wrote {json_path} and {png_path} in {payload['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
