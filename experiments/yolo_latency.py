"""CPU latency of the YOLO models in the yolo_synthetic tables: baseline vs pruned + fine-tuned, and the controls.

    python -m experiments.yolo_latency [--quick] [--tables yolo_synthetic,yolo_selective] [--imgsz 128,640]

Reads the run directories that ``experiments.yolo_synthetic`` recorded in its CSVs (run that first), loads each
checkpoint as ultralytics does for deployment (BatchNorm fused into the convolutions, eval mode) and times
batch-1 forwards with ``prunefx.metrics.latency`` in one process. Only the architecture matters for the time,
so the numbers belong to exactly the models whose mAP the tables report. Run it alone: other jobs on the cores
make latency noise. ``--quick`` (CI) builds a yolov8n and an L1-pruned copy at 64 px instead of reading runs.
Writes ``yolo_latency.{md,csv}`` (``yolo_latency_quick.*``) into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from experiments._table import RESULTS, write_csv

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 6  # base and model alternate this many times; each round times repeats / ROUNDS forwards
FIELDS = ["table", "model", "target_flops", "imgsz", "gflops640_baseline", "gflops640_model", "gflops_ratio",
          "latency_ms_baseline", "latency_ms_model", "speedup", "speedup_per_gflops_ratio"]


def _deployed(path: Path) -> tuple[torch.nn.Module, float]:
    """The checkpoint as ``YOLO(path)`` runs it for inference (float32, BatchNorm fused, eval mode), and its
    GFLOPs at 640 counted before fusing, as the yolo_synthetic tables count them."""
    from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
    from prunefx.integrations.ultralytics.train import load_yolo

    model = load_yolo(path).float()
    return model.fuse(verbose=False).eval(), ultralytics_gflops(model, 640)


def models_of(table: Path) -> list[tuple[str, float, Path | None, Path]]:
    """(model label, target, baseline checkpoint or None for a control row, measured checkpoint) per CSV row."""
    out = []
    with open(table, newline="") as f:
        for r in csv.DictReader(f):
            run = Path(r["run"])
            if (run / "weights" / "best.pt").is_file():  # a pipeline run: its baseline and its fine-tuned model
                out.append((r["model"], float(r["target_flops"]), run / "weights" / "baseline.pt",
                            run / "weights" / "best.pt"))
            elif (run / "best.pt").is_file():  # a from-scratch control: compared with its table's baseline
                out.append((r["model"], float(r["target_flops"]), None, run / "best.pt"))
            else:
                raise SystemExit(f"{table.name}: run directory {run} is missing; run experiments.yolo_synthetic "
                                 "with the command in its md first")
    return out


def measure_rows(name: str, entries, sizes: list[int], threads: int, repeats: int) -> list[dict]:
    from prunefx.metrics import latency

    rows, base_of = [], {}
    for label, target, base_path, path in entries:
        family = label.split(" ")[0]
        if base_path is not None:
            base_of.setdefault(family, base_path)
        base_path = base_path or base_of.get(family)
        if base_path is None:
            continue  # a control row listed before any pipeline row of its model: nothing to compare with
        (base, g_base), (model, g_model) = _deployed(base_path), _deployed(path)
        for size in sizes:
            x = (torch.zeros(1, 3, size, size),)
            # Interleaved rounds: a slow spell of the machine hits both models, not just the one timed in it.
            times: dict[str, list[float]] = {"base": [], "model": []}
            for _ in range(ROUNDS):
                for key, net in (("base", base), ("model", model)):
                    times[key].append(latency(net, x, warmup=2, repeats=max(1, repeats // ROUNDS),
                                              threads=threads).median_ms)
            t_base, t_model = statistics.median(times["base"]), statistics.median(times["model"])
            rows.append({"table": name, "model": label, "target_flops": target, "imgsz": size,
                         "gflops640_baseline": g_base, "gflops640_model": g_model, "gflops_ratio": g_model / g_base,
                         "latency_ms_baseline": t_base, "latency_ms_model": t_model, "speedup": t_base / t_model,
                         "speedup_per_gflops_ratio": (t_base / t_model) / (g_base / g_model)})
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    return rows


def quick_entries(tmp: Path) -> list[tuple[str, float, Path, Path]]:
    """An untrained yolov8n and a copy pruned (L1) to half its GFLOPs, saved as ultralytics checkpoints."""
    from ultralytics.nn.tasks import DetectionModel

    import prunefx
    from prunefx.integrations.ultralytics.io import save_yolo

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", nc=4, verbose=False)
    save_yolo(model, tmp / "baseline.pt")
    prunefx.prune(model, (torch.zeros(1, 3, 64, 64),), prunefx.PlanConfig(flops=0.5), criterion="l1")
    save_yolo(model, tmp / "pruned.pt")
    return [("yolov8n", 0.5, tmp / "baseline.pt", tmp / "pruned.pt")]


def write(rows: list[dict], args: argparse.Namespace, stem: str) -> Path:
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / f"{stem}.csv", FIELDS)
    cmd = "python -m experiments.yolo_latency" + (" --quick" if args.quick else "")
    lines = [
        f"# CPU latency of the YOLO tables' models ({stem})",
        "",
        f"Command: `{cmd}`. Machine: {platform.machine()} CPU, {os.cpu_count()} cores, {args.threads} torch "
        f"threads, batch 1, BatchNorm fused (as ultralytics deploys); base and model timed alternately in {ROUNDS} "
        f"rounds of {max(1, args.repeats // ROUNDS)} forwards (after 2 warm-up), the median of the round medians; "
        f"torch {torch.__version__}; 1-min load average at the end {os.getloadavg()[0]:.1f} "
        f"({args.threads}.0 = this benchmark alone).",
        "",
        "| table | model | GFLOPs target | imgsz | GFLOPs@640 base -> model (ratio) | latency ms base -> model "
        "| speedup | speedup / GFLOPs ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['table']} | {r['model']} | {r['target_flops']:g} | {r['imgsz']} | "
            f"{r['gflops640_baseline']:.3f} -> {r['gflops640_model']:.3f} ({r['gflops_ratio']:.3f}) | "
            f"{r['latency_ms_baseline']:.1f} -> {r['latency_ms_model']:.1f} | {r['speedup']:.2f}x | "
            f"{r['speedup_per_gflops_ratio']:.2f} |"
        )
    lines += [
        "",
        "Base: the run's baseline checkpoint; model: the pruned and fine-tuned checkpoint, or a from-scratch "
        "control (compared with the first baseline of the same model in its table).",
        "",
    ]
    path = args.out / f"{stem}.md"
    path.write_text("\n".join(lines))
    print(f"wrote {path}")
    return path


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="an untrained yolov8n and a pruned copy at 64 px (CI)")
    ap.add_argument("--tables", default="yolo_synthetic,yolo_selective")
    ap.add_argument("--imgsz", type=lambda s: [int(v) for v in s.split(",")], default=[128, 640])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()
    if args.quick:
        args.imgsz, args.repeats = [64], ROUNDS
        with tempfile.TemporaryDirectory() as tmp:
            rows = measure_rows("quick", quick_entries(Path(tmp)), args.imgsz, args.threads, args.repeats)
        return write(rows, args, "yolo_latency_quick")
    rows = []
    for name in args.tables.split(","):
        table = args.out / f"{name}.csv"
        rows += measure_rows(name, models_of(table), args.imgsz, args.threads, args.repeats)
    return write(rows, args, "yolo_latency")


if __name__ == "__main__":
    main()
