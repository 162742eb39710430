"""Is pruning worth it? A pruned big model against the small models of the same budget trained from scratch.

    python -m experiments.worth_it [--part classify|detect|all] [--quick] [--resume] [--background]
        [--seeds 0 1 2] [--epochs E] [--out experiments/results] [--runs runs/experiments/worth_it]

Classification (the project's synthetic set): per seed, a ResNet-18 baseline trained for E epochs, then per
target (2x, 4x fewer MACs): network slimming (bn_scale, selective sparsity) + fine-tuning with the pipeline's
controls (``prune.controls: [narrow, scratch]``), and from the same baseline checkpoint: l1, taylor, and bn_scale
with distillation (``prune.finetune.distill``).

Detection (the hard shapes set, ``prune.data.hard``): per seed and family (yolov8, yolo11), the s model trained E
epochs (the stand-in for a pretrained checkpoint) pruned to the n model's GFLOPs and fine-tuned K = 10% and 30% of
E epochs, with the controls (the uniformly narrower s model); the n model trained from scratch for K and for the
whole budget; l1 and distillation from the same checkpoint.

Every cell is one run directory under ``--runs``; a finished cell with the same config is reused, an unfinished one
is continued with ``--resume`` (else replaced). ``--background`` starts the same command detached with --resume,
logging to ``<runs>/worth_it.log``. Tables: ``worth_it_<part>.{md,csv}`` (mean ± std over seeds).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments import _table as table

PARTS = ("classify", "detect")
CLS_TARGETS = {"2x": 0.5, "4x": 0.25}
FAMILIES = {"yolov8": ("yolov8s", "yolov8n"), "yolo11": ("yolo11s", "yolo11n")}
FIELDS = ["part", "group", "row", "seed", "epochs", "gflops", "params_m", "metric", "value", "minutes", "run"]


@dataclass(frozen=True)
class Sizes:
    """The protocol's size knobs: full, reduced (stated in the table header) or --quick."""

    seeds: tuple[int, ...] = (0, 1, 2)
    cls_epochs: int = 30
    cls_sparsity: int = 10
    cls_finetune: int = 10
    cls_data: Mapping[str, Any] = field(default_factory=lambda: {"n_train": 6000, "n_val": 1000, "n_test": 2000})
    cls_model: str = "torchvision:resnet18"
    cls_size: int = 32
    det_epochs: int = 100
    det_sparsity: int = 10
    det_imgsz: int = 160
    det_data: Mapping[str, Any] = field(default_factory=lambda: {"n_train": 1200, "n_val": 300, "imgsz": 160})
    det_batch: int = 32
    families: tuple[str, ...] = ("yolov8", "yolo11")
    threads: int = 2

    def ks(self) -> tuple[int, ...]:
        """Fine-tune epochs K: 10% and 30% of the baseline's."""
        return tuple(dict.fromkeys(max(1, round(f * self.det_epochs)) for f in (0.1, 0.3)))


QUICK = Sizes(seeds=(0,), cls_epochs=2, cls_sparsity=1, cls_finetune=1,
              cls_data={"n_train": 256, "n_val": 64, "n_test": 128}, cls_model="prunefx.zoo:bn_cnn_synthetic",
              cls_size=16, det_epochs=2, det_sparsity=1, det_imgsz=64,
              det_data={"n_train": 16, "n_val": 8, "imgsz": 64}, det_batch=8, families=("yolov8",), threads=1)


@dataclass(frozen=True)
class Cell:
    """One run: a pipeline config (``kind`` classify / detect) or a plain YOLO training (``kind`` train)."""

    part: str
    group: str  # the table section: 2x, 4x, yolov8, yolo11
    name: str  # run directory name
    kind: str
    config: Mapping[str, Any]
    seed: int


# ---- the protocol -----------------------------------------------------------------------------------------------


