"""Measured sensitivity: per-group damage curves, and the allocation that meets a target with the least damage.

    curves = prunefx.sensitivity.measure(model, dg, scores, calibration)     # runs the model (top level)
    plan = make_plan(dg, scores, PlanConfig(flops=0.5, scope="sensitivity"), cost=cost, sensitivity=curves)

**The curves.** For each eligible group, the model is pruned with only that group (and the partners an
equal-count tie binds it to) cut to a few keep fractions, lowest-scored channels first, and its outputs on
calibration batches are compared with the unpruned ones (with ``refit``, after re-fitting the layers that read
the cut channels, as the cut's own re-fit will): the damage is the relative output error
``||y_pruned - y|| / ||y||`` (or the increase of the user's loss). A group's damage at any width is read off its
curve by linear interpolation, with keep 1.0 at damage 0; below the smallest measured fraction the last segment's
slope carries on (never falling). Groups measured together (a tie) share their measured damage equally, so a tie
set's damage, the sum of its members', is what was measured.

**The allocation** (:func:`allocate`). Importance decides which channels go; the curves decide how many per group.
From full widths, it repeatedly makes the jump of one unit (a group, or a tie set moving as one) to a lower
candidate width that adds the least damage per unit of target saved (removed channels, MACs, parameters or
predicted latency), until the target is met; the last jump is the least damaging one that reaches it. It is
greedy: for convex curves and costs that add up over groups it is optimal at every budget its steps end on
exactly (the relaxed problem's optimum is whole there) and within one jump's damage of the optimum elsewhere
(tests check both against brute force); for non-convex curves, or MACs that multiply where a layer reads one
pruned group and writes another, it is a heuristic. Its cost: at most ``MAX_STEPS`` candidate widths per unit
(steps of ``round_to``); after each move only the jumps of units sharing a layer with the moved one are
re-evaluated, each recounting only the layers that unit reaches (``CostModel.change``,
``LatencyModel.layer_delta``); no forward pass (ResNet-50's 37 groups to half the MACs: 2.8 s on one thread).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from prunefx.analysis.graph import DependencyGraph
from prunefx.plan.config import PlanConfig, PlanError
from prunefx.plan.greedy import next_jump
from prunefx.plan.latency import lowest_width
from prunefx.plan.widths import allowed_width

SCHEMA = "prunefx.sensitivity/1"
MAX_STEPS = 32  # candidate widths per unit at most: the step grows (in multiples of round_to) until it fits


@dataclass(frozen=True)
class GroupCurve:
    """One group's measured damage at a few kept widths (keep fraction = kept / channels)."""

    group: int
    channels: int
    keep: tuple[float, ...]  # measured keep fractions, in (0, 1)
    damage: tuple[float, ...]  # damage at each (this group's share when measured with tie partners)
    forwards: int  # forward passes its measurement ran
    label: str = ""
    tied: tuple[int, ...] = ()  # groups cut together with it when measured (an equal-count tie), itself included

    def at(self, width: int) -> float:
        """Damage at ``width`` kept channels: interpolated on the curve, 0 at full width, extrapolated below."""
        f = width / self.channels
        xs = np.array([*self.keep, 1.0], dtype=np.float64)
        ys = np.array([*self.damage, 0.0], dtype=np.float64)
        order = np.argsort(xs, kind="stable")
        xs, ys = xs[order], ys[order]
        if f >= xs[0] or len(xs) < 2:
            return float(np.interp(f, xs, ys))
        # below the smallest measured fraction: the lowest segment's slope carries on, damage never falling
        slope = (ys[1] - ys[0]) / max(xs[1] - xs[0], 1e-12)
        return float(ys[0] + max(0.0, -slope) * (xs[0] - f))


