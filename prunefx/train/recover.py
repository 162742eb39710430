"""Recovery for any model: distil the unpruned model's outputs into the pruned one on the user's data (accelerate).

    result = recover(pruned, original, data=batches, config=RecoverConfig(steps=300, lr=1e-4),
                     eval_data=held_out, metric=lambda m: my_accuracy(m))

Any input: a batch is a tensor (one positional input), a tuple / list (positional inputs) or a mapping (keyword
inputs, e.g. ``input_ids=``); ``inputs=`` maps other batch forms to one of those. Any output: the outputs of both
models are flattened (torch's pytree: tuples, lists, dicts, Hugging Face ``ModelOutput``) and each floating leaf
gets a distillation loss that fits it, named in ``RecoverResult.losses``:

* ``kl``: T^2 * KL(softmax(teacher / T) || softmax(student / T)) over the last dim, averaged over every other
  position (logits: a classifier's, an LLM's per token); the default for a leaf named ``logits``.
* ``mse``: the squared error divided by the teacher leaf's mean square on the first batch (a constant, so leaves
  of any scale weigh alike and the loss stays a plain scaled MSE); the default for every other leaf
  (regression, features, boxes).
* ``bce``: T^2 * the binary KL between sigmoid(teacher / T) and sigmoid(student / T) (independent sigmoid scores,
  multi-label), zero when they agree.
* ``skip``: not distilled.

Outputs that are probabilities (a sigmoid or softmax head) get the same divergences computed on their logs
(``config.outputs``, named per leaf in ``RecoverResult.outputs``): ``"auto"`` checks the teacher's outputs on the
first batch, and a leaf whose values all lie in [0, 1] is a ``distribution`` when its rows sum to 1 along the last
dim (within 1e-3, last dim > 1; its loss: ``kl`` on log p) and ``probabilities`` otherwise (its loss: ``bce`` on
logit p); probabilities are clamped to [1e-6, 1 - 1e-6] first. ``"logits"`` takes every leaf as raw values (kl on
``logits``, mse elsewhere); ``"probabilities"`` declares them and refuses a leaf outside [0, 1]. An explicit
``kl`` / ``bce`` on a probability leaf is computed on its logs too; ``mse`` stays on the values.

With ``eval_data`` or ``metric``, the best evaluation's state is kept (``config.keep_best``): the student's
state_dict is copied (to the CPU) at each evaluation that beats the best so far, and put back at the end when the
end is worse. "Better" is the metric's (its first value for a dict; higher unless ``metric_goal="min"``) when a
metric is given, else eval_data's distillation loss (lower). ``RecoverResult.kept`` says which state was returned
and ``worse_than_start`` whether the end was worse than the start; both are logged. The best state is part of a
checkpoint, so a resumed run returns what the uninterrupted one would.

``config.loss`` sets one kind for every leaf, or a mapping from leaf name (as ``losses`` lists them) to kind.
``task_loss(student_output, batch)`` (the user's, on their targets; ``batch`` as ``data`` yields it, before
``inputs=``) is mixed in as ``(1 - w) * KD + w * task``; ``config.features`` adds a scaled MSE between the two
models' outputs at named modules (outputs of the same shape: the residual stream, a block's output);
``teacher=None`` trains on ``task_loss`` alone. AdamW or SGD, linear warm-up then cosine, step decay or constant,
gradient clipping. ``metric(model)`` is called with the model on the
accelerator's device (move its batches there). Both models end on the device they started on, the teacher in the
mode and with the ``requires_grad`` flags it was given.

The engine is Hugging Face ``accelerate``: one loop for the CPU, one GPU, DDP (``accelerate launch``), FSDP or
DeepSpeed through accelerate's own config (checkpoints: one process or DDP). It is already what the Hugging Face
stack trains with, it wraps a plain PyTorch loop instead of owning it (Lightning Fabric would as well, but adds a
framework that nothing else here needs).
``checkpoint_dir`` + ``resume=True`` continue a run where it stopped, identically when the data order is
deterministic (a list of batches, or a DataLoader with its own seeded generator); resuming a finished run (its
checkpoint at ``steps``) loads it and trains nothing. A checkpoint is JSON and tensors read weights-only
(:mod:`prunefx.train.recover_checkpoint`): nothing a resume reads runs as code. ``metric``, ``task_loss`` and the
iteration of ``data`` are user code: their failures (an exception, ``sys.exit``) are one :class:`UserCodeError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import GetAttrKey, MappingKey, SequenceKey, tree_flatten_with_path

from prunefx._config import ConfigError, check_fields
from prunefx._extras import require
from prunefx.capture.inputs import Inputs
from prunefx.train.recover_checkpoint import (
    STATE_FILE,
    RecoverError,
    check_engine,
    config_record,
    earlier,
    load_best,
    load_state,
    resume_point,
    save_state,
)
from prunefx.train.schedule import SCHEDULES, lr_multiplier
from prunefx.train.user_code import UserCodeError, fenced

KINDS = ("kl", "mse", "bce", "skip")
OUTPUTS = ("auto", "logits", "probabilities")
_EPS = 1e-6  # probabilities clamped to [eps, 1 - eps] before their logs: float32 keeps 1 - 1e-6 apart from 1
_SUMS_TO_ONE = 1e-3  # how far a row's sum may be from 1 for the row to be a distribution


@dataclass(frozen=True)
class RecoverConfig:
    """How :func:`recover` trains: steps, optimiser, schedule, losses, reporting and checkpoints."""

    steps: int = 500  # optimiser steps; the data is cycled through as often as that takes
    lr: float = 1e-4  # AdamW's peak learning rate
    weight_decay: float = 0.0
    optimizer: str = "adamw"  # "adamw", or "sgd" (with momentum: Nesterov's)
    momentum: float = 0.9  # sgd only
    warmup: int = 0  # steps of linear warm-up from 0 to lr
    schedule: str = "cosine"  # after warm-up: "cosine" (to 0 at the last step), "step" or "constant"
    milestones: tuple[float, ...] = (0.5, 0.75)  # schedule "step": fractions of the steps after warm-up where
    gamma: float = 0.1  # ... the lr is multiplied by gamma
    clip: float = 1.0  # gradient norm clipping; 0 turns it off
    loss: str | Mapping[str, str] = "auto"  # "auto", one of KINDS for every output leaf, or leaf name -> kind
    temperature: float = 2.0  # kl / bce softening; the term is scaled by T^2
    task_weight: float = 0.5  # w in (1 - w) * KD + w * task, when task_loss is given
    features: tuple[str, ...] = ()  # modules whose outputs are distilled too (scaled MSE), same names in both models
    feature_weight: float = 1.0
    log_every: int = 50  # a progress line every this many steps (and at the last); 0: none
    eval_every: int = 0  # evaluate (eval_data's distillation loss, metric) every this many steps; 0: start and end
    checkpoint_every: int = 0  # save a resumable checkpoint every this many steps (and at the last); 0: at the end
    seed: int = 0
    outputs: str = "auto"  # "auto" (probabilities recognised on the first batch), "logits" or "probabilities"
    keep_best: bool = True  # with an eval: the best evaluation's state is returned when the end is worse
    metric_goal: str = "max"  # "max" (accuracy) or "min" (error, perplexity): which way the metric improves

    def __post_init__(self) -> None:
        loss = self.loss
        object.__setattr__(self, "loss", "auto")  # checked below: check_fields reads one annotation at a time
        check_fields(self)
        object.__setattr__(self, "loss", loss if isinstance(loss, str) else dict(loss))
        bad = [f"{k}={v!r}" for k, v in (("steps", self.steps), ("warmup", self.warmup), ("log_every", self.log_every),
                                          ("eval_every", self.eval_every), ("checkpoint_every", self.checkpoint_every))
               if v < 0] + [f"{k}={v!r}" for k, v in (("lr", self.lr), ("temperature", self.temperature)) if v <= 0]
        if self.steps < 1:
            bad.append(f"steps={self.steps}")
        if not 0 <= self.task_weight <= 1:
            bad.append(f"task_weight={self.task_weight} (a share in [0, 1])")
        if self.schedule not in SCHEDULES:
            bad.append(f"schedule={self.schedule!r} ({', '.join(SCHEDULES)})")
        if self.outputs not in OUTPUTS:
            bad.append(f"outputs={self.outputs!r} ({', '.join(OUTPUTS)})")
        if self.metric_goal not in ("max", "min"):
            bad.append(f"metric_goal={self.metric_goal!r} (max or min)")
        if self.optimizer not in ("adamw", "sgd"):
            bad.append(f"optimizer={self.optimizer!r} (adamw or sgd)")
        if not 0 <= self.momentum < 1 or not 0 < self.gamma <= 1 or not all(0 < m < 1 for m in self.milestones):
            bad.append(f"momentum={self.momentum}, gamma={self.gamma}, milestones={self.milestones} (momentum in "
                       "[0, 1), gamma in (0, 1], milestones fractions in (0, 1))")
        kinds = [self.loss] if isinstance(self.loss, str) else list(self.loss.values())
        bad += [f"loss {k!r} (one of auto, {', '.join(KINDS)})" for k in kinds
                if k not in KINDS and not (k == "auto" and isinstance(self.loss, str))]
        if bad:
            raise ConfigError(f"RecoverConfig: invalid {', '.join(bad)}; steps >= 1, lr and temperature > 0, counts "
                              ">= 0")


@dataclass(frozen=True)
class RecoverResult:
    """What :func:`recover` did: the loss of each output leaf, the progress, the evaluations."""

    steps: int  # the step the run ended at (counted from the start of a resumed run's first part)
    losses: Mapping[str, str]  # output leaf -> the distillation loss it got (none without a teacher)
    # at each progress line: step, loss and process_loss (the mean since the previous line, over all processes and
    # each process's own), lr
    history: tuple[Mapping[str, Any], ...]
    evals: tuple[Mapping[str, Any], ...]  # step, distill (eval_data's mean distillation loss), metric
    seconds: float
    resumed_from: int = 0  # the checkpoint's step, 0 for a fresh run
    processes: int = 1
    outputs: Mapping[str, str] | None = None  # output leaf -> "logits", "distribution" or "probabilities"
    kept: str = "end"  # the state returned: "end", or "best" (an earlier evaluation's, the end being worse)
    best: Mapping[str, Any] | None = None  # the evaluation whose state was returned ("best"), or the best one seen
    worse_than_start: bool = False  # the end's evaluation was worse than the start's
    judged_by: str | None = None  # what "better" meant: "metric (higher is better)", "distill loss", None: no eval

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a report."""
        return {**asdict(self), "losses": dict(self.losses),
                "outputs": dict(self.outputs) if self.outputs is not None else None}


