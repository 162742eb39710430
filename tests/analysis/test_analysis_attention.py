"""Attention patterns: heads as the pruning unit (split and fused qkv), GQA, RoPE, SwiGLU, tied embeddings.

Every pattern is analysed through both capture front ends (torch.fx and torch.export) and must give the same
groups: one analysis, one rule registry. Groups are asserted exactly, position by position.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunefx
from prunefx.analysis.roles import Kind
from prunefx.plan import GroupPlan, PruningPlan
from prunefx.transform import register_fixer
from prunefx.transform.fixers import _FIXERS, _OWNS_LITERALS

CAPTURES = ("fx", "export")
H, HD, E = 4, 4, 16  # heads, head_dim, model width


def _heads(h: int, hd: int, offset: int = 0) -> tuple[tuple[int, ...], ...]:
    """Positions of whole heads: channel k = rows offset + [k * hd, (k + 1) * hd)."""
    return tuple(tuple(range(offset + k * hd, offset + (k + 1) * hd)) for k in range(h))


def _pos(group, name: str, role: str = "out") -> tuple[tuple[int, ...], ...]:
    (m,) = [m for m in group.members if m.kind is Kind.MODULE and m.name == name and str(m.role) == role]
    return m.positions


def _group(dg, name: str, role: str = "out"):
    gs = dg.groups_of(name, role)
    assert len(gs) == 1, f"{name}.{role} spans {len(gs)} groups"
    return gs[0]


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep: int):
    """Hugging Face's repeat_kv: sizes read from the tensor, the repeat count an attribute."""
    batch, kv_heads, slen, head_dim = x.shape
    x = x[:, :, None, :, :].expand(batch, kv_heads, n_rep, slen, head_dim)
    return x.reshape(batch, kv_heads * n_rep, slen, head_dim)


class SplitAttention(nn.Module):
    """Llama-style: q/k/v projections viewed as (-1, head_dim), optional RoPE and GQA, SDPA, o projection."""

    def __init__(self, heads=H, kv_heads=H, rope=False, gqa="repeat", scale=True):
        super().__init__()
        self.heads, self.kv, self.rope, self.gqa, self.scale = heads, kv_heads, rope, gqa, scale
        self.embed = nn.Linear(5, E)
        self.q, self.o = nn.Linear(E, heads * HD), nn.Linear(heads * HD, E)
        self.k, self.v = nn.Linear(E, kv_heads * HD), nn.Linear(E, kv_heads * HD)
        self.head = nn.Linear(E, 3)

    def forward(self, inp):
        x = self.embed(inp)
        b, n, _ = x.shape
        q = self.q(x).view(b, n, -1, HD).transpose(1, 2)
        k = self.k(x).view(b, n, -1, HD).transpose(1, 2)
        v = self.v(x).view(b, n, -1, HD).transpose(1, 2)
        if self.rope:  # cos/sin over head_dim, as Hugging Face's apply_rotary_pos_emb
            pos = torch.arange(n, dtype=x.dtype)[:, None] * torch.arange(1, HD + 1, dtype=x.dtype)[None]
            cos, sin = pos.cos(), pos.sin()
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv
        extra = {}
        if rep > 1 and self.gqa == "repeat":
            k, v = repeat_kv(k, rep), repeat_kv(v, rep)
        elif rep > 1:
            extra["enable_gqa"] = True
        y = F.scaled_dot_product_attention(q, k, v, scale=HD**-0.5 if self.scale else None, **extra)
        y = y.transpose(1, 2).reshape(b, n, -1)
        return self.head(x + self.o(y))


class FusedAttention(nn.Module):
    """timm-style: one qkv projection reshaped with literal (3, heads, head_dim), unbind, SDPA's own scale."""

    def __init__(self):
        super().__init__()
        self.num_heads, self.head_dim = H, HD
        self.embed, self.qkv, self.proj, self.head = nn.Linear(5, E), nn.Linear(E, 3 * H * HD), nn.Linear(H * HD, E), \
            nn.Linear(E, 3)  # fmt: skip

    def forward(self, inp):
        x = self.embed(inp)
        b, n, _ = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, self.num_heads * self.head_dim)
        return self.head(x + self.proj(y))


