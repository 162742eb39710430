"""Constant-filled tensors of a torch.export capture (``aten.zeros`` / ``ones`` / ``full`` with literal sizes): a dim
that meets channels element-wise is those channels (its literal follows the kept count); a dim that meets none
(a batch dim, a mask over positions) belongs to no group."""

from __future__ import annotations

import torch
from torch import nn

import prunefx
from prunefx.transform.fixers import register_fixer


class Scan(nn.Module):
    """A recurrence from a zero state (a state-space scan's slow path), mixed over time by a uniform mask of ones."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.out = nn.Linear(16, 8)

    def forward(self, x):
        u = self.inp(x)
        state = torch.zeros(x.shape[0], u.shape[-1])
        outs = []
        for t in range(x.shape[1]):
            state = 0.5 * state + u[:, t]
            outs.append(state)
        mix = torch.ones(x.shape[1], x.shape[1]) / x.shape[1]
        return self.out(mix @ torch.stack(outs, 1))


# every size its forward uses is read from its input, so the literals export wrote follow the pruned widths
register_fixer(Scan, literals=True)(lambda m, widths: None)


def test_a_zero_state_follows_the_channels_it_is_added_to():
    model, x = Scan().eval(), torch.randn(2, 5, 8)
    dg = prunefx.analyze(model, x, capture="export")
    targets = [str(n.target) for n in dg.gm.graph.nodes if n.op == "call_function"]
    assert {"aten.zeros.default", "aten.ones.default"} <= set(targets)  # the ops under test are there
    assert not dg.unknown_ops
    (inner,) = dg.groups_of("inp")
    assert inner.prunable and inner.exact and inner.channels == 16
    members = {(str(m.kind), m.name, m.describe()) for m in inner.members}
    assert members == {
        ("module", "inp", "out[0:16]"), ("param", "inp.weight", "dim0[0:16]"), ("param", "inp.bias", "dim0[0:16]"),
        ("module", "out", "in[0:16]"), ("param", "out.weight", "dim1[0:16]"), ("const", "zeros", "args[0][1][0:16]"),
    }  # fmt: skip
    # the zero state's batch dim and the mask's position dims meet no channel: their literals are in no group
    consts = {(m.name, m.describe()) for g in dg.groups for m in g.members if str(m.kind) == "const"}
    assert consts == {("zeros", "args[0][1][0:16]")}
    assert [g.id for g in dg.groups if g.id != inner.id and g.prunable] == []  # the input and output stay
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5, round_to=1), criterion="l1", capture="export")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.inp.out_features == result.model.out.in_features == 8
    with torch.no_grad():
        assert result.model(torch.randn(3, 4, 8)).shape == (3, 4, 8)  # eager forward: sizes read from the input
