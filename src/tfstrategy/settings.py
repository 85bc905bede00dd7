"""Every ``TFSTRATEGY_*`` variable, and the rule for settings: argument > variable > default.

The CLI (``tfstrategy launch``) hands settings to a user's script through the
environment, so one script runs unchanged under different command lines. When
the script *also* passes a different value in code, neither silently wins: the
conflict is an error that says which one to remove.

Each variable is one :class:`Variable` (name, who reads it, help, parser, default), declared once in
:data:`VARIABLES`: *settings* a user may set (:data:`STRATEGY`, :data:`DEVICES`, :data:`CPU_REPLICAS`,
:data:`COLLECTIVE_TIMEOUT`, ...), the *launch protocol* that ``tfstrategy launch`` sets for each worker
(:data:`NUM_WORKERS` ... :data:`JOB_TAG`) and the *hook*'s (:data:`HOOK` ... :data:`DEVICE_CHECK`); the
``ENV_*`` constants are their names. A cluster environment's own variables (``TFSTRATEGY_SLURM``, the pod
contract's ``TFSTRATEGY_K8S_*``) are declared with the same type in their modules.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from tfstrategy.errors import SettingsConflictError, StrategyError, TFStrategyError
from tfstrategy.parsing import AUDIT_MODES as AUDIT_MODES  # re-exported, as the ones below: they moved there

# The wording every parser's errors share, and the parsers of device specs, port ranges and run ids, live
# beneath this module so that the Variables below can name them (their old homes import them from there).
from tfstrategy.parsing import DeviceRequest, parse_devices, parse_port_range, parse_run_id
from tfstrategy.parsing import closest as closest  # re-exported, as the ones below: they moved there
from tfstrategy.parsing import did_you_mean as did_you_mean
from tfstrategy.parsing import parse_collective_timeout as parse_collective_timeout
from tfstrategy.parsing import parse_min_max as parse_min_max
from tfstrategy.parsing import received as received
from tfstrategy.parsing import shorten as shorten
from tfstrategy.parsing import spell as spell
from tfstrategy.parsing import validate_audit_mode as validate_audit_mode


class Side(str, Enum):
    """Who sets a ``TFSTRATEGY_*`` variable, and so who reads it."""

    #: A user may set it (argument > variable > default); ``tfstrategy`` commands set it from their flags.
    USER = "user setting"
    #: ``tfstrategy launch`` sets it for each worker (or reads it from its own environment).
    LAUNCH = "launch protocol"
    #: The start-up hook of ``tfstrategy run`` and ``launch`` reads it (its switches and its messages).
    HOOK = "hook"
    #: A cluster environment's own (its module under :mod:`tfstrategy.environments`, the pod contract).
    CLUSTER = "cluster environment"
    #: Only tfstrategy's own tests set it (a fault to inject).
    TEST = "tests only"


def _text(text: str) -> str:
    return text


def _flag(text: str) -> bool:
    return text == "1"


def integer(low: int) -> Callable[[str], int]:
    """A parser of whole numbers ``>= low`` (``ValueError`` otherwise)."""

    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(text)
        return value

    return parse


def positive_number(text: str) -> float:
    """A finite number above 0 (``ValueError`` otherwise)."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(text)
    return value


def one_of(values: tuple[str, ...]) -> Callable[[str], str]:
    """A parser of one of ``values``, in any case (``ValueError`` otherwise)."""

    def parse(text: str) -> str:
        if text.lower() not in values:
            raise ValueError(text)
        return text.lower()

    return parse


#: The values of ``TFSTRATEGY_PRECISION`` (as :func:`tfstrategy.training.precision.parse_precision` accepts them).
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def _precision(text: str) -> str:
    lowered = text.lower().replace("-", "_")
    if lowered not in PRECISIONS:
        raise ValueError(text)
    return lowered


def _sentinel(text: str) -> str:
    lowered = text.lower()
    if lowered in ("epoch", "on"):
        return "epoch"
    if lowered in ("off", "0", "none"):
        return "off"
    if lowered.isdigit() and int(lowered) > 0:
        return str(int(lowered))
    raise ValueError(text)


