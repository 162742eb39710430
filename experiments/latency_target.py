"""Latency as the target: plans solved against measured latency vs FLOPs-targeted plans, on torch and ONNX Runtime.

    python -m experiments.latency_target [--quick] [--models resnet50,mobilenet_v2,yolov8n] [--batches 1,32]
                                         [--backends torch,onnxruntime] [--targets 0.75,0.5,0.35] [--threads 2]

Each model gets realistic, non-uniform importance (BatchNorm gammas drawn uniformly from [0.1, 1], seeded; one
global bn_scale ranking), then for every (batch, backend) cell and target t:

- **latency t**: ``prunefx.prune(PlanConfig(latency=t))`` on that deployment: the latency table (cached under
  ``--cache``), the latency planner, then the pruned model measured against the original in alternating rounds
  and re-planned while it misses t by more than 5% (at most 4 plans). Reported: the plans made, the model's
  prediction and the measured latency fraction of the chosen plan.
- **flops t, round_to 8** and **flops t, round_to auto**: the same importance pruned to t of the MACs, widths
  rounded up to multiples of 8 or to the fast edge of the measured step; both timed in the same alternating
  rounds as the original. Reported: their latency fraction, and speedup / MACs speedup (1.0: every MAC saved
  is time saved).

Every timing is base and pruned in alternating rounds, BatchNorm folded on torch (ONNX Runtime folds itself), with
the 1-min load average recorded per cell; a cell whose timing was noisy (load above the cores + 0.5, or p90 above
1.25x the median) says so. Rows are appended to the CSV as they finish; a rerun skips the cells already there.
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ["model", "batch", "backend", "target", "plan", "macs_ratio", "plans", "predicted", "measured", "miss",
          "speedup", "speedup_per_macs_speedup", "base_ms", "pruned_ms", "noise", "load", "seconds"]


def build(name: str, size: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model with BatchNorm gammas spread uniformly in [0.1, 1] (seeded), and a batch-1 input."""
    torch.manual_seed(0)
    if name.startswith("yolo"):
        from prunefx.integrations.ultralytics.env import setup_offline

        setup_offline()
        from ultralytics.nn.tasks import DetectionModel

        model = DetectionModel(f"{name}.yaml", verbose=False)
    else:
        import torchvision

        model = torchvision.models.get_model(name, weights=None)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.9 + 0.1)
    return model.eval(), torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(0))


def cell(name: str, model, x, batch: int, backend: str, targets: list[float], args) -> Iterator[dict]:
    import prunefx
    from prunefx.metrics import Deployment, compare_latency, measure

    dep = Deployment(backend=backend, threads=args.threads, batch=batch)
    base_macs = measure(model, x).macs
    for t in targets:
        start = time.time()
        pruned = copy.deepcopy(model)
        result = prunefx.prune(pruned, x, prunefx.PlanConfig(latency=t), deployment=dep, latency_cache=args.cache,
                               check=False)  # fmt: skip
        out = result.latency
        r = out.rounds[out.chosen]
        macs = measure(result.model, x).macs
        yield {
            "model": name, "batch": batch, "backend": backend, "target": t, "plan": "latency",
            "macs_ratio": macs / base_macs, "plans": len(out.rounds), "predicted": r.predicted, "measured": r.measured,
            "miss": r.measured / t - 1, "speedup": 1 / r.measured, "speedup_per_macs_speedup": (1 / r.measured) / (
                base_macs / macs), "base_ms": float("nan"), "pruned_ms": float("nan"), "noise": r.noise or "",
            "load": os.getloadavg()[0], "seconds": time.time() - start,
        }  # fmt: skip
        start = time.time()
        plans = {}
        for rounding in (8, "auto"):
            pruned = copy.deepcopy(model)
            res = prunefx.prune(pruned, x, prunefx.PlanConfig(flops=t, round_to=rounding), deployment=dep,
                                latency_cache=args.cache, check=False)  # fmt: skip
            plans[f"flops r{rounding}"] = res.model
        timed = compare_latency({"base": model, **plans}, x, dep, budget_s=args.budget)
        for label, m in plans.items():
            macs = measure(m, x).macs
            ratio = timed[label].median_ms / timed["base"].median_ms
            noise = timed[label].noise or timed["base"].noise or ""
            yield {
                "model": name, "batch": batch, "backend": backend, "target": t, "plan": label,
                "macs_ratio": macs / base_macs, "plans": 1, "predicted": float("nan"), "measured": ratio,
                "miss": ratio / t - 1, "speedup": 1 / ratio, "speedup_per_macs_speedup": (1 / ratio) / (
                    base_macs / macs), "base_ms": timed["base"].median_ms, "pruned_ms": timed[label].median_ms,
                "noise": noise, "load": timed["base"].load_avg or float("nan"), "seconds": time.time() - start,
            }  # fmt: skip


