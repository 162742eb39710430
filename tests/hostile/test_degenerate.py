"""Degenerate library input (a model holding NaN/inf, a config of the wrong kind): one line, before any work."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch import nn

import prunefx
from prunefx.analysis.finite import check_finite
from prunefx.errors import PrunefxError
from prunefx.plan import PlanError

analysis = importlib.import_module("prunefx.analysis")  # the module: prunefx.analyze is its function


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()


@pytest.fixture
def no_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """Capturing the model is the first work: a refusal must come before it."""

    def capture(*args, **kwargs):
        raise AssertionError("the model was captured before the bad input was refused")

    monkeypatch.setattr(analysis, "capture_graph", capture)


NON_FINITE = {
    "NaN weight": ("0.weight", (0, 0, 0, 0), math.nan, r"Sequential parameter '0\.weight' holds NaN \(1 of 108 "),
    "inf statistic": ("1.running_var", (2,), math.inf, r"Sequential buffer '1\.running_var' holds inf \(1 of 4 "),
    "-inf bias": ("3.bias", (1,), -math.inf, r"parameter '3\.bias' holds inf"),
}


@pytest.mark.parametrize("entry", ["prune", "analyze"])
@pytest.mark.parametrize("case", NON_FINITE)
def test_a_model_holding_nan_or_inf_is_refused_naming_the_tensor(entry: str, case: str, no_capture: None) -> None:
    name, index, value, message = NON_FINITE[case]
    model = _tiny()
    with torch.no_grad():
        dict([*model.named_parameters(), *model.named_buffers()])[name][index] = value
    with pytest.raises(PrunefxError, match=message) as raised:
        getattr(prunefx, entry)(model, torch.randn(1, 3, 8, 8))
    line = str(raised.value)
    assert "\n" not in line and "load weights saved before training diverged, or re-initialise that tensor" in line


def test_nan_and_inf_in_one_tensor_are_both_named(no_capture: None) -> None:
    model = _tiny()
    with torch.no_grad():
        model[0].weight[0, 0, 0, :2] = torch.tensor([math.nan, math.inf])
    with pytest.raises(PrunefxError, match=r"'0\.weight' holds NaN and inf \(2 of 108 values\)"):
        prunefx.prune(model, torch.randn(1, 3, 8, 8))


CONFIGS = {
    "a misspelt key": ({"flop": 0.5}, r"unknown key in config: 'flop' \(did you mean 'flops'\?\); known keys: .*ratio"),
    "a value out of range": ({"flops": 2}, r"config: flops must be in \(0, 1\]"),
    "a value of the wrong type": ({"ratio": "half"}, r"config\.ratio must be a number or null, got 'half'"),
    "a string": ("flops=0.5", r"config must be a prunefx\.PlanConfig or a mapping of its fields, got str 'flops=0\.5'"),
    "a number": (0.5, r"config must be a prunefx\.PlanConfig or a mapping of its fields, got float 0\.5; write e\.g\."),
}


@pytest.mark.parametrize("case", CONFIGS)
def test_a_config_that_is_no_plan_config_is_refused(case: str, no_capture: None) -> None:
    config, message = CONFIGS[case]
    with pytest.raises(PlanError, match=message):
        prunefx.prune(_tiny(), torch.randn(1, 3, 8, 8), config)
    with pytest.raises(PlanError, match=message):
        prunefx.prune(_tiny(), torch.randn(1, 3, 8, 8), config=config)


def test_an_inf_mask_buffer_is_not_refused() -> None:
    """A causal mask filled with -inf (openai-whisper's decoder registers one) is data, not a diverged weight."""

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 4)
            self.register_buffer("mask", torch.full((3, 3), -math.inf).triu(1))

        def forward(self, x):
            return self.b(torch.relu(self.a(x))) + (x @ x.transpose(1, 2) + self.mask).softmax(-1) @ x

    check_finite(Masked())
    with torch.no_grad():
        model = Masked()
        model.mask[0, 0] = math.nan
    with pytest.raises(PrunefxError, match=r"buffer 'mask' holds NaN \(1 of 9 values\)"):
        check_finite(model)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.complex64])
def test_a_bad_value_is_found_in_every_floating_dtype_among_others(dtype: torch.dtype) -> None:
    """The one-read scan batches tensors by dtype: a bad value in a tensor of another dtype than the rest is found,
    and a value near the dtype's largest (where a sum would overflow) is not taken for inf."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4).to(dtype))
    with torch.no_grad():
        model[1].weight[0, 0] = torch.finfo(model[1].weight.real.dtype).max
    check_finite(model)
    with torch.no_grad():
        model[1].weight[2, 3] = math.nan
    with pytest.raises(PrunefxError, match=r"parameter '1\.weight' holds NaN \(1 of 32 values\)"):
        check_finite(model)
