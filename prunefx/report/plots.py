"""PNG plots of a report: per-layer widths before/after and accuracy versus FLOPs over a sweep.

Figures are drawn on matplotlib's Agg canvas directly, never through pyplot, so plotting is headless
and leaves the process's global backend and figure registry alone.
"""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prunefx._extras import install_hint, require

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_MAX_STAGES = 30  # bars in the per-stage panel; deeper module prefixes are merged until this many remain


def available() -> bool:
    """Whether matplotlib is installed (the ``plots`` extra); without it a report has no PNG plots."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ValueError, ImportError):  # removed from sys.modules, or a finder that refuses it
        return False


MISSING = f"plots not drawn: matplotlib is not installed ({install_hint('matplotlib')})"


def _figure(**kwargs: Any) -> Figure:
    return require("matplotlib.figure", "a report's plots").Figure(**kwargs)


def _png(fig: Figure) -> bytes:
    require("matplotlib.backends.backend_agg", "a report's plots").FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()


def _module(name: str) -> list[str]:
    """The module path of a group label ("model.2.cv1.conv out[0:16]" -> ["model", "2", "cv1", "conv"])."""
    return name.split(" ", 1)[0].split(".")


def _stages(names: Sequence[str]) -> list[str]:
    """Each group's stage: the deepest module prefix that still leaves at most ``_MAX_STAGES`` distinct stages."""
    paths = [_module(n) for n in names]
    best = [p[0] for p in paths]
    for depth in range(2, max((len(p) for p in paths), default=1)):
        keys = [".".join(p[:depth]) for p in paths]
        if len(set(keys)) > _MAX_STAGES:
            break
        best = keys
    return best


def widths_png(widths: Sequence[Mapping[str, Any]], title: str = "") -> bytes:
    """Kept channels at a glance: the kept % of every group in model order (top), and before/after channels with
    the kept % per stage (bottom; a stage is a module prefix such as ``layer1`` or ``model.4``)."""
    names = [w["name"] for w in widths]
    kept = [100.0 * w["after"] / max(w["before"], 1) for w in widths]
    stages = _stages(names)
    order = list(dict.fromkeys(stages))
    totals = {s: [0, 0, 0] for s in order}  # before, after, groups
    for w, s in zip(widths, stages, strict=True):
        totals[s][0] += w["before"]
        totals[s][1] += w["after"]
        totals[s][2] += 1
    rows = len(order)
    fig = _figure(figsize=(10, 3.2 + 0.32 * rows + 0.8))
    top, bottom = fig.subplots(2, 1, height_ratios=[3.2, 0.32 * rows + 0.8])

    colours = ["tab:blue", "tab:orange"]
    xs = list(range(len(widths)))
    for i, s in enumerate(order):  # shade alternate stages so the dots read by stage
        idx = [x for x, st in zip(xs, stages, strict=True) if st == s]
        if i % 2:
            top.axvspan(idx[0] - 0.5, idx[-1] + 0.5, color="0.93", zorder=0)
        top.scatter(idx, [kept[x] for x in idx], s=14, color=colours[i % 2], zorder=2)
    top.set_ylim(0, 105)
    top.set_xlim(-0.5, max(len(widths) - 0.5, 0.5))
    top.set_ylabel("kept %", fontsize=11)
    top.set_xlabel(f"group, in model order ({len(widths)} groups; shading alternates by stage)", fontsize=10)
    top.grid(axis="y", alpha=0.3)
    top.tick_params(labelsize=10)
    removed = 1 - sum(w["after"] for w in widths) / max(sum(w["before"] for w in widths), 1)
    top.set_title((title + "\n" if title else "") + f"channels kept per group ({removed:.0%} of all removed)",
                  fontsize=12)

    ys = list(range(rows))
    before = [totals[s][0] for s in order]
    after = [totals[s][1] for s in order]
    bottom.barh(ys, before, height=0.7, color="0.82", label="before")
    bottom.barh(ys, after, height=0.7, color="tab:blue", label="after")
    for y, b, a in zip(ys, before, after, strict=True):
        bottom.text(b, y, f"  {a}/{b} ({100 * a / max(b, 1):.0f}%)", va="center", fontsize=9)
    bottom.set_yticks(ys, [f"{s} ({totals[s][2]})" for s in order], fontsize=10)
    bottom.invert_yaxis()  # first stage at the top, as in the model
    bottom.set_xlim(0, max(before, default=1) * 1.35)
    bottom.set_xlabel("channels per stage (groups in brackets)", fontsize=10)
    bottom.legend(loc="lower right", fontsize=9)
    bottom.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


_LABELLED = 10  # sensitivity curves named in the legend: the most damaging ones


def sensitivity_png(curves: Mapping[str, Any], title: str = "") -> bytes:
    """Measured damage against kept fraction, one line per group (``SensitivityCurves.to_dict()``; keep 1 is
    damage 0); the ``_LABELLED`` groups with the most damage at their deepest measured cut are named."""
    rows = [c for c in curves["curves"] if c["keep"]]
    worst = sorted(rows, key=lambda c: -c["damage"][-1] * max(len(c["tied"]), 1))[:_LABELLED]
    fig = _figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for c in rows:
        pts = sorted(zip([*c["keep"], 1.0], [*c["damage"], 0.0], strict=True))
        named = c in worst
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, alpha=0.9 if named else 0.35,
                linewidth=1.4 if named else 0.8, label=c["label"] or f"group {c['group']}" if named else None)
    metric = "loss increase" if curves.get("metric") == "loss_increase" else "relative output error"
    ax.set_xlabel("kept fraction of the group's channels")
    ax.set_ylabel(f"measured damage ({metric})")
    ax.set_xlim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title((title + "\n" if title else "") + f"sensitivity: each group cut alone ({len(rows)} groups)",
                 fontsize=11)
    if worst:
        ax.legend(fontsize=7, title=f"most damaging {len(worst)}", title_fontsize=8)
    fig.tight_layout()
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
    fig = _figure(figsize=(7, 4.5))
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
