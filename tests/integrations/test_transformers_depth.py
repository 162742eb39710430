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
        return replace(real(*args, **kwargs), ok=False, state="failed", message="forced")

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
    # the text config is rewritten in place, still the object the language model holds (a plain dict there broke
    # the cache: generate raised "'dict' object has no attribute 'get_text_config'")
    text = model.config.text_config
    assert isinstance(text, T.PretrainedConfig) and text is model.model.language_model.config
    assert text.intermediate_size == model.model.language_model.layers[0].mlp.gate_proj.out_features
    with torch.no_grad():
        assert model.generate(**batch, max_new_tokens=2, min_new_tokens=2, do_sample=False).shape == (1, 26)
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


def _old_write_fields(old, new):
    """The config update before this check existed: every changed field set from ``to_dict()``, so a nested
    sub-config became a plain dict."""
    for key, value in new.to_dict().items():
        if getattr(old, key, None) != value and key in old.to_dict():
            setattr(old, key, value)


def test_a_width_cut_whose_config_rewrite_breaks_generation_is_not_returned(monkeypatch):
    """The oracle proves the cut with the cache off; the model the user gets must also generate with its cache."""
    model, batch = _llava()
    monkeypatch.setattr(pfx_hf.api, "write_fields", _old_write_fields)
    with pytest.raises(VerificationError, match=r"the pruned model fails its cached generation \(2 tokens\) on the "
                                                r"example inputs \(AttributeError: 'dict' object has no attribute "
                                                r"'get_text_config'\); the cut is not returned as verified"):
        pfx_hf.prune(model, batch, prunefx.PlanConfig(ratio=0.5), language_model_only=True)


def _hybrid(types):
    """A Mamba2 + attention model (GraniteMoeHybrid), one decoder layer per entry of ``types``."""
    torch.manual_seed(0)
    cfg = T.GraniteMoeHybridConfig(**{**BASE, "num_hidden_layers": len(types)}, layer_types=types, mamba_n_heads=4,
                                   mamba_d_head=16, mamba_n_groups=1, mamba_d_state=8, mamba_chunk_size=8,
                                   num_local_experts=0, shared_intermediate_size=64)
    return T.GraniteMoeHybridForCausalLM(cfg).eval()


def test_a_hybrid_models_only_attention_layer_is_refused_before_any_compute(monkeypatch):
    model = _hybrid(["mamba", "attention"])
    ids = torch.randint(0, V, (1, 8))

    def no_compute(*args, **kwargs):
        raise AssertionError("the model was analysed: the refusal came after compute")

    monkeypatch.setattr(prunefx.depth, "analyze", no_compute)
    with pytest.raises(PrunefxError, match=r"^model\.layers\.1 cannot be removed: it is the only 'full_attention' "
                                           r"layer \(layer_types\) of model\.layers, which the model's cache and masks "
                                           r"need; name other blocks$"):
        pfx_hf.prune_depth(model, ids, remove=1, blocks=["model.layers.1"])
    with pytest.raises(PrunefxError, match=r"^remove=1, but GraniteMoeHybridForCausalLM can lose at most 0 of its 2 "
                                           r"decoder layers: one of each kind stays, .*; give remove <= 0$"):
        pfx_hf.prune_depth(model, ids, remove=1)
    with pytest.raises(PrunefxError, match=r"^remove=4, but LlamaForCausalLM can lose at most 3 of its 4 decoder "
                                           r"layers"):
        pfx_hf.prune_depth(_model("llama"), ids, remove=4)  # every layer: refused, not cut and then blamed
    assert len(model.model.layers) == 2 and model.config.layer_types == ["linear_attention", "full_attention"]


def test_a_hybrid_model_keeps_one_layer_of_each_kind_and_a_cut_that_breaks_its_call_is_undone(monkeypatch):
    model = _hybrid(["mamba", "mamba", "attention"])
    ids = torch.randint(0, V, (1, 8))
    with torch.no_grad():
        logits = model(ids).logits
    # without the kinds the attention layer goes: the oracle (cache off) passes, the model's default call does not
    monkeypatch.setattr(pfx_hf.depth, "layer_kinds", lambda model, under=None: {})
    with pytest.raises(VerificationError, match=r"the blocks are back: the pruned model fails its default call on "
                                                r"the example inputs \(ValueError: .*can only be called on Attention "
                                                r"layers"):
        pfx_hf.prune_depth(model, ids, remove=1, blocks=["model.layers.2"])
    monkeypatch.undo()
    assert len(model.model.layers) == 3 and model.config.num_hidden_layers == 3
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, logits)
    with pytest.raises(PrunefxError, match=r"remove=2, but GraniteMoeHybridForCausalLM can lose at most 1 of its 3"):
        pfx_hf.prune_depth(model, ids, remove=2)
    result = pfx_hf.prune_depth(model, ids, remove=1)  # one of the two mamba layers, never the attention layer
    assert result.verified.ok and result.plan.remove[0] in ("model.layers.0", "model.layers.1")
    assert model.config.layer_types == ["linear_attention", "full_attention"]
    assert model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0).shape == (1, 10)
