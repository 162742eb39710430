"""Rules that keep channels prunable where ViT-family and dual-path models used to freeze them (issue 15):
``einsum`` from its subscripts, constant channel slices (``x[:, a:b]``), and reshapes whose sizes are computed
from other tensors. Each pattern asserts the exact groups and that the pruned model equals the masked original."""

import copy

import pytest
import torch
from _graph_checks import expect, positions, the_group
from torch import nn

import prunefx
from prunefx.plan import PlanConfig, PlanError


def _checked(model, x, ratio=0.5, **cfg):
    """prune() with the oracle on: verified, nothing frozen by the check, something pruned."""
    result = prunefx.prune(model, x, PlanConfig(ratio=ratio, **cfg), bias_compensation=False)
    assert result.verified.ok, result.verified.message
    assert result.frozen_by_check == (), result.frozen_by_check
    assert result.plan.pruned
    return result


# ---- einsum ---------------------------------------------------------------------------------------------------------
class Bilinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(6, 2)

    def forward(self, x):  # the contracted letter c couples a's and b's outputs
        return self.c(torch.einsum("bnc,bmc->bnm", self.a(x), self.b(x)))


def test_einsum_contracted_letter_couples_both_operands():
    x = torch.randn(2, 6, 3)
    dg = prunefx.analyze(Bilinear(), x)
    expect(dg, (4, True, ["a.out[0:4]", "b.out[0:4]"]), (2, False, ["c.out[0:2]"]))
    assert dg.unknown_ops == {}
    _checked(Bilinear().eval(), x)


class RelPos(nn.Module):
    """SAM / MViTv2 relative positions: ``einsum("bhwc,hkc->bhwk", q, Rh)`` with a learned table, then the
    attention applied to v with a second einsum (the kept letter c of v maps to the output)."""

    def __init__(self, size=4, dim=8):
        super().__init__()
        self.q, self.v, self.o = nn.Linear(3, dim), nn.Linear(3, dim), nn.Linear(dim, 2)
        self.rel = nn.Parameter(torch.randn(size, size, dim))

    def forward(self, x):  # x: (B, H, W, 3)
        attn = torch.einsum("bhwc,hkc->bhwk", self.q(x), self.rel).softmax(-1)
        return self.o(torch.einsum("bhwk,bkwc->bhwc", attn, self.v(x)))


def test_einsum_relative_position_table_follows_the_query_channels():
    x = torch.randn(1, 4, 4, 3)
    dg = prunefx.analyze(RelPos(), x)
    # the table's position dims (h, k) meet the query's unlabeled positions: frozen, groups of parameter dims only
    expect(dg, (8, True, ["q.out[0:8]"]), (8, True, ["o.in[0:8]", "v.out[0:8]"]), (2, False, ["o.out[0:2]"]),
           (4, False, []), (4, False, []))
    g = the_group(dg, "q")
    assert positions(g, "rel", "dim2", kind="param") == tuple((j,) for j in range(8))
    _checked(RelPos().eval(), x)


def test_einsum_in_an_export_graph_has_the_same_rule():
    x = torch.randn(1, 4, 4, 3)
    result = prunefx.prune(RelPos().eval(), x, PlanConfig(ratio=0.5), capture="export", bias_compensation=False)
    assert result.verified.ok and {gp.label for gp in result.plan.pruned} == {"q out[0:8]", "v out[0:8]"}


class Ellipsis_(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 5), nn.Linear(4, 2)
        self.w = nn.Parameter(torch.randn(5, 4))

    def forward(self, x):  # "...c,cd->...d": ellipsis dims broadcast, c contracted with a weight
        return self.b(torch.einsum("...c,cd->...d", self.a(x), self.w))


