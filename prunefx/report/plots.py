"""PNG plots of a report: per-layer widths before/after and accuracy versus FLOPs over a sweep.

Figures are drawn on matplotlib's Agg canvas directly, never through pyplot, so plotting is headless
and leaves the process's global backend and figure registry alone.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_MAX_HEIGHT_IN = 150  # keeps a model with thousands of groups under matplotlib's pixel limit


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def widths_png(widths: Sequence[Mapping[str, Any]]) -> bytes:
    """Horizontal bars of each group's width before (grey) and after (blue) pruning, in model order."""
    names = [w["name"] for w in widths]
    height = min(_MAX_HEIGHT_IN, max(2.5, 0.22 * len(widths) + 1.2))
    fig = Figure(figsize=(8, height))
    ax = fig.add_subplot()
    rows = range(len(widths))
    ax.barh([r - 0.2 for r in rows], [w["before"] for w in widths], height=0.4, color="0.75", label="before")
    ax.barh([r + 0.2 for r in rows], [w["after"] for w in widths], height=0.4, color="tab:blue", label="after")
    ax.set_yticks(list(rows), names, fontsize=7)
    ax.invert_yaxis()  # first layer at the top, as in the model
    ax.set_xlabel("channels / features")
    ax.set_title("Widths before and after pruning")
    ax.legend(loc="best")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def shared_metrics(sweep: Sequence[Mapping[str, Any]]) -> list[str]:
    """Metric names every sweep point has, in the first point's order."""
    if not sweep:
        return []
    return [k for k in sweep[0]["metrics"] if all(k in p["metrics"] for p in sweep)]


def plottable_metric(sweep: Sequence[Mapping[str, Any]]) -> str | None:
    """The metric an accuracy-vs-FLOPs curve would show first, or None if a curve would be meaningless."""
    metrics = shared_metrics(sweep)
    return metrics[0] if len(sweep) >= 2 and metrics else None


def accuracy_vs_flops_png(sweep: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any] | None = None) -> bytes:
    """One line per metric shared by all sweep points, GFLOPs on x, each point labelled with its ratio.

    The unpruned ``baseline`` stage, when given and carrying the metric, is drawn as a star.
    """
    points = sorted(sweep, key=lambda p: p["flops"])
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for metric in shared_metrics(sweep):
        xs = [p["flops"] / 1e9 for p in points]
        ys = [p["metrics"][metric] for p in points]
        (line,) = ax.plot(xs, ys, marker="o", label=metric)
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(f"{p['ratio']:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if baseline is not None and metric in baseline["metrics"]:
            ax.plot(baseline["flops"] / 1e9, baseline["metrics"][metric], marker="*", markersize=12,
                    color=line.get_color(), linestyle="none")
    ax.set_xlabel("GFLOPs (2 x GMACs)")
    ax.set_ylabel("metric")
    ax.set_title("Accuracy vs FLOPs (labels: pruning ratio, star: baseline)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)
