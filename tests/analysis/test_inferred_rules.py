"""Ops with no rule: their channel map is inferred by probing them, only clean structures are accepted, and the
oracle still has the last word (prunefx.analysis.inferred)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx
from torch import nn

import prunefx
from prunefx.analysis import inferred
from prunefx.view.graph_data import graph_data

W16 = torch.linspace(0.5, 1.5, 16)


def swish_like(x):  # element-wise
    return x * torch.sigmoid(1.3 * x)


def gated_halves(x):  # GLU-like: the two halves along dim 1 make one output channel
    a, b = x.chunk(2, 1)
    return a * torch.tanh(b)


def reversed_channels(x):  # a permutation
    return x.flip(1)


def channel_sum(x):  # a reduction over the channels
    return x.sum(1, keepdim=True)


def dense_mix(x):  # a dense matmul over the channels
    return torch.einsum("bchw,dc->bdhw", x, torch.ones(x.shape[1], x.shape[1]) / x.shape[1] + torch.eye(x.shape[1]))


def fixed_scale(x):  # per-channel constants of a fixed length: removing a channel breaks it
    return x * W16[None, :, None, None]


for _f in (swish_like, gated_halves, reversed_channels, channel_sum, dense_mix, fixed_scale):
    torch.fx.wrap(_f.__name__)


class Net(nn.Module):
    """conv -> op -> conv, with the op called by its (wrapped) global name."""

    def __init__(self, op: str, mid: int = 16) -> None:
        super().__init__()
        self.op = op
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(mid, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.c2(globals()[self.op](self.c1(x))).mean((2, 3)))


def _net(op: str, mid: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return Net(op, mid).eval()


X = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _group(dg, name):
    return next(g for g in dg.groups if any(m.name == name for m in g.members))


@pytest.mark.parametrize(("op", "mid", "kind"), [
    ("swish_like", 16, "identity"), ("gated_halves", 8, "split"), ("reversed_channels", 16, "permutation"),
])
def test_a_clean_map_is_inferred_and_the_pruned_model_equals_the_masked_original(op, mid, kind) -> None:
    model = _net(op, mid)
    dg = prunefx.analyze(model, X)
    assert dg.inferred_ops == {op: f"{__name__}.{op}: input 0 dim 1 {kind} -> dim 1"} and not dg.unknown_ops
    assert _group(dg, "c1").prunable
    assert "inferred rule (probed, checked by the oracle)" in dg.summary()
    assert graph_data(dg)["inferred_ops"] == dg.inferred_ops  # the HTML view lists them
    if kind == "split":  # both halves of each output channel go together: c1 keeps an even count, paired
        assert _group(dg, "c1").channels == 8 and any(m.name == "c2" for m in _group(dg, "c1").members)
    original = copy.deepcopy(model)
    result = prunefx.prune(model, X, {"ratio": 0.5}, criterion="l1")
    assert result.verified.ok and model.c1.out_channels < 16
    again = prunefx.verify(original, model, result.plan, X)
    assert again.ok and again.errors


def test_a_reduction_over_the_channels_consumes_them() -> None:
    model = _net("channel_sum", 1)
    dg = prunefx.analyze(model, X)
    assert dg.inferred_ops == {"channel_sum": f"{__name__}.channel_sum: input 0 dim 1 reduced"}
    assert _group(dg, "c1").prunable
    result = prunefx.prune(model, X, {"ratio": 0.5}, criterion="l1")
    assert result.verified.ok and model.c1.out_channels == 8


@pytest.mark.parametrize(("op", "finding"), [
    ("dense_mix", "mixes positions"), ("fixed_scale", "fails on fewer channels"),
])
def test_a_mixing_or_size_bound_op_freezes_with_the_probes_finding(op, finding) -> None:
    dg = prunefx.analyze(_net(op), X)
    g = _group(dg, "c1")
    assert not g.prunable and any("no rule for" in r and finding in r for r in g.reasons), g.reasons
    assert op in dg.unknown_ops and not dg.inferred_ops


def test_a_wrong_inference_is_caught_by_the_oracle(monkeypatch) -> None:
    """Forced: the removal test skipped, so fixed_scale (16 constants) is taken for element-wise."""
    monkeypatch.setattr(inferred, "_removal_test", lambda *a, **k: "")
    monkeypatch.setattr(inferred, "_CACHE", {})
    model = _net("fixed_scale")
    dg = prunefx.analyze(model, X)
    assert _group(dg, "c1").prunable and dg.inferred_ops  # the analysis believed it
    result = prunefx.prune(model, X, {"ratio": 0.5}, criterion="l1")
    assert result.verified.ok and model.c1.out_channels == 16  # the oracle froze the group the op reads
    assert any(g == _group(dg, "c1").id for g, _ in result.frozen_by_check)


def test_inferences_are_cached_per_op_and_shapes(monkeypatch) -> None:
    calls = []
    probe = inferred._probe
    monkeypatch.setattr(inferred, "_CACHE", {})
    monkeypatch.setattr(inferred, "_probe", lambda *a: calls.append(1) or probe(*a))
    prunefx.analyze(_net("swish_like"), X)
    prunefx.analyze(_net("swish_like"), X)
    assert len(calls) == 1
    prunefx.analyze(_net("swish_like"), torch.rand(1, 3, 12, 12))  # other shapes: probed again
    assert len(calls) == 2


def scaled_by_count(x, c):
    return x * (16.0 / c)  # the same as x at the captured width, not after a cut


torch.fx.wrap("scaled_by_count")


class CountedNet(Net):
    def forward(self, x):
        y = self.c1(x)
        return self.head(self.c2(scaled_by_count(y, y.shape[1])).mean((2, 3)))


def test_an_op_given_a_channel_count_is_not_probed() -> None:
    torch.manual_seed(0)
    dg = prunefx.analyze(CountedNet("swish_like").eval(), X)
    g = _group(dg, "c1")
    assert not g.prunable and any("no rule for" in r and "scaled_by_count" in r for r in g.reasons), g.reasons
    assert not dg.inferred_ops
