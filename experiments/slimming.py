"""Network slimming (bn_scale) vs random / L1 / scratch / uniform controls and Torch-Pruning's BNScalePruner.

    python -m experiments.slimming [--quick] [--out experiments/results] [--threads 1]

A small BN CNN (``prunefx.zoo.bn_cnn`` at half width) is trained on prunefx's synthetic set (criteria
separate there) and on scikit-learn's digits (a sanity row set: it saturates), once plainly (the baseline) and
once per sparsity setting with the L1 penalty on from the first step for the same epochs (the original
network-slimming recipe; on a short budget a sparsity stage appended to a trained baseline cannot move the gammas
far enough), pruned to several MACs targets, and fine-tuned at a short and a full budget; every number is the
mean +- std over seeds. ``--jobs N`` trains N (dataset, seed) units in parallel processes.
Writes ``slimming.{md,csv,png}`` (``slimming_quick.*`` with ``--quick``) into ``--out``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import prunefx
from experiments import _table as table
from prunefx.data.classification import ClassificationData, DatasetSpec, load_dataset
from prunefx.metrics import measure
from prunefx.train import SparsityConfig, TrainConfig, evaluate, fit, fraction_below
from prunefx.zoo import bn_cnn

WIDTHS = (16, 32, 32, 64)  # half of bn_cnn's default: an epoch of the synthetic set takes seconds on one core
# The sparsity settings that get every target and every control. target0.5 was chosen before the first run;
# select0.5 was added after that run showed plain L1 at that strength shrinking the kept channels too.
MAINS = ("target0.5", "select0.5")
COLUMNS = ("dataset", "method", "sparsity", "target", "seed", "macs", "macs_kept", "params", "top1_pruned",
           "top1_short", "top1_full", "gammas_below_0.01", "seconds")


@dataclass(frozen=True)
class Grid:
    """What one run trains: sizes, epochs, sparsity settings and which methods run at which targets (x fewer MACs)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    n_train: int = 2500
    n_test: int = 1000
    baseline_epochs: int = 12  # also the sparsity-trained models' epochs: they are trained from scratch
    short_epochs: int = 1
    full_epochs: int = 4
    # (label, s, target, select) -> SparsityConfig; "s=0" is the baseline itself (no penalty)
    sparsity: tuple[tuple[str, float, float | None, float | None], ...] = (
        ("s=0", 0.0, None, None), ("s=1e-4", 1e-4, None, None), ("s=1e-3", 1e-3, None, None),
        ("s=1e-2", 1e-2, None, None), ("target0.5", 1e-3, 0.5, None), ("select0.5", 1e-3, 0.5, 0.5))
    targets: tuple[float, ...] = (1.5, 2.0, 3.0, 4.0)  # bn_scale and Torch-Pruning at the main sparsity
    control_targets: tuple[float, ...] = (2.0, 4.0)  # random, L1
    sweep_targets: tuple[float, ...] = (2.0,)  # bn_scale at the other sparsity settings
    scratch_targets: tuple[float, ...] = (2.0,)  # pruned-architecture-from-scratch and uniform-narrower

    @property
    def scratch_epochs(self) -> int:
        return self.baseline_epochs + self.full_epochs


# Sized for a 2-core machine (about 5 s per synthetic epoch on one thread): bn_scale and Torch-Pruning at four
# targets, random / L1 at 2x and 4x, the sparsity sweep and the from-scratch controls at 2x only.
FULL = {"synthetic": Grid(), "digits": Grid(baseline_epochs=10)}
QUICK = {
    name: Grid(
        seeds=(0,),
        n_train=256,
        n_test=128,
        baseline_epochs=1,
        full_epochs=1,
        sparsity=(("s=0", 0.0, None, None), ("select0.5", 1e-3, 0.5, 0.5)),
        targets=(2.0,),
        control_targets=(2.0,),
        sweep_targets=(2.0,),
        scratch_targets=(2.0,),
    )
    for name in ("synthetic", "digits")
}
BASE_LR, FT_LR = 0.05, 0.02


