"""Plans on trained models: top-1 right after the cut and after one short fine-tune, 2x / 4x fewer MACs, 3 seeds.

    python -m experiments.trained_plans [--quick] [--models resnet mobilenet vit] [--out experiments/results]
    python -m experiments.trained_plans --combine trained_plans_resnet_vit.csv trained_plans_mobilenet.csv

Three reference models (a ResNet-style CNN with residual adds, a MobileNetV2-style CNN with depthwise inverted
residuals and a small ViT with nn.MultiheadAttention) are trained here on scikit-learn's digits (16x16, 80/20
split by seed) to a plateau (40 epochs, cosine; SGD for the CNNs, AdamW for the ViT; train loss flat over the last
epochs) and cached under ``.cache/experiments/trained_plans/`` keyed by model, seed, epochs and ``VERSION``. Each
is cut to keep 1/2 and 1/4 of its MACs by prunefx (bn_scale scores, l2 where a group has no BatchNorm: raw global
threshold, per-group normalised global, local uniform, measured sensitivity; each with no recovery and with the
least-squares re-fit, whose sensitivity curves are then measured with the re-fit in the loop; raw and sensitivity
also with BatchNorm recalibration on the calibration batches where the model has BatchNorm) and by Torch-Pruning
1.6.1 when it is importable (BNScalePruner where there is BatchNorm, and MagnitudePruner, global with its mean
normalisation and local, the pruning ratio bisected to the same MACs). Kept MACs are counted independently
(torch.utils.flop_counter, nn.MultiheadAttention on its reference path). Every cut is evaluated on the held-out
split before any training and after the same 3-epoch fine-tune; the control is prunefx's raw-global architecture
re-initialised and trained from scratch with the baseline's recipe. ``--models`` runs some of the models (written
as ``trained_plans_<models>``, so two processes can share the work); ``--combine`` writes ``trained_plans.csv`` /
``.md`` from such CSVs, each run's machine line read from the ``.md`` beside its CSV, running nothing.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import prunefx
from experiments import _table as table
from prunefx.train.bn_recalibration import recalibrate_bn

VERSION = 1  # bump when a model, the data or the recipe changes: cached weights are keyed by it
CACHE = table.ROOT / ".cache" / "experiments" / "trained_plans"
TARGETS = {"2x": 0.5, "4x": 0.25}
CALIBRATION = 8  # batches of 32 training images for sensitivity and re-fit
RECOVERY = ("none", "refit", "bn-recal")  # after the cut, before any training: none, least-squares re-fit, BN stats
FIELDS = ["model", "seed", "target", "method", "recovery", "macs_kept", "baseline", "cut", "finetuned", "seconds"]


def data(seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = F.interpolate(torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0, size=16, mode="bilinear")
    x = (x - x.mean()) / x.std()
    y = torch.tensor(d.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(x))
    return (x[perm[:cut]], y[perm[:cut]]), (x[perm[cut:]], y[perm[cut:]])


def _cbr(i: int, o: int, k: int = 3, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(i, o, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(o)]
    return nn.Sequential(*layers, nn.ReLU()) if act else nn.Sequential(*layers)


class Basic(nn.Module):
    """A ResNet basic block (projection shortcut when the shape changes)."""

    def __init__(self, i: int, o: int, stride: int) -> None:
        super().__init__()
        self.a, self.b = _cbr(i, o, stride=stride), _cbr(o, o, act=False)
        self.short = _cbr(i, o, 1, stride, act=False) if (i != o or stride != 1) else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b(self.a(x)) + self.short(x))


class Inverted(nn.Module):
    """A MobileNetV2 inverted residual: 1x1 expand, 3x3 depthwise, 1x1 project (residual when shapes match)."""

    def __init__(self, i: int, o: int, stride: int, expand: int = 4) -> None:
        super().__init__()
        h = i * expand
        self.body = nn.Sequential(_cbr(i, h, 1), _cbr(h, h, stride=stride, groups=h), _cbr(h, o, 1, act=False))
        self.residual = i == o and stride == 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class Net(nn.Module):
    def __init__(self, stem: int, blocks: list[nn.Module], width: int, head: int | None = None) -> None:
        super().__init__()
        self.stem, self.blocks = _cbr(1, stem), nn.Sequential(*blocks)
        self.neck = _cbr(width, head, 1) if head else nn.Identity()
        self.fc = nn.Linear(head or width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.neck(self.blocks(self.stem(x))).mean((2, 3)))


def resnet() -> Net:
    return Net(32, [Basic(32, 32, 1), Basic(32, 64, 2), Basic(64, 64, 1), Basic(64, 128, 2)], 128)


def mobilenet() -> Net:
    return Net(32, [Inverted(32, 32, 1), Inverted(32, 48, 2), Inverted(48, 48, 1), Inverted(48, 96, 2)], 96, 192)


class Encoder(nn.Module):
    """A pre-norm transformer block: multi-head self-attention and a GELU MLP, each with a residual."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A small vision transformer: 4x4 patches of the 16x16 digit (16 tokens), 4 blocks, mean-pooled tokens."""

    def __init__(self, dim: int = 64, depth: int = 4, heads: int = 4, hidden: int = 256) -> None:
        super().__init__()
        self.patch = nn.Conv2d(1, dim, 4, 4)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.02)
        self.blocks = nn.Sequential(*(Encoder(dim, heads, hidden) for _ in range(depth)))
        self.norm, self.fc = nn.LayerNorm(dim), nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.fc(self.norm(self.blocks(x)).mean(1))


