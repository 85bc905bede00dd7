"""The argument parser every ``tfstrategy`` command uses: errors that teach (issue 35).

argparse's own errors print the whole usage block first and, for a flag a subcommand does not know,
the *top-level* usage with "unrecognized arguments". Here a mistake prints one line first, naming it
and the likely fix (``did you mean --max-restarts?``, ``-n/--num-workers`` for torchrun's
``--nproc-per-node``), then the command's own one-line usage, and exits 2.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from tfstrategy.contract.exits import EXIT_INVALID
from tfstrategy.settings import closest, did_you_mean

__all__ = ["Parser"]

_VALUE_FOR_A_SWITCH = re.compile(r"^argument (?P<flag>\S+): ignored explicit argument '(?P<value>.*)'$", re.S)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors say what was wrong and what was probably meant.

    Args:
        familiar: flags users bring from other launchers, mapped to ours (``--nproc-per-node`` -> ``-n``).
    """

    def __init__(self, *args: Any, familiar: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        # argparse would take --cpu-replica for --cpu-replicas, silently: a flag is spelled whole.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.familiar = dict(familiar or {})
        self._received: list[str] = []

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._received = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:
            # A subcommand reports its own unknown flags, with its own usage, not the root's.
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def _check_value(self, action: argparse.Action, value: object) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(choice) for choice in choices]
        hint = did_you_mean(str(value), names)
        if isinstance(action, argparse._SubParsersAction):
            raise argparse.ArgumentError(None, f"unknown command {value!r}; expected one of {', '.join(names)}.{hint}")
        raise argparse.ArgumentError(action, f"invalid choice {value!r}; expected one of {', '.join(names)}.{hint}")

    def error(self, message: str) -> NoReturn:
        unknown = self._unknown_flags()
        if unknown and (message.startswith(("unrecognized arguments", "the following arguments are required"))):
            message = self._unknown_message(unknown)
        valued = _VALUE_FOR_A_SWITCH.match(message)
        if valued is not None:  # argparse: "argument --tee: ignored explicit argument '3'"
            flag = valued["flag"].split("/")[-1]
            message = f"{flag} takes no value (received '{flag}={valued['value']}'); pass {flag} alone"
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message}\n{self.short_usage()}\n")

    def short_usage(self) -> str:
        """``usage: tfstrategy launch -n N [options] -- COMMAND ...`` and where the rest is."""
        required, positionals, optional = [], [], False
        for action in self._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
            if not action.option_strings:
                positionals.append(f"{metavar} ..." if isinstance(action, argparse._SubParsersAction) else metavar)
            elif action.required:
                required.append(f"{action.option_strings[0]} {metavar}")
            else:
                optional = True
        parts = [self.prog, *required, *(["[options]"] if optional else []), *positionals]
        return f"usage: {' '.join(parts)}  ('{self.prog} --help' lists every option)"

    def _known(self, flag: str) -> bool:
        options = self._option_string_actions
        if flag in options:
            return True
        if flag.startswith("--"):
            return self.allow_abbrev and sum(1 for option in options if option.startswith(flag)) == 1
        return flag[:2] in options  # -n2

    def _unknown_flags(self) -> list[str]:
        """Flags before the program (or ``--``) that this parser does not know."""
        unknown: list[str] = []
        previous_was_flag = False
        for token in self._received:
            if token == "--":
                break
            is_flag = token.startswith("-") and len(token) > 1 and not token.lstrip("-").replace(".", "").isdigit()
            if not is_flag:
                if not previous_was_flag:
                    break  # the program starts here; its own flags are not ours
                previous_was_flag = False
                continue
            flag = token.split("=", 1)[0]
            if not self._known(flag):
                unknown.append(flag)
            previous_was_flag = "=" not in token
        return unknown

    def _suggestion(self, flag: str) -> str | None:
        """Our flag for a mistyped or foreign one, spelled with all its names (``-n/--num-workers``)."""
        spelled = flag.replace("_", "-")
        target = self.familiar.get(flag) or self.familiar.get(spelled)
        if target is None:
            longs = [option for option in self._option_string_actions if option.startswith("--")]
            target = spelled if spelled in longs else closest(spelled, longs)
        if target is None:
            return None
        return "/".join(self._option_string_actions[target].option_strings)

    def _unknown_message(self, unknown: list[str]) -> str:
        flag, others = unknown[0], unknown[1:]
        message = f"unknown option {flag}" + (f" (and {', '.join(others)})" if others else "")
        suggestion = self._suggestion(flag)
        return f"{message}; did you mean {suggestion}?" if suggestion else message
