"""Run the corpus and print what each mode did against what the table states (a Markdown table).

    python tests/corpus/measure.py                      # every case, plain/run/launch and tf2
    python tests/corpus/measure.py --modes tf2 --json out.json keras-fault-tolerance

``tf2`` is plain TensorFlow's own multi-worker run (two processes with a TF_CONFIG each, no
tfstrategy): what a user gets without tfstrategy. Wrap it in ``flock /tmp/tfstrategy-heavy.lock``
on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_cases import CASES, Result, Trains, check, guide_table, run_case  # noqa: E402


def observed(case, mode: str, result: Result, results: dict[str, Result]) -> str:
    """One cell: what the run did, in a few words."""
    if mode != "tf2" and case.outcome(mode) is not None:
        problems = check(case, mode, result, results.get("plain"), results)
        if not problems:
            return "as stated"
        return "WRONG: " + problems[0].splitlines()[0][:240]
    if mode == "tf2" and result.returncode == 0:
        # Plain TensorFlow's two processes, held to what one job must do (one strategy, files once).
        problems = check(case, "launch", result, results.get("plain"), results) if isinstance(
            case.launch, Trains) else ["(no one-job outcome stated)"]
        return "one job, as stated" if not problems else "exit 0 but " + problems[0].splitlines()[0][:240]
    if result.returncode == 0:
        values = sorted(set(result.finals.values()))
        agree = "same on every worker" if len(values) == 1 else f"{len(values)} different results"
        return f"exit 0, {len(result.finals)} final line(s), {agree}"
    text = result.stdout + result.stderr
    errors = [line.split("] ", 1)[-1] for line in text.splitlines()
              if "Error" in line or "error:" in line or line.startswith("tfstrategy")]
    return f"exit {result.returncode}: {errors[-1][:160] if errors else '?'}"


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "unchanged-scripts.md"


def update_guide() -> None:
    """Replace the corpus table of the unchanged-scripts guide with the one ``CASES`` states."""
    lines = GUIDE.read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("| case (`tests/corpus/scripts/`)"))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    GUIDE.write_text("\n".join(lines[:start] + guide_table().rstrip("\n").split("\n") + lines[end:]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*", help="case ids (default: all)")
    parser.add_argument("--modes", default="plain,run,launch,tf2")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--table", action="store_true", help="print the guide's table of stated outcomes and exit")
    parser.add_argument("--update-guide", action="store_true", help="rewrite that table in the guide and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(guide_table(), end="")
        return 0
    if args.update_guide:
        update_guide()
        return 0
    modes = args.modes.split(",")
    cases = [case for case in CASES if not args.ids or case.id in args.ids]
    rows, record = [], {}
    for case in cases:
        results: dict[str, Result] = {}
        cells = {}
        with tempfile.TemporaryDirectory(prefix=f"corpus-{case.id}-") as tmp:
            needed = list(modes)
            for mode in ("plain", "run"):  # what the others compare with
                if mode not in needed and any(isinstance(case.outcome(m), Trains) and case.outcome(m).same_as == mode
                                              for m in needed if m != "tf2"):
                    needed.insert(0, mode)
            for mode in [m for m in ("plain", "run", "launch", "tf2") if m in needed]:
                if mode != "tf2" and case.outcome(mode) is None:
                    cells[mode] = "not run"
                    continue
                results[mode] = run_case(case, mode, Path(tmp) / mode)
                cells[mode] = f"{observed(case, mode, results[mode], results)} ({results[mode].seconds:.0f} s)"
                print(f"{case.id} {mode}: {cells[mode]}", file=sys.stderr, flush=True)
        rows.append((case, cells))
        record[case.id] = cells
    print("| case | " + " | ".join(modes) + " |")
    print("| --- | " + " | ".join("---" for _ in modes) + " |")
    for case, cells in rows:
        print(f"| {case.id} | " + " | ".join(cells.get(mode, "") for mode in modes) + " |")
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
