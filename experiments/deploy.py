"""Prune, then int8 (issue 49): fp32 eager, fp32 ONNX Runtime, int8 ONNX Runtime, pruned to 1/2 MACs, pruned + int8.

    python -m experiments.deploy [--quick] [--models resnet18,small_cnn] [--rounds 7] [--threads 1]

Each model is built seeded (random-init weights), pruned to half its MACs with ``prunefx.prune`` (bn_scale, the
oracle), and both the original and the pruned model are quantized with ``prunefx.quantize`` (ONNX Runtime static
QDQ, per-channel int8 weights, MinMax calibration on random normal batches, activation type measured, no per-layer
table). All five variants are timed at batch 1 in one process, in alternating rounds (each round times every
variant ``repeats`` times), one intra-op thread, ONNX Runtime's threads not spinning; the median over all repeats is
reported with the speedup over fp32 eager, the int8 model's error against its float ONNX model on held-out rows,
the CPU, ONNX Runtime's version and the 1-min load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SIZES = {"resnet18": 224, "resnet50": 224, "small_cnn": 32}


def _build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "small_cnn":
        from prunefx.zoo import bn_cnn_synthetic

        return bn_cnn_synthetic().eval()
    import torchvision

    return getattr(torchvision.models, name)(weights=None).eval()


def _variants(name: str, work: Path, calib_batches: int) -> tuple[dict[str, Any], dict[str, float], torch.Tensor]:
    """name -> a callable running one batch-1 forward; and the int8 models' errors vs float."""
    import prunefx
    from prunefx.metrics.backends import Deployment, ort_session

    size = SIZES[name]
    x = torch.randn(1, 3, size, size)
    model = _build(name)
    pruned = prunefx.prune(copy.deepcopy(model), x, prunefx.PlanConfig(flops=0.5)).model.eval()
    g = torch.Generator().manual_seed(1)
    calibration = [torch.randn(4, 3, size, size, generator=g) for _ in range(calib_batches)]
    dep = Deployment(backend="onnxruntime", threads=1)
    feed = {"input0": x.numpy()}
    runs: dict[str, Any] = {}
    errors: dict[str, float] = {}
    for label, net in (("", model), ("pruned 1/2 MACs, ", pruned)):
        q = prunefx.quantize(net, x, calibration, out=work / f"{name}-{len(runs)}", method="minmax",
                             per_layer=False)
        fp32 = ort_session(q.float_path.read_bytes(), dep)
        int8 = ort_session(q.int8_path.read_bytes(), dep)
        runs[f"{label}fp32 ORT"] = lambda s=fp32: s.run(None, feed)
        runs[f"{label}int8 ORT"] = lambda s=int8: s.run(None, feed)
        errors[f"{label}int8 ORT"] = q.error
    return runs, errors, x


def _eager(model: torch.nn.Module, x: torch.Tensor) -> Any:
    from prunefx.passes import fold_bn

    folded = fold_bn(model, (x,))

    def run() -> Any:
        with torch.no_grad():
            return folded(x)

    return run


def main(argv: list[str] | None = None, module: str = "experiments.deploy") -> Path:
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,small_cnn")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calib-batches", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="small_cnn only, 2 rounds (a smoke run)")
    parser.add_argument("--out", type=Path, default=Path("experiments/results"))
    args = parser.parse_args(argv)
    models = ["small_cnn"] if args.quick else args.models.split(",")
    rounds = 2 if args.quick else args.rounds
    torch.set_num_threads(args.threads)
    rows = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="deploy-bench-") as tmp:
        for name in models:
            runs, errors, x = _variants(name, Path(tmp), args.calib_batches)
            base = _build(name)
            variants = {"fp32 eager": _eager(base, x), **runs}
            times: dict[str, list[float]] = {k: [] for k in variants}
            for run in variants.values():  # warm-up
                run()
                run()
            for r in range(rounds):
                order = list(variants) if r % 2 == 0 else list(reversed(variants))
                for key in order:
                    for _ in range(args.repeats):
                        start = time.perf_counter()
                        variants[key]()
                        times[key].append(time.perf_counter() - start)
            eager = statistics.median(times["fp32 eager"])
            for key, t in times.items():
                med = statistics.median(t)
                rows.append({"model": f"{name} ({SIZES[name]} px)", "variant": key, "median_ms": round(med * 1e3, 2),
                             "speedup_vs_eager": round(eager / med, 2),
                             "int8_vs_float_rel_rms": f"{errors[key]:.3g}" if key in errors else ""})
    load_after = os.getloadavg()[0]
    return _write(args.out, rows, args, rounds, load_before, load_after)


def _write(out: Path, rows: list[dict[str, Any]], args: Any, rounds: int, before: float, after: float) -> Path:
    import onnxruntime

    from prunefx.metrics.backends import Deployment, machine_name

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "deploy.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    cols = list(rows[0])
    lines = [
        "# Prune, then int8: CPU latency at batch 1",
        "",
        f"{machine_name(Deployment())}, {os.cpu_count()} cores, {args.threads} thread(s), ONNX Runtime "
        f"{onnxruntime.__version__} (threads not spinning), torch {torch.__version__}; {rounds} alternating rounds x "
        f"{args.repeats} repeats per variant, median; random-init weights; 1-min load average {before:.1f} before, "
        f"{after:.1f} after (a shared machine: compare rows of one run only).",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
        *("| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows),
        "",
    ]
    (out / "deploy.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return out / "deploy.md"


if __name__ == "__main__":
    main()
