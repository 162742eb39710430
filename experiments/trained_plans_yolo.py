"""Plans on a trained YOLOv8n: mAP50-95 right after the cut and after one short fine-tune, 2x / 4x fewer MACs.

    python -m experiments.trained_plans_yolo [--quick] [--seeds 0 1 2] [--out experiments/results]

The YOLOv8n row of :mod:`experiments.trained_plans`, on detection: YOLOv8n is trained from its yaml with
ultralytics' own trainer on prunefx's embedded synthetic shapes set (:data:`DATA`; the same images for every seed,
the seed is the trainer's) with :data:`RECIPE` to a plateau, and cached under ``.cache/experiments/trained_plans/``
keyed by seed, a digest of recipe and data and ``VERSION``. It is cut to keep 1/2 and 1/4 of its MACs by prunefx
(bn_scale, raw global threshold; measured sensitivity with the least-squares re-fit, calibrated on the first
:data:`CALIBRATION` x 16 training images as the validator feeds them) and by Torch-Pruning 1.6.1 (BNScalePruner
and MagnitudePruner, global and local, ratio bisected to the same MACs) after its YOLOv8 recipe: each C2f's
``cv1`` + ``chunk`` split, which Torch-Pruning cannot prune, replaced by two equivalent convolutions (:class:`C2fV2`).
Kept MACs: torch.utils.flop_counter on one batch-1 image at the training size for every row. mAP50-95: ultralytics'
DetectionValidator on the synthetic val split, before any training and after the same fine-tune
(:data:`FINETUNE`, last epoch's EMA weights). The prunefx model is saved and read back as an ordinary ultralytics
checkpoint (weights-only) before it is evaluated and fine-tuned. Rows go to ``trained_plans_yolo.{csv,md}`` with
the columns of trained_plans (top-1 there, mAP50-95 here).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from experiments import _table as table
from experiments.trained_plans import CACHE, FIELDS, TARGETS, bisect_cut, cell, describe_machine

VERSION = 1  # bump when the model, the data or the recipe's meaning changes
# The embedded shapes set at 64 px (4 classes, 1-4 objects of 15-35% of the side): small enough for 2 CPU cores.
DATA = {"n_train": 384, "n_val": 96, "imgsz": 64, "seed": 0}
# Baseline training, ultralytics keys; SGD as configs/yolo.yaml (its 'auto' picks AdamW and ignores lr0), no mosaic.
RECIPE = {"imgsz": 64, "epochs": 60, "batch": 16, "nbs": 16, "optimizer": "SGD", "lr0": 0.01, "warmup_epochs": 1,
          "mosaic": 0.0, "close_mosaic": 0}
# The fixed short fine-tune of every cut: no warm-up (ultralytics' warm-up starts biases at lr 0.1).
FINETUNE = {**RECIPE, "epochs": 3, "warmup_epochs": 0}
QUICK_DATA = {"n_train": 32, "n_val": 16, "imgsz": 64, "seed": 0}
QUICK = {**RECIPE, "epochs": 1}
CALIBRATION = 8  # batches of 16 training images for sensitivity and re-fit
OURS = [("raw", "none"), ("sensitivity", "refit")]
THEIRS = ["tp_bn_global", "tp_bn_local", "tp_l2_global", "tp_l2_local"]


def _digest(*parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def dataset(params: dict, cache: Path) -> str:
    """The data yaml of the embedded shapes set with ``params``, made on first use under ``cache``."""
    from prunefx.data.detection import make_shapes_dataset

    return str(make_shapes_dataset(cache / "data" / f"shapes-{_digest(params)}", **params))


def train_args(recipe: dict, seed: int, project: Path, name: str, data: str) -> dict:
    from prunefx.integrations.ultralytics.env import cpu_train_kwargs

    return cpu_train_kwargs(**recipe, data=data, seed=seed, deterministic=True, project=str(project), name=name,
                            val=False, verbose=False)


def baseline(seed: int, recipe: dict, data_params: dict, cache: Path, runs: Path) -> tuple[nn.Module, str]:
    """The trained YOLOv8n (eval mode), from the cache when it holds it."""
    from prunefx.integrations.ultralytics.io import load_yolo
    from prunefx.integrations.ultralytics.train import train_yolo

    data = dataset(data_params, cache)
    path = cache / (f"yolov8n-seed{seed}-img{recipe['imgsz']}-ep{recipe['epochs']}-{_digest(recipe, data_params)}"
                    f"-v{VERSION}.pt")
    if not path.is_file():
        _, last = train_yolo("yolov8n.yaml", train_args(recipe, seed, runs, f"baseline-seed{seed}", data))
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(last, path)  # the last epoch (EMA), not the best: a fixed recipe's result
    return load_yolo(path).eval(), data


def training_record(run: Path) -> tuple[float, list[float]] | None:
    """Seconds and per-epoch train loss (box + cls + dfl) of an ultralytics run, from its results.csv."""
    rows = table.read_csv(run / "results.csv") if (run / "results.csv").is_file() else []
    if not rows:
        return None
    return float(rows[-1]["time"]), [sum(v for k, v in r.items() if k.startswith("train/")) for r in rows]


def validate(model: nn.Module, data: str, imgsz: int, project: Path) -> float:
    """mAP50-95 of ``model`` (in memory, on a copy) on the val split, as ``yolo val`` computes it."""
    from ultralytics.models.yolo.detect import DetectionValidator

    args = {"data": data, "imgsz": imgsz, "batch": 16, "device": "cpu", "workers": 0, "plots": False,
            "verbose": False, "conf": 0.001, "iou": 0.7, "project": str(project), "name": "val", "exist_ok": True}
    stats = DetectionValidator(args=args)(model=copy.deepcopy(model).float().eval())
    return float(stats["metrics/mAP50-95(B)"])


def macs(model: nn.Module, imgsz: int) -> float:
    """Multiply-accumulates of one batch-1 forward by torch.utils.flop_counter (every row is counted the same way)."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        copy.deepcopy(model).eval()(torch.zeros(1, 3, imgsz, imgsz))
    return counter.get_total_flops() / 2


