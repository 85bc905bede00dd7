"""Every exit status of the worker-launcher contract, in one table.

A worker exits with one of them (a refused strategy, a preemption), ``tfstrategy launch`` ends
with one per :class:`~tfstrategy.launch.states.Outcome`, and a scheduler acts on them (Slurm's
``--requeue``, the Kubernetes Job's ``podFailurePolicy``). Each is one :class:`ExitStatus` in
:data:`EXIT_STATUSES`; everything else derives from that table: ``Outcome.exit_status()``, the
``podFailurePolicy`` rules (:func:`tfstrategy.kubernetes.manifests.pod_failure_policy`), the exit
statuses in ``tfstrategy launch --help`` (:func:`help_table`) and the table of
``docs/guides/multi-worker.md`` (:func:`markdown_table`, held to the page by ``tests/test_contract.py``).

Pure values; nothing here imports TensorFlow or another module of tfstrategy.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "PodAction", "ExitStatus", "EXIT_STATUSES", "SUCCEEDED", "FAILED", "STOPPED", "TENSORFLOW_RESTART", "PREEMPTED",
    "JOIN_TIMEOUT", "STALLED", "INTERRUPTED", "EXIT_SUCCESS", "EXIT_FAILURE", "EXIT_INVALID", "EXIT_STOPPED",
    "EXIT_TENSORFLOW_RESTART", "EXIT_PREEMPTED", "EXIT_JOIN_TIMEOUT", "EXIT_STALL", "SIGNAL_BASE", "signal_status",
    "shell_status", "status_of_outcome", "help_table", "markdown_table",
]


class PodAction(str, Enum):
    """What the generated Kubernetes Job's ``podFailurePolicy`` does with a pod that exited with a status."""

    IGNORE = "Ignore"  # restarted without counting against backoffLimitPerIndex
    FAIL_JOB = "FailJob"  # a retry cannot help
    COUNT = "Count"  # no rule: retried up to backoffLimitPerIndex times


@dataclass(frozen=True, kw_only=True)
class ExitStatus:
    """One exit status: its number, the outcomes that end with it, what it means and what to do.

    ``meaning`` and ``to_do`` may say ``{code}`` for the number.
    """

    code: int
    #: The :class:`~tfstrategy.launch.states.Outcome` values the launcher ends with this status (none: a status
    #: only a worker exits with).
    outcomes: tuple[str, ...]
    #: Why a job ended with it, in flag terms (``--timeout``).
    meaning: str
    #: What a person or a scheduler does about it.
    to_do: str = ""
    #: The generated Kubernetes Job's ``podFailurePolicy`` action for a pod that exited with it.
    kubernetes: PodAction = PodAction.COUNT
    #: The status is ``code`` + N for signal N (the shell's convention), not ``code`` itself.
    plus_signal: bool = False

    @property
    def label(self) -> str:
        """The status as tables show it: ``75``, or ``128+N``."""
        return f"{self.code}+N" if self.plus_signal else str(self.code)

    def text(self) -> str:
        """``meaning``, then ``to_do`` after a semicolon, with ``{code}`` filled in."""
        said = f"{self.meaning}; {self.to_do}" if self.to_do else self.meaning
        return said.format(code=self.code)


SUCCEEDED = ExitStatus(code=0, outcomes=("succeeded",), meaning="every worker exited 0")
FAILED = ExitStatus(
    code=1, outcomes=("failed", "lost"),
    meaning="a worker failed: the report names the root cause, with its own status or signal (or node 0 was lost)",
    # A lost peer makes the survivors exit 1 too, so 1 cannot mean "user error, give up".
    kubernetes=PodAction.COUNT)
STOPPED = ExitStatus(
    code=2, outcomes=("stopped",),
    meaning="invalid options (nothing started), or a worker stopped the job with one line (a refused strategy, "
            "a missing device)",
    to_do="never restarted", kubernetes=PodAction.FAIL_JOB)
