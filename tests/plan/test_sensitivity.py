"""Measured sensitivity: the allocation recovers known optima on hand-made curves (and brute force on a tiny case),
measure() finds the insensitive branch of a model built with known sensitivities, its cache runs no forward the
second time, bad input is refused, and prunefx.prune(scope="sensitivity") passes the oracle and meets its target."""

import itertools
import math

import numpy as np
import pytest
import torch
from _nets import Patterns, cbr, randomize_bn
from torch import nn

import prunefx
from prunefx.metrics import measure as measure_cost
from prunefx.plan import CostModel, PlanConfig, PlanError, make_plan
from prunefx.plan.sensitivity import GroupCurve, SensitivityCurves, allocate
from prunefx.sensitivity import measure


class Branches(nn.Module):
    """Parallel conv branches from the input, each conv -> BN -> ReLU -> conv (to ``out`` channels), summed;
    branch i's output is multiplied by ``scale[i]`` (a branch scaled 100x smaller barely moves the output)."""

    def __init__(self, n: int = 3, width: int = 8, out: int = 4, scale: tuple[float, ...] | None = None) -> None:
        super().__init__()
        self.a = nn.ModuleList(nn.Conv2d(3, width, 3, padding=1, bias=False) for _ in range(n))
        self.bn = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(n))
        self.b = nn.ModuleList(nn.Conv2d(width, out, 1) for _ in range(n))
        self.scale = scale or (1.0,) * n

    def forward(self, x):
        return sum(s * b(torch.relu(bn(a(x)))) for a, bn, b, s in zip(self.a, self.bn, self.b, self.scale,
                                                                             strict=True))


def _branch_groups(dg, n: int) -> list[int]:
    """The group of each branch's first conv output (its BN channels), in branch order."""
    return [dg.group_of(f"a.{i}").id for i in range(n)]


def _linear_curves(dg, gids, slopes) -> SensitivityCurves:
    """Hand-made curves: damage = slope * (1 - keep), measured at keep 0.75 / 0.5 / 0.25."""
    keep = (0.75, 0.5, 0.25)
    return SensitivityCurves(
        tuple(GroupCurve(group=g, channels=dg.groups[g].channels, keep=keep, damage=tuple(s * (1 - f) for f in keep),
                         forwards=0) for g, s in zip(gids, slopes, strict=True)),
        "relative_output_error", "hand-made", dg.fingerprint(),
    )


@pytest.fixture
def three():
    model = randomize_bn(Branches(3, 8)).eval()
    x = torch.randn(2, 3, 8, 8)
    dg = prunefx.analyze(model, x)
    return model, x, dg, _branch_groups(dg, 3)


def test_equal_costs_cut_the_least_sensitive_group_first(three):
    model, x, dg, gids = three
    assert {g.id for g in dg.prunable} == set(gids)
    scores = prunefx.score(model, dg, "bn_scale")
    # slopes 1 < 5 < 25: a third of the 24 channels go; group 0 down to its lowest width (max_ratio 0.9 of 8 -> 1),
    # then one channel of group 1 (the cheaper of the two left), group 2 untouched
    curves = _linear_curves(dg, gids, (1.0, 5.0, 25.0))
    plan = make_plan(dg, scores, PlanConfig(ratio=1 / 3, scope="sensitivity"), sensitivity=curves)
    widths = {gp.group: gp.after for gp in plan.groups}
    assert [widths[g] for g in gids] == [1, 7, 8]
    # the order reverses with the slopes
    curves = _linear_curves(dg, gids, (25.0, 5.0, 1.0))
    plan = make_plan(dg, scores, PlanConfig(ratio=1 / 3, scope="sensitivity"), sensitivity=curves)
    assert [{gp.group: gp.after for gp in plan.groups}[g] for g in gids] == [8, 7, 1]
    # kept channels are each group's highest-scored ones, and the plan says why with the measured damage
    gp = next(gp for gp in plan.groups if gp.group == gids[2])
    assert set(gp.keep) == {int(np.argmax(scores.values[gids[2]]))}
    assert gp.why.startswith("sensitivity: width 1 of 8 (measured damage")
    assert math.isclose(float(gp.why.split("damage ")[1].split(" ")[0]), 1.0 * (1 - 1 / 8), rel_tol=1e-2)
    # round_to: widths are multiples of it (or full); the two least sensitive groups lose half each
    plan = make_plan(dg, scores, PlanConfig(ratio=0.3, scope="sensitivity", round_to=4), sensitivity=curves)
    assert [{gp.group: gp.after for gp in plan.groups}[g] for g in gids] == [8, 4, 4]


