"""Op patterns behind the external-zoo failures of issue 15, each as a small module: the analysis must freeze what
no rule explains, never mutate the model, and give the ops timm / torchvision / Hugging Face use a rule."""

import copy

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from _nets import randomize_bn
from torch import nn

import prunefx
from prunefx.analysis import analyze
from prunefx.errors import TraceFailure
from prunefx.plan import PlanConfig


def _checked(model, x, ratio=0.5):
    """prune() with the oracle on; the result verified and nothing frozen by the check (the analysis was right)."""
    result = prunefx.prune(model, x, PlanConfig(ratio=ratio), bias_compensation=False)
    assert result.verified.ok, result.verified.message
    assert result.frozen_by_check == (), result.frozen_by_check
    return result


def _param_groups(dg, name: str) -> list:
    return [g for g in dg.groups if any(m.kind == "param" and m.name == name for m in g.members)]


# ---- R1: a parameter dim no rule explained is frozen, never a group of its own ------------------------------------
class GroupNormAct(nn.Module):
    """timm GroupNormAct: F.group_norm with the module's own weight and bias."""

    def __init__(self):
        super().__init__()
        self.conv, self.gn, self.head = nn.Conv2d(3, 16, 3), nn.GroupNorm(4, 16), nn.Conv2d(16, 5, 1)

    def forward(self, x):
        x = self.conv(x)
        return self.head(torch.relu(F.group_norm(x, 4, self.gn.weight, self.gn.bias, 1e-5)))


def test_functional_group_norm_is_a_rule_not_orphan_groups():
    model = GroupNormAct().eval()
    x = torch.randn(2, 3, 8, 8)
    dg = analyze(model, x)
    (g,) = dg.groups_of("conv")
    names = {(m.name, str(m.role)) for m in g.members}
    assert {("gn.weight", "dim0"), ("gn.bias", "dim0")} <= names  # sliced with the channels, not on their own
    assert g.prunable and not g.exact and g.channels == 4  # 4 positions per group of 4, inexact statistics
    r = prunefx.prune(model, x, PlanConfig(ratio=0.5))
    assert r.verified.state == "inexact" and model.gn.weight.shape[0] == model.conv.out_channels  # accepted, labelled


class IndexBuffer(nn.Module):
    """LeViT / relative-position bias: a learned table indexed by a buffer of positions."""

    def __init__(self, n=9, heads=4):
        super().__init__()
        self.qk = nn.Linear(8, 8)
        self.table = nn.Parameter(torch.randn(heads, 5))
        self.register_buffer("idx", torch.randint(0, 5, (n, n)))

    def forward(self, x):  # x: (B, n, 8)
        bias = self.table[:, self.idx]  # (heads, n, n)
        attn = (self.qk(x) @ x.transpose(1, 2)).unsqueeze(1) + bias
        return attn.softmax(-1).mean(1) @ x


def test_index_buffer_positions_are_never_pruned_on_their_own():
    model = IndexBuffer().eval()
    x = torch.randn(2, 9, 8)
    dg = analyze(model, x)
    for g in _param_groups(dg, "idx"):
        assert not g.prunable, g  # was: a prunable group with the buffer alone -> "scores missing" in make_plan
    result = prunefx.prune(model, x, PlanConfig(ratio=0.3))
    assert result.verified.accepted  # softmax over the pruned positions: inexact by design


class GroupedFunctionalConv(nn.Module):
    """timm ScaledStdConv2d with groups: F.conv2d(x, w, self.bias, groups=g)."""

    def __init__(self):
        super().__init__()
        self.a, self.w = nn.Conv2d(3, 8, 1), nn.Parameter(torch.randn(8, 4, 3, 3))
        self.bias, self.head = nn.Parameter(torch.randn(8)), nn.Conv2d(8, 3, 1)

    def forward(self, x):
        return self.head(F.conv2d(self.a(x), self.w, self.bias, padding=1, groups=2))


def test_functional_grouped_conv_freezes_its_bias_too():
    dg = analyze(GroupedFunctionalConv(), torch.randn(1, 3, 6, 6))
    assert all(not g.prunable for g in _param_groups(dg, "bias"))


class FourierPos(nn.Module):
    """timm PositionalEncodingFourier: reads ``self.proj.weight.device``; proj's input is computed from sizes."""

    def __init__(self, dim=8, hidden=6):
        super().__init__()
        self.proj, self.conv, self.hidden = nn.Conv2d(2 * hidden, dim, 1), nn.Conv2d(3, dim, 1), hidden

    def forward(self, x):
        b, _, h, w = x.shape
        device = self.proj.weight.device
        grid = torch.ones((b, h, w), device=device).cumsum(1)
        t = torch.arange(2 * self.hidden, device=device).float()
        pos = (grid[..., None] / (t + 1)).permute(0, 3, 1, 2)
        return self.conv(x) + self.proj(pos)


