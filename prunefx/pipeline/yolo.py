"""The YOLO pipeline: baseline -> sparsity -> prune -> fine-tune -> report, with ultralytics' own trainer.

    job = YoloJob.from_config(load_config("configs/yolo.yaml", ["epochs=3"]), config_name="yolo")
    run = run_yolo(job)            # -> RunDir; run.root / "report.md", run.root / "weights" / "best.pt"

Every stage writes its artefacts into the run directory and is recorded in ``state.json`` only once they are
complete, so ``resume=true`` continues after the last finished stage. Weights are ordinary ultralytics
checkpoints: ``YOLO("weights/best.pt")`` validates, predicts and exports the pruned model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from prunefx._io import TRUST_HINT, atomic_write
from prunefx.errors import PrunefxError, UntrustedFileError
from prunefx.pipeline.config import ConfigError, PruneSpec, check_keys
from prunefx.pipeline.rundir import RunDir
from prunefx.pipeline.stages import check_pruned, prune_source

# Top-level keys prunefx consumes itself: the run directory (project/name), and how to open it.
RUN_KEYS = ("project", "name", "exist_ok", "resume", "trust_checkpoint")
STAGES = ("baseline", "sparsity", "prune", "finetune", "report")
# The embedded dataset (used when `data` is null): prunefx's synthetic shapes set; prune.data tunes it.
SYNTHETIC_DEFAULTS = {"n_train": 384, "n_val": 96, "imgsz": 128, "seed": 0}


def ultralytics_keys() -> set[str]:
    """Every key ultralytics' ``train``/``val`` accept (its default.yaml)."""
    from ultralytics.cfg import DEFAULT_CFG_DICT

    return set(DEFAULT_CFG_DICT)


@dataclass(frozen=True)
class YoloJob:
    """A validated YOLO pipeline config."""

    model: str  # a model yaml (trained from scratch for the baseline) or an ultralytics checkpoint .pt
    data: str | None  # an ultralytics data yaml; None = the embedded synthetic set
    train: Mapping[str, Any]  # ultralytics train arguments shared by every training stage
    prune: PruneSpec
    project: Path
    name: str
    resume: bool = False
    exist_ok: bool = False
    trust_checkpoint: bool = False  # unpickle checkpoints fully and eval model yamls (they can run code)
    synthetic: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)  # as given, for config.yaml

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, config_name: str = "yolo") -> YoloJob:
        """Validate every key before any work starts; prunefx's keys never reach ultralytics."""
        from prunefx.integrations.ultralytics.env import setup_offline

        setup_offline()  # before the first ultralytics import: it fixes its online flag and config dir then
        known = ultralytics_keys()
        check_keys(config, known | {"prune", "trust_checkpoint"},
                   "the config (top level: ultralytics keys, prunefx keys under prune:)")
        trust = config.get("trust_checkpoint", False)
        if not isinstance(trust, bool):
            raise ConfigError(f"trust_checkpoint must be true or false, got {trust!r}")
        prune_block = dict(config.get("prune") or {})
        synthetic = prune_block.pop("data", None) or {}
        check_keys(synthetic, SYNTHETIC_DEFAULTS, "prune.data (the embedded synthetic dataset)")
        for key, value in synthetic.items():
            least = 32 if key == "imgsz" else 0 if key == "seed" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"prune.data.{key} must be an integer >= {least}, got {value!r}")
        spec = PruneSpec.parse(prune_block, train_keys=known - {"model", "data", *RUN_KEYS})
        model = config.get("model")
        if not model or not isinstance(model, str):
            raise ConfigError("model is missing: give a model yaml (e.g. model=yolov8n.yaml) or a checkpoint .pt")
        data = config.get("data")
        if data is not None and not isinstance(data, str):
            raise ConfigError(
                f"data must be the path of an ultralytics data yaml (or null for the embedded set), got {data!r}"
            )
        train = {k: v for k, v in config.items() if k not in ("prune", "model", "data", *RUN_KEYS) and v is not None}
        task = _model_task(model, trust)
        if train.get("task", task) != task:
            raise ConfigError(
                f"task={train['task']} but {model} is a {task} model; drop task= or give a {train['task']} model"
            )
        train["task"] = task
        if spec.sparsity.start == "scratch" and spec.sparsity.epochs and model.endswith(".pt"):
            raise ConfigError(
                f"prune.sparsity.start=scratch trains from the model yaml, but model is the checkpoint "
                f"{model}; give its yaml (e.g. model=yolov8n.yaml) or use prune.sparsity.start=baseline"
            )
        _check_train_args(train)
        job = cls(
            model=model,
            data=data,
            train=train,
            prune=spec,
            project=Path(config.get("project") or "runs/prune"),
            name=str(config.get("name") or config_name),
            resume=bool(config.get("resume")),
            exist_ok=bool(config.get("exist_ok")),
            trust_checkpoint=trust,
            synthetic={**SYNTHETIC_DEFAULTS, **synthetic},
            config=dict(config),
        )
        job.check_inputs()
        return job

    @property
    def imgsz(self) -> int:
        return int(self.train.get("imgsz", 640))

    @property
    def task(self) -> str:
        return str(self.train["task"])

    def check_inputs(self) -> None:
        """Fail now, not after an hour of training: the data yaml and its images exist (the model: _model_task)."""
        if self.data is None:
            if self.task != "detect":
                raise ConfigError("the embedded synthetic dataset is for detection; give data= for other tasks")
            return
        _check_data_yaml(Path(self.data), self.trust_checkpoint)