def load(name: str, grid: Grid) -> ClassificationData:
    """The dataset, drawn once (data seed 0) so that seeds vary only initialisation and training order."""
    if name == "digits":
        return load_dataset(DatasetSpec(name="digits", image_size=16, seed=0))
    return load_dataset(
        DatasetSpec(name="synthetic", n_train=grid.n_train, n_val=1, n_test=grid.n_test, seed=0, cache=None)
    )


def train(
    model: nn.Module,
    data: ClassificationData,
    epochs: int,
    lr: float,
    seed: int,
    sparsity: SparsityConfig | None = None,
) -> nn.Module:
    # No flip: mirroring turns a 45-degree stripe into a 135-degree one, i.e. changes the synthetic set's class.
    cfg = TrainConfig(epochs=epochs, batch=64, lr=lr, seed=seed, augment=("crop",))
    fit(model, data.train, cfg, sparsity=sparsity, log=lambda _m: None, progress=False)
    return model.eval()


def top1(model: nn.Module, data: ClassificationData) -> float:
    return evaluate(model, data.test).top1


def reinit(model: nn.Module, seed: int) -> nn.Module:
    """Fresh parameters (and BN statistics) in the same, possibly pruned, architecture."""
    torch.manual_seed(seed)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return model


def tp_bn_scale(model: nn.Module, x1: torch.Tensor, keep: float) -> nn.Module:
    """Torch-Pruning's BNScalePruner (global), pruning_ratio bisected until prunefx measures ``keep`` of the MACs."""
    import torch_pruning as tp

    base = measure(model, (x1,)).macs
    lo, hi, best = 0.0, 0.95, None
    for _ in range(14):  # the achieved MACs move in channel-sized steps; 14 halvings resolve them
        mid = (lo + hi) / 2
        m = copy.deepcopy(model)
        linears = [mod for mod in m.modules() if isinstance(mod, nn.Linear)]
        tp.pruner.BNScalePruner(
            m,
            x1,
            importance=tp.importance.BNScaleImportance(),
            global_pruning=True,
            pruning_ratio=mid,
            max_pruning_ratio=0.9,
            ignored_layers=linears,
        ).step()
        kept = measure(m, (x1,)).macs / base
        if best is None or abs(kept - keep) < abs(best[0] - keep):
            best = (kept, m)
        lo, hi = (mid, hi) if kept > keep else (lo, mid)
    return best[1]


def have_tp() -> bool:
    try:
        import torch_pruning  # noqa: F401
    except ImportError:
        return False
    return True


def planned(grid: Grid, label: str, s: float) -> list[tuple[str, str, float]]:
    """The (method, sparsity, target) rows one sparsity setting produces, in the order they are made."""
    main = label in MAINS
    keys = [] if s == 0 else [("sparse", label, 1.0)]
    for k in grid.targets if main else grid.sweep_targets:
        keys.append(("bn_scale", label, k))
        if main and k in grid.scratch_targets:
            keys.append(("scratch", label, k))
    if main:
        keys += [("tp_bn_scale", label, k) for k in grid.targets if have_tp()]
        keys += [(m, label, k) for m in ("random", "l1") for k in grid.control_targets]
    return keys


