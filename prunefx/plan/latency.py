"""Plan against measured latency: a latency model from a table of timed layers, and the solver that uses it.

    model = LatencyModel(net, dg, inputs, LatencyTable(dep), base_ms=measured, config=cfg)
    widths = latency_widths(model, dg, ranks, eligible, goal=0.5)    # group id -> kept channels

**The model.** Each layer the analysis sees prune (convolutions, linear layers, norms that do not fold away)
is rebuilt standalone at every candidate width of its input and output groups and timed on the deployment (a
:class:`~prunefx.metrics.latency_table.LatencyTable`, cached on disk). A layer's time at input width ``a`` and
output width ``b`` is ``T(a, B) * T(A, b) / T(A, B)`` (each axis measured with the other at full width; exact
whenever one side is at full width, and for depthwise convs and norms, whose two sides are one group). The
model's latency is ``base - sum(T at full) + sum(T at the plan's widths)``, with ``base`` the measured latency
of the whole deployed model (when the isolated layers add up to more than ``base``, they are scaled to it).
Candidate widths are multiples of 8 channels (16, 32... for wide groups, at most 16 per group; 4 or 1 for
groups of up to 16 channels) and of ``round_to``, plus the full width: the planner only ever chooses widths
it measured.

**The solver.** Importance decides which channels go; latency decides how many per group. Starting from
full widths, it repeatedly moves the group whose jump to a lower candidate width loses the least importance
per millisecond saved (every lower candidate is considered, so a plateau of a step function is crossed to
its fast edge), until the predicted latency reaches the goal; the last jump is the cheapest one that
reaches it. Importance is the channel's global rank (as in the global-threshold planner).

**The correction.** The table predicts the end-to-end latency only up to a map. Measured on MobileNetV2 at batch 1
(torch, 2 threads, load 0.7): the convolutions timed alone sum to 12.5 of the model's 17.3 ms and the other 4.8 ms
are held fixed, yet the activations and adds among them shrink with the channels (1.7 -> 0.7 ms in torch's
profiler at the deepest cut), and at that cut the convolutions timed alone add up to 4.9 ms where the profiler
sees 3.6 ms inside the model. Asked for 0.75 / 0.6 / 0.5, the model predicted 0.75 / 0.60 / 0.54 (its floor),
and the pruned models measured 0.68 / 0.45 / 0.36: close to an affine map of slope 1.4 through the base.
:func:`meet_latency` therefore measures each plan end to end and asks the planner next for the prediction that
the measured points (the base at (1, 1) among them) map onto the goal (:func:`calibrated_ask`), from whichever
side the miss was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from torch import nn

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import CHANNEL, IN, OUT, Kind, Normalized, RecordKey, Role
from prunefx.capture import VALUE_KEY
from prunefx.metrics.latency_table import LatencyTable, LayerCase
from prunefx.metrics.layer_cases import per_channel, resized, timed
from prunefx.passes import foldable
from prunefx.plan.config import PlanConfig, PlanError
from prunefx.plan.greedy import next_jump
from prunefx.plan.plan import PruningPlan

MAX_POINTS = 16  # candidate widths per group at most (the quantum doubles until the group fits)
FAST_TOLERANCE = 0.03  # round_to="auto": a wider candidate within this fraction of the time is "as fast"


def width_grid(channels: int, lo: int, round_to: int = 1) -> np.ndarray:
    """Candidate kept widths of a group of ``channels``: multiples of a quantum from ``lo`` up, and ``channels``."""
    q = 1 if channels <= 8 else 4 if channels <= 16 else 8
    while channels / q > MAX_POINTS:
        q *= 2
    q = math.lcm(q, max(round_to, 1))
    start = max(q, math.ceil(max(lo, 1) / q) * q)
    return np.array(sorted({*range(start, channels, q), channels}), dtype=np.int64)


def lowest_width(channels: int, cfg: PlanConfig) -> int:
    """The fewest channels ``cfg`` lets a group of ``channels`` keep (min_channels, max_ratio)."""
    return max(cfg.min_channels, int(math.ceil((1.0 - cfg.max_ratio) * channels - 1e-9)))


@dataclass(frozen=True)
class Axis:
    """One channel side of a layer: which groups' channels it holds, how many times each, and the rest."""

    groups: tuple[int, ...]
    mult: tuple[float, ...]  # positions per kept channel of each group
    fixed: int  # positions of channels no eligible group owns
    full: int

    def count(self, widths: Mapping[int, int]) -> int:
        return int(round(self.fixed + sum(m * widths[g] for g, m in zip(self.groups, self.mult, strict=True))))