def _model_task(model: str, trust: bool = False) -> str:
    """The ultralytics task of a model yaml or checkpoint, which must resolve or load (never downloaded)."""
    from ultralytics.nn.tasks import guess_model_task, yaml_model_load

    from prunefx.integrations.ultralytics.model_yaml import check_model_yaml
    from prunefx.integrations.ultralytics.train import load_yolo

    if model.endswith(".pt"):
        if not Path(model).is_file():
            raise ConfigError(
                f"model checkpoint {model} not found; prunefx never downloads weights: give the path "
                "of a local .pt, or a model yaml (e.g. yolov8n.yaml) to train a baseline"
            )
        try:
            return str(load_yolo(model, trust_checkpoint=trust).task)
        except UntrustedFileError:
            raise
        except PrunefxError as exc:
            raise ConfigError(str(exc)) from exc
    if model.endswith((".yaml", ".yml")):
        try:
            cfg = yaml_model_load(model)
        except Exception as exc:
            raise ConfigError(
                f"unknown model {model!r} ({type(exc).__name__}: {exc}); give an ultralytics model yaml "
                "(yolov8n.yaml, yolo11s.yaml, ...), a yaml path, or a checkpoint .pt"
            ) from exc
        check_model_yaml(cfg, model, trust_checkpoint=trust)  # the trainer builds it: no code may run
        return str(guess_model_task(cfg))
    raise ConfigError(f"model {model!r} is neither a model yaml nor a .pt checkpoint")


def _check_train_args(train: Mapping[str, Any]) -> None:
    """Ultralytics' own type and range checks on the training keys, as a ConfigError."""
    from ultralytics.cfg import check_cfg

    try:
        check_cfg(dict(train), hard=True)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid ultralytics argument: {exc}") from exc


def _check_data_yaml(path: Path, trust: bool = False) -> None:
    if not path.is_file():
        raise ConfigError(
            f"data yaml {path} not found; give the path of an ultralytics data yaml (train:, val:, "
            "names:), or data=null for the embedded synthetic dataset. prunefx never downloads datasets"
        )
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"data yaml {path} is not valid YAML: {exc}") from exc
    script = d.get("download") if isinstance(d, dict) else None
    if isinstance(script, str) and not script.startswith(("http://", "https://")) and not trust:
        # ultralytics runs it (exec, or bash) when it finds images missing; prunefx never downloads anyway
        raise UntrustedFileError(f"data yaml {path} has a download: script, which ultralytics would run as code; "
                                 f"remove the download: key (prunefx never downloads), or {TRUST_HINT}")
    missing = [k for k in ("train", "val", "names") if not isinstance(d, dict) or k not in d]
    if missing:
        raise ConfigError(
            f"data yaml {path} lacks {', '.join(missing)}; an ultralytics data yaml names train/val "
            "image dirs (or lists) and the class names"
        )
    root = Path(d.get("path") or path.parent)
    root = root if root.is_absolute() else (path.parent / root)
    for split in ("train", "val"):
        for item in d[split] if isinstance(d[split], list) else [d[split]]:
            p = Path(item) if Path(item).is_absolute() else root / item
            if not p.exists():
                raise ConfigError(
                    f"data yaml {path}: {split} images {p} do not exist (prunefx never downloads "
                    "datasets; put them on disk or fix path:)"
                )


# ---------------------------------------------------------------------------------------------------------------
# Stages


