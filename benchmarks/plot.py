"""One PNG: a panel per suite, each row's median ratio with its min-max spread.

A suite whose details carry ``loglog`` (``bytes``, per-side ``series``, ``unit``)
gets a second panel: its values against bytes on log-log axes (all-reduce cost).
One whose details carry ``curve`` (``x``, ``xlabel``, ``series``, ``unit``) gets
a throughput panel: examples/s against replicas or workers.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any


def plot_results(results: dict[str, Any], path: Path) -> Path:
    """Draw ``results`` (the JSON ``run.py`` writes) to ``path`` with the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and none is available in CI
    import matplotlib.pyplot as plt

    suites = results["suites"]
    curves = [suite for suite in suites if "loglog" in suite.get("details", {})]
    lines = [suite for suite in suites if "curve" in suite.get("details", {})]
    heights = [max(1.6, 0.55 * len(suite["rows"]) + 1.0) for suite in suites] + [3.2] * (len(curves) + len(lines))
    size = (10, sum(heights) + 0.8)
    figure, axes = plt.subplots(len(heights), 1, figsize=size, gridspec_kw={"height_ratios": heights})
    axes = list(axes) if len(heights) > 1 else [axes]
    for axis, suite in zip(axes[len(suites) + len(curves):], lines):
        curve = suite["details"]["curve"]
        for label, values in curve["series"].items():
            axis.plot(curve["x"], values, marker="o", label=label)
        axis.set_yscale("log")  # an MLP's and a CNN's examples/s differ by 10x and more
        axis.set_xticks(curve["x"], [str(x) for x in curve["x"]])
        axis.set_xlabel(curve["xlabel"], fontsize=8)
        axis.set_ylabel(f"throughput ({curve['unit']}, median)", fontsize=8)
        axis.set_title(textwrap.fill("Throughput: " + suite["title"], 90), fontsize=9, loc="left")
        axis.grid(True, linewidth=0.3)
        axis.legend(fontsize=7)
    for axis, suite in zip(axes[len(suites):], curves):
        curve = suite["details"]["loglog"]
        for side, values in curve["series"].items():
            axis.loglog(curve["bytes"], values, marker="o", label=side)
        axis.set_xlabel("tensor bytes", fontsize=8)
        axis.set_ylabel(f"median time ({curve['unit']})", fontsize=8)
        axis.set_title(textwrap.fill(suite["title"], 90), fontsize=9, loc="left")
        axis.grid(True, which="both", linewidth=0.3)
        axis.legend(fontsize=8)
    for axis, suite in zip(axes, suites):
        rows = suite["rows"]
        names = [row["name"].replace("`", "") for row in rows]
        medians = [row["ratio_median"] for row in rows]
        low = [row["ratio_median"] - row["ratio_min"] for row in rows]
        high = [row["ratio_max"] - row["ratio_median"] for row in rows]
        positions = list(range(len(rows)))[::-1]
        axis.errorbar(medians, positions, xerr=[low, high], fmt="o", capsize=4, color="tab:blue")
        axis.axvline(1.0, color="grey", linestyle="--", linewidth=1)
        axis.set_yticks(positions, [name if len(name) <= 70 else name[:67] + "..." for name in names], fontsize=8)
        axis.set_title(textwrap.fill(suite["title"], 90), fontsize=9, loc="left")
        axis.set_xlabel("ratio compared / plain TensorFlow (median, min-max)", fontsize=8)
    machine = results["machine"]
    figure.suptitle(
        f"{machine['usable_cores']} cores, TensorFlow {machine['tensorflow']}, Keras {machine['keras']}"
        f"{' (quick)' if results['quick'] else ''}", fontsize=9,
    )
    # Leave the top strip to the machine line, so it does not overlap the first panel's title.
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.35 / figure.get_figheight()))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
