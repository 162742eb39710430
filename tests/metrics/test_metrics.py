"""MAC/FLOP counting, the ultralytics GFLOPs view and latency: exact against hand formulas and references."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from prunefx.errors import PrunefxError
from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
from prunefx.metrics import MetricsError, latency, measure

# ultralytics is imported lazily below; keep it offline and its settings file inside the repo.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", str(Path(__file__).resolve().parents[2] / ".cache" / "yolo"))


def small_net(width: int) -> nn.Sequential:
    """conv3x3 -> BN -> ReLU -> grouped strided conv3x3 -> BN -> 1x1 conv -> pool -> linear."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, groups=2, bias=False),
        nn.BatchNorm2d(2 * width),
        nn.Conv2d(2 * width, width, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, 10),
    )


def small_net_macs(width: int, batch: int, size: int) -> int:
    """Hand count for small_net: conv = out.numel() x Cin/groups x kh x kw; BN (eval) = 1 per element."""
    half = size // 2
    conv1 = batch * width * size * size * 3 * 9
    bn1 = batch * width * size * size
    conv2 = batch * 2 * width * half * half * (width // 2) * 9
    bn2 = batch * 2 * width * half * half
    conv3 = batch * width * half * half * 2 * width
    linear = batch * 10 * width
    return conv1 + bn1 + conv2 + bn2 + conv3 + linear


# ---- measure(): exact counts -----------------------------------------------------------------------


@pytest.mark.parametrize("use_meta", [True, False])
def test_small_net_exact(use_meta: bool) -> None:
    net = small_net(8)
    m = measure(net, torch.randn(2, 3, 16, 16), use_meta=use_meta)
    assert m.ran_on == ("meta" if use_meta else "cpu")
    assert m.macs == small_net_macs(8, 2, 16) == 110592 + 4096 + 73728 + 2048 + 16384 + 160
    assert m.flops == 2 * m.macs
    assert m.per_op == {
        "aten.convolution": 2 * 8 * 256 * 27 + 2 * 16 * 64 * 36 + 2 * 8 * 64 * 16,
        "aten._native_batch_norm_legit_no_training": 2 * 8 * 256 + 2 * 16 * 64,
        "aten.addmm": 2 * 80,
    }
    assert m.params == sum(p.numel() for p in net.parameters())
    assert m.buffers == (8 + 8 + 1) + (16 + 16 + 1)  # running mean, var, num_batches_tracked
    assert m.size_bytes > 4 * (m.params + m.buffers - 2)  # float32 data plus pickling overhead
    assert m.input_shapes == ((2, 3, 16, 16),)
    # ReLU and the pooling mean are arithmetic without a formula; views (Flatten) and copies are free.
    assert {"aten.relu", "aten.mean"} <= set(m.uncounted)
    assert not {"aten.view", "aten._unsafe_view", "aten.t"} & set(m.uncounted)


def test_per_module_breakdown() -> None:
    net = small_net(8)
    x = torch.randn(1, 3, 16, 16)
    leaf = measure(net, x, by="leaf").per_module
    assert leaf["0"] == 8 * 256 * 27 and leaf["1"] == 8 * 256 and leaf["8"] == 80
    assert sum(leaf.values()) == small_net_macs(8, 1, 16)  # all compute sits in leaves here
    assert list(leaf) == [n for n, _ in net.named_modules() if n in leaf]  # real names, in model order
    outer = nn.Sequential(net)
    assert measure(outer, x, by="module").per_module["0"] == small_net_macs(8, 1, 16)  # parents include children


@pytest.mark.parametrize("width", [16, 8, 6])
def test_pruned_widths_follow_hand_formula(width: int) -> None:
    """The same architecture at several widths: MACs track the per-layer formula exactly."""
    assert measure(small_net(width), torch.randn(1, 3, 32, 32)).macs == small_net_macs(width, 1, 32)


class _TrainingBatchNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, torch.zeros(x.shape[1]), torch.ones(x.shape[1]), training=True)


@pytest.mark.parametrize(
    ("norm", "macs_per_element"),
    [
        (nn.BatchNorm2d(6), 1),  # running stats: one scale-and-shift
        (nn.BatchNorm2d(6, track_running_stats=False), 3),  # batch statistics even in eval
        (_TrainingBatchNorm(), 3),  # running stats present, but training=True computes fresh ones
        (nn.InstanceNorm2d(6), 3),
        (nn.InstanceNorm2d(6, affine=True, track_running_stats=True), 1),
        (nn.GroupNorm(2, 6), 3),
        (nn.LayerNorm([6, 5, 5]), 4),  # elementwise affine cannot fold into the per-row scale
        (nn.LayerNorm([6, 5, 5], elementwise_affine=False), 3),
    ],
)
def test_norm_conventions(norm: nn.Module, macs_per_element: int) -> None:
    x = torch.randn(2, 6, 5, 5)
    for use_meta in (True, False):
        assert measure(norm, x, use_meta=use_meta).macs == macs_per_element * x.numel()