#: TensorFlow's ``PreemptionCheckpointHandler`` exits with it after saving, to ask for a restart (the Kubernetes
#: documentation's ``podFailurePolicy`` example treats it as permanent: not here). The launcher never ends with it.
TENSORFLOW_RESTART = ExitStatus(
    code=42, outcomes=(), meaning="TensorFlow's PreemptionCheckpointHandler saved and asks for a restart",
    to_do="restart", kubernetes=PodAction.IGNORE)
PREEMPTED = ExitStatus(
    code=75, outcomes=("preempted",), meaning="preempted: every worker saved and exited {code} (EX_TEMPFAIL)",
    to_do="requeue the job", kubernetes=PodAction.IGNORE)
JOIN_TIMEOUT = ExitStatus(code=124, outcomes=("join-timeout",),  # as coreutils' timeout
                          meaning="not every worker (or node) joined within --timeout")
STALLED = ExitStatus(code=125, outcomes=("stalled",), meaning="a worker stalled past --stall-timeout")
INTERRUPTED = ExitStatus(
    code=128, outcomes=("interrupted",), plus_signal=True,
    meaning="the launcher received signal N (130 Ctrl-C, 143 SIGTERM, even when workers had to be SIGKILLed "
            "after --grace)")

#: Every status, in the order the help and the docs list them.
EXIT_STATUSES: tuple[ExitStatus, ...] = (SUCCEEDED, FAILED, PREEMPTED, JOIN_TIMEOUT, STALLED, INTERRUPTED, STOPPED,
                                         TENSORFLOW_RESTART)

EXIT_SUCCESS = SUCCEEDED.code
EXIT_FAILURE = FAILED.code
#: A user error: a bad option, or a refusal before the first step (the CLI's one line). Kubernetes fails the Job on it.
EXIT_INVALID = STOPPED.code
#: What a worker the start-up hook stopped on a user error exits with (``tfstrategy.worker_contract.STOP_PREFIXES``).
EXIT_STOPPED = STOPPED.code
EXIT_TENSORFLOW_RESTART = TENSORFLOW_RESTART.code
#: What a preempted worker exits with (EX_TEMPFAIL), and the launcher when every worker did.
EXIT_PREEMPTED = PREEMPTED.code
EXIT_JOIN_TIMEOUT = JOIN_TIMEOUT.code
EXIT_STALL = STALLED.code
#: A process ended by signal N has the shell status ``SIGNAL_BASE + N``.
SIGNAL_BASE = INTERRUPTED.code


def signal_status(signum: int) -> int:
    """The shell's status for a process ended by signal ``signum`` (128+N)."""
    return SIGNAL_BASE + signum


def shell_status(returncode: int) -> int:
    """The shell's status of a Popen return code (``-N`` for signal N becomes 128+N)."""
    return signal_status(-returncode) if returncode < 0 else returncode


def status_of_outcome(outcome: str) -> ExitStatus:
    """The status the launcher ends with for ``outcome`` (an ``Outcome`` value).

    Raises:
        KeyError: no status lists ``outcome``.
    """
    for status in EXIT_STATUSES:
        if outcome in status.outcomes:
            return status
    raise KeyError(outcome)


_FLAG = re.compile(r"--[a-z][-a-z]*")


def _as_code(match: re.Match[str]) -> str:
    return f"`{match.group(0)}`"


def _launcher_statuses() -> tuple[ExitStatus, ...]:
    return tuple(status for status in EXIT_STATUSES if status.outcomes)


def help_table(indent: int = 2, width: int = 80) -> str:
    """The launcher's exit statuses as ``tfstrategy launch --help`` lists them (a plain-text table)."""
    statuses = _launcher_statuses()
    column = max(len(status.label) for status in statuses) + 2
    lines = []
    for status in statuses:
        first = " " * indent + status.label.ljust(column)
        lines.extend(textwrap.wrap(status.text(), width=width, initial_indent=first,
                                   subsequent_indent=" " * (indent + column)))
    return "\n".join(lines)


def markdown_table() -> str:
    """The launcher's exit statuses as a Markdown table (``docs/guides/multi-worker.md`` has it), flags as code."""
    rows = ["| status | the job ended because |", "| --- | --- |"]
    rows += [f"| {status.label} | {_FLAG.sub(_as_code, status.text())} |" for status in _launcher_statuses()]
    return "\n".join(rows)
