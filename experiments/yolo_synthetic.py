"""YOLO on the embedded synthetic set: baseline / pruned / fine-tuned mAP and cost at several GFLOPs targets.

    python -m experiments.yolo_synthetic [--quick] [--models yolov8n,yolo11n] [--targets 0.75,0.5,0.35] [--seeds 0,1,2]

Runs ``prunefx prune configs/yolo.yaml`` (the README's main job) once per model, target and seed. When the sparse
model continues from the baseline (``prune.sparsity.start: baseline``) the baseline is trained once per model and
seed (the first target's run) and every other target starts from that run's ``weights/baseline.pt``. With several
seeds the table adds a mean +- std row per model and target. Writes ``<stem>.csv`` and ``<stem>.md`` into
``--out``; the run directories go to ``--runs``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from experiments import _table as table

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "yolo.yaml"
QUICK = ["imgsz=64", "batch=8", "nbs=8", "epochs=1", "prune.sparsity.epochs=1", "prune.finetune.epochs=1",
         "prune.data.n_train=32", "prune.data.n_val=16", "prune.data.imgsz=64"]
FIELDS = ["model", "target_flops", "seed", "gflops640_baseline", "gflops640_pruned", "gflops_ratio",
          "params_m_baseline", "params_m_pruned", "map50_baseline", "map50_95_baseline", "map50_95_sparse",
          "gammas_below_0.01", "map50_pruned", "map50_95_pruned", "map50_finetuned", "map50_95_finetuned",
          "map50_95_cut_points", "map50_95_loss_points", "latency_ms_baseline", "latency_ms_finetuned", "run",
          "minutes", "load_average"]
AVERAGED = ("map50_95_baseline", "map50_95_sparse", "map50_95_pruned", "map50_95_finetuned", "map50_95_cut_points",
            "map50_95_loss_points", "gammas_below_0.01", "minutes")


def run_one(model: str, target: float, runs: Path, extra: list[str], baseline: Path | None,
            seed: int | None = None, resume: bool = False) -> dict:
    from prunefx.pipeline import run_config
    from prunefx.pipeline.rundir import STATE, read_state
    from prunefx.report import load_report

    name = f"{model}-flops{target:g}" + (f"-seed{seed}" if seed is not None else "")
    # --resume: a finished run is read back, an interrupted one continues after its last finished stage
    status = read_state(runs / name).get("status") if resume and (runs / name / STATE).is_file() else None
    again = "resume=true" if status is not None else "exist_ok=true"
    overrides = [*extra, f"model={baseline or model + '.yaml'}", f"prune.target.flops={target}",
                 *([f"seed={seed}"] if seed is not None else []), f"project={runs}", f"name={name}", again]
    start = time.perf_counter()
    if status == "complete":
        root = runs / name
    else:
        root = run_config(CONFIG, overrides, log=lambda msg: print(f"[{name}] {msg}", flush=True)).root
    report = load_report(root)
    st = report["stages"]
    b, p = st["baseline"], st["pruned"]
    f = st.get("finetuned", p)
    sparsity = report["settings"].get("sparsity") or {}
    sparse = (sparsity.get("metrics") or {}).get("map50_95")
    return {
        "model": model, "target_flops": target, "seed": seed,
        "map50_95_sparse": sparse, "gammas_below_0.01": (sparsity.get("gammas") or {}).get("below_0.01"),
        "map50_95_cut_points": 100 * (sparse - p["metrics"]["map50_95"]) if sparse is not None else None,
        "load_average": os.getloadavg()[0],
        "gflops640_baseline": b["metrics"]["yolo_gflops@640"], "gflops640_pruned": p["metrics"]["yolo_gflops@640"],
        "gflops_ratio": p["metrics"]["yolo_gflops@640"] / b["metrics"]["yolo_gflops@640"],
        "params_m_baseline": b["params"] / 1e6, "params_m_pruned": p["params"] / 1e6,
        "map50_baseline": b["metrics"]["map50"], "map50_95_baseline": b["metrics"]["map50_95"],
        "map50_pruned": p["metrics"]["map50"], "map50_95_pruned": p["metrics"]["map50_95"],
        "map50_finetuned": f["metrics"]["map50"], "map50_95_finetuned": f["metrics"]["map50_95"],
        "map50_95_loss_points": 100 * (b["metrics"]["map50_95"] - f["metrics"]["map50_95"]),
        "latency_ms_baseline": b["latency"]["median_ms"] if b["latency"] else None,
        "latency_ms_finetuned": f["latency"]["median_ms"] if f["latency"] else None,
        "run": str(root), "minutes": _minutes(root, start),
    }  # fmt: skip


def narrower(model: str, target: float, nc: int):
    """``model`` with its width multiple scaled down (bisection) until its GFLOPs are ``target`` of the original."""
    from ultralytics.nn.tasks import DetectionModel, yaml_model_load

    from prunefx.integrations.ultralytics.gflops import ultralytics_gflops

    cfg = yaml_model_load(f"{model}.yaml")
    depth, width, max_ch = cfg["scales"][cfg["scale"]]
    goal = target * ultralytics_gflops(DetectionModel(cfg, nc=nc, verbose=False), 640)
    lo, hi = 0.2 * width, width
    for _ in range(12):  # GFLOPs grow monotonically with the width multiple (rounded to 8 channels)
        mid = (lo + hi) / 2
        cfg["scales"][cfg["scale"]] = [depth, mid, max_ch]
        lo, hi = (mid, hi) if ultralytics_gflops(DetectionModel(cfg, nc=nc, verbose=False), 640) < goal else (lo, mid)
    cfg["scales"][cfg["scale"]] = [depth, hi, max_ch]
    return DetectionModel(cfg, nc=nc, verbose=False), hi


def control(kind: str, model: str, target: float, runs: Path, extra: list[str], epochs: int) -> dict:
    """Same total training budget as baseline + sparsity + fine-tune, from scratch: the unpruned model, or a
    uniformly narrower one with the pruned model's GFLOPs."""
    import yaml as pyyaml

    from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
    from prunefx.integrations.ultralytics.io import save_yolo
    from prunefx.integrations.ultralytics.train import load_yolo, param_count, train_yolo
    from prunefx.pipeline import load_config
    from prunefx.pipeline.backends.yolo import YoloJob, evaluate_yolo, resolve_data

    name = f"{model}-{kind}{target:g}"
    job = YoloJob.from_config(load_config(CONFIG, [*extra, f"model={model}.yaml", f"project={runs}", f"name={name}"]))
    data = resolve_data(job)
    nc = len(pyyaml.safe_load(Path(data).read_text())["names"])
    start = time.perf_counter()
    args = {**job.train, "epochs": epochs, "data": data, "project": str(runs / name), "name": "train",
            "exist_ok": True, "device": "cpu", "amp": False, "workers": 0, "plots": False}
    if kind == "narrow":
        net, width = narrower(model, target, nc)
        best, _ = train_yolo(net, args)
        what = f"uniformly narrower (width multiple {width:.3f}), from scratch"
    else:
        best, _ = train_yolo(f"{model}.yaml", args)
        what = "unpruned, from scratch"
    trained = load_yolo(best)
    weights = runs / name / "best.pt"
    save_yolo(trained, weights)
    m = evaluate_yolo(weights, data, job.train, runs / name / "val", name)
    g = ultralytics_gflops(trained, 640)
    return {"model": f"{model} ({what}, {epochs} epochs)", "target_flops": target, "gflops640_baseline": g,
            "gflops640_pruned": g, "gflops_ratio": float("nan"), "params_m_baseline": param_count(trained) / 1e6,
            "params_m_pruned": param_count(trained) / 1e6, "map50_baseline": m["map50"],
            "map50_95_baseline": m["map50_95"], "map50_pruned": m["map50"], "map50_95_pruned": m["map50_95"],
            "map50_finetuned": m["map50"], "map50_95_finetuned": m["map50_95"], "map50_95_loss_points": float("nan"),
            "latency_ms_baseline": None, "latency_ms_finetuned": None, "run": str(runs / name),
            "minutes": (time.perf_counter() - start) / 60}


