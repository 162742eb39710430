"""Depth pruning of Hugging Face decoders: removed layers leave the layer list and the config, the result equals the
original with those layers' residual branches zeroed (the oracle), reloads through ``from_pretrained`` and generates
with its KV cache as without it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

transformers = pytest.importorskip("transformers")

import prunefx
import prunefx.depth
from prunefx.errors import PrunefxError, VerificationError
from prunefx.integrations import transformers as pfx_hf

T = transformers
V = 64
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2)
CONFIGS = {
    "llama": lambda: T.LlamaConfig(**BASE),
    "qwen3": lambda: T.Qwen3Config(**BASE, head_dim=8),
    "gemma3": lambda: T.Gemma3TextConfig(**{**BASE, "num_hidden_layers": 6}, head_dim=8, sliding_window=4),
    "mixtral": lambda: T.MixtralConfig(**BASE, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": lambda: T.Qwen3MoeConfig(**BASE, head_dim=8, moe_intermediate_size=16, num_experts=4,
                                          num_experts_per_tok=2, mlp_only_layers=[1, 2]),
    "gpt2": lambda: T.GPT2Config(vocab_size=V, n_embd=32, n_layer=4, n_head=4),
}


def _model(name: str):
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(CONFIGS[name]()).eval()


def _layers(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


@pytest.mark.parametrize("name", list(CONFIGS))
def test_removed_decoder_layers_reload_and_generate(name, tmp_path):
    model = _model(name)
    ids = torch.randint(0, V, (2, 8))
    n = model.config.num_hidden_layers
    old_types = list(getattr(model.config, "layer_types", None) or [])
    result = pfx_hf.prune_depth(model, ids, remove=2, criterion="output")
    cfg = model.config
    assert result.verified.ok and not result.warnings
    gone = [int(p.rsplit(".", 1)[1]) for p in result.plan.remove]
    assert cfg.num_hidden_layers == n - 2 == len(_layers(model))
    if old_types:
        assert cfg.layer_types == [t for i, t in enumerate(old_types) if i not in gone]
    if name == "qwen3_moe":  # layers 1 and 2 were dense: the kept ones renumbered, the removed ones gone
        kept = [i for i in range(n) if i not in gone]
        assert cfg.mlp_only_layers == [kept.index(i) for i in (1, 2) if i in kept]
    idx = [m.layer_idx for layer in _layers(model) for m in layer.modules() if hasattr(m, "layer_idx")]
    assert sorted(set(idx)) == list(range(n - 2))
    model.save_pretrained(tmp_path)
    back = T.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    prompt = ids[:1]
    cached = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    plain = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0, use_cache=False)
    assert torch.equal(cached, plain)


def test_a_failed_check_puts_layers_config_and_indices_back(monkeypatch):
    model = _model("gemma3")
    ids = torch.randint(0, V, (1, 8))
    before = copy.deepcopy(model.config.to_dict())
    with torch.no_grad():
        logits = model(ids).logits

    def failing(*args, **kwargs):
        return replace(real(*args, **kwargs), ok=False, message="forced")

    real = prunefx.depth.verify_depth
    monkeypatch.setattr(prunefx.depth, "verify_depth", failing)
    with pytest.raises(VerificationError, match="forced"):
        pfx_hf.prune_depth(model, ids, remove=2)
    assert model.config.to_dict() == before and len(model.model.layers) == 6
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(6))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, logits)


def test_the_callers_config_object_is_not_changed():
    cfg = T.LlamaConfig(**{**BASE, "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 4})
    first, second = T.AutoModelForCausalLM.from_config(cfg).eval(), T.AutoModelForCausalLM.from_config(cfg).eval()
    assert first.config is cfg  # from_config keeps the caller's object
    ids = torch.randint(0, V, (1, 8))
    pfx_hf.prune_depth(first, ids, remove=1)
    pfx_hf.prune(first, ids, prunefx.PlanConfig(ratio=0.5))
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size) == (4, 8, 64)
    assert (first.config.num_hidden_layers, first.config.num_attention_heads) == (3, 4)
    assert all(m.config is first.config for m in first.modules() if hasattr(m, "config"))
    with torch.no_grad():
        assert second(ids).logits.shape == (1, 8, V)


def test_a_config_that_cannot_say_the_new_depth_warns_and_prunefx_save_round_trips(tmp_path):
    torch.manual_seed(0)  # every second layer is sparse by its index: dropping layer 0 shifts the pattern
    cfg = T.Qwen2MoeConfig(**BASE, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                           shared_expert_intermediate_size=32, decoder_sparse_step=2)
    model = T.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, V, (1, 8))
    with pytest.warns(pfx_hf.ConfigStaleWarning, match="does not rebuild the depth-pruned model"):
        result = pfx_hf.prune_depth(model, ids, remove=1, blocks=["model.layers.0"])
    assert result.verified.ok and result.warnings and "prunefx.save" in result.warnings[0]
    prunefx.save(model, result.plan, tmp_path / "shallow.pt")
    torch.manual_seed(1)  # another initialisation: the weights must come from the file
    back = prunefx.load(tmp_path / "shallow.pt", lambda: T.AutoModelForCausalLM.from_config(cfg).eval())
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits)


def test_sub_layers_are_bypassed_not_compacted_and_post_norm_layers_are_refused(tmp_path):
    torch.manual_seed(0)  # T5: block.k.layer lists [self-attention, (cross-attention,) FF], 3 like the layer count
    t5 = T.T5ForConditionalGeneration(T.T5Config(vocab_size=V, d_model=32, d_ff=64, num_layers=3, num_heads=4,
                                                 d_kv=8)).eval()
    inputs = (torch.randint(0, V, (2, 8)), None, torch.randint(0, V, (2, 4)))
    result = pfx_hf.prune_depth(t5, inputs, remove=1, blocks=["decoder.block.2.layer.2"])
    assert result.verified.ok and t5.config.num_layers == 3 and len(t5.decoder.block[2].layer) == 3
    assert result.warnings and "prunefx.save" in result.warnings[0]  # the config builds an FF layer there
    bert = T.BertModel(T.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64)).eval()
    with pytest.raises(PrunefxError, match="post-norm"):
        pfx_hf.prune_depth(bert, torch.randint(0, V, (2, 8)), remove=1)


def _llava():
    torch.manual_seed(0)
    vision = T.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                image_size=32, patch_size=8)
    text = T.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2)
    model = T.LlavaForConditionalGeneration(T.LlavaConfig(vision_config=vision, text_config=text,
                                                          image_token_index=100)).eval()
    ids = torch.randint(0, 100, (1, 24))
    ids[0, :16] = 100  # one image token per patch
    return model, {"input_ids": ids, "pixel_values": torch.randn(1, 3, 32, 32)}


def test_a_vlm_loses_language_layers_and_widths_only(tmp_path):
    model, batch = _llava()
    vision = {k: v.shape for k, v in model.state_dict().items() if not k.startswith("model.language_model")}
    result = pfx_hf.prune_depth(model, batch, remove=1, language_model_only=True)
    assert result.verified.ok and all(p.startswith("model.language_model.layers.") for p in result.plan.remove)
    assert model.config.text_config.num_hidden_layers == 3 and model.config.vision_config.num_hidden_layers == 2
    width = pfx_hf.prune(model, batch, prunefx.PlanConfig(ratio=0.5), language_model_only=True)
    assert width.verified.ok and width.plan.pruned
    assert {k: v.shape for k, v in model.state_dict().items() if not k.startswith("model.language_model")} == vision
    model.save_pretrained(tmp_path)
    back = T.LlavaForConditionalGeneration.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(**batch).logits, model(**batch).logits)


def test_language_model_only_on_a_model_without_one_is_one_clear_error():
    bert = T.BertModel(T.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64)).eval()
    with pytest.raises(PrunefxError, match="has no separate language model"):
        pfx_hf.prune(bert, torch.randint(0, V, (1, 8)), language_model_only=True)
