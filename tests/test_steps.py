"""Iterative pruning: prune(steps=k) meets the original target, each cut verified, the cuts composed into one plan."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _nets import Patterns, cbr, randomize_bn
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import prunefx
from prunefx.pipeline import ConfigError, PruneSpec
from prunefx.plan import CostModel, PlanConfig, PlanError, make_plan
from prunefx.steps import _check_matches
from prunefx.transform.rewrite import apply_plan

TESTS = Path(__file__).resolve().parent


class SmallCNN(nn.Module):
    """stem -> conv -> conv with a residual add -> conv -> pool -> linear: three prunable groups (16, 32, 48)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.c1, self.c2, self.c3 = cbr(3, 16), cbr(16, 32), cbr(32, 32), cbr(32, 48)
        self.fc = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c1(self.stem(x))
        y = self.c3(y + self.c2(y))  # c1 and c2 share their output channels through the add
        return self.fc(y.mean((2, 3)))


def small() -> nn.Module:
    torch.manual_seed(0)
    return randomize_bn(SmallCNN()).eval()


X = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def flops(model: nn.Module) -> int:
    """FLOPs by torch's own counter, independent of prunefx's cost model."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(X)
    return counter.get_total_flops()


def params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def widths(model: SmallCNN) -> int:
    """The prunable channels, counted from the layers: stem out, c1/c2 out (one group), c3 out."""
    return model.stem[0].out_channels + model.c1[0].out_channels + model.c3[0].out_channels


def one_channel(model: nn.Module, kind: str) -> float:
    """The largest share of the model's MACs / params that one channel of one group carries.

    Each cut's planner moves the global threshold one channel at a time and keeps the plan closest to its goal,
    so a cut lands within one channel's share of its goal; in the last cut that share is measured on a narrower
    model, whose channels each cost no more of the original than here. So a k-cut result is off the goal by at
    most this much more than the one-shot plan, which has the same granularity."""
    dg = prunefx.analyze(model, X)
    cost = CostModel(model, dg, X)
    total, f = (cost.macs_total, cost.macs) if kind == "flops" else (cost.params_total, cost.params)
    worst = 0.0
    for g in dg.prunable:
        mask = np.ones(g.channels, dtype=bool)
        mask[0] = False
        worst = max(worst, (total - f({g.id: mask})) / total)
    return worst


def achieved(kind: str, original: nn.Module, pruned: nn.Module) -> float:
    if kind == "flops":
        return flops(pruned) / flops(original)
    if kind == "params":
        return params(pruned) / params(original)
    return 1.0 - widths(pruned) / widths(original)  # ratio: channels removed over the original's prunable ones


@pytest.mark.parametrize("kind,goal", [("flops", 0.5), ("params", 0.5), ("ratio", 0.4)])
def test_three_cuts_meet_the_target_as_exactly_as_one(kind: str, goal: float) -> None:
    original = small()
    dg = prunefx.analyze(original, X)
    assert sum(g.channels for g in dg.prunable) == widths(original) == 96  # the ratio's definition, by the layers
    errors = {}
    for k in (1, 3):
        result = prunefx.prune(copy.deepcopy(original), X, {kind: goal}, criterion="l1", steps=k)
        errors[k] = abs(achieved(kind, original, result.model) - goal)
        if k == 3:
            assert len(result.steps) == 3 and all(s.verified is not None and s.verified.ok for s in result.steps)
            assert result.verified is not None and result.verified.ok
            assert result.plan.target[kind] == goal and result.plan.target["steps"] == 3
        else:
            assert result.steps == ()
    slack = 1.0 / 96 if kind == "ratio" else one_channel(original, kind)
    assert errors[3] <= errors[1] + slack, (errors, slack)


def test_the_schedule_is_geometric_in_the_original() -> None:
    """After cut i of 3 the model keeps 0.5 ** (i/3) of the original's MACs, each within one channel's share."""
    original = small()
    result = prunefx.prune(copy.deepcopy(original), X, PlanConfig(flops=0.5), criterion="l1", steps=3)
    base = result.plan.estimate["macs_before"]
    slack = one_channel(original, "flops")
    for i, cut in enumerate(result.steps, 1):
        assert abs(cut.plan.estimate["macs_after"] / base - 0.5 ** (i / 3)) <= slack, i


def test_local_ratio_cuts_each_group_per_cut() -> None:
    """scope local: per cut every group loses 1 - (1 - r) ** (1/k); k cuts keep at least (1 - r) of each group,
    and at most k - 1 channels more than that (one floor per cut)."""
    original = small()
    result = prunefx.prune(copy.deepcopy(original), X, PlanConfig(ratio=0.5, scope="local"), criterion="l1", steps=2)
    assert result.steps[0].plan.target["ratio"] == pytest.approx(1 - 0.5 ** 0.5, rel=1e-12)
    for gp in result.plan.groups:
        assert gp.before * 0.5 <= gp.after <= gp.before * 0.5 + (2 - 1), gp


@pytest.mark.parametrize("make,cfg", [(small, PlanConfig(flops=0.5)), (lambda: randomize_bn(Patterns()).eval(),
                                                                         PlanConfig(ratio=0.5))])
def test_composed_plan_rebuilds_the_stepped_model(make, cfg: PlanConfig) -> None:
    """The plan of the whole cut, applied to a fresh original, gives the same architecture; with weights only
    sliced (l1, no bias compensation) the same weights too."""
    for compensate in (False, True):
        original = make()
        result = prunefx.prune(copy.deepcopy(original), X, cfg, criterion="l1", bias_compensation=compensate,
                               steps=3)
        assert result.plan.pruned
        fresh = copy.deepcopy(original)
        rebuilt = apply_plan(fresh, prunefx.analyze(fresh, X), result.plan)
        want, got = result.model.state_dict(), rebuilt.state_dict()
        assert {n: t.shape for n, t in got.items()} == {n: t.shape for n, t in want.items()}
        if not compensate:
            assert all(torch.equal(got[n], want[n]) for n in want)
            assert result.verified is not None and result.verified.ok  # the whole cut against the masked original


def test_each_cut_is_refitted() -> None:
    """With refit on, every cut re-fits the layers it narrowed (on the model that cut started from)."""
    original = small()
    calibration = [torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(s)) for s in range(2)]
    result = prunefx.prune(copy.deepcopy(original), X, PlanConfig(flops=0.5), criterion="l1", steps=2, refit=True,
                           calibration=calibration)
    assert all(s.refit is not None and s.verified is not None and s.verified.ok for s in result.steps)
    assert abs(achieved("flops", original, result.model) - 0.5) <= one_channel(original, "flops")


@pytest.mark.parametrize("steps", [0, -1, 2.5, True, "3"])
def test_bad_steps_are_refused(steps) -> None:
    with pytest.raises(PlanError, match="steps must be an integer >= 1"):
        prunefx.prune(small(), X, PlanConfig(flops=0.5), steps=steps)


def test_latency_target_in_steps_is_refused_untouched() -> None:
    model = small()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(PlanError, match=r"latency target.*steps=1"):
        prunefx.prune(model, X, PlanConfig(latency=0.5), steps=2)
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())


def test_mismatched_analyses_do_not_compose() -> None:
    """A re-analysis whose widths are not the previous plan's kept counts is refused, not composed."""
    model = small()
    dg = prunefx.analyze(model, X)
    plan = make_plan(dg, {g.id: np.arange(g.channels, dtype=float) for g in dg.prunable}, PlanConfig(ratio=0.5))
    assert plan.pruned
    with pytest.raises(PlanError, match="cannot be described as one plan"):
        _check_matches(dg, plan, prunefx.analyze(model, X), 2)  # the model was never cut: widths unchanged


