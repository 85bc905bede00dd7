"""The job report as a picture: one self-contained HTML file with an inline SVG (pure: no TensorFlow, no plotting
library, no external asset).

:func:`html` draws one bar per worker (and one for the job): its median step, in milliseconds, split into
input, reduction, dispatch and compute; then the verdict, the recommendations and the report's text. The
file is well-formed XML (XHTML), so any browser opens it and any XML parser reads it.
"""

from __future__ import annotations

import math
from html import escape

from tfstrategy.performance.job import JobReport, WorkerFigures
from tfstrategy.performance.verdict import PARTS, UNSPLIT, epoch_note

#: Each part's colour (colour-blind safe: Okabe-Ito), and the colour of a step the probes did not split.
COLOURS = {"input": "#E69F00", "reduction": "#56B4E9", "dispatch": "#CC79A7", "compute": "#009E73"}
UNSPLIT_COLOUR = "#999999"
_WIDTH, _LEFT, _RIGHT, _BAR, _GAP, _TOP = 760, 170, 30, 26, 14, 40
#: The labels' font size (px), and the space between a label and its bar.
_FONT, _PAD = 13, 8
#: Character widths in em at least as wide as the widest common sans-serif (DejaVu Sans), for a margin that fits.
_WIDE, _NARROW = frozenset("%mwMW@"), frozenset(" .,:;!|'il()[]")


def text_width(text: str, size: float = _FONT) -> float:
    """An upper bound of ``text``'s width in px at ``size`` px (no font metrics here: a pure module)."""
    ems = sum(1.0 if char in _WIDE else 0.4 if char in _NARROW else 0.8 if char.isupper() else 0.66
              for char in text)
    return ems * size


def _left(labels: list[str]) -> float:
    """The bars' left edge: after the longest label, and never less than the usual margin."""
    return max(float(_LEFT), 2 * _PAD + max((text_width(label) for label in labels), default=0.0))


def _tick_step(largest: float) -> float:
    """A round tick interval (1, 2 or 5 x 10^n) giving about five ticks up to ``largest``."""
    if largest <= 0:
        return 1.0
    raw = largest / 5
    power = 10.0 ** math.floor(math.log10(raw))
    return next(float(step * power) for step in (1, 2, 5, 10) if step * power >= raw)


def _bar(y: float, label: str, median_ms: float, shares: dict[str, float], split: bool, scale: float,
         left: float) -> list[str]:
    """One labelled bar: its segments, each with a tooltip, and its step in ms at its end."""
    parts = [f'<text x="{left - _PAD:.1f}" y="{y + _BAR * 0.68:.1f}" text-anchor="end">{escape(label)}</text>']
    x = left
    segments = [(part, shares[part]) for part in PARTS] if split else [(UNSPLIT, 1.0)]
    for part, share in segments:
        width = median_ms * share * scale
        if width <= 0:
            continue
        colour = COLOURS.get(part, UNSPLIT_COLOUR)
        title = f"{part}: {share:.0%} ({median_ms * share:.3g} ms)" if split else "not split: the probes did not run"
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{_BAR}" fill="{colour}">'
                     f"<title>{escape(title)}</title></rect>")
        x += width
    parts.append(f'<text x="{x + 6:.1f}" y="{y + _BAR * 0.68:.1f}">{median_ms:.3g} ms</text>')
    return parts


def svg(job: JobReport) -> str:
    """The step-time breakdown per worker, and the job's, as an SVG element."""
    rows: list[tuple[str, float, dict[str, float], bool]] = [
        ("job (slowest worker's step)", job.median * 1000, job.shares, job.bottleneck != UNSPLIT)]
    rows += [(_label(job, figures), figures.median * 1000, figures.shares, figures.split) for figures in job.workers]
    largest = max(row[1] for row in rows)
    tick = _tick_step(largest)
    axis_end = math.ceil(largest / tick) * tick if largest > 0 else 1.0
    left = _left([row[0] for row in rows])
    width = round(left + _WIDTH - _LEFT)  # the bars keep their room; the labels get theirs
    scale = (_WIDTH - _LEFT - _RIGHT - 60) / axis_end
    height = _TOP + len(rows) * (_BAR + _GAP) + 60
    body: list[str] = [f'<text x="{left:.1f}" y="22" font-weight="bold">median step, ms</text>']
    bottom = _TOP + len(rows) * (_BAR + _GAP)
    for index in range(int(round(axis_end / tick)) + 1):
        x = left + index * tick * scale
        body.append(f'<line x1="{x:.1f}" y1="{_TOP - 6}" x2="{x:.1f}" y2="{bottom}" stroke="#dddddd"/>')
        body.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{index * tick:g}</text>')
    for index, (label, median_ms, shares, split) in enumerate(rows):
        body += _bar(_TOP + index * (_BAR + _GAP), label, median_ms, shares, split, scale, left)
    x = left
    unsplit = any(not row[3] for row in rows)
    for part in (*PARTS, UNSPLIT) if unsplit else PARTS:
        body.append(f'<rect x="{x:.1f}" y="{bottom + 30}" width="12" height="12" '
                    f'fill="{COLOURS.get(part, UNSPLIT_COLOUR)}"/>')
        name = "not split" if part == UNSPLIT else part
        body.append(f'<text x="{x + 16:.1f}" y="{bottom + 41}">{name}</text>')
        x += 16 + 9 * len(name) + 18
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="{_FONT}" role="img" '
            f'aria-label="step-time breakdown per worker">' + "".join(body) + "</svg>")


def _label(job: JobReport, figures: WorkerFigures) -> str:
    return f"worker {figures.worker} ({figures.replicas / max(job.replicas, 1):.0%} of examples)"


def html(job: JobReport) -> str:
    """The whole report as one self-contained XHTML page: headline, picture, recommendations, text."""
    if job.bottleneck != UNSPLIT:
        verdict = f"{job.bottleneck}-bound ({job.shares[job.bottleneck]:.0%} of a step)"
    elif job.inferred is not None:
        verdict = f"not split by the probes; {job.inferred.headline()}"
    else:
        verdict = "the step was not split: the probes did not run"
    rate = f"<b>{job.examples_per_second:,.0f} in-step examples/s</b>" + epoch_note(job.epoch_examples_per_second)
    items = "".join(f"<li><b>{escape(r.part)}</b>: {escape(r.line())}</li>" for r in job.recommendations)
    cost = job.probe_cost()
    cost_text = (f"probes {job.probe_seconds:.2f} s" + (f" = {cost:.1%} of the {job.seconds:.1f} s trained"
                                                          if cost is not None else "")
                 + f" (allowed {job.probe_share:.0%})")
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n'
        '<html xmlns="http://www.w3.org/1999/xhtml" lang="en"><head><meta charset="utf-8"/>'
        "<title>tfstrategy performance report</title>"
        "<style>body{font-family:sans-serif;margin:2em;max-width:60em}pre{background:#f6f6f6;padding:1em;"
        "white-space:pre-wrap}</style></head><body>"
        "<h1>tfstrategy performance report</h1>"
        f"<p>{rate} for the job: {len(job.workers)} worker(s), "
        f"{job.replicas} replica(s), global batch {job.global_batch}, {job.steps} steps in {job.seconds:.1f} s. "
        f"Verdict: <b>{escape(verdict)}</b>.</p>"
        f"{svg(job)}"
        f"<h2>Recommendations</h2><ol>{items}</ol>"
        f"<p>Report cost: {escape(cost_text)}.</p>"
        f"<h2>Report</h2><pre>{escape(job.text())}</pre>"
        "</body></html>\n"
    )