def recover(
    student: nn.Module,
    teacher: nn.Module | None,
    data: Iterable[Any],
    *,
    config: RecoverConfig | None = None,
    inputs: Callable[[Any], Any] | None = None,
    task_loss: Callable[[Any, Any], torch.Tensor] | None = None,
    eval_data: Sequence[Any] | None = None,
    metric: Callable[[nn.Module], Any] | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    accelerator: Any = None,
    log: Callable[[str], None] = print,
) -> RecoverResult:
    """Train ``student`` (in place) to reproduce ``teacher``'s outputs on ``data``; ``teacher`` is not changed.

    ``teacher=None`` fine-tunes on ``task_loss`` alone (then required), on the same engine.
    """
    Accelerator = require("accelerate", "prunefx.train.recover").Accelerator
    from accelerate.utils import set_seed

    cfg = config or RecoverConfig()
    if teacher is None and task_loss is None:
        raise RecoverError("recover: no teacher and no task_loss, so nothing to learn from; pass the unpruned model "
                           "as teacher, or a task_loss(output, batch)")
    _check_trainable(student, teacher)
    task_loss = fenced(task_loss, "task_loss") if task_loss is not None else None
    metric = fenced(metric, "metric") if metric is not None else None
    acc = accelerator if accelerator is not None else Accelerator()
    root = Path(checkpoint_dir) if checkpoint_dir is not None else None
    check_engine(acc, root)
    start, saved = resume_point(root, config_record(cfg), cfg.steps, resume)
    set_seed(cfg.seed)
    batches = _batches(data, acc)
    read = fenced(next, "data", name=_data_name(data), fix="fix the dataset or loader")  # its batches are user code
    homes = [(m, next((p.device for p in m.parameters()), None), m.training, [p.requires_grad for p in
                                                                           m.parameters()])
             for m in (student, teacher) if m is not None]
    try:  # on success and on failure, both models end where they started (the teacher as it was given)
        if teacher is not None:
            teacher.to(acc.device).eval().requires_grad_(False)
        student.to(acc.device).train()
        to_args = inputs or (lambda b: b)
        first = read(iter(batches()), None)
        if first is None:
            raise RecoverError("recover: data yielded no batch; pass an iterable of model inputs (tensors, tuples or "
                               "dicts)")
        kinds: dict[str, str] = {}
        scales: dict[str, float] = {}
        spaces: dict[str, str] = {}
        if teacher is not None:
            args, kwargs = _call(to_args(first), acc.device)
            with torch.no_grad():
                kinds, scales, spaces = _losses(teacher(*args, **kwargs), cfg, acc)
        optimizer = _optimizer([p for p in student.parameters() if p.requires_grad], cfg)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda i: lr_multiplier(i, cfg.steps, cfg.warmup, cfg.schedule, cfg.milestones, cfg.gamma))
        # Not prepared: accelerate would step it once per process per call (it counts epochs of a split dataset); this
        # schedule counts optimiser steps, so the step is all of its state.
        model, optimizer = acc.prepare(student, optimizer)
        stream = _cycle(batches)
        for _ in range(start if start < cfg.steps else 0):  # the batches trained on before the checkpoint, replayed
            read(stream)                                      # without a forward (a finished run reads none)
        if start:
            assert root is not None  # resume_point gives a start only from a checkpoint
            load_state(acc, root, start, model, optimizer)  # the optimiser's lr is the schedule's at start
            groups = optimizer.param_groups
            scheduler.load_state_dict({"last_epoch": start, "_step_count": start + 1,
                                       "lr_lambdas": [None] * len(groups), "_last_lr": [g["lr"] for g in groups]})
        hooks = _FeatureHooks(acc.unwrap_model(model), teacher, cfg.features)
        history, evals, since = earlier(saved, start, acc)  # a resumed run reports the whole run
        began, say = time.perf_counter(), (log if acc.is_main_process else (lambda _msg: None))
        say(f"recover: {cfg.steps - start} steps from step {start} on {acc.num_processes} process(es), device "
            f"{acc.device}; losses: {_named_losses(kinds, spaces) or 'task_loss only'}")
        evaluate = _Evaluator(model, teacher, eval_data, metric, to_args, kinds, scales, spaces, cfg, hooks, acc, say)
        best = _Best(acc.unwrap_model(model), cfg)
        earlier_best = saved.get("best") if start else None  # the best evaluation before the checkpoint
        if isinstance(earlier_best, dict) and type(earlier_best.get("step")) is int:
            assert root is not None
            best.best, best.state = dict(earlier_best), load_best(root, start) if cfg.keep_best else None
        if eval_data is not None or metric is not None:
            evals.append(evaluate(start))
            best.see(evals[-1], last=start == cfg.steps)  # a finished run's start is its end
        try:
            for step in range(start + 1, cfg.steps + 1):
                batch = read(stream)
                args, kwargs = _call(to_args(batch), acc.device)
                out = model(*args, **kwargs)
                if teacher is None:
                    loss = _scalar(task_loss(out, batch), "task_loss")  # type: ignore[misc]  # checked above
                else:
                    with torch.no_grad():
                        target = teacher(*args, **kwargs)
                    hooks.teacher_done()
                    loss = _distill(out, target, kinds, scales, spaces, cfg) + hooks.loss(cfg.feature_weight)
                    if task_loss is not None:
                        loss = ((1 - cfg.task_weight) * loss
                                + cfg.task_weight * _scalar(task_loss(out, batch), "task_loss"))
                if not torch.isfinite(loss):
                    raise RecoverError(f"recover: the loss is {loss.item()} at step {step}; lower lr (now {cfg.lr:g}), "
                                       "set clip, or check the data and task_loss")
                optimizer.zero_grad(set_to_none=True)
                acc.backward(loss)
                if cfg.clip:
                    acc.clip_grad_norm_(model.parameters(), cfg.clip)
                optimizer.step()
                scheduler.step()
                since += torch.tensor([float(loss.detach()), 1.0], dtype=torch.float64)
                if cfg.log_every and (step % cfg.log_every == 0 or step == cfg.steps):
                    each = [float(v) for v in acc.gather((since[0] / since[1]).reshape(1).to(acc.device)).cpu()]
                    mean = sum(each) / len(each)
                    since.zero_()
                    history.append({"step": step, "loss": mean, "process_loss": each,
                                    "lr": scheduler.get_last_lr()[0]})
                    rate = (step - start) / max(time.perf_counter() - began, 1e-9)
                    say(f"recover: step {step}/{cfg.steps}  loss {mean:.4g}  lr {history[-1]['lr']:.3g}  "
                        f"ETA {(cfg.steps - step) / rate:.0f} s")
                if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.steps:
                    evals.append(evaluate(step))
                    best.see(evals[-1])
                if root is not None and ((cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
                                         or step == cfg.steps):
                    save_state(acc, root, step, {"config": config_record(cfg), "losses": dict(kinds),
                                                 "history": list(history), "evals": list(evals), "best": best.best},
                               model, optimizer, since, best.state)
        finally:
            hooks.remove()
        if (eval_data is not None or metric is not None) and start < cfg.steps:  # a finished run's was its start
            evals.append(evaluate(cfg.steps))
            best.see(evals[-1], last=True)
        ending = best.finish(evals, say)
        model.eval()
    finally:
        _home(homes)
    return RecoverResult(cfg.steps, kinds, tuple(history), tuple(evals), time.perf_counter() - began, start,
                         acc.num_processes, outputs=spaces, **ending)


def _check_trainable(student: nn.Module, teacher: nn.Module | None) -> None:
    """Refuse a student that cannot learn: the teacher object itself, or one with every parameter frozen."""
    if student is teacher:
        raise RecoverError("recover: the student is the teacher object (the same model); pass the pruned model as "
                           "student and the unpruned one as teacher (copy.deepcopy the original before pruning)")
    if not any(p.requires_grad for p in student.parameters()):
        raise RecoverError("recover: the student has no trainable parameter (none, or every one has requires_grad "
                           "False); unfreeze what should train (student.requires_grad_(True))")


def _data_name(data: Any) -> str:
    """How an error names the data: its type, and a loader's dataset."""
    dataset = getattr(data, "dataset", None)
    return f"({type(data).__name__}{f' over {type(dataset).__name__}' if dataset is not None else ''})"


def _home(homes: list) -> None:
    """Each model back on the device it started on; the teacher in its mode and requires_grad."""
    for m, device, _, _grads in homes:
        if device is not None:
            m.to(device)
    for teacher, _, training, grads in homes[1:]:
        for p, grad in zip(teacher.parameters(), grads, strict=True):
            p.requires_grad_(grad)
        teacher.train(training)


# ---- inputs and data ------------------------------------------------------------------------------------------------


def _call(batch: Any, device: torch.device) -> tuple[tuple, dict]:
    """(positional, keyword) model inputs of ``batch``, on ``device``."""
    def move(x: Any) -> Any:
        return x.to(device) if isinstance(x, torch.Tensor) else x

    if isinstance(batch, torch.Tensor):
        return (move(batch),), {}
    if isinstance(batch, Inputs):
        return tuple(move(x) for x in batch.args), {k: move(v) for k, v in batch.kwargs.items()}
    if isinstance(batch, Mapping):
        return (), {k: move(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(move(x) for x in batch), {}
    raise RecoverError(f"recover: a batch is a {type(batch).__name__}; give tensors, tuples / lists (positional "
                       "inputs) or dicts (keyword inputs), or inputs=fn mapping a batch to one of those")


def _batches(data: Iterable[Any], acc: Any) -> Callable[[], Iterable[Any]]:
    """A fresh pass over this process's share of ``data`` each call."""
    if isinstance(data, torch.utils.data.DataLoader):
        loader = acc.prepare_data_loader(data)
        return lambda: loader
    if isinstance(data, Iterator):
        raise RecoverError("recover: data is a one-shot iterator (a generator); pass a list of batches or a "
                           "DataLoader, which can be passed over again")
    items = list(data)
    share = items[acc.process_index::acc.num_processes] if acc.num_processes > 1 else items
    if acc.num_processes > 1 and len(items) % acc.num_processes:
        raise RecoverError(f"recover: {len(items)} batches do not split evenly over {acc.num_processes} processes; "
                           "pass a multiple of the process count, or a DataLoader")
    return lambda: share


def _cycle(batches: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    epoch = 0
    while True:
        loader = batches()
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _optimizer(params: list[nn.Parameter], cfg: RecoverConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                               nesterov=cfg.momentum > 0)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


# ---- losses ---------------------------------------------------------------------------------------------------------


def _leaves(out: Any) -> dict[str, torch.Tensor]:
    """The floating tensors of a model output, by name (``logits``, ``0``, ``boxes.1``; ``output`` for a tensor)."""
    named = {}
    for path, leaf in tree_flatten_with_path(out)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            parts = [str(k.key if isinstance(k, MappingKey) else k.idx if isinstance(k, SequenceKey) else
                         k.name if isinstance(k, GetAttrKey) else k) for k in path]
            named[".".join(parts) or "output"] = leaf
    return named


def _losses(out: Any, cfg: RecoverConfig, acc: Any) -> tuple[dict[str, str], dict[str, float], dict[str, str]]:
    """Each output leaf's loss kind, the scale (the teacher's mean square) an mse leaf is divided by, and what its
    values are (logits, distribution, probabilities)."""
    leaves = _leaves(out)
    if not leaves:
        raise RecoverError("recover: the model's output has no floating-point tensor to distil; return logits or "
                           "features (a tensor, tuple, dict or ModelOutput)")
    given = cfg.loss if isinstance(cfg.loss, Mapping) else {}
    unknown = sorted(set(given) - set(leaves))
    if unknown:
        raise RecoverError(f"recover: config.loss names {', '.join(unknown)}, not leaves of the model's output; its "
                           f"leaves are: {', '.join(leaves)}")
    spaces = {name: _space(name, leaf, cfg.outputs, acc) for name, leaf in leaves.items()}
    kinds = {}
    for name in leaves:
        kind = given.get(name, "auto") if given else cfg.loss
        if kind == "auto":
            kind = {"distribution": "kl", "probabilities": "bce"}.get(
                spaces[name], "kl" if name.rsplit(".", 1)[-1] == "logits" else "mse")
        kinds[name] = kind
    if all(k == "skip" for k in kinds.values()):
        raise RecoverError("recover: every output leaf is skipped; give at least one a loss (kl, mse or bce)")
    scales = {n: float(acc.reduce(leaves[n].double().square().mean(), "mean")) for n, k in kinds.items()
              if k == "mse"}
    return kinds, {n: max(s, 1e-12) for n, s in scales.items()}, spaces


def _space(name: str, leaf: torch.Tensor, declared: str, acc: Any) -> str:
    """What a teacher output leaf holds: "distribution" (in [0, 1], rows summing to 1 along the last dim),
    "probabilities" (in [0, 1]) or "logits" (anything else, or ``outputs="logits"``); agreed by every process."""
    if declared == "logits":
        return "logits"
    x = leaf.detach().double()
    bounded = bool(x.numel()) and bool(((x >= 0) & (x <= 1)).all())
    rows = bounded and x.dim() >= 1 and x.shape[-1] > 1 and bool(((x.sum(-1) - 1).abs() <= _SUMS_TO_ONE).all())
    flags = acc.reduce(torch.tensor([float(bounded), float(rows)], device=acc.device), "mean")
    bounded, rows = bool(flags[0] == 1), bool(flags[1] == 1)
    if declared == "probabilities" and not bounded:
        raise RecoverError(f"recover: outputs='probabilities' but the original's output {name} has values outside "
                           f"[0, 1] (min {float(x.min()):.4g}, max {float(x.max()):.4g}); set outputs='logits' or "
                           "'auto'")
    return "distribution" if rows else "probabilities" if bounded else "logits"


def _named_losses(kinds: Mapping[str, str], spaces: Mapping[str, str]) -> str:
    """The log line's losses: each leaf's kind, and what it is computed on when the leaf is probabilities."""
    def on(name: str, kind: str) -> str:
        space = spaces.get(name, "logits")
        if space == "logits" or kind in ("mse", "skip"):
            return ""
        return (f" on {'log' if kind == 'kl' else 'logit'} p ({space}: "
                f"{'rows sum to 1' if space == 'distribution' else 'values in [0, 1]'})")

    return ", ".join(f"{k} {v}{on(k, v)}" for k, v in kinds.items())


def _distill(student: Any, teacher: Any, kinds: Mapping[str, str], scales: Mapping[str, float],
             spaces: Mapping[str, str], cfg: RecoverConfig) -> torch.Tensor:
    s, t = _leaves(student), _leaves(teacher)
    total = None
    for name, kind in kinds.items():
        if kind == "skip":
            continue
        if name not in s or s[name].shape != t[name].shape:
            raise RecoverError(f"recover: the pruned model's output {name} is "
                               f"{tuple(s[name].shape) if name in s else 'missing'}, the original's "
                               f"{tuple(t[name].shape)}; prune only what keeps the output's shape")
        ss, tt = s[name].float(), t[name].float()
        if kind in ("kl", "bce") and spaces.get(name, "logits") != "logits":
            ss, tt = _as_logits(ss, kind), _as_logits(tt, kind)
        term = _term(kind, ss, tt, scales.get(name, 1.0), cfg.temperature)
        total = term if total is None else total + term
    assert total is not None  # _losses refused an output with every leaf skipped
    return total


def _as_logits(p: torch.Tensor, kind: str) -> torch.Tensor:
    """Probabilities as the logits the kl / bce terms take: log p (softmax(log p) = p), or logit p (sigmoid)."""
    p = p.clamp(_EPS, 1 - _EPS)
    return p.log() if kind == "kl" else torch.logit(p)


def _term(kind: str, s: torch.Tensor, t: torch.Tensor, scale: float, temperature: float) -> torch.Tensor:
    if kind == "mse":
        return (s - t).square().mean() / scale
    tt = temperature
    if kind == "kl":
        log_p, log_q = F.log_softmax(t / tt, -1), F.log_softmax(s / tt, -1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).mean() * tt * tt
    # bce: KL(Bernoulli(sigmoid(t/T)) || Bernoulli(sigmoid(s/T))), zero when the scores agree
    p = torch.sigmoid(t / tt)
    return (F.binary_cross_entropy_with_logits(s / tt, p) - F.binary_cross_entropy_with_logits(t / tt, p)) * tt * tt


def _scalar(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise RecoverError(f"recover: {what} returned {shape}, not a scalar tensor; reduce it (e.g. .mean())")
    return value


class _FeatureHooks:
    """The outputs of ``names`` in both models at each step, and their scaled MSE."""

    def __init__(self, student: nn.Module, teacher: nn.Module, names: Sequence[str]) -> None:
        self.seen: dict[str, dict[str, torch.Tensor]] = {"s": {}, "t": {}}
        self.handles = []
        self.scales: dict[str, float] = {}
        for name in names:
            for side, model in (("s", student), ("t", teacher)):
                try:
                    module = model.get_submodule(name)
                except AttributeError as exc:
                    raise RecoverError(f"recover: config.features names {name!r}, not a module of the "
                                       f"{'pruned' if side == 's' else 'original'} model") from exc
                self.handles.append(module.register_forward_hook(self._keep(side, name)))

    def _keep(self, side: str, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            if isinstance(out, tuple):
                out = out[0]
            if isinstance(out, torch.Tensor):
                self.seen[side][name] = out
        return hook

    def teacher_done(self) -> None:
        self.seen["t"] = {k: v.detach() for k, v in self.seen["t"].items()}

    def loss(self, weight: float) -> torch.Tensor | float:
        total: torch.Tensor | float = 0.0
        for name, t in self.seen["t"].items():
            s = self.seen["s"].get(name)
            if s is None or s.shape != t.shape:
                raise RecoverError(f"recover: feature {name!r} is {tuple(s.shape) if s is not None else 'not called'} "
                                   f"in the pruned model, {tuple(t.shape)} in the original; distil features whose "
                                   "width the plan keeps (a block's output on the residual stream)")
            scale = self.scales.setdefault(name, max(float(t.double().square().mean()), 1e-12))
            total = total + weight * (s.float() - t.float()).square().mean() / scale
        self.seen = {"s": {}, "t": {}}
        return total

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class _Evaluator:
    """eval_data's mean distillation loss and the user's metric, at a step."""

    def __init__(self, model, teacher, data, metric, to_args, kinds, scales, spaces, cfg, hooks, acc, say) -> None:
        self.__dict__.update(model=model, teacher=teacher, data=data, metric=metric, to_args=to_args, kinds=kinds,
                             scales=scales, spaces=spaces, cfg=cfg, hooks=hooks, acc=acc, say=say)

    def __call__(self, step: int) -> dict[str, Any]:
        record: dict[str, Any] = {"step": step}
        was = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if self.data is not None and self.teacher is not None:  # without a teacher: the metric alone
                    losses = []
                    for batch in self.data:
                        args, kwargs = _call(self.to_args(batch), self.acc.device)
                        losses.append(float(_distill(self.model(*args, **kwargs), self.teacher(*args, **kwargs),
                                                     self.kinds, self.scales, self.spaces, self.cfg)))
                        self.hooks.seen = {"s": {}, "t": {}}
                    record["distill"] = sum(losses) / max(1, len(losses))
                if self.metric is not None:
                    record["metric"] = _number(self.metric(self.acc.unwrap_model(self.model)))
        finally:
            self.model.train(was)
        self.say("recover: eval " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in record.items()))
        return record


class _Best:
    """The best evaluation so far and a CPU copy of the student's state at it; the end compared with the start."""

    def __init__(self, student: nn.Module, cfg: RecoverConfig) -> None:
        self.student, self.cfg = student, cfg
        self.best: dict[str, Any] | None = None
        self.state: dict[str, torch.Tensor] | None = None
        self.last: dict[str, Any] | None = None
        self.judged_by: str | None = None

    def score(self, record: Mapping[str, Any]) -> float | None:
        """Lower is better: the metric (its first value; negated when higher is better), else the distill loss."""
        metric = record.get("metric")
        if isinstance(metric, Mapping):
            metric = next(iter(metric.values()), None)
        if isinstance(metric, float):
            self.judged_by = f"metric ({'higher' if self.cfg.metric_goal == 'max' else 'lower'} is better)"
            return -metric if self.cfg.metric_goal == "max" else metric
        if "distill" in record:
            self.judged_by = "distill loss (eval_data, lower is better)"
            return float(record["distill"])
        return None

    def see(self, record: Mapping[str, Any], *, last: bool = False) -> None:
        score = self.score(record)
        if last:
            self.last = dict(record)
        current = self.score(self.best) if self.best is not None else None
        if score is None or (current is not None and score >= current):
            return
        self.best = dict(record)
        if self.cfg.keep_best and not last:  # the end's state is the model itself: no copy needed
            self.state = {k: v.detach().to("cpu", copy=True) for k, v in self.student.state_dict().items()}
        elif last:
            self.state = None

    def finish(self, evals: Sequence[Mapping[str, Any]], say: Callable[[str], None]) -> dict[str, Any]:
        """Put the best state back when the end is worse (keep_best); the result's fields on what was returned."""
        fields: dict[str, Any] = {"best": self.best, "judged_by": self.judged_by if self.best else None}
        if self.last is None or self.best is None:
            return fields
        start, end = self.score(evals[0]), self.score(self.last)
        worse = start is not None and end is not None and end > start
        fields["worse_than_start"] = worse
        restore = self.cfg.keep_best and self.best["step"] != self.last["step"] and self.state is not None
        if restore:
            self.student.load_state_dict(self.state)
            fields["kept"] = "best"
        if worse or restore:
            returned = (f"returned the best state, step {self.best['step']} ({_shown(self.best)})" if restore else
                        f"{'keep_best is off' if not self.cfg.keep_best else 'its state was not saved'}, so the end "
                        f"state is returned (the best was step {self.best['step']}: {_shown(self.best)})")
            say(f"recover: the end (step {self.last['step']}) is {'worse than the start' if worse else 'not the best'}"
                f" by the {self.judged_by}: {_shown(evals[0])} at the start, {_shown(self.last)} at the end; "
                f"{returned}")
        return fields


def _shown(record: Mapping[str, Any]) -> str:
    metric = record.get("metric")
    if isinstance(metric, Mapping):
        metric = next(iter(metric.values()), None)
    value = metric if isinstance(metric, float) else record.get("distill")
    return f"{value:.4g}" if isinstance(value, float) else "-"


def _number(value: Any) -> float | dict[str, float]:
    if isinstance(value, Mapping):
        return {str(k): _number(v) for k, v in value.items()}  # type: ignore[misc]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecoverError(f"recover: metric returned {value!r}; return a finite number or a dict of them")
    return float(value)


__all__ = ["KINDS", "OUTPUTS", "STATE_FILE", "RecoverConfig", "RecoverError", "RecoverResult", "UserCodeError",
           "recover"]
