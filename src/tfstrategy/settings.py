"""Where each setting comes from: explicit argument > ``TFSTRATEGY_*`` variable > default.

The CLI (``tfstrategy launch``) hands settings to a user's script through the
environment, so one script runs unchanged under different command lines. When
the script *also* passes a different value in code, neither silently wins: the
conflict is an error that says which one to remove.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable

from tfstrategy.errors import SettingsConflictError, StrategyError

ENV_STRATEGY = "TFSTRATEGY_STRATEGY"
ENV_DEVICES = "TFSTRATEGY_DEVICES"
ENV_CPU_REPLICAS = "TFSTRATEGY_CPU_REPLICAS"


class StrategyKind(str, Enum):
    """The strategies tfstrategy can select; values are what users type."""

    AUTO = "auto"
    MIRRORED = "mirrored"
    ONE_DEVICE = "one_device"
    DEFAULT = "default"
    MULTI_WORKER = "multi_worker"
    TPU = "tpu"

    @classmethod
    def parse(cls, value: object) -> StrategyKind:
        """Accept a kind or its name in any case, with ``-`` or ``_``.

        Raises:
            StrategyError: not one of the known kinds.
        """
        if isinstance(value, cls):
            return value
        text = str(value).strip().lower().replace("-", "_")
        for kind in cls:
            if kind.value == text:
                return kind
        names = ", ".join(kind.value for kind in cls)
        raise StrategyError(f"Received strategy={value!r}; expected one of: {names}. Pass strategy='auto' to let tfstrategy choose.")


@dataclass(frozen=True, kw_only=True)
class Setting:
    """A resolved value and where it came from (``argument``, ``env`` or ``default``)."""

    value: Any
    source: str


def resolve_setting(
    name: str,
    argument: Any,
    env_var: str,
    default: Any,
    env: Mapping[str, str] | None = None,
    normalise: Callable[[Any], str] | None = None,
) -> Setting:
    """Pick one setting by precedence, refusing a conflict between code and environment.

    Args:
        name: the argument's name, for messages (``"strategy"``).
        argument: what the code passed; ``None`` means not passed.
        env_var: the environment variable that may carry it.
        default: used when neither is set.
        env: the environment to read (``os.environ`` when omitted).
        normalise: maps a value to the text compared when both are set, so
            ``"gpu:0"`` and ``["/gpu:0"]`` agree.

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
    if from_env is not None and normalise(from_env) != normalise(argument):
        raise SettingsConflictError(
            f"Received {name}={argument!r} in code and {env_var}={from_env!r} in the environment (set by you or "
            f"by a tfstrategy command). Remove {name}= from the code to let the command line decide, or unset "
            f"{env_var} to keep the code's choice."
        )
    return Setting(value=argument, source="argument")


def _normalise(value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    return str(value).strip().lower().replace(" ", "")
