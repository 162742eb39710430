"""prunefx.quantize: ONNX Runtime's int8 model checked by an independent oracle, per-layer cost, mixed precision."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import prunefx
from prunefx.deploy import QuantizeError, quantize
from prunefx.deploy.check import run_onnx
from tests._nets import randomize_bn

FAST = {"method": "minmax", "activation": "int8"}  # one candidate: the search itself is tested once


def _batches(shape: tuple[int, ...], n: int = 6, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


class Sabotaged(nn.Module):
    """Three convs and a head; ``body.0``'s weights hold an outlier on an input channel that is always zero.

    The outlier changes nothing in float (it multiplies zeros), but it sets every output channel's int8 weight
    scale, so the layer's real weights round to a few levels: quantizing ``body.0`` costs the most, by design.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.tail = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(8, 4)
        with torch.no_grad():
            self.stem[0].weight[0].zero_()
            self.stem[0].bias[0] = -1.0
            self.stem[1].weight[0], self.stem[1].bias[0] = 1.0, -5.0  # channel 0 after ReLU: always 0
            self.body[0].weight[:, 0] = 60.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.tail(self.body(self.stem(x))).mean((2, 3)))


@pytest.fixture(scope="module")
def sabotaged(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    model = randomize_bn(Sabotaged()).eval()
    with torch.no_grad():
        model.stem[1].weight[0], model.stem[1].bias[0] = 1.0, -5.0
        model.stem[1].running_mean[0], model.stem[1].running_var[0] = 0.0, 1.0
    out = tmp_path_factory.mktemp("sabotaged")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantize(model, torch.randn(1, 3, 8, 8), _batches((4, 3, 8, 8), n=4), out=out, **FAST)
    return model, q, before


def _producer(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in graph.node for o in n.output}


def _dequantized(graph: onnx.GraphProto, name: str, x: np.ndarray | None = None) -> np.ndarray:
    """Recompute, in numpy, what the DequantizeLinear producing ``name`` gives: from the initializer it reads, or by
    quantizing ``x`` with the QuantizeLinear before it (round half to even, saturate), then dequantizing."""
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    prod = _producer(graph)
    dq = prod[name]
    assert dq.op_type == "DequantizeLinear"
    scale = inits[dq.input[1]].astype(np.float64)
    zero = inits[dq.input[2]].astype(np.float64) if len(dq.input) > 2 else np.zeros_like(scale)
    if dq.input[0] in inits:
        q = inits[dq.input[0]].astype(np.float64)
    else:
        ql = prod[dq.input[0]]
        assert ql.op_type == "QuantizeLinear" and x is not None
        dtype = inits[ql.input[2]].dtype
        lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
        q = np.clip(np.rint(x / inits[ql.input[1]]) + inits[ql.input[2]].astype(np.float64), lo, hi)
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    if scale.ndim == 1 and q.ndim > 1:  # per channel along axis
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (q - zero) * scale


@pytest.mark.parametrize("kind", ["conv", "linear"])
def test_int8_layer_equals_numpy_quantize_dequantize(kind: str, tmp_path: Path) -> None:
    """The oracle: ORT's int8 output == the float op on numpy-dequantized input, weights and bias of the same scales."""
    torch.manual_seed(1)
    model = (nn.Conv2d(3, 6, 3) if kind == "conv" else nn.Linear(10, 5)).eval()
    shape = (4, 3, 8, 8) if kind == "conv" else (4, 10)
    q = quantize(model, torch.randn(1, *shape[1:]), _batches(shape), out=tmp_path, mixed=False, **FAST)
    graph = onnx.load(str(q.int8_path)).graph
    op = next(n for n in graph.node if n.op_type in ("Conv", "Gemm"))
    x = _batches(shape, n=1, seed=7)[0].numpy().astype(np.float64)
    xd = _dequantized(graph, op.input[0], x)
    w = _dequantized(graph, op.input[1])
    b = _dequantized(graph, op.input[2])
    if kind == "conv":
        want = torch.nn.functional.conv2d(torch.from_numpy(xd), torch.from_numpy(w), torch.from_numpy(b)).numpy()
    else:
        trans_b = next((a.i for a in op.attribute if a.name == "transB"), 0)
        want = xd @ (w.T if trans_b else w) + b
    got = run_onnx(q.int8_path, [{"input0": x.astype(np.float32)}])[0][0].astype(np.float64)
    # an output QuantizeLinear (if ORT put one) saturates and rounds to its step: the oracle does the same, and
    # ORT's int32 requantization may round the other way, so they agree within one step
    after = {i: n for n in graph.node for i in n.input}
    step = 0.0
    if op.output[0] in after and after[op.output[0]].op_type == "QuantizeLinear":
        ql = after[op.output[0]]
        step = float(numpy_helper.to_array(next(i for i in graph.initializer if i.name == ql.input[1])))
        want = _dequantized(graph, after[ql.output[0]].output[0], want)
    assert np.abs(got - want).max() <= max(step, 1e-5 * np.abs(want).max()) * 1.01
    # and the int8 model is not the float one: its weights really were rounded
    assert np.abs(w - model.weight.detach().numpy()).max() > 0


def test_per_layer_table_names_the_sabotaged_layer(sabotaged) -> None:
    _, q, _ = sabotaged
    assert q.layers[0].module == "body.0", q.table()
    assert q.layers[0].share > 0.5 and all(r.error < q.layers[0].error for r in q.layers[1:])
    assert "body.0" in q.table().splitlines()[1]


def test_mixed_precision_keeps_the_sabotaged_layer_float(sabotaged) -> None:
    _, q, _ = sabotaged
    assert "body.0" in q.kept_float and q.layers[0].precision == "float"
    assert q.error < 0.5 * max(e.rel_rms for e in q.all_int8), q.describe()
    assert {r.name for r in q.layers if r.precision == "int8"} >= {"tail.0"}


def test_quantize_changes_neither_model_nor_other_files(sabotaged) -> None:
    model, q, before = sabotaged
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training
    assert sorted(p.name for p in q.int8_path.parent.iterdir()) == ["model.float.onnx", "model.int8.onnx"]


def test_forced_patterns_win_over_measurement(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Sabotaged().eval()
    q = quantize(model, torch.randn(1, 3, 12, 12), _batches((4, 3, 12, 12)), out=tmp_path,
                 keep_float=["stem.*"], force_int8=["body.0"], **FAST)
    rows = {r.name: r for r in q.layers}
    assert rows["stem.0"].precision == "float" and rows["stem.0"].reason == "keep_float"
    assert rows["body.0"].precision == "int8"


def test_calibration_method_is_chosen_by_held_out_error(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).eval()
    q = quantize(model, torch.randn(1, 3, 8, 8), _batches((4, 3, 8, 8), n=4), out=tmp_path, mixed=False)
    tried = {part.rsplit(" ", 1)[0]: float(part.rsplit(" ", 1)[1])
             for part in q.choice.split("held-out error of ")[1].split(", ")}
    assert len(tried) == 6
    best = min(tried.values())
    if q.activation == "int8":  # int8 activations only when clearly better than uint8's faster kernels
        assert tried[f"{q.method}/int8"] == best and best < 0.9 * tried[f"{q.method}/uint8"]
    else:
        assert min(tried[f"{q.method}/uint8"], tried[f"{q.method}/int8"]) == best
        assert tried[f"{q.method}/uint8"] * 0.9 <= best


def test_pruned_model_round_trips_to_int8(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = randomize_bn(nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))).eval()
    x = torch.randn(1, 3, 16, 16)
    pruned = prunefx.prune(model, x, prunefx.PlanConfig(flops=0.5)).model.eval()
    assert pruned[3].out_channels < 16
    batches = _batches((4, 3, 16, 16), n=8)
    q = prunefx.quantize(pruned, x, batches, out=tmp_path, **FAST)
    # checked here against torch itself (not the float ONNX file): int8 stays within 5% relative RMS on held-out rows
    held = batches[-q.held_out_batches:]
    with torch.no_grad():
        want = np.concatenate([pruned(b).numpy().ravel() for b in held]).astype(np.float64)
    got = np.concatenate([o[0].ravel() for o in run_onnx(q.int8_path, [{"input0": b.numpy()} for b in held])])
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 0 < rel <= 0.05 and abs(rel - q.error) <= 0.01


def test_quantizer_option_that_breaks_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    def broken(*args, **kwargs):
        raise ValueError("The truth value of an array with more than one element is ambiguous.")

    monkeypatch.setattr(QDQQuantizer, "_adjust_weight_scale_for_int32_bias", broken)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3)).eval()
    q = quantize(model, torch.randn(1, 3, 8, 8), _batches((2, 3, 8, 8), n=4), out=tmp_path, per_layer=False, **FAST)
    assert q.per_channel and len(q.fallbacks) == 1 and "truth value" in q.fallbacks[0], q.fallbacks
    assert q.error < 0.2
    # without the per-layer table nothing is measured per layer, and nothing is kept float by measurement
    assert len(q.layers) == 2 and all(r.error != r.error and r.precision == "int8" for r in q.layers)


