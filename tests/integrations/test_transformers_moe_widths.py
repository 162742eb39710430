"""The second MoE axis and attention classes of any name: expert FFN widths through transformers' grouped_mm
dispatch, and heads of Llama-like attention classes without a listed layout (Qwen 3, Gemma 3, Granite)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import prunefx
from prunefx.integrations import transformers as pfx_hf
from prunefx.integrations.transformers.layouts import EXPERT_WIDTH_STEP

T = transformers
V = 64
BASE = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
MOE = {
    "mixtral": (lambda: T.MixtralConfig(**BASE, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2),
                "intermediate_size"),
    "qwen3_moe": (lambda: T.Qwen3MoeConfig(**BASE, head_dim=16, intermediate_size=128, moe_intermediate_size=96,
                                           num_experts=4, num_experts_per_tok=2), "moe_intermediate_size"),
    "olmoe": (lambda: T.OlmoeConfig(**BASE, intermediate_size=96, num_experts=4, num_experts_per_tok=2,
                                    eos_token_id=None, pad_token_id=None, bos_token_id=None), "intermediate_size"),
}


def _ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(seed))


def _masked(model, kept: dict[str, torch.Tensor]):
    """The original with every removed expert channel's down_proj column zeroed: the structure removed, by hand."""
    for name, keep in kept.items():
        experts = model.get_submodule(name)
        mask = torch.zeros(experts.down_proj.shape[-1], dtype=torch.bool)
        mask[keep] = True
        with torch.no_grad():
            experts.down_proj[..., ~mask] = 0
    return model


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(MOE))
def test_expert_ffn_widths_are_cut_exactly_and_the_config_reloads(name, tmp_path):
    make, field = MOE[name]
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(make()).eval()
    original = T.AutoModelForCausalLM.from_config(make()).eval()
    original.load_state_dict(model.state_dict())
    width = getattr(model.config, field)
    n0 = sum(p.numel() for p in model.parameters())
    before = {n: m.down_proj.detach().clone() for n, m in model.named_modules() if hasattr(m, "gate_up_proj")}
    result = pfx_hf.prune(model, _ids(), prunefx.PlanConfig(params=0.75))
    assert result.verified.ok
    new = getattr(model.config, field)
    assert new < width and new % EXPERT_WIDTH_STEP == 0  # grouped_mm's kernels want 16-byte rows
    assert sum(p.numel() for p in model.parameters()) / n0 == pytest.approx(0.75, abs=0.03)
    # independently of the oracle: which channels stayed, read off the weights, zeroed in the original
    kept = {}
    for n, m in model.named_modules():
        if hasattr(m, "gate_up_proj"):
            assert m.down_proj.shape[-1] == new
            cols = before[n].flatten(0, 1).T  # (I, E*H): one row per channel
            kept[n] = torch.tensor([int((cols == c).all(1).nonzero()[0]) for c in m.down_proj.flatten(0, 1).T])
    _masked(original, kept)
    with torch.no_grad():
        torch.testing.assert_close(model(_ids(1)).logits, original(_ids(1)).logits, rtol=1e-4, atol=1e-5)
    model.save_pretrained(tmp_path)  # the plain HF save: the config says the new width
    back = T.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(_ids(2)).logits, model(_ids(2)).logits)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("config", ["Qwen3Config", "Gemma3TextConfig", "GraniteConfig"])
def test_heads_of_llama_like_attention_classes_without_a_listed_layout(config, tmp_path):
    torch.manual_seed(0)
    cfg = getattr(T, config)(**{**BASE, "num_attention_heads": 8, "num_key_value_heads": 4}, intermediate_size=128,
                             head_dim=16)
    model = T.AutoModelForCausalLM.from_config(cfg).eval()
    result = pfx_hf.prune(model, _ids(), prunefx.PlanConfig(ratio=0.5))
    assert result.verified.ok
    attn = model.model.layers[0].self_attn
    assert model.config.num_key_value_heads < 4 and attn.k_proj.out_features == model.config.num_key_value_heads * 16
    assert model.config.num_attention_heads // model.config.num_key_value_heads == 2 == attn.num_key_value_groups
    model.save_pretrained(tmp_path)
    back = T.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(_ids(1)).logits, model(_ids(1)).logits)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_grouped_expert_matmuls_are_counted_and_the_estimate_follows_them():
    from prunefx.metrics import measure

    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(MOE["mixtral"][0]()).eval()
    ids = _ids()
    before = measure(model, (ids,)).macs
    result = pfx_hf.prune(model, ids, prunefx.PlanConfig(params=0.75))
    after = measure(model, (ids,)).macs
    # by hand: every token meets top_k experts, each 3 x hidden x width MACs (gate, up, down), in every layer
    tokens, k, hidden, layers = ids.numel(), 2, 64, 2
    cut = 128 - model.config.intermediate_size
    assert before - after == tokens * k * 3 * hidden * cut * layers  # only the experts' widths changed
    est = result.plan.estimate
    assert est["macs_after"] / est["macs_before"] == pytest.approx(after / before, rel=1e-3)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", list(MOE))
def test_plain_prune_keeps_expert_widths_the_grouped_mm_kernel_runs(name):
    """prunefx.prune, not only pfx_hf.prune, keeps the experts' FFN width a multiple of EXPERT_WIDTH_STEP (a width
    rule the transformers plugin registers): at 30% a free width (45 floats a row) broke torch._grouped_mm's
    16-byte rows on CPU, the check froze the expert groups and the experts kept their whole width."""
    make, _ = MOE[name]
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(make()).eval()
    widths = {n: m.down_proj.shape[-1] for n, m in model.named_modules() if hasattr(m, "gate_up_proj")}
    result = prunefx.prune(model, _ids(), prunefx.PlanConfig(ratio=0.3), criterion="l2")
    assert result.verified.accepted and not result.frozen_by_check, result.frozen_by_check  # OLMoE: inexact (q/k norms)
    for n, width in widths.items():
        new = result.model.get_submodule(n).down_proj.shape[-1]
        assert new < width and new % EXPERT_WIDTH_STEP == 0, (n, width, new)
