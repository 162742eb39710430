"""The torch.export front end: what the captured graph looks like, when "auto" picks it, what it reports."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import prunefx
from prunefx.capture import VALUE_KEY, export_graph
from prunefx.errors import TraceFailure


class Branchy(nn.Module):
    """A type check through torch.is_tensor on an activation and a grad-mode block: fx cannot trace it (torch's own
    check sees a Proxy, not a Tensor, so the module becomes a leaf), export can (its fake tensors are tensors)."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 3)
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x, flag: bool = True):
        h = self.a(x)
        if not torch.is_tensor(h):  # input validation as libraries write it
            raise TypeError(f"expected a tensor, got {type(h).__name__}")
        with torch.no_grad():
            s = self.scale * 2.0
        if h.shape[-1] > 4 and flag:
            h = h * s
        return self.c(torch.relu(self.b(h)))


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Branchy()

    def forward(self, x):
        return self.inner(x)


def test_export_graph_takes_the_example_inputs_and_carries_values_and_module_names():
    model = Branchy()
    gm = export_graph(model, (torch.randn(2, 4),), {"flag": True})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == 1  # flag=True was baked in
    assert all(isinstance(n.meta.get(VALUE_KEY), torch.Tensor) and n.meta[VALUE_KEY].device.type == "meta"
               for n in gm.graph.nodes if n.op not in ("output",) and "assert" not in str(n.target))  # fmt: skip
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    assert {"a.weight", "b.weight", "c.bias", "scale"} <= targets
    assert gm.get_parameter("a.weight") is model.a.weight  # the user's own tensors
    assert not any("wrap_with_set_grad_enabled" in str(n.target) for n in gm.graph.nodes)  # inlined
    stacks = [n.meta.get("nn_module_stack") for n in gm.graph.nodes if n.op == "call_function"]
    assert any(s and next(reversed(s.values()))[0] == "b" for s in stacks)
    out = gm(torch.ones(2, 4))
    assert torch.allclose(out[0], model(torch.ones(2, 4)))


def test_auto_capture_switches_to_export_when_fx_would_hide_parameters():
    model = Outer()
    x = torch.randn(2, 4)
    fx_dg = prunefx.analyze(model, x, capture="fx")
    assert fx_dg.auto_leaves and not fx_dg.prunable  # the whole inner module is an opaque leaf
    dg = prunefx.analyze(model, x)
    assert dg.capture == "export" and dg.shape_pass == "export" and not dg.auto_leaves
    (g,) = dg.groups_of("inner.b")
    assert g.prunable and {m.name for m in g.members if m.kind.value == "module"} == {"inner.b", "inner.c"}
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5), criterion="l2")
    assert result.graph.capture == "export" and result.plan.pruned
    assert result.verified.ok and result.verified.exact, result.verified.message


def test_models_on_the_meta_device_analyse_without_allocating():
    with torch.device("meta"):
        model = Outer()
    dg = prunefx.analyze(model, torch.randn(2, 4, device="meta"), capture="export")
    assert len(dg.prunable) == 2  # a's 8 (with the buffer and the scaled branch) and b's 8 channels
    assert all(p.device.type == "meta" for p in model.parameters())


def test_an_op_without_a_rule_freezes_what_it_touches_and_is_reported():
    class Spectral(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

        def forward(self, x):
            return self.b(torch.fft.fft(self.a(x)).real)

    dg = prunefx.analyze(Spectral(), torch.randn(2, 4), capture="export")
    assert any("fft" in d for d in dg.unknown_ops.values())
    (g,) = dg.groups_of("a")
    assert not g.prunable and any("no rule for" in r and "fft" in r for r in g.reasons)


def test_a_model_export_cannot_capture_is_one_clear_error():
    class DataDependent(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # a branch on tensor values: export cannot decide it
                return x * 2
            return x

    with pytest.raises(TraceFailure, match="torch.export cannot capture DataDependent"):
        export_graph(DataDependent(), (torch.randn(5),))
    with pytest.raises(prunefx.PrunefxError, match="capture must be one of"):
        prunefx.analyze(nn.Linear(2, 2), torch.randn(1, 2), capture="jit")
