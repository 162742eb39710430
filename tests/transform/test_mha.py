"""nn.MultiheadAttention heads: one group per layer (exact rows / columns), pruned -> PrunedMultiheadAttention,
the oracle (stock layer with the heads' weights zeroed) passes; what cannot be exact is frozen with a reason; the
torch.nn Transformer layers built on it are traced through."""

import copy

import pytest
import torch
import torchvision
from torch import nn

import prunefx
from prunefx.analysis.roles import IN, Kind, ParamDim
from prunefx.metrics import measure
from prunefx.plan import PlanConfig, make_plan
from prunefx.transform import PrunedMultiheadAttention
from prunefx.transform.rewrite import apply_plan
from prunefx.verify import verify


class Net(nn.Module):
    """Self-attention (fused in_proj, weights returned but unused) and cross-attention with kdim / vdim."""

    def __init__(self, batch_first: bool, **kw) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.att = nn.MultiheadAttention(32, 4, batch_first=batch_first, **kw)
        self.mem = nn.Linear(8, 24)
        self.cross = nn.MultiheadAttention(32, 4, kdim=24, vdim=24, batch_first=batch_first, **kw)
        self.fc = nn.Linear(32, 5)

    def forward(self, x, m):
        h = self.inp(x)
        a, _ = self.att(h, h, h)
        h = h + a
        mm = self.mem(m)
        c, _ = self.cross(h, mm, mm, need_weights=False)
        return self.fc(h + c)


def _inputs(batch_first: bool):
    x, m = torch.randn(2, 6, 8), torch.randn(2, 7, 8)
    return (x, m) if batch_first else (x.transpose(0, 1), m.transpose(0, 1))


def _positions(group, name: str, role) -> list[tuple[int, ...]]:
    (member,) = [m for m in group.members if m.name == name and m.role == role]
    return list(member.positions)


def _head_rows(h: int, hd: int = 8, blocks: int = 1, width: int = 32) -> tuple[int, ...]:
    return tuple(r for b in range(blocks) for r in range(b * width + h * hd, b * width + (h + 1) * hd))


def test_heads_are_groups_with_exact_rows_and_columns():
    torch.manual_seed(0)
    model = Net(batch_first=True).eval()
    dg = prunefx.analyze(model, _inputs(True))
    att = dg.group_of("att.out_proj", IN)
    assert att.prunable and att.exact and att.channels == 4
    assert any("one unit per head of att" in c for c in att.constraints)
    for h in range(4):  # head h: its 8 rows in each of q, k, v (fused) and its 8 input columns of out_proj
        assert _positions(att, "att.in_proj_weight", ParamDim(0))[h] == _head_rows(h, blocks=3)
        assert _positions(att, "att.in_proj_bias", ParamDim(0))[h] == _head_rows(h, blocks=3)
        assert _positions(att, "att.out_proj.weight", ParamDim(1))[h] == _head_rows(h)
    cross = dg.group_of("cross.out_proj", IN)
    assert cross.prunable and cross.channels == 4
    for p in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
        assert [_positions(cross, f"cross.{p}", ParamDim(0))[h] for h in range(4)] == [_head_rows(h) for h in range(4)]
    # the embedding dims are ordinary channels: the residual stream meets in_proj's columns and out_proj's rows
    stream = dg.group_of("inp")
    names = {(m.name, m.role) for m in stream.members if m.kind is Kind.PARAM}
    assert {("att.in_proj_weight", ParamDim(1)), ("att.out_proj.weight", ParamDim(0)),
            ("cross.q_proj_weight", ParamDim(1)), ("cross.out_proj.bias", ParamDim(0))} <= names
    memory = dg.group_of("mem")
    assert {(m.name, m.role) for m in memory.members if m.kind is Kind.PARAM} >= {
        ("cross.k_proj_weight", ParamDim(1)), ("cross.v_proj_weight", ParamDim(1))}


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("extras", [{}, {"add_bias_kv": True, "add_zero_attn": True}], ids=["plain", "bias_kv"])
def test_pruned_heads_equal_the_masked_original(batch_first, extras):
    torch.manual_seed(0)
    model = Net(batch_first, **extras).eval()
    x = _inputs(batch_first)
    dg = prunefx.analyze(model, x)
    plan = make_plan(dg, prunefx.score(model, dg, "l2"), PlanConfig(ratio=0.5, scope="local", ignore=("inp",)))
    assert {dg.groups[g.group].label.split()[0] for g in plan.pruned} >= {"att.out_proj", "cross.out_proj"}
    pruned = apply_plan(copy.deepcopy(model), dg, plan)
    for name in ("att", "cross"):
        layer = pruned.get_submodule(name)
        assert type(layer) is PrunedMultiheadAttention and layer.num_heads == 2 and layer.head_dim == 8
        assert layer.out_proj.in_features == 16 and layer.out_proj.out_features == 32
    assert pruned.cross.kdim == pruned.cross.vdim == 12  # mem's width, pruned with it
    result = verify(model, pruned, plan, x, dg=dg)
    assert result.ok and result.exact and result.max_rel_error <= 1e-5, result.message
    with torch.no_grad():  # the oracle is not blind: one changed weight inside a kept head is caught
        pruned.cross.v_proj_weight[0, 0] += 1.0
    assert not verify(model, pruned, plan, x, dg=dg).ok