@dataclass
class _Ctx:
    job: YoloJob
    run: RunDir
    data: str
    log: Callable[[str], None]

    @property
    def weights(self) -> Path:
        return self.run.root / "weights"

    def train_args(self, stage: str, overrides: Mapping[str, Any], epochs: int) -> dict[str, Any]:
        from prunefx.integrations.ultralytics.env import cpu_train_kwargs

        args = {
            **self.job.train,
            **overrides,
            "epochs": epochs,
            "data": self.data,
            "project": str((self.run.root / "train").absolute()),
            "name": stage,
            "exist_ok": True,
        }
        if str(args.get("device", "cpu")).lower() == "cpu":
            args = cpu_train_kwargs(**args)  # fp32, in-process loading, plots off unless the config asks
        return args

    def example(self) -> torch.Tensor:
        return torch.zeros(1, 3, self.job.imgsz, self.job.imgsz)


def run_yolo(job: YoloJob, *, log: Callable[[str], None] = print) -> RunDir:
    """Run (or resume) every stage of ``job``; returns the finished run directory."""
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()
    from prunefx.integrations.ultralytics.io import ultralytics_loading

    with ultralytics_loading(trust_checkpoint=job.trust_checkpoint):  # YOLO(path).val(), trainers' yaml builds
        return _run_stages(job, log)


def _run_stages(job: YoloJob, log: Callable[[str], None]) -> RunDir:
    run = RunDir.open(job.project, job.name, job.config, resume=job.resume, exist_ok=job.exist_ok)
    (run.root / "weights").mkdir(exist_ok=True)
    log(f"run directory: {run.root}")
    ctx = _Ctx(job, run, resolve_data(job, log), log)
    for i, (name, fn) in enumerate(zip(STAGES, (_baseline, _sparsity, _prune, _finetune, _report), strict=True), 1):
        if run.done(name) is not None:
            log(f"[{i}/{len(STAGES)}] {name}: done earlier, skipped")
            continue
        log(f"[{i}/{len(STAGES)}] {name}")
        try:
            with run.stage(name) as info:
                fn(ctx, info)
        except BaseException:
            log(
                f"stopped in stage {name!r}; finished stages are kept in {run.root}. Fix the cause and continue with "
                f"the same config plus: resume=true name={run.root.name} project={run.root.parent}"
            )
            raise
        log(f"[{i}/{len(STAGES)}] {name} finished in {info['seconds']:.0f} s")
    run.complete()
    return run


def resolve_data(job: YoloJob, log: Callable[[str], None] = print) -> str:
    """The job's data yaml; for ``data: null`` the embedded synthetic set, generated on first use into the cache."""
    if job.data is not None:
        return str(Path(job.data).absolute())
    from prunefx.data.detection import make_shapes_dataset
    from prunefx.integrations.ultralytics.env import default_config_dir

    params = dict(job.synthetic)
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    root = default_config_dir().parent / "datasets" / f"shapes-{digest}"
    log(f"data: the embedded synthetic shapes dataset {params} at {root}")
    return str(make_shapes_dataset(root, **params))


def _evaluate(ctx: _Ctx, weights: Path, name: str) -> dict[str, float]:
    return evaluate_yolo(weights, ctx.data, ctx.job.train, ctx.run.root / "val", name, log=ctx.log)


def evaluate_yolo(
    weights: Path, data: str, train: Mapping[str, Any], project: Path, name: str, log: Callable[[str], None] = print
) -> dict[str, float]:
    """mAP etc. of a checkpoint as ``YOLO(path).val()`` reports it (rect batches, conf 0.001, iou 0.7).

    ``train``: the config's ultralytics keys; the ones validation uses (imgsz, batch, device...) are passed on.
    """
    from ultralytics import YOLO

    keep = ("imgsz", "batch", "device", "workers", "half", "conf", "iou", "max_det", "single_cls", "classes", "split")
    args = {k: v for k, v in train.items() if k in keep}
    args.setdefault("device", "cpu")
    args["device"] = str(args["device"]).split(",")[0]  # training may span GPUs (DDP); validation runs on one
    if args["device"].lower() == "cpu":
        args.setdefault("workers", 0)
    metrics = YOLO(str(weights)).val(
        data=data, plots=False, verbose=False, project=str(project), name=name, exist_ok=True, **args
    )
    if hasattr(metrics, "box"):  # detection metrics under short names; the box ones for segment/pose too
        out = {
            "map50": float(metrics.box.map50),
            "map50_95": float(metrics.box.map),
            "precision": float(metrics.box.mp),
            "recall": float(metrics.box.mr),
        }
    elif hasattr(metrics, "top1"):
        out = {"top1": float(metrics.top1), "top5": float(metrics.top5)}
    else:
        out = {k: float(v) for k, v in metrics.results_dict.items() if k != "fitness"}
    log(f"  {name}: " + ", ".join(f"{k} {out[k]:.4f}" for k in ("map50", "map50_95", "top1") if k in out))
    return out


