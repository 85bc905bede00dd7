"""Slurm's compressed lists read without TensorFlow: node names and task counts of a job step.

``tfstrategy launch`` never imports TensorFlow (its parsers took 29 s to import on a loaded
machine), so under ``srun tfstrategy launch`` the step's ``SLURM_STEP_NODELIST`` and
``SLURM_STEP_TASKS_PER_NODE`` are read here; the workers keep TensorFlow's own parsers
(:func:`tfstrategy._compat.slurm_hostlist_helpers`), and a test checks both agree.
"""

from __future__ import annotations

import re

__all__ = ["expand_nodelist", "expand_task_counts", "PLAIN_PARSERS"]


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed node list as names, in order: ``"gpu[01-02,05],cpu1"`` -> ``gpu01, gpu02, gpu05, cpu1``.

    Several bracket groups in one name expand as their product, in order (``r[1-2]n[1-2]``:
    ``r1n1, r1n2, r2n1, r2n2``); a range keeps its lower bound's zero-padding.

    Raises:
        ValueError: an unbalanced bracket or a range that is not ``low-high`` digits.
    """
    names: list[str] = []
    for entry in _split_outside_brackets(text.strip()):
        if not entry:
            raise ValueError(f"an empty name in {text!r}")
        expanded = [""]
        for part in re.split(r"(\[[^\]]*\])", entry):  # literals, and bracket groups kept with their brackets
            choices = _expand_ranges(part[1:-1]) if part.startswith("[") else [part]
            expanded = [prefix + choice for prefix in expanded for choice in choices]
        names.extend(expanded)
    return names


def _split_outside_brackets(text: str) -> list[str]:
    """``"a[1,3],b"`` -> ``["a[1,3]", "b"]``: the commas that separate names, not those inside a range list."""
    entries, depth, start = [], 0, 0
    for position, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in {text!r}")
        if char == "," and depth == 0:
            entries.append(text[start:position])
            start = position + 1
    if depth:
        raise ValueError(f"unbalanced brackets in {text!r}")
    return [*entries, text[start:]]


def _expand_ranges(group: str) -> list[str]:
    """``"01-03,7"`` -> ``["01", "02", "03", "7"]``."""
    items: list[str] = []
    for part in group.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or int(high or low) < int(low):
            raise ValueError(f"range {part!r} is not low-high digits")
        items.extend(str(number).zfill(len(low)) for number in range(int(low), int(high or low) + 1))
    return items


def expand_task_counts(text: str) -> list[int]:
    """``SLURM_STEP_TASKS_PER_NODE`` as one count per node: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises:
        ValueError: a part that is not ``N`` or ``N(xM)``.
    """
    counts: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ValueError(f"{part!r} is not N or N(xM)")
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


#: Slurm's variables parsed without TensorFlow (for ``tfstrategy launch``, which never imports it).
PLAIN_PARSERS = (expand_nodelist, expand_task_counts)
