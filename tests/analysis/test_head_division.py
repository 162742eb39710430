"""``head_dim = width // self.heads``: whole heads (heads follows) or the same offsets per head (heads stays).

diffusers' attention processors, and many hand-written attentions, compute head_dim from a tensor's width and a head
count written in the code, then call ``scaled_dot_product_attention`` without a scale: the scale comes from
head_dim, so only whole heads can go and the head count must follow. With the scale given, head_dim may shrink
instead. Groups are asserted position by position; every prune is checked exact by the oracle.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunefx
from prunefx.analysis.roles import Kind
from prunefx.transform import register_fixer
from prunefx.transform.fixers import _FIXERS, _OWNS_LITERALS, LiteralCount

H, HD = 4, 8  # heads, head_dim
E = H * HD
X = torch.randn(2, 5, E)


class DividedAttention(nn.Module):
    """diffusers' AttnProcessor2_0 in small: head_dim read as ``key width // self.heads``."""

    def __init__(self, scaled: bool = False) -> None:
        super().__init__()
        self.heads, self.scaled = H, scaled
        self.to_q, self.to_k, self.to_v, self.to_out = (nn.Linear(E, E) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        head_dim = k.shape[-1] // self.heads
        q, k, v = (t.view(b, -1, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, scale=0.125 if self.scaled else None)
        o = o.transpose(1, 2).reshape(b, -1, self.heads * head_dim)
        return x + self.to_out(o)


def _positions(group, name: str, role: str) -> tuple[tuple[int, ...], ...]:
    (m,) = [m for m in group.members if m.kind is Kind.MODULE and m.name == name and str(m.role) == role]
    return tuple(tuple(sorted(p)) for p in m.positions)


def _inner(dg):
    (g,) = dg.groups_of("to_v", "out")
    for name, role in (("to_q", "out"), ("to_k", "out"), ("to_out", "in")):
        assert dg.groups_of(name, role) == [g], f"{name}.{role} is not in the group of to_v.out"
    return g


@pytest.fixture
def heads_fixer():
    """The fixer a library registers for such a module: the head count comes back under its traced value."""

    @register_fixer(DividedAttention, literals=True)
    def _fix(m, widths):
        m.heads = widths.get(LiteralCount(m.heads), m.heads)

    yield
    del _FIXERS[DividedAttention]
    _OWNS_LITERALS.discard(DividedAttention)


def test_default_scale_prunes_whole_heads_and_the_head_count_follows(heads_fixer):
    dg = prunefx.analyze(DividedAttention(), X)
    g = _inner(dg)
    whole = tuple(tuple(range(h * HD, (h + 1) * HD)) for h in range(H))
    assert g.prunable and g.channels == H
    for name, role in (("to_q", "out"), ("to_k", "out"), ("to_v", "out"), ("to_out", "in")):
        assert _positions(g, name, role) == whole
    # the divisor and the head count of every view are literals of the group: the module's fixer rewrites them
    assert any(m.kind is Kind.CONST for m in g.members)

    model = DividedAttention().eval()
    result = prunefx.prune(model, X, prunefx.PlanConfig(ratio=0.5, scope="local"), criterion="l2")
    assert any(gp.group == g.id and gp.after == H // 2 for gp in result.plan.pruned)
    assert result.model.heads == H // 2 and result.model.to_q.weight.shape == (E // 2, E)
    assert result.verified.ok and result.verified.exact, result.verified.message


def test_given_scale_prunes_the_same_offsets_in_every_head(heads_fixer):
    dg = prunefx.analyze(DividedAttention(scaled=True), X)
    g = _inner(dg)
    offsets = tuple(tuple(range(d, E, HD)) for d in range(HD))
    assert g.prunable and g.channels == HD
    for name, role in (("to_q", "out"), ("to_k", "out"), ("to_v", "out"), ("to_out", "in")):
        assert _positions(g, name, role) == offsets

    model = DividedAttention(scaled=True).eval()
    result = prunefx.prune(model, X, prunefx.PlanConfig(ratio=0.5, scope="local"), criterion="l2")
    assert any(gp.group == g.id and gp.after == HD // 2 for gp in result.plan.pruned)
    assert result.model.heads == H and result.model.to_q.weight.shape == (E // 2, E)
    assert result.verified.ok and result.verified.exact, result.verified.message


def test_whole_heads_without_a_fixer_need_the_graph_rewritten():
    """No fixer owns ``self.heads``: the plan skips the heads with the fix, and graph_rewrite prunes them."""
    model = DividedAttention().eval()
    dg = prunefx.analyze(model, X)
    g = _inner(dg)
    plan = prunefx.make_plan(dg, prunefx.score(model, dg, "l2").values, prunefx.PlanConfig(ratio=0.5, scope="local"))
    assert "graph_rewrite" in dict(plan.skipped)[g.id]
    result = prunefx.prune(copy.deepcopy(model), X, prunefx.PlanConfig(ratio=0.5, scope="local", graph_rewrite=True),
                           criterion="l2")  # fmt: skip
    assert any(gp.group == g.id and gp.after == H // 2 for gp in result.plan.pruned)
    assert result.verified.ok and result.verified.exact, result.verified.message


class OuterQuotient(nn.Module):
    """``x.view(b, y.shape[1] // 4, 4)``: the quotient is the outer piece, so its blocks are runs of 4 in y."""

    def __init__(self) -> None:
        super().__init__()
        self.x, self.y, self.head = nn.Linear(6, 12), nn.Linear(6, 12), nn.Linear(12, 3)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x, y = self.x(inp), self.y(inp)
        anchors = y.shape[-1] // 4
        z = x.view(x.shape[0], anchors, 4) * y.view(y.shape[0], anchors, 4)
        return self.head(z.flatten(1))


def test_an_outer_quotient_couples_whole_runs_of_the_divided_width():
    model, inp = OuterQuotient().eval(), torch.randn(2, 6)
    dg = prunefx.analyze(model, inp)
    (g,) = dg.groups_of("y", "out")
    runs = tuple(tuple(range(a * 4, a * 4 + 4)) for a in range(3))
    assert g.prunable and g.channels == 3 and dg.groups_of("x", "out") == [g] == dg.groups_of("head", "in")
    assert _positions(g, "y", "out") == runs == _positions(g, "x", "out")
    result = prunefx.prune(model, inp, prunefx.PlanConfig(ratio=0.34, scope="local"), criterion="l2")
    assert model.y.weight.shape == (8, 6)
    assert result.verified.ok and result.verified.exact, result.verified.message