X = torch.randn(1, 6, 5)


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("rope", [False, True], ids=["plain", "rope"])
def test_split_qkv_prunes_whole_heads(capture, rope):
    dg = prunefx.analyze(SplitAttention(rope=rope), X, capture=capture)
    g = _group(dg, "q")
    assert g.prunable and g.channels == H
    for name in ("q", "k", "v"):
        assert _pos(g, name) == _heads(H, HD)
    assert _pos(g, "o", "in") == _heads(H, HD)
    assert dg.groups_of("k") == [g] and dg.groups_of("v") == [g]
    # the stream (embed.out, o.out, q/k/v.in, head.in) is one separate group
    assert _group(dg, "embed") is _group(dg, "o") is _group(dg, "q", "in")


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("gqa", ["repeat", "sdpa"])
def test_gqa_couples_each_kv_head_with_its_query_heads(capture, gqa):
    """8 query heads, 4 KV heads: the unit is a KV group (1 KV head + its 2 query heads)."""
    dg = prunefx.analyze(SplitAttention(heads=8, kv_heads=4, gqa=gqa), X, capture=capture)
    g = _group(dg, "k")
    assert g.prunable and g.channels == 4
    assert _pos(g, "k") == _heads(4, HD) and _pos(g, "v") == _heads(4, HD)
    assert _pos(g, "q") == _heads(4, 2 * HD)  # query heads 2j and 2j + 1 read KV head j
    assert _pos(g, "o", "in") == _heads(4, 2 * HD)


@pytest.mark.parametrize("capture", CAPTURES)
def test_fused_qkv_prunes_heads_with_offsets(capture):
    dg = prunefx.analyze(FusedAttention(), X, capture=capture)
    g = _group(dg, "proj", "in")
    assert g.channels == H
    # head k: its q rows, its k rows (offset H*HD) and its v rows (offset 2*H*HD)
    want = tuple(tuple(p for part in range(3) for p in range(part * H * HD + k * HD, part * H * HD + (k + 1) * HD))
                 for k in range(H))  # fmt: skip
    assert tuple(tuple(sorted(p)) for p in _pos(g, "qkv")) == want
    assert _pos(g, "proj", "in") == _heads(H, HD)
    # the literal head count in both reshapes is a member: the module's forward hard-codes it
    assert {m.kind for m in g.members} >= {Kind.CONST}


