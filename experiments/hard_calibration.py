"""How hard is the hard shapes set? yolov8n and yolov8s trained from scratch on it, val mAP per epoch.

    python -m experiments.hard_calibration [--models yolov8n yolov8s] [--epochs 4] [--n-train 600] [--imgsz 160]
        [--runs runs/experiments/hard_calibration] [--out experiments/results] [--render]

Each model trains with ultralytics' own trainer (SGD lr0 0.01, no mosaic, 1 warm-up epoch, batch 32, seed 0) on
``make_hard_shapes_dataset`` (``--n-train`` training images, 150 validation images, seed 0); the table gives
ultralytics' per-epoch validation mAP50 / mAP50-95 from each run's ``results.csv``. ``--render`` only rewrites
the table from finished runs. A converged yolov8n should land at mAP50-95 0.4-0.6 with yolov8s clearly above.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import time
from pathlib import Path

from experiments import _table as table

TRAIN = {"optimizer": "SGD", "lr0": 0.01, "mosaic": 0.0, "close_mosaic": 0, "warmup_epochs": 1, "batch": 32, "seed": 0}


def train(model: str, epochs: int, n_train: int, imgsz: int, runs: Path) -> Path:
    """Train ``model`` from its yaml; returns its run directory (ultralytics' results.csv inside)."""
    from prunefx.integrations.ultralytics.env import cpu_train_kwargs, setup_offline

    setup_offline()
    from ultralytics import YOLO

    from prunefx.data.detection_hard import make_hard_shapes_dataset

    data = make_hard_shapes_dataset(runs / f"hard{n_train}", n_train=n_train, n_val=150, imgsz=imgsz, seed=0)
    YOLO(f"{model}.yaml").train(**cpu_train_kwargs(data=str(data), epochs=epochs, imgsz=imgsz, project=str(runs),
                                                   name=f"{model}-{epochs}ep", exist_ok=True, val=True, **TRAIN))
    return runs / f"{model}-{epochs}ep"


def render(models: list[str], epochs: int, runs: Path, out: Path, command: str, minutes: dict[str, float]) -> Path:
    rows, curves = [], {}
    for model in models:
        path = runs / f"{model}-{epochs}ep" / "results.csv"
        if not path.is_file():
            continue
        with path.open() as f:
            curve = [{k.strip(): v for k, v in r.items()} for r in csv.DictReader(f)]
        curves[model] = curve
        for r in curve:
            rows.append({"model": model, "epoch": int(r["epoch"]), "seconds": float(r["time"]),
                         "map50": float(r["metrics/mAP50(B)"]), "map50_95": float(r["metrics/mAP50-95(B)"])})
    table.write_csv(rows, out / "hard_calibration.csv", ["model", "epoch", "seconds", "map50", "map50_95"], digits=5)
    info = table.machine_info()
    lines = ["# The hard shapes set: yolov8n vs yolov8s from scratch", "", "## Summary", "",
             f"Command: `{command}`", "",
             f"Machine: {info['machine']}; load average at render {info['load average at start (1/5/15 min)']}; "
             f"{info['torch']}", "",
             f"Setup: {TRAIN}, imgsz and data as in the command; mAP is ultralytics' validation after each epoch. "
             "Epochs done: " + ", ".join(f"{m} {len(c)} of {epochs}" for m, c in curves.items()) + ".", ""]
    header = ["epoch", *(f"{m} mAP50 / mAP50-95" for m in curves)]
    body = [[str(e + 1), *(f"{float(c[e]['metrics/mAP50(B)']):.4f} / {float(c[e]['metrics/mAP50-95(B)']):.4f}"
                           if e < len(c) else "-" for c in curves.values())]
            for e in range(max((len(c) for c in curves.values()), default=0))]
    lines += table.md_table(header, body)
    if minutes:
        lines += ["", "Minutes per run: " + ", ".join(f"{m} {v:.1f}" for m, v in minutes.items())]
    path = out / "hard_calibration.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> Path:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["yolov8n", "yolov8s"])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--n-train", type=int, default=600)
    ap.add_argument("--imgsz", type=int, default=160)
    ap.add_argument("--runs", type=Path, default=table.RUNS / "hard_calibration")
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    ap.add_argument("--quick", action="store_true", help="1 epoch, 32 images, imgsz 64 (smoke test)")
    ap.add_argument("--render", action="store_true", help="only rewrite the table from the finished runs")
    ap.add_argument("--minutes", nargs="*", default=[], metavar="MODEL=MIN",
                    help="with --render: the minutes each training process printed in its own table")
    args = ap.parse_args(argv)
    if args.quick:
        args.epochs, args.n_train, args.imgsz = 1, 32, 64
    minutes = {m: float(v) for m, v in (item.split("=", 1) for item in args.minutes)}
    if not args.render:
        for model in args.models:
            start = time.perf_counter()
            train(model, args.epochs, args.n_train, args.imgsz, args.runs)
            minutes[model] = (time.perf_counter() - start) / 60
    shown, skip = [], False
    for a in argv:  # the command that trained the runs: without --render and --minutes
        skip = a == "--minutes" or (skip and not a.startswith("--"))
        if a != "--render" and not skip:
            shown.append(a)
    command = "python -m experiments.hard_calibration " + shlex.join(shown)
    return render(args.models, args.epochs, args.runs, args.out, command, minutes)


if __name__ == "__main__":
    main()
