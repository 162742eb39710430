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
from prunefx.plan.latency import LatencyModel, calibrated_ask, meet_latency, width_grid

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


def _fake_plan(fraction: float, floor: float = 0.0, step: float = 0.0) -> PruningPlan:
    """A plan predicted at ``fraction`` of 100 ms (never under ``floor``; rounded down to ``step``, as widths are)."""
    predicted = max(floor, math.floor(fraction / step) * step if step else fraction)
    estimate = {"latency_ms_before": 100.0, "latency_ms_planned": 100.0 * predicted}
    return PruningPlan("m", "f", ((1,),), "c", {"latency": fraction}, (), (), estimate)


def _affine(slope: float, noise: str | None = None):
    """A fake backend: measured = 1 - slope * (1 - predicted), exact at the base (1, 1), as real timings are."""

    def measure(plan):
        return 1.0 - slope * (1.0 - plan.estimate["latency_ms_planned"] / 100.0), noise

    return measure


@pytest.mark.parametrize(
    "slope,goal,floor,side",
    [
        (1.39, 0.5, 0.54, "faster"),  # MobileNetV2 torch b1 as measured: the table over-predicts, its floor 0.54
        (1.39, 0.75, 0.0, "faster"),
        (0.45, 0.75, 0.0, "slower"),  # ResNet-50 ONNX Runtime b1 as measured: fused ops, the table under-predicts
        (0.6, 0.5, 0.0, "slower"),
    ],
)
def test_meet_latency_calibrates_an_affine_miss_from_either_side(slope, goal, floor, side) -> None:
    plan, outcome = meet_latency(lambda f: _fake_plan(f, floor, step=0.013), _affine(slope), goal)
    first = outcome.rounds[0]
    assert (first.measured < goal * 0.95) if side == "faster" else (first.measured > goal * 1.05)  # a real miss
    assert outcome.met and 2 <= len(outcome.rounds) <= 3  # bounded: the map is read off base + one plan
    r = outcome.rounds[outcome.chosen]
    assert abs(r.measured / goal - 1) <= 0.05 and abs(outcome.miss) <= 0.05
    assert r.measured == pytest.approx(1 - slope * (1 - r.predicted))
    assert plan.estimate["latency_plans"] == len(outcome.rounds)
    assert plan.estimate["latency_ratio_planned"] == r.predicted
    assert plan.estimate["latency_ratio_measured"] == r.measured
    assert plan.target["latency"] == goal and plan.target["latency_planned_for"] == r.asked
    assert f"after {len(outcome.rounds)} plan(s)" in outcome.note and "within 5%" in outcome.note
    assert ("faster" if outcome.miss < 0 else "slower") in outcome.note


def test_calibrated_ask_interpolates_brackets_and_extrapolates() -> None:
    base = (1.0, 1.0)
    assert calibrated_ask([base, (0.5, 0.3)], 0.5) == pytest.approx(1 - 0.5 * 0.5 / 0.7)  # along base -> point
    assert calibrated_ask([base, (0.6, 0.4), (0.8, 0.7), (0.7, 0.45)], 0.5) == pytest.approx(0.7 + 0.05 * 0.1 / 0.25)
    assert calibrated_ask([base, (0.5, 0.3), (0.6, 0.2)], 0.1) is None  # falling: no map to follow
    assert calibrated_ask([base, (0.6, 0.45), (0.5, 0.55)], 0.5) == pytest.approx(0.55)  # a crossed bracket halves


def test_meet_latency_out_of_reach_stops_at_the_models_floor_and_says_so() -> None:
    asked = []

    def plan_for(f):
        asked.append(f)
        return _fake_plan(f, floor=0.54)

    plan, outcome = meet_latency(plan_for, _affine(1.39), 0.3)
    assert len(outcome.rounds) == 1 and len(asked) == 2  # the second ask gave the same (floor) plan: not re-timed
    assert not outcome.met and outcome.rounds[0].measured == pytest.approx(1 - 1.39 * 0.46)
    assert "missing 5%" in outcome.note and "slower" in outcome.note


def test_meet_latency_keeps_the_fastest_when_nothing_reaches_the_goal() -> None:
    def measure(plan):  # nothing below 0.8 of the base, whatever the plan
        return max(0.8, plan.estimate["latency_ms_planned"] / 100.0), None

    plan, outcome = meet_latency(_fake_plan, measure, 0.5)
    assert not outcome.met and 2 <= len(outcome.rounds) <= 4
    assert outcome.rounds[outcome.chosen].measured == min(r.measured for r in outcome.rounds)
    assert "missing 5%" in outcome.note


