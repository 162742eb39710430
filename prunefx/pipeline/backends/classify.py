"""The classification backend: training on :func:`prunefx.train.fit`, fine-tuning on :func:`prunefx.recover`.

    job = ClassifyJob.from_config(load_config("configs/digits_cnn.yaml", ["epochs=3"]), config_name="digits_cnn")
    run = run_classify(job)       # -> RunDir; run.root / "report.md", run.root / "weights" / "finetuned.pt"

    prunefx prune configs/digits_cnn.yaml nproc=2                           # spawns 2 DDP workers
    torchrun --nproc_per_node 2 -m prunefx.pipeline configs/digits_cnn.yaml   # or let torchrun start them

Every process runs the runner's stage loop. Training stages (baseline, sparsity, fine-tuning) run in every rank
under DistributedDataParallel; pruning and the report run in rank 0 while the others wait. Only rank 0 writes
files. A rank gets a model from rank 0 as bytes (the pruned one through ``prunefx.load``: the plan re-applied to a
fresh model), so no shared file system is needed across machines, except to resume a fine-tune cut mid-stage
(``weights/finetune_recover``, accelerate's checkpoint, is read by every rank). Inside an interrupted training
stage, resume continues from its last epoch checkpoint (``weights/<stage>_last.pt``, or that directory).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from prunefx._config import check_fields, field_names, from_dict
from prunefx._extras import require
from prunefx.data.classification import ClassificationData, DatasetSpec, load_dataset
from prunefx.errors import PrunefxError
from prunefx.metrics import Deployment
from prunefx.pipeline.classify_model import (
    arch_signature,
    check_classifier,
    classifier_factory,
    is_classifier_spec,
    load_weights,
    read_state_dict,
    save_weights,
    takes_in_channels,
)
from prunefx.pipeline.job import RECOVERY_DIR, STAGES, Cuts, Job, ModelRole, Start, Trained
from prunefx.pipeline.records import RankTrained
from prunefx.pipeline.run_config import RUN_KEYS, ConfigError, PruneSpec, StageSpec, check_keys
from prunefx.pipeline.rundir import RunDir, recovery_checkpoint
from prunefx.pipeline.runner import execute, open_run, preflight, resume_hint
from prunefx.train.distill import DistillConfig
from prunefx.train.distributed import (
    LOCAL,
    DistContext,
    DistributedError,
    init_from_env,
    launched_by_torchrun,
    resolve_device,
    spawn,
)
from prunefx.train.loop import TrainConfig, augment_batch, epoch_ended, evaluate, fit
from prunefx.train.sparsity import SparsityConfig

EXAMPLE_BATCH = 32  # real training images for pruning: bias-compensation means and the oracle check use them
_STAGE_DIRS = {"baseline": "baseline", "sparse": "sparsity", "finetuned": "finetune", "narrow": "narrow",
               "narrow_ft": "narrow_ft", "scratch": "scratch"}  # <stage>_last.pt
_WHERE = {"baseline": "", "sparse": "prune.sparsity.", "finetuned": "prune.finetune.", "narrow": "",
          "narrow_ft": "", "scratch": ""}
_UNPRUNED = ("baseline", "sparse")  # every other role is saved with its plan (prunefx.save)


@dataclass(frozen=True)
class Processes:
    """How many processes train, where, and how long a rank waits for its peers."""

    nproc: int = 1  # > 1: spawn DistributedDataParallel workers (torchrun decides itself)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | None = None  # torch threads per process (None: cores / nproc when spawning)
    dist_timeout: float = 1800.0  # seconds a rank waits for the others before failing

    def __post_init__(self) -> None:
        check_fields(self)
        if self.nproc < 1:
            raise ConfigError(f"nproc must be a positive integer (processes to spawn), got {self.nproc!r}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be a positive integer or null, got {self.threads!r}")
        try:
            resolve_device(self.device)
        except DistributedError as exc:
            raise ConfigError(str(exc)) from exc


_OWN_KEYS = ("task", "model", "checkpoint", "dataset", "eval_split", "prune")
TOP_KEYS = (*_OWN_KEYS, *RUN_KEYS, *field_names(Processes), *TrainConfig.keys())


@dataclass(frozen=True)
class ClassifyJob(Job):
    """A validated classification pipeline config (every key checked before any work starts)."""

    model: str = ""  # torchvision:NAME or package.module:factory
    dataset: DatasetSpec = DatasetSpec()
    num_classes: int = 10
    train: TrainConfig = TrainConfig()  # the baseline recipe; sparsity/finetune blocks override keys of it
    checkpoint: str | None = None  # baseline weights: skip baseline training
    eval_split: Literal["test", "val"] = "test"
    processes: Processes = Processes()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, config_name: str = "classify") -> ClassifyJob:
        """Check every key, the model, the dataset and the checkpoint; raises :class:`ConfigError`."""
        check_keys(config, TOP_KEYS, "the config (classification: model, dataset, training keys, prune:)")
        if config.get("task", "classify") != "classify":
            raise ConfigError(f"task is {config['task']!r}, but model {config.get('model')!r} is a classifier; "
                              "use task: classify (or an ultralytics model for other tasks)")
        model = config.get("model")
        if not is_classifier_spec(model):
            raise ConfigError(
                f"model {model!r} is not a classifier SPEC; give torchvision:NAME (e.g. torchvision:resnet18) "
                "or package.module:factory (e.g. prunefx.zoo:bn_cnn)"
            )
        block = config.get("dataset") or {}
        if not isinstance(block, dict):
            raise ConfigError(f"dataset must be a block of keys (name, root, image_size, ...), got {block!r}")
        check_keys(block, DatasetSpec.__dataclass_fields__, "dataset")
        try:
            dataset = DatasetSpec.from_dict(block)
            if dataset.channels is None:  # the data's own channels when the model can take them, else RGB
                dataset = replace(dataset, channels=dataset.native_channels if takes_in_channels(model) else 3)
            num_classes = dataset.num_classes()
            train = TrainConfig.from_dict({k: v for k, v in config.items()
                                           if k in TrainConfig.keys() and v is not None})
            spec = PruneSpec.parse(config.get("prune"), train_keys=set(TrainConfig.keys()) - {"epochs"})
            spec.finetune.distill_config.check_share("prune.finetune.distill_weight")  # a share of the loss here
            train.updated(spec.sparsity.overrides, "prune.sparsity.")  # fails now, not after the baseline
            train.updated(spec.finetune.overrides, "prune.finetune.")
        except ConfigError:
            raise
        except PrunefxError as exc:
            raise ConfigError(str(exc)) from exc
        checkpoint = config.get("checkpoint")
        if checkpoint is not None and not isinstance(checkpoint, str):
            raise ConfigError(f"checkpoint must be the path of a weights file, got {checkpoint!r}")
        if train.epochs == 0 and checkpoint is None:
            raise ConfigError(
                "epochs is 0 and no checkpoint is given: the baseline would be untrained; set epochs "
                "or checkpoint=path/to/weights.pt"
            )
        eval_split = config.get("eval_split", "test")
        if eval_split not in ("test", "val"):
            raise ConfigError(f"eval_split must be test or val, got {eval_split!r}")
        processes = from_dict(Processes, {k: config[k] for k in field_names(Processes) if config.get(k) is not None})
        if train.batch < processes.nproc:
            raise ConfigError(f"batch {train.batch} is the global batch and must be at least nproc ({processes.nproc})")
        return cls.build(config, config_name, spec, model=model, dataset=dataset, num_classes=num_classes, train=train,
                         checkpoint=checkpoint, eval_split=eval_split, processes=processes)

    def factory(self) -> Callable[[], nn.Module]:
        return classifier_factory(self.model, num_classes=self.num_classes, in_channels=self.dataset.channels)

    def example(self, n: int = 1) -> torch.Tensor:
        return torch.zeros(n, self.dataset.channels, self.dataset.size, self.dataset.size)

    def check_inputs(self) -> None:
        """The model builds, takes the dataset's images and predicts its classes; a checkpoint fits it."""
        model = self.factory()()
        check_classifier(model, self.model, self.example(2), self.num_classes)
        # Under torchrun only rank 0 reads the checkpoint (it sends the weights): other machines need no copy.
        if self.checkpoint is not None and os.environ.get("RANK", "0") == "0":
            load_weights(model, self.checkpoint, f"{self.model} with {self.num_classes} classes",
                         trust_checkpoint=self.run.trust_checkpoint)


