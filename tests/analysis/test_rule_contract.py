"""The op-rule and criterion contracts, checked over every registered rule and every criterion.

Rules: each takes one positional ``Ctx`` (the protocol of :mod:`prunefx.analysis.rules._context`, which the engine's
concrete ``Ctx`` implements); where a canonical call on a small tensor exists (one or two 4-D/2-D tensors, a module
built with 4 channels), analysing a one-op model labels every tensor node with one entry per dim.
Criteria: scoring a Conv-BN-ReLU-Conv model gives every scored group one finite score per channel.
"""

from __future__ import annotations

import inspect
import typing
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import prunefx
import prunefx.integrations.swin  # these three register their rules
import prunefx.integrations.torchvision
import prunefx.transform.mha
from prunefx.analysis import engine
from prunefx.analysis.rules import RULES, Ctx, OpRegistry
from prunefx.analysis.rules._context import EngineView
from prunefx.capture.values import VALUE_KEY
from prunefx.errors import RuleOverrideWarning
from prunefx.importance import CRITERIA, score

_ITEMS = RULES.items()


def _key_id(target: object) -> str:
    name = target if isinstance(target, str) else getattr(target, "__qualname__", None) or str(target)
    return f"{getattr(target, '__module__', '') or ''}.{name}".lstrip(".")


_IDS = [_key_id(t) for t, _ in _ITEMS]


# ---- rule signatures ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target,rule", _ITEMS, ids=_IDS)
def test_rule_takes_one_ctx(target: object, rule: object) -> None:
    assert callable(rule)
    params = list(inspect.signature(rule).parameters.values())
    required = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert len(required) == 1, f"{rule} must take exactly one required positional parameter (ctx), got {params}"
    hints = typing.get_type_hints(rule)
    assert hints.get(required[0].name) is Ctx, f"{rule}: parameter {required[0].name!r} is not annotated as Ctx"


def test_engine_ctx_implements_the_protocol() -> None:
    """Every attribute the protocol promises rules exists on the engine's concrete Ctx (or its engine)."""
    members = {n for n in dir(Ctx) if not n.startswith("_")} | set(Ctx.__annotations__)
    instance_attrs = {"engine", "state", "node", "module", "args", "kwargs"}  # set in Ctx.__init__
    missing = sorted(m for m in members if not hasattr(engine.Ctx, m) and m not in instance_attrs)
    assert not missing, f"engine.Ctx lacks {missing}"
    eng = engine.Engine(torch.fx.symbolic_trace(nn.Identity()))
    assert all(hasattr(eng, m) for m in EngineView.__annotations__), "the engine lacks what rules read"


# ---- canonical calls ---------------------------------------------------------------------------------------------
_X4 = torch.randn(2, 4, 6, 6)
_X2 = torch.randn(3, 4)


_EXTRA: tuple[tuple[int, ...], ...] = ((), (1,), (-1,), (1, 2), (0, 1), (2,), (0, 2, 1, 3), (1, 0))


class _Op(nn.Module):
    """``target(*tensors, *extra)``; a method name is called on the first tensor; ``as_list`` passes the tensors as
    one list (``torch.cat([x, x], 1)``)."""

    def __init__(self, target: object, extra: tuple[int, ...], as_list: bool) -> None:
        super().__init__()
        self.target, self.extra, self.as_list = target, extra, as_list

    def forward(self, *xs: torch.Tensor) -> object:
        if isinstance(self.target, str):
            return getattr(xs[0], self.target)(*xs[1:], *self.extra)
        return self.target(*((list(xs),) if self.as_list else xs), *self.extra)


class _Wrap(nn.Module):
    """A module as a submodule (the root's own forward is traced through, a child's is a call_module)."""

    def __init__(self, m: nn.Module) -> None:
        super().__init__()
        self.m = m

    def forward(self, *xs: torch.Tensor) -> object:
        return self.m(*xs)