def _directory_or_off(text: str) -> Path | None:
    return None if text.lower() == "off" else Path(text)


@dataclass(frozen=True, kw_only=True)
class Variable:
    """One ``TFSTRATEGY_*`` variable: its name, who reads it, what it means, how its text is parsed.

    Every variable is declared once, here (a cluster environment's own in its module, with this type),
    and read and written through its declaration (:meth:`read`, :meth:`to_environ`), so a name, a parser or a
    format is never spelled twice. A parser that raises a :class:`~tfstrategy.errors.TFStrategyError` words its
    own message (the one ``--flag`` and ``argument=`` get, naming the variable); a plain ``ValueError`` becomes
    the message :meth:`value` words.
    """

    name: str
    side: Side
    help: str
    #: The value from the variable's (stripped, non-empty) text; ``ValueError`` (or the package's own error, naming
    #: the variable) when it is not valid.
    parse: Callable[[str], Any] = _text
    #: What a valid value is, for the error on one that is not.
    expected: str = "a value"
    #: The value when the variable is unset or blank.
    default: Any = None

    def text(self, environ: Mapping[str, str]) -> str | None:
        """The variable's text in ``environ``, stripped; ``None`` when unset or blank."""
        text = environ.get(self.name, "").strip()
        return text or None

    def read(self, environ: Mapping[str, str], *, error: type[Exception] = StrategyError, fix: str = "") -> Any:
        """The parsed value in ``environ`` (:attr:`default` when unset or blank).

        Raises:
            error: the text is not valid; the message names the variable, what was expected and ``fix``.
        """
        return self.value(self.text(environ), error=error, fix=fix)

    def value(self, text: str | None, *, error: type[Exception] = StrategyError, fix: str = "") -> Any:
        """The variable's ``text`` parsed (:attr:`default` when ``None`` or blank), as :meth:`read` does."""
        text = (text or "").strip()
        if not text:
            return self.default
        try:
            return self.parse(text)
        except TFStrategyError:
            raise  # a parser of the package's own words its message, naming the variable
        except ValueError:
            shown = text if len(text) <= 80 else f"{text[:80]}..."
            raise error(f"Received {self.name}={shown!r}; expected {self.expected}"
                        f"{f' ({fix})' if fix else ''}.") from None

    def resolve(self, name: str, argument: object, environ: Mapping[str, str], parse: Callable[..., Any]) -> Setting:
        """``argument`` > this variable > :attr:`default`, parsed: the argument by ``parse(argument, name=name)``, the
        variable by :meth:`read` (so each error names where the bad value came from).

        Raises:
            TFStrategyError: a value is not valid.
            SettingsConflictError: the code and the variable both set it, to different values.
        """
        text, from_env = self.text(environ), self.read(environ)
        if argument is None:
            return Setting(value=from_env, source="default" if text is None else f"env {self.name}")
        value = parse(argument, name=name)
        if text is not None and value != from_env:
            raise _conflict(name, argument, self.name, text)
        return Setting(value=value, source="argument")

    def format(self, value: Any) -> str:
        """The text :meth:`read` parses back to ``value``: ``True`` as ``1``, a float without trailing zeros, an
        enum as its value."""
        if value is True:
            return "1"
        if isinstance(value, float):
            return f"{value:g}"
        return str(value.value if isinstance(value, Enum) else value)

    def to_environ(self, value: Any) -> dict[str, str]:
        """``{name: text}`` to put into an environment; empty for ``None`` and ``False`` (the variable left unset)."""
        return {} if value is None or value is False else {self.name: self.format(value)}


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


# The parsers a flag and an argument go through, given the variable's name for their errors.
def _strategy(text: str) -> StrategyKind:
    return StrategyKind.parse(text, name=STRATEGY.name)


def _devices(text: str) -> DeviceRequest | None:
    return parse_devices(text, name=DEVICES.name)


def _port_range(text: str) -> tuple[int, int]:
    return parse_port_range(text, source=PORT_RANGE.name)


