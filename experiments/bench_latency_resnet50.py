"""Does a 2x MACs reduction turn into a 2x CPU speedup? ResNet-50, with and without round_to=8.

    python -m experiments.bench_latency_resnet50 [--quick] [--batch 32] [--threads 2] [--out experiments/results]

Prunes ResNet-50 (random weights, bn_scale ties broken evenly) to half its MACs with round_to 1 and 8, then
times the original and both pruned models on the CPU (eval, no_grad), each as is, with BatchNorm folded
into the convs (torch.fx fuse) and in channels_last, and reports speedup / MACs-ratio (1.0 = every MAC
saved is time saved).
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import platform
from pathlib import Path

import torch
import torchvision
from torch.fx.experimental.optimization import fuse

import prunefx
from prunefx.metrics import latency, measure


def variants(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    folded = fuse(copy.deepcopy(model).eval())  # conv+BN folded: what inference runtimes do
    return {"as is": model, "BN folded": folded, "BN folded + channels_last": folded}


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="resnet18, batch 2, 64x64, 3 repeats (smoke test)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("experiments/results"))
    args = ap.parse_args(argv)
    name, size, batch, repeats = ("resnet18", 64, 2, 3) if args.quick else ("resnet50", 224, args.batch, args.repeats)
    torch.manual_seed(0)
    base = torchvision.models.get_model(name, weights=None).eval()
    x1 = torch.randn(1, 3, size, size)
    xb = torch.randn(batch, 3, size, size)
    models = {"original": base}
    for r in (1, 8):
        m = copy.deepcopy(base)
        prunefx.prune(m, x1, prunefx.PlanConfig(flops=0.5, round_to=r), criterion="bn_scale", check=False)
        models[f"pruned round_to={r}"] = m
    base_macs = measure(base, x1).macs
    rows, base_ms = [], {}
    for label, m in models.items():
        macs = measure(m, x1).macs
        for variant, vm in variants(m).items():
            cl = variant.endswith("channels_last")
            lat = latency(vm, (xb,), warmup=2, repeats=repeats, threads=args.threads, channels_last=cl)
            base_ms.setdefault(variant, lat.median_ms)
            speedup = base_ms[variant] / lat.median_ms
            macs_ratio = base_macs / macs
            rows.append({"model": label, "variant": variant, "gmacs": macs / 1e9, "macs_ratio": macs_ratio,
                         "median_ms": lat.median_ms, "p10_ms": lat.p10_ms, "p90_ms": lat.p90_ms,
                         "speedup": speedup, "speedup_per_macs_ratio": speedup / macs_ratio})
            print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "latency_resnet50" if not args.quick else "latency_quick"
    with open(args.out / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# CPU latency of {name} pruned to 2x fewer MACs", "",
             f"Command: `python -m experiments.bench_latency_resnet50{' --quick' if args.quick else ''}`. "
             f"{platform.machine()} CPU, {os.cpu_count()} cores, {args.threads} torch threads, batch {batch}, "
             f"{size}x{size}, warm-up 2, {repeats} repeats, median [p10, p90]; torch {torch.__version__}; "
             f"1-min load average at the end {load:.1f} (2.0 = both cores busy with this benchmark alone).", "",
             "| model | variant | GMACs | MACs ratio | median ms [p10, p90] | speedup | speedup / MACs ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['variant']} | {r['gmacs']:.3f} | {r['macs_ratio']:.2f}x | "
                     f"{r['median_ms']:.1f} [{r['p10_ms']:.1f}, {r['p90_ms']:.1f}] | {r['speedup']:.2f}x | "
                     f"{r['speedup_per_macs_ratio']:.2f} |")
    path = args.out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


if __name__ == "__main__":
    main()
