"""Every ``TFSTRATEGY_*`` variable, and the rule for settings: argument > variable > default.

The CLI (``tfstrategy launch``) hands settings to a user's script through the
environment, so one script runs unchanged under different command lines. When
the script *also* passes a different value in code, neither silently wins: the
conflict is an error that says which one to remove.

Two kinds of variables live here. *Settings* a user may set
(:data:`ENV_STRATEGY`, :data:`ENV_DEVICES`, :data:`ENV_CPU_REPLICAS`,
:data:`ENV_COLLECTIVE_TIMEOUT`, :data:`ENV_PORT_RANGE`, ...) and the *launch protocol* that ``tfstrategy
launch`` sets for each worker (:data:`ENV_NUM_WORKERS` ... :data:`ENV_ISOLATED`). A cluster environment's own
variables (``TFSTRATEGY_SLURM``, ``TFSTRATEGY_SLURM_PORT``) live in its module under :mod:`tfstrategy.environments`.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tfstrategy.errors import SettingsConflictError, StrategyError

# Settings (argument > variable > default).
ENV_STRATEGY = "TFSTRATEGY_STRATEGY"
ENV_DEVICES = "TFSTRATEGY_DEVICES"
ENV_CPU_REPLICAS = "TFSTRATEGY_CPU_REPLICAS"
#: Seconds a multi-worker collective waits for a peer before raising.
ENV_COLLECTIVE_TIMEOUT = "TFSTRATEGY_COLLECTIVE_TIMEOUT"
#: The ports ``tfstrategy launch`` gives its workers, LOW-HIGH, when ``--port-range`` is not given.
ENV_PORT_RANGE = "TFSTRATEGY_PORT_RANGE"
#: The run's folder under ``--log-dir`` (`tfstrategy launch --run-id`), e.g. the same on every node of one job.
ENV_RUN_ID = "TFSTRATEGY_RUN_ID"
#: The Keras global dtype policy set before the model is built: float32, mixed_float16 or mixed_bfloat16.
ENV_PRECISION = "TFSTRATEGY_PRECISION"
#: The divergence sentinel's interval: epoch, a step count, or off (`tfstrategy launch` defaults to epoch).
ENV_SENTINEL = "TFSTRATEGY_SENTINEL"
#: The performance report's directory (`tfstrategy run/launch --profile`); unset or off: no report.
ENV_PROFILE = "TFSTRATEGY_PROFILE"
#: Minutes between performance reports on long jobs (`--profile-every`).
ENV_PROFILE_EVERY = "TFSTRATEGY_PROFILE_EVERY"
#: The share of the time trained since the last report its probes may take (default 0.1; `probe_share=`).
ENV_PROFILE_PROBES = "TFSTRATEGY_PROFILE_PROBES"

# The launch protocol: set by `tfstrategy launch` for each worker it starts.
ENV_NUM_WORKERS = "TFSTRATEGY_NUM_WORKERS"
ENV_WORKER_INDEX = "TFSTRATEGY_WORKER_INDEX"
ENV_RESTART = "TFSTRATEGY_RESTART"
ENV_JOIN_FILE = "TFSTRATEGY_JOIN_FILE"
ENV_BACKUP_DIR = "TFSTRATEGY_BACKUP_DIR"
#: The job's identity in its backups, set by the user (passed on by ``launch``); else the cluster environment's
#: (tfstrategy.environments.job_id), else the directory's.
ENV_JOB_ID = "TFSTRATEGY_JOB_ID"
#: This machine's rank in a multi-node job (`tfstrategy launch --nnodes N`), when --node-rank is not given.
ENV_NODE_RANK = "TFSTRATEGY_NODE_RANK"
#: The shared secret every node of a multi-node job proves it knows (never passed to the workers).
ENV_LAUNCH_SECRET = "TFSTRATEGY_LAUNCH_SECRET"
#: Set by the launcher after it re-executed itself in a private network namespace.
ENV_ISOLATED = "TFSTRATEGY_ISOLATED_NETWORK"
#: Supervision (tfstrategy.runtime.worker_watch): the worker's error file, progress file, the pid of its
#: launcher and the descriptor that reaches end-of-file when the launcher dies; a tag every process of the job carries.
ENV_ERROR_FILE = "TFSTRATEGY_ERROR_FILE"
ENV_PROGRESS_FILE = "TFSTRATEGY_PROGRESS_FILE"
ENV_LAUNCHER_PID = "TFSTRATEGY_LAUNCHER_PID"
ENV_LIFELINE_FD = "TFSTRATEGY_LIFELINE_FD"
ENV_JOB_TAG = "TFSTRATEGY_JOB_TAG"

# The start-up hook (`tfstrategy run` and `tfstrategy launch`): see tfstrategy.runtime.worker_hook.
#: "1" makes the hook's sitecustomize install tfstrategy's worker side in a process.
ENV_HOOK = "TFSTRATEGY_HOOK"
#: What the hook does when a model's variables are outside its strategy's scope: warn, stop or off.
ENV_AUDIT = "TFSTRATEGY_AUDIT"
#: The values of ``--audit`` / ``TFSTRATEGY_AUDIT`` (here, not in the hook's module, so the CLI's parser
#: offers them without loading the hook).
AUDIT_MODES = ("warn", "stop", "off")
#: "1": print one summary line (strategies, what changed for the script, the audit) when the process exits.
ENV_HOOK_SUMMARY = "TFSTRATEGY_HOOK_SUMMARY"
#: "1" (``run``/``launch --debug``): the summary names the hook's steps, tracebacks keep tfstrategy's frames.
ENV_DEBUG = "TFSTRATEGY_DEBUG"
#: Set by the hook to the pid it installed in: a Python child of the script (which inherits it) stays unhooked.
ENV_HOOK_PID = "TFSTRATEGY_HOOK_PID"
#: What the hook does with a script's device list naming a device the host lacks: stop (default) or warn.
ENV_DEVICE_CHECK = "TFSTRATEGY_DEVICE_CHECK"

#: Seconds a collective may wait for a peer when neither code nor environment says: none (wait, as TensorFlow
#: does). A per-op timeout costs a thread per collective for that long (:func:`collective_timeout_cost`); a hang is
#: caught by the launcher's stall detection instead, a dead peer by TensorFlow's coordination service heartbeat.
DEFAULT_COLLECTIVE_TIMEOUT: float | None = None


class StrategyKind(str, Enum):
    """The strategies tfstrategy can select; values are what users type."""

    AUTO = "auto"
    MIRRORED = "mirrored"
    ONE_DEVICE = "one_device"
    DEFAULT = "default"
    MULTI_WORKER = "multi_worker"
    TPU = "tpu"

    @classmethod
    def parse(cls, value: object, *, name: str = "strategy") -> StrategyKind:
        """Accept a kind or its name in any case, with ``-`` or ``_``.

        Args:
            value: the kind or its name.
            name: what the value is called in messages (``TFSTRATEGY_STRATEGY`` when read from there).

        Raises:
            StrategyError: not one of the known kinds.
        """
        if isinstance(value, cls):
            return value
        text = str(value).strip().lower().replace("-", "_") if isinstance(value, str) else None
        for kind in cls:
            if kind.value == text:
                return kind
        names = [kind.value for kind in cls]
        hint = did_you_mean(text, names) if text else ""
        raise StrategyError(
            f"Received {received(name, value)}; expected one of: {', '.join(names)}.{hint} "
            f"Pass {spell(name, 'strategy', 'auto')} to let tfstrategy choose."
        )


@dataclass(frozen=True, kw_only=True)
class Setting:
    """A resolved value and where it came from (``argument``, ``env`` or ``default``)."""

    value: Any
    source: str


def closest(received: str, options: Iterable[str]) -> str | None:
    """The option a mistyped ``received`` most likely meant (``mirored`` -> ``mirrored``), or None."""
    matches = difflib.get_close_matches(received.lower(), list(options), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(received: str, options: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest option, or ``''``: the hint every error message appends."""
    match = closest(received, options)
    return f" Did you mean {match!r}?" if match else ""