def _baseline(ctx: _Ctx, info: dict[str, Any]) -> None:
    from prunefx.integrations.ultralytics.io import save_yolo
    from prunefx.integrations.ultralytics.train import load_yolo, train_yolo

    job, target = ctx.job, ctx.weights / "baseline.pt"
    if job.model.endswith(".pt"):
        model = load_yolo(job.model, trust_checkpoint=job.trust_checkpoint)
        _check_nc(model, ctx.data)
        save_yolo(model, target, train_args=dict(getattr(model, "args", {}) or {}))
        info["source"] = f"checkpoint {job.model}"
    else:
        epochs = int(job.train.get("epochs", 100))
        best, _ = train_yolo(job.model, ctx.train_args("baseline", {}, epochs), task=job.task)
        shutil.copyfile(best, target)
        info["source"] = f"trained from {job.model} for {epochs} epochs"
    info["metrics"] = _evaluate(ctx, target, "baseline")


def _check_nc(model: nn.Module, data: str) -> None:
    names = yaml.safe_load(Path(data).read_text()).get("names")
    nc = len(names) if isinstance(names, (list, dict)) else None
    head = model.model[-1] if isinstance(getattr(model, "model", None), nn.Sequential) else None
    predicts = getattr(head, "nc", None) or len(getattr(model, "names", None) or {}) or None
    if nc is not None and predicts is not None and predicts != nc:
        raise ConfigError(
            f"the checkpoint predicts {predicts} classes but {data} has {nc}; the trainer does not "
            "rebuild the head for a handed-over model: use a checkpoint trained on this dataset"
        )


def _sparsity(ctx: _Ctx, info: dict[str, Any]) -> None:
    from prunefx.integrations.ultralytics.train import SparsityConfig, TrainHooks, load_yolo, train_yolo

    sp = ctx.job.prune.sparsity
    if sp.epochs == 0:
        info["skipped"] = "prune.sparsity.epochs is 0"
        return
    # scratch: its architecture; the trainer builds from the yaml
    model = load_yolo(ctx.weights / "baseline.pt", trust_checkpoint=ctx.job.trust_checkpoint)
    exclude = list(sp.exclude)
    if sp.exclude_residual:
        from prunefx import analyze
        from prunefx.train.sparsity import residual_bns

        exclude += residual_bns(analyze(model, (ctx.example(),)))
    cfg = SparsityConfig(
        s=sp.s,
        exclude=tuple(exclude),
        target=sp.target if sp.schedule == "target" else None,
        select=sp.target if sp.selective else None,
        threshold=sp.threshold,
        s_max=sp.s_max,
    )
    hooks = TrainHooks.for_model(model, cfg)
    # scratch: ultralytics builds the model from the yaml with the baseline's seed, i.e. the baseline's start
    _, last = train_yolo(
        ctx.job.model if sp.start == "scratch" else model,
        ctx.train_args("sparsity", sp.overrides, sp.epochs),
        task=ctx.job.task,
        hooks=hooks,
    )
    # The last epoch, not the best one: sparsity grows over training and the best mAP is usually early.
    shutil.copyfile(last, ctx.weights / "sparse.pt")
    info["gammas"] = hooks.log
    info["metrics"] = _evaluate(ctx, ctx.weights / "sparse.pt", "sparse")


def _prune(ctx: _Ctx, info: dict[str, Any]) -> None:
    from prunefx import prune
    from prunefx.analysis.view import graph_data
    from prunefx.integrations.ultralytics.io import save_yolo
    from prunefx.integrations.ultralytics.train import load_yolo
    from prunefx.report import write_graph

    spec = ctx.job.prune
    source = prune_source(ctx.run, ctx.weights)
    model = load_yolo(source, trust_checkpoint=ctx.job.trust_checkpoint)
    result = prune(
        model,
        (ctx.example(),),
        spec.plan_config(),
        criterion=spec.criterion,
        check=spec.verify,
        bias_compensation=spec.bias_compensation,
    )
    info.update(check_pruned(result, spec, source))
    atomic_write(ctx.run.root / "plan.json", result.plan.to_json().encode())
    write_graph(ctx.run.root, graph_data(result.graph, result.plan))  # report.html draws the graph from it
    save_yolo(model, ctx.weights / "pruned.pt", plan=result.plan, train_args=dict(getattr(model, "args", {}) or {}))
    ctx.log(f"  {len(result.plan.pruned)} of {len(result.plan.groups)} groups pruned; verify: {info['verify']}")
    info["metrics"] = _evaluate(ctx, ctx.weights / "pruned.pt", "pruned")


