"""The files a launched worker and its launcher share: their names, in one place.

The launcher names three files per worker and attempt (:func:`worker_files`) and passes them in the
worker's contract (``TFSTRATEGY_JOIN_FILE``, ``TFSTRATEGY_ERROR_FILE``, ``TFSTRATEGY_PROGRESS_FILE``);
the worker derives two more from them, which the launcher reads by the same rule:

- ``<join file>.starting`` (:func:`starting_file`): the worker is creating its strategy, waiting for
  its peers; the join file itself once the strategy exists (:mod:`tfstrategy.multiworker.worker_protocol`);
- ``<progress file>.ledger`` (:func:`ledger_path`): what it trained (:mod:`tfstrategy.contract.ledger`).

The error and progress files' formats are :mod:`tfstrategy.contract.reports`.
Pure; nothing here imports TensorFlow or another module of tfstrategy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STARTING_SUFFIX", "LEDGER_SUFFIX", "WorkerFiles", "worker_files", "starting_file", "ledger_path"]

#: Appended to the join file's path while the worker creates its strategy.
STARTING_SUFFIX = ".starting"
#: Appended to the progress file's path for the worker's ledger.
LEDGER_SUFFIX = ".ledger"


@dataclass(frozen=True)
class WorkerFiles:
    """One worker's files in one attempt (the launcher's names; the worker learns them from its contract)."""

    join_file: Path
    error_file: Path
    progress_file: Path


def worker_files(directory: str | os.PathLike[str], index: int) -> WorkerFiles:
    """Worker ``index``'s join, error and progress files in ``directory`` (one directory per attempt)."""
    base = Path(directory)
    return WorkerFiles(join_file=base / f"worker-{index}.joined", error_file=base / f"worker-{index}.error",
                       progress_file=base / f"worker-{index}.progress")


def starting_file(join_file: str | os.PathLike[str]) -> Path:
    """The file a worker writes just before creating its strategy, beside ``join_file``."""
    return Path(f"{os.fspath(join_file)}{STARTING_SUFFIX}")


def ledger_path(progress_file: str | os.PathLike[str]) -> Path:
    """Where the worker whose progress file is ``progress_file`` writes its ledger."""
    path = Path(progress_file)
    return path.with_name(path.name + LEDGER_SUFFIX)
