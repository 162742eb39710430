"""Sizes that depend on the data (``x[x > 0]``, ``torch.nonzero``) and rules that crash: the channels they touch
freeze with the reason, the analysis never dies, the rest prunes exactly."""

from __future__ import annotations

import pytest
import torch
from _graph_checks import the_group
from torch import nn

import prunefx
from prunefx.analysis.rules import Ctx


class Branches(nn.Module):
    """a -> b beside c -> d; the data-dependent op reads a's output only."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 4, 1)
        self.c, self.d = nn.Conv2d(3, 6, 1), nn.Conv2d(6, 4, 1)

    def forward(self, x):
        y = self.a(x)
        out = self.b(y) + self.d(torch.relu(self.c(x)))
        if self.how == "mask":
            return out + y[y > 0].mean()  # as many elements as are positive
        fired = torch.nonzero(y[0, :, 0, 0] > 0).squeeze(1)  # which channels fire at one pixel
        return out + y.index_select(1, fired).mean()


# the reason each capture gives for a's channels: the op that reads them
REASONS = {("mask", "fx"): "advanced indexing selects along a channel dim",
           ("mask", "export"): "advanced (tensor) indexing",
           ("nonzero", "fx"): "no rule for torch._VariableFunctionsClass.nonzero",
           ("nonzero", "export"): "a size that depends on the data"}


@pytest.mark.parametrize("capture", ["fx", "export"])
@pytest.mark.parametrize("how", ["mask", "nonzero"])
def test_data_dependent_sizes_freeze_what_they_read_with_the_reason(how: str, capture: str) -> None:
    # export's nonzero crashed analyze (TypeError: unhashable SymInt in the probe's cache key); export's x[x > 0]
    # gave a 3-D label to a 1-D tensor (a 4-D mask was taken to index one dim)
    torch.manual_seed(0)
    dg = prunefx.analyze(Branches(how).eval(), (torch.randn(2, 3, 5, 5),), capture=capture)
    a = the_group(dg, "a")
    assert not a.prunable and any(REASONS[how, capture] in r for r in a.reasons), a.reasons
    if capture == "fx":  # export captures only a part of the mask model: the branch beside it is frozen there
        assert the_group(dg, "c").prunable and the_group(dg, "c").exact


@pytest.mark.parametrize("how", ["mask", "nonzero"])
def test_a_model_with_data_dependent_sizes_prunes_the_rest_exactly(how: str) -> None:
    torch.manual_seed(0)
    model, x = Branches(how).eval(), torch.randn(2, 3, 5, 5)
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.a.out_channels == 8 and result.model.c.out_channels == result.model.d.in_channels == 3


class Doubler(nn.Module):
    """Element-wise, with a rule that crashes (a bug in a user's rule)."""

    def forward(self, x):
        return 2 * x


@prunefx.register_rule(Doubler)
def _crashing_rule(ctx: Ctx) -> None:
    raise IndexError("tuple index out of range")


prunefx.register_leaf(Doubler)  # one node, so its rule runs


class WithDoubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.twice, self.b = nn.Conv2d(3, 8, 1), Doubler(), nn.Conv2d(8, 4, 1)
        self.c, self.d = nn.Conv2d(3, 6, 1), nn.Conv2d(6, 4, 1)

    def forward(self, x):
        return self.b(self.twice(self.a(x))) + self.d(torch.relu(self.c(x)))


def test_a_rule_that_crashes_freezes_what_its_node_reads_naming_the_rule_and_the_error() -> None:
    dg = prunefx.analyze(WithDoubler().eval(), (torch.randn(2, 3, 5, 5),))
    a = the_group(dg, "a")
    assert not a.prunable
    assert any("rule for" in r and "Doubler" in r and "IndexError: tuple index out of range" in r
               for r in a.reasons), a.reasons
    assert "twice" in dg.unknown_ops and the_group(dg, "c").prunable
    result = prunefx.prune(WithDoubler().eval(), torch.randn(2, 3, 5, 5), prunefx.PlanConfig(ratio=0.5),
                           criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.a.out_channels == 8 and result.model.c.out_channels == 3
