"""What the launcher keeps of a run under ``--log-dir`` besides the workers' output: its failures and re-formations.

Each attempt that failed leaves ``attempt-K/failure.txt`` (the report as the console showed it) and
``failure.json`` (the same as plain values, with the failures it caused); each elastic re-formation adds a
line to ``reformations.jsonl``. Writing them never stops the launcher: a folder it cannot write is said in
one line (the returned text), and the job goes on.
"""

from __future__ import annotations

import json
from pathlib import Path

from tfstrategy.launch.states import Failure

__all__ = ["keep_failure", "keep_reformation"]


def keep_failure(where: Path, attempt: int, failure: Failure, consequences: tuple[Failure, ...]) -> str | None:
    """Attempt ``attempt``'s failure under ``where`` (its folder); the line to say if it could not be written."""
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / "failure.txt").write_text(failure.report(consequences) + "\n")
        record = {**failure.as_dict(), "attempt": attempt, "consequences": [other.as_dict() for other in consequences]}
        (where / "failure.json").write_text(json.dumps(record, indent=2) + "\n")
    except OSError as error:
        return f"could not write the failure's report under {where} ({error.strerror}); it is above"
    return None


def keep_reformation(run_log_dir: Path, record: dict[str, object]) -> str | None:
    """A re-formation's record, added to ``run_log_dir/reformations.jsonl``; the line to say if it could not be."""
    try:
        run_log_dir.mkdir(parents=True, exist_ok=True)
        with open(run_log_dir / "reformations.jsonl", "a") as records:
            records.write(json.dumps(record) + "\n")
    except OSError as error:
        return f"could not add the re-formation to {run_log_dir}/reformations.jsonl ({error.strerror})"
    return None
