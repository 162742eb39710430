"""The YOLO backend: ultralytics' own trainer and validator, ultralytics checkpoints for every weights file.

    job = YoloJob.from_config(load_config("configs/yolo.yaml", ["epochs=3"]), config_name="yolo")
    run = run_yolo(job)            # -> RunDir; run.root / "report.md", run.root / "weights" / "best.pt"

Weights are ordinary ultralytics checkpoints: ``YOLO("weights/best.pt")`` validates, predicts and exports the
pruned model. A pruned module is handed to the trainer (``YOLO("pruned.pt").train()`` would rebuild the unpruned
yaml), and every weights file is the trainer's own file, linked into ``weights/`` rather than copied.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from prunefx._config import load_yaml
from prunefx._io import TRUST_HINT
from prunefx.errors import PrunefxError, UntrustedFileError
from prunefx.metrics import Deployment
from prunefx.pipeline.job import STAGES, WIDTH_ONLY, Job, ModelRole, Start, Trained
from prunefx.pipeline.run_config import RUN_KEYS, ConfigError, PruneSpec, RunOptions, StageSpec, check_keys
from prunefx.pipeline.rundir import RunDir
from prunefx.pipeline.runner import run_job
from prunefx.train.distributed import LOCAL
from prunefx.train.sparsity import SparsityConfig

# The embedded dataset (used when `data` is null): prunefx's synthetic shapes set; prune.data tunes it.
# hard: true picks the hard set (prunefx.data.detection_hard: 20 classes, small occluded objects, decoys).
SYNTHETIC_DEFAULTS = {"n_train": 384, "n_val": 96, "imgsz": 128, "seed": 0, "hard": False}
# Where each role's weights live; fine-tuning also keeps the trainer's last epoch as last.pt.
_FILES = {"baseline": "baseline.pt", "sparse": "sparse.pt", "pruned": "pruned.pt", "finetuned": "best.pt",
          "narrow": "narrow.pt", "narrow_ft": "narrow_ft.pt", "scratch": "scratch.pt", "narrow_init": "narrow_init.pt",
          "scratch_init": "scratch_init.pt"}
_TRAIN_DIRS = {"baseline": "baseline", "sparse": "sparsity", "finetuned": "finetune", "narrow": "narrow",
               "narrow_ft": "narrow_ft", "scratch": "scratch"}  # train/<stage>/


def ultralytics_keys() -> set[str]:
    """Every key ultralytics' ``train``/``val`` accept (its default.yaml)."""
    from ultralytics.cfg import DEFAULT_CFG_DICT

    return set(DEFAULT_CFG_DICT)


@dataclass(frozen=True)
class YoloJob(Job):
    """A validated YOLO pipeline config."""

    model: str = ""  # a model yaml (trained from scratch for the baseline) or an ultralytics checkpoint .pt
    data: str | None = None  # an ultralytics data yaml; None = the embedded synthetic set
    train: Mapping[str, Any] = field(default_factory=dict)  # ultralytics train arguments of every training stage
    synthetic: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, config_name: str = "yolo") -> YoloJob:
        """Validate every key before any work starts; prunefx's keys never reach ultralytics."""
        from prunefx.integrations.ultralytics.env import setup_offline

        setup_offline()  # before the first ultralytics import: it fixes its online flag and config dir then
        known = ultralytics_keys()
        check_keys(config, known | {"prune", *RUN_KEYS},
                   "the config (top level: ultralytics keys, prunefx keys under prune:)")
        run = RunOptions.parse(config, config_name)
        prune_block = dict(config.get("prune") or {})
        synthetic = prune_block.pop("data", None) or {}
        check_keys(synthetic, SYNTHETIC_DEFAULTS, "prune.data (the embedded synthetic dataset)")
        for key, value in synthetic.items():
            if key == "hard":
                if not isinstance(value, bool):
                    raise ConfigError(f"prune.data.hard must be true or false, got {value!r}")
                continue
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
        architecture = _architecture(model, run.trust_checkpoint)
        task = str(architecture.task)
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
        _check_imgsz(architecture, train.get("imgsz", 640), model)
        return cls.build(config, config_name, spec, model=model, data=data, train=train,
                         synthetic={**SYNTHETIC_DEFAULTS, **synthetic})

    @property
    def trust(self) -> bool:
        """Whether checkpoints may be unpickled fully and model yamls evaluated (they can run code)."""
        return self.run.trust_checkpoint

    @property
    def imgsz(self) -> int:
        return int(self.train.get("imgsz", 640))

    @property
    def task(self) -> str:
        return str(self.train["task"])

    def check_inputs(self) -> None:
        """Fail now, not after an hour of training: the data yaml and its images exist (the model: _architecture)."""
        if self.data is None:
            if self.task != "detect":
                raise ConfigError("the embedded synthetic dataset is for detection; give data= for other tasks")
            return
        _check_data_yaml(Path(self.data), self.trust)


