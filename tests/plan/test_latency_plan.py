"""The latency planner against hand-made step-function latency tables (known optimal widths), the latency model's
arithmetic, round_to="auto", the measure-and-replan loop with injected measurements, and prunefx.prune end to end
with a latency target (structure only: unit tests never compare real timings with thresholds)."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from _nets import Patterns, randomize_bn
from torch import nn

import prunefx
from prunefx.metrics import Deployment
from prunefx.metrics.latency_table import LatencyTable
from prunefx.plan import CostModel, PlanConfig, PlanError, PruningPlan, make_plan
from prunefx.plan.latency import LatencyModel, meet_latency, width_grid

DEP = Deployment(threads=1, batch=1)


class Chain(nn.Module):
    """conv1 (3 -> 32) -> BN -> conv2 (32 -> 32) -> BN -> conv3 (1x1, 32 -> 10): two prunable groups of 32."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32)
        self.c2, self.b2 = nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32)
        self.c3 = nn.Conv2d(32, 10, 1)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        return self.c3(x).mean((2, 3))


def steps16(cases):
    """A kernel whose time steps every 16 channels: ceil(in / 16) * ceil(out / 16) ms per conv, 0 for anything else."""
    out = {}
    for sig, case in cases.items():
        layer = case.layer
        out[sig] = math.ceil(layer.in_channels / 16) * math.ceil(layer.out_channels / 16) if isinstance(
            layer, nn.Conv2d) else 0.0
    return out


def chain(g1=(0.1, 0.2), g2=(0.8, 1.0)):
    """Chain with BatchNorm gammas spread in the given ranges (bn_scale importance) and its analysis."""
    model = randomize_bn(Chain()).eval()
    with torch.no_grad():
        model.b1.weight.copy_(torch.linspace(*g1, 32))
        model.b2.weight.copy_(torch.linspace(*g2, 32))
    x = torch.randn(1, 3, 8, 8)
    dg = prunefx.analyze(model, x)
    return model, x, dg


def groups_of(dg):
    """(group of c1's output, group of c2's output)."""
    return dg.group_of("c1").id, dg.group_of("c2").id


def latency_model(model, dg, tmp_path, timer=steps16, **cfg) -> LatencyModel:
    table = LatencyTable(DEP, tmp_path, timer=timer)
    return LatencyModel(model, dg, table, base_ms=8.0, config=PlanConfig(latency=1.0, **cfg))


def test_width_grid() -> None:
    assert width_grid(32, 4).tolist() == [8, 16, 24, 32]
    assert width_grid(2048, 205).tolist() == list(range(256, 2049, 128))  # quantum 128: at most 16 candidates
    assert width_grid(12, 2).tolist() == [4, 8, 12] and width_grid(6, 1).tolist() == [1, 2, 3, 4, 5, 6]
    assert width_grid(64, 7, round_to=24).tolist() == [24, 48, 64]  # multiples of lcm(8, 24), and the full width


def test_model_is_exact_on_a_separable_step_table(tmp_path) -> None:
    model, _, dg = chain()
    lat = latency_model(model, dg, tmp_path)
    a, b = groups_of(dg)
    assert {layer.name for layer in lat.layers} == {"c1", "c2", "c3"}  # the BatchNorms fold away
    assert lat.layers_full_ms == 8.0 and lat.scale == 1.0
    for wa in (8, 16, 24, 32):
        for wb in (8, 16, 24, 32):
            expected = math.ceil(wa / 16) + math.ceil(wa / 16) * math.ceil(wb / 16) + math.ceil(wb / 16)
            assert lat.predict({a: wa, b: wb}) == pytest.approx(expected)