def _candidates(target: object) -> list[tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    """One-op models calling ``target`` the simplest ways: on one tensor, then two, 4-D then 2-D, then with ints."""
    inputs = [(_X4,), (_X2,), (_X4, _X4), (_X2, _X2)]
    if isinstance(target, type):
        out = []
        for args in ((4,), (4, 4), (), (4, 4, 3), (2, 4)):
            try:
                module = target(*args)
            except Exception:  # noqa: BLE001 - any failure means: not a canonical call
                continue
            out += [(_Wrap(module), x) for x in inputs]
        return out
    return [(_Op(target, extra, as_list), x) for extra in _EXTRA for as_list in (False, True) for x in inputs]


def _canonical(target: object) -> tuple[nn.Module, tuple[torch.Tensor, ...]] | None:
    for module, xs in _candidates(target):
        module.eval()
        try:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = module(*(x.clone() for x in xs))
        except Exception:  # noqa: BLE001 - any failure means: not a canonical call
            continue
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            return module, xs
    return None


def _called(node: torch.fx.Node, target: object) -> bool:
    if node.op == "call_module":
        return isinstance(target, type) and type(node.graph.owning_module.get_submodule(node.target)) is target
    if node.op == "call_method":
        return node.target == target
    if node.op == "call_function":
        return node.target is target or getattr(node.target, "overloadpacket", None) is target
    return False


_CALLABLE = [(t, r) for t, r in _ITEMS if not isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))]


@pytest.mark.parametrize("target,rule", _CALLABLE, ids=[_key_id(t) for t, _ in _CALLABLE])
def test_canonical_call_labels_every_dim(target: object, rule: object) -> None:
    if target in (torch.tensor, torch.as_tensor):  # given a traced tensor, torch.tensor crashes fx's tracer natively
        pytest.skip("its rule is for data that is not a traced tensor (a KV cache's torch.tensor([]))")
    found = _canonical(target)
    if found is None:
        pytest.skip("no canonical call on one or two small float tensors")
    module, xs = found
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dg = prunefx.analyze(module, xs, capture="fx")
        except prunefx.errors.PrunefxError as e:
            pytest.skip(f"the one-op model is not captured: {e}")
    for n in dg.gm.graph.nodes:
        value, lab = n.meta.get(VALUE_KEY), dg.node_labels.get(n.name)
        if isinstance(value, torch.Tensor) and n.op != "output":
            assert lab is not None and lab.ndim == value.dim(), f"node {n.name}: label {lab} for shape {value.shape}"
    if not any(_called(n, target) for n in dg.gm.graph.nodes):
        pytest.skip("the call is not its own node (traced into other ops, checked above): its rule did not run")


# ---- criteria ----------------------------------------------------------------------------------------------------
class _ConvBnReluConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.relu(self.bn(self.c1(x))))


@pytest.mark.parametrize("name", sorted(CRITERIA))
def test_criterion_scores_every_channel_finitely(name: str) -> None:
    torch.manual_seed(0)
    model = _ConvBnReluConv().eval()
    with torch.no_grad():  # non-trivial BatchNorm scales, so bn_scale has something to read
        model.bn.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 8, 8)
    dg = prunefx.analyze(model, x)
    assert dg.prunable, "the model has a prunable group"
    calib = [(x, torch.randn(2, 4, 8, 8))]
    scores = score(model, dg, name, fallback=None, calibration=calib, loss_fn=nn.functional.mse_loss)
    assert set(scores.values) == {g.id for g in dg.prunable}, scores.used
    for g in dg.prunable:
        v = scores.values[g.id]
        assert v.shape == (g.channels,) and np.isfinite(v).all(), (name, g.id, v)


# ---- register_rule -----------------------------------------------------------------------------------------------
def _fresh_registry() -> OpRegistry:
    reg = OpRegistry()
    reg.register(torch.relu, "relu")(lambda ctx: None)
    reg.mark_builtin()
    return reg


def test_replacing_a_builtin_rule_warns() -> None:
    reg = _fresh_registry()
    new = lambda ctx: None  # noqa: E731
    with pytest.warns(RuleOverrideWarning, match="replace=True"):
        reg.register(torch.relu)(new)
    assert reg.for_function(torch.relu) is new


def test_replace_true_or_a_new_target_does_not_warn() -> None:
    reg = _fresh_registry()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reg.register(torch.relu, "relu", replace=True)(lambda ctx: None)
        reg.register(torch.sigmoid)(lambda ctx: None)
        reg.register(torch.sigmoid)(lambda ctx: None)  # not a built-in: a later registration wins silently
        assert reg.is_builtin(torch.relu) and not reg.is_builtin(torch.sigmoid)


def test_global_registry_marks_prunefx_rules_builtin() -> None:
    assert RULES.is_builtin(torch.cat) and RULES.is_builtin(nn.Conv2d)
    old = RULES.for_function(torch.cat)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RULES.register(torch.cat)(old)  # the same rule again: silent
    try:
        with pytest.warns(RuleOverrideWarning):
            RULES.register(torch.cat)(lambda ctx: None)
    finally:
        RULES.register(torch.cat, replace=True)(old)
    assert RULES.for_function(torch.cat) is old
