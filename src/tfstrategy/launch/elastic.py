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

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfstrategy.errors import BackupError
from tfstrategy.launch.coordinator import Reformation
from tfstrategy.multiworker import commit

if TYPE_CHECKING:
    from tfstrategy.contract.ledger import Ledger
    from tfstrategy.launch.options import LaunchOptions

__all__ = ["newest_committed_step", "reformation_line", "reformation_record", "planned_steps", "pipeline_line",
           "steps_line"]


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


def planned_steps(ledgers: Sequence[Ledger | None]) -> int | None:
    """The steps an epoch the workers plan (Keras' ``steps``: ``steps_per_epoch`` or the data's), if they said it."""
    planned = {ledger.extra.get("epoch_steps") for ledger in ledgers if ledger is not None}
    steps = [value for value in planned if isinstance(value, int) and not isinstance(value, bool)]
    return max(steps) if steps else None


def pipeline_line(ledgers: Sequence[Ledger | None]) -> str | None:
    """The one line for a group whose workers read data of their own (``AutoShardPolicy.FILE``, ``OFF``), else ``None``.

    Such a pipeline's global batches depend on the number of workers: after a re-formation step *S* trains on other
    examples than it would have, so the job does not end with the uninterrupted run's model.
    """
    kinds = {ledger.extra.get("sharding") for ledger in ledgers if ledger is not None}
    if "file" in kinds:
        how = "each reads files of its own (AutoShardPolicy.FILE, or AUTO on a dataset of files)"
    elif "off" in kinds:
        how = "each reads the whole dataset (AutoShardPolicy.OFF)"
    else:
        return None
    return (f"the workers of the group before it: {how}, so a global batch depends on the number of workers: the "
            "re-formed group trains on other batches than the uninterrupted run would (set the dataset's "
            "auto_shard_policy to DATA for the same batches at every size); it goes on")


def steps_line(before: tuple[int, int], workers: int, steps: int) -> str | None:
    """The one line when a group of ``workers`` plans ``steps`` an epoch where ``before`` (workers, steps) planned other."""
    if before[0] == workers or before[1] == steps:
        return None
    return (f"the workers plan {steps:,} steps an epoch in a group of {workers}, {before[1]:,} in a group of {before[0]}: "
            "steps_per_epoch (or the data) depends on the number of workers, so the re-formed group's epochs "
            "cover other batches than the uninterrupted run's; it goes on")
