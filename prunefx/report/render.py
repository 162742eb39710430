"""Render a report dict for humans: markdown (report.md) and a rich Table for the terminal."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from prunefx.report.plots import shared_metrics
from prunefx.report.verdict import verdict

_COST_COLUMNS = ("GMACs", "GFLOPs", "params (M)", "size (MB)", "latency ms: median [p10, p90]", "batch", "threads")


def _signed_pct(rel: float | None) -> str:
    return "" if rel is None else f" ({rel * 100:+.1f}%)"


def _abs_rel(delta: Mapping[str, Any] | None) -> str:
    if delta is None:
        return "-"
    if delta.get("noise"):  # a change the timing cannot vouch for is not printed as one
        return delta["noise"]
    value = delta["abs"]
    return (f"{value:+,}" if isinstance(value, int) else f"{value:+.4g}") + _signed_pct(delta["rel"])


def _metric_names(stages: Mapping[str, Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    for stage in stages.values():
        names.extend(k for k in stage["metrics"] if k not in names)
    return names


def _row(stage: Mapping[str, Any], metrics: Sequence[str]) -> list[str]:
    """Cells of one stage: costs with their relative change, metrics with their absolute change."""
    delta = stage["delta"]

    def cost(key: str, scale: float, fmt: str) -> str:
        if stage[key] is None:
            return "-"
        return f"{stage[key] / scale:{fmt}}{_signed_pct(delta[key]['rel']) if key in delta else ''}"

    lat = stage["latency"]
    latency = "-"
    if lat:
        change = _signed_pct(delta["latency_median_ms"]["rel"]) if "latency_median_ms" in delta else ""
        noise = lat.get("noise") or delta.get("latency_median_ms", {}).get("noise")
        if noise:  # say why the number is unreliable instead of printing a change that is not real
            change = f" ({noise})"
        latency = f"{lat['median_ms']:.2f} [{lat['p10_ms']:.2f}, {lat['p90_ms']:.2f}]{change}"
    cells = [
        cost("macs", 1e9, ".3f"),
        cost("flops", 1e9, ".3f"),
        cost("params", 1e6, ".3f"),
        cost("size_bytes", 1e6, ".2f"),
        latency,
        str(lat["batch_size"]) if lat else "-",
        str(lat["threads"]) if lat else "-",
    ]
    for name in metrics:
        value = stage["metrics"].get(name)
        change = stage["metrics_delta"].get(name)
        cells.append("-" if value is None else f"{value:.4g}" + (f" ({change['abs']:+.4g})" if change else ""))
    return cells


def _stage_label(report: Mapping[str, Any], name: str) -> str:
    """A stage's row name; the fine-tuned row says so when the pipeline kept the cut model instead."""
    finetune = report.get("settings", {}).get("finetune")
    if name == "finetuned" and isinstance(finetune, Mapping) and finetune.get("kept") == "pruned":
        return f"finetuned ({finetune.get('note', 'fine-tune made it worse: kept the cut model')})"
    return name


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _changes_section(stages: Mapping[str, Mapping[str, Any]]) -> list[str]:
    changed = [(name, s) for name, s in stages.items() if s["delta"]]
    if not changed:
        return []
    keys = list(dict.fromkeys(k for _, s in changed for k in s["delta"]))
    rows = [[key, *(_abs_rel(s["delta"].get(key)) for _, s in changed)] for key in keys]
    return ["## Change vs baseline", "", *_md_table(["quantity", *(n for n, _ in changed)], rows), ""]


def _widths_section(widths: Sequence[Mapping[str, Any]]) -> list[str]:
    if not widths:
        return []
    rows = [
        [w["name"], str(w["before"]), str(w["after"]), f"{w['after'] / w['before']:.1%}" if w["before"] else "-"]
        for w in widths
    ]
    return ["## Widths per group", "", *_md_table(["group", "before", "after", "kept"], rows), ""]