class _NoExport(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.histc(x, 4)  # no ONNX operator for it


@pytest.mark.parametrize("case,match", [
    ("none", "needs calibration batches"),
    ("one batch", "at least 2"),
    ("tensor", "needs calibration batches, got one tensor"),
    ("no layer", "nothing to quantize"),
    ("no export", "does not export to ONNX"),
    ("bad pattern", "matches no quantizable layer"),
    ("not a module", "needs a torch.nn.Module"),
])
def test_bad_input_is_one_line(case: str, match: str, tmp_path: Path) -> None:
    x = torch.randn(2, 3, 8, 8)
    model, calib, kwargs = nn.Sequential(nn.Conv2d(3, 4, 3)).eval(), [x, x + 1], {}
    if case == "none":
        calib = None
    elif case == "one batch":
        calib = [x]
    elif case == "tensor":
        calib = x
    elif case == "no layer":
        model = nn.Sequential(nn.ReLU(), nn.Softmax(dim=1))
    elif case == "no export":
        model = _NoExport()
    elif case == "bad pattern":
        kwargs = {"keep_float": ["nope*"]}
    elif case == "not a module":
        model = lambda t: t  # noqa: E731
    with pytest.raises(QuantizeError, match=match) as info:
        quantize(model, x, calib, out=tmp_path / "out", **FAST, **kwargs)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links here")
def test_out_through_a_link_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(QuantizeError, match="link"):
        quantize(nn.Conv2d(3, 4, 3), x, [x, x], out=tmp_path / "link", **FAST)
    assert not any(target.iterdir())