def _finetune(ctx: _Ctx, info: dict[str, Any]) -> None:
    from prunefx.integrations.ultralytics.train import TrainHooks, load_yolo, param_count, train_yolo

    ft = ctx.job.prune.finetune
    if ft.epochs == 0:
        info["skipped"] = "prune.finetune.epochs is 0"
        return
    model = load_yolo(ctx.weights / "pruned.pt", trust_checkpoint=ctx.job.trust_checkpoint)
    expected = param_count(model)
    best, last = train_yolo(
        model, ctx.train_args("finetune", ft.overrides, ft.epochs), task=ctx.job.task, hooks=TrainHooks.for_model(model)
    )
    shutil.copyfile(best, ctx.weights / "best.pt")
    shutil.copyfile(last, ctx.weights / "last.pt")
    got = param_count(load_yolo(ctx.weights / "best.pt", trust_checkpoint=ctx.job.trust_checkpoint))
    if got != expected:  # the hooks guard the trainer; this guards what it saved
        raise PrunefxError(f"fine-tuning saved a model with {got:,} parameters, not the pruned {expected:,}")
    info["metrics"] = _evaluate(ctx, ctx.weights / "best.pt", "finetuned")


def _report(ctx: _Ctx, info: dict[str, Any]) -> None:
    from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
    from prunefx.integrations.ultralytics.train import load_yolo
    from prunefx.metrics import Deployment, compare_latency, measure
    from prunefx.report import Stage, build_report, write_report

    job, run = ctx.job, ctx.run
    x = ctx.example()
    sources = {"baseline": ("baseline.pt", "baseline"), "pruned": ("pruned.pt", "prune")}
    if not run.done("finetune").get("skipped"):
        sources["finetuned"] = ("best.pt", "finetune")
    models = {
        name: load_yolo(ctx.weights / file, trust_checkpoint=job.trust_checkpoint).eval()
        for name, (file, _) in sources.items()
    }
    # Every core: ultralytics leaves torch at fewer threads after training; the report states the count.
    # The stages are timed in alternating rounds, so a slow spell of the machine hits them all alike.
    timed = compare_latency(models, (x,), Deployment(threads=os.cpu_count())) if job.prune.latency else {}

    def stage(name: str) -> Stage:
        model = models[name]
        extra = {
            "yolo_gflops@640": ultralytics_gflops(model, 640),
            f"yolo_gflops@{job.imgsz}": ultralytics_gflops(model, job.imgsz),
        }
        return Stage(measure(model, (x,)), timed.get(name), {**run.done(sources[name][1])["metrics"], **extra})

    stages = {name: stage(name) for name in sources}
    pr = run.done("prune")
    settings = {
        "config": dict(job.config),
        "data": ctx.data,
        "criterion": job.prune.criterion,
        "target": job.prune.target,
        "verify": pr["verify"],
        "pruned_from": pr["source"],
        "stage_seconds": {k: v.get("seconds") for k, v in run.state["stages"].items()},
        "sparsity": {"metrics": run.done("sparsity").get("metrics"), "gammas": run.done("sparsity").get("gammas")},
        "metrics_by": "ultralytics YOLO(path).val(): rect batches, conf 0.001, iou 0.7, at imgsz "
        f"{job.imgsz}; yolo_gflops@N: GFLOPs in ultralytics' convention (2 x MACs of a batch-1 NxN forward, "
        "conv bias ignored, BN 4 x numel)",
    }
    report = build_report(
        model=job.model,
        baseline=stages["baseline"],
        pruned=stages["pruned"],
        finetuned=stages.get("finetuned"),
        widths=[(w["name"], w["before"], w["after"]) for w in pr["widths"]],
        settings=settings,
    )
    write_report(run.root, report)
    info["files"] = sorted(p.name for p in run.root.iterdir() if p.is_file())


__all__ = ["YoloJob", "evaluate_yolo", "run_yolo"]
