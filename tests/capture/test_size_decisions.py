"""Python control flow on a channel count is baked into the trace: the groups whose pruning would change it are
frozen at analysis, with the model's source line, and the sizes read harmlessly leave their groups prunable."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from _nets import randomize_bn
from torch import nn

import prunefx
from prunefx.capture import capture_info
from prunefx.plan import PlanConfig
from prunefx.verify import verify


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())


def _where(cls: type, code: str) -> str:
    """'file:line: code' of the line of ``cls``'s forward that contains ``code``."""
    lines, start = inspect.getsourcelines(cls.forward)
    line = next(start + i for i, text in enumerate(lines) if code in text)
    return f"{inspect.getsourcefile(cls)}:{line}"


class NasCell(nn.Module):
    """A NASNet cell: the previous cell's output is projected only when its width differs."""

    def __init__(self, cin: int, filters: int) -> None:
        super().__init__()
        self.filters = filters
        self.dim_reduce = nn.Sequential(nn.Conv2d(cin, filters, 1), nn.BatchNorm2d(filters))
        self.conv = _block(filters, filters)

    def forward(self, x, prev):
        if prev is None:
            prev = x
        elif prev.size(1) != self.filters:
            prev = self.dim_reduce(prev)
        return self.conv(x) + prev


class NasNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.pre = _block(3, 16), _block(16, 16)
        self.cell = NasCell(16, 16)
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        s = self.stem(x)
        return self.head(self.cell(self.pre(s), s))


def test_a_nasnet_cell_branch_on_a_channel_count_freezes_its_group_with_the_source_line():
    model, x = randomize_bn(NasNet()).eval(), torch.randn(2, 3, 8, 8)
    dg = prunefx.analyze(model, x)
    decided = dg.group_of("stem.0")
    assert not decided.prunable
    where = _where(NasCell, "elif prev.size(1) != self.filters:")
    assert any(where in r and "`elif prev.size(1) != self.filters:`" in r for r in decided.reasons), decided.reasons
    assert dg.group_of("pre.0").prunable  # the groups no decision reads stay prunable

    original = copy.deepcopy(model)
    result = prunefx.prune(model, x, PlanConfig(ratio=0.5), criterion="l1", check=False)
    assert model.stem[0].out_channels == 16 and model.pre[0].out_channels < 16
    again = verify(original, result.model, result.plan, x)  # unchecked, and still the masked original
    assert again.ok, again.message


class Decisions(nn.Module):
    """One pattern per block: the four that read a channel count into Python, then four harmless size reads."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = _block(3, 16), _block(16, 16), _block(16, 16), _block(16, 16)
        self.e, self.f, self.g, self.h = _block(16, 16), _block(16, 8), _block(8, 8), _block(8, 8)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        a = self.a(x)
        if a.shape[1] == 16:
            a = a * 2
        b = self.b(a)
        assert b.size(1) % 8 == 0
        c = self.c(b)
        total = 0
        for i in range(c.size(1)):
            total = total + i
        d = self.d(c) + total
        d = d / float(d.size(1))  # a Python float: a constant of the graph
        e = self.e(d)
        n, ch = e.shape[:2]
        e = e.reshape(n, ch, -1).reshape_as(e)  # a size as a reshape argument: the rules follow it
        f = self.f(e)
        if f.numel() > 0:  # true at any width pruning leaves
            f = f + 1
        g = self.g(f) + f
        if g.size(1) != f.size(1):  # one group: pruning keeps them equal
            g = g * 0
        return self.head(self.h(g))


FROZEN = {
    "a.0": "if a.shape[1] == 16:",
    "b.0": "assert b.size(1) % 8 == 0",
    "c.0": "for i in range(c.size(1)):",
    "d.0": "d = d / float(d.size(1))",
}


@pytest.fixture(scope="module")
def decisions_dg():
    return prunefx.analyze(Decisions().eval(), torch.randn(1, 3, 8, 8))


@pytest.mark.parametrize("module", FROZEN)
def test_a_condition_an_assert_a_range_and_a_float_on_a_channel_count_freeze_its_group(decisions_dg, module):
    group = decisions_dg.group_of(module)
    where, code = _where(Decisions, FROZEN[module]), FROZEN[module]
    assert not group.prunable
    assert any(where in r and code in r for r in group.reasons), group.reasons


def test_every_size_decision_is_recorded_and_those_no_pruning_changes_leave_their_groups_prunable(decisions_dg):
    gm = prunefx.trace(Decisions(), (torch.randn(1, 3, 8, 8),))
    uses = {d["code"].split("  #")[0]: (d["use"], d["value"]) for d in capture_info(gm).decisions}
    assert uses["if a.shape[1] == 16:"] == ("condition", True)
    assert uses["for i in range(c.size(1)):"] == ("index", 16)
    assert uses["d = d / float(d.size(1))"] == ("float", 16)
    assert uses["if f.numel() > 0:"] == ("condition", True)
    assert uses["if g.size(1) != f.size(1):"] == ("condition", False)
    nodes = {n.name for n in gm.graph.nodes}
    assert all(d["node"] in nodes for d in capture_info(gm).decisions)
    for module in ("e.0", "f.0", "g.0", "h.0"):  # a reshape argument; decisions true at any width pruning leaves
        group = decisions_dg.group_of(module)
        assert group.prunable, (module, group.reasons)


class Unbatched(nn.Module):
    """len() of a tensor whose first dim is a channel dim: the channel count becomes a constant of the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.body = _block(3, 8), _block(8, 8)

    def forward(self, x):
        feat = self.body(self.stem(x)).squeeze(0)
        return feat.sum(0) / len(feat)


def test_len_of_a_tensor_along_a_channel_dim_freezes_its_group():
    dg = prunefx.analyze(Unbatched().eval(), torch.randn(1, 3, 6, 6))
    group = dg.group_of("body.0")
    where = _where(Unbatched, "return feat.sum(0) / len(feat)")
    assert not group.prunable and any(where in r and "len()" in r for r in group.reasons), group.reasons
    assert dg.group_of("stem.0").prunable


class ByRank(nn.Module):
    """A function chosen from a dict keyed by ``x.ndim`` (einops' Rearrange layer looks its recipe up this way)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.head = _block(3, 8), nn.Linear(8, 4)
        self.pool = {4: lambda t: t.mean((2, 3)), 3: lambda t: t.mean(2)}

    def forward(self, x):
        return self.head(self.pool[self.stem(x).ndim](self.stem(x)))


def test_ndim_of_a_traced_tensor_is_a_python_int_from_the_example_inputs():
    gm = prunefx.trace(ByRank(), (torch.randn(2, 3, 6, 6),), auto_leaf=False)  # was: KeyError on a Proxy key
    where = _where(ByRank, "self.pool[self.stem(x).ndim]")
    assert capture_info(gm).specialised[where] == 4
    assert not capture_info(gm).decisions  # pruning changes sizes, never a tensor's number of dims
    dg = prunefx.analyze(ByRank().eval(), torch.randn(2, 3, 6, 6))
    assert not dg.unknown_ops and dg.group_of("stem.0").prunable
