"""The launcher's reaper: a tiny process that stops the job's processes if the launcher dies.

``python reaper.py TAG`` (run as a file: it imports nothing of tfstrategy, so it starts in
milliseconds) reads its standard input, a pipe whose other end only the launcher holds:
``pgid N`` lines name the workers' process groups, ``done`` means the launcher stops the
job itself. At end-of-file without ``done`` (the launcher died, however: SIGKILL included)
it SIGKILLs every named process group, then every process of this user whose environment
carries ``TFSTRATEGY_JOB_TAG=TAG`` (what a worker started, even in a new session), until none
is left. It runs in its own session, so a signal to the launcher's process group spares it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

_TAG_VARIABLE = "TFSTRATEGY_JOB_TAG"


def tagged(tag: str, exclude: int) -> list[int]:
    """Pids of this user's live processes whose environment has ``TFSTRATEGY_JOB_TAG=tag``."""
    needle = f"{_TAG_VARIABLE}={tag}".encode()
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if needle in environ.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def reap(groups: list[int], tag: str) -> None:
    """SIGKILL ``groups`` and the tagged processes until none is left (at most ~10 s)."""
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    for _ in range(100):
        left = tagged(tag, os.getpid())
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    tag = argv[1]
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # only the end of the launcher's pipe ends the reaper
    groups: list[int] = []
    for line in sys.stdin.buffer:
        words = line.split()
        if words[:1] == [b"done"]:
            return 0
        if words[:1] == [b"pgid"] and len(words) == 2 and words[1].isdigit():
            groups.append(int(words[1]))
    reap(groups, tag)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
