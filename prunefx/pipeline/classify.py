"""The classification pipeline: baseline -> sparsity -> prune -> fine-tune -> report, on one or many processes.

    job = ClassifyJob.from_config(load_config("configs/digits_cnn.yaml", ["epochs=3"]), config_name="digits_cnn")
    run = run_classify(job)       # -> RunDir; run.root / "report.md", run.root / "weights" / "finetuned.pt"

    prunefx prune configs/digits_cnn.yaml nproc=2                                  # spawns 2 DDP workers
    torchrun --nproc_per_node 2 -m prunefx.pipeline.classify configs/digits_cnn.yaml   # or let torchrun start them

Every process runs the same stage sequence. Training stages (baseline, sparsity, fine-tuning) run in every rank
under DistributedDataParallel; pruning and the report run in rank 0 while the others wait. Only rank 0 writes
files. A rank gets a model from rank 0 as bytes (the pruned one through ``prunefx.load``: the plan re-applied to a
fresh model), so no shared file system is needed across machines. A stage is recorded in ``state.json`` only once
its files are written: ``resume=true`` continues after the last finished stage, and inside an interrupted training
stage from its last epoch checkpoint (``weights/<stage>_last.pt``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from prunefx._io import atomic_write
from prunefx.data.classification import ClassificationData, DatasetSpec, load_dataset
from prunefx.errors import PrunefxError
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
from prunefx.pipeline.config import ConfigError, PruneSpec, check_keys, load_config
from prunefx.pipeline.rundir import RunDir
from prunefx.pipeline.stages import check_pruned, prune_source
from prunefx.train.distributed import (
    LOCAL,
    DistContext,
    DistributedError,
    init_from_env,
    launched_by_torchrun,
    resolve_device,
    shutdown,
    spawn,
)
from prunefx.train.loop import SparsityConfig, TrainConfig, evaluate, fit

STAGES = ("baseline", "sparsity", "prune", "finetune", "report")
RUN_KEYS = ("project", "name", "exist_ok", "resume", "trust_checkpoint")
DIST_KEYS = ("nproc", "device", "threads", "dist_timeout")
TOP_KEYS = ("task", "model", "checkpoint", "dataset", "eval_split", "prune", *RUN_KEYS, *DIST_KEYS, *TrainConfig.keys())
EXAMPLE_BATCH = 32  # real training images for pruning: bias-compensation means and the oracle check use them


@dataclass(frozen=True)
class ClassifyJob:
    """A validated classification pipeline config (every key checked before any work starts)."""

    model: str  # torchvision:NAME or package.module:factory
    dataset: DatasetSpec
    num_classes: int
    train: TrainConfig  # the baseline recipe; sparsity/finetune blocks override keys of it
    prune: PruneSpec
    project: Path
    name: str
    checkpoint: str | None = None  # baseline weights: skip baseline training
    eval_split: str = "test"
    resume: bool = False
    exist_ok: bool = False
    trust_checkpoint: bool = False  # unpickle checkpoint= fully (it can run code)
    nproc: int = 1
    device: str = "auto"
    threads: int | None = None
    dist_timeout: float = 1800.0
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)

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
            train = TrainConfig.from_dict(
                {k: v for k, v in config.items() if k in TrainConfig.keys() and v is not None}
            )
            spec = PruneSpec.parse(config.get("prune"), train_keys=set(TrainConfig.keys()) - {"epochs"})
            train.updated(spec.sparsity.overrides, "prune.sparsity.")  # fails now, not after the baseline
            train.updated(spec.finetune.overrides, "prune.finetune.")
        except ConfigError:
            raise
        except PrunefxError as exc:
            raise ConfigError(str(exc)) from exc
        checkpoint = config.get("checkpoint")
        if checkpoint is not None and not isinstance(checkpoint, str):
            raise ConfigError(f"checkpoint must be the path of a weights file, got {checkpoint!r}")
        trust = config.get("trust_checkpoint", False)
        if not isinstance(trust, bool):
            raise ConfigError(f"trust_checkpoint must be true or false, got {trust!r}")
        if train.epochs == 0 and checkpoint is None:
            raise ConfigError(
                "epochs is 0 and no checkpoint is given: the baseline would be untrained; set epochs "
                "or checkpoint=path/to/weights.pt"
            )
        if config.get("eval_split", "test") not in ("test", "val"):
            raise ConfigError(f"eval_split must be test or val, got {config['eval_split']!r}")
        nproc, threads = config.get("nproc", 1), config.get("threads")
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise ConfigError(f"nproc must be a positive integer (processes to spawn), got {nproc!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"threads must be a positive integer or null, got {threads!r}")
        if train.batch < nproc:
            raise ConfigError(f"batch {train.batch} is the global batch and must be at least nproc ({nproc})")
        device = str(config.get("device") or "auto")
        try:
            resolve_device(device)
        except DistributedError as exc:
            raise ConfigError(str(exc)) from exc
        job = cls(
            model=model,
            dataset=dataset,
            num_classes=num_classes,
            train=train,
            prune=spec,
            project=Path(config.get("project") or "runs/prune"),
            name=str(config.get("name") or config_name),
            checkpoint=checkpoint,
            eval_split=config.get("eval_split", "test"),
            resume=bool(config.get("resume")),
            exist_ok=bool(config.get("exist_ok")),
            trust_checkpoint=trust,
            nproc=nproc,
            device=device,
            threads=threads,
            dist_timeout=float(config.get("dist_timeout", 1800.0)),
            config=dict(config),
        )
        job.check_inputs()
        return job

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
                         trust_checkpoint=self.trust_checkpoint)


# ---------------------------------------------------------------------------------------------------------------
# Running: one process, spawned workers, or torchrun's workers


def run_classify(job: ClassifyJob, *, log: Callable[[str], None] = print) -> RunDir | None:
    """Run (or resume) every stage of ``job``; returns the finished run directory (None in torchrun ranks > 0)."""
    if launched_by_torchrun():
        if job.nproc > 1:
            log(f"note: started by torchrun, which decides the number of processes; nproc={job.nproc} is ignored")
        dist = init_from_env(job.device, timeout_s=job.dist_timeout)
        with _threads(job.threads):
            return _run_rank(job, dist, None, log)
    run = RunDir.open(job.project, job.name, job.config, resume=job.resume, exist_ok=job.exist_ok)
    if job.nproc == 1:
        with _threads(job.threads):
            return _run_rank(job, DistContext(device=resolve_device(job.device)), run, log)
    log(f"run directory: {run.root}; spawning {job.nproc} DistributedDataParallel workers")
    try:
        spawn(_spawned_rank, (job, str(run.root)), job.nproc, threads=job.threads)
    except DistributedError as exc:
        run = _reload(run.root)
        if not run.is_complete:
            # The failing rank's own error, not what rank 0 saw as a consequence ("connection closed by peer"),
            # or nothing at all when rank 0 was stopped mid-stage.
            stage = (run.state.get("error") or {}).get("stage") or run.state.get("current")
            run.state["status"] = "failed"
            run.state["error"] = {"stage": stage, "type": "DistributedError", "message": str(exc)}
            atomic_write(run.root / "state.json", json.dumps(run.state, indent=2, default=str).encode())
        log(
            f"finished stages are kept in {run.root}; fix the cause and continue with the same config plus: "
            f"resume=true name={run.root.name} project={run.root.parent}"
        )
        raise
    return _reload(run.root)


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
    dist = init_from_env(job.device, timeout_s=job.dist_timeout)
    _run_rank(job, dist, _reload(Path(root)) if dist.is_main else None, print)


def _reload(root: Path) -> RunDir:
    return RunDir(root, json.loads((root / "state.json").read_text()))


@dataclass
class _Ctx:
    job: ClassifyJob
    run: RunDir | None  # rank 0 only
    root: Path
    data: ClassificationData
    dist: DistContext
    log: Callable[[str], None]

    @property
    def weights(self) -> Path:
        return self.root / "weights"

    def fresh(self) -> nn.Module:
        torch.manual_seed(self.job.train.seed)  # the same initial weights in every rank and on every resume
        return self.job.factory()()

    def load_unpruned(self, path: Path) -> nn.Module:
        model = self.fresh()
        model.load_state_dict(self.dist.broadcast(dict(read_state_dict(path)) if self.dist.is_main else None))
        return model

    def load_pruned(self, path: Path) -> tuple[nn.Module, dict[str, Any]]:
        """The pruned model in every rank: rank 0 sends the checkpoint's bytes; each rank re-applies its plan."""
        from prunefx import load as load_pruned

        blob = self.dist.broadcast(path.read_bytes() if self.dist.is_main else None)
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / path.name
            local.write_bytes(blob)
            model = load_pruned(local, self.job.factory())
            plan = torch.load(local, map_location="cpu", weights_only=True)["plan"]
        return model, plan

    def recipe(self, overrides: Mapping[str, Any], epochs: int, where: str) -> TrainConfig:
        return replace(self.job.train.updated(overrides, where), epochs=epochs)

    def evaluate(self, model: nn.Module, name: str, dist: DistContext | None = None) -> dict[str, float]:
        dist = dist or self.dist
        split = getattr(self.data, self.job.eval_split)
        m = evaluate(
            model.to(dist.device), split, batch=self.job.train.eval_batch, dist=dist, workers=self.job.train.workers
        )
        self.log(
            f"  {name}: top-1 {m.top1:.4f}, top-5 {m.top5:.4f}, loss {m.loss:.4f} ({m.n} {self.job.eval_split} images)"
        )
        return {"top1": m.top1, "top5": m.top5, "loss": m.loss}


