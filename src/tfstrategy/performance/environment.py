"""The report's settings for ``--profile``: the ``TFSTRATEGY_PROFILE*`` variables, made and read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tfstrategy.errors import TrainingError
from tfstrategy.settings import PROFILE, PROFILE_EVERY, PROFILE_PROBES

#: A report every this many minutes on long jobs (at an epoch's end), besides the first fit's.
EVERY_MINUTES = 10.0
#: The probes may take this share of the time trained since the last report (``TFSTRATEGY_PROFILE_PROBES``).
PROBE_SHARE = 0.10


def valid_probe_share(value: object, source: str = "probe_share") -> float:
    """A share of the time trained the probes may take: a number above 0 (above 1: more than the training).

    Raises:
        TrainingError: anything else, naming ``source``.
    """
    number: float | None = None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    if number is None or not number > 0 or number != number or number == float("inf"):
        received = f"{source} {value}" if source.startswith("--") else f"{source}={value!r}"
        raise TrainingError(f"Received {received}; expected the share of the time trained the report's probes "
                            "may take, a number above 0 (0.1: a tenth; 2: twice the training), e.g. 0.25.")
    return number


def profile_settings(profile: bool, directory: str | os.PathLike[str], every_minutes: float,
                     probes: str | float | None = None) -> tuple[Path | None, float | None, float | None]:
    """The report's directory (resolved), the minutes between reports and, given ``probes`` (``--profile-probes``),
    the probes' share for ``--profile`` (``None`` each without it), validated: what ``run`` and ``launch`` hand on.

    Raises:
        TrainingError: minutes not above 0, a directory that is an existing file, a probe share not above 0,
            or ``--profile-probes`` without ``--profile``.
    """
    share = None if probes is None else valid_probe_share(probes, "--profile-probes")
    if not profile:
        if share is not None:
            raise TrainingError(f"Received --profile-probes {probes} without --profile; expected it with the report it "
                                f"sets the probes' share of: add --profile (--profile --profile-probes {probes}).")
        return None, None, None
    if isinstance(every_minutes, bool) or not isinstance(every_minutes, (int, float)) or not every_minutes > 0:
        raise TrainingError(f"Received --profile-every {every_minutes!r}; expected a number of minutes above 0, "
                            "e.g. --profile-every 10.")
    path = Path(directory).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise TrainingError(f"Received --profile-dir {str(directory)!r}, which is a file; expected a directory "
                            "(made if missing) for the report's files. Name another one.")
    return path, float(every_minutes), share


def profile_environment(profile: bool, directory: str | os.PathLike[str], every_minutes: float,
                        probes: str | float | None = None) -> dict[str, str]:
    """``TFSTRATEGY_PROFILE``, ``TFSTRATEGY_PROFILE_EVERY`` and, given ``probes``, ``TFSTRATEGY_PROFILE_PROBES``
    for ``--profile`` (empty without it), from :func:`profile_settings`.

    Raises:
        TrainingError: as :func:`profile_settings`.
    """
    path, every, share = profile_settings(profile, directory, every_minutes, probes)
    return {**PROFILE.to_environ(path), **PROFILE_EVERY.to_environ(every), **PROFILE_PROBES.to_environ(share)}


def tracker_from_environment(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The report's settings from ``TFSTRATEGY_PROFILE`` (its directory) and ``TFSTRATEGY_PROFILE_EVERY``, or None."""
    env = dict(os.environ if env is None else env)
    directory = PROFILE.text(env) or ""
    if not directory or directory.lower() == "off":
        return None
    every = PROFILE_EVERY.text(env) or ""
    try:
        minutes = float(every) if every else EVERY_MINUTES
    except ValueError:
        minutes = -1.0
    if not minutes > 0:
        raise TrainingError(f"Received {PROFILE_EVERY.name}={every!r}; expected a number of minutes above 0 "
                            "(tfstrategy run/launch --profile-every).")
    settings: dict[str, object] = {"directory": directory, "every_minutes": minutes}
    share = PROFILE_PROBES.text(env) or ""
    if share:
        settings["probe_share"] = valid_probe_share(share, PROFILE_PROBES.name)
    return settings
