"""An elastic job's re-formations (``--nnodes MIN:MAX``, ``-n MIN:MAX``), as the launcher says and records them.

Node 0's rendezvous decides when the group re-forms (:class:`~tfstrategy.launch.rendezvous.RendezvousServer`):
a node lost while at least MIN remain, or a node that joins while fewer than MAX train; on one machine
(``-n MIN:MAX``) the :class:`~tfstrategy.launch.coordinator.LocalCoordinator`: a worker lost, or its
replacement ready. Every
launcher then stops its workers, says one line, adds a record to ``--log-dir``'s
``reformations.jsonl`` and forms the next round; the workers resume from the newest step every
worker of the old group committed (:mod:`tfstrategy.multiworker.coordinated`), which a group of
another size loads as well: the weights of MultiWorkerMirroredStrategy's workers are identical, and
the global batch stays the same, so each step's arithmetic does not depend on the group's size.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfstrategy.errors import BackupError
from tfstrategy.launch.coordinator import Reformation
from tfstrategy.multiworker import commit

if TYPE_CHECKING:
    from tfstrategy.launch.options import LaunchOptions

__all__ = ["newest_committed_step", "reformation_line", "reformation_record"]


def newest_committed_step(backup_dir: Path | None) -> int | None:
    """The newest step any worker's ``commit.json`` under ``backup_dir`` names (``None``: none readable)."""
    if backup_dir is None:
        return None
    steps: list[list[int]] = []
    for record in sorted(backup_dir.glob(f"*/{commit.RECORD_NAME}")):
        try:
            steps.append(list(commit.read_record(record).steps))
        except BackupError:
            continue
    candidates = commit.candidates(steps)
    return candidates[0] if candidates else None


def _nodes(ranks: tuple[int, ...]) -> str:
    return "node " + str(ranks[0]) if len(ranks) == 1 else "nodes " + ", ".join(map(str, ranks))


def _workers(count: int) -> str:
    return f"{count} worker{'s' if count != 1 else ''}"


def reformation_line(reform: Reformation, workers_per_node: int, step: int | None) -> str:
    """The one line a re-formation gets, e.g. ``node 2 lost: going on with 2 nodes (4 workers) from step 1,200``."""
    where = "from scratch (nothing committed yet)" if step is None else f"from step {step:,} (the newest committed)"
    how = "; the workers stopped at a step they agreed on" if reform.graceful else ""
    if reform.lost_worker is not None:  # -n MIN:MAX on one machine
        return f"worker {reform.lost_worker} lost: going on with {_workers(reform.workers or 0)} {where}"
    if reform.joined_worker is not None:  # its replacement, taken back
        return f"worker {reform.joined_worker} back: going on with {_workers(reform.workers or 0)} {where}{how}"
    parts = []
    if reform.lost:  # a node that asked to leave is lost at a step the workers agreed on
        parts.append(f"{_nodes(reform.lost)} {'left' if reform.graceful else 'lost'}")
    if reform.joined:
        parts.append(f"{_nodes(reform.joined)} joined")
    count = len(reform.nodes)
    return (f"{' and '.join(parts) or 're-formed'}: going on with {count} node{'s' if count != 1 else ''} "
            f"({_workers(count * workers_per_node)}) {where}{how}")


def reformation_record(reform: Reformation, options: LaunchOptions, wall: float, seconds: float) -> dict[str, Any]:
    """What ``reformations.jsonl`` keeps of a re-formation."""
    workers = len(reform.nodes) * options.num_workers if reform.workers is None else reform.workers
    return {"time": wall, "round": reform.round, "nodes": list(reform.nodes), "lost": list(reform.lost),
            "joined": list(reform.joined), "graceful": reform.graceful, "reason": reform.reason,
            "lost_worker": reform.lost_worker, "joined_worker": reform.joined_worker, "workers": workers, "step": newest_committed_step(options.backup_dir),
            "stop_seconds": round(seconds, 3)}
