"""How long structured pruning takes end to end on torchvision models, prunefx vs Torch-Pruning.

    python -m experiments.bench_prune                        # the default models, 3 repeats
    python -m experiments.bench_prune --quick                # resnet18 + mobilenet_v2, 1 repeat (smoke test)
    python -m experiments.bench_prune --models resnet50,vit_b_16 --repeats 5 --out /tmp/bench

What is timed, per model (median of ``--repeats`` runs, each on a fresh deep copy of the same CPU model, both
tools in one process and interleaved: repeat r runs prunefx first when r is even, Torch-Pruning first when odd;
an untimed warm-up on a tiny model first, so no lazy import is counted):
- prunefx: (a) ``analyze(model, x)``, (b) ``score(model, dg, "bn_scale")`` + ``make_plan(dg, scores,
  PlanConfig(ratio=0.5))`` (global scope), (c) ``apply_plan(model, dg, plan)``.
- Torch-Pruning: (a) ``tp.pruner.MetaPruner(model, x, importance, pruning_ratio=0.5, global_pruning=True,
  max_pruning_ratio=0.9, ignored_layers=[classifier])``, which builds its DependencyGraph with a forward pass,
  (b) ``pruner.step()``. The importance is ``BNScaleImportance()`` for models with BatchNorm, else
  ``GroupMagnitudeImportance(p=2)`` (prunefx's bn_scale falls back to l2 per group the same way). ViT follows
  Torch-Pruning's torchvision example: ``round_to=num_heads`` and ``model.hidden_dim`` reset after the step.
Before the copies are made, every BatchNorm gamma is drawn from U(0.1, 1) (seeded, untimed): a fresh model has
all gammas equal to 1, on which Torch-Pruning's global BN-scale threshold prunes nothing at all.
Building, copying and measuring are never timed. After the last repeat, parameters and MACs
(``prunefx.metrics.measure``) of each tool's pruned model are recorded and a forward pass is checked.
A run longer than ``--timeout`` seconds is interrupted (SIGALRM) and recorded as "timeout"; an exception as
"error: <type>". Torch-Pruning is optional (``pip install torch-pruning``); without it its columns say
"not installed".

Writes ``<out>/prune_speed.csv`` and ``<out>/prune_speed.md`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.metadata
import math
import os
import signal
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torchvision
from torch import nn

import prunefx
from experiments import _table as table
from prunefx.metrics import measure

DEFAULT_MODELS = [
    "resnet18", "resnet50", "mobilenet_v2", "densenet121", "efficientnet_b0", "convnext_tiny", "vit_b_16",
    "regnet_x_400mf",
]  # fmt: skip
QUICK_MODELS = ["resnet18", "mobilenet_v2"]
RATIO = 0.5
MAX_RATIO = 0.9  # prunefx PlanConfig's default max_ratio; Torch-Pruning gets the same cap
SEED = 0
PFX_STAGES = ("analyze", "score_plan", "apply")
TP_STAGES = ("init", "step")
CSV_FIELDS = [
    "model", "input", "params_m", "gmacs",
    "pfx_status", "pfx_analyze_s", "pfx_score_plan_s", "pfx_apply_s", "pfx_spa_s", "pfx_total_s",
    "pfx_prunable_groups", "pfx_pruned_groups", "pfx_l2_fallback_groups", "pfx_params_m", "pfx_gmacs", "pfx_forward",
    "tp_status", "tp_importance", "tp_init_s", "tp_step_s", "tp_total_s", "tp_params_m", "tp_gmacs", "tp_forward",
    "tp_step_over_pfx_spa", "tp_total_over_pfx_total", "errors",
]  # fmt: skip


class RunTimeout(BaseException):
    """A timed run exceeded its deadline (a BaseException, so a tool's ``except Exception`` cannot swallow it)."""


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise RunTimeout in the main thread if the block runs longer than ``seconds``."""

    def _fire(signum: int, frame: Any) -> None:
        raise RunTimeout

    previous = signal.signal(signal.SIGALRM, _fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load_tp() -> ModuleType | None:
    """torch_pruning if it is importable, else None."""
    try:
        import torch_pruning
    except ImportError:
        return None
    return torch_pruning


# ---- the two pipelines ------------------------------------------------------------------------------------------
def run_prunefx(model: nn.Module, x: torch.Tensor) -> tuple[dict[str, float], dict[str, Any]]:
    """Prune ``model`` in place with prunefx; stage times and what the plan did."""
    t0 = time.perf_counter()
    dg = prunefx.analyze(model, x)
    t1 = time.perf_counter()
    scores = prunefx.score(model, dg, "bn_scale")
    plan = prunefx.make_plan(dg, scores.values, prunefx.PlanConfig(ratio=RATIO, scope="global", max_ratio=MAX_RATIO))
    t2 = time.perf_counter()
    prunefx.apply_plan(model, dg, plan)
    t3 = time.perf_counter()
    info = {
        "pfx_prunable_groups": len(dg.prunable),
        "pfx_pruned_groups": len(plan.pruned),
        "pfx_l2_fallback_groups": sum(u.startswith("l2") for u in scores.used.values()),
    }
    return {"analyze": t1 - t0, "score_plan": t2 - t1, "apply": t3 - t2}, info


def classifier(model: nn.Module) -> nn.Linear:
    """The final classifier of a torchvision classification model: its last nn.Linear."""
    return [m for m in model.modules() if isinstance(m, nn.Linear)][-1]


def tp_importance_name(model: nn.Module) -> str:
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    return "BNScaleImportance" if has_bn else "GroupMagnitudeImportance(p=2)"


def run_tp(tp: ModuleType, model: nn.Module, x: torch.Tensor) -> tuple[dict[str, float], dict[str, Any]]:
    """Prune ``model`` in place with Torch-Pruning's MetaPruner; stage times."""
    name = tp_importance_name(model)
    if name == "BNScaleImportance":
        importance = tp.importance.BNScaleImportance()
    else:
        importance = tp.importance.GroupMagnitudeImportance(p=2)
    vit = isinstance(model, torchvision.models.VisionTransformer)
    # Torch-Pruning's torchvision example rounds ViT widths to the head count so attention still splits evenly.
    round_to = model.encoder.layers[0].num_heads if vit else None
    t0 = time.perf_counter()
    pruner = tp.pruner.MetaPruner(
        model, x, importance=importance, pruning_ratio=RATIO, global_pruning=True, max_pruning_ratio=MAX_RATIO,
        ignored_layers=[classifier(model)], round_to=round_to,
    )  # fmt: skip
    t1 = time.perf_counter()
    pruner.step()
    t2 = time.perf_counter()
    if vit:  # torchvision's ViT reshapes with self.hidden_dim, which Torch-Pruning does not update
        model.hidden_dim = model.conv_proj.out_channels
    return {"init": t1 - t0, "step": t2 - t1}, {"tp_importance": name}


# ---- measuring ---------------------------------------------------------------------------------------------------
def build(name: str) -> tuple[nn.Module, torch.Tensor]:
    """A seeded torchvision model in eval mode with random BatchNorm gammas, and its input."""
    torch.manual_seed(SEED)
    model = torchvision.models.get_model(name, weights=None).eval()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for m in model.modules():
            # all-equal gammas (fresh init) make bn_scale a pure tie-break; spread them as training would
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.weight is not None:
                m.weight.uniform_(0.1, 1.0, generator=g)
    size = 299 if name == "inception_v3" else 224
    return model, torch.randn(1, 3, size, size, generator=g)


def footprint(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Params (M), GMACs and whether a forward still gives one row of logits (GMACs None if it does not run)."""
    params = sum(p.numel() for p in model.parameters()) / 1e6
    try:
        with torch.no_grad():
            out = model.eval()(x)
        forward = "ok" if tuple(out.shape) == (1, classifier(model).out_features) else f"shape {tuple(out.shape)}"
        gmacs = measure(model, x).macs / 1e9
    except Exception as exc:  # noqa: BLE001 - a broken pruned model is a result, not a crash
        return {"params_m": params, "gmacs": None, "forward": f"error: {type(exc).__name__}"}
    return {"params_m": params, "gmacs": gmacs, "forward": forward}


def bench_model(
    name: str, repeats: int, timeout: float, tp: ModuleType | None, log: Callable[[str], None]
) -> dict[str, Any]:
    """Time both tools on ``name`` and return one result row."""
    base, x = build(name)
    row: dict[str, Any] = {"model": name, "input": "x".join(map(str, x.shape))}
    fp = footprint(base, x)
    row.update(params_m=fp["params_m"], gmacs=fp["gmacs"])
    tools: dict[str, tuple[Callable, tuple[str, ...]]] = {"pfx": (run_prunefx, PFX_STAGES)}
    if tp is not None:
        tools["tp"] = (lambda model, inp: run_tp(tp, model, inp), TP_STAGES)
    else:
        row["tp_status"] = "not installed"
    times: dict[str, list[dict[str, float]]] = {k: [] for k in tools}
    status = {k: "ok" for k in tools}
    pruned: dict[str, nn.Module] = {}
    errors = []
    for r in range(repeats):
        for key in list(tools) if r % 2 == 0 else list(tools)[::-1]:
            if status[key] != "ok":
                continue
            fn, _ = tools[key]
            model = copy.deepcopy(base)
            gc.collect()
            try:
                with warnings.catch_warnings(), deadline(timeout):
                    warnings.simplefilter("ignore")
                    stage_times, info = fn(model, x)
            except RunTimeout:
                status[key] = "timeout"
                continue
            except Exception as exc:  # noqa: BLE001 - any failure of a tool is a result
                status[key] = f"error: {type(exc).__name__}"
                errors.append(f"{key}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")
                log(traceback.format_exc(limit=-3))
                continue
            times[key].append(stage_times)
            row.update(info)
            pruned[key] = model
    for key, (_, stages) in tools.items():
        row[f"{key}_status"] = status[key]
        if status[key] != "ok":
            continue
        for stage in stages:
            row[f"{key}_{stage}_s"] = table.median([t[stage] for t in times[key]])
        # totals are medians of per-repeat sums, not sums of medians
        row[f"{key}_total_s"] = table.median([sum(t.values()) for t in times[key]])
        if key == "pfx":
            row["pfx_spa_s"] = table.median([t["score_plan"] + t["apply"] for t in times[key]])
        fp = footprint(pruned[key], x)
        row.update({f"{key}_{k}": v for k, v in fp.items()})
    for ratio, (num, den) in {"tp_step_over_pfx_spa": ("tp_step_s", "pfx_spa_s"),
                              "tp_total_over_pfx_total": ("tp_total_s", "pfx_total_s")}.items():  # fmt: skip
        a, b = row.get(num), row.get(den)
        row[ratio] = a / b if a and b else None
    row["errors"] = "; ".join(errors)
    return row


def warm_up(tp: ModuleType | None) -> None:
    """Run both pipelines once on a tiny model so first-call costs (lazy imports, caches) are not timed."""
    torch.manual_seed(SEED)
    tiny = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    ).eval()  # fmt: skip
    x = torch.randn(1, 3, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_prunefx(copy.deepcopy(tiny), x)
        footprint(tiny, x)
        if tp is not None:
            run_tp(tp, copy.deepcopy(tiny), x)


# ---- reporting ------------------------------------------------------------------------------------------------------
def tp_version(tp: ModuleType | None) -> str:
    if tp is None:
        return "not installed"
    dist = importlib.metadata.version("torch-pruning")
    attr = getattr(tp, "__version__", dist)
    return dist if attr == dist else f"{dist} (torch_pruning.__version__ says {attr})"


def machine_info(threads: int, repeats: int, timeout: float, tp: ModuleType | None) -> dict[str, str]:
    return table.machine_info(threads, **{
        "torch-pruning": tp_version(tp),
        "repeats": f"{repeats} per model and tool, each on a fresh model copy; statistic: median",
        "timeout": f"{timeout:g} s per run",
        "target": f"ratio {RATIO} of channels, global ranking, at most {MAX_RATIO} of any group",
    })


def _s(row: dict[str, Any], key: str, tool: str) -> str:
    """A time in seconds, or the tool's status where it did not run."""
    v = row.get(key)
    return f"{v:.3f}" if v is not None else str(row.get(f"{tool}_status") or "-")


def _num(row: dict[str, Any], key: str, fmt: str = ".2f") -> str:
    v = row.get(key)
    return format(v, fmt) if v is not None else "-"


def _ratio(row: dict[str, Any], key: str) -> str:
    v = row.get(key)
    return f"{v:.1f}x" if v is not None else "-"


def table_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells shared by the printed table and the Markdown file."""
    header = ["model", "params M", "GMACs", "pfx analyze", "pfx score+plan", "pfx apply", "pfx s+p+a", "pfx total",
              "TP init", "TP step", "TP total", "TP step / pfx s+p+a", "TP total / pfx total",
              "params M pfx / TP", "GMACs pfx / TP"]  # fmt: skip
    cells = []
    for r in rows:
        cells.append([
            r["model"], _num(r, "params_m"), _num(r, "gmacs"),
            _s(r, "pfx_analyze_s", "pfx"), _s(r, "pfx_score_plan_s", "pfx"), _s(r, "pfx_apply_s", "pfx"),
            _s(r, "pfx_spa_s", "pfx"), _s(r, "pfx_total_s", "pfx"),
            _s(r, "tp_init_s", "tp"), _s(r, "tp_step_s", "tp"), _s(r, "tp_total_s", "tp"),
            _ratio(r, "tp_step_over_pfx_spa"), _ratio(r, "tp_total_over_pfx_total"),
            f"{_num(r, 'pfx_params_m')} / {_num(r, 'tp_params_m')}", f"{_num(r, 'pfx_gmacs')} / {_num(r, 'tp_gmacs')}",
        ])  # fmt: skip
    return header, cells


def summary(rows: list[dict[str, Any]]) -> list[str]:
    """A few lines: ratio statistics, failures, and pruned models that no longer run."""
    lines = []
    for key, label in (("tp_step_over_pfx_spa", "TP step / prunefx score+plan+apply"),
                       ("tp_total_over_pfx_total", "TP init+step / prunefx analyze+score+plan+apply")):  # fmt: skip
        ratios = [r[key] for r in rows if r.get(key)]
        if ratios:
            gm = math.exp(statistics.fmean(math.log(v) for v in ratios))
            lines.append(f"{label} on {len(ratios)} models: geometric mean {gm:.2f}x, "
                         f"range {min(ratios):.2f}x - {max(ratios):.2f}x")  # fmt: skip
    for tool, label in (("pfx", "prunefx"), ("tp", "Torch-Pruning")):
        bad = [
            f"{r['model']} ({r[f'{tool}_status']})"
            for r in rows
            if r.get(f"{tool}_status") not in ("ok", "not installed")
        ]
        broken = [f"{r['model']} ({r[f'{tool}_forward']})" for r in rows if r.get(f"{tool}_forward", "ok") != "ok"]
        if bad:
            lines.append(f"{label} failed on: " + ", ".join(bad))
        if broken:
            lines.append(f"{label}'s pruned model does not run: " + ", ".join(broken))
    if any(r.get("tp_status") == "not installed" for r in rows):
        lines.append("Torch-Pruning is not installed: only prunefx was timed (pip install torch-pruning)")
    return lines


NOTE = (
    "What is compared: prunefx's `analyze` (trace + shapes + channel groups), `score(bn_scale)` + `make_plan"
    "(ratio=0.5, global)`, `apply_plan`, against Torch-Pruning's `MetaPruner(...)` constructor (which builds its "
    "DependencyGraph with a real forward pass) and `pruner.step()` (importance, global threshold, pruning), same "
    "CPU model, same input, same 50% target and 90% per-group cap, classifier outputs kept. Both get fresh copies "
    "of one model whose BatchNorm gammas were drawn from U(0.1, 1) so that bn_scale ranks channels rather than "
    "ties. The two targets are not the same measure: prunefx removes 50% of the channels of the groups it can "
    "prune (ViT's embedding width is not prunable: its forward hard-codes it; ConvNeXt's "
    "LayerNorm2d widths are skipped because the forward hard-codes them, unless graph_rewrite), Torch-Pruning "
    "removes 50% of the channels of the groups it scores (BNScaleImportance scores only groups containing a "
    "BatchNorm; it prunes ViT's embedding width and ConvNeXt's LayerNorms). Compare the params/GMACs columns "
    "before comparing times. Nothing was done with the pruned models beyond one forward pass (no fine-tuning, "
    "no accuracy). Times are wall-clock seconds (time.perf_counter), median of the repeats; 'total' columns are "
    "medians of per-repeat sums. Ratios above 1 mean prunefx was faster. The machine may be shared with other "
    "jobs: a load average above the CPU count (both listed above) means they competed for the cores, which "
    "inflates the times and their spread between repeats; the ratios, taken within one process with the tools "
    "interleaved, are the more stable numbers."
)


def write_md(rows: list[dict[str, Any]], info: dict[str, str], path: Path) -> None:
    header, cells = table_rows(rows)
    out = ["# Pruning time: prunefx vs Torch-Pruning", ""]
    out += [f"- {k}: {v}" for k, v in info.items()]
    out += ["", NOTE, ""]
    out.append("| " + " | ".join(header) + " |")
    out.append("|---|" + "---:|" * (len(header) - 1))
    out += ["| " + " | ".join(c) + " |" for c in cells]
    out += ["", "## Summary", ""] + [f"- {line}" for line in summary(rows)]
    errors = [f"- {r['model']}: {r['errors']}" for r in rows if r.get("errors")]
    if errors:
        out += ["", "## Errors", ""] + errors
    path.write_text("\n".join(out) + "\n")


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    header, cells = table_rows(rows)
    t = Table(title="pruning time (median, s)")
    for col in header:
        t.add_column(col, justify="left" if col == "model" else "right")
    for c in cells:
        t.add_row(*c)
    console = Console(width=220)
    console.print(t)
    for line in summary(rows):
        console.print(line)


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help=f"smoke test: {', '.join(QUICK_MODELS)}, 1 repeat")
    ap.add_argument("--models", help=f"comma-separated torchvision model names (default: {','.join(DEFAULT_MODELS)})")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per model and tool; the median is reported")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one run of one tool may take")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--out", type=Path, default=table.RESULTS, help="output directory")
    args = ap.parse_args(argv)

    models = args.models.split(",") if args.models else QUICK_MODELS if args.quick else DEFAULT_MODELS
    repeats = 1 if args.quick else args.repeats
    torch.set_num_threads(args.threads)
    tp = load_tp()
    info = machine_info(args.threads, repeats, args.timeout, tp)
    warm_up(tp)
    t0 = time.perf_counter()
    rows = []
    for name in models:
        row = bench_model(name, repeats, args.timeout, tp, log=lambda s: print(s, file=sys.stderr))
        rows.append(row)
        print(
            f"{name:18s} prunefx s+p+a {_s(row, 'pfx_spa_s', 'pfx')}  TP step {_s(row, 'tp_step_s', 'tp')}", flush=True
        )
    info["load average at end (1/5/15 min)"] = " ".join(f"{v:.1f}" for v in os.getloadavg())
    info["wall time"] = f"{time.perf_counter() - t0:.0f} s"
    args.out.mkdir(parents=True, exist_ok=True)
    table.write_csv(rows, args.out / "prune_speed.csv", CSV_FIELDS, digits=4)
    write_md(rows, info, args.out / "prune_speed.md")
    print_table(rows)
    print(f"wrote {args.out / 'prune_speed.csv'} and {args.out / 'prune_speed.md'}")
    return args.out / "prune_speed.md"


if __name__ == "__main__":
    main()
