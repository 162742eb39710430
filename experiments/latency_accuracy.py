"""At equal measured latency, is a latency-targeted plan at least as accurate as a FLOPs-targeted one? (issue 17)

    python -m experiments.latency_accuracy            # 3 seeds x targets 0.5 / 0.35, ~40 min on 2 idle cores
    python -m experiments.latency_accuracy --quick    # smoke test (tiny data, 1 seed, 1 target)

Per seed, the worth_it classification protocol in one process: ``prunefx.zoo:bn_cnn_synthetic`` trained on the
synthetic set, then selective target sparsity (layer_cap 0.5), giving one sparse model whose BatchNorm gammas are
the importance of every plan below (bn_scale, global). For each latency target t, on one deployment (torch eager
CPU, BatchNorm folded, ``--threads``, batch ``--batch``):

- **latency**: ``prunefx.prune(PlanConfig(latency=t))``: latency table, planner, measured and re-planned;
- **flops, round_to r** (r = 1, the default, and 8): the FLOPs fraction searched (at most ``--search`` plans) so
  that the plan's measured latency equals the latency plan's within 3%; the closest plan is kept.

The three pruned models and the sparse model are then timed together in alternating rounds (the latencies the
table reports), each is fine-tuned with the same recipe and seed, and top-1 is measured on the test split before
and after fine-tuning. The question (issue 17): at equal measured latency, is the latency plan's accuracy at least
the FLOPs plan's?
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from experiments._table import RESULTS, machine_info, md_table, read_csv, write_csv

FIELDS = ["seed", "target", "plan", "flops_asked", "macs_ratio", "measured", "latency_ms", "base_ms", "search",
          "pruned_top1", "finetuned_top1", "baseline_top1", "sparse_top1", "noise", "load"]
TOLERANCE = 0.03  # equal latency: within 3% of the latency plan's measured fraction


@dataclass(frozen=True)
class Sizes:
    seeds: tuple[int, ...]
    targets: tuple[float, ...]
    epochs: int
    sparsity: int
    finetune: int
    data: dict[str, int]


FULL = Sizes((0, 1, 2), (0.5, 0.35), 20, 6, 6, {"n_train": 3000, "n_val": 500, "n_test": 2000})
QUICK = Sizes((0,), (0.5,), 1, 1, 1, {"n_train": 256, "n_val": 64, "n_test": 128})


def _quiet(_: str) -> None:
    return None


def _fraction(lat: dict[str, Any], name: str) -> float:
    return lat[name].median_ms / lat["base"].median_ms


def _search(sparse, x, dep, goal: float, start: float, round_to: int, tries: int) -> tuple[Any, float, float, int]:
    """The FLOPs plan whose measured latency fraction is closest to ``goal``: (model, flops asked, measured, plans)."""
    import prunefx
    from prunefx.metrics import compare_latency

    seen: list[tuple[float, float, Any]] = []
    f = start
    for _ in range(tries):
        model = copy.deepcopy(sparse)
        prunefx.prune(model, x, prunefx.PlanConfig(flops=f, round_to=round_to))
        measured = _fraction(compare_latency({"base": sparse, "pruned": model}, x, dep), "pruned")
        seen.append((f, measured, model))
        if abs(measured / goal - 1) <= TOLERANCE:
            break
        below = [s for s in seen if s[1] < goal]
        above = [s for s in seen if s[1] > goal]
        if below and above:  # interpolate between the closest plans on either side
            (f0, m0, _), (f1, m1, _) = max(below, key=lambda s: s[1]), min(above, key=lambda s: s[1])
            nxt = f0 + (goal - m0) * (f1 - f0) / (m1 - m0)
        else:  # latency roughly proportional to MACs near here
            nxt = f * goal / measured
        nxt = min(1.0, max(0.02, nxt))
        if any(abs(nxt - s[0]) < 1e-3 for s in seen):
            break
        f = nxt
    f, measured, model = min(seen, key=lambda s: abs(s[1] / goal - 1))
    return model, f, measured, len(seen)


def run_seed(seed: int, sizes: Sizes, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    import prunefx
    from prunefx.data.classification import DatasetSpec, load_dataset
    from prunefx.metrics import Deployment, compare_latency, measure
    from prunefx.train import SparsityConfig, TrainConfig, evaluate, fit
    from prunefx.zoo import bn_cnn_synthetic

    data = load_dataset(DatasetSpec(name="synthetic", image_size=32, **sizes.data))
    x = data.test[0][0].unsqueeze(0)
    dep = Deployment(backend="torch", threads=args.threads, batch=args.batch)
    torch.manual_seed(seed)
    model = bn_cnn_synthetic(num_classes=data.num_classes)
    recipe = TrainConfig(epochs=sizes.epochs, batch=128, lr=0.1, warmup_epochs=min(1, sizes.epochs), seed=seed)
    fit(model, data.train, recipe, val=data.val, log=_quiet, progress=False)
    top1 = lambda m: evaluate(m, data.test).top1  # noqa: E731
    baseline = top1(model)
    sparsity = SparsityConfig(s=1e-3, schedule="target", target=0.5, selective=True, layer_cap=0.5,
                              exclude_residual=True).resolved(model, (x,))
    fit(model, data.train, recipe.updated({"epochs": sizes.sparsity, "lr": 0.05}), sparsity=sparsity, log=_quiet,
        progress=False)
    sparse = model.eval()
    sparse_top1 = top1(sparse)
    base_macs = measure(sparse, x).macs
    rows = []
    for t in sizes.targets:
        lat_model = copy.deepcopy(sparse)
        result = prunefx.prune(lat_model, x, prunefx.PlanConfig(latency=t), deployment=dep, latency_cache=args.cache)
        out = result.latency
        goal = out.rounds[out.chosen].measured
        plans: dict[str, tuple[Any, float | None, int]] = {"latency": (lat_model, None, len(out.rounds))}
        start = measure(lat_model, x).macs / base_macs
        for r in (1, 8):
            m, f, _, n = _search(sparse, x, dep, goal, start, r, args.search)
            plans[f"flops, round_to {r}"] = (m, f, n)
        lat = compare_latency({"base": sparse, **{k: v[0] for k, v in plans.items()}}, x, dep, repeats=60, rounds=10)
        load = os.getloadavg()[0]
        for name, (m, f, n) in plans.items():
            pruned_top1 = top1(m)
            tuned = copy.deepcopy(m)
            fit(tuned, data.train, recipe.updated({"epochs": sizes.finetune, "lr": 0.02}), log=_quiet,
                progress=False)
            rows.append({
                "seed": seed, "target": t, "plan": name, "flops_asked": f, "macs_ratio": measure(m, x).macs / base_macs,
                "measured": _fraction(lat, name), "latency_ms": lat[name].median_ms, "base_ms": lat["base"].median_ms,
                "search": n, "pruned_top1": pruned_top1, "finetuned_top1": top1(tuned), "baseline_top1": baseline,
                "sparse_top1": sparse_top1, "noise": lat[name].noise or lat["base"].noise or "", "load": round(load, 2),
            })  # fmt: skip
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    return rows


def _ms(values: list[float], fmt: str = ".4f") -> str:
    if len(values) < 2:
        return format(values[0], fmt)
    return f"{statistics.mean(values):{fmt}} ± {statistics.stdev(values):{fmt.lstrip('+')}}"


def _col(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows]


def write_md(rows: list[dict[str, Any]], path: Path, info: dict[str, str], command: str, seconds: float) -> None:
    seeds = sorted({int(r["seed"]) for r in rows})
    lines = ["# Accuracy at equal measured latency: latency-targeted vs FLOPs-targeted plans (issue 17)", "",
             f"Command: `{command.strip()}` ({seconds / 60:.1f} min). Seeds {seeds}; mean ± standard deviation "
             "over seeds.", "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()) + ".", "",
             "Protocol: experiments/latency_accuracy.py docstring. Measured: each pruned model's latency over the "
             "sparse model's, all of them timed together in 10 alternating rounds (60 forwards each), batch and "
             "threads as above; top-1 on the synthetic test split, right after pruning and after the same "
             "fine-tune.", ""]
    body = []
    for t in sorted({float(r["target"]) for r in rows}, reverse=True):
        for plan in dict.fromkeys(r["plan"] for r in rows):
            sel = [r for r in rows if float(r["target"]) == t and r["plan"] == plan]
            if not sel:
                continue
            body.append([t, plan, _ms(_col(sel, "macs_ratio"), ".3f"), _ms(_col(sel, "measured"), ".3f"),
                         _ms(_col(sel, "pruned_top1")), _ms(_col(sel, "finetuned_top1")),
                         sum(bool(r["noise"]) for r in sel)])
    lines += md_table(["latency target", "plan", "MACs kept", "measured latency", "top-1 pruned",
                       "top-1 fine-tuned", "noisy timings"], body)
    base = [float(r["baseline_top1"]) for r in rows if r["plan"] == "latency"]
    lines += ["", f"Baseline top-1 {_ms(base)}; sparse (before pruning) "
              f"{_ms([float(r['sparse_top1']) for r in rows if r['plan'] == 'latency'])}.", ""]
    verdicts = []
    for t in sorted({float(r["target"]) for r in rows}, reverse=True):
        for plan in [p for p in dict.fromkeys(r["plan"] for r in rows) if p != "latency"]:
            diffs, gaps = [], []
            for s in seeds:
                a = [r for r in rows if float(r["target"]) == t and int(r["seed"]) == s]
                lat = next((r for r in a if r["plan"] == "latency"), None)
                fl = next((r for r in a if r["plan"] == plan), None)
                if lat and fl:
                    diffs.append(float(lat["finetuned_top1"]) - float(fl["finetuned_top1"]))
                    gaps.append(float(fl["measured"]) / float(lat["measured"]) - 1)
            if diffs:
                verdicts.append(f"- target {t}: latency plan minus {plan}, fine-tuned top-1: "
                                f"{_ms([100 * d for d in diffs], '+.2f')} points over {len(diffs)} seed(s) "
                                f"(wins {sum(d >= 0 for d in diffs)} of {len(diffs)}); the FLOPs plan's measured "
                                f"latency was {_ms([100 * g for g in gaps], '+.1f')}% off the latency plan's.")
    lines += ["## At equal latency", "", *verdicts, ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes")
    ap.add_argument("--seeds", default="", help="comma-separated seeds (default: 0,1,2)")
    ap.add_argument("--batch", type=int, default=32, help="batch of the timed forward")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--search", type=int, default=6, help="FLOPs plans tried per equal-latency search")
    ap.add_argument("--cache", default="default", help="latency-table cache (default: prunefx's)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    sizes = QUICK if args.quick else FULL
    if args.seeds:
        sizes = replace(sizes, seeds=tuple(int(s) for s in args.seeds.split(",")))
    stem = "latency_accuracy_quick" if args.quick else "latency_accuracy"
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{stem}.csv"
    done = read_csv(csv_path) if csv_path.exists() and not args.quick else []
    info = machine_info(threads=args.threads, batch=str(args.batch),
                        data=", ".join(f"{k} {v}" for k, v in sizes.data.items()))
    t0 = time.time()
    rows = [*done]
    for seed in sizes.seeds:
        if any(int(r["seed"]) == seed for r in done):
            continue  # a rerun appends the seeds still missing
        rows += run_seed(seed, sizes, args)
        write_csv(rows, csv_path, FIELDS)
    info["load average at end (1/5/15 min)"] = " ".join(f"{v:.1f}" for v in os.getloadavg())
    md = args.out / f"{stem}.md"
    write_md(rows, md, info, "python -m experiments.latency_accuracy " + " ".join(argv or sys.argv[1:]),
             time.time() - t0)
    print(md.read_text())
    return md


if __name__ == "__main__":
    main()
