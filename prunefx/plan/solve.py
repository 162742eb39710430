"""Decide what to prune: choose kept channels per group so a ratio / FLOPs / params / latency target is met.

    plan = make_plan(dg, scores, PlanConfig(flops=0.5, round_to=8), cost=CostModel(model, dg, inputs))
    plan = make_plan(dg, scores, PlanConfig(latency=0.5), latency=LatencyModel(...))  # see prunefx.plan.latency
"""

from __future__ import annotations

import fnmatch
import math
import re
import warnings
from collections.abc import Mapping

import numpy as np

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import Kind
from prunefx.errors import TargetMissedWarning
from prunefx.importance import Scores
from prunefx.plan.config import PlanConfig, PlanError
from prunefx.plan.cost import CostModel
from prunefx.plan.fill import TOLERANCE, fill, units
from prunefx.plan.latency import LatencyModel, latency_widths, lowest_width
from prunefx.plan.plan import GroupPlan, PruningPlan
from prunefx.plan.sensitivity import SensitivityCurves, allocate, candidate_widths
from prunefx.plan.widths import allowed_width


def _eligible(
    dg: DependencyGraph, cfg: PlanConfig, owned_constants: frozenset[str]
) -> tuple[list[int], list[tuple[int, str]]]:
    used_patterns: set[str] = set()
    eligible, skipped = [], []
    for g in dg.groups:
        if not g.prunable:
            continue
        names = g.modules()
        hit = [p for p in cfg.ignore if any(fnmatch.fnmatchcase(n, p) for n in names)]
        used_patterns.update(hit)
        consts = [m for m in g.members if m.kind is Kind.CONST and m.module_type not in owned_constants]
        if hit:
            skipped.append((g.id, f"ignored by pattern {hit[0]!r}"))
        elif consts and not cfg.graph_rewrite:
            c = consts[0]
            fix = ("set graph_rewrite=True to rewrite the traced graph" if dg.capture != "export" else
                   "the torch.export graph cannot be returned as the model, so graph_rewrite needs capture='fx'")
            where = f"node '{c.name}' in {c.module_type or 'the model'}"
            skipped.append((g.id, f"forward hard-codes this channel count ({where}); {fix}"))
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


def layer_ties(dg: DependencyGraph) -> list[tuple[tuple[int, ...], str]]:
    """Prunable groups that play the same role in repeated layers, as equal-count ties: their module members have
    (or parameter) members have the same names once layer indices are masked (``model.layers.3.mlp.up_proj`` ->
    ``model.layers.#.mlp.up_proj``)
    and they have as many channels. ``PlanConfig(uniform_layers=True)`` keeps them equally wide."""
    by_key: dict[tuple, list[int]] = {}
    for g in dg.groups:
        if not g.prunable:
            continue
        # parameters too: a stacked expert weight read by the graph has no module of its own
        names = {(_LAYER_INDEX.sub("#", m.name), str(m.role)) for m in g.members if m.kind in (Kind.MODULE, Kind.PARAM)}
        if any("#" in n for n, _ in names):
            by_key.setdefault((tuple(sorted(names)), g.channels), []).append(g.id)
    return [(tuple(ids), "uniform_layers: the same role in every layer") for ids in by_key.values() if len(ids) > 1]


_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _counts(dg, scores, eligible, cfg, knob: float, ties, latency: LatencyModel | None = None) -> dict[int, int]:
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
        if cfg.round_to == "auto":
            n = latency.fast_width(gid, n)
        elif cfg.round_to > 1:
            n = min(c, int(math.ceil(n / cfg.round_to)) * cfg.round_to)
        counts[gid] = allowed_width(dg, gid, cfg, n)
    for gids, _ in ties:  # equal-count ties (chunk halves, uniform layers): the larger count wins
        tied = [g for g in gids if g in counts]
        if len(tied) != len(gids):
            for g in tied:  # a tied partner that cannot be pruned pins the others
                counts[g] = dg.groups[g].channels
            continue
        n = max(counts[g] for g in tied)
        for g in tied:
            counts[g] = min(n, dg.groups[g].channels)
    return counts


_ROUND_OFF = 1e-12  # a standard deviation below this fraction of a group's largest |score| is round-off, not spread


