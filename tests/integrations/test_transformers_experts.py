"""Expert pruning of Hugging Face MoE models: the pruned model equals the original whose routers give the removed
experts a logit of -inf, the config counts follow, and ``save_pretrained`` / ``from_pretrained`` round-trips."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from prunefx.errors import PrunefxError, VerificationError
from prunefx.integrations import transformers as pfx_hf
from prunefx.integrations.transformers import experts as pfx_experts

T = transformers
V = 64
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
CONFIGS = {
    "mixtral": (lambda: T.MixtralConfig(**BASE, num_local_experts=8, num_experts_per_tok=2), "num_local_experts"),
    "qwen3_moe": (lambda: T.Qwen3MoeConfig(**BASE, head_dim=8, moe_intermediate_size=16, num_experts=8,
                                           num_experts_per_tok=2), "num_experts"),
    "olmoe": (lambda: T.OlmoeConfig(**BASE, num_experts=8, num_experts_per_tok=2), "num_experts"),
    "qwen2_moe": (lambda: T.Qwen2MoeConfig(**BASE, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                                           shared_expert_intermediate_size=32), "num_experts"),
}


def _model(name: str):
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(CONFIGS[name][0]()).eval()


def _calibration():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, V, (2, 16), generator=g) for _ in range(2)]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_removed_experts_equal_masked_routers_and_reload(name, tmp_path):
    model = _model(name)
    cal = _calibration()
    stacked = sum(p.numel() for x in pfx_experts.moe_layers(model) for p in model.get_submodule(x.experts).parameters())
    total = sum(p.numel() for p in model.parameters())
    result = pfx_hf.prune_experts(model, cal, keep=0.5)
    assert result.verified.ok and not result.warnings
    # a token runs through top_k = 2 experts per layer: 2 of 8 of the stacked expert weights, then 2 of the 4 left
    # (the router lost its removed experts' rows too: counted in the parameters after)
    after = sum(p.numel() for p in model.parameters())
    assert result.active_params == (total - stacked * 6 // 8, after - stacked // 4)
    assert getattr(model.config, CONFIGS[name][1]) == 4
    for layer in pfx_experts.moe_layers(model):
        assert layer.num_experts == 4
        assert model.get_submodule(layer.router).weight.shape[0] == 4
    model.save_pretrained(tmp_path)
    back = T.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(cal[0]).logits, model(cal[0]).logits, rtol=1e-5, atol=1e-5)
    assert model.generate(cal[0][:1], max_new_tokens=3, do_sample=False, pad_token_id=0).shape == (1, 19)


def test_a_wrong_slice_fails_the_check_and_puts_the_experts_back(monkeypatch):
    model = _model("mixtral")
    cal = _calibration()
    with torch.no_grad():
        before = model(cal[0]).logits
    real = pfx_experts._slice

    def shifted(m, layers, plan):  # keeps the right number of experts, but the wrong ones
        real(m, layers, type(plan)(tuple((p, tuple((i + 1) % 8 for i in k)) for p, k in plan.keep), plan.scores,
                                   plan.criterion))

    monkeypatch.setattr(pfx_experts, "_slice", shifted)
    with pytest.raises(VerificationError, match="experts are back"):
        pfx_hf.prune_experts(model, cal, keep=0.5)
    assert model.config.num_local_experts == 8
    with torch.no_grad():
        torch.testing.assert_close(model(cal[0]).logits, before)


def test_a_cut_whose_model_fails_its_default_call_puts_the_experts_back(monkeypatch):
    """The oracle runs without the KV cache; the model the user gets must still run its default call (cache on)."""
    model = _model("mixtral")
    cal = _calibration()
    real = pfx_experts._slice

    def misnumbered(m, layers, plan):  # the right experts, but a layer's KV-cache index left wrong
        real(m, layers, plan)
        m.model.layers[1].self_attn.layer_idx = 5

    monkeypatch.setattr(pfx_experts, "_slice", misnumbered)
    with pytest.raises(VerificationError, match=r"the experts are back: the pruned model fails its default call on "
                                                r"the example inputs \(IndexError"):
        pfx_hf.prune_experts(model, cal, keep=0.5)
    assert model.config.num_local_experts == 8
    assert all(x.num_experts == 8 for x in pfx_experts.moe_layers(model))


def _routed(model, cal):
    """Per MoE layer, what its experts module was called with: (hidden, top_k_index, top_k_weights) per batch."""
    seen = {x.path: [] for x in pfx_experts.moe_layers(model)}
    hooks = [model.get_submodule(x.experts).register_forward_pre_hook(
        lambda m, args, p=x.path: seen[p].append(tuple(a.detach() for a in args[:3])))
        for x in pfx_experts.moe_layers(model)]
    with torch.no_grad():
        for ids in cal:
            model(ids, use_cache=False)
    for h in hooks:
        h.remove()
    return seen


def test_scores_are_routing_mass_reap_saliency_and_contribution():
    model = _model("mixtral")
    cal = _calibration()
    layers = pfx_experts.moe_layers(model)
    batches = [((ids,), None) for ids in cal]
    freq = pfx_experts._routing(model, layers, batches, "frequency")
    reap = pfx_experts._routing(model, layers, batches, "reap")
    contribution = pfx_experts._routing(model, layers, batches, "contribution")
    for x in layers:
        experts = model.get_submodule(x.experts)
        mass, sal, count = torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64), torch.zeros(8)
        for hidden, index, weight in _routed(model, cal)[x.path]:
            for t in range(hidden.shape[0]):
                for slot in range(index.shape[1]):
                    j, w = int(index[t, slot]), float(weight[t, slot])
                    gate, up = F.linear(hidden[t], experts.gate_up_proj[j]).chunk(2, dim=-1)
                    out = F.linear(F.silu(gate) * up, experts.down_proj[j])
                    mass[j] += w
                    sal[j] += w * out.double().norm()
                    count[j] += 1
        torch.testing.assert_close(freq[x.path], mass, rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(reap[x.path], sal / count.clamp(min=1), rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(contribution[x.path], sal, rtol=1e-4, atol=1e-9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(experts=1), "top_k=2"),
    (dict(keep=0.0), "no fraction of the experts"),
    (dict(keep=0.5, experts=4), "give one expert target"),
    (dict(keep=0.5, criterion="magic"), "unknown expert criterion"),
])
def test_bad_expert_targets_are_one_clear_error(kwargs, match):
    model = _model("qwen3_moe")
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(PrunefxError, match=match):
        pfx_hf.prune_experts(model, _calibration(), **kwargs)
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_a_dense_model_has_no_moe_layer():
    model = T.AutoModelForCausalLM.from_config(T.LlamaConfig(**BASE)).eval()
    with pytest.raises(PrunefxError, match="no MoE layer"):
        pfx_hf.prune_experts(model, _calibration(), keep=0.5)


def test_given_scores_decide_which_experts_stay():
    model = _model("olmoe")
    layers = pfx_experts.moe_layers(model)
    mine = {x.path: [float(i % 3) for i in range(8)] for x in layers}  # experts 2 and 5 score highest
    result = pfx_hf.prune_experts(model, _calibration(), experts=2, scores=mine)
    assert result.verified.ok and result.plan.criterion == "given"
    assert all(kept == (2, 5) for _, kept in result.plan.keep)
    with pytest.raises(PrunefxError, match="one score per expert"):
        pfx_hf.prune_experts(_model("olmoe"), _calibration(), experts=2, scores={layers[0].path: [1.0]})
