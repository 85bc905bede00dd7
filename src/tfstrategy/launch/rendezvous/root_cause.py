"""Node 0's choice of a failed round's root cause among the nodes' reports (pure, ``--nnodes``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from tfstrategy.launch.ledger_diagnosis import diagnose, view_from_wire
from tfstrategy.launch.rendezvous.wire import DIAGNOSIS_LINES, Failed

__all__ = ["root_cause", "across_nodes"]


def root_cause(reported: list[tuple[int, Failed]],
               shared: Mapping[int, list[dict[str, object]]] | None = None) -> tuple[int, Failed]:
    """The round's root cause among ``reported`` (each node's failure, earliest first; never empty).

    A failure its node's ledgers diagnosed names the cause; else one every node's worker views
    together diagnose (:func:`across_nodes`); else the earliest that is not a consequence of another,
    else the earliest: a node whose workers only echo a peer's loss (``UnavailableError``) often
    reports first.
    """
    return (next(((r, f) for r, f in reported if f.diagnosis), None) or across_nodes(reported, shared)
            or next(((r, f) for r, f in reported if not f.consequential), reported[0]))


def across_nodes(reported: list[tuple[int, Failed]],
                 shared: Mapping[int, list[dict[str, object]]] | None = None) -> tuple[int, Failed] | None:
    """The failure every node's worker views together diagnose (``--nnodes``: no node alone sees the cause).

    ``reported``: each node's failure (rank, message), earliest first; ``shared``: the latest views of the
    nodes that reported none (their workers wait, alive), by rank. Returns the failure of the node of the
    diagnosed worker (the earliest one when the diagnosis names several), with the diagnosis, or ``None``;
    when that node reported none (a stopped worker whose stall has not timed out yet), one on its behalf:
    another node's echo never names the worker, nor its node.
    """
    failing = {rank for rank, _ in reported}
    views = [view_from_wire(view) for _, failed in reported for view in failed.views]
    views += [view_from_wire(view) for rank, sent in sorted((shared or {}).items()) if rank not in failing
              for view in sent]
    found = diagnose(sorted(views, key=lambda view: view.index))
    if found is None:
        return None
    rank, cause = next(((r, f) for r, f in reported if any(v["index"] == found.index for v in f.views)), reported[0])
    quiet = next((r for r, sent in sorted((shared or {}).items()) if r not in failing
                  and any(v["index"] == found.index for v in sent)), None)
    if found.index is not None and quiet is not None:
        rank, cause = quiet, _alive(found.index, quiet, cause)
    elif found.index is not None and cause.worker != found.index:
        cause = dataclasses.replace(cause, worker=found.index)
    return rank, dataclasses.replace(cause, diagnosis=list(found.lines())[:DIAGNOSIS_LINES], consequential=False)


def _alive(worker: int, rank: int, reported: Failed) -> Failed:
    """The root cause on node ``rank``, which reported no failure: its ``worker`` is alive (stopped, waiting), and
    what the views it shares show is the cause; ``reported`` (another node's echo of it) lends its time and outcome."""
    return Failed.bounded(round=reported.round, worker=worker, status=1, time=reported.time, consequential=False,
                          reason=f"was alive on its node, whose launcher reported no failure: the worker views node "
                                 f"{rank} shares show the cause", outcome=reported.outcome, lines=(), logs=())
