"""Network-slimming sparsity training: an L1 penalty on BatchNorm gammas for any training loop.

>>> sp = BNSparsity(model, s=1e-4).attach(optimizer)  # then train as usual
>>> sched = TargetSparsity(target=0.5, total_steps=epochs * len(loader))
>>> sp = BNSparsity(model, exclude=residual_bns(dg), schedule=sched).attach(optimizer)
>>> log(sparsity_stats(model))
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.conv import _ConvNd
from torch.utils.hooks import RemovableHandle

from prunefx._config import check_fields
from prunefx.analysis.roles import CHANNEL, IN, OUT, Kind
from prunefx.errors import PrunefxError

if TYPE_CHECKING:
    from prunefx.analysis.graph import DependencyGraph


DEFAULT_S = 1e-4  # network slimming's strength (Liu et al. 2017, CIFAR); a target schedule starts from it


class Schedule(Protocol):
    """Chooses the penalty strength for the next optimizer step from the current one and the gammas."""

    def __call__(self, step: int, s: float, gammas: Sequence[torch.Tensor]) -> float: ...


class BNSparsity:
    """Adds ``s * sign(gamma)`` to the gradient of every selected BatchNorm weight inside ``optimizer.step()``.

    The term is added by an optimizer step *pre-hook*, i.e. after everything a training loop does to
    the gradients before stepping: ``clip_grad_norm_``, ``GradScaler.unscale_`` (``scaler.step`` calls
    ``optimizer.step`` only after unscaling, and skips it, hook included, on inf/nan). Adding the L1 term
    to ``.grad`` right after ``backward()`` instead would put it under the clip: ultralytics clips to norm
    10 while a detector's gradient norm is in the hundreds, which would shrink the penalty ~25x, and
    differently every step. Here it is exactly ``s * sign(gamma)``.

    ``modules``: names of the BatchNorms to penalise (default: every affine BatchNorm); ``exclude``:
    names or fnmatch patterns to leave out, e.g. ``residual_bns(dg)`` or ``"model.22.*"``.
    ``s`` is the strength, or the starting strength when a ``schedule`` adapts it every step.

    ``max_step``: the largest move ``lr * s`` one step may give a gamma (``lr`` read from the optimizer at every step):
    ``s`` is lowered to ``max_step / lr`` when above it. A schedule then adapts ``s`` freely as the learning rate
    decays, while a gamma at zero still oscillates by less than the pruning threshold. Default: a
    :class:`TargetSparsity` schedule's own ``max_step``, else no bound.

    ``select``: penalise only that fraction of the gammas, the ones with the smallest |gamma| over all selected
    BatchNorms, re-chosen every step (exact ties broken by a fixed random order). Plain L1 shrinks every gamma;
    where the loss barely resists (a detector's gammas move in lockstep) they all fall together and the
    kept channels are crippled too. Selected, the would-be-pruned channels fade while the network adapts
    and the rest keep their scale (the idea of growing-regularisation pruning, with the global rank of
    network slimming choosing what fades).
    ``layer_cap``: with ``select``, at most this fraction of any one BatchNorm's gammas is selected (its smallest).
    The global rank alone can select all of a layer whose gammas are small as a whole (a stem after training):
    the layer then carries almost no signal, the next BatchNorm normalises a near-constant input with running
    statistics that lag, and the sparse model collapses in eval mode (measured: a trained 4-layer CNN at chance).

    >>> sp = BNSparsity(model, s=1e-4).attach(optimizer)
    >>> ...; sp.detach()
    """

    def __init__(
        self,
        model: nn.Module,
        s: float = DEFAULT_S,
        *,
        modules: Iterable[str] | None = None,
        exclude: Iterable[str] = (),
        schedule: Schedule | None = None,
        select: float | None = None,
        layer_cap: float = 1.0,
        max_step: float | None = None,
    ) -> None:
        if select is not None and not 0 < select < 1:
            raise PrunefxError(f"BNSparsity select must be a fraction in (0, 1), got {select}")
        if not 0 < layer_cap <= 1:
            raise PrunefxError(f"BNSparsity layer_cap must be a fraction in (0, 1], got {layer_cap}")
        if max_step is not None and not max_step > 0:
            raise PrunefxError(f"BNSparsity max_step must be > 0 (or None), got {max_step}")
        self.modules = _select_bns(model, modules, exclude)
        self.gammas = [bn.weight for bn in self.modules.values() if bn.weight.requires_grad]
        self.schedule = schedule
        self.select = select
        self.layer_cap = layer_cap
        if max_step is None and isinstance(schedule, TargetSparsity):
            max_step = schedule.max_step
        self.max_step = max_step
        n = sum(g.numel() for g in self.gammas)
        # A fixed random order breaks exact ties (all gammas are 1.0 at initialisation): by index it would
        # select whole early layers, which then stay the smallest.
        self._order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        self.steps = 0
        self._s = float(s)
        self._handle: RemovableHandle | None = None

    @property
    def step_s(self) -> float:
        """Current strength: what the last optimizer step added (``s`` before the first step)."""
        return self._s

    def attach(self, optimizer: torch.optim.Optimizer) -> BNSparsity:
        if self._handle is not None:
            raise PrunefxError("BNSparsity is already attached; call detach() first")
        self._handle = optimizer.register_step_pre_hook(self._pre_step)
        return self

    def detach(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def state_dict(self) -> dict[str, Any]:
        """What resuming needs: the current strength, the step count and an adaptive schedule's memory."""
        memory = self.schedule.state_dict() if isinstance(self.schedule, TargetSparsity) else None
        return {"s": self._s, "steps": self.steps, "schedule": memory}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._s, self.steps = float(state["s"]), int(state["steps"])
        if isinstance(self.schedule, TargetSparsity):
            self.schedule.load_state_dict(state.get("schedule"))

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with torch.no_grad():
            if self.schedule is not None:
                self._s = float(self.schedule(self.steps, self._s, self.gammas))
            if self.max_step is not None and self.gammas:
                lr = _lr_of(optimizer, self.gammas[0])
                if lr > 0:  # stored clamped: a schedule never winds s up past what the step may use
                    self._s = min(self._s, self.max_step / lr)
            for g in self.gammas:
                # A gamma without a gradient this step (unused branch) is still pulled towards zero.
                if g.grad is None:
                    g.grad = torch.zeros_like(g)
            if self.gammas:
                signs = torch._foreach_sign(self.gammas)
                if self.select is not None:
                    torch._foreach_mul_(signs, self.selected())
                torch._foreach_add_([g.grad for g in self.gammas], signs, alpha=self._s)
        self.steps += 1

    def selected(self) -> list[torch.Tensor]:
        """Per BatchNorm, 1.0 where the gamma is among the ``select`` fraction with the smallest |gamma|, else 0
        (at most ``layer_cap`` of one BatchNorm's gammas, its smallest)."""
        a = _abs(self.gammas, relative=False)
        sizes = [g.numel() for g in self.gammas]
        k = max(1, math.ceil(self.select * a.numel())) if self.select is not None else a.numel()
        order = self._order.to(a.device)
        ranked = order[torch.argsort(a[order], stable=True)]  # smallest first, exact ties in the fixed random order
        if self.layer_cap < 1:
            counts = torch.tensor(sizes, device=a.device)
            layer = torch.repeat_interleave(torch.arange(len(sizes), device=a.device), counts)
            by_layer = ranked[torch.argsort(layer[ranked], stable=True)]  # layer by layer, smallest first within
            starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
            rank = torch.empty_like(by_layer)
            rank[by_layer] = torch.arange(a.numel(), device=a.device) - starts  # rank within its own layer
            caps = torch.tensor([math.floor(self.layer_cap * n) for n in sizes], device=a.device)
            ranked = ranked[(rank < caps[layer])[ranked]]
        mask = torch.zeros_like(a).index_fill_(0, ranked[:k], 1.0)
        return [m.view_as(g).to(g.dtype) for m, g in zip(mask.split(sizes), self.gammas, strict=True)]


@dataclass(kw_only=True)
class TargetSparsity:
    """Adapt ``s`` so that a ``target`` fraction of the gammas is below ``threshold`` by ``total_steps``.

    The controlled value is q, the ``target``-quantile of |gamma|: the fraction below ``threshold``
    reaches ``target`` exactly when q reaches ``threshold``. (The fraction itself stays 0 until gammas
    arrive near the threshold, then jumps: a controller on it winds ``s`` up and overshoots.) The L1
    term moves gammas at a speed that grows with ``s``, so ``s`` steers q's speed in log space: every
    ``every`` steps the measured v = -dlog(q)/dt is compared with the v* that lands q on ``aim * threshold`` at
    ``reach * total_steps`` (and then holds it there), and ``s`` is multiplied by
    ``exp(gain * (v* - v) / max(|v*| + |v|, v0))``, v0 being the speed planned at the first measurement.
    ``every`` defaults to about 50 measurements per run (at most one per 10 steps), so a run of a hundred
    steps still has the measurements it needs to ramp ``s`` up from a small start.
    Steering speed rather than q avoids winding ``s`` up through the lag between ``s`` and the gammas; log
    space gives the last decade above the threshold, where channels separate into kept and dead, as much
    time as the first, where they all shrink together; v0 keeps the noise of a held q (both speeds near 0)
    from swinging ``s`` by the full gain.

    What bounds ``s`` is the step it causes, not ``s`` itself: a gamma at zero oscillates around it with
    amplitude about 1.5 * lr * s under SGD with momentum 0.9, so ``max_step`` (default ``threshold / 3``)
    bounds lr * s, applied by :class:`BNSparsity` with the optimizer's current lr, and ``s`` may grow as the
    learning rate decays. A bound on ``s`` alone (``s_max``, default none) stalls short runs whose lr decays:
    q never reaches the threshold. ``relative``: threshold is a fraction of each layer's largest |gamma|.
    Holds the last measured q, so use one instance per training run.

    >>> TargetSparsity(target=0.5, total_steps=epochs * len(loader))
    """

    target: float = 0.5
    total_steps: int
    threshold: float = 1e-2
    relative: bool = False
    reach: float = 0.8
    gain: float = 1.0
    every: int | None = None
    s_min: float = 1e-6
    s_max: float | None = None
    max_step: float | None = None  # the largest lr * s (default threshold / 3; BNSparsity applies it)
    # q is steered to aim * threshold. 1: the fraction below the threshold is the target when the gammas around q are
    # spread. Under a selective penalty they move in lockstep, so that fraction jumps between 0 and the target as q
    # crosses the threshold and a q held there leaves it to chance (yolov8n, shipped recipe, 64 steps, target 0.5:
    # 0.17, 0.35, 0.45, 0.50 on four data seeds): SparsityConfig then steers q to half the threshold (0.50 on five).
    aim: float = 1.0
    _last: float | None = field(default=None, init=False, repr=False)
    _v0: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.target < 1:
            raise PrunefxError(f"TargetSparsity target must be in (0, 1), got {self.target}")
        if self.max_step is None:  # a gamma at zero then oscillates by about half the threshold
            self.max_step = self.threshold / 3
        if self.every is None:  # about 50 measurements per run, at most one per 10 steps
            self.every = max(1, min(10, round(self.total_steps / 50)))
        if self.total_steps < 1 or self.every < 1 or self.threshold <= 0:
            raise PrunefxError("TargetSparsity total_steps, every and threshold must be positive")
        if not 0 < self.aim <= 1:
            raise PrunefxError(f"TargetSparsity aim must be in (0, 1] (a fraction of the threshold), got {self.aim}")

    def __call__(self, step: int, s: float, gammas: Sequence[torch.Tensor]) -> float:
        if step % self.every or not gammas:
            return s
        q = math.log(max(_quantile(gammas, self.target, self.relative), 1e-12))
        last, self._last = self._last, q
        distance = q - math.log(self.aim * self.threshold)  # log distance of q above where it is steered
        if self._v0 is None:
            self._v0 = max(abs(distance), 1.0) / max(self.every, self.reach * self.total_steps - step)
        if last is None:
            return s
        v = (last - q) / self.every
        wanted = distance / max(self.every, self.reach * self.total_steps - step)
        err = (wanted - v) / max(abs(wanted) + abs(v), self._v0)
        s = max(self.s_min, s * math.exp(self.gain * err))
        return s if self.s_max is None else min(self.s_max, s)

    def state_dict(self) -> dict[str, float | None]:
        """The controller's memory (last measured log-quantile, planned speed), for resuming mid-run."""
        return {"last": self._last, "v0": self._v0}

    def load_state_dict(self, state: dict[str, float | None] | float | None) -> None:
        if not isinstance(state, dict):  # checkpoints before v0 stored the last log-quantile alone
            state = {"last": state, "v0": None}
        self._last, self._v0 = state.get("last"), state.get("v0")


@dataclass(frozen=True)
class SparsityConfig:
    """Network-slimming sparsity as one setting: strength, how it adapts, which BatchNorms it leaves alone.

    The one declaration behind :func:`prunefx.train.fit`, the ultralytics hooks and every pipeline's
    ``prune.sparsity`` block; :meth:`regularizer` builds the :class:`BNSparsity` they attach.
    """

    s: float = DEFAULT_S  # L1 strength; with schedule=target the strength it starts from
    schedule: Literal["constant", "target"] = "constant"  # target: TargetSparsity adapts s
    target: float = 0.5  # schedule=target / selective: the fraction of gammas driven below threshold
    threshold: float = 1e-2
    s_max: float | None = None  # schedule=target: a cap on s (the step lr * s is capped at threshold / 3 anyway)
    selective: bool = False  # penalise only the `target` fraction with the smallest |gamma| (BNSparsity select)
    # selective: at most this fraction of one BatchNorm is penalised (BNSparsity layer_cap). 1.0 (none) by default:
    # 0.5 lifted a trained CNN's 2x pruning from 0.815 to 0.917 top-1 (experiments/selective_cap.py) but left the
    # YOLO main job where it was (0.879 vs 0.882 mAP50-95, 3 seeds, results/yolo_default_cap.md)
    layer_cap: float = 1.0
    exclude_residual: bool = False  # leave BatchNorms whose channels feed residual adds unpenalised
    exclude: tuple[str, ...] = ()  # names or fnmatch patterns of BatchNorms left unpenalised

    def __post_init__(self) -> None:
        check_fields(self, error=PrunefxError)
        if self.s < 0:
            raise PrunefxError(f"sparsity s must be >= 0, got {self.s}")
        if not 0 < self.target < 1:
            raise PrunefxError(f"sparsity target must be in (0, 1) (a fraction of the gammas), got {self.target}")
        if self.threshold <= 0:
            raise PrunefxError(f"sparsity threshold must be > 0, got {self.threshold}")
        if self.s_max is not None and self.s_max <= 0:
            raise PrunefxError(f"sparsity s_max must be > 0 or null, got {self.s_max}")
        if not 0 < self.layer_cap <= 1:
            raise PrunefxError(f"sparsity layer_cap must be in (0, 1] (a fraction of one BatchNorm), "
                               f"got {self.layer_cap}")

    def resolved(self, model: nn.Module, example_inputs: Sequence[Any]) -> SparsityConfig:
        """This config with ``exclude_residual`` turned into names (it needs the model's channel analysis)."""
        if not self.exclude_residual:
            return self
        from prunefx.analysis import analyze

        names = residual_bns(analyze(model, tuple(example_inputs)))
        return replace(self, exclude=(*self.exclude, *names), exclude_residual=False)

    def regularizer(self, model: nn.Module, total_steps: int) -> BNSparsity:
        """The :class:`BNSparsity` for a run of ``total_steps`` optimizer steps (attach it to the optimizer)."""
        if self.exclude_residual:
            raise PrunefxError("sparsity exclude_residual needs the model's analysis: use config.resolved(model, x)")
        schedule = None
        if self.schedule == "target":
            # selective: the penalised gammas fall together, so their largest is steered well under the threshold
            schedule = TargetSparsity(target=self.target, threshold=self.threshold, s_max=self.s_max,
                                      total_steps=max(1, total_steps), aim=0.5 if self.selective else 1.0)
        return BNSparsity(model, self.s, exclude=self.exclude, schedule=schedule,
                          select=self.target if self.selective else None, layer_cap=self.layer_cap)


def fraction_below(gammas: Sequence[torch.Tensor], threshold: float, *, relative: bool = False) -> float:
    """Fraction of all entries with |gamma| < threshold (times the layer's max |gamma| when relative)."""
    return float((_abs(gammas, relative) < threshold).float().mean()) if gammas else 0.0


def _abs(gammas: Sequence[torch.Tensor], relative: bool) -> torch.Tensor:
    """All |gamma| in one flat float tensor, each layer divided by its largest when relative."""
    with torch.no_grad():
        a = [g.detach().abs().flatten().float() for g in gammas]
        return torch.cat([x / x.max().clamp_min(1e-12) for x in a] if relative else a)


def _quantile(gammas: Sequence[torch.Tensor], q: float, relative: bool) -> float:
    a = _abs(gammas, relative)
    return float(a.kthvalue(max(1, math.ceil(q * a.numel()))).values)


@dataclass(frozen=True)
class GammaStats(Mapping[str, float]):
    """|gamma| over a model's BatchNorms: the fraction below each threshold, quantiles, the largest.

    As a mapping it is the flat, loggable dict (:meth:`flat`) training logs and ``state.json`` keep.
    """

    bn_channels: float
    below: Mapping[float, float] = field(default_factory=dict)  # threshold -> fraction of gammas below it
    quantiles: Mapping[float, float] = field(default_factory=dict)  # p -> the p-quantile of |gamma|
    max: float | None = None  # None (like below and quantiles empty) when no BatchNorm was selected

    def flat(self) -> dict[str, float]:
        """``{'bn_channels': ..., 'below_0.01': ..., 'q0.5': ..., 'max': ...}``."""
        stats = {"bn_channels": self.bn_channels}
        stats |= {f"below_{t:g}": v for t, v in self.below.items()}
        stats |= {f"q{p:g}": v for p, v in self.quantiles.items()}
        return stats if self.max is None else stats | {"max": self.max}

    @classmethod
    def from_flat(cls, stats: Mapping[str, float]) -> GammaStats:
        """The stats whose :meth:`flat` is ``stats`` (as ``state.json`` keeps them)."""
        below = {float(k.removeprefix("below_")): v for k, v in stats.items() if k.startswith("below_")}
        quantiles = {float(k[1:]): v for k, v in stats.items() if k.startswith("q")}
        return cls(stats["bn_channels"], below, quantiles, stats.get("max"))

    def __getitem__(self, key: str) -> float:
        return self.flat()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.flat())

    def __len__(self) -> int:
        return len(self.flat())