def test_meet_latency_corrects_against_a_noisy_timing_and_says_so() -> None:
    """ONNX Runtime's timings carried a p90 flag in every cell and the loop stopped after one plan: it re-plans."""
    noise = "noisy: p90 2.34x the median"
    plan, outcome = meet_latency(_fake_plan, _affine(0.6, noise), 0.5)
    assert len(outcome.rounds) >= 2 and outcome.met
    assert all(r.noise == noise for r in outcome.rounds)
    assert f"noisy ({noise})" in outcome.note


def test_meet_latency_one_bad_timing_moves_the_plan_at_most_2x() -> None:
    seen = []

    def measure(plan):  # a freak first timing the noise flags did not catch, then the truth
        seen.append(plan.target["latency"])
        return (0.01 if len(seen) == 1 else 0.5), None

    _, outcome = meet_latency(_fake_plan, measure, 0.5)
    assert 0.5 < seen[1] <= 1.0  # moved towards the base, by at most 2x
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


def _fake_layer_ms(cases):
    """A table timer: 1 ms per 10 M MACs of the layer timed alone (nothing for a layer without MACs)."""
    out = {}
    for sig, case in cases.items():
        layer, shape = case.layer, case.input_shape
        if isinstance(layer, nn.Conv2d):
            out[sig] = layer.weight.numel() * math.prod(shape[2:]) / math.prod(layer.stride) * 1e-7
        elif isinstance(layer, nn.Linear):
            out[sig] = layer.weight.numel() * math.prod(shape[:-1]) * 1e-7
        else:
            out[sig] = 0.0
    return out


@pytest.mark.parametrize(
    "backend,const_ms,slope,noise",
    [
        ("torch", 0.1, 2.0, None),  # the table over-predicts (a big constant it holds fixed): over-pruning
        ("onnxruntime", 0.3, 0.6, "noisy: p90 2.01x the median"),  # under-predicts, flagged as every ORT cell was
    ],
)
def test_prune_re_plans_a_latency_target_on_a_fake_backend(monkeypatch, tmp_path, backend, const_ms, slope,
                                                           noise) -> None:  # fmt: skip
    """prunefx.prune on a fake deployment whose end-to-end time is ``const_ms + slope x`` the MACs' share of the
    table (so the measured fraction is an affine function of the table's prediction, but not the identity):
    the first plan misses, the loop re-plans on the measured points and lands within 5%, and says so."""
    from types import SimpleNamespace

    from prunefx.metrics import measure
    from prunefx.metrics.latency_table import LatencyTable as Table
    from prunefx.plan import measured
    from prunefx.zoo import bn_cnn

    model = randomize_bn(bn_cnn(10, 3)).eval()
    x = torch.randn(1, 3, 16, 16)
    timed = []

    def e2e_ms(m):
        return const_ms + slope * measure(m, x).macs * 1e-7

    def fake_compare(models, inputs, dep, **_):
        timed.append(dep.backend)
        return {n: SimpleNamespace(median_ms=e2e_ms(m), noise=noise) for n, m in models.items()}

    monkeypatch.setattr(measured, "compare_latency", fake_compare)
    monkeypatch.setattr(measured, "LatencyTable", lambda dep, cache: Table(dep, cache, timer=_fake_layer_ms))
    base_ms = e2e_ms(model)
    result = prunefx.prune(model, x, PlanConfig(latency=0.5), deployment=Deployment(backend=backend, threads=1),
                           latency_cache=tmp_path)  # fmt: skip
    out = result.latency
    assert set(timed) == {backend}
    first, chosen = out.rounds[0], out.rounds[out.chosen]
    assert first.measured < 0.5 * 0.95 if slope > 1 else first.measured > 0.5 * 1.05  # a real miss, either side
    assert 2 <= len(out.rounds) <= 4 and out.met and abs(chosen.measured / 0.5 - 1) <= 0.05
    assert all(r.noise == noise for r in out.rounds)
    assert result.plan.estimate["latency_plans"] == len(out.rounds)
    assert result.plan.estimate["latency_ratio_measured"] == chosen.measured
    assert result.plan.estimate["latency_ratio_planned"] == chosen.predicted
    assert e2e_ms(result.model) / base_ms == pytest.approx(chosen.measured)  # the model returned is the one measured
    assert result.verified is not None and result.verified.ok