def _run_id(text: str) -> str:
    return parse_run_id(text, source=RUN_ID.name)


# Settings (argument > variable > default).
STRATEGY = Variable(name="TFSTRATEGY_STRATEGY", side=Side.USER, parse=_strategy, default=StrategyKind.AUTO,
                    help="the strategy select() builds (--strategy)", expected="a strategy kind")
DEVICES = Variable(name="TFSTRATEGY_DEVICES", side=Side.USER, parse=_devices,
                   help="the devices to replicate over (--devices)", expected="a device list")
CPU_REPLICAS = Variable(name="TFSTRATEGY_CPU_REPLICAS", side=Side.USER, parse=integer(1),
                        help="split the CPU into N logical devices used as replicas (--cpu-replicas)",
                        expected="a number of logical CPU devices, 1 or more")
COLLECTIVE_TIMEOUT = Variable(name="TFSTRATEGY_COLLECTIVE_TIMEOUT", side=Side.USER,
                              help="seconds a multi-worker collective waits for a peer before raising",
                              expected="seconds > 0, or none")
PORT_RANGE = Variable(name="TFSTRATEGY_PORT_RANGE", side=Side.USER, parse=_port_range,
                      help="the ports tfstrategy launch gives its workers, LOW-HIGH, when --port-range is not given",
                      expected="LOW-HIGH")
RUN_ID = Variable(name="TFSTRATEGY_RUN_ID", side=Side.USER, parse=_run_id,
                  help="the run's folder under --log-dir (tfstrategy launch --run-id), e.g. the same on every node "
                       "of one job", expected="a run id")
PRECISION = Variable(name="TFSTRATEGY_PRECISION", side=Side.USER, parse=_precision,
                     help="the Keras global dtype policy set before the model is built (--precision)",
                     expected=f"one of {', '.join(PRECISIONS)}")
SENTINEL = Variable(name="TFSTRATEGY_SENTINEL", side=Side.USER, parse=_sentinel,
                    help="the divergence sentinel's interval: epoch, a step count, or off (launch: epoch)",
                    expected="epoch, a step interval such as 100, or off")
PROFILE = Variable(name="TFSTRATEGY_PROFILE", side=Side.USER, parse=_directory_or_off,
                   help="the performance report's directory (run/launch --profile); unset or off: no report",
                   expected="a directory")
PROFILE_EVERY = Variable(name="TFSTRATEGY_PROFILE_EVERY", side=Side.USER, parse=positive_number,
                         help="minutes between performance reports on long jobs (--profile-every)",
                         expected="a number of minutes above 0")
PROFILE_PROBES = Variable(name="TFSTRATEGY_PROFILE_PROBES", side=Side.USER, parse=positive_number,
                          help="the share of the time trained since the last report its probes may take "
                               "(default 0.1; --profile-probes)", expected="a share of the time trained above 0")
BACKUP_DIR = Variable(name="TFSTRATEGY_BACKUP_DIR", side=Side.USER, parse=Path,
                      help="the job's backup directory (launch --backup-dir; k8s: where the backups are mounted)",
                      expected="a directory")
JOB_ID = Variable(name="TFSTRATEGY_JOB_ID", side=Side.USER,
                  help="the job's identity in its backups (else the cluster environment's, else the directory's)",
                  expected="the job's identity")
NODE_RANK = Variable(name="TFSTRATEGY_NODE_RANK", side=Side.USER, parse=integer(0),
                     help="this machine's rank in a multi-node job (launch --nnodes N), when --node-rank is not given",
                     expected="this machine's rank, 0 or more")
LAUNCH_SECRET = Variable(name="TFSTRATEGY_LAUNCH_SECRET", side=Side.USER,
                         help="the shared secret every node of a multi-node job proves it knows (never passed to "
                              "the workers)", expected="a secret")

# The launch protocol: set by `tfstrategy launch` for each worker it starts.
NUM_WORKERS = Variable(name="TFSTRATEGY_NUM_WORKERS", side=Side.LAUNCH, parse=integer(1),
                       help="the job's number of workers", expected="a count of workers, 1 or more")