def classify_cells(sizes: Sizes, runs: Path) -> list[Cell]:
    cells = []
    for seed in sizes.seeds:
        first: Path | None = None
        for group, target in CLS_TARGETS.items():
            base = _cls_config(sizes, seed, target, runs)
            name = f"cls-s{seed}-{group}-bn_scale"
            recipe = copy.deepcopy(base)
            if first is not None:
                recipe["checkpoint"] = str(first / "weights" / "baseline.pt")
            recipe["prune"]["controls"] = ["narrow", "scratch"]
            cells.append(Cell("classify", group, name, "classify", _named(recipe, runs, name), seed))
            first = first or runs / name
            ckpt = str(first / "weights" / "baseline.pt")
            for variant, prune in (("l1", {"criterion": "l1", "sparsity": {"epochs": 0}}),
                                   ("taylor", {"criterion": "taylor", "sparsity": {"epochs": 0}}),
                                   ("bn_scale+kd", {"finetune": {**base["prune"]["finetune"], "distill": True}})):
                cfg = copy.deepcopy(base)
                cfg["checkpoint"] = ckpt
                cfg["prune"].update(copy.deepcopy(prune))
                vname = f"cls-s{seed}-{group}-{variant}"
                cells.append(Cell("classify", group, vname, "classify", _named(cfg, runs, vname), seed))
    return cells


def _cls_config(sizes: Sizes, seed: int, target: float, runs: Path) -> dict[str, Any]:
    return {
        "task": "classify", "model": sizes.cls_model, "checkpoint": None,
        "dataset": {"name": "synthetic", "image_size": sizes.cls_size, **sizes.cls_data},
        "epochs": sizes.cls_epochs, "batch": 128, "lr": 0.1, "weight_decay": 5.0e-4, "warmup_epochs": 1,
        "augment": ["crop"], "crop_pad": 2, "seed": seed, "threads": sizes.threads, "project": str(runs),
        "prune": {
            "criterion": "bn_scale", "target": {"flops": target}, "round_to": 8, "latency": False,
            "sparsity": {"epochs": sizes.cls_sparsity, "s": 1.0e-3, "schedule": "target", "target": 0.5,
                         "selective": True, "exclude_residual": True, "lr": 0.05},
            "finetune": {"epochs": sizes.cls_finetune, "lr": 0.02},
        },
    }  # fmt: skip


def detect_cells(sizes: Sizes, runs: Path) -> list[Cell]:
    cells = []
    for seed in sizes.seeds:
        for family in sizes.families:
            big, small = FAMILIES[family]
            target = _gflops_ratio(big, small, sizes.det_imgsz)
            first: Path | None = None
            for k in sizes.ks():
                cfg = _det_config(sizes, seed, big, target, k, runs)
                name = f"det-s{seed}-{family}-K{k}-bn_scale"
                if first is not None:
                    cfg["model"] = str(first / "weights" / "baseline.pt")
                    cfg["epochs"] = sizes.det_epochs  # the checkpoint's own training, counted in the controls' budget
                cfg["prune"]["controls"] = ["narrow", "scratch"]
                cells.append(Cell("detect", family, name, "detect", _named(cfg, runs, name), seed))
                first = first or runs / name
                ckpt = str(first / "weights" / "baseline.pt")
                for variant, prune in (("l1", {"criterion": "l1", "sparsity": {"epochs": 0}}),
                                       ("bn_scale+kd", {"finetune": {"epochs": k, "distill": True}})):
                    v = _det_config(sizes, seed, big, target, k, runs)
                    v["model"] = ckpt
                    v["prune"].update(copy.deepcopy(prune))
                    vname = f"det-s{seed}-{family}-K{k}-{variant}"
                    cells.append(Cell("detect", family, vname, "detect", _named(v, runs, vname), seed))
                plain = {"model": f"{small}.yaml", "epochs": k, "seed": seed, "imgsz": sizes.det_imgsz,
                         "batch": sizes.det_batch, "data": dict(sizes.det_data)}
                cells.append(Cell("detect", family, f"det-s{seed}-{family}-{small}-{k}ep", "train", plain, seed))
            total = sizes.det_epochs + sizes.det_sparsity + max(sizes.ks())
            plain = {"model": f"{small}.yaml", "epochs": total, "seed": seed, "imgsz": sizes.det_imgsz,
                     "batch": sizes.det_batch, "data": dict(sizes.det_data)}
            cells.append(Cell("detect", family, f"det-s{seed}-{family}-{small}-{total}ep", "train", plain, seed))
    return cells