def _run_rank(job: ClassifyJob, dist: DistContext, run: RunDir | None, log: Callable[[str], None]) -> RunDir | None:
    """The stage sequence in one rank; rank 0 owns the run directory and the files."""
    if dist.is_main and run is None:  # under torchrun rank 0 opens the directory; the others learn its path
        run = RunDir.open(job.project, job.name, job.config, resume=job.resume, exist_ok=job.exist_ok)
    root = Path(dist.broadcast(str(run.root) if dist.is_main else None))
    done = set(dist.broadcast(list(run.state["stages"]) if dist.is_main else None))
    log = log if dist.is_main else (lambda _msg: None)
    if dist.is_main:
        (root / "weights").mkdir(exist_ok=True)
        log(f"run directory: {root}" + (f" ({dist.world_size} ranks, {dist.device})" if dist.distributed else ""))
    data = load_dataset(job.dataset)
    log(f"data: {data.summary()}")
    ctx = _Ctx(job, run, root, data, dist, log)
    stages = (
        ("baseline", _baseline, True),
        ("sparsity", _sparsity, True),
        ("prune", _prune, False),
        ("finetune", _finetune, True),
        ("report", _report, False),
    )  # looked up now: tests patch them
    for i, (name, fn, every_rank) in enumerate(stages, 1):
        if name in done:
            log(f"[{i}/{len(stages)}] {name}: done earlier, skipped")
            continue
        log(f"[{i}/{len(stages)}] {name}")
        if dist.is_main:
            try:
                with run.stage(name) as info:
                    fn(ctx, info)
            except BaseException:
                log(
                    f"stopped in stage {name!r}; finished stages are kept in {root}. Fix the cause and continue with "
                    f"the same config plus: resume=true name={root.name} project={root.parent}"
                )
                raise
            log(f"[{i}/{len(stages)}] {name} finished in {info['seconds']:.0f} s")
        elif every_rank:
            fn(ctx, {})
        dist.barrier()  # rank 0's files of this stage exist before any rank starts the next
    if dist.is_main:
        run.complete()
    return run


