"""A target the plan cannot reach is a warning naming the value reached and what froze the rest, never silent."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import prunefx
from prunefx.errors import TargetMissedWarning


class _MostlyFrozen(nn.Module):
    """A small prunable conv pair beside a large layer between the model's input and an output (frozen)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 64, 3, padding=1)
        self.head = nn.Linear(64, 10)
        self.side = nn.Linear(3, 20000)

    def forward(self, x):
        return self.head(self.b(torch.relu(self.a(x))).mean((2, 3))), self.side(x.mean((2, 3)))


def test_an_unreachable_params_target_warns_with_the_value_reached_and_the_frozen_share() -> None:
    model, x = _MostlyFrozen().eval(), torch.randn(1, 3, 8, 8)
    with pytest.warns(TargetMissedWarning, match=r"keeps 0\.\d+ of the parameters, not the 0\.300 asked.*frozen"):
        result = prunefx.prune(model, x, prunefx.PlanConfig(params=0.3))
    assert result.plan.estimate["params_after"] / result.plan.estimate["params_before"] > 0.3 * 1.01


def test_a_reachable_target_does_not_warn() -> None:
    model, x = _MostlyFrozen().eval(), torch.randn(1, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TargetMissedWarning)
        prunefx.prune(model, x, prunefx.PlanConfig(params=0.97))