def _det_config(sizes: Sizes, seed: int, model: str, target: float, k: int, runs: Path) -> dict[str, Any]:
    return {
        "model": f"{model}.yaml", "data": None, "epochs": sizes.det_epochs, "imgsz": sizes.det_imgsz,
        "batch": sizes.det_batch, "device": "cpu", "workers": 0, "seed": seed, "project": str(runs),
        "prune": {
            "data": {**sizes.det_data, "hard": True, "seed": 0},
            "criterion": "bn_scale", "target": {"flops": target}, "round_to": 8, "latency": False,
            "sparsity": {"epochs": sizes.det_sparsity, "schedule": "target", "target": 0.5, "selective": True,
                         "s_max": 0.2},
            "finetune": {"epochs": k},
        },
    }  # fmt: skip


def _gflops_ratio(big: str, small: str, imgsz: int) -> float:
    """The small model's GFLOPs as a fraction of the big one's (20 classes, at ``imgsz``)."""
    from ultralytics.nn.tasks import DetectionModel

    from prunefx.integrations.ultralytics.gflops import ultralytics_gflops

    g = [ultralytics_gflops(DetectionModel(f"{m}.yaml", nc=20, verbose=False), imgsz) for m in (big, small)]
    return round(g[1] / g[0], 4)


def _named(config: dict[str, Any], runs: Path, name: str) -> dict[str, Any]:
    return {**config, "project": str(runs), "name": name}


# ---- running cells ----------------------------------------------------------------------------------------------


def run_cell(cell: Cell, runs: Path, resume: bool, log: Callable[[str], None] = print) -> Path:
    """Run ``cell`` (or reuse its finished run with the same config); returns its run directory."""
    root = runs / cell.name
    if cell.kind == "train":
        return _run_plain(cell, root, log)
    import yaml

    from prunefx.pipeline.rundir import RunDir, RunError

    config = dict(cell.config)
    try:
        state = RunDir.reload(root).state
        same = _run_free(yaml.safe_load((root / "config.yaml").read_text())) == _run_free(config)
    except (OSError, ValueError, RunError):
        state, same = {}, False
    if same and state.get("status") == "complete":
        log(f"  {cell.name}: finished earlier, reused")
        return root
    config |= {"resume": True} if (resume and same) else {"exist_ok": True}
    if cell.kind == "classify":
        from prunefx.pipeline.backends.classify import ClassifyJob, run_classify

        run_classify(ClassifyJob.from_config(config, config_name=cell.name), log=lambda m: log(f"    {m}"))
    else:
        from prunefx.pipeline.backends.yolo import YoloJob, run_yolo

        run_yolo(YoloJob.from_config(config, config_name=cell.name), log=lambda m: log(f"    {m}"))
    return root