def test_einsum_with_ellipsis_contracts_with_a_weight():
    x = torch.randn(2, 3, 3)
    dg = prunefx.analyze(Ellipsis_(), x)
    expect(dg, (5, True, ["a.out[0:5]"]), (4, True, ["b.in[0:4]"]), (2, False, ["b.out[0:2]"]))
    assert positions(the_group(dg, "a"), "w", "dim0", kind="param") == tuple((j,) for j in range(5))
    _checked(Ellipsis_().eval(), x)


class AgainstInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(1, 2)

    def forward(self, x):  # contracted with the model input, whose channels cannot be sliced
        return self.b(torch.einsum("bnc,bnc->bn", self.a(x), x)[..., None])


def test_einsum_contracted_with_the_input_freezes_with_a_reason():
    dg = prunefx.analyze(AgainstInput(), torch.randn(2, 4, 3))
    g = the_group(dg, "a")
    assert not g.prunable and "einsum contracts it with a dim that cannot be sliced" in g.reasons[0]


def test_einsum_with_a_diagonal_freezes_its_operand():
    class Trace(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(2, 2)

        def forward(self, x):  # x: (B, 4, 4) -> trace over the last two dims of a(x)... "bii->b"
            return self.b(torch.einsum("bii->b", self.a(x))[:, None].expand(-1, 2))

    dg = prunefx.analyze(Trace(), torch.randn(2, 4, 4))
    assert not the_group(dg, "a").prunable
    assert "einsum form prunefx does not model" in the_group(dg, "a").reasons[0]


# ---- constant slices of a channel dim -------------------------------------------------------------------------------
class DualPath(nn.Module):
    """DPN: one conv's output cut at a literal offset into a residual part and a dense part."""

    def __init__(self):
        super().__init__()
        self.a, self.r, self.d = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 5, 1), nn.Conv2d(3, 2, 1)
        self.head = nn.Conv2d(10, 4, 1)

    def forward(self, x):
        y = self.a(x)
        resid = self.r(x) + y[:, :5]
        dense = torch.cat([self.d(x), y[:, 5:, :, :]], 1)
        return self.head(torch.cat([resid, dense], 1))


def test_constant_channel_slice_is_a_split_with_its_bounds_rewritten():
    x = torch.randn(1, 3, 4, 4)
    dg = prunefx.analyze(DualPath(), x)
    expect(
        dg,
        (5, True, ["a.out[0:5]", "r.out[0:5]", "head.in[0:5]", "const:getitem.args[1][1][1][0:5]",
                   "const:getitem_1.args[1][1][0][0:5]"]),
        (3, True, ["a.out[5:8]", "head.in[7:10]"]),
        (2, True, ["d.out[0:2]", "head.in[5:7]"]),
        (4, False, ["head.out[0:4]"]),
    )  # fmt: skip
    result = _checked(DualPath().eval(), x, graph_rewrite=True)
    gm = result.model
    (first,) = [n for n in gm.graph.nodes if n.name == "getitem"]
    (second,) = [n for n in gm.graph.nodes if n.name == "getitem_1"]
    width = gm.r.out_channels
    assert first.args[1][1] == slice(None, width, None) and second.args[1][1] == slice(width, None, None)


class FusedQKV(nn.Module):
    """Phi-3: one projection holding q, k and v, cut with ``qkv[..., :q_pos]`` and the like."""

    def __init__(self):
        super().__init__()
        self.qkv, self.o = nn.Linear(3, 12), nn.Linear(4, 2)

    def forward(self, x):
        f = self.qkv(x)
        return self.o(f[..., :4] * f[..., 4 : 4 + 4] + f[..., 8:])


def test_fused_qkv_cut_at_literal_offsets_keeps_the_same_positions_in_each_part():
    x = torch.randn(2, 5, 3)
    dg = prunefx.analyze(FusedQKV(), x)
    expect(
        dg,
        (4, True, ["qkv.out[0:4]+[4:8]+[8:12]", "o.in[0:4]", "const:getitem.args[1][1][1][0:4]",
                   "const:getitem_1.args[1][1][0][0:4]", "const:getitem_1.args[1][1][1][0:4]+[4:8]",
                   "const:getitem_2.args[1][1][0][0:4]+[4:8]"]),
        (2, False, ["o.out[0:2]"]),
    )  # fmt: skip
    result = _checked(FusedQKV().eval(), x, graph_rewrite=True)
    assert result.model.qkv.out_features == 3 * result.model.o.in_features


