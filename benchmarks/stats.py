"""Paired comparisons, medians and spreads, the machine they ran on, and tables.

Every figure is a ratio of tfstrategy against plain TensorFlow measured in the
same run: samples are taken in interleaved pairs (plain, tfstrategy, then the
other order), so slow drift on a shared machine hits both sides alike, and the
ratio of each pair is summarised by its median and its min-max spread.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """One row: a candidate against a plain-TensorFlow baseline, sample by sample.

    ``ratios`` defaults to candidate / baseline per pair; a row may supply its
    own (e.g. time above the import floor).
    """

    name: str
    unit: str
    better: str  # "lower" or "higher": which ratio direction favours tfstrategy
    baseline_label: str
    candidate_label: str
    baseline: tuple[float, ...]
    candidate: tuple[float, ...]
    ratios: tuple[float, ...] = ()

    def ratio_samples(self) -> tuple[float, ...]:
        if self.ratios:
            return self.ratios
        return tuple(c / b for b, c in zip(self.baseline, self.candidate))

    def summary(self) -> dict[str, Any]:
        ratios = self.ratio_samples()
        return {
            **asdict(self),
            "ratios": list(ratios),
            "baseline_median": statistics.median(self.baseline),
            "candidate_median": statistics.median(self.candidate),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "pairs": len(ratios),
        }


@dataclass(frozen=True, kw_only=True)
class SuiteResult:
    """A suite's rows plus what a reader needs to judge them."""

    name: str
    title: str
    rows: tuple[Comparison, ...]
    notes: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "notes": list(self.notes), "details": self.details,
                "rows": [row.summary() for row in self.rows]}


def interleaved_order(sides: Sequence[str], repeat: int) -> list[str]:
    """The order of sides for one repeat: rotated each time so no side always goes first."""
    shift = repeat % len(sides)
    return list(sides[shift:]) + list(sides[:shift])


def _version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_info() -> dict[str, Any]:
    """Cores, CPU, versions and load: stated beside every table."""
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(affinity(0)) if affinity else os.cpu_count(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow", "tensorflow-cpu"),
        "keras": _version("keras"),
        "tfstrategy": _version("tfstrategy"),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def machine_line(machine: dict[str, Any]) -> str:
    return (
        f"machine: {machine['usable_cores']} of {machine['cores']} cores ({machine['cpu']}), {machine['platform']}, "
        f"Python {machine['python']}, TensorFlow {machine['tensorflow']}, Keras {machine['keras']}, "
        f"load {machine['load_average_1m']} at start"
    )


def _value(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "examples/s":
        return f"{value:,.0f}/s"
    if unit == "examples/CPU-s":
        return f"{value:,.0f}/CPU-s"
    return f"{value:.3g} {unit}"


def format_table(suite: SuiteResult, machine: dict[str, Any]) -> str:
    """A Markdown table with the machine line beside it (paste-ready for the README)."""
    lines = [f"### {suite.title}", "", machine_line(machine), ""]
    lines += [
        "| comparison | plain TensorFlow side (median) | compared side (median) | ratio compared/plain: median | min-max | pairs | better |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in suite.rows:
        s = row.summary()
        lines.append(
            f"| {row.name} | {row.baseline_label}: {_value(s['baseline_median'], row.unit)} "
            f"| {row.candidate_label}: {_value(s['candidate_median'], row.unit)} "
            f"| **{s['ratio_median']:.3f}** | {s['ratio_min']:.3f}-{s['ratio_max']:.3f} | {s['pairs']} | {row.better} |"
        )
    lines += [""] + [f"- {note}" for note in suite.notes]
    return "\n".join(lines).rstrip() + "\n"