def _normalized(scores: Mapping[int, np.ndarray], eligible: list[int], mode: str) -> Mapping[int, np.ndarray]:
    """Each eligible group's scores on a common scale (``PlanConfig.normalize``); the order inside a group is kept.

    "mean" / "max" / "sum" divide by the group's mean / max / sum of |score|; "standard" subtracts the group's
    mean and divides by its standard deviation. A degenerate scale (all-zero scores; for "standard", all-equal
    ones) counts as 1, so the scores are never divided by zero: all-zero stay 0 and all-equal ones become 0, the
    normalised mean, and the global ranking breaks such ties by position as it does for raw ones.
    """
    if mode == "none":
        return scores
    out = {}
    for g in eligible:
        s = np.asarray(scores[g], dtype=np.float64)
        if mode == "standard":
            top = float(np.abs(s).max()) if len(s) else 0.0
            s = s - s.mean()
            scale = float(s.std())
            scale = scale if scale > _ROUND_OFF * top else 0.0
        else:
            scale = float({"mean": np.mean, "max": np.max, "sum": np.sum}[mode](np.abs(s)))
        out[g] = s / (scale if math.isfinite(scale) and scale > 0 else 1.0)
    return out


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


def _lower(dg: DependencyGraph, cfg: PlanConfig, gid: int, n: int) -> int | None:
    """The largest count below ``n`` that ``gid`` may keep (min_channels, max_ratio, round_to, allowed_widths)."""
    c = dg.groups[gid].channels
    lo = max(cfg.min_channels, int(math.ceil((1.0 - cfg.max_ratio) * c - 1e-9)), 1)
    step = cfg.round_to if isinstance(cfg.round_to, int) and cfg.round_to > 1 else 1
    m = (int(math.ceil(n / step)) - 1) * step
    while m >= lo:
        if allowed_width(dg, gid, cfg, m) == m:
            return m
        m -= step
    return None


def _keep(scores: np.ndarray, n: int) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")[:n]
    mask = np.zeros(len(scores), dtype=bool)
    mask[order] = True
    return mask


