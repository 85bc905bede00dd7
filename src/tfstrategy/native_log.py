"""TensorFlow's C++ start-up lines, held to the level ``TF_CPP_MIN_LOG_LEVEL`` asks for.

While ``import tensorflow`` loads its shared libraries, TensorFlow's C++ code logs
straight to file descriptor 2 before it has read ``TF_CPP_MIN_LOG_LEVEL``: on
TF 2.21, on a CPU with oneDNN's fast paths (not every CPU), ``WARNING: All log
messages before absl::InitializeLog() is called are written to STDERR`` and
``I0000 ... port.cc:153] oneDNN custom operations are on ...``, twice per process
(measured: both during the import, none after it), whatever the level. The commands
import TensorFlow in their own process, and the start-up hook of ``run`` and
``launch`` in the user's, inside :func:`native_start_up_held`: descriptor 2 goes
to a temporary file for the import only, then every line is written back but the
native ones the level hides. Nothing else is lost or reordered within the import.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping

#: A line of absl's format (``I0000 00:00:1796542949.442244   15525 port.cc:153] ...``): severity first.
NATIVE_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] ")
#: absl's notice before its first line (before ``absl::InitializeLog()``).
ABSL_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
#: ``TF_CPP_MIN_LOG_LEVEL``'s meaning: a native line is hidden when its severity's rank is below the level.
SEVERITY_RANK = {"I": 0, "W": 1, "E": 2, "F": 3}


def log_level(env: Mapping[str, str]) -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it (0, showing everything, if unset or not a number)."""
    try:
        return int(env.get("TF_CPP_MIN_LOG_LEVEL", "0").strip() or 0)
    except ValueError:
        return 0


def shown_lines(text: str, level: int) -> str:
    """``text`` without the native lines ``level`` hides (and absl's notice, from level 1)."""
    kept = []
    for line in text.splitlines(keepends=True):
        native = NATIVE_LINE.match(line)
        if native is not None and SEVERITY_RANK[native.group(1)] < level:
            continue
        if level >= 1 and line.rstrip("\r\n") == ABSL_NOTICE:
            continue
        kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def native_start_up_held(level: int) -> Iterator[None]:
    """Hold descriptor 2 for the block (an ``import tensorflow``), then write back what ``level`` shows.

    Does nothing at level 0 (everything shown) or when descriptor 2 cannot be redirected.
    """
    if level <= 0:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = shown_lines(held.read().decode("utf-8", errors="replace"), level)
            if text:
                os.write(2, text.encode("utf-8"))