# ---------------------------------------------------------------------------------------------------------------
# Stages


def _baseline(ctx: _Ctx, info: dict[str, Any]) -> None:
    job = ctx.job
    if job.checkpoint is not None:
        model = ctx.fresh()
        if ctx.dist.is_main:
            load_weights(model, job.checkpoint, job.model, trust_checkpoint=job.trust_checkpoint)
        model.load_state_dict(ctx.dist.broadcast(model.state_dict() if ctx.dist.is_main else None))
        info["source"] = f"checkpoint {job.checkpoint}"
    else:
        model = ctx.fresh()
        result = fit(
            model,
            ctx.data.train,
            job.train,
            val=ctx.data.val,
            dist=ctx.dist,
            checkpoint=ctx.weights / "baseline_last.pt",
            log=ctx.log,
        )
        info["source"] = f"trained from scratch for {job.train.epochs} epochs"
        info["history"] = list(result.history)
    if ctx.dist.is_main:
        save_weights(model, ctx.weights / "baseline.pt", model_spec=job.model, num_classes=job.num_classes)
    info["metrics"] = ctx.evaluate(model, "baseline")


def _sparsity(ctx: _Ctx, info: dict[str, Any]) -> None:
    sp = ctx.job.prune.sparsity
    if sp.epochs == 0:
        info["skipped"] = "prune.sparsity.epochs is 0"
        return
    # scratch: the baseline's initial weights (fresh() seeds), trained with the penalty from the first step
    model = ctx.fresh() if sp.start == "scratch" else ctx.load_unpruned(ctx.weights / "baseline.pt")
    exclude = list(sp.exclude)
    if sp.exclude_residual:
        from prunefx import analyze
        from prunefx.train.sparsity import residual_bns

        exclude += residual_bns(analyze(model, (ctx.job.example(),)))
    cfg = SparsityConfig(
        s=sp.s,
        target=sp.target if sp.schedule == "target" else None,
        threshold=sp.threshold,
        select=sp.target if sp.selective else None,
        exclude=tuple(exclude),
    )
    result = fit(
        model,
        ctx.data.train,
        ctx.recipe(sp.overrides, sp.epochs, "prune.sparsity."),
        val=ctx.data.val,
        dist=ctx.dist,
        checkpoint=ctx.weights / "sparsity_last.pt",
        sparsity=cfg,
        log=ctx.log,
    )
    if ctx.dist.is_main:
        # The last epoch, not the best: sparsity grows over training and the best accuracy is usually early.
        save_weights(model, ctx.weights / "sparse.pt", model_spec=ctx.job.model, num_classes=ctx.job.num_classes)
    info["gammas"] = result.sparsity
    info["history"] = list(result.history)
    info["metrics"] = ctx.evaluate(model, "sparse")


