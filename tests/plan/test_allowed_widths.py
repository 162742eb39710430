"""PlanConfig.allowed_widths: a group keeps the smallest accepted count at or above the plan's, else its full width."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunefx
from prunefx.plan import PlanError


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()


def _kept(config: prunefx.PlanConfig) -> dict[int, int]:
    model, x = _model(), torch.randn(1, 3, 4, 4)
    dg = prunefx.analyze(model, (x,))
    plan = prunefx.make_plan(dg, prunefx.score(model, dg, "l1"), config)
    return {dg.groups[gp.group].modules("out")[0]: gp.after for gp in plan.groups}


def test_counts_round_up_to_an_accepted_one_and_only_where_the_pattern_matches() -> None:
    base = prunefx.PlanConfig(ratio=0.7, scope="local")  # 8 -> 3 in both groups
    assert _kept(base) == {"0": 3, "2": 3}
    assert _kept(prunefx.PlanConfig(ratio=0.7, scope="local", allowed_widths=(("0", (2, 4, 8)),))) == {"0": 4, "2": 3}


def test_no_accepted_count_at_or_above_keeps_the_full_width() -> None:
    kept = _kept(prunefx.PlanConfig(ratio=0.7, scope="local", allowed_widths=(("2", (1, 2)),)))
    assert kept == {"0": 3, "2": 8}


def test_a_global_plan_with_even_counts_only_equals_round_to_2() -> None:
    # the same constraint said two ways: the planner's bisection sees the same counts
    x = torch.randn(1, 3, 4, 4)
    even = prunefx.PlanConfig(params=0.6, allowed_widths=(("*", (2, 4, 6, 8)),))
    rounded = prunefx.PlanConfig(params=0.6, round_to=2)
    plans = [prunefx.prune(_model(), x, c, criterion="l1").plan for c in (even, rounded)]
    assert [gp.keep for gp in plans[0].groups] == [gp.keep for gp in plans[1].groups]
    assert {gp.after for gp in plans[0].groups} <= {2, 4, 6, 8}


@pytest.mark.parametrize("bad", [(), (0, 2), (2.5,), (True,)])
def test_counts_must_be_positive_integers(bad) -> None:
    with pytest.raises(PlanError, match=r"allowed_widths(\[0\]\[1\]\[0\] must be an integer| for .0. must be)"):
        prunefx.PlanConfig(allowed_widths=(("0", bad),))


def test_the_sensitivity_allocation_steps_only_between_accepted_widths() -> None:
    x = torch.randn(4, 3, 4, 4)
    config = prunefx.PlanConfig(params=0.6, scope="sensitivity", allowed_widths=(("*", (2, 4, 8)),))
    result = prunefx.prune(_model(), x, config, criterion="l1", calibration=[x])
    assert result.verified.ok
    assert {gp.after for gp in result.plan.groups} <= {2, 4, 8}