@dataclass
class Layer:
    """A timed layer: its input / output axes and measured times along each (counts ascending)."""

    name: str
    node: str
    axis_in: Axis
    axis_out: Axis | None  # None: a per-channel layer (norm, depthwise conv): one axis
    in_counts: np.ndarray
    in_ms: np.ndarray
    out_counts: np.ndarray
    out_ms: np.ndarray
    full_ms: float

    @property
    def groups(self) -> set[int]:
        return {*self.axis_in.groups, *(self.axis_out.groups if self.axis_out else ())}

    def ms(self, widths: Mapping[int, int]) -> float:
        t_in = float(np.interp(self.axis_in.count(widths), self.in_counts, self.in_ms))
        if self.axis_out is None:
            return t_in
        t_out = float(np.interp(self.axis_out.count(widths), self.out_counts, self.out_ms))
        return t_in * t_out / self.full_ms


def _fixed(module: nn.Module, side: str) -> Axis | None:
    """An axis no prunable group reaches: the layer's own width on that side (None when it has no such attribute)."""
    names = ("in_channels", "in_features", "num_features", "num_channels") if side == "in" else (
        "out_channels", "out_features")
    n = next((getattr(module, a) for a in names if isinstance(getattr(module, a, None), int)), None)
    if n is None and side == "in" and isinstance(module, nn.LayerNorm):
        n = module.normalized_shape[-1]
    return None if n is None else Axis((), (), int(n), int(n))


def _in_role(module: nn.Module) -> Role:
    """The record role of a layer's input channels: a conv's / linear's IN, a norm's channels."""
    if isinstance(module, nn.LayerNorm):
        return Normalized(len(module.normalized_shape) - 1)
    if isinstance(module, (nn.modules.conv._ConvNd, nn.Linear)):
        return IN
    return CHANNEL


