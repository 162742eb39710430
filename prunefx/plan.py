"""Decide what to prune: a frozen, printable, JSON-serialisable ``PruningPlan``.

    plan = make_plan(dg, scores, PlanConfig(flops=0.5, round_to=8), cost=CostModel(model, dg, inputs))

Deciding is kept apart from doing (``prunefx.rewrite.apply_plan``): a plan can be printed, reviewed,
saved and re-applied to a fresh copy of the model.
"""

from __future__ import annotations

import fnmatch
import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from .analysis.graph import DependencyGraph
from .errors import PrunefxError


class PlanError(PrunefxError):
    """A plan or a planning request is invalid (bad ratio, wrong model, violated constraint)."""


@dataclass(frozen=True)
class PlanConfig:
    """How much to prune and under which limits. Exactly one target: ratio, flops or params.

    ratio: fraction of prunable channels to remove, in [0, 1). flops / params: fraction of the model's
    MACs / parameters to KEEP, in (0, 1] ("flops: 0.5" keeps half). scope "global": one score threshold
    over every group (network slimming); "local": each group loses the same fraction.
    """

    ratio: float | None = None
    flops: float | None = None
    params: float | None = None
    scope: Literal["global", "local"] = "global"
    min_channels: int = 1  # never prune a group below this many channels (never to zero)
    max_ratio: float = 0.9  # never remove more than this fraction of one group
    round_to: int = 1  # kept widths rounded up to a multiple of this (hardware-friendly)
    ignore: tuple[str, ...] = ()  # fnmatch patterns of module names whose groups are left alone
    overrides: tuple[tuple[str, float], ...] = ()  # (module pattern, ratio) for local per-layer ratios
    graph_rewrite: bool = False  # allow rewriting literal channel counts in the traced graph

    def __post_init__(self) -> None:
        targets = [k for k in ("ratio", "flops", "params") if getattr(self, k) is not None]
        if len(targets) != 1:
            raise PlanError(f"give exactly one target (ratio, flops or params), got {targets or 'none'}")
        if self.ratio is not None and not 0.0 <= self.ratio < 1.0:
            raise PlanError(f"ratio must be in [0, 1) (fraction of channels removed), got {self.ratio}")
        for k in ("flops", "params"):
            v = getattr(self, k)
            if v is not None and not 0.0 < v <= 1.0:
                raise PlanError(f"{k} must be in (0, 1] (fraction of the model's {k} kept), got {v}")
        if self.scope not in ("global", "local"):
            raise PlanError(f"scope must be 'global' or 'local', got {self.scope!r}")
        if self.min_channels < 1:
            raise PlanError(f"min_channels must be >= 1 (a group is never pruned to zero), got {self.min_channels}")
        if not 0.0 < self.max_ratio <= 1.0:
            raise PlanError(f"max_ratio must be in (0, 1], got {self.max_ratio}")
        if self.round_to < 1:
            raise PlanError(f"round_to must be >= 1, got {self.round_to}")
        for pat, r in self.overrides:
            if not 0.0 <= r < 1.0:
                raise PlanError(f"override ratio for {pat!r} must be in [0, 1), got {r}")


@dataclass(frozen=True)
class GroupPlan:
    """One group's decision: which channels stay (indices in group channel order) and why."""

    group: int
    before: int
    after: int
    keep: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class PruningPlan:
    """What to keep in every pruned group, tied to the analysed model by a fingerprint."""

    model: str
    fingerprint: str
    input_shapes: tuple[tuple[int, ...], ...]
    criterion: str
    target: dict[str, Any]
    groups: tuple[GroupPlan, ...]
    skipped: tuple[tuple[int, str], ...] = ()  # (group id, reason) for prunable groups left alone
    estimate: dict[str, float] = field(default_factory=dict)  # cost model's MACs / params before and after

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema"] = "prunefx.plan/1"
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "PruningPlan":
        if d.get("schema") != "prunefx.plan/1":
            raise PlanError(f"not a prunefx plan (schema {d.get('schema')!r}); expected 'prunefx.plan/1'")
        return PruningPlan(
            model=d["model"],
            fingerprint=d["fingerprint"],
            input_shapes=tuple(tuple(s) for s in d["input_shapes"]),
            criterion=d["criterion"],
            target=dict(d["target"]),
            groups=tuple(GroupPlan(g["group"], g["before"], g["after"], tuple(g["keep"]), g["why"]) for g in d["groups"]),
            skipped=tuple((int(a), str(b)) for a, b in d.get("skipped", ())),
            estimate=dict(d.get("estimate", {})),
        )

    @staticmethod
    def from_json(text: str) -> "PruningPlan":
        return PruningPlan.from_dict(json.loads(text))

    @property
    def pruned(self) -> tuple[GroupPlan, ...]:
        return tuple(g for g in self.groups if g.after < g.before)

    def summary(self) -> str:
        before = sum(g.before for g in self.groups)
        after = sum(g.after for g in self.groups)
        est = ""
        if self.estimate:
            est = f"; estimated MACs {self.estimate['macs_after'] / max(self.estimate['macs_before'], 1):.3f}x"
        return (
            f"{self.model}: {len(self.pruned)}/{len(self.groups)} groups pruned, channels {before} -> {after} "
            f"({1 - after / max(before, 1):.1%} removed) by {self.criterion}{est}"
        )

    def table(self):
        from rich.table import Table

        t = Table(title=self.summary())
        for col in ("group", "before", "after", "why"):
            t.add_column(col)
        for g in self.groups:
            t.add_row(str(g.group), str(g.before), str(g.after), g.why)
        return t