def run_dataset(
    name: str, grid: Grid, log: Callable[[str], None], have: frozenset[tuple[str, str, float]] = frozenset()
) -> list[dict[str, Any]]:
    """Every row of one dataset: baselines, sparse models, pruned + fine-tuned models and controls, per seed.

    ``have``: (method, sparsity, target) rows already measured (one seed): not made again, and a model that
    only they need is not trained.
    """
    data = load(name, grid)
    x, x1 = data.example(64), data.example(1)  # 64 real images: bias compensation measures channel means on them
    log(f"{name}: {data.summary()}")
    rows: list[dict[str, Any]] = []

    def row(method: str, sparsity: str, target: float, seed: int, model: nn.Module, t0: float, **values: Any) -> None:
        m = measure(model, (x1,))
        rows.append(
            {
                "dataset": name,
                "method": method,
                "sparsity": sparsity,
                "target": target,
                "seed": seed,
                "macs": m.macs,
                "macs_kept": m.macs / base_macs,
                "params": m.params,
                "top1_pruned": math.nan,
                "top1_short": math.nan,
                "top1_full": math.nan,
                "gammas_below_0.01": math.nan,
                "seconds": round(time.perf_counter() - t0, 1),
            }
            | values
        )
        r = rows[-1]
        log(
            f"  {name} seed {seed} {method:<9} {sparsity:<9} {target:g}x  MACs kept {r['macs_kept']:.3f}  top-1 "
            + "  ".join(
                f"{k[5:]} {r[k]:.4f}" for k in ("top1_pruned", "top1_short", "top1_full") if not math.isnan(r[k])
            )
        )

    def finetune(pruned: nn.Module, seed: int) -> tuple[float, float]:
        short = train(copy.deepcopy(pruned), data, grid.short_epochs, FT_LR, seed)
        full = train(pruned, data, grid.full_epochs, FT_LR, seed)
        return top1(short, data), top1(full, data)

    for seed in grid.seeds:
        t0 = time.perf_counter()
        torch.manual_seed(seed)
        fresh = bn_cnn(data.num_classes, data.channels, WIDTHS)
        base_macs = measure(fresh, (x1,)).macs
        todo = {label: [key for key in planned(grid, label, s) if key not in have] for label, s, *_ in grid.sparsity}
        baseline = None
        if ("baseline", "-", 1.0) not in have or any(todo[label] for label, s, *_ in grid.sparsity if s == 0):
            baseline = train(copy.deepcopy(fresh), data, grid.baseline_epochs, BASE_LR, seed)
            if ("baseline", "-", 1.0) not in have:
                row("baseline", "-", 1.0, seed, baseline, t0, top1_full=top1(baseline, data))
        for label, s, target, select in grid.sparsity:
            if not todo[label]:
                continue
            t0 = time.perf_counter()
            if s == 0:
                sparse = baseline
            else:  # from the same initialisation as the baseline, for the same epochs
                sparse = train(
                    copy.deepcopy(fresh),
                    data,
                    grid.baseline_epochs,
                    BASE_LR,
                    seed,
                    SparsityConfig(s=s, schedule="constant" if target is None else "target", target=target or 0.5,
                                   selective=select is not None),
                )
                if ("sparse", label, 1.0) in todo[label]:
                    row("sparse", label, 1.0, seed, sparse, t0, top1_full=top1(sparse, data))
            gammas = [m.weight for m in sparse.modules() if isinstance(m, nn.BatchNorm2d)]
            below = fraction_below(gammas, 1e-2)
            for method, _, k in planned(grid, label, s):  # the rows this setting makes, in their order
                if method in ("sparse", "scratch"):
                    continue  # sparse: made above; scratch re-initialises bn_scale's pruned architecture below
                keys = [(method, label, k)] + ([("scratch", label, k)] if method == "bn_scale" else [])
                wanted = [key for key in keys if key in todo[label]]
                if not wanted:  # measured already
                    continue
                t0 = time.perf_counter()
                if method == "tp_bn_scale":
                    pruned = tp_bn_scale(sparse, x1, 1 / k)
                else:
                    pruned = copy.deepcopy(sparse)
                    prunefx.prune(pruned, x, prunefx.PlanConfig(flops=1 / k), criterion=method, seed=seed)
                after = top1(pruned, data)
                arch = copy.deepcopy(pruned)
                if (method, label, k) in wanted:
                    short, full = finetune(pruned, seed)
                    row(
                        method,
                        label,
                        k,
                        seed,
                        pruned,
                        t0,
                        top1_pruned=after,
                        top1_short=short,
                        top1_full=full,
                        **{"gammas_below_0.01": below},
                    )
                if ("scratch", label, k) in wanted:
                    t0 = time.perf_counter()
                    scratch = train(reinit(arch, seed), data, grid.scratch_epochs, BASE_LR, seed)
                    row("scratch", label, k, seed, scratch, t0, top1_full=top1(scratch, data))
        for k in grid.scratch_targets:
            if ("uniform", "-", k) in have:
                continue
            t0 = time.perf_counter()
            uniform = copy.deepcopy(fresh)  # every prunable group loses the same fraction; weights are then reset
            prunefx.prune(uniform, x, prunefx.PlanConfig(flops=1 / k, scope="local"), criterion="l1", check=False)
            uniform = train(reinit(uniform, seed), data, grid.scratch_epochs, BASE_LR, seed)
            row("uniform", "-", k, seed, uniform, t0, top1_full=top1(uniform, data))
    return rows