def test_stepped_model_saves_and_loads(tmp_path: Path) -> None:
    model = small()
    result = prunefx.prune(model, X, PlanConfig(flops=0.5), steps=2)  # bn_scale, bias compensation on
    path = prunefx.save(result.model, result.plan, tmp_path / "pruned.pt")
    loaded = prunefx.load(path, SmallCNN).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(X), result.model(X), rtol=1e-5, atol=1e-6)


def test_pipeline_key_parses_and_is_checked() -> None:
    spec = PruneSpec.parse({"steps": 3, "target": {"flops": 0.5}}, train_keys=())
    assert spec.steps == 3 and PruneSpec.parse(spec.to_dict(), train_keys=()) == spec
    assert PruneSpec.parse({}, train_keys=()).steps == 1
    with pytest.raises(ConfigError, match="prune.steps must be >= 1"):
        PruneSpec.parse({"steps": 0}, train_keys=())


def test_cli_steps_reach_prune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from prunefx.cli.main import app

    monkeypatch.syspath_prepend(str(TESTS))
    run = tmp_path / "run"
    tiny = ["_factories:tiny_cnn", "--imgsz", "32"]
    result = CliRunner().invoke(app, ["prune", *tiny, "--flops", "0.5", "--steps", "2", "--no-latency",
                                      "--out", str(run)])
    assert result.exit_code == 0, result.output
    plan = json.loads((run / "plan.json").read_text())
    assert plan["target"]["steps"] == 2 and plan["target"]["flops"] == 0.5
    refused = CliRunner().invoke(app, ["prune", *tiny, "--steps", "0", "--out", str(tmp_path / "r0")])
    assert refused.exit_code != 0 and not (tmp_path / "r0").exists()