def _run_free(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as the run directory stores it (without resume / exist_ok)."""
    return {k: v for k, v in config.items() if k not in ("resume", "exist_ok")}


def _run_plain(cell: Cell, root: Path, log: Callable[[str], None]) -> Path:
    """The small YOLO model trained from scratch (no pruning); result.json marks it finished."""
    from prunefx.integrations.ultralytics.env import cpu_train_kwargs, setup_offline

    setup_offline()
    from prunefx._io import atomic_write
    from prunefx.data.detection_hard import make_hard_shapes_dataset
    from prunefx.integrations.ultralytics.env import default_config_dir
    from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
    from prunefx.integrations.ultralytics.train import load_yolo, train_yolo
    from prunefx.pipeline.backends.yolo import evaluate_yolo

    done = root / "result.json"
    if done.is_file() and json.loads(done.read_text()).get("config") == dict(cell.config):
        log(f"  {cell.name}: finished earlier, reused")
        return root
    c = cell.config
    data_params = {**c["data"], "seed": 0}
    tag = "-".join(f"{v}" for v in data_params.values())
    data = str(make_hard_shapes_dataset(default_config_dir().parent / "datasets" / f"shapes-hard-{tag}",
                                        **data_params))
    start = time.perf_counter()
    args = cpu_train_kwargs(data=data, epochs=c["epochs"], imgsz=c["imgsz"], batch=c["batch"], seed=c["seed"],
                            project=str(root), name="train", exist_ok=True, optimizer="SGD", lr0=0.01)
    best, _ = train_yolo(c["model"], args)
    metrics = evaluate_yolo(best, data, {"imgsz": c["imgsz"], "batch": c["batch"]}, root / "val", "plain",
                            log=lambda m: log(f"    {m}"))
    model = load_yolo(best)
    result = {"config": dict(c), "metrics": metrics, "gflops": ultralytics_gflops(model, c["imgsz"]),
              "params": sum(p.numel() for p in model.parameters()), "minutes": (time.perf_counter() - start) / 60}
    atomic_write(done, (json.dumps(result, indent=2) + "\n").encode())
    return root


# ---- tables -----------------------------------------------------------------------------------------------------


def rows_of(cell: Cell, root: Path) -> list[dict[str, Any]]:
    """The table rows one finished cell contributes (metric values as fractions)."""
    base = {"part": cell.part, "group": cell.group, "seed": cell.seed, "run": str(root)}
    if cell.kind == "train":
        r = json.loads((root / "result.json").read_text())
        small = cell.config["model"].removesuffix(".yaml")
        return [{**base, "row": f"{small} from scratch, {cell.config['epochs']} ep",
                 "epochs": cell.config["epochs"], "gflops": r["gflops"], "params_m": r["params"] / 1e6,
                 "metric": "map50_95", "value": r["metrics"]["map50_95"], "minutes": r["minutes"]}]
    report = json.loads((root / "report.json").read_text())
    state = json.loads((root / "state.json").read_text())
    metric = "top1" if cell.kind == "classify" else "map50_95"
    minutes = sum(v.get("seconds") or 0 for k, v in state["stages"].items() if k != "controls") / 60
    variant = cell.name.rsplit("-", 1)[1]
    k = cell.config["prune"]["finetune"]["epochs"]
    label = f"pruned {variant}, fine-tuned {k} ep" if cell.kind == "classify" else f"pruned {variant}, K={k}"
    stages, rows = report["stages"], []

    def add(row: str, stage: Mapping[str, Any], epochs: int | None, mins: float | None = None) -> None:
        gflops = stage.get("metrics", {}).get(f"yolo_gflops@{cell.config.get('imgsz')}", stage["flops"] / 1e9)
        rows.append({**base, "row": row, "epochs": epochs, "gflops": gflops, "params_m": stage["params"] / 1e6,
                     "metric": metric, "value": stage["metrics"].get(metric), "minutes": mins})

    total = cell.config["epochs"] + cell.config["prune"]["sparsity"]["epochs"] + k
    if variant == "bn_scale" and not cell.config.get("checkpoint") and not str(cell.config["model"]).endswith(".pt"):
        add("baseline (unpruned)", stages["baseline"], cell.config["epochs"])
    add(label, stages.get("finetuned", stages["pruned"]), total, minutes)
    for c in (report.get("controls") or {}).get("runs", ()):
        what = {"narrow": "uniformly narrower, from scratch, total epochs",
                "narrow_ft": "uniformly narrower, from scratch, K epochs" if cell.kind == "detect"
                else "uniformly narrower, from scratch, fine-tune epochs",
                "scratch": "pruned architecture from scratch, total epochs"}[c["name"]]
        add(f"{what} [{variant}, ft {k}]", c, c["epochs"])
    return rows


def summarise(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± std over seeds of every (part, group, row)."""
    keyed: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        keyed.setdefault((r["part"], r["group"], r["row"]), []).append(r)
    out = []
    for (part, group, row), rs in keyed.items():
        values = [r["value"] for r in rs if r["value"] is not None]
        out.append({"part": part, "group": group, "row": row, "seeds": len(values), "epochs": rs[0]["epochs"],
                    "gflops": statistics.mean(r["gflops"] for r in rs), "params_m": rs[0]["params_m"],
                    "metric": rs[0]["metric"], "mean": statistics.mean(values) if values else None,
                    "std": statistics.stdev(values) if len(values) > 1 else None,
                    "minutes": statistics.mean(m) if (m := [r["minutes"] for r in rs if r["minutes"]]) else None})
    return out


def verdicts(cells: Sequence[Cell], runs: Path) -> list[str]:
    """The verdict that ends each main run's report.md (one line per seed and group)."""
    lines = []
    for cell in cells:
        if cell.kind == "train" or not cell.name.endswith("-bn_scale"):
            continue
        md = (runs / cell.name / "report.md")
        if md.is_file():
            text = md.read_text().split("## Verdict", 1)[-1].strip().splitlines()
            lines.append(f"- `{cell.name}`: " + " ".join(t for t in text[1:] if t))
    return lines


def write_tables(part: str, cells: Sequence[Cell], runs: Path, out: Path, sizes: Sizes, header: Mapping[str, str],
                 missing: Sequence[str]) -> Path:
    rows = [r for c in cells if (runs / c.name).is_dir() and _finished(c, runs) for r in rows_of(c, runs / c.name)]
    table.write_csv(rows, out / f"worth_it_{part}.csv", FIELDS, digits=5)
    summary = summarise(rows)
    info = dict(header)
    lines = [f"# Is pruning worth it? ({part})", "", "## Summary", "",
             f"Command: `{info.pop('command')}`", "",
             f"Machine: {info.pop('machine')}; load average at start (1/5/15 min) "
             f"{info.pop('load average at start (1/5/15 min)')}; torch threads {info.pop('torch threads')}; "
             + "; ".join(f"{k} {v}" for k, v in info.items() if k != "sizes"), "",
             f"Setup: {info['sizes']}. Cells finished: {sum(_finished(c, runs) for c in cells)} of {len(cells)}"
             + (f"; failed: {', '.join(missing)}" if missing else "") + ".", ""]
    for group in dict.fromkeys(s["group"] for s in summary):
        sub = [s for s in summary if s["group"] == group]
        lines += [f"**{group}** ({sub[0]['metric']}, mean ± std over the seeds; the number of seeds in brackets)", ""]
        lines += table.md_table(
            ["model", "epochs", "GFLOPs", "params (M)", sub[0]["metric"], "minutes/run"],
            [[s["row"], s["epochs"], f"{s['gflops']:.4g}", f"{s['params_m']:.4g}",
              (f"{s['mean']:.4f}" + (f" ± {s['std']:.4f}" if s["std"] is not None else "") + f" ({s['seeds']})")
              if s["mean"] is not None else "-", f"{s['minutes']:.1f}" if s["minutes"] else "-"] for s in sub])
        lines += ["", "minutes/run: a pruned row's run without its controls (baseline + sparsity + prune + fine-tune; "
                  "runs from a checkpoint: sparsity + prune + fine-tune); controls: their stage in the main run, "
                  f"{_controls_minutes(cells, runs, group)}.", ""]
    found = verdicts([c for c in cells if c.part == part], runs)
    if found:
        lines += ["Verdicts (the last lines of each main run's report.md):", "", *found, ""]
    path = out / f"worth_it_{part}.md"
    path.write_text("\n".join(lines))
    return path


def _controls_minutes(cells: Sequence[Cell], runs: Path, group: str) -> str:
    """Mean minutes of the controls stage (all controls of one run) over the group's finished main runs."""
    spent = []
    for c in cells:
        if c.group == group and c.kind != "train" and _finished(c, runs):
            stage = json.loads((runs / c.name / "state.json").read_text())["stages"].get("controls") or {}
            if not stage.get("skipped") and stage.get("seconds"):
                spent.append(stage["seconds"] / 60)
    return f"{statistics.mean(spent):.1f} min per run for all its controls" if spent else "none run"


def _finished(cell: Cell, runs: Path) -> bool:
    if cell.kind == "train":
        return (runs / cell.name / "result.json").is_file()
    try:
        return json.loads((runs / cell.name / "state.json").read_text()).get("status") == "complete"
    except (OSError, ValueError):
        return False


# ---- entry point ------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> list[Path]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=[*PARTS, "all"], default="all")
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes: 1 seed, 1-3 epochs, tiny data")
    ap.add_argument("--resume", action="store_true", help="continue unfinished cells instead of restarting them")
    ap.add_argument("--background", action="store_true", help="start this command detached (with --resume)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--epochs", type=int, default=None, help="baseline epochs (both parts); reduces the protocol")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="any Sizes field as JSON, e.g. --set det_epochs=20 --set 'families=[\"yolov8\"]'")
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    ap.add_argument("--runs", type=Path, default=None)
    ap.add_argument("--only-tables", action="store_true", help="only write the tables from the finished cells")
    args = ap.parse_args(argv)
    runs = args.runs or table.RUNS / ("worth_it_quick" if args.quick else "worth_it")
    if args.background:
        runs.mkdir(parents=True, exist_ok=True)
        rest = [a for a in argv if a != "--background"] + ["--resume"]
        with (runs / "worth_it.log").open("a") as logf:
            proc = subprocess.Popen([sys.executable, "-m", "experiments.worth_it", *rest], stdout=logf,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=table.ROOT)
        print(f"started pid {proc.pid}; log {runs / 'worth_it.log'}; continue later with --resume")
        return []
    sizes = _sizes(args)
    parts = PARTS if args.part == "all" else (args.part,)
    written = []
    for part in parts:
        shown = [a for a in argv if a not in ("--only-tables", "--resume", "--background")]
        header = {**table.machine_info(threads=sizes.threads), "command": "python -m experiments.worth_it "
                  + shlex.join(shown), "sizes": _describe(sizes, part)}
        if args.only_tables:  # the runs were made earlier: this process only read them
            header["tables"] = "re-rendered from the finished runs with --only-tables (load average at render time)"
        if part == "detect":
            from prunefx.integrations.ultralytics.env import setup_offline

            setup_offline()
        cells = classify_cells(sizes, runs) if part == "classify" else detect_cells(sizes, runs)
        missing = []
        for i, cell in enumerate(cells, 1):
            if args.only_tables:
                continue
            print(f"[{i}/{len(cells)}] {cell.name}", flush=True)
            try:
                run_cell(cell, runs, args.resume)
            except Exception as exc:  # noqa: BLE001 - a failed cell is listed in the table; the rest run
                print(f"  {cell.name} failed: {type(exc).__name__}: {exc}", flush=True)
                missing.append(cell.name)
            written.append(write_tables(part, cells, runs, args.out, sizes, header, missing))
        written.append(write_tables(part, cells, runs, args.out, sizes, header, missing))
    return list(dict.fromkeys(written))