def _sweep_section(sweep: Sequence[Mapping[str, Any]]) -> list[str]:
    if not sweep:
        return []
    names = shared_metrics(sweep)
    header = ["ratio", "GMACs", "GFLOPs", "params (M)", *names]
    rows = [
        [f"{p['ratio']:g}", f"{p['macs'] / 1e9:.3f}", f"{p['flops'] / 1e9:.3f}", f"{p['params'] / 1e6:.3f}",
         *(f"{p['metrics'][n]:.4g}" for n in names)]
        for p in sweep
    ]  # fmt: skip
    return ["## Sweep", "", *_md_table(header, rows), ""]


def render_markdown(report: Mapping[str, Any], plots: Sequence[str] = ()) -> str:
    """The human-readable report.md: warnings, results table, changes, widths, sweep, plots, conventions, machine."""
    stages = report["stages"]
    metrics = _metric_names(stages)
    lines = [f"# Pruning report: {report['model']}", ""]
    lines += [f"Created {report['created']} with prunefx {report['prunefx']}.", ""]
    warnings = report_warnings(report)
    if warnings:
        lines += ["## Warnings", "", *(f"- **warning**: {w}" for w in warnings), ""]
    lines += _md_table(["stage", *_COST_COLUMNS, *metrics],
                       [[_stage_label(report, name), *_row(s, metrics)] for name, s in stages.items()])
    lines += ["", "Costs show the relative change vs baseline in parentheses, metrics the absolute change.", ""]
    lines += _timing_line(report.get("timing"))
    settings = report["settings"] if isinstance(report["settings"], Mapping) else {}
    depth, refit, experts = settings.get("depth"), settings.get("refit"), settings.get("experts")
    lines += [experts_line(experts), ""] if isinstance(experts, Mapping) else []
    lines += [depth_line(depth), ""] if isinstance(depth, Mapping) else []
    lines += [refit_line(refit), ""] if isinstance(refit, Mapping) else []
    verify = settings.get("verify")  # VerifyResult.headline(): an inexact-by-design cut says so first
    lines += [f"Check against the masked original: {verify}", ""] if isinstance(verify, str) else []
    lines += _changes_section(stages) + _widths_section(report["widths"]) + _sweep_section(report["sweep"])
    lines += [f"![{name.removesuffix('.png')}]({name})" for name in plots] + ([""] if plots else [])
    lines += ["## Conventions", "", *(f"- **{k}**: {v}" for k, v in report["conventions"].items())]
    lines += ["", "## Machine", "", *(f"- {k}: {v}" for k, v in report["machine"].items())]
    if report["settings"]:
        lines += ["", "## Settings", "", "```json", json.dumps(report["settings"], indent=2), "```"]
    lines += _controls_section(report)
    return "\n".join(lines) + "\n"


def report_warnings(report: Mapping[str, Any]) -> list[str]:
    """The report's warnings in order: report.md and report.html both list exactly these, before anything else."""
    return [str(w) for w in report.get("warnings") or ()]


def _controls_section(report: Mapping[str, Any]) -> list[str]:
    """The controls' table and, last in report.md, the verdict drawn from the report's numbers."""
    table = controls_table(report)
    if table is None:
        return []
    return ["", "## Controls", "", *_md_table(*table), "", "## Verdict", "", *verdict(report)]


def controls_table(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]] | None:
    """The controls' header and cells (report.md and report.html show the same), None when the run has none."""
    controls = report.get("controls")
    if not controls or not controls.get("runs"):
        return None
    metrics = list(dict.fromkeys(k for r in controls["runs"] for k in r["metrics"]))
    rows = [[r["name"], r["what"], str(r["epochs"]), f"{r['flops'] / 1e9:.4g}", f"{r['params'] / 1e6:.4g}",
             *(f"{r['metrics'][k]:.4g}" if k in r["metrics"] else "-" for k in metrics)] for r in controls["runs"]]
    return ["control", "what", "epochs", "GFLOPs", "params (M)", *metrics], rows