def _prunefx(model: nn.Module, imgsz: int, keep: float, method: str, calibration: list) -> nn.Module:
    """``model`` cut by prunefx with bn_scale scores, as configs/yolo.yaml's pipeline calls it."""
    import prunefx

    refit = method == "sensitivity"
    cfg = prunefx.PlanConfig(flops=keep, scope="global" if method == "raw" else "sensitivity")
    r = prunefx.prune(model, torch.zeros(1, 3, imgsz, imgsz), cfg, criterion="bn_scale", refit=refit,
                      sensitivity_cache=None, calibration=calibration if refit else None)
    assert r.verified is not None and r.verified.accepted, r.verified
    return r.model


class C2fV2(nn.Module):
    """C2f with its ``cv1`` + ``chunk(2)`` split done by two convolutions: same function, prunable by Torch-Pruning."""

    def __init__(self, c2f: nn.Module) -> None:
        super().__init__()
        from ultralytics.nn.modules.conv import Conv

        conv, bn = c2f.cv1.conv, c2f.cv1.bn
        c = conv.out_channels // 2
        self.cv0, self.cv1 = Conv(conv.in_channels, c, 1, 1), Conv(conv.in_channels, c, 1, 1)
        for half, part in ((self.cv0, slice(0, c)), (self.cv1, slice(c, 2 * c))):
            half.conv.weight.data.copy_(conv.weight.data[part])
            for name in ("weight", "bias", "running_mean", "running_var"):
                getattr(half.bn, name).data.copy_(getattr(bn, name).data[part])
            half.bn.eps, half.bn.momentum, half.act = bn.eps, bn.momentum, c2f.cv1.act
        self.cv2, self.m = c2f.cv2, c2f.m
        for attr in ("i", "f", "type", "np"):  # ultralytics' forward routes layers by these
            if hasattr(c2f, attr):
                setattr(self, attr, getattr(c2f, attr))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv0(x), self.cv1(x)]
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