# ---- rendering ------------------------------------------------------------------------------------------------


def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds per (dataset, method, sparsity, target), in first-seen order."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["method"], r["sparsity"], r["target"]), []).append(r)
    out = []
    for (ds, method, sp, k), rs in groups.items():
        agg = {
            "dataset": ds,
            "method": method,
            "sparsity": sp,
            "target": k,
            "n": len(rs),
            "macs_kept": statistics.fmean(r["macs_kept"] for r in rs),
            "macs": statistics.fmean(r["macs"] for r in rs),
        }
        for col in ("top1_pruned", "top1_short", "top1_full", "gammas_below_0.01"):
            vals = [r[col] for r in rs if not math.isnan(r[col])]
            agg[col] = (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else math.nan) if vals else None
        out.append(agg)
    return out


def pct(v: tuple[float, float] | None) -> str:
    if v is None:
        return "—"
    return f"{100 * v[0]:.1f}" + ("" if math.isnan(v[1]) else f" ± {100 * v[1]:.1f}")  # one seed: no std


NAMES = {
    "baseline": "baseline (unpruned)",
    "sparse": "sparsity-trained (unpruned)",
    "bn_scale": "prunefx bn_scale",
    "tp_bn_scale": "Torch-Pruning BNScalePruner",
    "random": "prunefx random channels",
    "l1": "prunefx l1",
    "scratch": "pruned arch. from scratch",
    "uniform": "uniformly narrower, scratch",
}


def summary(aggs: Sequence[dict[str, Any]], tp_ok: bool) -> list[str]:
    """Sentences computed from the means: where bn_scale (main sparsity) beats or trails each control."""
    lines = []
    for ds in dict.fromkeys(a["dataset"] for a in aggs):
        by = {(a["method"], a["sparsity"], a["target"]): a for a in aggs if a["dataset"] == ds}
        base = by[("baseline", "-", 1.0)]["top1_full"][0]
        gams = {
            main: next(
                (a["gammas_below_0.01"] for a in by.values() if a["sparsity"] == main and a["gammas_below_0.01"]), None
            )
            for main in MAINS
        }
        lines.append(
            f"- **{ds}**: baseline {100 * base:.1f}% top-1. BN gammas below 0.01 after sparsity training "
            "(both aim at 50%): " + ", ".join(f"{main} {100 * g[0]:.0f}%" for main, g in gams.items() if g) + "."
        )
        for (method, main, k), a in by.items():
            if method != "bn_scale" or main not in MAINS:
                continue
            ours = a["top1_full"][0]
            sparse = by.get(("sparse", main, 1.0))
            parts = [
                f"bn_scale ({main}) at {k:g}x fewer MACs: {100 * a['top1_pruned'][0]:.1f}% right after pruning"
                + (
                    ""
                    if sparse is None
                    else f" (the unpruned sparsity-trained model: {100 * sparse['top1_full'][0]:.1f}%)"
                )
                + f", {100 * ours:.1f}% after the full fine-tune ({100 * (ours - base):+.1f} points vs baseline)"
            ]
            for other, osp in (
                ("tp_bn_scale", main),
                ("random", main),
                ("l1", main),
                ("scratch", main),
                ("uniform", "-"),
            ):
                o = by.get((other, osp, k))
                if o is None:
                    continue
                for col, when in (("top1_full", "full"), ("top1_short", "short")):
                    if a[col] is None or o[col] is None:
                        continue
                    d = 100 * (a[col][0] - o[col][0])
                    std = max(a[col][1], o[col][1])
                    noise = "" if math.isnan(std) or abs(d) >= 100 * std else " (within one std)"
                    verdict = (
                        f"ties {NAMES[other]}"
                        if abs(d) < 0.05
                        else f"{'beats' if d > 0 else 'trails'} {NAMES[other]} by {abs(d):.1f} points"
                    )
                    parts.append(f"{verdict} ({when} fine-tune){noise}")
            lines.append("  - " + "; ".join(parts) + ".")
        sweep = [(sp, a) for (method, sp, k), a in by.items() if method == "bn_scale" and k == 2.0]
        if len(sweep) > 1:
            lines.append(
                "  - sparsity sweep, bn_scale at 2x (gammas < 0.01 / right after pruning / full fine-tune): "
                + "; ".join(
                    f"{sp}: {100 * a['gammas_below_0.01'][0]:.0f}% / "
                    f"{100 * a['top1_pruned'][0]:.1f}% / {100 * a['top1_full'][0]:.1f}%"
                    for sp, a in sweep
                )
                + "."
            )
    if not tp_ok:
        lines.append("- Torch-Pruning rows: skipped: torch-pruning not installed (pip install -e '.[experiments]').")
    return lines