def make_plan(
    dg: DependencyGraph,
    scores: Scores | Mapping[int, np.ndarray],
    cfg: PlanConfig,
    *,
    criterion: str | None = None,
    cost: CostModel | None = None,
    latency: LatencyModel | None = None,
    owned_constants: frozenset[str] = frozenset(),
    sensitivity: SensitivityCurves | None = None,
) -> PruningPlan:
    """Choose kept channels for every eligible group so the target in ``cfg`` is met.

    ``scores``: a :class:`prunefx.Scores` (its criterion names the plan) or group id -> one score per channel
    (higher = keep; the plan says ``criterion``, default "custom"). ``cost`` is required for flops / params targets,
    which are solved by bisection on the global threshold (or the local ratio).
    ``latency`` (a :class:`~prunefx.plan.latency.LatencyModel`) is required for a latency target and for
    ``round_to="auto"``: with global scope the latency planner decides each group's width (importance
    decides which channels), with local scope the per-layer ratio is bisected against the predicted latency.
    ``owned_constants``: names of modules whose fixers rewrite the literal channel counts in their forward
    (``prunefx.transform.owned_modules(model)``); their groups need no ``graph_rewrite``.
    ``sensitivity``: measured damage curves (``prunefx.sensitivity.measure``), required by ``scope="sensitivity"``,
    which gives each group the width of least total measured damage (:mod:`prunefx.plan.sensitivity`).
    """
    if isinstance(scores, Scores):
        criterion = criterion or scores.criterion
        scores = scores.values
    criterion = criterion or "custom"
    kind, goal = cfg.target
    eligible, skipped = _eligible(dg, cfg, owned_constants)
    ties = [*dg.ties, *(layer_ties(dg) if cfg.uniform_layers else ())]
    missing = [g for g in eligible if g not in scores or len(scores[g]) != dg.groups[g].channels]
    if missing:
        raise PlanError(f"scores missing or of wrong length for groups {missing[:5]}")
    if kind in ("flops", "params") and cost is None:
        raise PlanError("a flops/params target needs a CostModel (cost=CostModel(model, dg, inputs))")
    if cfg.needs_latency and latency is None:
        raise PlanError(
            "a latency target and round_to='auto' need measured latencies: pass latency=LatencyModel(...), "
            "or call prunefx.prune, which measures them on its deployment"
        )
    if cfg.scope == "sensitivity" and sensitivity is None:
        raise PlanError("scope='sensitivity' needs measured curves: call prunefx.prune(..., calibration=[...]) or "
                        "prunefx.sensitivity.measure(...) and pass make_plan(..., sensitivity=curves)")

    raw = scores  # the criterion's own values: each group's score_scale is measured on them
    # What one global threshold compares: each group's scores on a common scale (PlanConfig.normalize).
    ranked = _normalized(raw, eligible, cfg.normalize) if cfg.scope == "global" else raw
    if cfg.scope == "global":
        # One global ranking; equal scores (fresh BatchNorms all have gamma 1) are broken by relative
        # position inside the group, so ties are pruned evenly across groups instead of group by group.
        scores = _global_ranks(dg, ranked, eligible)

    def masks_for(knob: float) -> dict[int, np.ndarray]:
        return {g: _keep(scores[g], n) for g, n in _counts(dg, scores, eligible, cfg, knob, ties, latency).items()}

    total = sum(dg.groups[g].channels for g in eligible)

    def measure_fn(masks: dict[int, np.ndarray]) -> float:
        """The target's quantity for a plan: removed channel fraction, or kept MACs / params / latency fraction."""
        match kind:
            case "ratio":
                return 1.0 - sum(int(m.sum()) for m in masks.values()) / max(total, 1)
            case "flops":
                return cost.macs(masks) / cost.macs_total
            case "params":
                return cost.params(masks) / cost.params_total
            case "latency":
                return latency.predict({g: int(m.sum()) for g, m in masks.items()}) / latency.base_ms

    planned = kind == "latency" and cfg.scope == "global"
    if planned:  # the latency planner: widths from the latency table, channels by rank
        widths = latency_widths(latency, dg, {g: scores[g] + 1.0 for g in eligible}, eligible, goal, ties)
        masks = {g: _keep(scores[g], n) for g, n in widths.items()}
        knob = 0.0
    elif cfg.scope == "sensitivity":  # widths from the measured curves, channels by score
        masks, whys = _by_sensitivity(dg, raw, eligible, cfg, ties, sensitivity, measure_fn, cost, latency)
        knob = 0.0
    elif kind == "ratio" and cfg.scope == "local":
        knob = goal  # per-layer ratio: each group loses exactly this fraction (or its override)
    else:  # the removed fraction grows with the knob; kept MACs / params / latency shrink
        knob = _bisect(measure_fn, masks_for, goal, kind == "ratio", _knobs(cfg.scope, scores, eligible))
    if not planned and cfg.scope != "sensitivity":
        masks = masks_for(knob)
    filled: set[int] = set()
    fillable = kind in ("flops", "params") and cfg.scope == "global" and not planned and cfg.round_to != "auto"
    if fillable and abs(measure_fn(masks) - goal) > TOLERANCE * goal:
        # coarse steps (KV-head groups, widths tied across layers) left the target unmet: from the last plan that
        # keeps more than the target, cut the fine units on (plan.fill)
        upper = _last_above(measure_fn, masks_for, goal, _knobs(cfg.scope, scores, eligible))
        trial, cut = fill(masks_for(upper), scores, units(eligible, ties), lambda g, n: _lower(dg, cfg, g, n),
                          lambda g, n: _keep(scores[g], n), measure_fn, goal)
        if abs(measure_fn(trial) - goal) < abs(measure_fn(masks) - goal):
            masks, knob, filled = trial, upper, cut

    if kind in ("flops", "params", "ratio") and cfg.scope != "sensitivity":
        _warn_if_missed(dg, kind, goal, measure_fn(masks), cfg)

    groups = []
    ranked_sorted = (np.sort(np.concatenate([np.asarray(ranked[g], dtype=np.float64) for g in eligible]))
                     if eligible else None)
    for gid in eligible:
        m = masks[gid]
        c = dg.groups[gid].channels
        if planned:
            n = int(m.sum())
            why = f"latency: width {n} of {c} (measured candidates {_grid_text(latency.grids.get(gid))})"
        elif cfg.scope == "sensitivity":
            why = whys[gid]
        elif cfg.scope == "global":
            why = _global_why(np.asarray(ranked[gid], dtype=np.float64), scores[gid] <= knob, ranked_sorted, knob,
                              cfg.normalize)
            n_raw = int((scores[gid] > knob).sum())
            if gid in filled:
                why += (f"; cut to {int(m.sum())} after the threshold (which left {n_raw}) to meet the target, a "
                        "coarser unit's next step going past it")
            elif int(m.sum()) != n_raw:
                why += (f"; kept {int(m.sum())} instead of {n_raw} "
                        "(min_channels / max_ratio / round_to / allowed_widths / a tie)")
        else:
            why = f"ratio {(_override(dg, gid, cfg) or knob):.3f}"
        keep = tuple(np.flatnonzero(m).tolist())
        after = int(m.sum())
        groups.append(GroupPlan(group=gid, before=c, after=after, keep=keep, why=why, label=dg.groups[gid].label,
                                score_scale=float(np.mean(np.abs(np.asarray(raw[gid], dtype=np.float64))))))
    target = {kind: goal}
    target.update(scope=cfg.scope, round_to=cfg.round_to, min_channels=cfg.min_channels, max_ratio=cfg.max_ratio)
    if cfg.uniform_layers:
        target.update(uniform_layers=True)
    if cfg.allowed_widths:  # only then, as for normalize: plans made before it read the same
        target["allowed_widths"] = [[pat, list(counts)] for pat, counts in cfg.allowed_widths]
    if cfg.normalize != "none":
        target["normalize"] = cfg.normalize  # only then: plans made before normalisation read the same
    if cfg.graph_rewrite:
        target["graph_rewrite"] = True  # prunefx.load re-applies the plan with the graph rewritten again
    estimate = {}
    if cost is not None:
        estimate = {
            "macs_before": cost.macs_total,
            "macs_after": cost.macs(masks),
            "params_before": cost.params_total,
            "params_after": cost.params(masks),
        }
    if latency is not None:
        estimate["latency_ms_before"] = latency.base_ms
        estimate["latency_ms_planned"] = latency.predict({g: int(m.sum()) for g, m in masks.items()})
    return PruningPlan(
        model=dg.model_name, fingerprint=dg.fingerprint(), input_shapes=dg.input_shapes, criterion=criterion,
        target=target, groups=tuple(groups), skipped=tuple(skipped), estimate=estimate, frozen=dg.frozen_by_check,
        input_kinds=dg.input_kinds,
    )