def sparsity_stats(
    model: nn.Module,
    modules: Iterable[str] | None = None,
    *,
    thresholds: Sequence[float] = (1e-3, 1e-2, 1e-1),
    quantiles: Sequence[float] = (0.1, 0.25, 0.5, 0.75, 0.9),
) -> GammaStats:
    """Summary of |gamma| over the selected BatchNorms (default: every affine one).

    >>> sparsity_stats(model).flat()
    {'bn_channels': 4800.0, 'below_0.001': 0.02, 'below_0.01': 0.31, ..., 'q0.5': 0.2, 'max': 1.3}
    """
    gammas = [bn.weight for bn in _select_bns(model, modules).values()]
    channels = float(sum(g.numel() for g in gammas))
    if not gammas:
        return GammaStats(channels)
    a = _abs(gammas, relative=False)
    q = torch.quantile(a, torch.tensor(list(quantiles), dtype=a.dtype, device=a.device)).tolist()
    return GammaStats(channels, {t: fraction_below(gammas, t) for t in thresholds},
                      dict(zip(quantiles, q, strict=True)), float(a.max()))


def _select_bns(
    model: nn.Module, modules: Iterable[str] | None = None, exclude: Iterable[str] = ()
) -> dict[str, _BatchNorm]:
    """Affine BatchNorms by name: ``modules`` (default all) minus names matching ``exclude`` patterns."""
    # A lone string is one name or pattern, not an iterable of one-letter names.
    patterns = [exclude] if isinstance(exclude, str) else list(exclude)
    modules = [modules] if isinstance(modules, str) else modules
    if modules is None:
        chosen = {n: m for n, m in model.named_modules() if _is_affine_bn(m)}
    else:
        chosen = {}
        for n in modules:
            m = model.get_submodule(n)
            if not _is_affine_bn(m):
                raise PrunefxError(f"{n!r} is a {type(m).__name__}, not a BatchNorm with a learnable weight")
            chosen[n] = m
    return {n: m for n, m in chosen.items() if not any(fnmatch.fnmatchcase(n, p) for p in patterns)}