def render(rows: list[dict[str, Any]], grids: dict[str, Grid], args: argparse.Namespace, stem: str) -> str:
    aggs = aggregate(rows)
    tp_ok = have_tp()
    tp_version = __import__("torch_pruning").__version__ if tp_ok else "not installed"
    cmd = (
        "python -m experiments.slimming"
        + (" --quick" if args.quick else "")
        + (f" --threads {args.threads}" if args.threads != 1 else "")
    )
    g = grids["synthetic"]
    seeds = {ds: sorted({r["seed"] for r in rows if r["dataset"] == ds}) for ds in grids}
    lines = [
        f"# Network slimming vs controls and Torch-Pruning ({stem})",
        "",
        f"Command: `{cmd}` ({sum(r['seconds'] for r in rows) / 60:.0f} min of training, pruning and evaluation). "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs "
        f"(shared with other jobs), {torch.get_num_threads()} torch thread(s), Python {platform.python_version()}, "
        f"torch {torch.__version__}, torch-pruning {tp_version}.",
        "",
        f"Setup: `bn_cnn(widths={WIDTHS})` (4 conv-BN-ReLU); seeds "
        + ", ".join(f"{ds} {s}" for ds, s in seeds.items())
        + " (seeds change the initialisation and training "
        "order, the data are fixed). "
        + " ".join(
            f"{ds}: {gr.baseline_epochs} baseline epochs (SGD lr {BASE_LR}, cosine, crop augmentation), "
            f"sparsity-trained models {gr.baseline_epochs} epochs from the same initialisation, "
            f"fine-tune {gr.short_epochs} "
            f"(short) / {gr.full_epochs} (full) epochs at lr {FT_LR}, scratch and uniform controls "
            f"{gr.scratch_epochs} epochs;"
            for ds, gr in grids.items()
        )
        + f" synthetic: {g.n_train} training / {g.n_test} test images (32 px); digits: 16 px, 70/15/15 split. "
        "Top-1 on the test split. At these budgets the baseline is not converged: pruned rows trained "
        f"{g.full_epochs} epochs more, so a gain over the baseline is partly extra training; "
        "the scratch and uniform controls (trained as long as a pruned row in all) are the fairer references.",
        "",
        "Sparsity (the penalty is on from the first step, as in the network-slimming paper): `s=0` prunes the "
        "baseline itself; "
        + ", ".join(f"`{label}`" for label, _s, t, _sel in g.sparsity if _s and t is None)
        + " add `BNSparsity(s)` at that fixed strength; "
        "`target0.5` uses `TargetSparsity(target=0.5)` (s adapted so half the gammas end below 0.01) on every "
        "gamma; `select0.5` the same schedule with `BNSparsity(select=0.5)`, which penalises only the half with "
        "the smallest |gamma| (re-chosen every step), so the kept channels are not shrunk. Every target and "
        "every control runs at both; controls and Torch-Pruning use the weights of the setting named in their "
        "row. prunefx rows: `prunefx.prune(PlanConfig(flops=1/k))` "
        "(global threshold; bn_scale with its default bias compensation, random/l1 without). Torch-Pruning: "
        "`BNScalePruner(global_pruning=True, max_pruning_ratio=0.9)` with `pruning_ratio` bisected (14 steps) "
        "until `prunefx.metrics.measure` gives the closest MACs to 1/k; every row reports the MACs measured "
        "the same way. Scratch: the bn_scale-pruned architecture re-initialised; uniform: every group pruned by "
        'the same fraction (`scope="local"`), re-initialised; both trained baseline + full fine-tune epochs.',
        "",
        "| dataset | method | sparsity | target | seeds | MACs kept | top-1 pruned | top-1 short FT "
        "| top-1 full FT | gammas < 0.01 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in aggs:
        gam = "—" if a["gammas_below_0.01"] is None else f"{100 * a['gammas_below_0.01'][0]:.0f}%"
        lines.append(
            f"| {a['dataset']} | {NAMES[a['method']]} | {a['sparsity']} | {a['target']:g}x | {a['n']} | "
            f"{a['macs_kept']:.3f} | {pct(a['top1_pruned'])} | {pct(a['top1_short'])} | "
            f"{pct(a['top1_full'])} | {gam} |"
        )
    if not tp_ok:
        lines.append(
            "| all | Torch-Pruning BNScalePruner | — | — | — | — | skipped: torch-pruning not installed | — | — | — |"
        )
    lines += [
        "",
        "Top-1 in %, mean ± std over seeds (no std with one seed); MACs kept: measured MACs / the unpruned "
        "model's (batch 1). Raw per-seed rows: `" + f"{stem}.csv`; plot: `{stem}.png`.",
        "",
        "## Summary",
        "",
        *summary(aggs, tp_ok),
        "",
    ]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aggs = aggregate(rows)
    datasets = list(dict.fromkeys(a["dataset"] for a in aggs))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 6), squeeze=False)
    for ax, ds in zip(axes[0], datasets, strict=True):
        mine = [a for a in aggs if a["dataset"] == ds]
        base = next(a for a in mine if a["method"] == "baseline")
        ax.axhline(100 * base["top1_full"][0], color="grey", ls="--", lw=1, label="baseline")
        colours = dict(zip(NAMES, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
        # the settings' lines: dashed, solid; uniform
        for sp, style in (*zip(MAINS, ("--", "-"), strict=False), ("-", "-")):
            for method in ("bn_scale", "tp_bn_scale", "random", "l1", "scratch", "uniform"):
                pts = sorted(
                    (a for a in mine if a["method"] == method and a["sparsity"] == sp), key=lambda a: a["macs_kept"]
                )
                if pts:
                    ax.errorbar(
                        [a["macs_kept"] for a in pts],
                        [100 * a["top1_full"][0] for a in pts],
                        yerr=[100 * np.nan_to_num(a["top1_full"][1]) for a in pts],
                        marker="o",
                        capsize=3,
                        ls=style,
                        color=colours[method],
                        label=NAMES[method] + ("" if sp == "-" else f" ({sp})"),
                    )
        ax.set(
            title=f"{ds}: top-1 after the full fine-tune", xlabel="MACs kept (fraction of baseline)", ylabel="top-1 (%)"
        )
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()  # one legend under the plots: none hides a point
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> Path:
    """Run the grid, write ``<out>/slimming{,_quick}.{md,csv,png}``; returns the md path.

    >>> main(["--quick", "--out", "/tmp/slim"])   # PosixPath('/tmp/slim/slimming_quick.md')
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed, one target, 1-epoch stages, few images (CI)")
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    ap.add_argument("--render", action="store_true", help="only re-render the md and png from the csv in --out")
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in the csv and make only the missing ones (e.g. after a new setting)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per process (1: one thread trains these small convs fastest per core)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="(dataset, seed) units trained in parallel processes")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    grids, stem = (QUICK, "slimming_quick") if args.quick else (FULL, "slimming")
    path = args.out / f"{stem}.csv"
    rows = table.read_csv(path) if (args.render or args.resume) and path.is_file() else []
    if not args.render:
        args.out.mkdir(parents=True, exist_ok=True)
        have: dict[tuple[str, int], set[tuple[str, str, float]]] = {}
        for r in rows:
            have.setdefault((r["dataset"], r["seed"]), set()).add((r["method"], r["sparsity"], float(r["target"])))
        # Seeds outermost and the files rewritten after each (seed, dataset): a stopped run leaves a table of
        # the seeds it finished (the md says which), and --resume makes only the rows still missing.
        todo = [
            (name, seed)
            for seed in sorted({s for g in grids.values() for s in g.seeds})
            for name, grid in grids.items()
            if seed in grid.seeds and not unit_rows(grid) <= have.get((name, seed), set())
        ]
        if args.jobs > 1:
            todo.sort(key=lambda u: list(grids).index(u[0]))  # the long dataset first: the pool ends together
            ctx = multiprocessing.get_context("spawn")  # a fresh interpreter per worker: no forked torch threads
            with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
                futures = [
                    pool.submit(_unit, name, grids[name], seed, args.threads, frozenset(have.get((name, seed), ())))
                    for name, seed in todo
                ]
                for f in concurrent.futures.as_completed(futures):
                    rows += f.result()
                    write(rows, grids, args, stem)
        else:
            for name, seed in todo:
                rows += _unit(name, grids[name], seed, args.threads, frozenset(have.get((name, seed), ())))
                write(rows, grids, args, stem)
    return write(rows, grids, args, stem)


def unit_rows(grid: Grid) -> set[tuple[str, str, float]]:
    """Every (method, sparsity, target) row one (dataset, seed) of ``grid`` makes."""
    keys = {("baseline", "-", 1.0)} | {("uniform", "-", k) for k in grid.scratch_targets}
    return keys | {key for label, s, *_ in grid.sparsity for key in planned(grid, label, s)}


def _unit(
    name: str, grid: Grid, seed: int, threads: int, have: frozenset[tuple[str, str, float]] = frozenset()
) -> list[dict[str, Any]]:
    """One (dataset, seed): the rows of it not in ``have`` (runs in a worker process with ``--jobs``)."""
    torch.set_num_threads(threads)
    return run_dataset(name, replace(grid, seeds=(seed,)), lambda m: print(m, flush=True), have)


def write(rows: list[dict[str, Any]], grids: dict[str, Grid], args: argparse.Namespace, stem: str) -> Path:
    order = list(grids)
    methods = ("baseline", "sparse", "bn_scale", "scratch", "tp_bn_scale", "random", "l1", "uniform")

    def place(r: dict[str, Any]) -> tuple:  # a resumed run appends rows; the table keeps one order regardless
        labels = ["-", *(label for label, *_ in grids[r["dataset"]].sparsity)]
        return (
            order.index(r["dataset"]),
            r["seed"],
            r["method"] == "uniform",
            labels.index(r["sparsity"]),
            methods.index(r["method"]),
            float(r["target"]),
        )

    rows.sort(key=place)
    if not args.render:
        table.write_csv(rows, args.out / f"{stem}.csv", COLUMNS)
    plot(rows, args.out / f"{stem}.png")
    md = args.out / f"{stem}.md"
    md.write_text(render(rows, grids, args, stem))
    print(f"wrote {md}")
    return md


if __name__ == "__main__":
    main(sys.argv[1:])