WORKER_INDEX = Variable(name="TFSTRATEGY_WORKER_INDEX", side=Side.LAUNCH, parse=integer(0),
                        help="this worker's index (task.index in TF_CONFIG)", expected="this worker's index, 0 or more")
RESTART = Variable(name="TFSTRATEGY_RESTART", side=Side.LAUNCH, parse=integer(0), default=0,
                   help="0 on the first start, k after the k-th restart of the group",
                   expected="a restart count, 0 or more")
JOIN_FILE = Variable(name="TFSTRATEGY_JOIN_FILE", side=Side.LAUNCH, parse=Path,
                     help="written by tfstrategy once this worker's strategy exists (<file>.starting while it is "
                          "created)", expected="a file path")
ISOLATED = Variable(name="TFSTRATEGY_ISOLATED_NETWORK", side=Side.LAUNCH, parse=_flag,
                    help="set by the launcher after it re-executed itself in a private network namespace",
                    expected="1")
ERROR_FILE = Variable(name="TFSTRATEGY_ERROR_FILE", side=Side.LAUNCH, parse=Path,
                      help="supervision: where the worker's first uncaught exception goes", expected="a file path")
PROGRESS_FILE = Variable(name="TFSTRATEGY_PROGRESS_FILE", side=Side.LAUNCH, parse=Path,
                         help="supervision: the worker's heartbeat and batch counts (its ledger beside it)",
                         expected="a file path")
LAUNCHER_PID = Variable(name="TFSTRATEGY_LAUNCHER_PID", side=Side.LAUNCH, parse=integer(1),
                        help="supervision: the pid of the worker's launcher", expected="the launcher's process id")
LIFELINE_FD = Variable(name="TFSTRATEGY_LIFELINE_FD", side=Side.LAUNCH, parse=integer(0),
                       help="supervision: the descriptor that reaches end-of-file when the launcher dies",
                       expected="a file descriptor")
JOB_TAG = Variable(name="TFSTRATEGY_JOB_TAG", side=Side.LAUNCH,
                   help="a tag every process of the job carries (the reaper finds them by it)",
                   expected="the job's tag")

# The start-up hook (`tfstrategy run` and `tfstrategy launch`): see tfstrategy.runtime.worker_hook.
HOOK = Variable(name="TFSTRATEGY_HOOK", side=Side.HOOK, parse=_flag,
                help="1 makes the hook's sitecustomize install tfstrategy's worker side in a process", expected="1")
AUDIT = Variable(name="TFSTRATEGY_AUDIT", side=Side.HOOK, parse=one_of(AUDIT_MODES), default="warn",
                 help="what the hook does when a model's variables are outside its strategy's scope (--audit)",
                 expected=f"one of {', '.join(AUDIT_MODES)}")
HOOK_SUMMARY = Variable(name="TFSTRATEGY_HOOK_SUMMARY", side=Side.HOOK, parse=_flag, default=False,
                        help="1: print one summary line (strategies, what changed, the audit) when the process exits",
                        expected="1")
DEBUG = Variable(name="TFSTRATEGY_DEBUG", side=Side.HOOK, parse=_flag, default=False,
                 help="1 (run/launch --debug): the summary names the hook's steps, tracebacks keep tfstrategy's "
                      "frames", expected="1")
HOOK_PID = Variable(name="TFSTRATEGY_HOOK_PID", side=Side.HOOK,
                    help="set by the hook to the pid it installed in: a Python child of the script stays unhooked",
                    expected="a process id")
DEVICE_CHECK = Variable(name="TFSTRATEGY_DEVICE_CHECK", side=Side.HOOK, parse=one_of(("stop", "warn")),
                        default="stop",
                        help="what the hook does with a script's device list naming a device the host lacks",
                        expected="stop (a device list naming a device this host lacks is an error) or warn "
                                 "(report it and go on)")