def shorten(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a 10 KB value makes a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def received(name: str, value: object) -> str:
    """A value as an error message names it: ``--devices cpu:9`` for a flag (a name starting ``--``, as the
    CLI passes), ``devices='cpu:9'`` for a keyword argument or ``TFSTRATEGY_DEVICES='cpu:9'`` for a variable.

    Example:
        >>> received("--strategy", "mirored")
        '--strategy mirored'
        >>> received("strategy", "mirored")
        "strategy='mirored'"
    """
    if name.startswith("--"):
        text = str(value)
        return f"{name} {text if len(text) <= 80 else f'{text[:80]}... ({len(text)} characters)'}"
    return f"{name}={shorten(value)}"


def spell(name: str, setting: str, value: str) -> str:
    """How a fix names ``setting=value`` in the vocabulary of ``name``: ``--cpu-replicas 4`` when ``name`` is a
    flag, else the keyword argument ``cpu_replicas=4`` (a string value quoted)."""
    if name.startswith("--"):
        return f"--{setting.replace('_', '-')} {value}"
    return f"{setting}={value if value.isdigit() else repr(value)}"


def setting_name(name: str, setting: Setting, env_var: str) -> str:
    """What to call a resolved setting in messages: the variable when it came from there, else the argument."""
    return env_var if setting.source.startswith("env") else name


def resolve_setting(
    name: str,
    argument: object,
    env_var: str,
    default: object,
    env: Mapping[str, str] | None = None,
    normalise: Callable[[Any, str], str] | None = None,
) -> Setting:
    """Pick one setting by precedence, refusing a conflict between code and environment.

    Args:
        name: the argument's name, for messages (``"strategy"``).
        argument: what the code passed; ``None`` means not passed.
        env_var: the environment variable that may carry it.
        default: used when neither is set.
        env: the environment to read (``os.environ`` when omitted).
        normalise: maps a value to the text compared when both are set, so
            ``"gpu:0"`` and ``["/gpu:0"]`` agree. Its second argument is the name
            its errors give the value (``env_var`` for the environment's).

    Raises:
        SettingsConflictError: both are set and differ.
    """
    env = os.environ if env is None else env
    from_env = env.get(env_var)
    if from_env is not None and from_env.strip() == "":
        from_env = None
    if argument is None:
        if from_env is None:
            return Setting(value=default, source="default")
        return Setting(value=from_env, source=f"env {env_var}")
    normalise = normalise or _normalise
    if from_env is not None and normalise(from_env, env_var) != normalise(argument, name):
        raise SettingsConflictError(
            f"Received {name}={argument!r} in code and {env_var}={from_env!r} in the environment (set by you or "
            f"by a tfstrategy command). Remove {name}= from the code to let the command line decide, or unset "
            f"{env_var} to keep the code's choice."
        )
    return Setting(value=argument, source="argument")


def _normalise(value: object, name: str = "") -> str:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    return str(value).strip().lower().replace(" ", "")


def parse_min_max(text: str) -> tuple[int | None, int] | None:
    """``N`` as ``(None, N)`` and ``MIN:MAX`` as ``(MIN, MAX)`` (torchrun's node counts); ``None`` if neither.

    Only the shape: each caller checks the counts against what it runs (``--nnodes``, ``k8s --elastic``).
    """
    low, sep, high = text.strip().partition(":")
    if not sep:
        return (None, int(low)) if low.isdigit() else None
    return (int(low), int(high)) if low.isdigit() and high.isdigit() else None


def parse_collective_timeout(value: object, *, name: str = "collective_timeout") -> float | None:
    """Seconds > 0 as a float; ``None`` for "wait forever" (``"none"``, ``0`` or ``inf``).

    Raises:
        StrategyError: not a finite positive number, ``0``, ``inf`` or ``"none"``.
    """
    text = str(value).strip().lower()
    if text in ("none", "0", "0.0", "inf", "infinity"):
        return None
    number = math.nan
    if not isinstance(value, bool) and len(text) <= 32:
        try:
            number = float(text)
        except ValueError:
            pass
    if not math.isfinite(number) or number <= 0:
        raise StrategyError(
            f"Received {name}={shorten(value)}; expected seconds > 0 (e.g. 120), or 'none' to wait forever "
            "as TensorFlow does by default."
        )
    return number


def resolve_collective_timeout(
    argument: float | str | None, env: Mapping[str, str] | None = None
) -> tuple[float | None, str]:
    """The collective timeout by argument > ``TFSTRATEGY_COLLECTIVE_TIMEOUT`` > none (wait), and its source.

    Raises:
        StrategyError: a value is not a valid timeout (the message names the variable if it came from there).
        SettingsConflictError: code and environment both set it and differ.
    """
    setting = resolve_setting(
        "collective_timeout",
        argument,
        ENV_COLLECTIVE_TIMEOUT,
        DEFAULT_COLLECTIVE_TIMEOUT,
        env,
        normalise=lambda v, n: str(parse_collective_timeout(v, name=n)),
    )
    name = ENV_COLLECTIVE_TIMEOUT if setting.source.startswith("env") else "collective_timeout"
    return parse_collective_timeout(setting.value, name=name), setting.source


def collective_timeout_cost(seconds: float) -> str:
    """The one line a chosen collective timeout adds to ``explain()`` and the exit summary: what it costs.

    TensorFlow (``BaseCollectiveExecutor``) schedules a closure that sleeps out the timeout on its own thread for
    each collective it resolves and each it runs, so a training step holds a few threads for ``seconds``: a fast
    loop reaches thousands of threads and the process aborts (``Resource temporarily unavailable``).
    """
    return (f"collective timeout {seconds:g} s: TensorFlow keeps a thread per collective op alive for {seconds:g} s "
            f"(a long, fast job can run out of threads)")


def validate_audit_mode(mode: object, *, name: str = "--audit") -> str:
    """``warn``, ``stop`` or ``off``.

    Raises:
        StrategyError: anything else.
    """
    text = str(mode).strip().lower()
    if text not in AUDIT_MODES:
        raise StrategyError(
            f"Received {name} {mode!r}; expected one of {', '.join(AUDIT_MODES)}: warn reports variables made outside "
            "the strategy's scope and trains on, stop refuses to train, off skips the audit."
        )
    return text