MISSED = 0.05  # a plan further than this fraction from its target warns


def _warn_if_missed(dg: DependencyGraph, kind: str, goal: float, reached: float, cfg: PlanConfig) -> None:
    """Warn when the plan stops short of its target (kept MACs / params above it, or fewer channels removed)."""
    # a few percent is the coarse steps of tied or rounded groups (the fill closes most of it): not worth a warning
    short = reached < goal * (1 - MISSED) if kind == "ratio" else reached > goal * (1 + MISSED)
    if not short:
        return
    frozen: dict[str, int] = {}
    for g in dg.groups:
        if not g.prunable:
            key = (g.reasons[0] if g.reasons else "frozen").split(" (node")[0]
            frozen[key] = frozen.get(key, 0) + g.channels
    total = sum(g.channels for g in dg.groups)
    share = sum(frozen.values()) / max(total, 1)
    top = "; ".join(f"{why}: {n} channels" for why, n in sorted(frozen.items(), key=lambda kv: -kv[1])[:3])
    what = "removes" if kind == "ratio" else "keeps"
    noun = {"ratio": "of the channels", "flops": "of the MACs", "params": "of the parameters"}[kind]
    warnings.warn(
        f"the plan {what} {reached:.3f} {noun}, not the {goal:.3f} asked: the prunable groups are cut as far as "
        f"min_channels={cfg.min_channels}, max_ratio={cfg.max_ratio} and the ties allow, and {share:.0%} of the "
        f"channels are frozen{' (' + top + ')' if top else ''}; relax those limits, or unfreeze channels (the "
        "reasons above; `prunefx analyze` lists every group)",
        TargetMissedWarning, stacklevel=3)