@pytest.mark.parametrize("case", ["self", "cross", "unbatched", "masks", "causal", "bias_kv"])
def test_pruned_forward_equals_the_stock_forward(case):
    """Unpruned, the swapped class computes what the stock layer computes, for every argument it takes."""
    torch.manual_seed(0)
    kw = {"kdim": 6, "vdim": 5} if case == "cross" else {}
    if case == "bias_kv":
        kw = {"add_bias_kv": True, "add_zero_attn": True}
    stock = nn.MultiheadAttention(16, 4, batch_first=case != "unbatched", **kw).eval()
    mine = copy.deepcopy(stock)
    mine.__class__ = PrunedMultiheadAttention
    q = torch.randn(3, 5, 16) if case != "unbatched" else torch.randn(5, 16)
    k = torch.randn(3, 7, 6) if case == "cross" else q
    v = torch.randn(3, 7, 5) if case == "cross" else q
    calls = [{}, {"need_weights": False}, {"average_attn_weights": False}]
    if case in ("masks", "bias_kv"):
        pad = torch.zeros(3, 5)
        pad[:, -1] = float("-inf")  # the last key is padding (a float mask, like attn_mask)
        calls = [{"key_padding_mask": pad, "attn_mask": torch.randn(5, 5)},
                 {"key_padding_mask": pad, "need_weights": False},
                 {"attn_mask": torch.randn(12, 5, 5), "need_weights": False}]
    if case == "causal":
        causal = nn.Transformer.generate_square_subsequent_mask(5)
        calls = [{"attn_mask": causal, "is_causal": True, "need_weights": False}, {"attn_mask": causal}]
    for call in calls:
        for grad in (False, True):  # no_grad takes the stock fast path where it applies
            with torch.set_grad_enabled(grad):
                a, wa = stock(q, k, v, **call)
                b, wb = mine(q, k, v, **call)
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
            assert (wa is None) == (wb is None)
            if wa is not None:
                torch.testing.assert_close(wb, wa, atol=1e-5, rtol=1e-4)