@pytest.mark.parametrize(
    "goal,widths",
    [
        (0.5, (16, 16)),  # only both at the fast edge of the first step fit 4 ms (3 ms); 24 costs as much as 32
        (0.7, (16, 32)),  # 5 ms: one group must drop a step; importance says c1's (small gammas)
        (0.9, (16, 32)),  # nothing lies between 5 and 8 ms: the cheapest jump that reaches the goal
    ],
)
def test_planner_honours_a_synthetic_step_table_exactly(tmp_path, goal, widths) -> None:
    model, _, dg = chain()
    lat = latency_model(model, dg, tmp_path)
    scores = prunefx.score(model, dg, "bn_scale").values
    plan = make_plan(dg, scores, PlanConfig(latency=goal), latency=lat)
    a, b = groups_of(dg)
    got = {g.group: g.after for g in plan.groups}
    assert (got[a], got[b]) == widths
    assert plan.estimate["latency_ms_planned"] <= goal * 8.0 and plan.estimate["latency_ms_before"] == 8.0
    for g in plan.groups:  # importance decides which channels: the largest gammas stay
        gammas = (model.b1 if g.group == a else model.b2).weight.detach()
        assert sorted(g.keep) == sorted(torch.argsort(gammas, descending=True)[: g.after].tolist())
        assert g.why.startswith(f"latency: width {g.after} of 32")


def test_planner_follows_importance_between_groups(tmp_path) -> None:
    """Swap which group is important: the group that drops a step swaps too."""
    model, _, dg = chain(g1=(0.8, 1.0), g2=(0.1, 0.2))
    lat = latency_model(model, dg, tmp_path)
    plan = make_plan(dg, prunefx.score(model, dg, "bn_scale").values, PlanConfig(latency=0.7), latency=lat)
    a, b = groups_of(dg)
    got = {g.group: g.after for g in plan.groups}
    assert (got[a], got[b]) == (32, 16)


def test_round_to_auto_moves_to_the_fast_edge_of_each_step(tmp_path) -> None:
    model, x, dg = chain()
    lat = latency_model(model, dg, tmp_path, round_to="auto")
    a, _ = groups_of(dg)
    assert [lat.fast_width(a, n) for n in (3, 9, 16, 17, 25, 32)] == [16, 16, 16, 32, 32, 32]
    scores = prunefx.score(model, dg, "bn_scale").values
    cost = CostModel(model, dg, x)
    auto = make_plan(dg, scores, PlanConfig(flops=0.6, round_to="auto"), cost=cost, latency=lat)
    assert all(g.after in (16, 32) for g in auto.groups)  # never inside a step (8, 24 cost as much as 16, 32)


def test_latency_target_without_a_model_is_an_error() -> None:
    model, _, dg = chain()
    scores = prunefx.score(model, dg, "bn_scale").values
    for cfg in (PlanConfig(latency=0.5), PlanConfig(flops=0.5, round_to="auto")):
        with pytest.raises(PlanError, match="need measured latencies"):
            make_plan(dg, scores, cfg, cost=CostModel(model, dg, torch.randn(1, 3, 8, 8)))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"latency": 0.0}, r"latency must be in \(0, 1\]"),
        ({"latency": 0.5, "flops": 0.5}, "exactly one target"),
        ({"latency": 0.5, "round_to": "fast"}, "round_to must be an integer or one of 'auto'"),
    ],
)
def test_plan_config_validates_latency(kwargs, match) -> None:
    with pytest.raises(PlanError, match=match):
        PlanConfig(**kwargs)


def test_patterns_model_predicts_base_at_full_width_and_less_when_narrower(tmp_path) -> None:
    """Depthwise, grouped, chunked and concatenated layers: the model is consistent on a monotone table."""
    model = randomize_bn(Patterns()).eval()
    dg = prunefx.analyze(model, torch.randn(1, 3, 16, 16))

    def monotone(cases):
        return {s: float(np.prod(c.input_shape[1:])) * 1e-4 + sum(p.numel() for p in c.layer.parameters()) * 1e-5
                for s, c in cases.items()}

    # a base below the layers' sum: isolated layers are scaled down to it, so the layers are the whole latency
    lat = LatencyModel(model, dg, LatencyTable(DEP, tmp_path, timer=monotone), base_ms=1.0)
    assert lat.scale == pytest.approx(1.0 / lat.layers_full_ms) and lat.scale < 1
    assert lat.predict({}) == pytest.approx(1.0)
    assert any(layer.axis_out is None and layer.name == "dw.0" for layer in lat.layers)  # depthwise: one axis
    for g, grid in lat.grids.items():
        if len(grid) > 1:  # (a 1-channel group has nothing to prune)
            assert lat.predict({g: int(grid[0])}) < 1.0
    plan = make_plan(dg, prunefx.score(model, dg, "bn_scale").values, PlanConfig(latency=0.8), latency=lat)
    assert plan.estimate["latency_ms_planned"] <= 0.8
    prunefx.apply_plan(model, dg, plan)  # the planned widths are ones the rewrite accepts (ties, grouped convs)