def test_unequal_costs_match_brute_force_on_convex_curves(three):
    _, _, dg, gids = three
    cfg = PlanConfig(ratio=0.5, scope="sensitivity", max_ratio=0.75)  # widths 2..8 per group
    unit_cost = dict(zip(gids, (1.0, 2.0, 3.5), strict=True))  # cost of one kept channel, per group
    full = sum(unit_cost[g] * 8 for g in gids)
    keep = (0.75, 0.5, 0.25)
    quad = dict(zip(gids, (4.0, 3.0, 9.0), strict=True))  # damage = a * (1 - keep)^2: convex
    curves = SensitivityCurves(
        tuple(GroupCurve(group=g, channels=8, keep=keep, damage=tuple(quad[g] * (1 - f) ** 2 for f in keep), forwards=0)
              for g in gids), "relative_output_error", "hand-made", dg.fingerprint())

    def remaining(widths) -> float:
        return sum(unit_cost[g] * w for g, w in widths.items()) / full

    def damage(widths) -> float:
        return sum(curves.get(g).at(w) for g, w in widths.items())

    combos = [dict(zip(gids, ws, strict=True)) for ws in itertools.product(range(2, 9), repeat=3)]

    def optimum(goal: float) -> float:
        return min(damage(c) for c in combos if remaining(c) <= goal + 1e-12)

    # at any budget greedy is within one channel step of the optimum
    step = max(curves.get(g).at(w - 1) - curves.get(g).at(w) for g in gids for w in range(3, 9))
    for goal in np.linspace(0.3, 0.95, 27):
        widths = allocate(dg, curves, gids, cfg, [], remaining, float(goal), coupled={})
        assert remaining(widths) <= goal + 1e-12
        assert optimum(goal) - 1e-9 <= damage(widths) <= optimum(goal) + step + 1e-9
    # and exact at the budgets of the steps taken in order of damage per cost (convex: each group's steps in
    # order): there the relaxed problem's optimum is whole, so nothing does better (brute force checks it)
    steps = sorted(((curves.get(g).at(w - 1) - curves.get(g).at(w)) / unit_cost[g], g) for g in gids
                   for w in range(8, 2, -1))
    budgets = np.cumsum([unit_cost[g] for _, g in steps])
    for saved in budgets[::2]:
        goal = 1.0 - saved / full
        widths = allocate(dg, curves, gids, cfg, [], remaining, goal, coupled={})
        assert damage(widths) == pytest.approx(optimum(goal), abs=1e-9)


def test_ties_move_as_one_unit(three):
    _, _, dg, gids = three
    curves = _linear_curves(dg, gids, (1.0, 1.5, 30.0))
    cfg = PlanConfig(ratio=0.25, scope="sensitivity")

    def remaining(widths):
        return sum(widths.values()) / 24

    # groups 0 and 2 tied: the tie's damage is 1 + 30 per unit cut, so group 1 (1.5) goes first and alone
    widths = allocate(dg, curves, gids, cfg, [((gids[0], gids[2]), "test")], remaining, 0.75, coupled={})
    assert widths[gids[0]] == widths[gids[2]] == 8 and widths[gids[1]] == 2
    # a tie with a partner that is not eligible pins the other at full width
    widths = allocate(dg, curves, gids[:2], cfg, [((gids[0], gids[2]), "test")],
                      lambda w: (sum(w.values()) + 8) / 24, 0.8, coupled={})
    assert widths[gids[0]] == 8 and widths[gids[1]] < 8


def _scaled_branches():
    model = randomize_bn(Branches(2, 8, scale=(1.0, 0.01))).eval()
    torch.manual_seed(0)
    calib = [torch.randn(4, 3, 8, 8) for _ in range(2)]
    return model, calib