def _architecture(model: str, trust: bool = False) -> nn.Module:
    """The model a yaml builds or a checkpoint holds, which must resolve or load (never downloaded).

    Safe unless ``trust``: a checkpoint loads weights-only, a model yaml must hold no code (ultralytics evaluates
    some of its strings) and builds in ultralytics' restricted mode.
    """
    from prunefx.integrations.ultralytics.io import load_yolo, ultralytics_loading

    if model.endswith(".pt"):
        if not Path(model).is_file():
            raise ConfigError(
                f"model checkpoint {model} not found; prunefx never downloads weights: give the path "
                "of a local .pt, or a model yaml (e.g. yolov8n.yaml) to train a baseline"
            )
        try:
            return load_yolo(model, trust_checkpoint=trust)
        except UntrustedFileError:
            raise
        except PrunefxError as exc:
            raise ConfigError(str(exc)) from exc
    if model.endswith((".yaml", ".yml")):
        from ultralytics import YOLO
        from ultralytics.nn.tasks import guess_model_task, yaml_model_load

        from prunefx.integrations.ultralytics.model_yaml import check_model_yaml

        try:
            cfg = yaml_model_load(model)
        except Exception as exc:  # a missing or unparsable yaml: ultralytics raises several types
            raise ConfigError(
                f"unknown model {model!r} ({type(exc).__name__}: {exc}); give an ultralytics model yaml "
                "(yolov8n.yaml, yolo11s.yaml, ...), a yaml path, or a checkpoint .pt"
            ) from exc
        check_model_yaml(cfg, model, trust_checkpoint=trust)  # before anything builds it: no code may run
        try:
            with ultralytics_loading(trust_checkpoint=trust):
                return YOLO(model, task=str(guess_model_task(cfg))).model
        except Exception as exc:  # ultralytics' own parse error, for a yaml it could read
            raise ConfigError(f"model yaml {model!r} does not build ({type(exc).__name__}: {exc})") from exc
    raise ConfigError(f"model {model!r} is neither a model yaml nor a .pt checkpoint")