def test_export_slices_with_literal_bounds_record_start_and_end():
    dg = prunefx.analyze(FusedQKV().eval(), torch.randn(2, 5, 3), capture="export")
    expect(
        dg,
        (4, True, ["qkv.out[0:4]+[4:8]+[8:12]", "o.in[0:4]", "const:slice_1.args[3][0:4]", "const:slice_2.args[2][0:4]",
                   "const:slice_2.args[3][0:4]+[4:8]", "const:slice_3.args[2][0:4]+[4:8]"]),
        (2, False, ["o.out[0:2]"]),
        (3, False, ["qkv.in[0:3]"]),
    )  # fmt: skip


def test_export_capture_with_literal_groups_says_graph_rewrite_needs_fx():
    """The literal-carrying group is skipped with a fix that works for export captures; asking for a rewrite of an
    export graph is one clear error, not a failed check."""
    model, x = FusedQKV().eval(), torch.randn(2, 5, 3)
    result = prunefx.prune(copy.deepcopy(model), x, PlanConfig(ratio=0.5), capture="export")
    assert result.verified.ok
    reasons = [why for _, why in result.plan.skipped if "hard-codes" in why]
    assert reasons and all("graph_rewrite needs capture='fx'" in why for why in reasons)
    with pytest.raises(PlanError, match="graph_rewrite needs an fx capture"):
        prunefx.prune(copy.deepcopy(model), x, PlanConfig(ratio=0.5, graph_rewrite=True), capture="export")