def test_measure_finds_the_insensitive_branch_and_the_plan_cuts_it_first(tmp_path):
    model, calib = _scaled_branches()
    dg = prunefx.analyze(model, calib[0])
    loud, quiet = _branch_groups(dg, 2)
    scores = prunefx.score(model, dg, "bn_scale")
    curves = measure(model, dg, scores, calib, cache=tmp_path)
    for f_loud, f_quiet in zip(curves.get(loud).damage, curves.get(quiet).damage, strict=True):
        assert f_quiet < 0.05 * f_loud  # 100x smaller output: its cut moves the sum ~100x less
    assert curves.get(loud).keep == (0.75, 0.5, 0.25)
    # 2 groups x 3 fractions x (2 batches + 1 compensation pass, bn_scale compensates) + 2 reference batches
    assert curves.forwards == 2 * 3 * 3 + 2
    plan = make_plan(dg, scores, PlanConfig(ratio=0.4, scope="sensitivity"), sensitivity=curves)
    widths = {gp.group: gp.after for gp in plan.groups}
    assert widths[loud] == 8 and widths[quiet] == 1  # 7 of 16 channels removed >= 0.4, all from the quiet branch
    cost = CostModel(model, dg, (calib[0],))
    plan = make_plan(dg, scores, PlanConfig(flops=0.7, scope="sensitivity"), cost=cost, sensitivity=curves)
    assert plan.estimate["macs_after"] <= 0.7 * plan.estimate["macs_before"] * (1 + 1e-9)
    widths = {gp.group: gp.after for gp in plan.groups}
    assert widths[quiet] < widths[loud]


def test_a_second_measure_with_the_same_key_runs_no_forward(tmp_path):
    model, calib = _scaled_branches()
    dg = prunefx.analyze(model, calib[0])
    scores = prunefx.score(model, dg, "bn_scale")
    runs = []
    model.register_forward_pre_hook(lambda *_: runs.append(1))  # deep copies keep it: every pruned copy counts
    first = measure(model, dg, scores, calib, cache=tmp_path)
    assert len(runs) == first.forwards > 0
    runs.clear()
    second = measure(model, dg, scores, calib, cache=tmp_path)
    assert not runs and second == first
    # another key (other calibration data) measures again
    measure(model, dg, scores, [c * 2 for c in calib], cache=tmp_path)
    assert len(runs) == first.forwards
    # the curves survive JSON
    assert SensitivityCurves.from_json(first.to_json()) == first


def test_loss_fn_measures_the_loss_increase(tmp_path):
    model, calib = _scaled_branches()
    dg = prunefx.analyze(model, calib[0])
    scores = prunefx.score(model, dg, "bn_scale")
    with torch.no_grad():
        pairs = [(x, model(x) + 0.1) for x in calib]  # a target the unpruned model misses by a little
    curves = measure(model, dg, scores, pairs, loss_fn=nn.functional.mse_loss, cache=None)
    assert curves.metric == "loss_increase"
    loud, quiet = _branch_groups(dg, 2)
    assert all(d > 0 for d in curves.get(loud).damage)
    assert max(abs(d) for d in curves.get(quiet).damage) < 0.05 * min(curves.get(loud).damage)