def _by_sensitivity(dg, raw, eligible, cfg, ties, curves, measure_fn, cost, latency):
    """Masks and reasons of a sensitivity plan: widths by :func:`prunefx.plan.sensitivity.allocate`, on the
    target's quantity (kept channels / MACs / params, or the latency model's prediction)."""
    kind, goal = cfg.target
    memo: dict[tuple[int, int], np.ndarray] = {}

    def masks(widths):
        for g, n in widths.items():
            if (g, n) not in memo:
                memo[g, n] = _keep(np.asarray(raw[g]), n)
        return {g: memo[g, n] for g, n in widths.items()}

    def remaining(widths) -> float:  # what the cut brings down to the goal: kept fraction of the target's quantity
        v = measure_fn(masks(widths))
        return 1.0 - v if kind == "ratio" else v

    coupled: dict[int, set[int]] = {}  # groups whose cost changes with another's width: they share a layer
    if kind in ("flops", "params"):
        coupled = cost.coupled()
    elif kind == "latency":
        for layer in latency.layers:
            for g in layer.groups:
                coupled.setdefault(g, set()).update(layer.groups)
    total = sum(dg.groups[g].channels for g in eligible)

    def saving(widths, unit, w) -> float:  # what one move saves, counted on the layers it reaches only
        if kind == "ratio":
            return sum(widths[g] - w for g in unit) / max(total, 1)
        if kind == "latency":
            return -latency.layer_delta({**latency.full_widths(), **widths}, unit, w) / latency.base_ms
        moved = masks(dict.fromkeys(unit, w))
        if kind == "flops":
            return -cost.change(masks(widths), moved, "macs") / cost.macs_total
        return -cost.change(masks(widths), moved, "params") / cost.params_total

    grids = None
    if kind == "latency":  # the latency model only knows the widths it measured
        grids = {g: latency.grids[g].tolist() for g in eligible if g in latency.grids}
    elif cfg.round_to == "auto":  # each candidate at the fast edge of its latency step
        grids = {g: sorted({latency.fast_width(g, w) for w in candidate_widths(
            dg.groups[g].channels, lowest_width(dg.groups[g].channels, cfg))}) for g in eligible}
    fixed = {}
    for g in eligible:
        r = _override(dg, g, cfg)
        if r is not None:
            c = dg.groups[g].channels
            fixed[g] = max(lowest_width(c, cfg), c - int(math.floor(r * c + 1e-9)))
    widths = allocate(dg, curves, eligible, cfg, ties, remaining, 1.0 - goal if kind == "ratio" else goal,
                      coupled=coupled, grids=grids, fixed=fixed, target=f"the target {kind}={goal:g}", saving=saving)
    whys = {}
    for g, n in widths.items():
        c = dg.groups[g].channels
        d = curves.get(g).at(n)
        whys[g] = f"sensitivity: width {n} of {c} (measured damage {d:.3g} at this width)"
        if g in fixed:
            whys[g] += "; width set by an override"
    return masks(widths), whys


def _grid_text(grid: np.ndarray | None) -> str:
    if grid is None or not len(grid):
        return "none"
    return ",".join(map(str, grid.tolist())) if len(grid) <= 6 else f"{grid[0]},{grid[1]},...,{grid[-1]}"


def _global_why(values: np.ndarray, below: np.ndarray, ranked_sorted: np.ndarray, knob: float, normalize: str) -> str:
    """Why a group loses what it loses under one global threshold: its (normalised) scores against that threshold."""
    which = "its scores" if normalize == "none" else f"its scores normalised by {normalize}"
    stats = f"{which}: min {values.min():.3g}, median {np.median(values):.3g}, max {values.max():.3g}"
    if knob < 0:
        return f"no channel is below the global threshold ({stats})"
    threshold = ranked_sorted[min(int(knob), len(ranked_sorted) - 1)]
    n = len(values)
    return f"{int(below.sum())} of {n} channels score at or below the global threshold {threshold:.3g} ({stats})"


def _knobs(scope: str, scores: Mapping[int, np.ndarray], eligible: list[int]) -> np.ndarray:
    """The knob values to search, ascending: for global scope the threshold (a score rank), for local the ratio."""
    if scope == "global":  # below every score, then each sorted score
        all_scores = np.sort(np.concatenate([scores[g] for g in eligible])) if eligible else np.zeros(1)
        return np.concatenate([[all_scores[0] - 1.0], all_scores])
    return np.linspace(0.0, 0.999, 2000)


def _last_above(measure_fn, masks_for, goal: float, cands: np.ndarray) -> float:
    """The largest knob among ``cands`` whose plan still keeps more than ``goal`` (kept fraction, monotone)."""
    lo, hi = 0, len(cands) - 1
    if measure_fn(masks_for(float(cands[0]))) <= goal:
        return float(cands[0])
    while lo < hi:  # invariant: cands[lo] keeps more than goal
        mid = (lo + hi + 1) // 2
        if measure_fn(masks_for(float(cands[mid]))) > goal:
            lo = mid
        else:
            hi = mid - 1
    return float(cands[lo])


def _bisect(measure_fn, masks_for, goal: float, increasing: bool, cands: np.ndarray) -> float:
    """Find the knob among ``cands`` whose plan measures closest to ``goal`` (monotone in the knob)."""
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
