"""F.multi_head_attention_forward called from a model's own forward (open_clip's AttentionPool2d): the heads of
nn.MultiheadAttention bound to the weights it is passed, packed ``in_proj_weight`` or separate q/k/v projections.

head_dim is ``query.shape[-1] // num_heads`` and the q projection is square, so a head leaves with head_dim of the
query's channels: the query stream and the heads are one group whose unit is a head. ``num_heads`` is a literal of the
traced call (rewritten by ``graph_rewrite``, or by a fixer that claims it). Forms the rule does not map freeze what the
call touches, with the reason.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunefx
from prunefx.analysis.roles import IN, OUT, Kind, Literal, ParamDim
from prunefx.transform import register_fixer
from prunefx.transform.fixers import _FIXERS, _OWNS_LITERALS

H, HD, E, KV, L, N = 4, 4, 16, 12, 5, 2  # heads, head_dim, query width, key/value width, sequence, batch
X = (torch.randn(L, N, 5), torch.randn(7, N, 3))  # sequence-first, as the function takes them


class FunctionalAttention(nn.Module):
    """A stream (plus a positional embedding) into F.multi_head_attention_forward, then a head.

    ``packed``: self-attention through one ``in_proj_weight``, ``embed_dim_to_check`` a literal. ``separate``: the
    query from the stream, key and value from a memory of another width, q/k/v from three nn.Linear (the bias their
    concatenation, as AttentionPool2d), ``embed_dim_to_check`` read from the query.
    """

    def __init__(self, form: str, **call) -> None:
        super().__init__()
        self.form, self.call, self.num_heads = form, call, H
        self.embed = nn.Linear(5, E)
        self.pos = nn.Parameter(torch.randn(L, 1, E))
        if form == "packed":
            self.in_proj_weight = nn.Parameter(torch.randn(3 * E, E) / 4)
            self.in_proj_bias = nn.Parameter(torch.randn(3 * E))
        else:
            self.mem = nn.Linear(3, KV)
            self.q, self.k, self.v = nn.Linear(E, E), nn.Linear(KV, E), nn.Linear(KV, E)
        self.out = nn.Linear(E, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x, m):
        x = self.embed(x) + self.pos
        if self.form == "packed":
            kv, check, w, b = x, E, self.in_proj_weight, self.in_proj_bias
            sep = {}
        else:
            kv, check, w, b = self.mem(m), x.shape[-1], None, torch.cat([self.q.bias, self.k.bias, self.v.bias])
            sep = {"use_separate_proj_weight": True, "q_proj_weight": self.q.weight,
                   "k_proj_weight": self.k.weight, "v_proj_weight": self.v.weight}
        call = {"need_weights": False, **sep, **self.call}
        y, weights = F.multi_head_attention_forward(
            x, kv, kv, check, self.num_heads, w, b, call.pop("bias_k", None), call.pop("bias_v", None),
            call.pop("add_zero_attn", False), 0.0, self.out.weight, self.out.bias, training=self.training, **call)
        y = self.head(torch.relu(y))
        return (y, weights) if self.call.get("need_weights") else y  # fx traces weights as a value even when None


class Net(nn.Module):
    """The attention as a submodule, so the reasons name it."""

    def __init__(self, form: str, **call) -> None:
        super().__init__()
        self.attn = FunctionalAttention(form, **call)

    def forward(self, x, m):
        return self.attn(x, m)


def _positions(group, name: str, role) -> list[tuple[int, ...]]:
    (member,) = [m for m in group.members if m.name == name and m.role == role]
    return [tuple(sorted(p)) for p in member.positions]


def _head(h: int, blocks: int = 1) -> tuple[int, ...]:
    """Rows of head h in each of ``blocks`` stacked E-row blocks (q, k, v of a packed weight)."""
    return tuple(b * E + h * HD + j for b in range(blocks) for j in range(HD))


def _params(group) -> set[tuple[str, object]]:
    return {(m.name, m.role) for m in group.members if m.kind is Kind.PARAM}


@pytest.mark.parametrize("form", ["packed", "separate"])
def test_the_query_stream_and_the_heads_are_one_group_whose_unit_is_a_head(form):
    dg = prunefx.analyze(Net(form), X)
    stream = dg.group_of("attn.embed")
    assert stream.prunable and stream.exact and stream.channels == H
    assert any("one unit per head of attn" in c for c in stream.constraints)
    heads = [_head(h) for h in range(H)]
    assert _positions(stream, "attn.embed.weight", ParamDim(0)) == heads
    assert _positions(stream, "attn.pos", ParamDim(2)) == heads  # added to the stream: sliced with it
    assert _positions(stream, "attn.out.weight", ParamDim(1)) == heads
    # the literals of the call: num_heads (one per head) and, when literal, embed_dim_to_check (the query's width)
    consts = {(m.name, m.role, m.module_type) for m in stream.members if m.kind is Kind.CONST}
    literals = (4, 3) if form == "packed" else (4,)
    assert consts == {("multi_head_attention_forward", Literal((i,)), "attn") for i in literals}  # in attn's forward
    if form == "packed":
        assert _positions(stream, "attn.in_proj_weight", ParamDim(0)) == [_head(h, 3) for h in range(H)]
        assert _positions(stream, "attn.in_proj_weight", ParamDim(1)) == heads
        assert _positions(stream, "attn.in_proj_bias", ParamDim(0)) == [_head(h, 3) for h in range(H)]
    else:
        for p in ("q", "k", "v"):
            assert _positions(stream, f"attn.{p}.weight", ParamDim(0)) == heads
        assert _positions(stream, "attn.q.weight", ParamDim(1)) == heads
        assert _positions(stream, "attn.q.bias", ParamDim(0)) == heads  # its slice of the concatenated bias
        assert _positions(stream, "attn.v.bias", ParamDim(0)) == heads
        assert {m.name for m in stream.members if m.kind is Kind.MODULE and m.role == OUT} >= {
            "attn.q", "attn.k", "attn.v"}  # the Linear layers read, not called, follow their weights
        memory = dg.group_of("attn.mem")  # key and value: an ordinary group of their own width
        assert memory.prunable and memory.channels == KV
        assert _params(memory) >= {("attn.k.weight", ParamDim(1)), ("attn.v.weight", ParamDim(1)),
                                   ("attn.mem.weight", ParamDim(0))}
        assert {(m.name, m.role) for m in memory.members if m.kind is Kind.MODULE} >= {("attn.k", IN), ("attn.v", IN)}
    out = dg.group_of("attn.out")  # out_proj's rows are the output's channels
    assert out.prunable and out.channels == 6
    assert _params(out) == {("attn.out.weight", ParamDim(0)), ("attn.out.bias", ParamDim(0)),
                            ("attn.head.weight", ParamDim(1))}
    # the sequence positions of the positional embedding stay, with the reason
    frozen = [g for g in dg.groups if ("attn.pos", ParamDim(0)) in _params(g)]
    assert len(frozen) == 1 and not frozen[0].prunable and frozen[0].channels == L


@pytest.mark.parametrize("form", ["packed", "separate"])
def test_pruned_heads_equal_the_masked_original_with_the_graph_rewritten(form):
    torch.manual_seed(0)
    model = Net(form).eval()
    dg = prunefx.analyze(model, X)
    stream = dg.group_of("attn.embed")
    result = prunefx.prune(copy.deepcopy(model), X, prunefx.PlanConfig(ratio=0.5, scope="local", graph_rewrite=True),
                           criterion="l2")
    (gp,) = [gp for gp in result.plan.pruned if gp.group == stream.id]
    assert gp.after == H // 2
    assert result.verified.ok and result.verified.exact and result.verified.max_rel_error <= 1e-5, \
        result.verified.message
    (call,) = [n for n in result.model.graph.nodes if n.target is F.multi_head_attention_forward]
    assert call.args[4] == H // 2  # num_heads rewritten; head_dim stays
    assert (call.args[3] == (H // 2) * HD) if form == "packed" else not isinstance(call.args[3], int)
    attn = result.model.attn
    assert attn.pos.shape == (L, 1, (H // 2) * HD) and attn.out.weight.shape[1] == (H // 2) * HD
    with torch.no_grad():  # the oracle is not blind: one changed weight inside a kept head is caught
        attn.out.weight[:, 0] += 1.0
    assert not prunefx.verify(model, result.model, result.plan, X).ok


def test_the_head_count_is_hard_coded_until_a_fixer_claims_it():
    """Without graph_rewrite the heads are skipped with the reason; a fixer that re-derives ``num_heads`` from the
    sliced weights prunes them in the module itself, its attribute and its positional embedding consistent."""
    torch.manual_seed(0)
    model = Net("separate").eval()
    dg = prunefx.analyze(model, X)
    stream = dg.group_of("attn.embed")
    plan = prunefx.make_plan(dg, prunefx.score(model, dg, "l2").values, prunefx.PlanConfig(ratio=0.5, scope="local"))
    skipped = dict(plan.skipped)
    assert "forward hard-codes this channel count" in skipped[stream.id]
    assert "node 'multi_head_attention_forward' in attn" in skipped[stream.id]

    @register_fixer(FunctionalAttention, literals=True)
    def _fix(m, widths):
        m.num_heads = m.q.weight.shape[0] // HD

    try:
        result = prunefx.prune(copy.deepcopy(model), X, prunefx.PlanConfig(ratio=0.5, scope="local"), criterion="l2")
        assert any(gp.group == stream.id and gp.after == H // 2 for gp in result.plan.pruned)
        attn = result.model.attn
        assert type(result.model) is Net and attn.num_heads == H // 2
        assert attn.pos.shape[-1] == attn.q.in_features == attn.q.out_features == (H // 2) * HD
        assert result.verified.ok and result.verified.exact, result.verified.message
    finally:
        del _FIXERS[FunctionalAttention]
        _OWNS_LITERALS.discard(FunctionalAttention)


@pytest.mark.parametrize(("call", "why"), [
    ({"add_zero_attn": True}, "not supported: add_zero_attn is not False"),
    ({"bias_k": torch.zeros(1, 1, E), "bias_v": torch.zeros(1, 1, E)}, "not supported: bias_k is given"),
    ({"static_k": torch.zeros(N * H, 7, HD)}, "not supported: static_k is given"),
])  # fmt: skip
def test_an_unsupported_form_freezes_what_the_call_touches_with_the_reason(call, why):
    dg = prunefx.analyze(Net("separate", **call), X)
    touched = [("attn.embed.weight", 0), ("attn.mem.weight", 0),  # the streams, and every dim of every weight passed
               *((f"attn.{p}.weight", d) for p in ("q", "k", "v", "out") for d in (0, 1))]
    for name, d in touched:
        (g,) = [g for g in dg.groups if (name, ParamDim(d)) in _params(g)]
        assert not g.prunable and g.reasons[0].startswith(f"F.multi_head_attention_forward in 'attn': {why}"), \
            (name, d, g.reasons)


@pytest.mark.parametrize(("call", "why"), [
    ({"need_weights": True}, "its attention weights are used (need_weights=True)"),
    ({"attn_mask": torch.zeros(N * H, L, 7)}, "a 3-D attn_mask holds one mask per head"),
])  # fmt: skip
def test_heads_that_cannot_leave_freeze_the_query_stream_with_them(call, why):
    dg = prunefx.analyze(Net("separate", **call), X)
    stream = dg.group_of("attn.embed")
    assert not stream.prunable and any(why in r for r in stream.reasons), stream.reasons
    assert dg.group_of("attn.mem").prunable and dg.group_of("attn.out").prunable  # the rest is still mapped
