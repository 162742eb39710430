"""A params / MACs target between two coarse steps is met: after the global threshold, the fine units are cut on.

Uniform layers and the config's head counts make a Llama's attention move a whole KV group at a time in every layer
at once; one threshold then jumps from above the target to well below it. The fill must land within its tolerance
and cut only the fine units (MLP widths) beyond the threshold, the heads keeping an allowed count."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

import prunefx
from prunefx.integrations import transformers as pfx_hf
from prunefx.plan.fill import units

CASES = [(64, 8, 4, 128), (128, 4, 2, 384), (256, 8, 8, 688)]  # hidden, heads, KV heads, MLP


@pytest.mark.parametrize("hidden,heads,kv,mlp", CASES)
@pytest.mark.parametrize("target", [0.6, 0.7])
def test_a_target_between_head_steps_is_met(hidden, heads, kv, mlp, target):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=4,
                                   num_attention_heads=heads, num_key_value_heads=kv)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    n = sum(p.numel() for p in model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = pfx_hf.prune(model, torch.randint(0, 256, (1, 16)), prunefx.PlanConfig(params=target))
    kept = sum(p.numel() for p in model.parameters()) / n
    assert abs(kept - target) <= 0.012 * target, kept
    assert result.verified.ok
    assert not any("unpruned widths" in w for w in result.warnings)  # the config says the new head count
    widths = {g.after for g in result.plan.groups if g.before == mlp}
    assert len(widths) == 1  # uniform layers: every MLP as wide as its peers


def test_units_merge_overlapping_ties_and_pin_ties_with_an_unprunable_partner():
    eligible = [1, 2, 3, 4, 5]
    got = units(eligible, [((1, 2), "a"), ((2, 3), "b"), ((4, 9), "c")])
    assert sorted(map(sorted, got)) == [[1, 2, 3], [5]]