MODELS = {"resnet": resnet, "mobilenet": mobilenet, "vit": ViT}
# The recipe per model: optimiser, learning rate of the baseline (and from-scratch) training, of the fine-tune.
# The CNNs train with SGD as ResNets do; a transformer trains with AdamW as ViTs do.
RECIPES = {"resnet": ("sgd", 0.05, 0.01), "mobilenet": ("sgd", 0.05, 0.01), "vit": ("adamw", 2e-3, 2e-4)}


def fit(model: nn.Module, train_set, epochs: int, lr: float, seed: int, optimizer: str = "sgd") -> list[float]:
    """SGD with momentum (or AdamW) and a cosine schedule; returns the mean train loss of each epoch."""
    x, y = train_set
    g = torch.Generator().manual_seed(seed)
    opt = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4) if optimizer == "sgd" else
           torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05))
    steps = epochs * math.ceil(len(x) / 64)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0))))
    losses = []
    for _ in range(epochs):
        model.train()
        total = 0.0
        for idx in torch.randperm(len(x), generator=g).split(64):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        losses.append(total / len(x))
    model.eval()
    return losses


def baseline(name: str, seed: int, epochs: int, train_set, cache: Path = CACHE) -> nn.Module:
    """The trained reference model, from the cache when it holds it."""
    path = cache / f"{name}-seed{seed}-epochs{epochs}-v{VERSION}.pt"
    torch.manual_seed(seed)
    model = MODELS[name]()
    if path.is_file():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    optimizer, lr, _ = RECIPES[name]
    losses = fit(model, train_set, epochs, lr, seed, optimizer)
    print(f"{name} seed {seed}: train loss {losses[0]:.3f} -> {losses[-1]:.4f} (last 5: "
          f"{', '.join(f'{v:.4f}' for v in losses[-5:])})", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model.eval()


@torch.no_grad()
def top1(model: nn.Module, test_set) -> float:
    x, y = test_set
    return (model.eval()(x).argmax(1) == y).float().mean().item()


def macs(model: nn.Module, x: torch.Tensor) -> float:
    # nn.MultiheadAttention's inference fast path is one fused op FlopCounterMode has no formula for (it would
    # count the ViT's attention as 0): the reference path's matmuls are counted instead.
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model.eval()(x)
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
    return counter.get_total_flops() / 2


def _prunefx(model: nn.Module, x: torch.Tensor, keep: float, method: str, recovery: str, calibration) -> nn.Module:
    """``model`` cut by prunefx (in place; the module to use is returned), then recovered as ``recovery`` says."""
    scope = {"raw": "global", "normalized": "global", "local": "local", "sensitivity": "sensitivity"}[method]
    # No ignore pattern: the classifier's outputs are the model's output (frozen by the analysis), and
    # ignore=("fc",) would also freeze the group fc reads (the last stage's width), which Torch-Pruning prunes.
    cfg = prunefx.PlanConfig(flops=keep, scope=scope, normalize="mean" if method == "normalized" else "none")
    refit = recovery == "refit"  # with scope="sensitivity", prune() then measures the curves re-fit included
    needs = refit or scope == "sensitivity"
    r = prunefx.prune(model, x, cfg, criterion="bn_scale", refit=refit, sensitivity_cache=None,
                      calibration=calibration if needs else None)
    assert r.verified is not None and r.verified.accepted, r.verified
    if recovery == "bn-recal":
        recalibrate_bn(r.model, calibration)
    return r.model


def _torch_pruning(model: nn.Module, x: torch.Tensor, keep: float, method: str) -> nn.Module:
    """Torch-Pruning's pruner with the pruning ratio bisected until the MACs kept match ``keep``."""
    import torch_pruning as tp

    kind, scope = method.split("_")[1:]
    full = macs(model, x)

    def cut(ratio: float) -> nn.Module:
        m = copy.deepcopy(model)
        imp = tp.importance.BNScaleImportance() if kind == "bn" else tp.importance.MagnitudeImportance(p=2)
        cls = tp.pruner.BNScalePruner if kind == "bn" else tp.pruner.MagnitudePruner
        # nn.MultiheadAttention needs embed_dim % num_heads == 0: Torch-Pruning keeps it with round_to (its way)
        heads = [mod.num_heads for mod in m.modules() if isinstance(mod, nn.MultiheadAttention)]
        cls(m, x, importance=imp, pruning_ratio=ratio, global_pruning=scope == "global", ignored_layers=[m.fc],
            max_pruning_ratio=0.9, round_to=max(heads) if heads else None).step()
        return m

    return bisect_cut(cut, lambda m: macs(m, x) / full, keep, steps=14)


def bisect_cut(cut: Callable[[float], nn.Module], kept: Callable[[nn.Module], float], keep: float,
               steps: int) -> nn.Module:
    """The cut whose kept fraction of the MACs comes closest to ``keep``, bisecting Torch-Pruning's ratio."""
    lo, hi, best = 0.0, 0.95, None
    for _ in range(steps):
        mid = (lo + hi) / 2
        m = cut(mid)
        fraction = kept(m)
        if best is None or abs(fraction - keep) < abs(best[0] - keep):
            best = (fraction, m)
        lo, hi = (mid, hi) if fraction > keep else (lo, mid)
    return best[1]


def _scratch(name: str, pruned: nn.Module, train_set, epochs: int, seed: int) -> nn.Module:
    """The pruned architecture, re-initialised and trained with the baseline's recipe."""
    m = copy.deepcopy(pruned)
    torch.manual_seed(seed + 1000)
    for mod in m.modules():
        if hasattr(mod, "reset_parameters") and mod is not m:
            mod.reset_parameters()
    optimizer, lr, _ = RECIPES[name]
    fit(m, train_set, epochs, lr, seed + 1000, optimizer)
    return m


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="1 model (resnet unless --models), 1 seed, 2x only, 3 epochs (smoke test)")
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    ap.add_argument("--cache", type=Path, default=CACHE, help="where trained baselines are kept")
    ap.add_argument("--no-train", action="store_true",
                    help="cuts only: no fine-tune (its column left empty) and no scratch control")
    ap.add_argument("--models", nargs="+", choices=tuple(MODELS), help="only these models (default: all)")
    ap.add_argument("--combine", nargs="+", type=Path, metavar="CSV",
                    help="write trained_plans.csv/.md from these runs' CSVs (run nothing)")
    args = ap.parse_args(argv)
    seeds, epochs, ft = ((0,), 3, 1) if args.quick else ((0, 1, 2), 40, 3)
    if args.combine:
        rows = [r for path in args.combine for r in table.read_csv(path)]
        seeds = tuple(sorted({r["seed"] for r in rows}))
        machines = [f"{_machine_line(path.with_suffix('.md'))} ({path.stem})" for path in args.combine]
        table.write_csv(rows, args.out / "trained_plans.csv", FIELDS, digits=4)
        return _markdown(rows, args, seeds, epochs, ft, "trained_plans", machines)
    names = tuple(args.models or (("resnet",) if args.quick else MODELS))
    targets = {"2x": 0.5} if args.quick else TARGETS
    ours = [(m, r) for m in ("raw", "normalized", "local", "sensitivity") for r in ("none", "refit")]
    ours += [("raw", "bn-recal"), ("sensitivity", "bn-recal")]
    if args.quick:
        ours = [("raw", "none"), ("normalized", "none"), ("sensitivity", "refit"), ("raw", "bn-recal")]
    theirs = ["tp_bn_global", "tp_bn_local", "tp_l2_global", "tp_l2_local"]
    if args.quick or importlib.util.find_spec("torch_pruning") is None:
        theirs = []
    torch.set_num_threads(1)
    rows = []
    for name in names:
        for seed in seeds:
            train_set, test_set = data(seed)
            base = baseline(name, seed, epochs, train_set, args.cache)
            x = train_set[0][:8]
            g = torch.Generator().manual_seed(seed)
            calibration = [train_set[0][i] for i in torch.randperm(len(train_set[0]), generator=g)[:32 * CALIBRATION]
                           .split(32)]
            full, base_top1 = macs(base, x[:1]), top1(base, test_set)
            for tname, keep in targets.items():
                cuts = {}
                # BatchNorm statistics and BN-scale pruners apply only where the model has BatchNorm.
                has_bn = any(isinstance(mod, nn.BatchNorm2d) for mod in base.modules())
                runs = [*ours, *((t, "none") for t in theirs)]
                runs = [(m, r) for m, r in runs if has_bn or (r != "bn-recal" and not m.startswith("tp_bn"))]
                for method, recovery in runs:
                    m = copy.deepcopy(base)
                    start = time.perf_counter()
                    if method.startswith("tp_"):
                        m = _torch_pruning(m, x, keep, method)
                    else:
                        m = _prunefx(m, x, keep, method, recovery, calibration)
                    seconds = time.perf_counter() - start
                    cut_top1 = top1(m, test_set)
                    cuts[(method, recovery)] = m
                    tuned = None if args.no_train else copy.deepcopy(m)
                    if tuned is not None:
                        fit(tuned, train_set, ft, RECIPES[name][2], seed, RECIPES[name][0])
                    rows.append({"model": name, "seed": seed, "target": tname, "method": method, "recovery": recovery,
                                 "macs_kept": macs(m, x[:1]) / full, "baseline": base_top1, "cut": cut_top1,
                                 "finetuned": None if tuned is None else top1(tuned, test_set), "seconds": seconds})
                    print(rows[-1], flush=True)
                if args.no_train:
                    continue
                scratch = _scratch(name, cuts[("raw", "none")], train_set, epochs, seed)
                rows.append({"model": name, "seed": seed, "target": tname, "method": "scratch", "recovery": "none",
                             "macs_kept": macs(scratch, x[:1]) / full, "baseline": base_top1, "cut": None,
                             "finetuned": top1(scratch, test_set), "seconds": None})
    stem = ("trained_plans_quick" if args.quick else "trained_plans" if set(names) == set(MODELS) else
            "trained_plans_" + "_".join(names))
    table.write_csv(rows, args.out / f"{stem}.csv", FIELDS, digits=4)
    return _markdown(rows, args, seeds, epochs, ft, stem, [describe_machine(table.machine_info(threads=1))])