class LatencyModel:
    """Predicted latency (ms) of the deployed model as a function of each prunable group's kept width.

    ``base_ms``: the measured latency of the whole deployed model. ``config`` sets the candidate widths
    (``round_to``, ``min_channels``, ``max_ratio``). Layers are timed through ``table`` (measured once, then
    read from its cache). ``unmodeled`` lists layers with channels that no table can time, with the reason.
    """

    def __init__(
        self,
        model: nn.Module,
        dg: DependencyGraph,
        table: LatencyTable,
        *,
        base_ms: float,
        config: PlanConfig | None = None,
    ) -> None:
        if base_ms <= 0:
            raise PlanError(f"base_ms must be the measured latency of the model (> 0), got {base_ms}")
        cfg = config or PlanConfig(latency=1.0)
        self.dg, self.table, self.base_ms = dg, table, float(base_ms)
        step = 1 if cfg.round_to == "auto" else int(cfg.round_to)
        self.grids = {g.id: width_grid(g.channels, lowest_width(g.channels, cfg), step) for g in dg.prunable}
        self.full = {g.id: g.channels for g in dg.groups}
        self.unmodeled: dict[str, str] = {}
        self.call_ms = self._call_overhead(table)
        self.layers = self._layers(model, dg, table.deployment.batch or 1)
        self.layers_full_ms = sum(layer.full_ms for layer in self.layers)
        # isolated layers can add up to more than the whole (per-call overheads counted twice): scale them down
        self.scale = min(1.0, self.base_ms / self.layers_full_ms) if self.layers_full_ms else 1.0
        self._profiles: dict[int, np.ndarray] = {}
        self.by_group: dict[int, list[int]] = {}
        for i, layer in enumerate(self.layers):
            for g in layer.groups:
                self.by_group.setdefault(g, []).append(i)

    # ---- building -------------------------------------------------------------------------------------

    @staticmethod
    def _call_overhead(table: LatencyTable) -> float:
        """What one standalone call costs with nothing to compute: ONNX Runtime pays it per session run, so each
        layer timed alone carries it once, while the whole model pays it once (torch pays its per-module call in
        the model too, so nothing is subtracted there)."""
        if table.deployment.backend != "onnxruntime":
            return 0.0
        return table.lookup({"call": LayerCase(nn.Identity(), (table.deployment.batch or 1, 1))})["call"]

    def _axis(self, key: RecordKey, root_to: dict[int, tuple[int, int]]) -> Axis | None:
        roots = self.dg.record_roots.get(key)
        if roots is None:
            return None
        gids = np.array([root_to.get(r, (-1, 0))[0] for r in roots.tolist()], dtype=np.int64)
        groups, mult = [], []
        for g in sorted(set(gids.tolist()) & set(self.grids)):
            groups.append(g)
            mult.append(float((gids == g).sum()) / self.full[g])
        fixed = int(sum(1 for g in gids.tolist() if g not in self.grids))
        return Axis(tuple(groups), tuple(mult), fixed, len(gids))

    def _counts(self, axis: Axis) -> list[int]:
        """Position counts at which to time one axis: the group's candidate widths, or a joint sweep."""
        if not axis.groups:
            return [axis.full]
        if len(axis.groups) == 1:
            return sorted({axis.count({axis.groups[0]: int(w)}) for w in self.grids[axis.groups[0]]})
        fracs = np.linspace(0.1, 1.0, MAX_POINTS)
        return sorted({axis.count({g: max(1, round(f * self.full[g])) for g in axis.groups}) for f in fracs})

    def _layers(self, model: nn.Module, dg: DependencyGraph, batch: int) -> list[Layer]:
        gm = dg.gm
        modules = dict(gm.named_modules())
        folded = {f.node for f in foldable(gm) if f.into is not None}
        root_to = {}
        for g in dg.groups:
            for k, r in enumerate(g.roots.tolist()):
                root_to[r] = (g.id, k)
        plans: list[tuple[str, str, Axis, Axis | None, dict[str, LayerCase], list[int], list[int]]] = []
        cases: dict[str, LayerCase] = {}
        for node in gm.graph.nodes:
            if node.op != "call_module" or node.name in folded:
                continue
            module = modules.get(node.target)
            if module is None or not timed(module):
                continue
            name = str(node.target)
            arg = node.args[0] if node.args else None
            value = getattr(arg, "meta", {}).get(VALUE_KEY)
            if value is None or not hasattr(value, "shape"):
                self.unmodeled[name] = "its input shape is unknown"
                continue
            shape = (batch, *value.shape[1:])
            single = per_channel(module)
            # a side the analysis recorded no channels for (a model input, a frozen output) never changes
            axis_in = self._axis(RecordKey(Kind.MODULE, name, _in_role(module)), root_to) or _fixed(module, "in")
            axis_out = None if single else (
                self._axis(RecordKey(Kind.MODULE, name, OUT), root_to) or _fixed(module, "out")
            )
            if axis_in is None or (not single and axis_out is None):
                self.unmodeled[name] = "its channel counts are unknown"
                continue
            if not axis_in.groups and (axis_out is None or not axis_out.groups):
                continue  # no prunable channel reaches it: its time is part of the fixed remainder
            ins, outs = self._counts(axis_in), ([] if single else self._counts(axis_out))
            mine: dict[str, LayerCase] = {}
            for a in ins:
                case = resized(module, a, a if single else axis_out.full, shape)
                if case is not None:
                    mine[f"{node.name}|in|{a}"] = case
            for b in outs:
                case = resized(module, axis_in.full, b, shape)
                if case is not None:
                    mine[f"{node.name}|out|{b}"] = case
            full_key = f"{node.name}|in|{axis_in.full}"
            if full_key not in mine:
                self.unmodeled[name] = "it cannot be rebuilt at its own width"
                continue
            plans.append((name, node.name, axis_in, axis_out, mine, ins, outs))
            cases.update(mine)
        # a layer's own time: the standalone call's fixed cost is not paid per layer inside the model
        ms = {k: max(v - self.call_ms, 0.05 * v) for k, v in self.table.lookup(cases).items()}
        layers = []
        for name, node_name, axis_in, axis_out, mine, ins, outs in plans:
            full = ms[f"{node_name}|in|{axis_in.full}"]
            ic = [a for a in ins if f"{node_name}|in|{a}" in mine]
            oc = [b for b in outs if f"{node_name}|out|{b}" in mine]
            layers.append(
                Layer(
                    name, node_name, axis_in, axis_out,
                    np.array(ic, dtype=np.float64), np.array([ms[f"{node_name}|in|{a}"] for a in ic]),
                    np.array(oc or [axis_in.full], dtype=np.float64),
                    np.array([ms[f"{node_name}|out|{b}"] for b in oc] or [full]), full,
                )
            )
        return layers

    # ---- using --------------------------------------------------------------------------------------

    def measured_on(self) -> dict[str, str]:
        """Where its times come from, for a plan's target: the deployment and the latency table's file name."""
        return {"deployment": self.table.deployment.describe(), "latency_table": self.table.name}

    def full_widths(self) -> dict[int, int]:
        return {g: int(self.full[g]) for g in self.grids}

    def predict(self, widths: Mapping[int, int]) -> float:
        """Predicted latency (ms) with ``widths`` (group id -> kept channels; missing groups at full width)."""
        w = {**self.full_widths(), **widths}
        layers = sum(layer.ms(w) for layer in self.layers)
        return self.base_ms + self.scale * (layers - self.layers_full_ms)

    def layer_delta(self, widths: Mapping[int, int], group_ids: Sequence[int], width: int) -> float:
        """Predicted change (ms) when every group in ``group_ids`` moves to ``width``; others as in ``widths``."""
        idx = sorted({i for g in group_ids for i in self.by_group.get(g, ())})
        after = {**widths, **dict.fromkeys(group_ids, width)}
        return self.scale * sum(self.layers[i].ms(after) - self.layers[i].ms(widths) for i in idx)

    def fast_width(self, gid: int, n: int) -> int:
        """``round_to="auto"``: ``n`` rounded up to a candidate width, then up to the widest candidate that is
        as fast (within FAST_TOLERANCE of the time this group can save), i.e. to the fast edge of its step."""
        grid = self.grids.get(gid)
        if grid is None:
            return n
        profile = self.profile(gid)
        up = np.flatnonzero(grid >= n)
        if not len(up):
            return int(grid[-1])
        t0 = profile[up[0]]
        slack = FAST_TOLERANCE * max(t0 - profile[0], 1e-9)
        return int(grid[max(i for i in up.tolist() if profile[i] <= t0 + slack)])

    def profile(self, gid: int) -> np.ndarray:
        """Predicted latency with group ``gid`` at each of its candidate widths and every other group full."""
        if gid not in self._profiles:
            self._profiles[gid] = np.array([self.predict({gid: int(w)}) for w in self.grids[gid]])
        return self._profiles[gid]


