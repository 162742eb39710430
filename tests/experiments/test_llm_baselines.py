"""experiments/llm_baselines.py: masking equals removal; --quick (a 4-layer stdlib LM, 60 steps) meets the budget."""

from __future__ import annotations

import copy
import csv
import math

import pytest

pytest.importorskip("transformers")

import torch

from experiments import llm_baselines as lb


def _removed(model, shape, keep):
    """``model`` with the structures not in ``keep`` sliced out (the physically smaller model)."""
    from torch import nn

    def sliced(linear, rows=None, cols=None):
        w = linear.weight.detach()
        w = w[rows] if rows is not None else w
        w = w[:, cols] if cols is not None else w
        new = nn.Linear(w.shape[1], w.shape[0], bias=linear.bias is not None)
        new.weight.data.copy_(w)
        if linear.bias is not None:
            new.bias.data.copy_(linear.bias.detach() if rows is None else linear.bias.detach()[rows])
        return new

    model = copy.deepcopy(model)
    for layer, (groups, channels) in zip(model.model.layers, keep, strict=True):
        wide = [c for g in groups for c in range(shape.group_rows(g)[0].start, shape.group_rows(g)[0].stop)]
        narrow = [c for g in groups for c in range(shape.group_rows(g)[1].start, shape.group_rows(g)[1].stop)]
        a, m = layer.self_attn, layer.mlp
        a.q_proj, a.k_proj, a.v_proj = sliced(a.q_proj, wide), sliced(a.k_proj, narrow), sliced(a.v_proj, narrow)
        a.o_proj = sliced(a.o_proj, cols=wide)
        m.gate_proj, m.up_proj, m.down_proj = sliced(m.gate_proj, channels), sliced(m.up_proj, channels), sliced(
            m.down_proj, cols=channels)
    return model


@pytest.mark.parametrize("flap", [False, True])
def test_masking_equals_removing_the_structures(flap):
    from prunefx.examples import stdlib_lm as lm

    torch.manual_seed(0)
    model = lm.tiny_llama(2).eval()
    shape = lb.Shape(model)
    keep = [([1], list(range(0, 384, 3))), ([0], list(range(200)))]
    x = torch.randint(0, 256, (2, 16))
    stats = lb._stats(model, shape, [(x, x)], lm.task_loss) if flap else None
    masked = copy.deepcopy(model)
    lb._apply(masked, shape, keep, stats)
    removed = _removed(masked, shape, keep)  # the masked model's weights (and FLAP's biases), sliced
    with torch.no_grad():
        torch.testing.assert_close(masked(x).logits, removed(x).logits, rtol=1e-5, atol=1e-5)
    count = sum(p.numel() for p in removed.parameters()) - lb._embedding_params(removed)
    assert shape.params(keep, 2 * 2 * 128 if flap else 0) == count


@pytest.mark.slow
def test_llm_baselines_quick_meets_the_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("PRUNEFX_CACHE_DIR", str(tmp_path / "cache"))
    assert lb.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = {r["method"].split(" (")[0]: r for r in csv.DictReader(open(tmp_path / "llm_baselines_quick.csv"))}
    assert {"Wanda-sp", "FLAP", "LLM-Pruner, L2", "LLM-Pruner, Taylor", "random", "ShortGPT",
            "taylor, normalised, re-fit", "activation", "Wanda-sp, MLP only"} <= set(rows)
    cut = {k: r for k, r in rows.items() if k != "unpruned"}
    for name, r in cut.items():  # every method at 50% of the parameters without embeddings, within 2%
        assert abs(float(r["params_kept"]) - 0.5) <= 0.02 * 0.5, name
        assert math.isfinite(float(r["ppl"])), name
    assert rows["unpruned"]["params_kept"] == "1.0"
    # the control loses most: random structures cost far more than any scored choice (28 vs <= 19 ppl here)
    assert float(cut["random"]["ppl"]) > max(float(r["ppl"]) for k, r in cut.items() if not k.startswith("random"))
    assert "prunefx's best plan" in (tmp_path / "llm_baselines_quick.md").read_text()