def describe_machine(info: dict[str, str]) -> str:
    return "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items())


def _machine_line(md: Path) -> str:
    """The machine line a run wrote into its table, or a line saying it is missing."""
    lines = [line for line in md.read_text().splitlines() if line.startswith("Machine: ")] if md.is_file() else []
    return lines[0] if lines else f"Machine: not recorded ({md.name} missing)"


def cell(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return ""
    spread = f" ± {statistics.stdev(values):.1%}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.1%}{spread}"


def _markdown(rows: list[dict], args, seeds, epochs: int, ft: int, stem: str, machines: list[str]) -> Path:
    models = list(dict.fromkeys(r["model"] for r in rows))
    command = (" --quick" if args.quick else "") + (" --no-train" if args.no_train else "") + (
        f" --models {' '.join(args.models)}" if args.models else "")
    lines = [
        "# Plans on trained models: top-1 right after the cut and after a short fine-tune", "",
        f"Command: `python -m experiments.trained_plans{command}`"
        f"{' (one run per model, combined)' if args.combine else ''}; models {models}. Digits 16x16, 80/20 "
        f"split per seed, seeds {list(seeds)}; baselines trained {epochs} epochs (CNNs: SGD 0.05; ViT: AdamW "
        f"2e-3; cosine), fine-tune {ft} epochs (SGD 0.01; ViT: AdamW 2e-4; cosine); bn_scale scores (l2 where a "
        "group has no BatchNorm: every ViT group); mean ± stdev over seeds. Torch-Pruning 1.6.1's ratio "
        "bisected to the same MACs (counted by torch.utils.flop_counter, nn.MultiheadAttention on its reference "
        "path; Torch-Pruning keeps the ViT's widths a multiple of its 4 heads with round_to=4, which "
        "nn.MultiheadAttention needs); scratch: prunefx's raw-global "
        "architecture trained from scratch with the baseline's recipe. Recovery, before any training: refit = "
        "least-squares re-fit of the layers reading pruned channels (sensitivity curves then measured with it); "
        "bn-recal = BatchNorm running statistics re-estimated on the calibration batches "
        f"({CALIBRATION} x 32 training images, the same for sensitivity and re-fit). s: median seconds of the cut "
        "and its recovery." + (" --no-train: no fine-tune and no scratch control were run (that column is empty)."
                               if args.no_train else ""), "",
        *[line for m in machines for line in (m, "")],
        "| model | target | method | recovery | MACs kept | baseline | right after the cut | after fine-tune | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r["model"], r["target"], r["method"], r["recovery"]) for r in rows))
    for model, target, method, recovery in keys:
        sel = [r for r in rows
               if (r["model"], r["target"], r["method"], r["recovery"]) == (model, target, method, recovery)]
        secs = [r["seconds"] for r in sel if r["seconds"] is not None]
        lines.append(
            f"| {model} | {target} | {method} | {recovery} | "
            f"{statistics.mean(r['macs_kept'] for r in sel):.3f} | {cell([r['baseline'] for r in sel])} | "
            f"{cell([r['cut'] for r in sel])} | {cell([r['finetuned'] for r in sel])} | "
            f"{statistics.median(secs):.1f} |" if secs else
            f"| {model} | {target} | {method} | none | {statistics.mean(r['macs_kept'] for r in sel):.3f} | "
            f"{cell([r['baseline'] for r in sel])} | | {cell([r['finetuned'] for r in sel])} | |"
        )
    path = args.out / f"{stem}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


if __name__ == "__main__":
    main()