def _check_imgsz(model: nn.Module, imgsz: Any, name: str) -> None:
    """An image size the model takes: a positive integer, a multiple of its largest stride."""
    if isinstance(imgsz, bool) or not isinstance(imgsz, int):
        raise ConfigError(f"imgsz must be one integer (square images), got {imgsz!r}")
    stride = getattr(model, "stride", None)
    stride = int(stride.max()) if isinstance(stride, torch.Tensor) else 32
    if imgsz < stride or imgsz % stride:
        fix = max(stride, -(-imgsz // stride) * stride)
        raise ConfigError(f"imgsz={imgsz}: {name} takes square images whose side is a positive multiple of its "
                          f"stride {stride}; use e.g. imgsz={fix}")


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
        d = load_yaml(path.read_text(), f"data yaml {path}")
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


def resolve_data(job: YoloJob, log: Callable[[str], None] = print) -> str:
    """The job's data yaml; for ``data: null`` the embedded synthetic set, generated on first use into the cache."""
    if job.data is not None:
        return str(Path(job.data).absolute())
    from prunefx.data.detection import make_shapes_dataset
    from prunefx.data.detection_hard import make_hard_shapes_dataset
    from prunefx.integrations.ultralytics.env import default_config_dir

    params = dict(job.synthetic)
    hard = params.pop("hard", False)
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]
    root = default_config_dir().parent / "datasets" / f"shapes{'-hard' if hard else ''}-{digest}"
    log(f"data: the embedded synthetic {'hard ' if hard else ''}shapes dataset {params} at {root}")
    return str((make_hard_shapes_dataset if hard else make_shapes_dataset)(root, **params))


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


class YoloBackend:
    """Train, evaluate, load and save with ultralytics (see :class:`prunefx.pipeline.job.Backend`)."""

    dist = LOCAL  # multi-GPU: ultralytics' trainer runs its own DDP workers inside one stage
    cuts = WIDTH_ONLY  # evaluate reads the saved checkpoint (no metric before the re-fit); no prune.depth

    def __init__(self, job: YoloJob, log: Callable[[str], None] = print) -> None:
        self.job, self.log = job, log
        self.root: Path | None = None
        self.name = job.model
        self.checkpoint = job.model if job.model.endswith(".pt") else None
        self.baseline_epochs = int(job.train.get("epochs", 100))
        self.primary_metric = "top1" if job.task == "classify" else "map50_95"
        self.chance = None  # mAP has no guess level; a classify model's classes are known only once its data is read
        self.data = resolve_data(job, log)

    def path(self, role: ModelRole) -> Path:
        assert self.root is not None, "the runner sets root once the run directory is open"
        if self.dist.is_main:
            (self.root / "weights").mkdir(exist_ok=True)
        return self.root / "weights" / _FILES[role]

    def architecture(self) -> nn.Module:
        if self.root is not None and self.path("baseline").is_file():
            return self.load("baseline")  # the trained baseline's: a checkpoint's classes, the data's nc
        return _architecture(self.job.model, self.job.trust)

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(1, 3, self.job.imgsz, self.job.imgsz),)

    def prune_inputs(self) -> tuple[torch.Tensor, ...]:
        return self.example_inputs()

    def score_kwargs(self, criterion: str) -> dict[str, Any]:
        return {}

    @property
    def calibration_source(self) -> str:
        from prunefx.integrations.ultralytics.calibration import BATCH

        return f"the first training images of {self.data}, {BATCH} a batch, as the validator feeds them"

    def calibration(self, batches: int) -> list[Any]:
        from prunefx.integrations.ultralytics.calibration import calibration_images

        return calibration_images(self.data, self.job.task, self.job.imgsz, batches)

    def from_checkpoint(self) -> nn.Module:
        from prunefx.integrations.ultralytics.io import load_yolo

        model = load_yolo(self.job.model, trust_checkpoint=self.job.trust)
        _check_nc(model, self.data)
        return model

    def fresh(self) -> nn.Module:
        """The baseline's architecture (its yaml, its classes) built again by ultralytics: seeded, untrained."""
        baseline = self.load("baseline")
        torch.manual_seed(int(self.job.train.get("seed", 0)))
        fresh = type(baseline)(cfg=dict(baseline.yaml), nc=len(baseline.names), verbose=False)
        fresh.names, fresh.args = baseline.names, getattr(baseline, "args", {})
        return fresh

    def train(self, out: ModelRole, start: Start, stage: StageSpec, sparsity: SparsityConfig | None) -> Trained:
        from prunefx.integrations.ultralytics.io import load_yolo
        from prunefx.integrations.ultralytics.train import TrainHooks, param_count, train_yolo

        distill = {}
        if getattr(stage, "distill", False):  # output KD from the unpruned baseline
            distill = {"teacher": self.load("baseline"), "distill": stage.distill_config}
        if start == "init":  # ultralytics builds the yaml with the baseline's seed: the baseline's start
            model: nn.Module | str = self.job.model
            hooks = TrainHooks.for_model(self.load("baseline"), sparsity) if sparsity is not None else None
        else:
            model = self.load(start)
            hooks = TrainHooks.for_model(model, sparsity, **distill)
        args = self._train_args(_TRAIN_DIRS[out], stage.overrides, stage.epochs)
        best, last = train_yolo(model, args, task=self.job.task, hooks=hooks)
        # sparse: the last epoch, not the best: sparsity grows over training and the best mAP is usually early.
        _link(last if out == "sparse" else best, self.path(out))
        if out == "finetuned":
            _link(last, self.path(out).with_name("last.pt"))
        trained = load_yolo(self.path(out), trust_checkpoint=self.job.trust)
        if hooks is not None and hooks.expected_params is not None and start not in ("init", "baseline"):
            got = param_count(trained)  # the hooks guard the trainer; this guards what it saved
            if got != hooks.expected_params:
                raise PrunefxError(f"training saved a model with {got:,} parameters, not the pruned "
                                   f"{hooks.expected_params:,}")
        return Trained(trained, hooks.log if hooks is not None else (),
                       distill={"teacher": "baseline", **asdict(stage.distill_config)} if distill else None)

    def load(self, role: ModelRole) -> nn.Module:
        from prunefx.integrations.ultralytics.io import load_yolo

        return load_yolo(self.path(role), trust_checkpoint=self.job.trust)

    def save(self, model: nn.Module, role: ModelRole, plan: Any = None) -> None:
        from prunefx.integrations.ultralytics.io import save_yolo

        save_yolo(model, self.path(role), plan=plan, train_args=dict(getattr(model, "args", {}) or {}))

    def evaluate(self, role: ModelRole, model: nn.Module, *, alone: bool = False) -> dict[str, float]:
        return evaluate_yolo(self.path(role), self.data, self.job.train, self.root / "val", role, log=self.log)

    def extra_costs(self, model: nn.Module) -> dict[str, float]:
        from prunefx.integrations.ultralytics.gflops import report_gflops

        return report_gflops(model, self.job.imgsz)

    def deployment(self) -> Deployment | None:
        # Every core: ultralytics leaves torch at fewer threads after training; the report states the count.
        return Deployment(threads=os.cpu_count())

    def settings(self) -> dict[str, Any]:
        return {
            "data": self.data,
            "metrics_by": "ultralytics YOLO(path).val(): rect batches, conf 0.001, iou 0.7, at imgsz "
            f"{self.job.imgsz}; yolo_gflops@N: GFLOPs in ultralytics' convention (2 x MACs of a batch-1 NxN "
            "forward, conv bias ignored, BN 4 x numel)",
        }

    def _train_args(self, stage: str, overrides: Mapping[str, Any], epochs: int) -> dict[str, Any]:
        from prunefx.integrations.ultralytics.env import cpu_train_kwargs

        args = {
            **self.job.train,
            **overrides,
            "epochs": epochs,
            "data": self.data,
            "project": str((self.root / "train").absolute()),
            "name": stage,
            "exist_ok": True,
        }
        if str(args.get("device", "cpu")).lower() == "cpu":
            args = cpu_train_kwargs(**args)  # fp32, in-process loading, plots off unless the config asks
        return args


