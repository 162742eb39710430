"""PEFT LoRA on a Hugging Face Llama, and torch.cat's skipping of 1-D empty tensors (a KV cache's first step)."""

from __future__ import annotations

import pytest
import torch
from _graph_checks import the_group
from torch import nn

import prunefx


class EmptyCat(nn.Module):
    """A cache that starts as ``torch.tensor([])``: torch.cat skips it, whatever the other pieces' rank."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv1d(3, 8, 1), nn.Conv1d(8, 5, 1)

    def forward(self, x):
        return self.b(torch.cat((torch.tensor([]), self.a(x)), dim=-2))


def test_a_1d_empty_tensor_in_cat_is_skipped() -> None:
    dg = prunefx.analyze(EmptyCat(), (torch.randn(2, 3, 6),))
    g = the_group(dg, "a")
    assert g.prunable and g.exact and g is the_group(dg, "b", "in") and g.channels == 8
    result = prunefx.prune(EmptyCat().eval(), torch.randn(2, 3, 6), prunefx.PlanConfig(ratio=0.5), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert result.model.b.in_channels == result.model.a.out_channels == 4


def _lora_llama(use_cache: bool = True) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128, use_cache=use_cache)
    model = peft.get_peft_model(transformers.LlamaForCausalLM(cfg),
                                peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: the adapter would add nothing for the check to see
            nn.init.normal_(p, std=0.05)
    return model.eval()


ATTN = "base_model.model.model.layers.{}.self_attn."


def test_lora_llama_analyses_with_adapters_in_the_groups_of_their_layers() -> None:
    # crashed with IndexError in the cat rule: the KV cache's first update is cat((tensor([]), k), dim=-2)
    dg = prunefx.analyze(_lora_llama(), (torch.randint(0, 128, (1, 8)),))
    for i in range(2):
        a = ATTN.format(i)
        heads = the_group(dg, a + "q_proj.base_layer")
        # the adapter's output is added to its layer's: one group, the KV-head units of k_proj with them
        assert heads.prunable and heads is the_group(dg, a + "q_proj.lora_B.default")
        assert heads is the_group(dg, a + "v_proj.lora_B.default") is the_group(dg, a + "k_proj")
        for proj in ("q_proj", "v_proj"):  # the LoRA rank: lora_A's outputs are lora_B's inputs, nothing else
            rank = the_group(dg, a + f"{proj}.lora_A.default")
            assert rank.prunable and rank.exact and rank.channels == 4
            assert rank is the_group(dg, a + f"{proj}.lora_B.default", "in")
    assert not dg.unknown_ops


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_pruned_lora_llama_equals_the_masked_original(use_cache: bool) -> None:
    # use_cache=True (the config's default) stopped prune at the check: a PeftModel is no PreTrainedModel, so fx
    # traced the cache and kept the DynamicCache (holding proxies) as a graph constant that cannot be deep-copied
    model = _lora_llama(use_cache=use_cache)
    ids = torch.randint(0, 128, (1, 8))
    # the hidden stream passes RMSNorm (never exact): left alone, so every pruned group must match exactly
    result = prunefx.prune(model, (ids,), prunefx.PlanConfig(ratio=0.4, ignore=("*embed_tokens",)), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    layers = result.model.base_model.model.model.layers
    assert any(layer.mlp.up_proj.out_features < 128 for layer in layers)
    for layer in layers:
        q = layer.self_attn.q_proj
        assert q.lora_A["default"].out_features == q.lora_B["default"].in_features <= 4
        assert q.lora_B["default"].out_features == q.base_layer.out_features
    assert result.model(ids).logits.shape == (1, 8, 128)
    # the capture turned the cache off only while it ran: the user's config and the pruned model's are as given
    assert model.config.use_cache is use_cache and model.get_base_model().config.use_cache is use_cache
    assert result.model.get_base_model().config.use_cache is use_cache


class Wrapped(nn.Module):
    """A user's module holding a Hugging Face Llama (no PreTrainedModel itself), called with the config's cache."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids).logits


def test_any_module_wrapping_a_pretrained_model_is_captured_without_the_cache() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128)
    assert cfg.use_cache
    model, ids = Wrapped(transformers.LlamaForCausalLM(cfg)).eval(), torch.randint(0, 128, (1, 8))
    result = prunefx.prune(model, (ids,), prunefx.PlanConfig(ratio=0.4, ignore=("*embed_tokens",)), criterion="l1")
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert any(layer.mlp.up_proj.out_features < 128 for layer in result.model.lm.model.layers)
    assert model.lm.config.use_cache is True and result.model.lm.config.use_cache is True