def latency_widths(
    model: LatencyModel,
    dg: DependencyGraph,
    values: Mapping[int, np.ndarray],
    eligible: Sequence[int],
    goal: float,
    ties: Sequence[tuple[tuple[int, ...], str]] | None = None,
) -> dict[int, int]:
    """Kept width per eligible group so the predicted latency is at most ``goal`` x the base (greedy, see module).

    ``values``: per group, a positive importance per channel (higher = keep). Tied groups (``ties``, default the
    analysis's equal-count ties) move together; a tie with a group that cannot be pruned pins them at full width.
    """
    eligible_set = {g for g in eligible if g in model.grids}
    units: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for gids, _ in dg.ties if ties is None else ties:
        tied = tuple(g for g in gids if g in eligible_set)
        if len(tied) != len(gids) or len({model.full[g] for g in tied}) > 1:
            seen.update(gids)  # pinned: a partner that cannot move, or partners of different sizes
            continue
        units.append(tied)
        seen.update(tied)
    units += [(g,) for g in sorted(eligible_set - seen)]
    widths = model.full_widths()
    prefix = {g: np.concatenate([[0.0], np.cumsum(np.sort(np.asarray(values[g], dtype=np.float64))[::-1])])
              for u in units for g in u}
    target = goal * model.base_ms
    now = model.predict(widths)
    cache: dict[tuple[int, ...], list[tuple[float, float, int]]] = {}

    def options(unit: tuple[int, ...]) -> list[tuple[float, float, int]]:
        """(loss, saved ms, width) of every jump of this unit to a lower candidate width."""
        if unit not in cache:
            grid = model.grids[unit[0]]
            n = widths[unit[0]]
            out = []
            for w in grid[grid < n].tolist():
                loss = sum(prefix[g][n] - prefix[g][w] for g in unit)
                saved = -model.layer_delta(widths, unit, w)
                out.append((loss, saved, int(w)))
            cache[unit] = out
        return cache[unit]

    while now > target + 1e-12:
        jump = next_jump(units, options, now, target)
        if jump is None:
            break  # no lower width saves anything: the goal is out of reach
        unit, w, _ = jump
        for g in unit:
            widths[g] = w
        now = model.predict(widths)
        touched = set(unit).union(*(model.layers[i].groups for g in unit for i in model.by_group.get(g, ())))
        for u in [u for u in cache if touched.intersection(u)]:
            del cache[u]
    return {g: widths[g] for g in eligible}