class _Weights(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(16, 4, batch_first=True)

    def forward(self, x):
        out, w = self.att(x, x, x)
        return out.mean(1) + w.sum()


class _HeadMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(16, 4, batch_first=True)
        self.register_buffer("mask", torch.zeros(2 * 4, 5, 5))

    def forward(self, x):
        return self.att(x, x, x, attn_mask=self.mask, need_weights=False)[0]


class _Sub(nn.MultiheadAttention):
    pass


class _Subclassed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.att = _Sub(16, 4, batch_first=True)

    def forward(self, x):
        return self.att(self.fc(x), x, x, need_weights=False)[0]


@pytest.mark.parametrize(("net", "why"), [
    (_Weights, "its attention weights are used (need_weights=True)"),
    (_HeadMask, "a 3-D attn_mask holds one mask per head"),
])
def test_heads_frozen_with_the_reason_naming_the_module(net, why):
    dg = prunefx.analyze(net(), torch.randn(2, 5, 16))
    heads = dg.group_of("att.out_proj", IN)
    assert not heads.prunable
    assert any(r.startswith(f"nn.MultiheadAttention 'att': {why}") for r in heads.reasons), heads.reasons


def test_a_subclass_keeps_its_widths_frozen():
    # traced through, its functional forward's rule ties fc (the query) to key and value, the model's input, through
    # in_proj_weight's columns; made a leaf, the rule cannot give it the pruned forward
    traced = prunefx.analyze(_Subclassed(), torch.randn(2, 5, 16))
    assert traced.group_of("fc").reasons[0].startswith(
        "F.multi_head_attention_forward in 'att': query, key and value share in_proj_weight's columns")
    leaf = prunefx.analyze(_Subclassed(), torch.randn(2, 5, 16), leaves=["att"])
    assert not leaf.group_of("fc").prunable
    assert "nn.MultiheadAttention 'att' is a subclass (_Sub)" in leaf.group_of("fc").reasons[0]


def _small_vit() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=2, num_heads=4,
                                                hidden_dim=64, mlp_dim=128).eval()


def test_small_vit_heads_pruned_at_30_percent_verified_counted_and_reloaded(tmp_path):
    model = _small_vit()
    original = copy.deepcopy(model)
    x = torch.randn(2, 3, 32, 32)
    result = prunefx.prune(model, x, PlanConfig(ratio=0.3, scope="local"), criterion="l2")
    assert result.verified.ok and result.verified.exact, result.verified.message
    heads = [g for g in result.plan.pruned if "self_attention" in result.graph.groups[g.group].label]
    assert len(heads) == 2 and all(len(g.keep) == 3 for g in heads)  # 4 heads -> 3 in both layers
    layer = result.model.encoder.layers[0].self_attention
    assert type(layer) is PrunedMultiheadAttention and layer.num_heads == 3
    assert isinstance(layer, nn.MultiheadAttention)
    # MACs of the pruned attention are counted: 10 tokens, width 64, 3 heads of 16, MLP 128 -> kept
    mlp = [len(g.keep) for g in result.plan.pruned if "mlp" in result.graph.groups[g.group].label]
    tokens, before, after = 2 * 5, measure(original, x).macs, measure(result.model, x).macs
    attn = lambda h: tokens * 64 * 3 * 16 * h + tokens * 16 * h * 64 + 2 * 2 * h * 5 * 5 * 16  # noqa: E731
    assert before - after == 2 * (attn(4) - attn(3)) + sum(2 * tokens * 64 * (128 - k) for k in mlp)
    assert result.plan.estimate["macs_after"] == pytest.approx(after, rel=1e-9)  # the cost model sees the heads
    path = prunefx.save(result.model, result.plan, tmp_path / "vit.pt")
    back = prunefx.load(path, lambda: _small_vit()).eval()
    assert type(back.encoder.layers[1].self_attention) is PrunedMultiheadAttention
    with torch.no_grad():
        torch.testing.assert_close(back(x), result.model(x), atol=0, rtol=0)


@pytest.mark.slow
def test_vit_b_16_heads_pruned_at_30_percent_pass_the_oracle():
    model = torchvision.models.vit_b_16(weights=None).eval()
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision zero-initialises the head
    x = torch.randn(1, 3, 224, 224)
    params = sum(p.numel() for p in model.parameters())
    result = prunefx.prune(model, x, PlanConfig(ratio=0.3, scope="local"), criterion="l2")
    assert result.verified.ok and result.verified.exact, result.verified.message
    heads = [g for g in result.plan.pruned if "self_attention" in result.graph.groups[g.group].label]
    assert len(heads) == 12 and all(len(g.keep) == 9 for g in heads)  # 12 heads -> 9 in every layer
    assert sum(p.numel() for p in result.model.parameters()) < params