def test_fused_qkv_literals_are_frozen_without_a_fixer_and_prune_with_one():
    """An attention whose forward writes the head count (``reshape(b, n, 3, self.num_heads, ...)``) is left alone
    with a reason naming the node and the module until a fixer that rewrites ``num_heads`` is registered."""
    model, x = FusedAttention(), X
    dg = prunefx.analyze(model, x)
    heads = _group(dg, "proj", "in")
    plan = prunefx.make_plan(dg, prunefx.score(model, dg, "l2").values, prunefx.PlanConfig(ratio=0.5, scope="local"))
    skipped = dict(plan.skipped)
    assert heads.id in skipped and "forward hard-codes this channel count" in skipped[heads.id]
    assert "node 'reshape" in skipped[heads.id]

    @register_fixer(FusedAttention, literals=True)
    def _fix(m, widths):
        m.num_heads = m.proj.weight.shape[1] // m.head_dim

    try:
        result = prunefx.prune(copy.deepcopy(model), x, prunefx.PlanConfig(ratio=0.5, scope="local"), criterion="l2")
        assert any(gp.group == heads.id and gp.after == H // 2 for gp in result.plan.pruned)
        assert result.model.num_heads == H // 2
        assert result.verified.ok and result.verified.exact, result.verified.message
    finally:
        del _FIXERS[FusedAttention]
        _OWNS_LITERALS.discard(FusedAttention)


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(5, E), nn.Linear(E, 3)
        self.gate, self.up, self.down = nn.Linear(E, 24, bias=False), nn.Linear(E, 24, bias=False), nn.Linear(24, E)

    def forward(self, inp):
        x = self.embed(inp)
        return self.head(x + self.down(F.silu(self.gate(x)) * self.up(x)))


@pytest.mark.parametrize("capture", CAPTURES)
def test_swiglu_gate_up_down_are_one_group(capture):
    dg = prunefx.analyze(SwiGLU(), X, capture=capture)
    g = _group(dg, "gate")
    assert g.prunable and g.channels == 24
    assert {(m.name, str(m.role)) for m in g.members if m.kind is Kind.MODULE} == {
        ("gate", "out"), ("up", "out"), ("down", "in")
    }


class TiedLM(nn.Module):
    """Token embedding and an output head sharing one weight (tie_word_embeddings)."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(20, E)
        self.mix = nn.Linear(E, E)
        self.lm_head = nn.Linear(E, 20, bias=False)
        self.lm_head.weight = self.tok.weight

    def forward(self, ids):
        x = self.tok(ids)
        return self.lm_head(x + self.mix(x))


@pytest.mark.parametrize("capture", CAPTURES)
def test_tied_embeddings_keep_the_stream_in_one_group_and_the_vocabulary_frozen(capture):
    ids = torch.randint(0, 20, (1, 6))
    dg = prunefx.analyze(TiedLM(), ids, capture=capture)
    stream = _group(dg, "tok")
    assert stream.prunable and stream.channels == E
    assert _group(dg, "lm_head", "in") is stream and _group(dg, "mix") is stream
    assert not _group(dg, "lm_head").prunable  # the vocabulary: model output and embedding rows
    # pruned together, the shared weight is sliced once and stays shared
    model = TiedLM()
    result = prunefx.prune(model, ids, prunefx.PlanConfig(ratio=0.5), criterion="l2", capture=capture)
    assert model.lm_head.weight is model.tok.weight and model.tok.weight.shape == (20, E // 2)
    assert result.verified.ok and result.verified.exact, result.verified.message


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize(
    "make", [lambda: SplitAttention(rope=True), lambda: SplitAttention(heads=8, kv_heads=4),
             lambda: SplitAttention(heads=8, kv_heads=4, gqa="sdpa"), SwiGLU],
    ids=["rope", "gqa-repeat", "gqa-sdpa", "swiglu"],
)  # fmt: skip
def test_pruned_attention_equals_the_masked_original(capture, make, claimed):
    torch.manual_seed(0)
    model = make().eval()
    if capture == "export":
        # torch.export turns repeat_kv's sizes (read from the tensor) into literals: the module's fixer claims them
        claimed(type(model))
    result = prunefx.prune(model, X, prunefx.PlanConfig(ratio=0.5, scope="local", ignore=("embed",)),
                           criterion="l2", capture=capture)  # fmt: skip
    assert result.plan.pruned and all("ignored" in why for _, why in result.plan.skipped), result.plan.skipped
    assert result.verified.ok and result.verified.exact, result.verified.message


@pytest.fixture
def claimed():
    """Register a fixer that claims a module type's literals (nothing to rewrite: they are read from tensors)."""
    types = []

    def claim(cls):
        register_fixer(cls, literals=True)(lambda m, widths: None)
        types.append(cls)

    yield claim
    for cls in types:
        del _FIXERS[cls]
        _OWNS_LITERALS.discard(cls)


def test_a_split_whose_both_factors_stay_free_prefers_the_heads():
    """No RoPE, a scale given: head_dim offsets could be pruned too, but heads (the batch dim of q.k^T) win;
    head_dim is frozen with the reason saying so."""
    dg = prunefx.analyze(SplitAttention(heads=2, kv_heads=2, scale=True), X, capture="fx")
    g = _group(dg, "q")
    assert g.channels == 2 and _pos(g, "q") == _heads(2, HD)


def test_plan_with_a_hand_made_keep_list_removes_the_chosen_heads():
    torch.manual_seed(0)
    model = SplitAttention().eval()
    original = copy.deepcopy(model)
    dg = prunefx.analyze(model, X)
    g = _group(dg, "q")
    plan = PruningPlan(dg.model_name, dg.fingerprint(), dg.input_shapes, "manual", {"ratio": 0.5},
                       (GroupPlan(g.id, H, 2, (1, 3), "manual"),))  # fmt: skip
    prunefx.apply_plan(model, dg, plan)
    keep = torch.tensor([r for h in (1, 3) for r in range(h * HD, (h + 1) * HD)])
    assert torch.equal(model.q.weight, original.q.weight[keep])
    assert torch.equal(model.o.weight, original.o.weight[:, keep])
    assert prunefx.verify(original, model, plan, X).ok
