"""Submodule names that are not Python identifiers (``a"b``, ``e\\f``, ``if``) are legal in torch; the traced graph's
code quotes them, so the model traces, prunes and verifies under its own names."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from _nets import randomize_bn
from torch import nn

import prunefx
from prunefx.errors import TraceFailure
from prunefx.plan import PlanConfig
from prunefx.verify import verify

NAMES = ('a"b', "c'd", "e\\f", "if")


def _model() -> nn.Sequential:
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    model.add_module(NAMES[0], nn.Conv2d(8, 6, 1))
    model.add_module(NAMES[1], nn.BatchNorm2d(6))
    model.add_module(NAMES[2], nn.Conv2d(6, 6, 1))
    model.add_module(NAMES[3], nn.Conv2d(6, 4, 1))
    return randomize_bn(model).eval()


@pytest.mark.parametrize("capture", ["fx", "export"])
def test_modules_named_with_quotes_backslashes_or_keywords_trace_and_prune(capture):
    model, x = _model(), torch.randn(1, 3, 8, 8)
    dg = prunefx.analyze(model, x, capture=capture)
    for gm in (dg.gm, copy.deepcopy(dg.gm)):  # a copy regenerates its code
        out = gm(x)
        torch.testing.assert_close(out[0] if isinstance(out, tuple) else out, model(x))  # export: flat outputs
    assert dg.group_of(NAMES[0]) is not None and dg.group_of(NAMES[0]).prunable  # the graph names the user's modules

    original = copy.deepcopy(model)
    result = prunefx.prune(model, x, PlanConfig(ratio=0.5), criterion="l1", capture=capture)
    assert result.verified.ok, result.verified.message
    assert getattr(model, NAMES[0]).out_channels < 6 and getattr(model, NAMES[1]).num_features < 6
    again = verify(original, result.model, result.plan, x, capture=capture)
    assert again.ok, again.message


def test_without_the_quoting_the_failure_names_the_module_and_the_fix(monkeypatch):
    trace_module = importlib.import_module("prunefx.capture.trace")  # the package's `trace` is the function
    monkeypatch.setattr(trace_module, "quote_targets", lambda graph: None)  # torch.fx's own code generation
    with pytest.raises(TraceFailure, match=r"""submodule name\(s\) 'a"b'.*a Python identifier"""):
        prunefx.trace(_model(), (torch.randn(1, 3, 8, 8),))
