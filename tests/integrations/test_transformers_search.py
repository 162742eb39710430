"""The searched architecture: depth and width mixed to one parameter budget, ranked by the user's score."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from prunefx.errors import PrunefxError
from prunefx.integrations import transformers as pfx_hf

T = transformers
V = 64


def _model():
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                        num_attention_heads=8, num_key_value_heads=4)
    return T.AutoModelForCausalLM.from_config(cfg).eval()


def _ids(seed: int = 0):
    return torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_best_candidate_by_a_hand_made_score_is_returned_and_every_one_meets_the_budget(tmp_path):
    model = _model()
    state = copy.deepcopy(model.state_dict())
    result = pfx_hf.search(model, _ids(), params=0.6, score=lambda m: m.config.num_hidden_layers)
    assert len(result.candidates) >= 2
    assert all(abs(c.params_kept - 0.6) <= 0.02 * 0.6 for c in result.candidates)
    assert result.best.layers_removed == max(c.layers_removed for c in result.candidates)
    assert result.model.config.num_hidden_layers == 6 - result.best.layers_removed
    n = sum(p.numel() for p in result.model.parameters()) / sum(p.numel() for p in model.parameters())
    assert n == pytest.approx(result.best.params_kept, abs=1e-4)
    # the model given is left as it was
    assert model.config.num_hidden_layers == 6 and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    result.model.save_pretrained(tmp_path)
    back = T.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(_ids(1)).logits, result.model(_ids(1)).logits)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_default_score_is_the_logit_error_and_the_lowest_wins():
    model = _model()
    cal = [_ids(2), _ids(3)]
    result = pfx_hf.search(model, _ids(), params=0.6, calibration=cal)
    assert result.best.score == min(c.score for c in result.candidates)
    with torch.no_grad():
        num = sum(float((result.model(x).logits - model(x).logits).double().pow(2).sum()) for x in cal)
        den = sum(float(model(x).logits.double().pow(2).sum()) for x in cal)
    assert result.best.score == pytest.approx((num / den) ** 0.5, rel=1e-6)


def test_a_budget_no_candidate_meets_is_one_clear_error():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(PrunefxError, match="no candidate keeps 60.0% of the parameters within 0%"):
            pfx_hf.search(_model(), _ids(), params=0.6, tolerance=0.0, depths=[0])
    with pytest.raises(PrunefxError, match="no fraction of the parameters"):
        pfx_hf.search(_model(), _ids(), params=1.5)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_budget_without_embeddings_counts_the_decoder_only():
    model = _model()
    tables = sum(p.numel() for m in (model.get_input_embeddings(), model.get_output_embeddings())
                 for p in m.parameters())
    result = pfx_hf.search(model, _ids(), params=0.6, embeddings=False, score=lambda m: m.config.num_hidden_layers)
    body = sum(p.numel() for p in model.parameters()) - tables
    kept = (sum(p.numel() for p in result.model.parameters()) - tables) / body
    assert kept == pytest.approx(result.best.params_kept, abs=1e-4) and abs(kept - 0.6) <= 0.012


def _memory_by_hand(cfg, params: int, batch: int, context: int, window: int | None = None) -> float:
    # weights in bf16 + K and V of every layer for batch x context tokens (a sliding layer holds its window)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    tokens = sum(min(context, window) if t == "sliding_attention" and window else context for t in types)
    return 2 * params + 2 * batch * tokens * 2 * cfg.num_key_value_heads * head_dim


def test_memory_counts_the_weights_and_the_kv_cache_sliding_layers_at_their_window():
    model = _model()
    n = sum(p.numel() for p in model.parameters())
    budget = pfx_hf.Budget("memory", batch=4, context=512)
    assert budget.of(model) == _memory_by_hand(model.config, n, 4, 512)
    cfg = T.Gemma3TextConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=4, head_dim=16,
                             num_attention_heads=4, num_key_value_heads=2, sliding_window=128,
                             layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                                          "full_attention"])
    gemma = T.AutoModelForCausalLM.from_config(cfg)
    g = sum(p.numel() for p in gemma.parameters())
    assert budget.of(gemma) == _memory_by_hand(gemma.config, g, 4, 512, window=128)
    assert budget.of(gemma) < _memory_by_hand(gemma.config, g, 4, 512)  # the windows hold fewer tokens
    with pytest.raises(PrunefxError, match="unknown budget measure"):
        pfx_hf.Budget("bytes")
    # NaN compares false with everything, so "context < 1" let it through; a fraction of a token is no count either
    for field, value in [("context", float("nan")), ("batch", 2.5), ("context", True), ("bytes_per_kv", float("inf")),
                         ("bytes_per_param", float("nan"))]:
        with pytest.raises(PrunefxError, match=rf"^Budget {field}={value!r}: it must be a (whole|positive finite)"):
            pfx_hf.Budget("memory", **{field: value})


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_memory_budget_is_met_by_every_candidate_and_the_kv_cache_counts():
    model = _model()
    budget = pfx_hf.Budget("memory", batch=1, context=256)  # the cache: a third of the bytes
    base = budget.of(model)
    result = pfx_hf.search(model, _ids(), keep=0.6, budget=budget, score=lambda m: m.config.num_hidden_layers)
    assert result.candidates and result.budget.startswith("memory")
    for c in result.candidates:
        assert c.kept == pytest.approx(0.6, rel=0.02)
    kept = budget.of(result.model) / base
    assert kept == pytest.approx(result.best.kept, abs=1e-4) and kept == pytest.approx(0.6, rel=0.02)
    # measured independently: the best model's config and weights give the same bytes
    n = sum(p.numel() for p in result.model.parameters())
    assert budget.of(result.model) == _memory_by_hand(result.model.config, n, 1, 256)
    assert all(abs(c.params_kept - c.kept) > 0.02 for c in result.candidates)  # not a parameter budget
    with pytest.raises(PrunefxError, match="give one of params"):
        pfx_hf.search(model, _ids(), params=0.6, keep=0.6)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_active_params_budget_on_a_mixture_of_experts():
    from prunefx.integrations.transformers.experts import active_params

    torch.manual_seed(0)
    cfg = T.MixtralConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    model = T.AutoModelForCausalLM.from_config(cfg).eval()
    shallow = copy.deepcopy(model)
    pfx_hf.prune_depth(shallow, _ids(), remove=1)
    goal = active_params(shallow) / active_params(model)  # one layer fewer, counted by hand
    params = sum(p.numel() for p in shallow.parameters()) / sum(p.numel() for p in model.parameters())
    assert abs(goal - params) > 1e-3  # inactive experts make the two measures differ
    result = pfx_hf.search(model, _ids(), keep=goal, budget="active_params", depths=[1])
    assert result.best.kept == pytest.approx(goal, abs=1e-4) and result.best.params_kept == pytest.approx(params,
                                                                                                          abs=1e-4)