def _minutes(root: Path, start: float) -> float:
    """Minutes the run's stages took (recorded in its state, so a resumed run counts every stage once)."""
    from prunefx.pipeline.rundir import read_state

    stages = read_state(root).get("stages", {})
    recorded = [s["seconds"] for s in stages.values() if isinstance(s, dict) and "seconds" in s]
    return sum(recorded) / 60 if recorded else (time.perf_counter() - start) / 60


def _nan(v) -> bool:
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return False


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _mean_rows(rows: list[dict]) -> list[str]:
    """One mean +- std (over seeds) row per pruned (model, target) that ran with more than one seed."""
    out = []
    for key in dict.fromkeys((r["model"], r["target_flops"]) for r in rows if not _nan(r["gflops_ratio"])):
        group = [r for r in rows if (r["model"], r["target_flops"]) == key and not _nan(r["gflops_ratio"])]
        if len(group) < 2 or any(r.get(k) is None for r in group for k in AVERAGED):
            continue
        cell = {k: (statistics.mean(r[k] for r in group), statistics.stdev(r[k] for r in group)) for k in AVERAGED}

        def pm(k: str, fmt: str, c: dict = cell) -> str:
            return f"{format(c[k][0], fmt)} ± {format(c[k][1], fmt.lstrip('+'))}"

        out.append(f"| **{key[0]}, mean ± std** | {key[1]:g} | {len(group)} seeds | | | "
                   f"{pm('map50_95_baseline', '.4f')} | {pm('map50_95_sparse', '.4f')} | "
                   f"{pm('map50_95_pruned', '.4f')} | {pm('map50_95_finetuned', '.4f')} | "
                   f"{pm('map50_95_cut_points', '+.2f')} | {pm('map50_95_loss_points', '+.2f')} | "
                   f"{pm('gammas_below_0.01', '.0%')} | | | {pm('minutes', '.1f')} |")
    return out