class _Shared(nn.Module):
    """One attention layer called twice, its query straight from the model input the second time."""

    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(16, 4, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        a = self.att(x, x, x, need_weights=False)[0]
        b = self.att(a, a, a, need_weights=False)[0]
        return self.fc(a + b)


def test_a_layer_called_twice_shares_its_heads_and_a_pruned_model_prunes_again():
    torch.manual_seed(0)
    model, x = _Shared().eval(), torch.randn(2, 5, 16)
    dg = prunefx.analyze(model, x)
    (heads,) = [g for g in dg.groups if any("one unit per head of att" in c for c in g.constraints)]
    assert heads.prunable and heads.channels == 4  # both calls' heads are the same 4 units
    assert not dg.group_of("fc", IN).prunable  # the first call reads in_proj's columns from the model input
    result = prunefx.prune(model, x, PlanConfig(ratio=0.5, scope="local"), criterion="l2")
    assert result.verified.ok and model.att.num_heads == 2, result.verified.message
    assert result.frozen_by_check == ()  # the analysis knew: nothing had to be undone after the oracle
    again = prunefx.prune(model, x, PlanConfig(ratio=0.5, scope="local"), criterion="l2")  # the pruned class
    assert again.verified.ok and type(model.att) is PrunedMultiheadAttention and model.att.num_heads == 1


class _Seq2Seq(nn.Module):
    """nn.Transformer (encoder self-attention, decoder self- and cross-attention) with causal and padding masks."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 32), nn.Linear(8, 32)
        self.t = nn.Transformer(32, 4, 1, 1, 64, batch_first=True)
        self.t.encoder.use_nested_tensor = False  # FLOP counting cannot read nested tensors' sizes
        self.fc = nn.Linear(32, 3)

    def forward(self, x, y, pad):
        causal = nn.Transformer.generate_square_subsequent_mask(y.shape[1])
        return self.fc(self.t(self.a(x), self.b(y), tgt_mask=causal, src_key_padding_mask=pad))


def test_transformer_layers_are_traced_through_and_their_heads_pruned():
    torch.manual_seed(0)
    model = _Seq2Seq().eval()
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, -2:] = True
    x = (torch.randn(2, 6, 8), torch.randn(2, 5, 8), pad)
    dg = prunefx.analyze(model, x)
    heads = [g for g in dg.groups if any(c.startswith("one unit per head of t.") for c in g.constraints)]
    assert len(heads) == 3 and all(g.prunable and g.exact and g.channels == 4 for g in heads)
    result = prunefx.prune(model, x, PlanConfig(ratio=0.5, scope="local", ignore=("a", "b")), criterion="l2")
    assert result.verified.ok and result.verified.exact and result.frozen_by_check == (), result.verified.message
    layer = model.t.encoder.layers[0]
    assert type(layer.self_attn) is PrunedMultiheadAttention and layer.self_attn.num_heads == 2
    assert layer.activation_relu_or_gelu == 0  # the fused inference path (stock head layout) is off
    with torch.no_grad():  # eval + no_grad is where nn.TransformerEncoderLayer would take it
        assert model(*x).shape == (2, 5, 3)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("scope", ["global", "local"])
def test_plan_estimates_the_macs_the_pruned_attention_costs(batch_first, scope):
    """The planner's MAC model splits an attention layer by what each part scales with (q projection: input x
    heads; k/v: key x heads; out_proj: heads x output; QK^T and AV: heads alone), so a MACs target is met: the
    pruned model's counted MACs are the plan's estimate (one product over all of them missed by 0.2 at 0.5)."""
    torch.manual_seed(0)
    model = Net(batch_first=batch_first).eval()
    x = _inputs(batch_first)
    base = measure(model, x).macs
    r = prunefx.prune(copy.deepcopy(model), x, PlanConfig(flops=0.5, scope=scope), criterion="l2")
    assert r.verified.ok
    est = r.plan.estimate["macs_after"] / r.plan.estimate["macs_before"]
    assert measure(r.model, x).macs / base == pytest.approx(est, abs=1e-6)
    assert abs(est - 0.5) < 0.02