def with_c2f_v2(model: nn.Module, imgsz: int) -> nn.Module:
    """A copy of ``model`` with every C2f replaced by :class:`C2fV2`, checked to compute the same outputs."""
    from ultralytics.nn.modules.block import C2f

    m = copy.deepcopy(model).eval()
    for i, layer in enumerate(m.model):
        if type(layer) is C2f:
            m.model[i] = C2fV2(layer)
    m.eval()  # the new convolutions' BatchNorms are built in training mode
    x = torch.rand(2, 3, imgsz, imgsz)
    with torch.no_grad():
        ref, got = model.eval()(x), m(x)
    ref, got = (ref[0] if isinstance(ref, (tuple, list)) else ref), (got[0] if isinstance(got, (tuple, list)) else got)
    assert torch.allclose(ref, got, atol=1e-4, rtol=1e-4), (ref - got).abs().max()
    return m


def _torch_pruning(v2: nn.Module, imgsz: int, keep: float, method: str, full: float) -> nn.Module:
    """Torch-Pruning's pruner on the C2fV2 model, the pruning ratio bisected until the MACs kept match ``keep``."""
    import torch_pruning as tp

    kind, scope = method.split("_")[1:]
    x = torch.zeros(1, 3, imgsz, imgsz)

    def cut(ratio: float) -> nn.Module:
        m = copy.deepcopy(v2)
        for p in m.parameters():  # the DFL conv is frozen; Torch-Pruning traces the autograd graph
            p.requires_grad_(True)
        head = m.model[-1]
        # The prediction convs and the DFL fix the outputs' layout (Torch-Pruning's example ignores the whole
        # Detect head; this leaves its inner convs prunable, as prunefx prunes them).
        ignored = [head.dfl, *(seq[-1] for seq in (*head.cv2, *head.cv3))]
        imp = tp.importance.BNScaleImportance() if kind == "bn" else tp.importance.MagnitudeImportance(p=2)
        cls = tp.pruner.BNScalePruner if kind == "bn" else tp.pruner.MagnitudePruner
        cls(m, x, importance=imp, pruning_ratio=ratio, global_pruning=scope == "global", ignored_layers=ignored,
            max_pruning_ratio=0.9).step()
        return m.eval()

    return bisect_cut(cut, lambda m: macs(m, imgsz) / full, keep, steps=10)


def finetune(model: nn.Module, recipe: dict, seed: int, data: str, runs: Path, name: str, trust: bool) -> nn.Module:
    """``model`` after the fixed fine-tune by ultralytics' trainer (the module handed over; last epoch's EMA)."""
    from prunefx.integrations.ultralytics.io import load_yolo, ultralytics_loading
    from prunefx.integrations.ultralytics.train import TrainHooks, train_yolo

    m = copy.deepcopy(model)
    # trust: the C2fV2 model's checkpoints (its class is outside ultralytics' allow-list), written by this process
    with warnings.catch_warnings(), ultralytics_loading(trust_checkpoint=trust):
        warnings.simplefilter("ignore")
        _, last = train_yolo(m, train_args(recipe, seed, runs, name, data), hooks=TrainHooks.for_model(m))
        return load_yolo(last, trust_checkpoint=trust).eval()


def scratch(pruned: nn.Module, recipe: dict, seed: int, data: str, runs: Path, name: str) -> nn.Module:
    """The control: ``pruned``'s architecture re-initialised as ultralytics builds it, trained with the baseline's
    recipe (its epochs and warm-up)."""
    return finetune(reinitialised(pruned, seed + 1000), recipe, seed + 1000, data, runs, name, trust=False)


def reinitialised(model: nn.Module, seed: int) -> nn.Module:
    """A copy of ``model`` with fresh weights, as ultralytics initialises a new model."""
    m = copy.deepcopy(model)
    torch.manual_seed(seed)
    for mod in m.modules():
        # a layer whose weights never train is part of the architecture (the DFL's fixed arange projection)
        if hasattr(mod, "reset_parameters") and any(p.requires_grad for p in mod.parameters(recurse=False)):
            mod.reset_parameters()
    head = m.model[-1]
    if hasattr(head, "bias_init"):  # ultralytics' Detect prior for the class and box biases (needs the strides)
        head.bias_init()
    return m