def _fake_plan(fraction: float) -> PruningPlan:
    estimate = {"latency_ms_before": 100.0, "latency_ms_planned": 100.0 * fraction}
    return PruningPlan("m", "f", ((1,),), "c", {"latency": fraction}, (), (), estimate)


def test_meet_latency_replans_until_the_measurement_is_within_5_percent() -> None:
    measured = []

    def measure(plan):  # the model over-predicts: the real latency is 0.7 x predicted + 0.1
        measured.append(0.7 * plan.estimate["latency_ms_planned"] / 100.0 + 0.1)
        return measured[-1], None

    plan, outcome = meet_latency(_fake_plan, measure, 0.5)
    assert outcome.met and len(outcome.rounds) == 2 and outcome.chosen == 1
    assert outcome.rounds[0].asked == 0.5 and outcome.rounds[0].measured == pytest.approx(0.45)
    assert outcome.rounds[1].asked == pytest.approx(0.5 * 0.5 / 0.45)
    assert abs(outcome.rounds[1].measured / 0.5 - 1) <= 0.05
    assert plan.target["latency"] == 0.5 and plan.target["latency_planned_for"] == pytest.approx(0.5 * 0.5 / 0.45)
    assert plan.estimate["latency_ratio_measured"] == measured[1]
    assert "re-planned 1 time(s)" in outcome.note


def test_meet_latency_out_of_reach_says_so_and_keeps_the_fastest() -> None:
    def measure(plan):  # nothing below 0.8 of the base, whatever the plan: the goal is out of reach
        return max(0.8, plan.estimate["latency_ms_planned"] / 100.0), None

    plan, outcome = meet_latency(_fake_plan, measure, 0.5)
    assert not outcome.met and 2 <= len(outcome.rounds) <= 4
    assert outcome.rounds[outcome.chosen].measured == min(r.measured for r in outcome.rounds)
    assert "missing 5%" in outcome.note


def test_meet_latency_does_not_chase_a_noisy_timing() -> None:
    def measure(plan):
        return 0.9, "noisy: load 5.1 on 2 cores"

    plan, outcome = meet_latency(_fake_plan, measure, 0.5)
    assert len(outcome.rounds) == 1 and outcome.chosen == 0 and not outcome.met
    assert plan.target["latency_planned_for"] == 0.5  # the model's own plan for the goal
    assert "noisy: load 5.1 on 2 cores: not re-planned on it" in outcome.note


def test_meet_latency_one_noisy_timing_moves_the_plan_at_most_2x() -> None:
    seen = []

    def measure(plan):  # a freak first timing the noise flags did not catch, then the truth
        seen.append(plan.target["latency"])
        return (0.01 if len(seen) == 1 else 0.5), None

    _, outcome = meet_latency(_fake_plan, measure, 0.5)
    assert seen[1] == pytest.approx(1.0)  # 0.5 * 2, clamped to the base: not 0.5 * 50
    assert outcome.met


def test_prune_with_a_latency_target_end_to_end(tmp_path) -> None:
    """Real timings (no threshold on them): the loop ran, the plan says what it was made for, the table is cached."""
    torch.set_num_threads(1)
    model, x, _ = chain()
    result = prunefx.prune(model, x, PlanConfig(latency=0.6), deployment=Deployment(threads=1),
                           latency_cache=tmp_path)  # fmt: skip
    out = result.latency
    assert out is not None and 1 <= len(out.rounds) <= 4 and 0 <= out.chosen < len(out.rounds)
    assert result.plan.target["latency"] == 0.6 and "torch eager" in result.plan.target["deployment"]
    assert result.plan.estimate["latency_ratio_measured"] == out.rounds[out.chosen].measured
    assert result.verified is not None and result.verified.ok
    (table,) = tmp_path.glob("torch-cpu-b1-float32-t1-*.json")
    assert table.name == result.plan.target["latency_table"]
    again = LatencyTable(replace(Deployment(threads=1), batch=1), tmp_path)
    assert len(again.entries) > 0