def test_errors_name_the_fix(three, tmp_path):
    model, x, dg, gids = three
    scores = prunefx.score(model, dg, "bn_scale")
    with pytest.raises(PlanError, match=r"scope='sensitivity' needs measured curves.*calibration"):
        make_plan(dg, scores, PlanConfig(ratio=0.3, scope="sensitivity"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(PlanError, match=r"calibration=\["):
        prunefx.prune(model, x, PlanConfig(ratio=0.3, scope="sensitivity"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing touched
    curves = _linear_curves(dg, gids, (1.0, 2.0, 3.0))
    with pytest.raises(PlanError, match=r"ratio=0.8 cannot be met.*raise max_ratio"):
        make_plan(dg, scores, PlanConfig(ratio=0.8, scope="sensitivity", max_ratio=0.5), sensitivity=curves)
    other = _linear_curves(dg, gids[:2], (1.0, 2.0))  # no curve for the third group
    with pytest.raises(PlanError, match="no measured sensitivity curve"):
        make_plan(dg, scores, PlanConfig(ratio=0.3, scope="sensitivity"), sensitivity=other)
    with pytest.raises(PlanError, match="calibration is empty"):
        measure(model, dg, scores, [], cache=None)
    with pytest.raises(PlanError, match="keep fractions in"):
        measure(model, dg, scores, [x], fractions=(1.5,), cache=None)


def test_prune_with_sensitivity_scope_passes_the_oracle_and_meets_the_target(tmp_path):
    model = randomize_bn(Patterns()).eval()
    torch.manual_seed(1)
    x = torch.randn(1, 3, 16, 16)
    calib = [torch.randn(2, 3, 16, 16) for _ in range(2)]
    base = measure_cost(model, x).macs
    result = prunefx.prune(model, x, PlanConfig(flops=0.6, scope="sensitivity"), calibration=calib,
                           sensitivity_cache=tmp_path)
    assert result.verified.ok
    assert result.sensitivity is not None and result.sensitivity.forwards > 0
    assert measure_cost(result.model, x).macs <= 0.6 * base * (1 + 1e-6)
    assert result.plan.target["scope"] == "sensitivity"
    assert all(gp.why.startswith("sensitivity: width") for gp in result.plan.groups)


class Halves(nn.Module):
    """A stem whose output is chunked in two halves (two groups tied to equal counts), each through its own cbr."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.b, self.c = cbr(3, 16), cbr(8, 8), cbr(8, 8)
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        u, v = self.stem(x).chunk(2, 1)
        return self.head(torch.cat([self.b(u), self.c(v)], 1)).mean((2, 3))


def test_prune_keeps_tied_groups_equally_wide(tmp_path):
    model = randomize_bn(Halves()).eval()
    torch.manual_seed(2)
    x = torch.randn(1, 3, 8, 8)
    result = prunefx.prune(model, x, PlanConfig(ratio=0.4, scope="sensitivity"), calibration=[x * 2, x - 1],
                           sensitivity_cache=None, refit=False)  # without re-fit: 3 forwards a fraction
    assert result.verified.ok
    ties = [gids for gids, _ in result.graph.ties]
    assert ties and all(len(t) == 2 for t in ties)
    widths = {gp.group: gp.after for gp in result.plan.groups}
    assert sum(result.graph.groups[g].channels - n for g, n in widths.items()) >= 0.4 * sum(
        result.graph.groups[g].channels for g in widths)
    for t in ties:  # measured together, each half carrying half the measured damage; kept equally wide
        assert len({widths[g] for g in t}) == 1
        curves = [result.sensitivity.get(g) for g in t]
        assert curves[0].tied == tuple(t) and curves[0].damage == curves[1].damage
        assert curves[0].forwards + curves[1].forwards == 3 * 3  # 3 fractions x (2 batches + 1 compensation pass)


def test_a_latency_target_is_planned_on_the_latency_model(three, tmp_path):
    from prunefx.metrics import Deployment
    from prunefx.metrics.latency_table import LatencyTable
    from prunefx.plan.latency import LatencyModel

    model, _, dg, gids = three

    def steps4(cases):  # a conv costs ceil(in / 4) * ceil(out / 4) ms: widths 5..8 cost as much as 8
        return {sig: math.ceil(c.layer.in_channels / 4) * math.ceil(c.layer.out_channels / 4)
                if isinstance(c.layer, nn.Conv2d) else 0.0 for sig, c in cases.items()}

    table = LatencyTable(Deployment(threads=1, batch=1), tmp_path, timer=steps4)
    lat = LatencyModel(model, dg, table, base_ms=12.0, config=PlanConfig(latency=1.0))
    assert lat.predict({}) == pytest.approx(12.0)  # three branches of 2 + 2 ms
    scores = prunefx.score(model, dg, "bn_scale")
    curves = _linear_curves(dg, gids, (1.0, 5.0, 25.0))
    plan = make_plan(dg, scores, PlanConfig(latency=0.7, scope="sensitivity"), latency=lat, sensitivity=curves)
    # 8.4 ms needs two branches at width <= 4 (2 ms saved each): the two least sensitive, at the fast edge 4
    assert [{gp.group: gp.after for gp in plan.groups}[g] for g in gids] == [4, 4, 8]
    assert plan.estimate["latency_ms_planned"] == pytest.approx(8.0)


def test_cost_change_recounts_exactly_what_a_full_count_would():
    model = randomize_bn(Patterns()).eval()
    x = torch.randn(1, 3, 16, 16)
    dg = prunefx.analyze(model, x)
    cost = CostModel(model, dg, (x,))
    rng = np.random.default_rng(0)
    keep = {g.id: rng.random(g.channels) < 0.7 for g in dg.prunable}
    coupled = cost.coupled()
    for g in dg.prunable:
        moved = {g.id: rng.random(g.channels) < 0.4}
        for what, count in (("macs", cost.macs), ("params", cost.params)):
            assert cost.change(keep, moved, what) == pytest.approx(count({**keep, **moved}) - count(keep), rel=1e-9,
                                                                   abs=1e-6)
        assert g.id in coupled[g.id]