def _prune(ctx: _Ctx, info: dict[str, Any]) -> None:
    from prunefx import prune, save
    from prunefx.analysis.view import graph_data
    from prunefx.report import write_graph

    spec, run = ctx.job.prune, ctx.run
    source = prune_source(run, ctx.weights)
    model = load_weights(ctx.fresh(), source, ctx.job.model).eval()
    x = ctx.data.example(EXAMPLE_BATCH)  # real images: compensation measures channel means on them
    kwargs: dict[str, Any] = {}
    if spec.criterion == "taylor":  # gradients of the loss on a few labelled training batches
        items = [ctx.data.train[i] for i in range(min(256, len(ctx.data.train)))]
        images, labels = torch.stack([im for im, _ in items]), torch.as_tensor([int(lb) for _, lb in items])
        kwargs = {"calibration": list(zip(images.split(64), labels.split(64), strict=True)), "loss_fn": F.cross_entropy}
    result = prune(
        model,
        (x,),
        spec.plan_config(),
        criterion=spec.criterion,
        check=spec.verify,
        bias_compensation=spec.bias_compensation,
        **kwargs,
    )
    info.update(check_pruned(result, spec, source))
    atomic_write(ctx.root / "plan.json", result.plan.to_json().encode())
    write_graph(ctx.root, graph_data(result.graph, result.plan))  # report.html draws the graph from it
    save(model, result.plan, ctx.weights / "pruned.pt")
    est = result.plan.estimate
    info["macs_kept_estimate"] = est["macs_after"] / est["macs_before"] if est.get("macs_before") else None
    ctx.log(f"  {len(result.plan.pruned)} of {len(result.plan.groups)} groups pruned; verify: {info['verify']}")
    # Only rank 0 runs this stage, so it evaluates the whole split alone.
    info["metrics"] = ctx.evaluate(model, "pruned", replace(LOCAL, device=ctx.dist.device))