def _row(base, v2, method: str, keep: float, full: float, data: str, imgsz: int, calibration: list, ft: dict,
         seed: int, args, tag: str, stages: dict) -> dict:
    """Cut, evaluate, fine-tune and evaluate one method; the stage running is kept in ``stages['_stage']``."""
    from prunefx.integrations.ultralytics.io import load_yolo, save_yolo

    stages["_stage"] = "the cut"
    start = time.perf_counter()
    ours = not method.startswith("tp_")
    if ours:
        m = _prunefx(copy.deepcopy(base), imgsz, keep, method, calibration)
    else:
        m = _torch_pruning(v2, imgsz, keep, method, full)
    seconds = time.perf_counter() - start
    if ours:  # an ordinary ultralytics checkpoint: written, and read back weights-only
        m = load_yolo(save_yolo(m, args.runs / f"{tag}.pt")).eval()
    kept = macs(m, imgsz) / full
    stages["_stage"] = "validation after the cut"
    t0 = time.perf_counter()
    cut_map = validate(m, data, imgsz, args.runs)
    stages["_stage"] = "the fine-tune"
    t1 = time.perf_counter()
    tuned = finetune(m, ft, seed, data, args.runs, tag, trust=not ours)
    t2 = time.perf_counter()
    torch.set_num_threads(args.threads)
    stages["_stage"] = "validation after the fine-tune"
    tuned_map = validate(tuned, data, imgsz, args.runs)
    stages.setdefault("cut", []).append(seconds)
    stages.setdefault("validation", []).append(t1 - t0)
    stages.setdefault("fine-tune", []).append(t2 - t1)
    return {"macs_kept": kept, "cut": cut_map, "finetuned": tuned_map, "seconds": seconds}


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="1 seed, 2x only, raw + sensitivity/refit + tp_l2_global, 1-epoch recipe on 32 images")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    ap.add_argument("--cache", type=Path, default=CACHE, help="where trained baselines are kept")
    ap.add_argument("--runs", type=Path, default=table.RUNS / "trained_plans_yolo")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scratch", action="store_true",
                    help="also train prunefx's raw architecture from scratch with the baseline's recipe (the control)")
    ap.add_argument("--controls-only", action="store_true",
                    help="only the from-scratch controls, from the raw cuts an earlier run left in --runs; writes "
                         "trained_plans_yolo_controls.csv/.md for --combine")
    ap.add_argument("--combine", nargs="+", type=Path, metavar="CSV",
                    help="write trained_plans_yolo.csv/.md from these runs' CSVs (run nothing)")
    args = ap.parse_args(argv)
    if args.combine:
        rows = [r for path in args.combine for r in table.read_csv(path)]
        runs = []
        for path in args.combine:  # each run's own lines, read from the .md beside its CSV
            md = path.with_suffix(".md")
            lines = [line for line in md.read_text().splitlines() if line.startswith(RUN_LINES)] if md.is_file() else []
            runs.append([f"{line} ({path.stem}, seeds {sorted({r['seed'] for r in table.read_csv(path)})})"
                         for line in lines] or [f"Machine: not recorded ({md.name} missing)"])
        return _write(rows, args, RECIPE, FINETUNE, DATA, "trained_plans_yolo", runs)
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()
    from prunefx.integrations.ultralytics.calibration import calibration_images

    recipe, ft, data_params = (QUICK, {**FINETUNE, "epochs": 1}, QUICK_DATA) if args.quick else (RECIPE, FINETUNE, DATA)
    seeds = args.seeds[:1] if args.quick else args.seeds
    targets = {"2x": 0.5} if args.quick else TARGETS
    theirs = THEIRS[2:3] if args.quick else THEIRS
    if importlib.util.find_spec("torch_pruning") is None:  # the experiments extra: its rows are left out
        print("Torch-Pruning is not installed: its rows are left out (pip install torch-pruning==1.6.1)")
        theirs = []
    runs = [*OURS, *((t, "none") for t in theirs)]
    imgsz = recipe["imgsz"]
    stem = "trained_plans_yolo_quick" if args.quick else "trained_plans_yolo"
    if args.controls_only:
        runs, args.scratch, stem = [], True, f"{stem}_controls"
    # ultralytics' select_device() sets torch to cpu_count - 1 threads for its trainer and validator
    from ultralytics.utils import NUM_THREADS

    machine = describe_machine(table.machine_info(threads=f"{args.threads} for the cuts, {NUM_THREADS} in ultralytics' "
                                                  "trainer and validator (it sets cpu_count - 1)"))
    rows, stages, losses = [], {}, {}
    for seed in seeds:
        torch.set_num_threads(args.threads)
        base, data = baseline(seed, recipe, data_params, args.cache, args.runs)
        record = training_record(args.runs / f"baseline-seed{seed}")
        if record is not None:  # the run that trained the cached weights, when it is still on disk
            stages.setdefault("baseline training", []).append(record[0])
            losses[seed] = record[1]
        torch.set_num_threads(args.threads)  # ultralytics' trainer changes torch's thread count
        full = macs(base, imgsz)
        start = time.perf_counter()
        base_map = validate(base, data, imgsz, args.runs)
        stages.setdefault("validation", []).append(time.perf_counter() - start)
        calibration = calibration_images(data, "detect", imgsz, CALIBRATION)
        v2 = with_c2f_v2(base, imgsz) if any(m.startswith("tp_") for m, _ in runs) else None
        for tname, keep in targets.items():
            for method, recovery in runs:
                tag = f"seed{seed}-{tname}-{method}-{recovery}"
                row = {"model": "yolov8n", "seed": seed, "target": tname, "method": method, "recovery": recovery,
                       "baseline": base_map}
                try:
                    row.update(_row(base, v2, method, keep, full, data, imgsz, calibration, ft, seed, args, tag,
                                    stages))
                except Exception as exc:  # noqa: BLE001 -- a pruner that fails or breaks the model is a result: the row says so
                    print(f"{tag}: {type(exc).__name__}: {exc}", flush=True)
                    row["error"] = f"{type(exc).__name__} in {stages.get('_stage', 'the cut')}"
                rows.append(row)
                print(rows[-1], flush=True)
                _write(rows, args, recipe, ft, data_params, stem, [_run_lines(machine, stages, losses)])
            if args.scratch:
                rows.append(_scratch_row(seed, tname, base_map, recipe, data, imgsz, full, args, stages))
                print(rows[-1], flush=True)
                _write(rows, args, recipe, ft, data_params, stem, [_run_lines(machine, stages, losses)])
    return _write(rows, args, recipe, ft, data_params, stem, [_run_lines(machine, stages, losses)])


