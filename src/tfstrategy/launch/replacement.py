"""A lost worker's replacement (``-n MIN:MAX``): started at once in the next group's cluster, taken once it is ready.

After a worker is lost and the group re-forms without it, the
:class:`~tfstrategy.launch.coordinator.LocalCoordinator` offers its place as a
:class:`~tfstrategy.launch.coordinator.Vacancy` while ``--max-restarts`` has a restart left (each
replacement uses one, so a worker that dies every time is not replaced forever). The replacement
starts at once, its start-up overlapping the group's; once it creates its strategy and the group has
trained a batch, the coordinator's :meth:`~tfstrategy.launch.coordinator.Coordinator.take` gives the
re-formation that takes it, which the supervisor carries out as it does a node's return: the workers
stop at a step they agree on, and the next group starts beside the replacement, which waits in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tfstrategy.launch.coordinator import Coordinator, Event, Vacancy
from tfstrategy.launch.processes import WorkerHandle, stop_workers
from tfstrategy.launch.states import RunResult

__all__ = ["Replacement", "Replacements"]


@dataclass(frozen=True)
class Replacement:
    """A worker started for a lost worker's place, waiting in the next round's cluster."""

    vacancy: Vacancy
    handle: WorkerHandle
    started: float


class Replacements:
    """The one replacement a launcher may have waiting (``-n MIN:MAX``), from its start to its take or its end.

    Args:
        spawn: starts the replacement for a vacancy (the launcher's worker, with its files of its own).
        say: the launcher's one-line messages.
        clock, sleep: monotonic time and waiting (tests pass a fake clock).
        join_timeout: seconds it may take to create its strategy (``--timeout``; ``None`` or 0: no limit).
        max_restarts: ``--max-restarts``, to number the restart each replacement uses.
    """

    def __init__(self, *, spawn: Callable[[Vacancy], WorkerHandle], say: Callable[[str], None],
                 clock: Callable[[], float], sleep: Callable[[float], None], join_timeout: float | None,
                 max_restarts: int) -> None:
        self._spawn, self._say, self._clock, self._sleep = spawn, say, clock, sleep
        self._join_timeout, self._max_restarts = join_timeout, max_restarts
        self.waiting: Replacement | None = None

    def tend(self, coordinator: Coordinator, attempt: int, result: RunResult, *, take: bool) -> Event | None:
        """Start a replacement if a place is vacant, watch it; the re-formation that takes it once it is ready.

        ``take``: the group has trained a batch from its backup, so the re-formation costs no step already won and
        its workers stop at a step they agree on (the preemption callbacks are in place).
        """
        waiting = self.waiting
        if waiting is None:
            vacancy = coordinator.vacancy(attempt)
            if vacancy is None:
                return None
            result.replacements += 1
            self._say(f"starting a replacement for a lost worker, as worker {vacancy.index} of the next group "
                      f"(restart {vacancy.restart} of {self._max_restarts}); the group takes it at a step "
                      "the workers agree on once it creates its strategy")
            self.waiting = waiting = Replacement(vacancy, self._spawn(vacancy), self._clock())
        seen = waiting.handle.observe()
        if seen.returncode is not None:
            self.drop()
            self._say(f"the replacement worker {waiting.vacancy.index} exited with status {seen.returncode} "
                      f"before it created its strategy; the group goes on without it")
        elif seen.starting or seen.joined or seen.listening:
            return coordinator.take(waiting.vacancy) if take else None
        elif self._join_timeout and self._clock() - waiting.started > self._join_timeout:
            self.drop()
            self._say(f"the replacement worker {waiting.vacancy.index} did not create its strategy within "
                      f"--timeout {self._join_timeout:g} s; stopped it, the group goes on without it")
        return None

    def adopt(self, attempt: int, index: int) -> WorkerHandle | None:
        """The replacement waiting as worker ``index`` of round ``attempt``, now one of the group; else ``None``."""
        waiting = self.waiting
        if waiting is None or (waiting.vacancy.round, waiting.vacancy.index) != (attempt, index):
            return None
        self.waiting = None
        return waiting.handle

    def pid(self) -> int | None:
        """The waiting replacement's process (not an orphan when the group is stopped), if any."""
        return None if self.waiting is None else self.waiting.handle.pid

    def drop(self) -> None:
        """Stop the waiting replacement, if any: its round will not come, or it failed."""
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            stop_workers([waiting.handle], grace=0.0, clock=self._clock, sleep=self._sleep)
            waiting.handle.close()
