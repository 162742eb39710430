"""A small classification training loop: SGD/AdamW, warm-up + cosine/step lr, label smoothing, batch augmentation,
top-1/top-5, an atomic checkpoint every epoch with resume, BN sparsity, and DistributedDataParallel.

>>> cfg = TrainConfig(epochs=10, lr=0.05)
>>> result = fit(model, data, cfg, checkpoint=Path("run/last.pt"))      # resumes from run/last.pt if present
>>> evaluate(model, data.test).top1

Determinism: the model's initial weights are the caller's; the shuffle (DistributedSampler, ``seed`` + epoch),
the augmentation and torch's global RNG are re-seeded from (seed, epoch, rank) at every epoch, so a run resumed
from an epoch checkpoint continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from prunefx._config import check_fields, field_names, from_dict, to_dict
from prunefx._io import atomic_torch_save
from prunefx.errors import PrunefxError
from prunefx.train.distill import DistillConfig, classification_loss
from prunefx.train.distributed import LOCAL, DistContext
from prunefx.train.schedule import lr_multiplier
from prunefx.train.sparsity import BNSparsity, SparsityConfig, sparsity_stats

TRAIN_FORMAT = "prunefx.trainstate/1"
# Whoever runs a training without calling it (a pipeline's job progress) hears of its epoch ends here:
# fit and the ultralytics trainer's callback both call epoch_ended.
_EPOCH_LISTENER: ContextVar[Callable[[int, int], None] | None] = ContextVar("prunefx_epoch_listener", default=None)


@contextlib.contextmanager
def listening_to_epochs(listener: Callable[[int, int], None]) -> Iterator[None]:
    """Within the block, every finished training epoch calls ``listener(epoch, epochs)`` (1-based epoch)."""
    token = _EPOCH_LISTENER.set(listener)
    try:
        yield
    finally:
        _EPOCH_LISTENER.reset(token)


def epoch_ended(epoch: int, epochs: int) -> None:
    """Tell the listener of :func:`listening_to_epochs`, if any, that epoch ``epoch`` of ``epochs`` finished."""
    listener = _EPOCH_LISTENER.get()
    if listener is not None:
        listener(epoch, epochs)


class TrainError(PrunefxError):
    """Training cannot start or continue as configured (bad setting, diverged loss, foreign checkpoint)."""


@dataclass(frozen=True)
class TrainConfig:
    """A training recipe; every field is also a top-level key of a classification config."""

    epochs: int = 10
    batch: int = 64  # global batch: each of N ranks takes batch / N
    optimizer: Literal["sgd", "adamw"] = "sgd"  # sgd: momentum, nesterov
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    schedule: Literal["cosine", "step", "constant"] = "cosine"  # after warmup_epochs of linear warm-up
    warmup_epochs: float = 0.0
    lr_steps: tuple[float, ...] = (0.5, 0.75)  # schedule=step: fractions of training where lr *= lr_gamma
    lr_gamma: float = 0.1
    label_smoothing: float = 0.0
    augment: tuple[Literal["crop", "flip"], ...] = ("crop",)  # crop (pad + random crop), flip (horizontal)
    crop_pad: int = 2
    grad_clip: float | None = None  # max gradient norm; the BN-sparsity term is added after the clip
    seed: int = 0
    eval_batch: int = 256
    workers: int = 0  # DataLoader workers for datasets read from disk

    def __post_init__(self) -> None:
        check_fields(self, error=TrainError)
        problems = [
            msg
            for bad, msg in (
                (self.epochs < 0, "epochs must be >= 0"),
                (self.batch < 1, "batch must be >= 1"),
                (self.lr <= 0, "lr must be > 0"),
                (self.weight_decay < 0, "weight_decay must be >= 0"),
                (not all(0 < s < 1 for s in self.lr_steps), "lr_steps must be fractions of training in (0, 1)"),
                (not 0 <= self.label_smoothing < 1, "label_smoothing must be in [0, 1)"),
                (min(self.crop_pad, self.workers, self.warmup_epochs) < 0 or self.eval_batch < 1,
                 "crop_pad, workers and warmup_epochs must be >= 0 and eval_batch >= 1"),
                (self.grad_clip is not None and self.grad_clip <= 0, "grad_clip must be > 0 or null"),
            )
            if bad
        ]
        if problems:
            raise TrainError(problems[0])

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return field_names(cls)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "") -> TrainConfig:
        """Type-checked construction from config keys (see :func:`prunefx._config.from_dict`)."""
        return from_dict(cls, d, where.rstrip("."), error=TrainError)

    def updated(self, overrides: Mapping[str, Any], where: str = "") -> TrainConfig:
        """This recipe with ``overrides`` (e.g. a fine-tuning block's ``lr``) applied and checked."""
        return TrainConfig.from_dict({**self.to_dict(), **overrides}, where)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


@dataclass(frozen=True)
class Metrics:
    """Classification metrics over a whole split (all ranks together)."""

    top1: float
    top5: float
    loss: float
    n: int

    def to_dict(self) -> dict[str, float]:
        return {"top1": self.top1, "top5": self.top5, "loss": self.loss, "n": self.n}


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit` did: one history row per epoch (train loss, every rank's loss, val metrics, lr)."""

    history: tuple[dict[str, Any], ...]
    resumed_from: int = 0  # epochs already done in the checkpoint it resumed from
    sparsity: dict[str, float] = field(default_factory=dict)


def lr_factor(step: int, total: int, warmup: int, cfg: TrainConfig) -> float:
    """Multiplier of ``cfg.lr`` at optimizer step ``step`` of ``total`` (linear warm-up, then the schedule)."""
    return lr_multiplier(step, total, warmup, cfg.schedule, cfg.lr_steps, cfg.lr_gamma)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                               nesterov=cfg.momentum > 0)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def _seed(*parts: int) -> int:
    return abs(hash(tuple(parts))) % (2 ** 31)  # hash of a tuple of ints is stable across processes


def augment_batch(x: torch.Tensor, cfg: TrainConfig, gen: torch.Generator | None = None) -> torch.Tensor:
    """Random crop after zero padding (zero = the dataset mean after normalisation) and horizontal flip, per image
    (drawn from ``gen``, or torch's global generator)."""
    n, _, h, w = x.shape
    if "crop" in cfg.augment and cfg.crop_pad > 0:
        p = cfg.crop_pad
        padded = F.pad(x, (p, p, p, p))
        dy = torch.randint(0, 2 * p + 1, (n,), generator=gen).to(x.device)
        dx = torch.randint(0, 2 * p + 1, (n,), generator=gen).to(x.device)
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
        x = padded[torch.arange(n, device=x.device)[:, None, None, None],
                   torch.arange(x.shape[1], device=x.device)[None, :, None, None], rows, cols]
    if "flip" in cfg.augment:
        flip = (torch.rand(n, generator=gen) < 0.5).to(x.device)
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    return x


def _batches(dataset: Dataset, indices: Sequence[int], batch: int, *, drop_last: bool, workers: int,
             device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) batches of ``dataset[indices]``: whole-batch indexing in memory, a DataLoader from disk."""
    from prunefx.data.classification import TensorSplit

    if isinstance(dataset, TensorSplit):
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        stop = len(idx) - (len(idx) % batch if drop_last else 0)
        for i in range(0, stop, batch):
            x, y = dataset[idx[i:i + batch]]
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        return
    loader = DataLoader(torch.utils.data.Subset(dataset, list(indices)), batch_size=batch, shuffle=False,
                        drop_last=drop_last, num_workers=workers, pin_memory=device.type == "cuda")
    for x, y in loader:
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


@torch.no_grad()
def evaluate(model: nn.Module, dataset: Dataset, *, batch: int = 256, dist: DistContext = LOCAL,
             workers: int = 0) -> Metrics:
    """Top-1/top-5 and mean cross-entropy over all of ``dataset``; each rank takes every world_size-th image."""
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    was_training = module.training
    module.eval()
    # A strided shard, not DistributedSampler: no padding duplicates, so the sums over ranks are exact.
    shard = range(dist.rank, len(dataset), dist.world_size)
    sums = torch.zeros(4, dtype=torch.float64)
    try:
        for x, y in _batches(dataset, shard, batch, drop_last=False, workers=workers, device=dist.device):
            out = module(x)
            k = min(5, out.shape[1])
            top = out.topk(k, dim=1).indices
            hit = top == y[:, None]
            sums += torch.tensor([hit[:, 0].sum().item(), hit.any(1).sum().item(),
                                  F.cross_entropy(out, y, reduction="sum").item(), len(y)], dtype=torch.float64)
    finally:
        module.train(was_training)
    c1, c5, loss, n = dist.all_reduce_sum(sums).tolist()
    if n == 0:
        raise TrainError("cannot evaluate on an empty split")
    return Metrics(c1 / n, c5 / n, loss / n, int(n))


def fit(model: nn.Module, train: Dataset, cfg: TrainConfig, *, val: Dataset | None = None,
        dist: DistContext = LOCAL, checkpoint: Path | None = None, sparsity: SparsityConfig | None = None,
        log: Callable[[str], None] = print, progress: bool | None = None,
        on_epoch: Callable[[int, dict[str, Any]], None] | None = None, teacher: nn.Module | None = None,
        distill: DistillConfig | None = None) -> FitResult:
    """Train ``model`` (in place, on ``dist.device``) for ``cfg.epochs``; see the module docstring.

    ``checkpoint``: after every epoch rank 0 writes the full training state there (atomically); if the file
    exists when called, training continues after its last epoch. ``on_epoch(epoch, row)`` runs after each
    epoch's checkpoint (tests use it to interrupt a run); rank 0 also tells the listener of
    :func:`listening_to_epochs` (a pipeline's job progress). ``teacher``: a frozen model whose logits the loss
    distils (``distill``, default :class:`DistillConfig`); every rank runs its own copy.
    """
    if teacher is not None:
        distill = (distill or DistillConfig()).check_share("distill.weight")  # before any work
        teacher = teacher.to(dist.device).eval().requires_grad_(False)
    model.to(dist.device)
    module = model
    if dist.distributed:
        ddp_kw = {"device_ids": [dist.device.index]} if dist.device.type == "cuda" else {}
        model = nn.parallel.DistributedDataParallel(module, **ddp_kw)  # also syncs rank 0's weights to all ranks
    opt = make_optimizer(module, cfg)
    per_rank = max(1, cfg.batch // dist.world_size)
    sampler = DistributedSampler(train, num_replicas=dist.world_size, rank=dist.rank, shuffle=True, seed=cfg.seed)
    drop_last = len(sampler) >= 2 * per_rank  # a lone tiny last batch makes BatchNorm statistics useless
    steps_per_epoch = len(sampler) // per_rank if drop_last else math.ceil(len(sampler) / per_rank)
    total, warmup = cfg.epochs * steps_per_epoch, int(cfg.warmup_epochs * steps_per_epoch)
    reg = sparsity.regularizer(module, total).attach(opt) if sparsity is not None else None
    history: list[dict[str, Any]] = []
    start = 0
    if checkpoint is not None:
        state = dist.broadcast(_read_state(checkpoint) if dist.is_main and checkpoint.is_file() else None)
        if state is not None:
            start, history = _restore(state, module, opt, reg, cfg, checkpoint)
            log(f"  resumed from {checkpoint} after epoch {start} of {cfg.epochs}")
    show = (dist.is_main and sys.stdout.isatty()) if progress is None else (progress and dist.is_main)
    run = _Epoch(model=model, module=module, train=train, sampler=sampler, opt=opt, reg=reg, cfg=cfg, dist=dist,
                 per_rank=per_rank, drop_last=drop_last, steps_per_epoch=steps_per_epoch, total=total, warmup=warmup,
                 show=show, teacher=teacher, distill=distill)
    try:
        for epoch in range(start, cfg.epochs):
            row = _train_epoch(run, epoch)
            if val is not None:
                row |= {f"val_{k}": v for k, v in evaluate(module, val, batch=cfg.eval_batch, dist=dist,
                                                           workers=cfg.workers).to_dict().items() if k != "n"}
            history.append(row)
            if checkpoint is not None and dist.is_main:
                atomic_torch_save({"format": TRAIN_FORMAT, "epoch": epoch + 1, "model": module.state_dict(),
                                   "optimizer": opt.state_dict(), "sparsity": reg.state_dict() if reg else None,
                                   "history": history, "config": cfg.to_dict(), "world_size": dist.world_size},
                                  checkpoint)
            log(f"  epoch {epoch + 1}/{cfg.epochs}: loss {row['loss']:.4f}"
                + (f", val top-1 {row['val_top1']:.4f}" if "val_top1" in row else "") + f", lr {row['lr']:.2e}")
            if dist.is_main:
                epoch_ended(epoch + 1, cfg.epochs)
            if on_epoch is not None:
                on_epoch(epoch, row)
    finally:
        if reg is not None:
            reg.detach()
    module.eval()
    return FitResult(tuple(history), start, sparsity_stats(module).flat() if reg is not None else {})


@dataclass(frozen=True)
class _Epoch:
    """What every epoch of one :func:`fit` trains with."""

    model: nn.Module  # what the forward runs: the DDP wrapper when distributed
    module: nn.Module  # the model itself (its parameters, train/eval mode)
    train: Dataset
    sampler: DistributedSampler
    opt: torch.optim.Optimizer
    reg: BNSparsity | None
    cfg: TrainConfig
    dist: DistContext
    per_rank: int  # batch size of one rank
    drop_last: bool
    steps_per_epoch: int
    total: int  # optimizer steps of the whole fit, for the lr schedule
    warmup: int  # warm-up steps
    show: bool  # draw a progress bar
    teacher: nn.Module | None = None
    distill: DistillConfig | None = None


def _train_epoch(run: _Epoch, epoch: int) -> dict[str, Any]:
    """Train one epoch (0-based ``epoch``); its history row."""
    model, module, opt, reg, cfg, dist = run.model, run.module, run.opt, run.reg, run.cfg, run.dist
    sampler, teacher, distill, steps_per_epoch = run.sampler, run.teacher, run.distill, run.steps_per_epoch
    sampler.set_epoch(epoch)
    torch.manual_seed(_seed(cfg.seed, epoch, dist.rank))  # dropout etc. reproducible after a resume
    gen = torch.Generator().manual_seed(_seed(cfg.seed, epoch, dist.rank, 1))
    module.train()
    sums = torch.zeros(3, dtype=torch.float64)  # loss * n, correct, n (this rank)
    bar = _progress(run.show, f"epoch {epoch + 1}/{cfg.epochs}", steps_per_epoch)
    try:
        for i, (x, y) in enumerate(_batches(run.train, list(sampler), run.per_rank, drop_last=run.drop_last,
                                            workers=cfg.workers, device=dist.device)):
            step = epoch * steps_per_epoch + i
            for g in opt.param_groups:
                g["lr"] = cfg.lr * lr_factor(step, run.total, run.warmup, cfg)
            x = augment_batch(x, cfg, gen)
            out = model(x)
            with torch.no_grad():
                soft = teacher(x) if teacher is not None else None  # the teacher sees the same augmented batch
            loss = classification_loss(out, y, soft, distill, cfg.label_smoothing)
            if not torch.isfinite(loss):
                raise TrainError(f"the training loss became {loss.item()} at epoch {epoch + 1}, step {i + 1} "
                                 f"(rank {dist.rank}); lower lr (now {opt.param_groups[0]['lr']:.3g}) or add grad_clip")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip is not None:
                nn.utils.clip_grad_norm_(module.parameters(), cfg.grad_clip)
            opt.step()  # BNSparsity's pre-hook adds s * sign(gamma) here, after the clip
            sums += torch.tensor([loss.item() * len(y), (out.argmax(1) == y).sum().item(), len(y)], dtype=torch.float64)
            if bar is not None:
                bar[0].update(bar[1], advance=1, description=f"epoch {epoch + 1}/{cfg.epochs} loss {loss.item():.3f}")
    finally:
        if bar is not None:
            bar[0].stop()
    local = float(sums[0] / max(sums[2], 1))
    total_sums = dist.all_reduce_sum(sums.clone())
    row = {
        "epoch": epoch + 1,
        "loss": float(total_sums[0] / total_sums[2]),
        "top1": float(total_sums[1] / total_sums[2]),
        "rank_loss": [float(v) for v in dist.all_gather(local)],
        "lr": opt.param_groups[0]["lr"],
    }
    if reg is not None:
        row["sparsity_s"] = reg.step_s
    return row


def _progress(show: bool, description: str, total: int) -> tuple[Any, Any] | None:
    if not show:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), transient=True
    )
    bar.start()
    return bar, bar.add_task(description, total=total)


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated or foreign file
        raise TrainError(
            f"cannot resume from {path}: not a readable checkpoint ({type(exc).__name__}: {exc}); "
            "delete it to restart this stage from its beginning"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != TRAIN_FORMAT:
        raise TrainError(
            f"cannot resume from {path}: not a prunefx training checkpoint; delete it to restart the stage"
        )
    return state


def _restore(
    state: dict[str, Any],
    module: nn.Module,
    opt: torch.optim.Optimizer,
    reg: BNSparsity | None,
    cfg: TrainConfig,
    path: Path,
) -> tuple[int, list[dict[str, Any]]]:
    saved = TrainConfig.from_dict(state["config"])
    if replace(saved, epochs=cfg.epochs) != cfg:
        raise TrainError(
            f"cannot resume from {path}: it was trained with another recipe ({_diff(saved, cfg)}); "
            "resume with the same settings, or delete it to restart the stage"
        )
    try:
        module.load_state_dict(state["model"])
    except RuntimeError as exc:
        raise TrainError(f"cannot resume from {path}: its weights do not fit this model ({_first_line(exc)})") from exc
    opt.load_state_dict(state["optimizer"])
    if reg is not None and state.get("sparsity"):
        reg.load_state_dict(state["sparsity"])
    return min(int(state["epoch"]), cfg.epochs), list(state["history"])


def _diff(a: TrainConfig, b: TrainConfig) -> str:
    return ", ".join(
        f"{k}: {getattr(a, k)!r} -> {getattr(b, k)!r}"
        for k in a.keys()
        if getattr(a, k) != getattr(b, k) and k != "epochs"
    )


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:400] + ("..." if len(text) > 400 else "")


__all__ = [
    "TRAIN_FORMAT",
    "FitResult",
    "Metrics",
    "TrainConfig",
    "TrainError",
    "augment_batch",
    "evaluate",
    "fit",
    "lr_factor",
    "make_optimizer",
]