def calibrated_ask(points: Sequence[tuple[float, float]], goal: float) -> float | None:
    """The predicted fraction whose measurement should be ``goal``, from measured (predicted, measured) points.

    The table's prediction and the end-to-end measurement differ by roughly an affine map (layers timed alone
    carry per-call costs the model does not pay; the untimed remainder, activations and adds, shrinks with the
    channels yet is predicted constant), so the map is read off the points: interpolated between the nearest
    points measured on either side of ``goal``, else extrapolated along the two nearest. The base, predicted
    and measured at 1.0 by definition, is one of the points. None when the points give no increasing map.
    """
    pts = sorted({(float(p), float(m)) for p, m in points}, key=lambda pm: abs(pm[1] - goal))
    below = [pm for pm in pts if pm[1] <= goal]
    above = [pm for pm in pts if pm[1] > goal]
    pair = (below[0], above[0]) if below and above else tuple(pts[:2])
    if len(pair) < 2:
        return None
    (p0, m0), (p1, m1) = pair
    if (p1 - p0) * (m1 - m0) <= 0 or abs(m1 - m0) < 1e-9:  # flat or falling: noise, not a map to follow
        return (p0 + p1) / 2 if below and above else None  # a bracket still halves
    return p0 + (goal - m0) * (p1 - p0) / (m1 - m0)


@dataclass(frozen=True)
class LatencyRound:
    """One plan of the correction loop: the goal the model was asked for, what it predicted, what was measured."""

    asked: float  # latency fraction the model was asked to reach
    predicted: float  # the plan's predicted fraction of the base latency
    measured: float  # measured fraction (pruned / base, timed in alternating rounds)
    noise: str | None = None  # the measurement's noise flag, if any


@dataclass(frozen=True)
class LatencyOutcome:
    """How a latency target was met: every round, the one chosen, and a sentence saying so."""

    goal: float
    rounds: tuple[LatencyRound, ...]
    chosen: int
    met: bool
    note: str

    @property
    def miss(self) -> float:
        """The chosen plan's measured fraction over the goal, minus 1 (negative: faster than asked)."""
        return self.rounds[self.chosen].measured / self.goal - 1.0