# ---- cost model ------------------------------------------------------------------------------------------
class CostModel:
    """MACs and parameter counts as a function of each group's kept channels.

    Starts from measured per-module MACs (``prunefx.metrics.measure``) and scales each module by the
    fraction of its input/output channels that remain; parameters scale by the kept fraction of every
    sliced dim. Ops outside modules (functional matmuls) are kept constant.
    """

    def __init__(self, model, dg: DependencyGraph, example_inputs) -> None:
        from torch import nn

        from .metrics import measure

        self.dg = dg
        m = measure(model, example_inputs, by="leaf")
        self.macs_total = float(m.macs)
        self.params_total = float(m.params)
        gindex = {g.id: g for g in dg.groups}
        root_to = {}
        for g in gindex.values():
            for k, r in enumerate(g.roots.tolist()):
                root_to[r] = (g.id, k)
        # per record: arrays (group id, channel index) per position, -1 when never pruned
        self._pos: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = {}
        for key, roots in dg.record_roots.items():
            gid = np.array([root_to.get(r, (-1, -1))[0] for r in roots.tolist()], dtype=np.int64)
            ch = np.array([root_to.get(r, (-1, -1))[1] for r in roots.tolist()], dtype=np.int64)
            self._pos[key] = (gid, ch)
        self._modules: list[tuple[float, list[tuple[str, str, str]]]] = []
        named = dict(model.named_modules())
        for name, macs in m.per_module.items():
            mod = named.get(name)
            roles = [k for k in (("module", name, "out"), ("module", name, "in"), ("module", name, "channel"),
                                 ("module", name, "normalized0")) if k in self._pos]
            if isinstance(mod, nn.modules.conv._ConvNd) and mod.groups > 1 and mod.groups == mod.in_channels:
                roles = [k for k in roles if k[2] != "in"]  # depthwise: in and out are the same channels
            self._modules.append((float(macs), roles))
        self._macs_scaled = sum(m for m, _ in self._modules)
        self._params: list[tuple[int, list[tuple[str, str, str]]]] = []
        sizes = {n: t.numel() for n, t in (*model.named_parameters(), *model.named_buffers())}
        pnames = {n for n, _ in model.named_parameters()}
        by_param: dict[str, list] = {}
        for key in self._pos:
            if key[0] == "param" and key[1] in pnames:
                by_param.setdefault(key[1], []).append(key)
        self._params = [(sizes[n], keys) for n, keys in by_param.items()]
        self._params_scaled = sum(s for s, _ in self._params)

    def _frac(self, key, keep: dict[int, np.ndarray]) -> float:
        gid, ch = self._pos[key]
        if len(gid) == 0:
            return 1.0
        kept = np.ones(len(gid), dtype=bool)
        for g in np.unique(gid[gid >= 0]).tolist():
            if g in keep:
                sel = gid == g
                kept[sel] = keep[g][ch[sel]]
        return float(kept.mean())

    def macs(self, keep: dict[int, np.ndarray]) -> float:
        scaled = sum(m * math.prod(self._frac(k, keep) for k in roles) for m, roles in self._modules)
        return self.macs_total - self._macs_scaled + scaled

    def params(self, keep: dict[int, np.ndarray]) -> float:
        scaled = sum(n * math.prod(self._frac(k, keep) for k in keys) for n, keys in self._params)
        return self.params_total - self._params_scaled + scaled