def _scratch_row(seed: int, tname: str, base_map: float, recipe: dict, data: str, imgsz: int, full: float, args,
                 stages: dict) -> dict:
    """The from-scratch control of one target: prunefx's raw-global architecture (the checkpoint its row wrote)."""
    from prunefx.integrations.ultralytics.io import load_yolo

    row = {"model": "yolov8n", "seed": seed, "target": tname, "method": "scratch", "recovery": "none",
           "baseline": base_map, "cut": None}
    start = time.perf_counter()
    try:
        pruned = load_yolo(args.runs / f"seed{seed}-{tname}-raw-none.pt")
        trained = scratch(pruned, recipe, seed, data, args.runs, f"seed{seed}-{tname}-scratch")
        torch.set_num_threads(args.threads)
        row.update(macs_kept=macs(trained, imgsz) / full, finetuned=validate(trained, data, imgsz, args.runs),
                   seconds=time.perf_counter() - start)
        stages.setdefault("scratch training", []).append(row["seconds"])
    except Exception as exc:  # noqa: BLE001 -- a control that fails is a row that says so
        print(f"seed{seed}-{tname}-scratch: {type(exc).__name__}: {exc}", flush=True)
        row["error"] = f"{type(exc).__name__} in the scratch training"
    return row


def _write(rows: list[dict], args, recipe: dict, ft: dict, data_params: dict, stem: str, runs: list[list[str]]
           ) -> Path:
    """The CSV, and the table rendered from the CSV's (rounded) rows, as --combine renders it."""
    path = table.write_csv(rows, args.out / f"{stem}.csv", [*FIELDS, "error"], digits=4)
    return _markdown(table.read_csv(path), args, recipe, ft, data_params, stem, runs)