def _sizes(args: argparse.Namespace) -> Sizes:
    import dataclasses

    sizes = QUICK if args.quick else Sizes()
    changes: dict[str, Any] = {}
    if args.seeds:
        changes["seeds"] = tuple(args.seeds)
    if args.epochs:
        changes |= {"cls_epochs": args.epochs, "det_epochs": args.epochs}
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in {f.name for f in dataclasses.fields(Sizes)}:
            raise SystemExit(f"--set {item}: unknown field {key!r}")
        parsed = json.loads(value)
        changes[key] = tuple(parsed) if isinstance(parsed, list) else parsed
    return dataclasses.replace(sizes, **changes)


def _describe(sizes: Sizes, part: str) -> str:
    if part == "classify":
        return (f"{sizes.cls_model} on the synthetic set {dict(sizes.cls_data)} at {sizes.cls_size} px; baseline "
                f"{sizes.cls_epochs} epochs, sparsity {sizes.cls_sparsity}, fine-tune {sizes.cls_finetune}; seeds "
                f"{list(sizes.seeds)}")
    return (f"hard shapes set {dict(sizes.det_data)}, imgsz {sizes.det_imgsz}, batch {sizes.det_batch}; baseline "
            f"{sizes.det_epochs} epochs, sparsity {sizes.det_sparsity}, K = {list(sizes.ks())}; families "
            f"{list(sizes.families)}; seeds {list(sizes.seeds)}")


if __name__ == "__main__":
    main()