@dataclass(frozen=True)
class SensitivityCurves:
    """Measured damage curves of a model's groups, and what they cost and were measured under."""

    curves: tuple[GroupCurve, ...]
    metric: str  # "relative_output_error", or "loss_increase" (the user's loss_fn)
    key: str  # sha256 of what the damage depends on (graph, weights, calibration, fractions, scores, loss)
    fingerprint: str  # the analysis (DependencyGraph.fingerprint) they were measured on
    reference_forwards: int = 0  # forwards of the unpruned model on the calibration batches
    seconds: float = 0.0  # wall time of the measurement (0 when read from the cache)
    refit: bool = False  # measured with the layers reading each cut group re-fitted (prunefx.prune's refit=True)

    @property
    def forwards(self) -> int:
        """Forward passes the curves cost: the reference pass and every group's."""
        return self.reference_forwards + sum(c.forwards for c in self.curves)

    def get(self, group: int) -> GroupCurve | None:
        return next((c for c in self.curves if c.group == group), None)

    def merged(self, other: SensitivityCurves) -> SensitivityCurves:
        """These curves plus ``other``'s for groups these lack (same key), forwards and seconds added."""
        if other.key != self.key:
            raise PlanError("cannot merge sensitivity curves measured under different keys")
        have = {c.group for c in self.curves}
        extra = tuple(c for c in other.curves if c.group not in have)
        return SensitivityCurves(
            tuple(sorted((*self.curves, *extra), key=lambda c: c.group)), self.metric, self.key, self.fingerprint,
            max(self.reference_forwards, other.reference_forwards), self.seconds + other.seconds, self.refit,
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["schema"] = SCHEMA
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_dict(d: Mapping) -> SensitivityCurves:
        if d.get("schema") != SCHEMA:
            raise PlanError(f"not prunefx sensitivity curves (schema {d.get('schema')!r}); expected {SCHEMA!r}")
        curves = tuple(
            GroupCurve(group=int(c["group"]), channels=int(c["channels"]), keep=tuple(map(float, c["keep"])),
                       damage=tuple(map(float, c["damage"])), forwards=int(c["forwards"]), label=str(c["label"]),
                       tied=tuple(map(int, c["tied"])))
            for c in d["curves"]
        )
        return SensitivityCurves(curves, str(d["metric"]), str(d["key"]), str(d["fingerprint"]),
                                 int(d["reference_forwards"]), float(d["seconds"]), bool(d.get("refit", False)))

    @staticmethod
    def from_json(text: str) -> SensitivityCurves:
        return SensitivityCurves.from_dict(json.loads(text))


def candidate_widths(channels: int, lo: int, round_to: int = 1) -> list[int]:
    """Widths a unit may step down to: multiples of a step (a multiple of ``round_to``) from ``lo`` up, and full."""
    step = max(round_to, 1)
    while (channels - lo) / step > MAX_STEPS:
        step += max(round_to, 1)
    start = max(step, math.ceil(max(lo, 1) / step) * step)
    return sorted({*range(start, channels, step), channels})


def allocate(
    dg: DependencyGraph,
    curves: SensitivityCurves,
    eligible: Sequence[int],
    cfg: PlanConfig,
    ties: Sequence[tuple[tuple[int, ...], str]],
    remaining: Callable[[Mapping[int, int]], float],
    goal: float,
    *,
    coupled: Mapping[int, set[int]] | None = None,
    grids: Mapping[int, Sequence[int]] | None = None,
    fixed: Mapping[int, int] | None = None,
    target: str = "the target",
    saving: Callable[[Mapping[int, int], tuple[int, ...], int], float] | None = None,
) -> dict[int, int]:
    """Kept width per eligible group so ``remaining(widths) <= goal`` with the least total damage (greedy, see module).

    ``remaining``: the target's quantity that pruning brings down (kept channel / MACs / parameter / latency
    fraction) for widths of every eligible group. ``coupled``: group -> groups whose savings change when its width
    does (they share a layer); None: every group with every other. ``grids``: candidate widths per group (default
    :func:`candidate_widths` of ``round_to`` from the lowest width min_channels / max_ratio allow). ``fixed``:
    groups whose width is set (per-layer overrides); ``target`` names the goal in errors. ``saving(widths, unit,
    w)``: how much moving ``unit`` to width ``w`` lowers ``remaining`` (default: the difference of two full
    evaluations; a cost model recounts only the layers the unit reaches). A tie whose partner is
    not eligible, or whose members differ in size, pins its members at full width. Raises PlanError when no
    allocation meets the goal.
    """
    missing = [g for g in eligible if curves.get(g) is None or curves.get(g).channels != dg.groups[g].channels]
    if missing:
        raise PlanError(
            f"no measured sensitivity curve for group(s) {missing[:5]} ({dg.groups[missing[0]].label}): the curves "
            "were measured on another model or under another config; measure them again on this analysis "
            "(prunefx.sensitivity.measure(model, dg, scores, calibration, config=cfg))"
        )
    fixed = dict(fixed or {})
    eligible_set = set(eligible)
    widths = {g: dg.groups[g].channels for g in eligible}
    units: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for gids, _ in ties:
        tied = tuple(g for g in gids if g in eligible_set)
        if not tied:
            continue
        if len(tied) != len(gids) or len({dg.groups[g].channels for g in tied}) > 1:
            seen.update(tied)  # pinned: a partner that cannot move, or partners of different sizes
            continue
        if seen.intersection(tied):  # overlapping ties: join them into one unit
            joined = {g for u in units if set(u) & set(tied) for g in u} | set(tied)
            units = [u for u in units if not set(u) & set(tied)]
            units.append(tuple(sorted(joined)))
        else:
            units.append(tied)
        seen.update(tied)
    units += [(g,) for g in eligible if g not in seen]
    units = [u for u in units if all(g in widths for g in u)]
    options_of: dict[tuple[int, ...], list[int]] = {}
    for u in units:
        c = dg.groups[u[0]].channels
        set_to = [fixed[g] for g in u if g in fixed]
        if set_to:
            for g in u:
                widths[g] = min(set_to)
            continue
        grid = grids.get(u[0]) if grids is not None else None
        if grid is None:
            step = 1 if cfg.round_to == "auto" else int(cfg.round_to)
            grid = candidate_widths(c, lowest_width(c, cfg), step)
        # only widths PlanConfig.allowed_widths accepts (a config's legal head counts): the greedy steps between them
        options_of[u] = sorted(int(w) for w in grid if w < c and allowed_width(dg, u[0], cfg, int(w)) == w)
    movable = [u for u in options_of if options_of[u]]

    curve_of = {g: curves.get(g) for g in eligible}

    def damage(u: tuple[int, ...], w: int) -> float:
        return sum(curve_of[g].at(w) for g in u)

    now = remaining(widths)
    cache: dict[tuple[int, ...], list[tuple[float, float, int]]] = {}

    def jumps(u: tuple[int, ...]) -> list[tuple[float, float, int]]:
        """(added damage, saved, width) of every jump of unit ``u`` to a lower candidate width."""
        if u not in cache:
            n = widths[u[0]]
            d0 = damage(u, n)
            out = []
            for w in options_of[u]:
                if w >= n:
                    break
                saved = saving(widths, u, w) if saving is not None else (
                    now - remaining({**widths, **dict.fromkeys(u, w)}))
                out.append((damage(u, w) - d0, saved, w))
            cache[u] = out
        return cache[u]

    while now > goal + 1e-12:
        jump = next_jump(movable, jumps, now, goal)
        if jump is None:
            raise PlanError(
                f"{target} cannot be met with scope='sensitivity': with every eligible group at its lowest "
                f"candidate width the plan still keeps {now:.3f} (it must keep at most {goal:.3f}); allow deeper "
                "cuts (raise max_ratio, lower min_channels or round_to, fewer ignore patterns) or ask for a smaller cut"
            )
        unit, w, saved = jump
        for g in unit:
            widths[g] = w
        now -= saved
        if now <= goal + 1e-9:  # reached by the running sum: confirm on the full count (round-off)
            now = remaining(widths)
        touched = set(unit).union(*((coupled or {}).get(g, set()) for g in unit)) if coupled is not None else None
        for u in list(cache):
            if touched is None or touched.intersection(u):
                del cache[u]
    return widths