def _finetune(ctx: _Ctx, info: dict[str, Any]) -> None:
    from prunefx import save
    from prunefx.plan import PruningPlan

    ft = ctx.job.prune.finetune
    if ft.epochs == 0:
        info["skipped"] = "prune.finetune.epochs is 0"
        return
    model, plan = ctx.load_pruned(ctx.weights / "pruned.pt")
    signature = arch_signature(model)
    everyone = ctx.dist.all_gather(signature)
    if any(s != signature for s in everyone):  # every rank sees the same list, so all of them raise
        bad = [r for r, s in enumerate(everyone) if s != everyone[0]]
        raise DistributedError(f"ranks {bad} rebuilt a different pruned architecture than rank 0 from pruned.pt")
    result = fit(
        model,
        ctx.data.train,
        ctx.recipe(ft.overrides, ft.epochs, "prune.finetune."),
        val=ctx.data.val,
        dist=ctx.dist,
        checkpoint=ctx.weights / "finetune_last.pt",
        log=ctx.log,
    )
    if ctx.dist.is_main:
        save(model, PruningPlan.from_dict(plan), ctx.weights / "finetuned.pt")
    # What each rank trained, as rank 0 gathered it: the architecture (a digest of every tensor's name and shape)
    # and the parameter count, so state.json shows that every rank fine-tuned the same pruned model.
    info["ranks"] = [
        {"rank": r, "arch": digest, "params": n}
        for r, (digest, n) in enumerate(
            ctx.dist.all_gather((_digest(signature), sum(p.numel() for p in model.parameters())))
        )
    ]
    info["history"] = list(result.history)
    info["metrics"] = ctx.evaluate(model, "finetuned")


def _digest(signature: list[tuple[str, tuple[int, ...]]]) -> str:
    import hashlib

    return hashlib.sha256(repr(signature).encode()).hexdigest()[:16]


def _report(ctx: _Ctx, info: dict[str, Any]) -> None:
    from prunefx import load
    from prunefx.metrics import compare_latency, measure
    from prunefx.report import Stage, build_report, write_report

    job, run = ctx.job, ctx.run
    x = job.example()
    models = {
        "baseline": load_weights(job.factory()(), ctx.weights / "baseline.pt", job.model),
        "pruned": load(ctx.weights / "pruned.pt", job.factory()),
    }
    done = {"baseline": "baseline", "pruned": "prune", "finetuned": "finetune"}
    if not run.done("finetune").get("skipped"):
        models["finetuned"] = load(ctx.weights / "finetuned.pt", job.factory())
    models = {name: m.cpu().eval() for name, m in models.items()}
    # the stages are timed in alternating rounds, so a slow spell of the machine hits them all alike
    timed = compare_latency(models, (x,)) if job.prune.latency else {}
    stages = {
        name: Stage(measure(m, (x,)), timed.get(name), dict(run.done(done[name])["metrics"]))
        for name, m in models.items()
    }
    pr = run.done("prune")
    split = getattr(ctx.data, job.eval_split)
    settings = {
        "config": dict(job.config),
        "dataset": ctx.data.summary(),
        "criterion": job.prune.criterion,
        "target": job.prune.target,
        "verify": pr["verify"],
        "pruned_from": pr["source"],
        "world_size": ctx.dist.world_size,
        "stage_seconds": {k: v.get("seconds") for k, v in run.state["stages"].items()},
        "sparsity": {"metrics": run.done("sparsity").get("metrics"), "gammas": run.done("sparsity").get("gammas")},
        "metrics_by": f"top-1/top-5 on the {job.eval_split} split ({len(split)} images, one centred view, no "
        f"augmentation); MACs at batch 1, {job.dataset.channels}x{job.dataset.size}x{job.dataset.size}",
    }
    report = build_report(
        model=job.model,
        baseline=stages["baseline"],
        pruned=stages["pruned"],
        finetuned=stages.get("finetuned"),
        widths=[(w["name"], w["before"], w["after"]) for w in pr["widths"]],
        settings=settings,
    )
    write_report(ctx.root, report)
    info["macs_kept"] = report["stages"]["pruned"]["macs"] / report["stages"]["baseline"]["macs"]
    info["files"] = sorted(p.name for p in ctx.root.iterdir() if p.is_file())


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m prunefx.pipeline.classify CONFIG [key=value ...]``, also as ``torchrun ... -m`` (one per rank)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    try:
        config = load_config(argv[0], argv[1:])
        run_classify(ClassifyJob.from_config(config, config_name=Path(argv[0]).stem))
    except PrunefxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["STAGES", "TOP_KEYS", "ClassifyJob", "main", "run_classify"]