def test_a_weight_dim_only_read_for_its_device_is_not_pruned():
    model = FourierPos().eval()
    x = torch.randn(1, 3, 4, 4)
    dg = analyze(model, x)
    for g in _param_groups(dg, "proj.weight"):
        if any(str(m.role) == "dim1" for m in g.members if m.name == "proj.weight"):
            assert not g.prunable and "no op rule says how its positions are used" in g.reasons[0]
    _checked(model, x)  # was: proj.weight sliced to fewer inputs than pos has -> RuntimeError inside verify


# ---- R3 / R4: analyze never mutates the model; optional forward arguments keep their defaults ---------------------
class CachesAnchors(nn.Module):
    """ultralytics RTDETRDecoder: caches tensors built in forward on the module (an opaque leaf here)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.shapes = None

    def forward(self, x):
        if self.shapes != x.shape[-2:]:
            self.anchors = torch.zeros(1, 8, *x.shape[-2:], device=x.device)
            self.shapes = x.shape[-2:]
        return self.conv(x) + self.anchors


def test_analyze_leaves_cached_attributes_and_buffers_untouched():
    prunefx.register_leaf(CachesAnchors)
    model = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3), CachesAnchors()).eval()
    x = torch.randn(1, 3, 5, 5)
    state = copy.deepcopy(model.state_dict())
    attrs = {k: v for k, v in vars(model[2]).items()}
    analyze(model, x)
    assert vars(model[2]) == attrs and "anchors" not in vars(model[2])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    model(x)  # still runs on real tensors (it used to find meta anchors cached)


def test_optional_forward_arguments_are_traced_with_their_defaults():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x, mask=None, scale=2.0):
            x = self.a(x)
            if mask is not None:
                x = x * mask.view(1, -1, 1, 1)
            return self.b(x) * scale

    model = Masked().eval()
    x = torch.randn(1, 3, 4, 4)
    gm = prunefx.trace(model, (x,))
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["x"]
    _checked(model, x)


def test_trace_failure_names_a_torchvision_line_not_unknown_location():
    import torchvision

    model = torchvision.models.get_model("fasterrcnn_mobilenet_v3_large_320_fpn", weights=None,
                                         weights_backbone=None, min_size=64, max_size=64).eval()
    with pytest.raises(TraceFailure) as err:
        prunefx.trace(model, ([torch.rand(3, 64, 64)],), training=True)
    assert "unknown location" not in str(err.value)
    assert "torchvision/models/detection/" in str(err.value)


# ---- R7 / R8: fx's immutable lists; a shape passed as one computed tuple ----------------------------------------
@fx.wrap
def _window(size: list, x: torch.Tensor) -> torch.Tensor:
    size[0] = min(size[0], x.shape[-1])  # mutates its argument, as torchvision's swin3d helper does
    return x * size[0]


def test_a_wrapped_function_may_mutate_its_list_argument():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            return self.b(_window([7, 7], self.a(x)))

    _checked(M().eval(), torch.randn(1, 3, 4, 4))


def test_reshape_to_a_shape_built_from_tuples():
    class Windows(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 8), nn.Linear(8, 2)

        def forward(self, x):  # x: (B, 4, 4, 3) -> windows (B*4, 2, 2, C) as timm maxvit's window_partition
            x = self.a(x)
            b, h, w, c = x.shape
            x = x.view(b, h // 2, 2, w // 2, 2, c).permute(0, 1, 3, 2, 4, 5)
            x = x.reshape((-1,) + (2, 2) + (c,))
            return self.b(x)

    result = _checked(Windows().eval(), torch.randn(1, 4, 4, 3))
    assert result.graph.group_of("a").prunable


# ---- item 4: rules for ops that froze whole ViT-family models ------------------------------------------------------
def test_new_empty_and_factories_sized_from_channels_follow_those_channels():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1)

        def forward(self, x):
            y = self.a(x)
            acc = y.new_zeros(y.shape) + torch.zeros((y.shape[0], y.shape[1], 1, 1))
            return self.b(y + acc + x.new_empty(x.shape[0], 1, 1, 1).fill_(1.0))

    result = _checked(M().eval(), torch.randn(2, 3, 4, 4))
    assert result.graph.group_of("a").prunable


def test_cumsum_along_channels_is_exact_and_cumprod_freezes():
    class M(nn.Module):
        def __init__(self, op):
            super().__init__()
            self.a, self.b, self.op = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1), op

        def forward(self, x):
            return self.b(getattr(self.a(x), self.op)(1))

    x = torch.randn(1, 3, 4, 4)
    assert _checked(M("cumsum").eval(), x).graph.group_of("a").prunable
    dg = analyze(M("cumprod").eval(), x)
    assert not dg.group_of("a").prunable and "cumprod along a channel dim" in dg.group_of("a").reasons[0]


@pytest.mark.parametrize("width", [8, 10, 11])
def test_uneven_chunk3_prunes_the_shared_positions(width):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(3, width, 1)
            sizes = [t.shape[1] for t in torch.empty(1, width).chunk(3, 1)]
            self.heads = nn.ModuleList(nn.Conv2d(n, 2, 1) for n in sizes)

        def forward(self, x):
            return [h(p) for h, p in zip(self.heads, self.a(x).chunk(3, 1), strict=True)]

    result = _checked(M().eval(), torch.randn(1, 3, 2, 2), ratio=0.4)
    assert result.plan.pruned  # was: every channel frozen ("chunk(3) into uneven pieces")


def test_advanced_indexing_along_tokens_keeps_the_channel_labels():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)
            self.register_buffer("keep", torch.tensor([0, 2, 3]))

        def forward(self, x):  # x: (B, tokens, 4)
            return self.b(self.a(x)[:, self.keep])

    result = _checked(M().eval(), torch.randn(2, 5, 4))
    assert result.graph.group_of("a").prunable


def test_position_embedding_cut_to_the_channel_count():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 2, 1)
            self.pos = nn.Parameter(torch.randn(1, 12, 1, 1))  # longer than needed, cut to the width

        def forward(self, x):
            y = self.a(x)
            return self.b(y + self.pos[:, : y.shape[1]])

    result = _checked(M().eval(), torch.randn(1, 3, 4, 4))
    assert result.graph.group_of("a").prunable


def test_reshape_as_ties_to_the_other_tensor_and_repeat_interleave_copies_channels():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 8, 1), nn.Conv2d(16, 2, 1)

        def forward(self, x):
            y = self.a(x)
            z = y.flatten(2).reshape_as(y)
            return self.b(z.repeat_interleave(2, dim=1))

    result = _checked(randomize_bn(M()).eval(), torch.randn(1, 3, 4, 4))
    assert result.graph.group_of("a").prunable


class GlobalResponseNorm(nn.Module):
    """ConvNeXt-V2's GRN (HF's spelling: torch.linalg.vector_norm with positional ord, dim, keepdim), channels last."""

    def __init__(self, functional):
        super().__init__()
        self.functional = functional
        self.conv, self.head = nn.Conv2d(3, 16, 3), nn.Conv2d(16, 5, 1)

    def forward(self, x):
        h = self.conv(x).permute(0, 2, 3, 1)
        g = torch.linalg.vector_norm(h, 2, (1, 2), True) if self.functional else torch.norm(h, 2, (1, 2), True)
        h = h * (g / (g.mean(dim=-1, keepdim=True) + 1e-6))  # the mean over channels: inexact, prunable
        return self.head(h.permute(0, 3, 1, 2))


@pytest.mark.parametrize("capture", ["fx", "export"])
@pytest.mark.parametrize("functional", [True, False], ids=["vector_norm", "torch.norm"])
def test_vector_norm_over_positions_keeps_the_channels(functional, capture):
    # HF ConvNeXt-V2 froze every channel: aten.linalg_vector_norm had no rule, and torch.norm's positional dims
    # (after p) were read as the dims.
    model, x = GlobalResponseNorm(functional).eval(), torch.randn(2, 3, 8, 8)
    dg = analyze(model, x, capture=capture)
    (g,) = dg.groups_of("conv")
    assert g.prunable and g.channels == 16 and not g.exact, g.reasons


class GroupNormConcat(nn.Module):
    """HF PoolFormer's GroupNorm and RT-DETR's torch.concat, as the export front end sees them (aten ops)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 3, padding=1)
        self.gn, self.head = nn.GroupNorm(4, 16), nn.Conv2d(16, 5, 1)

    def forward(self, x):
        return self.head(torch.relu(self.gn(torch.concat([self.a(x), self.b(x)], dim=1))))


def test_export_group_norm_and_concat_have_rules():
    model, x = GroupNormConcat().eval(), torch.randn(2, 3, 8, 8)
    dg = analyze(model, x, capture="export")
    assert not dg.unknown_ops, dg.unknown_ops
    assert all(g.prunable for g in dg.groups_of("a") + dg.groups_of("b")), [g.reasons for g in dg.groups]
    result = prunefx.prune(model, x, PlanConfig(ratio=0.5), capture="export", bias_compensation=False)
    assert result.verified.accepted and result.frozen_by_check == (), result.verified.message
    assert model.gn.weight.shape[0] < 16 and model.gn.weight.shape[0] % 4 == 0  # equal positions kept per group
