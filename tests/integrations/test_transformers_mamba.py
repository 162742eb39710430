"""Hugging Face Mamba: the mixer's inner channels, state size and time-step rank as groups, pruned exactly.

A tiny random MambaForCausalLM on CPU, so the torch slow path of ``MambaMixer`` is what torch.export captures: its
scan starts from ``torch.zeros(b, d_inner, d_state)``, whose literal sizes the analysis couples to the channels
it meets, and the mixer's fixer re-derives the widths its forward reads from attributes.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import prunefx
from prunefx.analysis.roles import Kind
from prunefx.integrations import transformers as pfx_hf

HIDDEN, INNER, STATE, RANK, KERNEL, VOCAB = 16, 32, 4, 3, 4, 50


def _mamba():
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, state_size=STATE,
                                   expand=INNER // HIDDEN, time_step_rank=RANK, conv_kernel=KERNEL)  # fmt: skip
    return transformers.MambaForCausalLM(cfg).eval(), (torch.randint(0, VOCAB, (1, 7)),)


def _members(group) -> set[tuple[str, str, str]]:
    return {(str(m.kind), m.name, m.describe()) for m in group.members}


def _group_with(dg, kind: Kind, name: str, slices: str):
    return next(g for g in dg.groups if any(m.kind is kind and m.name == name and m.describe() == slices
                                            for m in g.members))  # fmt: skip


M = "backbone.layers.0.mixer"


def test_mixer_channels_state_and_rank_are_groups():
    model, x = _mamba()
    dg = prunefx.analyze(model, x)
    assert dg.capture == "export"
    inner = _group_with(dg, Kind.PARAM, f"{M}.D", "dim0[0:32]")
    # x and gate halves of in_proj, the depthwise conv (its groups literal), A_log's rows, D, dt_proj's outputs,
    # x_proj's and out_proj's inputs and the scan's zero state all follow channel i of d_inner
    assert inner.prunable and inner.exact and inner.channels == INNER
    assert _members(inner) == {
        ("param", f"{M}.A_log", "dim0[0:32]"), ("param", f"{M}.D", "dim0[0:32]"),
        ("param", f"{M}.conv1d.weight", "dim0[0:32]"), ("param", f"{M}.conv1d.bias", "dim0[0:32]"),
        ("param", f"{M}.in_proj.weight", "dim0[0:32]+[32:64]"), ("module", f"{M}.in_proj", "out[0:32]+[32:64]"),
        ("param", f"{M}.x_proj.weight", "dim1[0:32]"), ("module", f"{M}.x_proj", "in[0:32]"),
        ("param", f"{M}.dt_proj.weight", "dim0[0:32]"), ("param", f"{M}.dt_proj.bias", "dim0[0:32]"),
        ("param", f"{M}.out_proj.weight", "dim1[0:32]"), ("module", f"{M}.out_proj", "in[0:32]"),
        ("const", "conv1d", "args[6][0:32]"), ("const", "zeros", "args[0][1][0:32]"),
    }  # fmt: skip
    # state size: A_log's columns, the B and C rows of x_proj (state n of each), the split sizes and the zero state
    state = _group_with(dg, Kind.PARAM, f"{M}.A_log", "dim1[0:4]")
    assert state.prunable and state.exact and state.channels == STATE
    assert _members(state) == {
        ("param", f"{M}.A_log", "dim1[0:4]"), ("param", f"{M}.x_proj.weight", "dim0[3:7]+[7:11]"),
        ("module", f"{M}.x_proj", "out[3:7]+[7:11]"), ("const", "split_with_sizes", "args[1][1][0:4]"),
        ("const", "split_with_sizes", "args[1][2][0:4]"), ("const", "zeros", "args[0][2][0:4]"),
    }  # fmt: skip
    rank = _group_with(dg, Kind.PARAM, f"{M}.dt_proj.weight", "dim1[0:3]")
    assert rank.prunable and rank.channels == RANK
    assert _members(rank) == {
        ("param", f"{M}.x_proj.weight", "dim0[0:3]"), ("module", f"{M}.x_proj", "out[0:3]"),
        ("param", f"{M}.dt_proj.weight", "dim1[0:3]"), ("const", "split_with_sizes", "args[1][0][0:3]"),
    }  # fmt: skip
    kernel = _group_with(dg, Kind.PARAM, f"{M}.conv1d.weight", "dim2[0:4]")
    assert not kernel.prunable and kernel.reasons == ("convolution kernel dims (node 'conv1d')",)
    vocab = _group_with(dg, Kind.MODULE, "lm_head", "out[0:50]")
    assert not vocab.prunable and vocab.reasons == ("embedding rows are looked up by token id (node 'embedding')",)
    stream = _group_with(dg, Kind.MODULE, "backbone.embeddings", "out[0:16]")
    assert stream.prunable and stream.channels == HIDDEN
    assert {g.id for g in dg.groups} == {inner.id, state.id, rank.id, kernel.id, vocab.id, stream.id}


def test_pruned_mamba_equals_the_masked_original_and_runs_other_lengths():
    model, x = _mamba()
    original = copy.deepcopy(model)
    cfg = prunefx.PlanConfig(ratio=0.4, scope="local", ignore=pfx_hf.stream_patterns(model))
    result = prunefx.prune(model, x, cfg, criterion="l2")
    assert result.verified.ok and result.verified.exact, result.verified.message
    after = {result.graph.groups[gp.group].label: gp.after for gp in result.plan.pruned}
    inner, state, rank = (after[f"{M}.{k}"] for k in ("in_proj out[0:32]+[32:64]", "x_proj out[3:7]+[7:11]",
                                                      "x_proj out[0:3]"))  # fmt: skip
    assert len(after) == 3 and inner < INNER and state < STATE and rank < RANK  # all three widths were cut
    mixer = model.get_submodule(M)
    assert (mixer.intermediate_size, mixer.ssm_state_size, mixer.time_step_rank) == (inner, state, rank)
    assert (mixer.conv1d.in_channels, mixer.conv1d.out_channels, mixer.conv1d.groups) == (inner, inner, inner)
    assert (mixer.dt_proj.in_features, mixer.dt_proj.out_features) == (rank, inner)
    assert tuple(mixer.A_log.shape) == (inner, state) and tuple(mixer.x_proj.weight.shape) == (rank + 2 * state, inner)
    longer = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        out, ref = model(longer).logits, original(longer).logits
    assert out.shape == ref.shape == (2, 11, VOCAB) and torch.isfinite(out).all()
    # the cached one-token path (causal_conv1d_update, selective_state_update: never traced) agrees with the scan
    with torch.no_grad():
        first = model(longer[:, :6], use_cache=True)
        cache, steps = first.cache_params, [first.logits[:, -1]]
        for t in range(6, 10):
            step = model(longer[:, t : t + 1], cache_params=cache, use_cache=True, cache_position=torch.tensor([t]))
            cache = step.cache_params
            steps.append(step.logits[:, -1])
    torch.testing.assert_close(torch.stack(steps, 1), out[:, 5:10], rtol=1e-4, atol=1e-5)