def _link(src: Path, dst: Path) -> None:
    """``dst`` names the bytes of ``src`` (a hard link; a copy across file systems): no second copy on disk."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed there
        shutil.copyfile(src, dst)


def _check_nc(model: nn.Module, data: str) -> None:
    names = load_yaml(Path(data).read_text(), f"data yaml {data}").get("names")
    nc = len(names) if isinstance(names, (list, dict)) else None
    head = model.model[-1] if isinstance(getattr(model, "model", None), nn.Sequential) else None
    predicts = getattr(head, "nc", None) or len(getattr(model, "names", None) or {}) or None
    if nc is not None and predicts is not None and predicts != nc:
        raise ConfigError(
            f"the checkpoint predicts {predicts} classes but {data} has {nc}; the trainer does not "
            "rebuild the head for a handed-over model: use a checkpoint trained on this dataset"
        )


def run_yolo_config(config: Mapping[str, Any], config_name: str, log: Callable[[str], None]) -> RunDir:
    """The YOLO pipeline of a loaded config (:mod:`prunefx.pipeline.registry`'s entry for ultralytics models)."""
    return run_yolo(YoloJob.from_config(config, config_name=config_name), log=log)


def run_yolo(job: YoloJob, *, log: Callable[[str], None] = print) -> RunDir:
    """Run (or resume) every stage of ``job``; returns the finished run directory."""
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()
    from prunefx.integrations.ultralytics.io import ultralytics_loading

    with ultralytics_loading(trust_checkpoint=job.trust):  # YOLO(path).val(), the trainers' yaml builds
        return run_job(job, YoloBackend(job, log), log=log)


__all__ = ["STAGES", "YoloBackend", "YoloJob", "evaluate_yolo", "resolve_data", "run_yolo", "ultralytics_keys"]