def test_constant_channel_slice_counted_from_the_end_is_frozen():
    class Tail(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Conv2d(3, 8, 1), nn.Conv2d(3, 2, 1)

        def forward(self, x):
            return self.c(self.a(x)[:, -3:])

    dg = prunefx.analyze(Tail(), torch.randn(1, 3, 4, 4))
    assert not the_group(dg, "a").prunable
    assert "a constant slice of a channel dim counted from its end" in the_group(dg, "a").reasons[0]


# ---- reshapes sized from other tensors -------------------------------------------------------------------------------
class FactorAttn(nn.Module):
    """CoaT: head_dim is ``C // heads`` with C the residual width, and a conv over ``reshape(b, h * c, H, W)`` with
    h, c read from q's shape."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.embed, self.qkv, self.proj = nn.Linear(3, dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.conv, self.head = nn.Conv2d(dim, dim, 3, padding=1, groups=dim), nn.Linear(dim, 2)

    def forward(self, x):  # x: (B, 4, 3): 2 x 2 tokens
        x = self.embed(x)
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        att = q @ (k.softmax(dim=2).transpose(-1, -2) @ v)
        b, h, n, c = q.shape
        crpe = self.conv(v.transpose(-1, -2).reshape(b, h * c, 2, 2)).reshape(b, h, c, n).transpose(-1, -2)
        y = (att + q * crpe).transpose(1, 2).reshape(B, N, C)
        return self.head(x + self.proj(y))


def test_head_dim_computed_as_width_over_heads_prunes_the_same_offset_in_every_block():
    x = torch.randn(2, 4, 3)
    dg = prunefx.analyze(FactorAttn(), x)
    expect(
        dg,
        (4, True, ["conv.in[0:4]+[4:8]", "conv.out[0:4]+[4:8]", "embed.out[0:4]+[4:8]", "head.in[0:4]+[4:8]",
                   "proj.in[0:4]+[4:8]", "proj.out[0:4]+[4:8]", "qkv.in[0:4]+[4:8]", "qkv.out[0:4]x6"]),
        (2, False, ["head.out[0:2]"]),
    )  # fmt: skip
    g = the_group(dg, "embed")
    assert g.prunable and g.channels == 4  # offset d of head_dim = channels d and 4 + d of the residual width
    assert positions(g, "embed", "out") == tuple((d, 4 + d) for d in range(4))
    assert positions(g, "qkv", "out") == tuple(tuple(p * 4 + d for p in range(6)) for d in range(4))
    assert positions(g, "conv", "out") == tuple((d, 4 + d) for d in range(4))
    result = _checked(FactorAttn().eval(), x)
    m = result.model
    assert m.embed.out_features == m.conv.out_channels == m.qkv.out_features // 3 < 8


class BatchTimesHeads(nn.Module):
    """SAM: ``reshape(3, B * num_heads, N, -1)``: the heads literal sits in a multiplication before the reshape."""

    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(3, 3 * dim), nn.Linear(dim, 2)

    def forward(self, x):  # x: (B, N, 3)
        B, N, _ = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, B * self.heads, N, -1).unbind(0)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # its scale freezes head_dim: heads prune
        return self.proj(y.view(B, self.heads, N, -1).permute(0, 2, 1, 3).reshape(B, N, -1))


def test_batch_times_heads_literal_follows_the_kept_heads():
    x = torch.randn(2, 5, 3)
    dg = prunefx.analyze(BatchTimesHeads(), x)
    expect(
        dg,
        (4, True, ["const:mul.args[1][0:4]", "const:view.args[4][0:4]", "const:view_1.args[2][0:4]",
                   "proj.in[0:13:4]+[1:14:4]+[2:15:4]+[3:16:4]", "qkv.out[0:13:4]x12"]),
        (2, False, ["proj.out[0:2]"]),
    )  # fmt: skip
    (g,) = [g for g in dg.groups if g.prunable]
    assert positions(g, "mul", "args[1]", kind="const") == tuple((h,) for h in range(4))
    result = _checked(BatchTimesHeads().eval(), x, graph_rewrite=True)
    (mul,) = [n for n in result.model.graph.nodes if n.name == "mul"]
    assert mul.args[1] == 2 and result.model.qkv.out_features == 3 * 2 * 4


class WindowBlock(nn.Module):
    """Swin / GCViT: tokens -> ``view(B, H, W, C)`` -> window partition -> attention with ``C // heads`` -> window
    unpartition -> tokens; every size read from the tensors."""

    def __init__(self, dim=8, heads=2, ws=2):
        super().__init__()
        self.heads, self.ws = heads, ws
        self.embed, self.qkv, self.proj, self.head = (nn.Linear(3, dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim),
                                                      nn.Linear(dim, 2))

    def forward(self, x):  # x: (B, 16, 3), 4 x 4 tokens
        x = self.embed(x)
        B, L, C = x.shape
        ws, H = self.ws, 4
        w = x.view(B, H, H, C).view(B, H // ws, ws, H // ws, ws, C).permute(0, 1, 3, 2, 4, 5)
        w = w.reshape(-1, ws * ws, C)
        Bw, N, _ = w.shape
        q, k, v = self.qkv(w).reshape(Bw, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = ((q @ k.transpose(-2, -1)).softmax(-1) @ v).transpose(1, 2).reshape(Bw, N, C)
        y = self.proj(y).view(B, H // ws, H // ws, ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H * H, C)
        return self.head(x + y)


def test_window_partition_attention_with_sizes_read_from_the_tensors():
    x = torch.randn(2, 16, 3)
    dg = prunefx.analyze(WindowBlock(), x)
    expect(
        dg,
        (4, True, ["embed.out[0:4]+[4:8]", "head.in[0:4]+[4:8]", "proj.in[0:4]+[4:8]", "proj.out[0:4]+[4:8]",
                   "qkv.in[0:4]+[4:8]", "qkv.out[0:4]x6"]),
        (2, False, ["head.out[0:2]"]),
    )  # fmt: skip
    _checked(WindowBlock().eval(), x)