#: Every variable of this module, in the order above (a cluster environment's own are in its module).
VARIABLES: tuple[Variable, ...] = (
    STRATEGY, DEVICES, CPU_REPLICAS, COLLECTIVE_TIMEOUT, PORT_RANGE, RUN_ID, PRECISION, SENTINEL, PROFILE,
    PROFILE_EVERY, PROFILE_PROBES, BACKUP_DIR, JOB_ID, NODE_RANK, LAUNCH_SECRET,
    NUM_WORKERS, WORKER_INDEX, RESTART, JOIN_FILE, ISOLATED, ERROR_FILE, PROGRESS_FILE, LAUNCHER_PID, LIFELINE_FD,
    JOB_TAG,
    HOOK, AUDIT, HOOK_SUMMARY, DEBUG, HOOK_PID, DEVICE_CHECK,
)

# The names alone, as most modules spell them.
ENV_STRATEGY, ENV_DEVICES, ENV_CPU_REPLICAS = STRATEGY.name, DEVICES.name, CPU_REPLICAS.name
ENV_COLLECTIVE_TIMEOUT, ENV_PORT_RANGE, ENV_RUN_ID = COLLECTIVE_TIMEOUT.name, PORT_RANGE.name, RUN_ID.name
ENV_PRECISION, ENV_SENTINEL, ENV_PROFILE = PRECISION.name, SENTINEL.name, PROFILE.name
ENV_PROFILE_EVERY, ENV_PROFILE_PROBES = PROFILE_EVERY.name, PROFILE_PROBES.name
ENV_BACKUP_DIR, ENV_JOB_ID, ENV_NODE_RANK, ENV_LAUNCH_SECRET = BACKUP_DIR.name, JOB_ID.name, NODE_RANK.name, LAUNCH_SECRET.name
ENV_NUM_WORKERS, ENV_WORKER_INDEX, ENV_RESTART = NUM_WORKERS.name, WORKER_INDEX.name, RESTART.name
ENV_JOIN_FILE, ENV_ISOLATED, ENV_ERROR_FILE = JOIN_FILE.name, ISOLATED.name, ERROR_FILE.name
ENV_PROGRESS_FILE, ENV_LAUNCHER_PID, ENV_LIFELINE_FD = PROGRESS_FILE.name, LAUNCHER_PID.name, LIFELINE_FD.name
ENV_JOB_TAG, ENV_HOOK, ENV_AUDIT, ENV_HOOK_SUMMARY = JOB_TAG.name, HOOK.name, AUDIT.name, HOOK_SUMMARY.name
ENV_DEBUG, ENV_HOOK_PID, ENV_DEVICE_CHECK = DEBUG.name, HOOK_PID.name, DEVICE_CHECK.name


def variable(name: str) -> Variable:
    """The declaration of ``name`` among :data:`VARIABLES`.

    Raises:
        KeyError: not a variable of this module.
    """
    return _BY_NAME[name]


_BY_NAME = {item.name: item for item in VARIABLES}

#: Seconds a collective may wait for a peer when neither code nor environment says: none (wait, as TensorFlow
#: does). A per-op timeout costs a thread per collective for that long (:func:`collective_timeout_cost`); a hang is
#: caught by the launcher's stall detection instead, a dead peer by TensorFlow's coordination service heartbeat.
DEFAULT_COLLECTIVE_TIMEOUT: float | None = None


@dataclass(frozen=True, kw_only=True)
class Setting:
    """A resolved value and where it came from (``argument``, ``env`` or ``default``)."""

    value: Any
    source: str


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
        raise _conflict(name, argument, env_var, from_env)
    return Setting(value=argument, source="argument")


def _conflict(name: str, argument: object, env_var: str, text: str) -> SettingsConflictError:
    return SettingsConflictError(
        f"Received {name}={argument!r} in code and {env_var}={text!r} in the environment (set by you or "
        f"by a tfstrategy command). Remove {name}= from the code to let the command line decide, or unset "
        f"{env_var} to keep the code's choice."
    )


def _normalise(value: object, name: str = "") -> str:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    return str(value).strip().lower().replace(" ", "")




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