def _run_lines(machine: str, stages: dict[str, list[float]], losses: dict[int, list[float]]) -> list[str]:
    """The lines that describe one run: its machine, its baselines' train loss, its seconds per stage."""
    return [machine,
            *[f"Baseline seed {seed}: train loss (box + cls + dfl) epoch 1 {v[0]:.3f}; epochs {len(v) - 9}-{len(v)}: "
              + ", ".join(f"{x:.3f}" for x in v[-10:]) + "." for seed, v in losses.items()],
            "Seconds per stage (median, count): " + ", ".join(
                f"{k} {statistics.median(v):.0f} ({len(v)})" for k, v in stages.items() if k != "_stage") + "."]


RUN_LINES = ("Machine: ", "Baseline seed ", "Seconds per stage ")


def _markdown(rows: list[dict], args, recipe: dict, ft: dict, data_params: dict, stem: str,
              runs: list[list[str]]) -> Path:
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        "# Plans on a trained YOLOv8n: mAP50-95 right after the cut and after a short fine-tune", "",
        f"Command: `python -m experiments.trained_plans_yolo{' --quick' if args.quick else ''} --seeds "
        f"{' '.join(map(str, seeds))}`{' (runs of some seeds each, combined)' if args.combine else ''}. "
        "YOLOv8n trained from yolov8n.yaml by ultralytics' trainer on prunefx's "
        f"embedded synthetic shapes set {data_params} (the same images for every seed; the seed is ultralytics' "
        f"training seed, deterministic=True), recipe {recipe} (last epoch's EMA weights, cached under "
        f"`.cache/experiments/trained_plans/yolov8n-seed<s>-img{recipe['imgsz']}-ep{recipe['epochs']}-"
        f"{_digest(recipe, data_params)}-v{VERSION}.pt`); fine-tune {ft['epochs']} epochs, same recipe without "
        "warm-up, last epoch's EMA weights. mAP50-95 by ultralytics' DetectionValidator on the synthetic val split "
        "(conf 0.001, iou 0.7); mean ± stdev over seeds. MACs kept counted by torch.utils.flop_counter on one "
        f"{recipe['imgsz']}x{recipe['imgsz']} image for every row. prunefx: bn_scale scores; raw = one global "
        "threshold; sensitivity + refit = measured sensitivity allocation with the least-squares re-fit in the loop "
        f"and after the cut ({CALIBRATION} x 16 of the first training images, as the validator feeds them); the "
        "prunefx model is written and read back as an ordinary ultralytics checkpoint (weights-only) first. "
        "Torch-Pruning 1.6.1 after its YOLOv8 recipe: every C2f replaced by C2fV2 (the cv1 + chunk split computed "
        "by two convolutions, checked equal), the Detect head's prediction convs and DFL ignored (its example "
        "ignores the whole head), max_pruning_ratio 0.9, pruning ratio bisected (10 steps) to the MACs; its rows "
        "are fine-tuned as C2fV2 models. scratch: prunefx's raw-global architecture re-initialised and trained with "
        "the baseline's recipe (its mAP in the fine-tune column; s: its training seconds). "
        "s: median seconds of the cut (Torch-Pruning: the whole bisection, 10 cuts).", "",
        *[line for run in runs for line in (*run, "")],
        "| model | target | method | recovery | MACs kept | baseline | right after the cut | after fine-tune | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r["target"], r["method"], r["recovery"]) for r in rows))
    for target, method, recovery in keys:
        sel = [r for r in rows if (r["target"], r["method"], r["recovery"]) == (target, method, recovery)]
        ok = [r for r in sel if not r.get("error")]
        failed = [r for r in sel if r.get("error")]
        note = f" ({len(failed)} of {len(sel)} seeds failed: {failed[0]['error']})" if failed else ""
        if not ok:
            lines.append(f"| yolov8n | {target} | {method} | {recovery} | failed{note} | "
                         f"{cell([r['baseline'] for r in sel])} | | | |")
            continue
        lines.append(
            f"| yolov8n | {target} | {method} | {recovery} | {statistics.mean(r['macs_kept'] for r in ok):.3f}{note} | "
            f"{cell([r['baseline'] for r in ok])} | {cell([r['cut'] for r in ok])} | "
            f"{cell([r['finetuned'] for r in ok])} | {statistics.median(r['seconds'] for r in ok):.1f} |")
    path = args.out / f"{stem}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


if __name__ == "__main__":
    os.environ.setdefault("YOLO_OFFLINE", "1")
    main()
