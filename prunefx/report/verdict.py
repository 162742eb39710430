"""The verdict that ends report.md: does the pruned model beat the models of its budget trained from scratch?

Produced from the report's own numbers only (``stages`` and ``controls``), so it can be checked against them:

    pruned beats the narrow model by 1.2 points of top1 at equal GFLOPs and equal total epochs ...

When every compared model scores 0, or at or below the chance level the controls give (``controls.chance``, e.g.
1/classes for top-1), there is nothing to rank: the verdict says "No verdict", why, and what to do instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TIE_POINTS = 0.05  # a difference below this many points is reported as a tie


def _compare(ours: float, theirs: float) -> tuple[str, float]:
    """("beats" | "trails" | "matches", absolute difference in points = 100 x metric)."""
    points = (ours - theirs) * 100
    if abs(points) < TIE_POINTS:
        return "matches", abs(points)
    return ("beats" if points > 0 else "trails"), abs(points)


def _by(word: str, points: float) -> str:
    return word if word == "matches" else f"{word} it by {points:.1f} points"


def _no_verdict(metric: str, scores: Mapping[str, float], chance: float | None) -> str | None:
    """Why ``scores`` (model -> metric) cannot rank the models, or None when they can.

    Every score at 0, or at or below the chance level (within the tie tolerance): no model has learned the task,
    so the differences between them are noise and any "beats" or "matches" would be read as a result.
    """
    tie = TIE_POINTS / 100
    names = ", ".join(f"{n} {v:.4f}" for n, v in scores.items())
    fix = "train longer (more epochs, a higher learning rate) or check the data (labels, the evaluation split)"
    if all(abs(v) < tie for v in scores.values()):
        return f"No verdict: every model scores 0 on {metric} ({names}); {fix}, then compare again."
    if chance is not None and all(v < chance + tie for v in scores.values()):
        return (f"No verdict: every model scores at or below chance level {chance:.4f} on {metric} ({names}); "
                f"{fix}, then compare again.")
    return None


def verdict(report: Mapping[str, Any]) -> list[str]:
    """Sentences comparing the pruned (fine-tuned when there is one) model with the report's controls."""
    controls = report.get("controls")
    if not controls or not controls.get("runs"):
        return []
    metric, total, ft = controls["metric"], controls["total_epochs"], controls["finetune_epochs"]
    stages = report["stages"]
    name = "finetuned" if "finetuned" in stages else "pruned"
    ours = stages[name]["metrics"].get(metric)
    if ours is None:
        return [f"No verdict: the {name} model has no {metric} in this report."]
    runs = {r["name"]: r for r in controls["runs"]}
    scores = {"pruned": ours, **{n: r["metrics"][metric] for n, r in runs.items() if metric in r["metrics"]}}
    unranked = _no_verdict(metric, scores, controls.get("chance"))
    if unranked is not None:
        return [unranked]
    gflops = stages[name]["flops"] / 1e9
    lines = [f"Metric: {metric} (1 point = 0.01); pruned = the {name} model, {ours:.4f} at {gflops:.4g} GFLOPs, "
             f"trained {total} epochs in all (baseline + sparsity + fine-tune), {ft} of them fine-tuning."]
    narrow = runs.get("narrow")
    if narrow is not None and metric in narrow["metrics"]:
        word, points = _compare(ours, narrow["metrics"][metric])
        gap = narrow["flops"] / stages[name]["flops"] - 1
        text = (f"**Pruned {word} the narrow model" + ("" if word == "matches" else f" by {points:.1f} points")
                + f" at equal GFLOPs and equal total epochs** ({ours:.4f} vs {narrow['metrics'][metric]:.4f}; "
                f"narrow: {narrow['flops'] / 1e9:.4g} GFLOPs ({gap:+.1%}), {narrow['epochs']} epochs from scratch)")
        short = runs.get("narrow_ft")
        if short is not None and metric in short["metrics"]:
            word, points = _compare(ours, short["metrics"][metric])
            text += (f"; **and {_by(word, points)} at equal fine-tune epochs** ({ours:.4f} vs "
                     f"{short['metrics'][metric]:.4f}, the narrow model trained {short['epochs']} epochs from scratch)")
        else:
            text += "; no comparison at equal fine-tune epochs (no fine-tuning epochs)"
        lines.append(text + ".")
    scratch = runs.get("scratch")
    if scratch is not None and metric in scratch["metrics"]:
        word, points = _compare(ours, scratch["metrics"][metric])
        lines.append(f"The pruned architecture trained from scratch for {scratch['epochs']} epochs reaches "
                     f"{scratch['metrics'][metric]:.4f}: pruning {_by(word, points)}.")
    return lines