def meet_latency(
    plan_for: Callable[[float], PruningPlan],
    measure: Callable[[PruningPlan], tuple[float, str | None]],
    goal: float,
    *,
    tolerance: float = 0.05,
    max_rounds: int = 4,
) -> tuple[PruningPlan, LatencyOutcome]:
    """Plan for ``goal``, measure the pruned model end to end, and re-plan while it misses by more than ``tolerance``.

    ``plan_for(f)`` plans for a predicted fraction ``f`` of the base latency; ``measure(plan)`` returns the
    measured fraction (and a noise flag). A miss on either side re-plans for :func:`calibrated_ask` of the
    measured points so far (the base at (1, 1) included), at most 2x the last prediction either way (one bad
    timing must not fling the plan), at most ``max_rounds`` plans in all; the loop also ends when the planner
    gives back a plan it already measured (the goal is beyond what the model can reach). A noisy timing is
    still corrected against (base and pruned shared its slow spells in alternating rounds) and said.
    The plan returned is the one within tolerance, else the one closest to ``goal`` not slower than
    ``goal * (1 + tolerance)``, else the fastest; its ``estimate`` gains the predicted and measured
    fractions and the number of plans, its ``target`` the fraction it was planned for.
    """
    if not 0.0 < goal <= 1.0:
        raise PlanError(f"a latency goal is a fraction of the measured latency in (0, 1], got {goal}")
    rounds: list[LatencyRound] = []
    plans: list[PruningPlan] = []
    asked = goal
    for _ in range(max_rounds):
        plan = plan_for(asked)
        est = plan.estimate
        predicted = est["latency_ms_planned"] / est["latency_ms_before"]
        if any(abs(predicted - r.predicted) < 1e-9 for r in rounds):
            break  # the same plan again (the model's floor or ceiling): measuring it again cannot change anything
        measured, noise = measure(plan)
        rounds.append(LatencyRound(asked, predicted, measured, noise))
        plans.append(plan)
        if abs(measured / goal - 1.0) <= tolerance:
            break
        nxt = calibrated_ask([(1.0, 1.0), *((r.predicted, r.measured) for r in rounds)], goal)
        if nxt is None:  # no increasing map in the points: scale by the miss
            nxt = predicted * goal / measured
        nxt = min(1.0, max(0.01, predicted / 2, min(nxt, predicted * 2)))
        if any(abs(nxt - r.asked) < 1e-4 for r in rounds):
            break  # asking again what was asked before cannot change the plan
        asked = nxt

    def rank(i: int) -> tuple[bool, bool, float]:
        miss = rounds[i].measured / goal - 1.0
        return abs(miss) > tolerance, miss > tolerance, abs(miss)

    chosen = min(range(len(rounds)), key=rank)
    r = rounds[chosen]
    miss = r.measured / goal - 1.0
    met = abs(miss) <= tolerance
    noisy = [str(i + 1) for i, x in enumerate(rounds) if x.noise]
    note = (
        f"measured {r.measured:.3f} of the base latency for a goal of {goal:g} ({miss:+.1%}, "
        f"{'faster' if miss < 0 else 'slower'}; {'within' if met else 'missing'} {tolerance:.0%}) "
        f"after {len(rounds)} plan(s); the model predicted {r.predicted:.3f}"
        + (f"; re-planned {len(rounds) - 1} time(s) on the measured points" if len(rounds) > 1 else "")
        + (f"; timing of plan(s) {', '.join(noisy)} noisy ({rounds[int(noisy[-1]) - 1].noise})" if noisy else "")
    )
    plan = plans[chosen]
    estimate = {**plan.estimate, "latency_ratio_planned": r.predicted, "latency_ratio_measured": r.measured,
                "latency_plans": float(len(rounds))}
    target = {**plan.target, "latency": goal, "latency_planned_for": r.asked}
    return replace(plan, estimate=estimate, target=target), LatencyOutcome(goal, tuple(rounds), chosen, met, note)