# ---- deciding ---------------------------------------------------------------------------------------------
def _eligible(dg: DependencyGraph, cfg: PlanConfig, owned_constants: frozenset[str]) -> tuple[list[int], list[tuple[int, str]]]:
    used_patterns: set[str] = set()
    eligible, skipped = [], []
    for g in dg.groups:
        if not g.prunable:
            continue
        names = g.modules()
        hit = [p for p in cfg.ignore if any(fnmatch.fnmatchcase(n, p) for n in names)]
        used_patterns.update(hit)
        consts = [m for m in g.members if m.kind == "const" and m.module_type not in owned_constants]
        if hit:
            skipped.append((g.id, f"ignored by pattern {hit[0]!r}"))
        elif consts and not cfg.graph_rewrite:
            c = consts[0]
            skipped.append((g.id, f"forward hard-codes this channel count (node '{c.name}' in {c.module_type or 'the model'}); "
                                  "set graph_rewrite=True to rewrite the traced graph"))
        elif g.channels <= cfg.min_channels:
            skipped.append((g.id, f"only {g.channels} channel(s)"))
        else:
            eligible.append(g.id)
    for p in cfg.ignore:
        if p not in used_patterns:
            warnings.warn(f"ignore pattern {p!r} matches no module of a prunable group", stacklevel=3)
    return eligible, skipped


def _override(dg: DependencyGraph, gid: int, cfg: PlanConfig) -> float | None:
    names = dg.groups[gid].modules()
    for pat, r in cfg.overrides:
        if any(fnmatch.fnmatchcase(n, pat) for n in names):
            return r
    return None


def _counts(dg, scores, eligible, cfg, knob: float) -> dict[int, int]:
    """Kept channel count per eligible group for a global threshold / local ratio ``knob``."""
    counts = {}
    for gid in eligible:
        c = dg.groups[gid].channels
        if cfg.scope == "global":
            n = int((scores[gid] > knob).sum())
        else:
            r = _override(dg, gid, cfg)
            n = c - int(math.floor((knob if r is None else r) * c + 1e-9))
        lo = max(cfg.min_channels, int(math.ceil((1.0 - cfg.max_ratio) * c - 1e-9)))
        n = min(max(n, lo), c)
        if cfg.round_to > 1:
            n = min(c, int(math.ceil(n / cfg.round_to)) * cfg.round_to)
        counts[gid] = n
    for gids, _ in dg.ties:  # equal-count ties (chunk halves): the larger count wins
        tied = [g for g in gids if g in counts]
        if len(tied) != len(gids):
            for g in tied:  # a tied partner that cannot be pruned pins the others
                counts[g] = dg.groups[g].channels
            continue
        n = max(counts[g] for g in tied)
        for g in tied:
            counts[g] = min(n, dg.groups[g].channels)
    return counts


def _global_ranks(dg, scores: dict[int, np.ndarray], eligible: list[int]) -> dict[int, np.ndarray]:
    """Replace scores by their rank in one global order (ties broken by relative position in the group)."""
    if not eligible:
        return {}
    vals = np.concatenate([np.asarray(scores[g], dtype=np.float64) for g in eligible])
    frac = np.concatenate([(np.arange(dg.groups[g].channels) + 0.5) / dg.groups[g].channels for g in eligible])
    order = np.lexsort((frac, vals))
    rank = np.empty(len(vals), dtype=np.float64)
    rank[order] = np.arange(len(vals), dtype=np.float64)
    out, start = {}, 0
    for g in eligible:
        c = dg.groups[g].channels
        out[g] = rank[start : start + c]
        start += c
    return out


def _keep(scores: np.ndarray, n: int) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")[:n]
    mask = np.zeros(len(scores), dtype=bool)
    mask[order] = True
    return mask