class ClassifyBackend:
    """Train (fit) and recover (recover) in every rank, evaluate over all ranks (see ``job.Backend``)."""

    cuts = Cuts(before_refit=True)  # the pruned model's checkpoint holds one PruningPlan: no prune.depth yet

    def __init__(self, job: ClassifyJob, dist: DistContext, log: Callable[[str], None] = print) -> None:
        self.job, self.dist, self.log = job, dist, log
        self.root: Path | None = None
        self.name = job.model
        self.checkpoint = job.checkpoint
        self.baseline_epochs = job.train.epochs
        self.primary_metric = "top1"
        self.chance = 1.0 / job.num_classes  # top-1 of a uniform guess: the verdict's floor

    @functools.cached_property
    def data(self) -> ClassificationData:
        """The dataset, loaded on first use (checks before any work need only the model)."""
        data = load_dataset(self.job.dataset)
        self.log(f"data: {data.summary()}")
        return data

    def path(self, role: ModelRole) -> Path:
        assert self.root is not None, "the runner sets root once the run directory is open"
        if self.dist.is_main:
            (self.root / "weights").mkdir(exist_ok=True)
        return self.root / "weights" / f"{role}.pt"

    def fresh(self) -> nn.Module:
        torch.manual_seed(self.job.train.seed)  # the same initial weights in every rank and on every resume
        return self.job.factory()()

    def architecture(self) -> nn.Module:
        with torch.random.fork_rng(devices=[]):  # an untrained model for analysis leaves the RNG as it was
            return self.job.factory()()

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        return (self.job.example(),)

    def prune_inputs(self) -> tuple[torch.Tensor, ...]:
        return (self.data.example(EXAMPLE_BATCH),)  # real images: compensation measures channel means on them

    def score_kwargs(self, criterion: str) -> dict[str, Any]:
        if criterion != "taylor":
            return {}
        items = [self.data.train[i] for i in range(min(256, len(self.data.train)))]  # labelled training batches
        images, labels = torch.stack([im for im, _ in items]), torch.as_tensor([int(lb) for _, lb in items])
        return {"calibration": list(zip(images.split(64), labels.split(64), strict=True)), "loss_fn": F.cross_entropy}

    calibration_source = "the first training images, 32 a batch"

    def calibration(self, batches: int) -> list[Any]:
        n = min(32 * batches, len(self.data.train))  # the first training images, 32 a batch (seen in training)
        return list(torch.stack([self.data.train[i][0] for i in range(n)]).split(32))

    def from_checkpoint(self) -> nn.Module:
        model = self.fresh()
        if self.dist.is_main:
            load_weights(model, self.job.checkpoint, self.job.model, trust_checkpoint=self.job.run.trust_checkpoint)
        model.load_state_dict(self.dist.broadcast(model.state_dict() if self.dist.is_main else None))
        return model

    def train(self, out: ModelRole, start: Start, stage: StageSpec, sparsity: SparsityConfig | None) -> Trained:
        plan, distill, ranks = None, None, None
        if start == "init":
            model = self.fresh()
        elif start == "baseline":
            model = self.fresh()
            model.load_state_dict(self.dist.broadcast(dict(read_state_dict(self.path("baseline")))
                                                      if self.dist.is_main else None))
        else:
            model, plan, signature = self._pruned_in_every_rank(start)
        recipe = replace(self.job.train.updated(stage.overrides, _WHERE[out]), epochs=stage.epochs)
        teacher = None
        if getattr(stage, "distill", False):  # the unpruned baseline's logits, in every rank
            teacher = self.fresh()
            teacher.load_state_dict(self.dist.broadcast(dict(read_state_dict(self.path("baseline")))
                                                        if self.dist.is_main else None))
            distill = {"teacher": "baseline", **asdict(stage.distill_config)}
        if out == "finetuned":  # recovery: the same engine as every other model's (prunefx.recover, accelerate)
            history = self._recover(model, recipe, teacher, getattr(stage, "distill_config", None))
        else:  # training the baseline, its sparsity stage or a control
            history = fit(model, self.data.train, recipe, val=self.data.val, dist=self.dist, sparsity=sparsity,
                          checkpoint=self.path(out).with_name(f"{_STAGE_DIRS[out]}_last.pt"), log=self.log).history
        self.save(model, out, plan)
        if start not in ("init", "baseline"):
            # What each rank trained, as rank 0 gathered it: the architecture (a digest of every tensor's name and
            # shape) and the parameter count, so state.json shows every rank fine-tuned the same pruned model.
            gathered = self.dist.all_gather((_digest(signature), sum(p.numel() for p in model.parameters())))
            ranks = tuple(RankTrained(rank=r, arch=d, params=n) for r, (d, n) in enumerate(gathered))
        return Trained(model, history, distill=distill, ranks=ranks)

    def _recover(self, model: nn.Module, recipe: TrainConfig, teacher: nn.Module | None,
                 distill: DistillConfig | None) -> list[dict[str, Any]]:
        """Fine-tune the pruned model by :func:`prunefx.recover`: the recipe's optimiser, schedule, augmentation and
        cross-entropy, distilling the baseline's logits when asked; a checkpoint every epoch, resumed after a cut.
        Its history: one row per epoch (mean loss, each rank's, lr, the validation metrics)."""
        from prunefx.train.recover import STATE_FILE, RecoverConfig, recover

        accelerator = require("accelerate", "the classification pipeline's fine-tuning").Accelerator

        world, train = self.dist.world_size, self.data.train
        per_rank = max(1, recipe.batch // world)
        drop_last = math.ceil(len(train) / world) >= 2 * per_rank  # as fit: no lone tiny batch for BatchNorm
        loader = DataLoader(train, batch_size=per_rank, shuffle=True, drop_last=drop_last,
                            num_workers=recipe.workers, generator=torch.Generator().manual_seed(recipe.seed))
        per_epoch = math.ceil(len(loader) / world)  # accelerate deals each rank every world-th batch
        weight = distill.check_share("distill.weight").weight if teacher is not None and distill else 0.5
        config = RecoverConfig(
            steps=recipe.epochs * per_epoch, lr=recipe.lr, weight_decay=recipe.weight_decay, optimizer=recipe.optimizer,
            momentum=recipe.momentum, warmup=int(recipe.warmup_epochs * per_epoch), schedule=recipe.schedule,
            milestones=recipe.lr_steps, gamma=recipe.lr_gamma, clip=recipe.grad_clip or 0.0, loss="kl",
            temperature=distill.temperature if distill else 4.0, task_weight=1 - weight, log_every=per_epoch,
            eval_every=per_epoch, checkpoint_every=per_epoch, seed=recipe.seed)
        ckpt = self.path("finetuned").with_name(RECOVERY_DIR)
        # rank 0 decides for every rank; on several machines the others then read the checkpoint from the shared
        # run directory (accelerate's state: each rank's RNG, rank 0's weights and optimiser)
        resume = self.dist.broadcast(recovery_checkpoint(ckpt) if self.dist.is_main else None)
        epochs = [_resumed_step(ckpt / STATE_FILE) // per_epoch if resume else 0]

        def metric(m: nn.Module) -> dict[str, float]:  # every rank evaluates its share of the split
            if epochs[0] and self.dist.is_main:  # the first call is the start; then one per finished epoch
                epoch_ended(epochs[0], recipe.epochs)
            epochs[0] += 1
            scores = evaluate(m, self.data.val, batch=recipe.eval_batch, dist=self.dist, workers=recipe.workers)
            return {k: v for k, v in scores.to_dict().items() if k != "n"}

        def task(out: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return F.cross_entropy(out, batch[1], label_smoothing=recipe.label_smoothing)

        result = recover(model, teacher, loader, config=config, task_loss=task, metric=metric,
                         inputs=lambda batch: augment_batch(batch[0], recipe),  # torch's RNG: in the checkpoint
                         checkpoint_dir=ckpt, resume=resume, log=self.log,
                         accelerator=accelerator(cpu=self.dist.device.type == "cpu"))
        val = {e["step"]: e["metric"] for e in result.evals}
        return [{"epoch": h["step"] // per_epoch, "loss": h["loss"], "rank_loss": h["process_loss"], "lr": h["lr"],
                 **{f"val_{k}": v for k, v in val.get(h["step"], {}).items()}} for h in result.history]

    def _pruned_in_every_rank(
        self, role: ModelRole = "pruned"
    ) -> tuple[nn.Module, Any, list[tuple[str, tuple[int, ...]]]]:
        """A pruned-shape model (``role``) in every rank: rank 0 sends its bytes, each rank re-applies its plan."""
        from prunefx import load as load_pruned
        from prunefx.plan import PruningPlan

        path = self.path(role)
        blob = self.dist.broadcast(path.read_bytes() if self.dist.is_main else None)
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / path.name
            local.write_bytes(blob)
            model = load_pruned(local, self.job.factory())
            plan = PruningPlan.from_dict(torch.load(local, map_location="cpu", weights_only=True)["plan"])
        signature = arch_signature(model)
        everyone = self.dist.all_gather(signature)
        if any(s != signature for s in everyone):  # every rank sees the same list, so all of them raise
            bad = [r for r, s in enumerate(everyone) if s != everyone[0]]
            raise DistributedError(f"ranks {bad} rebuilt a different pruned architecture than rank 0 from {path.name}")
        return model, plan, signature

    def load(self, role: ModelRole) -> nn.Module:
        if role not in _UNPRUNED:
            from prunefx import load as load_pruned

            return load_pruned(self.path(role), self.job.factory())
        return load_weights(self.fresh(), self.path(role), self.job.model)

    def save(self, model: nn.Module, role: ModelRole, plan: Any = None) -> None:
        if not self.dist.is_main:
            return
        if role not in _UNPRUNED:
            from prunefx import save

            save(model, plan, self.path(role))
        else:
            save_weights(model, self.path(role), model_spec=self.job.model, num_classes=self.job.num_classes)

    def evaluate(self, role: ModelRole, model: nn.Module, *, alone: bool = False) -> dict[str, float]:
        dist = replace(LOCAL, device=self.dist.device) if alone else self.dist
        split = getattr(self.data, self.job.eval_split)
        m = evaluate(model.to(dist.device), split, batch=self.job.train.eval_batch, dist=dist,
                     workers=self.job.train.workers)
        self.log(f"  {role}: top-1 {m.top1:.4f}, top-5 {m.top5:.4f}, loss {m.loss:.4f} "
                 f"({m.n} {self.job.eval_split} images)")
        return {"top1": m.top1, "top5": m.top5, "loss": m.loss}

    def extra_costs(self, model: nn.Module) -> dict[str, float]:
        return {}

    def deployment(self) -> Deployment | None:
        return None  # torch on the CPU with the run's threads

    def settings(self) -> dict[str, Any]:
        job, split = self.job, getattr(self.data, self.job.eval_split)
        return {
            "dataset": self.data.summary(),
            "world_size": self.dist.world_size,
            "metrics_by": f"top-1/top-5 on the {job.eval_split} split ({len(split)} images, one centred view, no "
            f"augmentation); MACs at batch 1, {job.dataset.channels}x{job.dataset.size}x{job.dataset.size}",
        }


def _digest(signature: list[tuple[str, tuple[int, ...]]]) -> str:
    return hashlib.sha256(repr(signature).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# Processes: one, spawned workers, or torchrun's workers


def run_classify_config(config: Mapping[str, Any], config_name: str, log: Callable[[str], None]) -> RunDir | None:
    """The classification pipeline of a loaded config (:mod:`prunefx.pipeline.registry`'s entry for torch models)."""
    return run_classify(ClassifyJob.from_config(config, config_name=config_name), log=log)


def run_classify(job: ClassifyJob, *, log: Callable[[str], None] = print) -> RunDir | None:
    """Run (or resume) every stage of ``job``; returns the finished run directory (None in torchrun ranks > 0)."""
    procs = job.processes
    if launched_by_torchrun():
        if procs.nproc > 1:
            log(f"note: started by torchrun, which decides the number of processes; nproc={procs.nproc} is ignored")
        dist = init_from_env(procs.device, timeout_s=procs.dist_timeout)
        with _threads(procs.threads):
            return _run_rank(job, dist, None, log)
    if procs.nproc == 1:
        with _threads(procs.threads):
            return _run_rank(job, DistContext(device=resolve_device(procs.device)), None, log)
    run = _open_checked(job, ClassifyBackend(job, LOCAL, log=lambda _msg: None))
    log(f"run directory: {run.root}; spawning {procs.nproc} DistributedDataParallel workers")
    try:
        spawn(_spawned_rank, (job, str(run.root)), procs.nproc, threads=procs.threads)
    except DistributedError as exc:
        run = RunDir.reload(run.root)
        if not run.is_complete:
            # The failing rank's own error, not what rank 0 saw as a consequence ("connection closed by peer"),
            # or nothing at all when rank 0 was stopped mid-stage.
            run.fail(exc, stage=(run.state.get("error") or {}).get("stage") or run.state.get("current"))
        log(resume_hint(run.root))
        raise
    return RunDir.reload(run.root)


def _open_checked(job: ClassifyJob, backend: ClassifyBackend) -> RunDir:
    preflight(job.prune, backend)  # nothing prunable: an error before the directory exists
    return open_run(job)


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` for the run and restored after it (the caller's process goes on)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _spawned_rank(job: ClassifyJob, root: str) -> None:
    dist = init_from_env(job.processes.device, timeout_s=job.processes.dist_timeout)
    _run_rank(job, dist, RunDir.reload(Path(root)) if dist.is_main else None, print)


def _run_rank(job: ClassifyJob, dist: DistContext, run: RunDir | None, log: Callable[[str], None]) -> RunDir | None:
    """The stage loop in one rank; rank 0 owns the run directory (opening it when nobody did) and the files."""
    backend = ClassifyBackend(job, dist, log if dist.is_main else (lambda _msg: None))
    if dist.is_main and run is None:
        run = _open_checked(job, backend)
    if dist.is_main:
        log(f"run directory: {run.root}" + (f" ({dist.world_size} ranks, {dist.device})" if dist.distributed else ""))
    return execute(job, backend, run, log=log)


def _resumed_step(path: Path) -> int:
    """The step a recovery checkpoint stopped at (recover.json read within limits; recover checks the rest)."""
    from prunefx._io import read_json

    fix = f"delete {path.parent} to fine-tune from the start"
    record = read_json(path, ConfigError, missing=f"{path} is missing; {fix}", what="is damaged", fix=fix, expect=dict)
    step = record.get("step")
    if type(step) is not int or step < 0:
        raise ConfigError(f"{path}: 'step' is {step!r}, not a step count; {fix}")
    return step


__all__ = ["STAGES", "TOP_KEYS", "ClassifyBackend", "ClassifyJob", "Processes", "run_classify"]
