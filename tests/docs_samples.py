"""The console samples the docs show, held against what the process tests really printed.

A ``text`` block of a page, just below ``<!-- docs-sample: NAME -->``, is sample NAME: what the
launcher (or another command) prints in a case a process test runs anyway. That test calls
:func:`assert_sample` with the console it got, so the page cannot drift from the product, at no cost
of its own: the sample is checked where it is produced. ``tests/test_docs_samples.py`` checks that
every sample of the docs is claimed by a test, and the matching rules below without processes.

The rules, so that a sample stays readable and still says something exact:

- each line of the sample must be a line of the real console, in the same order (other lines may
  come between: a worker's output, lines the sample leaves out);
- a measurement matches any number (it varies from run to run): a decimal number (``0.2 s``, ``15.5x``), a
  number with a unit of time, rate or share (``23 s``, ``5 ms``, ``561/s``, ``376 examples/s``, ``12%``,
  ``3x``), or a number of four digits or more (a port, ``1,494``); other whole numbers (a worker, a step,
  a batch count, an exit status) must be the same;
- a line ``...`` stands for any lines; a line ending in `` ...`` matches the real line's beginning;
- ``DIR`` matches a path; a file's path (``/tmp/x/model.weights.h5``, ``tests/workers/fault_worker.py:65``)
  matches any path to a file of that name, at any line; a decimal may have an exponent (``1.2e-07``).
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers import ROOT

SAMPLE = re.compile(r"<!--\s*docs-sample:\s*(\S+)\s*-->\s*\n+[ \t]*```text\n(.*?)\n[ \t]*```", re.S)
#: A measurement in a sample: a decimal number, seconds, or four digits or more (see the module's rules).
MEASUREMENT = re.compile(r"(?<![0-9.])(?<![0-9],)(?:[0-9]+\.[0-9]+(?:e[-+][0-9]+)?|[0-9]+(?= s\b| ms\b|%|/s| examples/s| in-step examples/s|x\b)|[0-9]{4,}|[0-9]{1,3}(?:,[0-9]{3})+)(?![0-9.]|,[0-9])")


def pages() -> list[Path]:
    """Every page that may hold samples."""
    found = [ROOT / "README.md"]
    found.extend(sorted((ROOT / "docs").rglob("*.md")))
    return found


def all_samples() -> dict[str, tuple[Path, list[str]]]:
    """Every sample of the docs: its name, its page and its lines."""
    samples: dict[str, tuple[Path, list[str]]] = {}
    for page in pages():
        for match in SAMPLE.finditer(page.read_text(encoding="utf-8")):
            name = match.group(1)
            if name in samples:
                raise ValueError(f"docs sample {name!r} is named twice: {samples[name][0]} and {page}; "
                                 "give each sample a name of its own")
            samples[name] = (page, [line.strip() for line in match.group(2).splitlines()])
    return samples


#: A file's path in a sample (``/tmp/x/model.weights.h5``, ``tests/workers/fault_worker.py:65``): any path to a
#: file of that name (at any line).
PATH = re.compile(r"\S*/([\w.-]+\.[A-Za-z0-9]+)(?::[0-9]+)?")


def _text_pattern(piece: str) -> str:
    """Plain sample text as a pattern: measurements match any number, the rest itself."""
    parts: list[str] = []
    last = 0
    for number in MEASUREMENT.finditer(piece):
        parts.append(re.escape(piece[last:number.start()]))
        parts.append(r"[0-9][0-9,]*(?:\.[0-9]+)?(?:e[-+][0-9]+)?")
        last = number.end()
    parts.append(re.escape(piece[last:]))
    return "".join(parts)


def line_pattern(line: str) -> re.Pattern[str]:
    """One sample line as a pattern over a real console line (see the module's rules)."""
    prefix = line.endswith(" ...")
    text = line[:-4] if prefix else line
    parts: list[str] = []
    last = 0
    for token in re.finditer(r"DIR|" + PATH.pattern, text):
        parts.append(_text_pattern(text[last:token.start()]))
        name = token.group(1)
        parts.append(r"\S+" if name is None else r"\S*/" + re.escape(name) + r"(?::[0-9]+)?")
        last = token.end()
    parts.append(_text_pattern(text[last:]))
    return re.compile("".join(parts) + ("" if prefix else r"\s*$"))


def unmatched(sample: list[str], console: str) -> list[str]:
    """The sample's lines the console does not show in order (empty when it matches)."""
    real = [line.strip() for line in console.splitlines()]
    position = 0
    for index, line in enumerate(sample):
        if line == "...":
            continue
        pattern = line_pattern(line)
        found = next((at for at in range(position, len(real)) if pattern.match(real[at])), None)
        if found is None:
            return sample[index:]
        position = found + 1
    return []


def assert_sample(name: str, console: str) -> None:
    """The page's sample ``name`` is what ``console`` (a real run's) shows, by the module's rules."""
    page, sample = all_samples()[name]
    missing = unmatched(sample, console)
    assert not missing, (f"{page.relative_to(ROOT)}'s sample {name!r} no longer matches the real console: from "
                         f"{missing[0]!r} on, not found in order. Update the page from the console:\n{console[-4000:]}")
