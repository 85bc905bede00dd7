"""Fake workers and a fake clock: the launcher's policy, run without a single process."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from tfstrategy.launch.ledger import Ledger
from tfstrategy.launch.monitor import Observation
from tfstrategy.launch.processes import WorkerSpec
from tfstrategy.launch.reports import ErrorRecord, Progress


class Clock:
    """Monotonic and wall time that move only when the launcher sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.hooks: list[Callable[[float], None]] = []

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1000.0 + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for hook in self.hooks:
            hook(self.now)


@dataclass
class FakeWorker:
    """A worker whose observations a scenario sets; signals are recorded and end it (unless ignored)."""

    spec: WorkerSpec
    clock: Clock
    returncode: int | None = None
    starting: bool = False
    joined: bool = False
    progress: Progress | None = None
    error: ErrorRecord | None = None
    stopped: bool = False
    lines: tuple[str, ...] = ()
    signals: list[int] = field(default_factory=list)
    stacks_dumped: int = 0
    frozen_stacks_dumped: int = 0
    #: What SIGTERM does: None ignores it, else the exit code it ends with.
    on_term: int | None = -signal.SIGTERM
    beating: bool = False
    steps: int = 0
    in_step: bool = False
    ledger: Ledger | None = None

    def __post_init__(self) -> None:
        self.index, self.port, self.pid = self.spec.index, self.spec.port, 10_000 + self.spec.index
        self.logs: tuple[str, ...] = ()
        self._beat = 0

    def poll(self) -> int | None:
        return self.returncode

    def observe(self) -> Observation:
        if self.beating and self.returncode is None and not self.stopped:
            self._beat += 1
        progress = Progress(self._beat, self.steps, self.in_step) if self.beating or self._beat else None
        return Observation(returncode=self.returncode, starting=self.starting, joined=self.joined,
                           progress=progress, error=self.error, stopped=self.stopped, ledger=self.ledger)

    def signal_group(self, signum: int) -> None:
        self.signals.append(signum)
        if self.returncode is not None:
            return
        if signum == signal.SIGKILL:
            self.returncode = -signal.SIGKILL
        elif signum in (signal.SIGTERM, signal.SIGINT) and self.on_term is not None:
            self.returncode = self.on_term if signum == signal.SIGTERM else -signum

    def dump_stacks(self, *, frozen: bool = False) -> None:
        self.stacks_dumped += 1
        self.frozen_stacks_dumped += frozen

    def wait(self) -> int:
        if self.returncode is None:
            raise AssertionError(f"worker {self.index} waited on while alive")
        return self.returncode

    def last_lines(self) -> tuple[str, ...]:
        return self.lines

    def output_lost(self) -> OSError | None:
        return None

    def close(self) -> None:
        pass

    # --- what scenarios do ---
    def join(self) -> None:
        self.starting = self.joined = True

    def train(self, steps: int = 0, in_step: bool = True) -> None:
        self.beating, self.steps, self.in_step = True, steps, in_step

    def exit(self, code: int, error: ErrorRecord | None = None, lines: tuple[str, ...] = ()) -> None:
        self.returncode, self.error, self.lines = code, error, lines


class Fleet:
    """Every fake worker started, by attempt; ``spawn`` is what the launcher calls."""

    def __init__(self, clock: Clock, setup: Callable[[FakeWorker], None] | None = None) -> None:
        self.clock, self.setup = clock, setup
        self.attempts: list[list[FakeWorker]] = []

    def spawn(self, spec: WorkerSpec) -> FakeWorker:
        worker = FakeWorker(spec, self.clock)
        restart = int(spec.env["TFSTRATEGY_RESTART"])
        while len(self.attempts) <= restart:
            self.attempts.append([])
        self.attempts[restart].append(worker)
        if self.setup is not None:
            self.setup(worker)
        return worker

    def at(self, attempt: int, index: int) -> FakeWorker:
        return self.attempts[attempt][index]
