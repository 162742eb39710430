"""Do FLOPs savings turn into CPU speed? Models pruned to several MACs targets, with and without round_to.

    python -m experiments.bench_latency [--quick] [--models resnet50,mobilenet_v2] [--targets 0.75,0.5,0.35]
                                        [--round-to 1,8] [--batches 1,32] [--threads 2] [--repeats 5]

Each torchvision model (random init; bn_scale ties are broken evenly, so the plan is a near-uniform one) is
pruned to each MACs target, then the original and every pruned model are timed on the CPU (eval, no_grad)
as is and with BatchNorm folded into the convolutions (torch.fx ``fuse``, what inference runtimes do),
at each batch size. Reports speedup / MACs ratio: 1.0 means every MAC saved is time saved.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
from pathlib import Path

import torch
import torchvision
from torch.fx.experimental.optimization import fuse

import prunefx
from experiments import _table as table
from prunefx.metrics import latency, measure

FIELDS = ["model", "target", "round_to", "batch", "variant", "gmacs", "macs_ratio", "median_ms", "p10_ms", "p90_ms",
          "speedup", "speedup_per_macs_ratio"]
VARIANTS = ("as is", "BN folded", "BN folded + channels_last")


def pruned_models(name: str, size: int, targets: list[float], round_tos: list[int]) -> dict[tuple, torch.nn.Module]:
    torch.manual_seed(0)
    base = torchvision.models.get_model(name, weights=None).eval()
    x1 = torch.randn(1, 3, size, size)
    models = {(1.0, 1): base}
    for t in targets:
        for r in round_tos:
            m = copy.deepcopy(base)
            prunefx.prune(m, x1, prunefx.PlanConfig(flops=t, round_to=r), criterion="bn_scale", check=False)
            models[(t, r)] = m
    return models


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    for name in args.models:
        size = args.size
        models = pruned_models(name, size, args.targets, args.round_to)
        x1 = torch.randn(1, 3, size, size)
        base_macs = measure(models[(1.0, 1)], x1).macs
        for batch in args.batches:
            xb = torch.randn(batch, 3, size, size)
            base_ms: dict[str, float] = {}
            for (target, r), m in models.items():
                macs = measure(m, x1).macs
                folded = fuse(copy.deepcopy(m).eval())
                for variant in args.variants:
                    vm = m if variant == "as is" else folded
                    lat = latency(vm, (xb,), warmup=2, repeats=args.repeats, threads=args.threads,
                                  channels_last=variant.endswith("channels_last"))
                    base_ms.setdefault(variant, lat.median_ms)
                    speedup, ratio = base_ms[variant] / lat.median_ms, base_macs / macs
                    rows.append({"model": name, "target": target, "round_to": r, "batch": batch, "variant": variant,
                                 "gmacs": macs / 1e9, "macs_ratio": ratio, "median_ms": lat.median_ms,
                                 "p10_ms": lat.p10_ms, "p90_ms": lat.p90_ms, "speedup": speedup,
                                 "speedup_per_macs_ratio": speedup / ratio})
                    print({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    return rows


def write(rows: list[dict], args: argparse.Namespace, stem: str, command: str) -> Path:
    args.out.mkdir(parents=True, exist_ok=True)
    table.write_csv(rows, args.out / f"{stem}.csv", FIELDS)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        f"# CPU latency vs MACs: {', '.join(args.models)}",
        "",
        f"Command: `{command}`. {platform.machine()} CPU, {os.cpu_count()} cores, {args.threads} torch threads, "
        f"{args.size}x{args.size}, warm-up 2, {args.repeats} repeats, median [p10, p90]; torch {torch.__version__}; "
        f"1-min load average at the end {load:.1f} ({args.threads:.1f} = this benchmark alone).",
        "",
        "| model | MACs target | round_to | batch | variant | GMACs | MACs ratio | median ms [p10, p90] | speedup "
        "| speedup / MACs ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = "original" if r["target"] == 1.0 else f"{r['target']:g}"
        lines.append(
            f"| {r['model']} | {target} | {r['round_to']} | {r['batch']} | {r['variant']} | {r['gmacs']:.3f} | "
            f"{r['macs_ratio']:.2f}x | {r['median_ms']:.1f} [{r['p10_ms']:.1f}, {r['p90_ms']:.1f}] | "
            f"{r['speedup']:.2f}x | {r['speedup_per_macs_ratio']:.2f} |"
        )
    path = args.out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def parser(**defaults) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="resnet18 at 64x64, one target, batch 2, 3 repeats")
    ap.add_argument("--models", type=lambda s: s.split(","), default=["resnet50", "mobilenet_v2"])
    ap.add_argument("--targets", type=lambda s: [float(t) for t in s.split(",")], default=[0.75, 0.5, 0.35])
    ap.add_argument("--round-to", type=lambda s: [int(t) for t in s.split(",")], default=[1, 8])
    ap.add_argument("--batches", type=lambda s: [int(t) for t in s.split(",")], default=[1, 32])
    ap.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS[:2]))
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    ap.add_argument("--stem", default="latency_vs_macs")
    ap.set_defaults(**defaults)
    return ap


def main(argv: list[str] | None = None, *, module: str = "experiments.bench_latency", **defaults) -> Path:
    args = parser(**defaults).parse_args(argv)
    stem = args.stem
    if args.quick:
        args.models, args.targets, args.round_to, args.batches = ["resnet18"], [0.5], [1, 8], [2]
        args.size, args.repeats, stem = 64, 3, f"{args.stem}_quick"
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m", module, *given])
    path = write(run(args), args, stem, command)
    print(path.read_text())
    return path


if __name__ == "__main__":
    main()