def read(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_md(rows: list[dict], args, stem: str, command: str) -> Path:
    lines = [
        "# Latency as the target: measured-latency plans vs FLOPs plans",
        "",
        f"Command: `{command}`. Machine: {platform.machine()} CPU ({platform.processor() or 'unknown'}), "
        f"{os.cpu_count()} cores, {args.threads} threads per timing, torch {torch.__version__}; images "
        f"{', '.join(f'{m} {args.size_of(m)}px' for m in args.models)}; BatchNorm gammas uniform in [0.1, 1] "
        "(seeded), global bn_scale ranking; base and pruned timed in alternating rounds (BatchNorm folded on torch).",
        "",
        "latency t: planned against the measured latency table, re-planned while the measurement misses t by > 5% "
        "(plans = how many); flops t: the same importance at t of the MACs, widths rounded to 8 or 'auto' (the "
        "fast edge of each measured step). measured = pruned / base latency; speedup / MACs speedup = 1.0 when "
        "every MAC saved is time saved. 'noise' flags a cell whose timing is unreliable (load above cores + 0.5 "
        "or p90 above 1.25x the median).",
        "",
        "| model | batch | backend | target | plan | MACs kept | plans | predicted | measured | miss | speedup "
        "| speedup / MACs speedup | load | noise |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def num(v: str, fmt: str) -> str:
        return "-" if v in ("", "nan") else format(float(v), fmt)

    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['backend']} | {float(r['target']):g} | {r['plan']} | "
            f"{num(r['macs_ratio'], '.3f')} | {r['plans']} | {num(r['predicted'], '.3f')} | "
            f"{num(r['measured'], '.3f')} | {num(r['miss'], '+.1%')} | {num(r['speedup'], '.2f')}x | "
            f"{num(r['speedup_per_macs_speedup'], '.2f')} | {num(r['load'], '.1f')} | {r['noise'] or '-'} |"
        )
    lat = [r for r in rows if r["plan"] == "latency"]
    quiet = [r for r in lat if not r["noise"]]
    within = [r for r in lat if abs(float(r["miss"])) <= 0.05]
    faster = [r for r in lat if float(r["miss"]) < -0.05]  # over-pruned: accuracy spent for nothing
    lines += ["", "## Summary", ""]
    lines.append(f"- latency plans within 5% of the target (|miss| <= 5%): {len(within)} of {len(lat)} cells; "
                 f"faster by more (over-pruned): {len(faster)}; slower by more: {len(lat) - len(within) - len(faster)} "
                 f"({len(quiet)} of the {len(lat)} timed without a noise flag).")
    for plan in ("flops r8", "flops rauto"):
        eff = [float(r["speedup_per_macs_speedup"]) for r in rows if r["plan"] == plan]
        if eff:
            lines.append(f"- {plan}: speedup / MACs speedup {min(eff):.2f}-{max(eff):.2f} (median "
                         f"{sorted(eff)[len(eff) // 2]:.2f}), >= 0.9 in {sum(e >= 0.9 for e in eff)} of {len(eff)} "
                         "cells.")
    pairs = {}
    for r in rows:
        if r["plan"].startswith("flops"):
            pairs.setdefault((r["model"], r["batch"], r["backend"], r["target"]), {})[r["plan"]] = float(r["measured"])
    both = [p for p in pairs.values() if len(p) == 2]
    if both:
        faster = sum(p["flops rauto"] < p["flops r8"] for p in both)
        lines.append(f"- round_to auto vs 8 at the same MACs target: auto faster in {faster} of {len(both)} cells "
                     f"(latency fraction auto / r8 {min(p['flops rauto'] / p['flops r8'] for p in both):.2f}-"
                     f"{max(p['flops rauto'] / p['flops r8'] for p in both):.2f}).")
    noisy = sorted({f"{r['model']} b{r['batch']} {r['backend']}" for r in rows if r["noise"]})
    lines.append(f"- cells with a noise flag (rerun on a quiet machine): {', '.join(noisy) or 'none'}.")
    path = args.out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="resnet18 at 64 px, batch 1, one target, 1 thread")
    ap.add_argument("--models", type=lambda s: s.split(","), default=["resnet50", "mobilenet_v2", "yolov8n"])
    ap.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")], default=[1, 32])
    ap.add_argument("--backends", type=lambda s: s.split(","), default=["torch", "onnxruntime"])
    ap.add_argument("--targets", type=lambda s: [float(v) for v in s.split(",")], default=[0.75, 0.5, 0.35])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=15.0, help="seconds of timed forwards per model per timing")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "latency")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--stem", default="latency_target")
    given = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(given)
    stem = args.stem
    sizes = {"yolov8n": 640}
    if args.quick:
        args.models, args.batches, args.targets, args.threads, stem = ["resnet18"], [1], [0.5], 1, f"{stem}_quick"
        sizes = {"resnet18": 64}
    args.size_of = lambda m: sizes.get(m, 224)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{stem}.csv"
    rows = [] if args.quick else read(csv_path)
    done = {(r["model"], r["batch"], r["backend"], r["target"], r["plan"]) for r in rows}
    if args.quick and csv_path.exists():
        csv_path.unlink()
    torch.set_num_threads(args.threads)
    for name in args.models:
        model, x = build(name, args.size_of(name))
        for batch in args.batches:
            for backend in args.backends:
                todo = [t for t in args.targets if (name, str(batch), backend, str(t), "latency") not in done]
                for row in cell(name, model, x, batch, backend, todo, args):
                    print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
                    new = not csv_path.exists()
                    with open(csv_path, "a", newline="") as f:
                        w = csv.DictWriter(f, fieldnames=FIELDS)
                        if new:
                            w.writeheader()
                        w.writerow(row)
    command = " ".join(["python -m experiments.latency_target", *given])
    path = write_md(read(csv_path), args, stem, command)
    print(path.read_text())
    return path


if __name__ == "__main__":
    main()