def write(rows: list[dict], out: Path, args: argparse.Namespace, stem: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    table.write_csv(rows, out / f"{stem}.csv", FIELDS)
    shown = [a for a in args.argv if a not in ("--rewrite", "--resume")]  # the command that made the rows
    if "--note" in shown:
        del shown[shown.index("--note"):shown.index("--note") + 2]
    cmd = " ".join(["python -m experiments.yolo_synthetic", *map(shlex.quote, shown)])
    lines = [
        "# YOLO on the embedded synthetic shapes set", "",
        f"Command: `{cmd}` (each row is one `prunefx prune configs/yolo.yaml model=... prune.target.flops=T` run; "
        + ("the targets of one model share the baseline trained in its first run)." if args.share_baseline else
           "each run trains its own baseline: the sparse model starts from the baseline's initialisation)."),
        f"Machine: {platform.machine()} CPU, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}; settings from configs/yolo.yaml"
        + (" with the --quick overrides " + " ".join(QUICK) if args.quick else "")
        + (" with " + " ".join(args.set) if args.set else "") + ".",
        "mAP by `YOLO(path).val()` on the synthetic val split; GFLOPs in ultralytics' convention at 640; latency: "
        "CPU, batch 1 at the training imgsz, median of 50 after 10 warm-up, all cores.", "",
        "| model | target | seed | GFLOPs@640 base -> pruned (ratio) | params M | mAP50-95 baseline | sparse | "
        "pruned | fine-tuned | cut (points) | loss (points) | gammas < 0.01 | mAP50 base / fine-tuned | "
        "latency ms base -> fine-tuned | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lat = (f"{r['latency_ms_baseline']:.1f} -> {r['latency_ms_finetuned']:.1f}"
               if r["latency_ms_baseline"] is not None and r["latency_ms_finetuned"] is not None else "-")
        seed = "-" if r.get("seed") is None else r["seed"]
        if _nan(r["gflops_ratio"]):  # a control: one model trained from scratch, no pruning
            lines.append(f"| {r['model']} | {r['target_flops']:g} | {seed} | {r['gflops640_pruned']:.3f} | "
                         f"{r['params_m_pruned']:.3f} | - | - | - | {r['map50_95_finetuned']:.4f} | - | - | - | "
                         f"- / {r['map50_finetuned']:.3f} | {lat} | {r['minutes']:.1f} |")
            continue
        lines.append(
            f"| {r['model']} | {r['target_flops']:g} | {seed} | {r['gflops640_baseline']:.3f} -> "
            f"{r['gflops640_pruned']:.3f} ({r['gflops_ratio']:.3f}) | {r['params_m_baseline']:.3f} -> "
            f"{r['params_m_pruned']:.3f} | {r['map50_95_baseline']:.4f} | {_f(r.get('map50_95_sparse'), '.4f')} | "
            f"{r['map50_95_pruned']:.4f} | {r['map50_95_finetuned']:.4f} | "
            f"{_f(r.get('map50_95_cut_points'), '+.2f')} | "
            f"{r['map50_95_loss_points']:+.2f} | {_f(r.get('gammas_below_0.01'), '.0%')} | "
            f"{r['map50_baseline']:.3f} / {r['map50_finetuned']:.3f} | {lat} | {r['minutes']:.1f} |")
    lines += _mean_rows(rows)
    lines += ["", "Cut = sparse minus pruned mAP50-95 (what pruning itself costs), loss = baseline minus fine-tuned "
              "mAP50-95, both in points (negative: the later model is better); gammas < 0.01: the fraction of the "
              "sparse model's penalised BatchNorm gammas below 0.01. "
              + ("The baseline trains for `epochs` only; the pruned model gets `prune.sparsity.epochs` + "
                 "`prune.finetune.epochs` more" if args.share_baseline else
                 "The pruned model descends from a sparse model trained from the baseline's initialisation for "
                 "`prune.sparsity.epochs`, then gets `prune.finetune.epochs` more")
              + ", so the control rows (trained from scratch for the same total epochs: "
              "the unpruned model, and one made uniformly narrower by its width multiple; its GFLOPs cannot go "
              "lower than shown because ultralytics rounds widths to multiples of 8) are the fair comparison. "
              + ("" if args.rewrite else f"1-min load average when written: {os.getloadavg()[0]:.1f} on "
               f"{os.cpu_count()} cores (latency is only comparable within a row, and not at all when the load is "
               "above the core count).")]
    if args.note:
        lines += ["", args.note]
    path = out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="yolov8n, one target, 1 epoch per stage at imgsz 64")
    ap.add_argument("--models", default="yolov8n,yolo11n")
    ap.add_argument("--targets", default="0.75,0.5,0.35")
    ap.add_argument("--controls", type=lambda v: [float(t) for t in v.split(",") if t], default=[0.5],
                    help="targets at which to also train the same-budget controls (unpruned; uniformly narrower)")
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    ap.add_argument("--runs", type=Path, default=table.RUNS)
    ap.add_argument("--rewrite", action="store_true", help="only re-render the md from the existing CSV")
    ap.add_argument("--note", default="", help="a sentence appended to the md (e.g. what loaded the machine)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (repeatable): a recipe variant, written to its own --stem")
    ap.add_argument("--stem", default=None, help="output file stem (default yolo_synthetic[_quick])")
    ap.add_argument("--resume", action="store_true",
                    help="read finished runs back and continue interrupted ones instead of training them again")
    ap.add_argument("--seeds", type=lambda v: [int(s) for s in v.split(",") if s], default=None,
                    help="training seeds, one run each (default: the config's seed)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    args.argv = argv
    stem = args.stem or ("yolo_synthetic_quick" if args.quick else "yolo_synthetic")
    extra = [*(QUICK if args.quick else []), *args.set]
    from prunefx.pipeline import load_config
    from prunefx.pipeline.backends.yolo import YoloJob

    job = YoloJob.from_config(load_config(CONFIG, extra))  # validates the overrides before any training
    # start=scratch trains the sparse model from the model yaml, so every target trains its own (identical) baseline
    args.share_baseline = job.prune.sparsity.start != "scratch"
    if args.rewrite:
        rows = table.read_csv(args.out / f"{stem}.csv")
        return write(rows, args.out, args, stem)
    models = ["yolov8n"] if args.quick else args.models.split(",")
    targets = [0.5] if args.quick else [float(t) for t in args.targets.split(",")]
    runs = args.runs / stem if args.stem else args.runs  # a variant's runs never replace the default table's
    rows = []
    for model in models:
        baselines: dict[int | None, Path] = {}
        for target in targets:
            for seed in args.seeds or [None]:
                row = run_one(model, target, runs, extra, baselines.get(seed), seed, args.resume)
                rows.append(row)
                if args.share_baseline:
                    baselines[seed] = Path(row["run"]) / "weights" / "baseline.pt"
                write(rows, args.out, args, stem)
            if target in args.controls and not args.quick:
                budget = int(job.train["epochs"]) + job.prune.sparsity.epochs + job.prune.finetune.epochs
                for kind in ("unpruned", "narrow"):
                    rows.append(control(kind, model, target, runs, extra, budget))
                    write(rows, args.out, args, stem)
    path = write(rows, args.out, args, stem)
    print(path.read_text())
    return path


if __name__ == "__main__":
    main()
