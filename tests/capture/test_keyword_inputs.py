"""Keyword example inputs (a mapping, or ``prunefx.Inputs``) through every stage: bound by the forward's signature,
the pruned model equals the masked original on the same call, and each stage counts the forward the user makes."""

from __future__ import annotations

import copy

import pytest
import torch
from _factories import TwoTower
from torch import nn

import prunefx
from prunefx.capture.inputs import Inputs, bind, positional
from prunefx.errors import PrunefxError
from prunefx.metrics import compare_latency
from prunefx.metrics.flops import measure
from prunefx.passes.fold_bn import fold_bn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return TwoTower().eval()


def _ids(n: int = 2) -> torch.Tensor:
    return torch.randint(0, 16, (n, 5), generator=torch.Generator().manual_seed(1))


def _pixels(n: int = 2) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(2))


def test_binding_fills_the_parameters_between_with_their_defaults() -> None:
    m, ids, px = _model(), _ids(), _pixels()
    assert positional(m, {"pixel_values": px})[:2] == (None, None)
    got = positional(m, Inputs(ids, pixel_values=px))
    assert got[0] is ids and got[1] is None and got[2] is px
    assert positional(m, (ids,)) == (ids,) and positional(m, ids) == (ids,)
    assert torch.equal(m(*positional(m, {"pixel_values": px, "input_ids": ids})), m(input_ids=ids, pixel_values=px))
    with pytest.raises(PrunefxError, match="'pixels' is not a parameter of TwoTower.forward"):
        positional(m, {"pixels": px})
    with pytest.raises(PrunefxError, match="already give"):
        bind(m, (ids,), {"input_ids": ids})
    assert repr(Inputs(torch.zeros(2, 3), mask=None)) == "Inputs(tensor(2x3, float32), mask=None)"


class _KeywordOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, *, scale):
        return self.fc(x) * scale


class _Needs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.fc(x + y)


def test_what_cannot_be_bound_by_position_is_refused_naming_why() -> None:
    with pytest.raises(PrunefxError, match="cannot be given by position .*keyword-only"):
        positional(_KeywordOnly(), Inputs(torch.rand(1, 4), scale=2.0))
    with pytest.raises(PrunefxError, match="needs 'x' .*no default"):
        positional(_Needs(), {"y": torch.rand(1, 4)})


@pytest.mark.parametrize("capture", ["fx", "export"])
@pytest.mark.parametrize("given", ["image", "both", "mixed"])
def test_prune_on_keyword_inputs_equals_the_masked_original(capture: str, given: str) -> None:
    ids, px = _ids(), _pixels()
    inputs = {"image": {"pixel_values": px}, "both": {"pixel_values": px, "input_ids": ids},
              "mixed": Inputs(ids, pixel_values=px)}[given]
    call = {"image": {"pixel_values": px}, "both": {"input_ids": ids, "pixel_values": px},
            "mixed": {"input_ids": ids, "pixel_values": px}}[given]
    model = _model()
    original = copy.deepcopy(model)
    dg = prunefx.analyze(original, inputs, capture=capture)
    assert sum(g.prunable for g in dg.groups) >= 1
    result = prunefx.prune(model, inputs, {"ratio": 0.5}, criterion="l1", capture=capture)
    assert result.verified.ok and result.verified.errors  # outputs were compared
    assert model.mlp[0].out_features < original.mlp[0].out_features  # something was cut
    # the independent check on the user's own call: prunefx.verify against the unpruned copy
    again = prunefx.verify(original, model, result.plan, inputs, capture=capture)
    assert again.ok and again.errors
    assert model(**call).shape == original(**call).shape


def test_every_stage_counts_the_call_the_user_makes(tmp_path) -> None:
    model, ids, px = _model(), _ids(), _pixels()
    by_name = {"input_ids": ids, "pixel_values": px}
    assert measure(model, by_name).macs == measure(model, (ids, None, px)).macs
    assert measure(model, {"input_ids": ids}).macs < measure(model, by_name).macs  # the image tower not run
    times = compare_latency({"m": model}, by_name, repeats=2, rounds=1, warmup=0)
    assert times["m"].median_ms > 0
    folded = fold_bn(model, by_name)
    assert torch.allclose(folded(ids, None, px), model(**by_name), atol=1e-6)


def test_calibration_batches_may_be_keyword_inputs() -> None:
    model, ids, px = _model(), _ids(64), _pixels(64)
    original = copy.deepcopy(model)
    batches = [{"input_ids": ids[i: i + 8], "pixel_values": px[i: i + 8]} for i in range(0, 64, 8)]
    result = prunefx.prune(model, batches[0], {"ratio": 0.5}, criterion="activation", calibration=batches,
                           refit=True, sensitivity_cache=None)
    assert result.verified.ok and result.refit is not None and result.refit.layers
    assert all(r.after <= r.before + 1e-6 for r in result.refit.layers)  # kept only where it helps
    sens = prunefx.prune(copy.deepcopy(original), batches[0], {"ratio": 0.5, "scope": "sensitivity"},
                         criterion="l1", calibration=batches, sensitivity_cache=None)
    assert sens.verified.ok and sens.sensitivity is not None


def test_onnx_export_of_keyword_inputs(tmp_path) -> None:
    pytest.importorskip("onnxruntime")
    from prunefx.onnx_export import export_onnx

    model = _model()
    exported = export_onnx(model, {"pixel_values": _pixels()}, tmp_path / "m.onnx", fold=False)
    assert (tmp_path / "m.onnx").is_file() and exported.max_rel_error <= 1e-4