def test_conv_and_linear_match_flop_counter_and_hooks() -> None:
    """Convs/linears agree with an independent per-module hook count and with raw FlopCounterMode."""
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    by_hooks = 0

    def count(mod: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal by_hooks
        if isinstance(mod, nn.Conv2d):
            by_hooks += out.numel() * mod.in_channels // mod.groups * math.prod(mod.kernel_size)
        else:
            by_hooks += out.numel() * mod.in_features

    handles = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad(), FlopCounterMode(display=False) as raw:
        model(x)
    for h in handles:
        h.remove()
    m = measure(model, x)
    assert m.per_op["aten.convolution"] + m.per_op["aten.addmm"] == by_hooks
    assert raw.get_total_flops() == 2 * by_hooks  # torch counts 2 FLOPs per MAC, as we state
    bn_elements = m.per_op["aten._native_batch_norm_legit_no_training"]
    assert m.macs == by_hooks + bn_elements


class _SDPA(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q)


def test_attention_paths_count_the_same_on_meta_and_cpu() -> None:
    """CPU flash SDPA, MHA's fused fast path and the fused encoder layer are counted, matching meta."""
    b, h, length, e = 2, 4, 10, 16
    q = torch.randn(b, h, length, e)
    for use_meta in (True, False):
        assert measure(_SDPA(), q, use_meta=use_meta).macs == 2 * b * h * length * length * e  # QK^T and AV

    d, ffn = 64, 128
    layer = nn.TransformerEncoderLayer(d, 4, ffn, batch_first=True, dropout=0.0)
    x = torch.randn(b, length, d)
    attention = b * (4 * length * d * d + 2 * length * length * d)  # Q, K, V, out projections + QK^T, AV
    expected = attention + b * length * 2 * d * ffn + 2 * 4 * x.numel()  # + feed-forward + two layer norms
    real = measure(layer, x, use_meta=False)
    assert "aten._transformer_encoder_layer_fwd" in real.per_op  # the fused CPU path really ran
    assert real.macs == measure(layer, x).macs == expected
    mha = measure(layer.self_attn, (x, x, x), use_meta=False)
    assert "aten._native_multi_head_attention" in mha.per_op and mha.macs == attention


# torchvision's "_ops" (docs column "GFLOPS") is in fact GMACs at 224x224 (resnet50's 4.089 is the
# well-known 4.1 GMACs) and covers convs, linears and attention products only. Without our
# normalisation terms we reproduce it to all 3 published decimals; norms add a little on top
# (2.2% for mobilenet_v2, the most BN-heavy).
@pytest.mark.parametrize(
    ("name", "weights"),
    [("resnet50", "ResNet50_Weights"), ("mobilenet_v2", "MobileNet_V2_Weights"), ("vit_b_16", "ViT_B_16_Weights")],
)
def test_torchvision_published_gmacs(name: str, weights: str) -> None:
    published = getattr(torchvision.models, weights).IMAGENET1K_V1.meta["_ops"]
    m = measure(getattr(torchvision.models, name)(weights=None), torch.randn(1, 3, 224, 224))
    norms = sum(v for op, v in m.per_op.items() if "norm" in op)
    assert round((m.macs - norms) / 1e9, 3) == published
    assert m.macs / 1e9 == pytest.approx(published, rel=0.025)


def test_model_on_meta_device() -> None:
    """A model built on the meta device is counted, but has no data to serialize: size is None."""
    with torch.device("meta"):
        on_meta = small_net(8)
    m = measure(on_meta, torch.randn(1, 3, 16, 16))
    assert m.macs == small_net_macs(8, 1, 16) and m.size_bytes is None


# ---- measure(): the model is left as it was ---------------------------------------------------------


@pytest.mark.parametrize("use_meta", [True, False])
def test_measure_leaves_flags_and_running_stats(use_meta: bool) -> None:
    net = small_net(8)
    net.train()
    net[4].eval()  # mixed flags must come back exactly, not as a blanket train()
    with torch.no_grad():
        net(torch.randn(4, 3, 16, 16))  # non-trivial running stats
    flags = {n: m.training for n, m in net.named_modules()}
    state = copy.deepcopy(net.state_dict())
    measure(net, torch.randn(4, 3, 16, 16), use_meta=use_meta)
    assert {n: m.training for n, m in net.named_modules()} == flags
    for key, value in net.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_measure_then_real_forward_on_yolo_head() -> None:
    """ultralytics' Detect caches anchors in forward; a meta pass must not leave meta tensors behind."""
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", verbose=False)
    assert measure(model, torch.zeros(1, 3, 320, 320)).ran_on == "meta"
    assert model.model[-1].anchors.device.type == "cpu"
    with torch.no_grad():
        model.eval()(torch.zeros(1, 3, 320, 320))


# ---- ultralytics view --------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["yolov8n.yaml", "yolo11n.yaml"])
def yolo(request: pytest.FixtureRequest) -> nn.Module:
    from ultralytics.nn.tasks import DetectionModel

    return DetectionModel(request.param, verbose=False)


def test_ultralytics_view_equals_get_flops(yolo: nn.Module) -> None:
    from ultralytics.utils.torch_utils import get_flops

    before = copy.deepcopy(yolo.state_dict())
    unfused = ultralytics_gflops(yolo, imgsz=640)
    fused = ultralytics_gflops(yolo, imgsz=640, fused=True)
    assert unfused == get_flops(yolo, imgsz=640)
    assert fused == get_flops(copy.deepcopy(yolo).fuse(verbose=False), imgsz=640)
    expected = {"yolov8n.yaml": (8.8550912, 8.7439872), "yolo11n.yaml": (6.6733184, 6.5425024)}[yolo.yaml["yaml_file"]]
    assert (unfused, fused) == pytest.approx(expected, abs=1e-9)  # ultralytics 8.4.190 / ultralytics-thop 2.2.3
    assert not yolo.is_fused() and yolo.state_dict().keys() == before.keys()  # fused on a copy only


def test_ultralytics_view_conventions_by_hand() -> None:
    """Conv bias ignored, affine BN 4 x numel, plain BN 2 x numel, Linear in x out.numel(), ReLU free."""
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.BatchNorm2d(8, affine=False),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    macs = 8 * 32 * 32 * 3 * 9 + 4 * 8 * 32 * 32 + 2 * 8 * 32 * 32 + 8 * 5
    assert ultralytics_gflops(model, imgsz=32) == macs / 1e9 * 2
    macs_32x16 = 8 * 32 * 16 * 3 * 9 + 4 * 8 * 32 * 16 + 2 * 8 * 32 * 16 + 8 * 5  # pooled linear does not shrink
    assert ultralytics_gflops(model, imgsz=(32, 16)) == macs_32x16 / 1e9 * 2


# ---- latency -------------------------------------------------------------------------------------------


def test_latency_is_measured_and_restores_threads() -> None:
    net = small_net(8)
    net.train()
    threads_before = torch.get_num_threads()
    lat = latency(net, torch.randn(3, 3, 16, 16), warmup=1, repeats=7, threads=1)
    assert torch.get_num_threads() == threads_before
    assert lat.threads == 1 and lat.repeats == 7 and lat.batch_size == 3 and lat.device == "cpu"
    assert 0 < lat.min_ms <= lat.p10_ms <= lat.median_ms <= lat.p90_ms
    assert lat.min_ms <= lat.mean_ms and lat.torch_version == torch.__version__
    assert all(m.training for m in net.modules())


def test_latency_channels_last_works_on_a_copy() -> None:
    net = small_net(8)
    lat = latency(net, torch.randn(1, 3, 16, 16), warmup=0, repeats=3, channels_last=True)
    assert lat.channels_last and lat.median_ms > 0
    assert net[0].weight.is_contiguous()  # the caller's model keeps its layout


# ---- bad input -----------------------------------------------------------------------------------------


def test_non_module_is_a_clear_error() -> None:
    for fn in (measure, latency):
        with pytest.raises(MetricsError, match="needs a torch.nn.Module, got str"):
            fn("resnet50", torch.randn(1, 3, 8, 8))
    assert issubclass(MetricsError, PrunefxError) and issubclass(MetricsError, ValueError)


def test_rejected_inputs_are_a_clear_error() -> None:
    net = small_net(8)
    with pytest.raises(MetricsError, match=r"rejected example inputs of shape \[\(1, 4, 16, 16\)\].*Pass inputs"):
        measure(net, torch.randn(1, 4, 16, 16))
    with pytest.raises(MetricsError, match="rejected example inputs"):
        latency(net, torch.randn(1, 4, 16, 16), warmup=0, repeats=1)
    with pytest.raises(MetricsError, match="holds no tensor"):
        measure(net, "an image")
    with pytest.raises(MetricsError, match=r"\.fuse\(\) method"):
        ultralytics_gflops(net, imgsz=32, fused=True)
    with pytest.raises(MetricsError, match="repeats >= 1"):
        latency(net, torch.randn(1, 3, 16, 16), repeats=0)