def residual_bns(dg: DependencyGraph) -> list[str]:
    """BatchNorms whose channels are summed with another conv/linear's output (residual-coupled).

    Such a group is produced by several layers, so a gamma driven to zero does not remove the channel's
    signal; users often exclude them: ``BNSparsity(model, exclude=residual_bns(dg))``. A depthwise conv
    (in and out in the same group) passes its group's channels through and does not count as a producer.
    """
    names: list[str] = []
    for g in dg.groups:
        mods = [m for m in g.members if m.kind is Kind.MODULE]
        inputs = {m.name for m in mods if m.role == IN}
        producers = [
            m.name
            for m in mods
            if m.role == OUT
            and m.name not in inputs
            and isinstance(dg.gm.get_submodule(m.name), (_ConvNd, nn.Linear))
        ]
        if len(producers) > 1:
            names += [
                m.name for m in mods if m.role == CHANNEL and isinstance(dg.gm.get_submodule(m.name), _BatchNorm)
            ]
    return list(dict.fromkeys(names))


def _lr_of(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> float:
    """The learning rate of the parameter group holding ``param`` (the first group's if none does)."""
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return float(group["lr"])
    return float(optimizer.param_groups[0]["lr"])


def _is_affine_bn(m: nn.Module) -> bool:
    return isinstance(m, _BatchNorm) and m.weight is not None