def refit_line(refit: Mapping[str, Any]) -> str:
    """One sentence on the re-fit after the cut: calibration error before and after, layers, data."""
    layers, skipped = refit.get("layers", ()), refit.get("skipped", ())
    applied = sum(1 for x in layers if x.get("applied"))
    data = f" ({refit['calibration']})" if refit.get("calibration") else ""
    before = refit.get("metrics_before")
    cut = (" Metrics right after the cut, before the re-fit: " + ", ".join(f"{k} {v:.4g}" for k, v in before.items())
           + ".") if isinstance(before, Mapping) and before else ""
    return (f"Re-fit after the cut on {refit.get('batches')} calibration batch(es){data}: relative output error "
            f"{refit.get('before', 0.0):.4g} -> {refit.get('after', 0.0):.4g} over {len(layers)} layer(s), "
            f"{applied} re-fitted, {len(skipped)} skipped.{cut}")


def experts_line(experts: Mapping[str, Any]) -> str:
    """One sentence on the expert cut before the others: experts kept per MoE layer, by what, active parameters."""
    kept = experts.get("kept") or {}
    per_layer = len(next(iter(kept.values()), []))
    active = experts.get("active_params") or (0, 0)
    after = (f"; the cuts before the widths kept {experts['params_kept']:.3f} of the parameters"
             if "params_kept" in experts else "")
    return (f"Expert cut first: {per_layer} experts kept in each of {len(kept)} MoE layer(s) by "
            f"{experts.get('criterion')}, active parameters {active[0]:,} -> {active[1]:,}; checked: "
            f"{experts.get('verify')}{after}.")


def depth_line(depth: Mapping[str, Any]) -> str:
    """One sentence on the depth cut before the width cut: the blocks removed, by what, what they left."""
    removed = depth.get("removed") or ()
    target = ", ".join(f"{k} {v:.4g}" for k, v in (depth.get("width_target") or {}).items())
    return (f"Depth cut before the width cut: {len(removed)} block(s) removed ({', '.join(removed)}) by "
            f"{depth.get('criterion')}, the cuts before the widths keeping {depth.get('params_kept', 1.0):.3f} of "
            f"the parameters and {depth.get('macs_kept', 1.0):.3f} of the MACs; checked: {depth.get('verify')}; "
            f"the width cut then planned for {target} of the model they left.")


def _timing_line(timing: Mapping[str, Any] | None) -> list[str]:
    """One sentence on how latency was timed (stated once), flagged when the timing is unreliable."""
    if not timing:
        return []
    how = "in alternating rounds" if timing.get("alternating") else f"in {timing.get('rounds', 1)} round(s)"
    load = timing.get("load_avg")
    where = f"load average {load:.1f} on {timing.get('cpu_count')} cores" if load is not None else "load unknown"
    text = (f"Latency: {timing['backend']} ({timing.get('deployed') or 'as is'}) on {timing['device']}, "
            f"{timing['threads']} threads, batch {timing['batch_size']}, models timed {how}; {where}.")
    if timing.get("noise"):
        text += f" **{timing['noise']}: the latency changes above are not reliable.**"
    return [text, ""]


def render_table(report: Mapping[str, Any]) -> Table:
    """A rich Table for the terminal: one column per stage, one row per cost or metric (fits any metric count)."""
    stages = report["stages"]
    metrics = _metric_names(stages)
    caption = "FLOPs = 2 x MACs; costs: (x%) = change vs baseline; metrics: (+x) = absolute change"
    timing = _timing_line(report.get("timing"))
    if timing:
        caption += "\n" + timing[0].replace("**", "")
    table = Table(title=f"prunefx: {report['model']}", caption=caption)
    table.add_column("quantity", style="bold")
    for name in stages:
        table.add_column(_stage_label(report, name), justify="right")
    cells = {name: _row(stage, metrics) for name, stage in stages.items()}
    for i, quantity in enumerate((*_COST_COLUMNS, *metrics)):
        table.add_row(quantity, *(cells[name][i] for name in stages))
    return table