def make_plan(
    dg: DependencyGraph,
    scores: dict[int, np.ndarray],
    cfg: PlanConfig,
    *,
    criterion: str = "custom",
    cost: CostModel | None = None,
    owned_constants: frozenset[str] = frozenset(),
) -> PruningPlan:
    """Choose kept channels for every eligible group so the target in ``cfg`` is met.

    ``scores``: group id -> one score per channel (higher = keep). ``cost`` is required for flops /
    params targets, which are solved by bisection on the global threshold (or the local ratio).
    ``owned_constants``: module types whose attribute fixers rewrite their hard-coded channel counts.
    """
    eligible, skipped = _eligible(dg, cfg, owned_constants)
    missing = [g for g in eligible if g not in scores or len(scores[g]) != dg.groups[g].channels]
    if missing:
        raise PlanError(f"scores missing or of wrong length for groups {missing[:5]}")
    if (cfg.flops is not None or cfg.params is not None) and cost is None:
        raise PlanError("a flops/params target needs a CostModel (cost=CostModel(model, dg, inputs))")

    if cfg.scope == "global":
        # One global ranking; equal scores (fresh BatchNorms all have gamma 1) are broken by relative
        # position inside the group, so ties are pruned evenly across groups instead of group by group.
        scores = _global_ranks(dg, scores, eligible)

    def masks_for(knob: float) -> dict[int, np.ndarray]:
        return {g: _keep(scores[g], n) for g, n in _counts(dg, scores, eligible, cfg, knob).items()}

    all_scores = np.sort(np.concatenate([scores[g] for g in eligible])) if eligible else np.zeros(1)
    total = sum(dg.groups[g].channels for g in eligible)
    if cfg.ratio is not None:
        measure_fn = lambda masks: 1.0 - sum(int(m.sum()) for m in masks.values()) / max(total, 1)  # noqa: E731
        goal, increasing = cfg.ratio, True  # removed fraction grows with the knob
    elif cfg.flops is not None:
        measure_fn = lambda masks: cost.macs(masks) / cost.macs_total  # noqa: E731
        goal, increasing = cfg.flops, False
    else:
        measure_fn = lambda masks: cost.params(masks) / cost.params_total  # noqa: E731
        goal, increasing = cfg.params, False
    if cfg.ratio is not None and cfg.scope == "local":
        knob = cfg.ratio  # per-layer ratio: each group loses exactly this fraction (or its override)
    else:
        knob = _bisect(measure_fn, masks_for, goal, increasing, all_scores, cfg.scope)
    masks = masks_for(knob)

    groups = []
    for gid in eligible:
        m = masks[gid]
        c = dg.groups[gid].channels
        why = f"global rank > {int(knob)} of {total}" if cfg.scope == "global" else f"ratio {(_override(dg, gid, cfg) or knob):.3f}"
        n_raw = int((scores[gid] > knob).sum()) if cfg.scope == "global" else None
        if n_raw is not None and int(m.sum()) != n_raw:
            why += f"; clamped/rounded to {int(m.sum())}"
        groups.append(GroupPlan(gid, c, int(m.sum()), tuple(np.flatnonzero(m).tolist()), why))
    target = {k: getattr(cfg, k) for k in ("ratio", "flops", "params") if getattr(cfg, k) is not None}
    target.update(scope=cfg.scope, round_to=cfg.round_to, min_channels=cfg.min_channels, max_ratio=cfg.max_ratio)
    estimate = {}
    if cost is not None:
        estimate = {"macs_before": cost.macs_total, "macs_after": cost.macs(masks),
                    "params_before": cost.params_total, "params_after": cost.params(masks)}
    return PruningPlan(dg.model_name, dg.fingerprint(), dg.input_shapes, criterion, target, tuple(groups), tuple(skipped), estimate)


def _bisect(measure_fn, masks_for, goal: float, increasing: bool, all_scores: np.ndarray, scope: str) -> float:
    """Find the knob whose plan measures closest to ``goal`` (monotone in the knob)."""
    if scope == "global":  # knob = a threshold between sorted scores: search over their indices
        cands = np.concatenate([[all_scores[0] - 1.0], all_scores])
    else:  # knob = the per-group ratio
        cands = np.linspace(0.0, 0.999, 2000)
    lo, hi = 0, len(cands) - 1

    def value(i: int) -> float:
        return measure_fn(masks_for(float(cands[i])))

    # measured value moves away from the unpruned end as i grows; find the first i reaching the goal
    reached = (lambda v: v >= goal - 1e-12) if increasing else (lambda v: v <= goal + 1e-12)
    if not reached(value(hi)):
        return float(cands[hi])
    while lo < hi:
        mid = (lo + hi) // 2
        if reached(value(mid)):
            hi = mid
        else:
            lo = mid + 1
    # the step before may land closer to the goal
    if lo > 0 and abs(value(lo - 1) - goal) < abs(value(lo) - goal):
        lo -= 1
    return float(cands[lo])
