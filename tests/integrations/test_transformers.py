"""Hugging Face models: heads and MLP widths pruned exactly, the config rewritten, save_pretrained / from_pretrained.

Tiny random configs of twelve families, captured with torch.export. Every pruned model must equal the masked original
(the oracle, exact); where the family's config can describe the pruned widths, ``save_pretrained`` then
``from_pretrained`` must give the same outputs; where it cannot, saving says why and ``prunefx.save`` / ``load``
round-trips instead.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.utils._pytree import tree_flatten

transformers = pytest.importorskip("transformers")

import prunefx
from prunefx.analysis.roles import Kind
from prunefx.integrations import transformers as pfx_hf
from prunefx.integrations.transformers.layouts import attention_widths, layout_of

T = transformers
V = 128
SMALL = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)  # fmt: skip
GQA = {**SMALL, "hidden_size": 96, "num_attention_heads": 8, "num_key_value_heads": 4}  # 6 heads divide 96


def _ids():
    return (torch.randint(0, V, (1, 8)),)


def _image():
    return (torch.randn(1, 3, 32, 32),)


def _vision(cfg_cls):
    return cfg_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                   patch_size=8)  # fmt: skip


MODELS = {
    "llama": lambda: (T.LlamaForCausalLM(T.LlamaConfig(**GQA)), _ids()),
    "qwen2": lambda: (T.Qwen2ForCausalLM(T.Qwen2Config(**GQA)), _ids()),
    "mistral": lambda: (T.MistralForCausalLM(T.MistralConfig(**GQA)), _ids()),
    "gemma": lambda: (T.GemmaForCausalLM(T.GemmaConfig(**GQA, head_dim=12)), _ids()),
    "phi": lambda: (T.PhiForCausalLM(T.PhiConfig(**SMALL)), _ids()),
    "gpt2": lambda: (T.GPT2LMHeadModel(T.GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                                    bos_token_id=0, eos_token_id=0)), _ids()),  # fmt: skip
    "bert": lambda: (T.BertModel(T.BertConfig(**SMALL)), _ids()),
    "roberta": lambda: (T.RobertaModel(T.RobertaConfig(**{**SMALL, "max_position_embeddings": 72})), _ids()),
    "t5_encoder": lambda: (T.T5EncoderModel(T.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                                       num_heads=4)), _ids()),  # fmt: skip
    "vit": lambda: (T.ViTModel(_vision(T.ViTConfig)), _image()),
    "clip_vision": lambda: (T.CLIPVisionModel(_vision(T.CLIPVisionConfig)), _image()),
    "whisper_encoder": lambda: (
        T.models.whisper.modeling_whisper.WhisperEncoder(
            T.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                            num_mel_bins=16, max_source_positions=16, vocab_size=V)  # fmt: skip
        ),
        (torch.randn(1, 16, 32),),
    ),
}
# Families whose config derives head_dim from hidden_size / heads: fewer heads cannot be written as that config.
HEADS_NOT_EXPRESSIBLE = {"gpt2", "bert", "roberta", "clip_vision", "whisper_encoder"}
FAST = {"llama", "bert"}


def _flat(out) -> list[torch.Tensor]:
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def _same_outputs(a, b, x, tol=1e-5) -> float:
    with torch.no_grad():
        pa, pb = _flat(a(*x)), _flat(b(*x))
    assert len(pa) == len(pb) and pa
    return max(float((p - q).abs().max() / p.abs().max().clamp_min(1e-12)) for p, q in zip(pa, pb, strict=True))


def _build(name):
    torch.manual_seed(0)
    model, x = MODELS[name]()
    return model.eval(), x


def _pruned_kinds(result) -> set[str]:
    """Which kinds of groups the plan pruned: 'heads' (a group with an attention projection) and/or 'mlp'."""
    kinds = set()
    for gp in result.plan.pruned:
        g = result.graph.groups[gp.group]
        names = [m.name for m in g.members if m.kind is Kind.MODULE]
        owners = {n.rpartition(".")[0] for n in names}
        attn = any(layout_of(result.model.get_submodule(o)) is not None for o in owners if o)
        kinds.add("heads" if attn else "mlp")
    return kinds


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in MODELS]
)  # fmt: skip
def test_heads_and_mlp_pruned_exactly_and_round_tripped(name, tmp_path):
    model, x = _build(name)
    original = copy.deepcopy(model)
    if name in HEADS_NOT_EXPRESSIBLE:  # the generic API prunes heads the family's config cannot write
        ignore = pfx_hf.stream_patterns(model)
        config = prunefx.PlanConfig(ratio=0.3, scope="local", ignore=ignore, uniform_layers=True)
        result = prunefx.prune(model, x, config, criterion="l2")
    else:
        result = pfx_hf.prune(model, x, prunefx.PlanConfig(ratio=0.3, scope="local"))
    assert result.graph.capture == "export"
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert _pruned_kinds(result) == {"heads", "mlp"}, result.plan.summary()
    assert all("ignored" in why for _, why in result.plan.skipped), result.plan.skipped  # only the residual stream
    for m in model.modules():  # every attention's attributes agree with its weights
        layout = layout_of(m)
        if layout is not None:
            heads, _, hd = attention_widths(m, layout)
            for attr in layout.heads:
                assert getattr(m, attr) == heads
            for attr in layout.widths:
                assert getattr(m, attr) == heads * hd
    assert _same_outputs(original, original, x) == 0.0
    if name in HEADS_NOT_EXPRESSIBLE:
        with pytest.raises(prunefx.PrunefxError, match="cannot be written as a"):
            pfx_hf.save_pretrained(model, tmp_path / "hf")
        prunefx.save(model, result.plan, tmp_path / "pruned.pt")
        factory = lambda: type(original)(original.config).eval()  # noqa: E731
        again = prunefx.load(tmp_path / "pruned.pt", factory, example_inputs=x).eval()
    else:
        pfx_hf.save_pretrained(model, tmp_path / "hf")
        again = type(model).from_pretrained(tmp_path / "hf").eval()
    assert _same_outputs(model, again, x) <= 1e-5


def test_gqa_unit_is_a_kv_head_with_its_query_heads():
    model, x = _build("llama")
    dg = prunefx.analyze(model, x)
    attn = "model.layers.0.self_attn"
    (g,) = dg.groups_of(f"{attn}.k_proj")
    assert g.prunable and g.channels == 4  # 4 KV heads of 12, each with 2 query heads
    members = {(m.name, str(m.role)): m.positions for m in g.members if m.kind is Kind.MODULE}
    heads = lambda n, w: tuple(tuple(range(k * w, (k + 1) * w)) for k in range(n))  # noqa: E731
    assert members[(f"{attn}.k_proj", "out")] == heads(4, 12)
    assert members[(f"{attn}.v_proj", "out")] == heads(4, 12)
    assert members[(f"{attn}.q_proj", "out")] == heads(4, 24)
    assert members[(f"{attn}.o_proj", "in")] == heads(4, 24)
    (mlp,) = dg.groups_of("model.layers.0.mlp.gate_proj")
    assert {(m.name, str(m.role)) for m in mlp.members if m.kind is Kind.MODULE} == {
        ("model.layers.0.mlp.gate_proj", "out"), ("model.layers.0.mlp.up_proj", "out"),
        ("model.layers.0.mlp.down_proj", "in"),
    }  # fmt: skip


@pytest.mark.slow
def test_layers_of_different_widths_need_uniform_layers(tmp_path):
    model, x = _build("qwen2")
    config = prunefx.PlanConfig(params=0.6, ignore=pfx_hf.stream_patterns(model))  # global: layers differ
    prunefx.prune(model, x, config, criterion="l2")
    with pytest.raises(prunefx.PrunefxError, match="different widths.*uniform_layers=True"):
        pfx_hf.save_pretrained(model, tmp_path)
    model, x = _build("qwen2")
    result = pfx_hf.prune(model, x, prunefx.PlanConfig(params=0.6))  # uniform_layers by default
    assert result.verified.ok and result.plan.target["uniform_layers"]
    pfx_hf.save_pretrained(model, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    widths = {m.weight.shape[0] for n, m in model.named_modules() if n.endswith("mlp.gate_proj")}
    assert widths == {saved["intermediate_size"]} and saved["intermediate_size"] < 128


def test_head_counts_are_chosen_among_those_the_config_accepts(tmp_path):
    # LlamaConfig needs hidden_size % heads == 0: of 8 heads in 64, 1, 2, 4 and 8 can be written
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**{**SMALL, "num_attention_heads": 8, "num_key_value_heads": 8})).eval()
    x = _ids()
    result = pfx_hf.prune(model, x, prunefx.PlanConfig(ratio=0.7, scope="local"))  # 70% of 8: keep 3 -> 4
    assert result.verified.ok
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.out_features == 4 * 8 and model.config.num_attention_heads == 4
    assert dict(result.plan.target["allowed_widths"])["model.layers.0.self_attn.k_proj"] == [1, 2, 4, 8]
    model.save_pretrained(tmp_path / "plain")  # the user's own save: the config says 4 heads
    again = T.AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    assert _same_outputs(model, again, x) <= 1e-5


def test_checkpoint_on_disk_is_pruned_shard_by_shard(tmp_path):
    """Analysis and scores on the meta device (weights streamed from the shards one tensor at a time), then the
    shards sliced one by one: the result loads with from_pretrained and equals pruning the model in memory."""
    full, x = _build("llama")
    full.config.tie_word_embeddings = True
    full.tie_weights()
    src, dst = tmp_path / "src", tmp_path / "dst"
    full.save_pretrained(src, max_shard_size="200KB")
    assert len(list(src.glob("*.safetensors"))) > 2
    model = pfx_hf.meta_model(src)
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    dg = prunefx.analyze(model, (ids,))
    scores = prunefx.score(model, dg, "l2", weights=pfx_hf.CheckpointTensors(src, model))
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing was loaded into the model
    config = prunefx.PlanConfig(params=0.7, uniform_layers=True, ignore=pfx_hf.stream_patterns(model))
    plan = prunefx.make_plan(dg, scores.values, config, cost=prunefx.CostModel(model, dg, (ids,)),
                             owned_constants=prunefx.transform.owned_modules(model))  # fmt: skip
    assert plan.pruned
    pfx_hf.prune_checkpoint(src, dst, model, dg, plan)
    again = T.LlamaForCausalLM.from_pretrained(dst).eval()
    reference = T.LlamaForCausalLM.from_pretrained(src).eval()
    prunefx.apply_plan(reference, prunefx.analyze(reference, x), plan)  # same plan: same fingerprint, real weights
    assert _same_outputs(reference, again, x) == 0.0
    assert again.lm_head.weight is again.model.embed_tokens.weight
    with pytest.raises(prunefx.PrunefxError, match="not empty"):
        pfx_hf.prune_checkpoint(src, dst, pfx_hf.meta_model(src), dg, plan)


def _ones_plan(model):
    """A plan for ``model`` (on the meta device) that keeps 70% of the parameters, channels ranked by position."""
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    dg = prunefx.analyze(model, (ids,))
    values = {g.id: torch.arange(g.channels, 0, -1).double().numpy() for g in dg.groups if g.prunable}
    config = prunefx.PlanConfig(params=0.7, uniform_layers=True, ignore=pfx_hf.stream_patterns(model))
    return dg, prunefx.make_plan(dg, values, config, cost=prunefx.CostModel(model, dg, (ids,)),
                                 owned_constants=prunefx.transform.owned_modules(model))


def test_a_truncated_shard_is_named_with_the_fix(tmp_path):
    full, _ = _build("llama")
    src = tmp_path / "src"
    full.save_pretrained(src, max_shard_size="200KB")
    shard = sorted(src.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a copy that stopped halfway
    damaged = rf"{shard.name} is not a readable safetensors file \(Error while deserializing header: .*\); it is " \
              r"truncated or damaged: copy or download the checkpoint again"
    with pytest.raises(prunefx.PrunefxError, match=damaged):
        pfx_hf.CheckpointTensors(src, pfx_hf.meta_model(src))  # reads every shard's header
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    name = next(k for k, v in index.items() if v == shard.name)
    with pytest.raises(prunefx.PrunefxError, match=damaged):
        pfx_hf.CheckpointTensors(src)[name]
    single = tmp_path / "single"
    full.save_pretrained(single)
    (single / "model.safetensors").write_bytes(b"")
    with pytest.raises(prunefx.PrunefxError, match=r"model\.safetensors is not a readable safetensors file"):
        pfx_hf.CheckpointTensors(single)


def test_a_checkpoint_whose_config_disagrees_names_the_tensor(tmp_path):
    """config.json edited after saving: the error names the tensor and both shapes, not what the config can express."""
    full, _ = _build("llama")
    src, dst = tmp_path / "src", tmp_path / "dst"
    full.save_pretrained(src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "hidden_size": 64}))
    model = pfx_hf.meta_model(src)
    mismatch = (r"src: tensor 'lm_head\.weight' is \(128, 96\) in model\.safetensors but \(128, 64\) in the "
                r"LlamaForCausalLM its config\.json describes; the checkpoint and its config\.json disagree")
    with pytest.raises(prunefx.PrunefxError, match=mismatch):
        pfx_hf.CheckpointTensors(src, model)  # scores of these weights would rank the wrong channels
    dg, plan = _ones_plan(model)
    with pytest.raises(prunefx.PrunefxError, match=mismatch):
        pfx_hf.prune_checkpoint(src, dst, model, dg, plan)
    assert not dst.exists()


@pytest.mark.parametrize("shard", ["../victim/model.safetensors", "/tmp/elsewhere.safetensors", "..", "a\\b"])
def test_a_shard_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path, shard):
    """Shard names come from the index file: one that leads out of the checkpoint is refused before any read or write
    (it overwrote another checkpoint's weights)."""
    full, _ = _build("llama")
    src, dst, victim = tmp_path / "src", tmp_path / "dst", tmp_path / "victim"
    full.save_pretrained(src, max_shard_size="200KB")
    victim.mkdir()
    (victim / "model.safetensors").write_bytes(b"another checkpoint's weights")
    index = json.loads((src / "model.safetensors.index.json").read_text())
    name = sorted(index["weight_map"])[0]
    index["weight_map"][name] = shard
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    unsafe = rf"src/model\.safetensors\.index\.json: the shard of {name!r}: .* is not a plain file name"
    with pytest.raises(prunefx.PrunefxError, match=unsafe):
        pfx_hf.CheckpointTensors(src)
    dg, plan = _ones_plan(pfx_hf.meta_model(src))
    with pytest.raises(prunefx.PrunefxError, match=unsafe):
        pfx_hf.prune_checkpoint(src, dst, pfx_hf.meta_model(src), dg, plan)
    assert (victim / "model.safetensors").read_bytes() == b"another checkpoint's weights"
    assert not dst.exists()


def test_a_link_planted_in_the_destination_is_never_written_through(tmp_path, monkeypatch):
    """A link that appears in the (checked, empty) destination while the checkpoint is written is refused, never
    written through (config.json was written with open(), which follows it)."""
    from prunefx.integrations.transformers import checkpoint as pfx_checkpoint

    full, _ = _build("llama")
    src, dst, victim = tmp_path / "src", tmp_path / "dst", tmp_path / "victim.json"
    full.save_pretrained(src)
    victim.write_bytes(b"a user's file")
    real = pfx_checkpoint.check_destination

    def then_planted(path, **kwargs):
        real(path, **kwargs)
        path.mkdir()
        (path / "config.json").symlink_to(victim)

    monkeypatch.setattr(pfx_checkpoint, "check_destination", then_planted)
    dg, plan = _ones_plan(pfx_hf.meta_model(src))
    with pytest.raises(prunefx.PrunefxError, match=r"dst/config\.json is a symbolic link .*prunefx does not write "
                                                   r"through links"):
        pfx_hf.prune_checkpoint(src, dst, pfx_hf.meta_model(src), dg, plan)
    assert victim.read_bytes() == b"a user's file" and (dst / "config.json").is_symlink()


def test_activation_criterion_ranks_a_silent_mlp_unit_last():
    """Unit 5 of layer 0's MLP has the largest weights but its gate is zero, so it never carries a signal: weight
    norms keep it, activations drop it first."""
    model, x = _build("llama")
    mlp = model.model.layers[0].mlp
    with torch.no_grad():
        mlp.gate_proj.weight[5] = 0.0
        mlp.down_proj.weight[:, 5] *= 50.0
        mlp.up_proj.weight[5] *= 50.0
    dg = prunefx.analyze(model, x)
    (g,) = dg.groups_of("model.layers.0.mlp.gate_proj")
    calibration = [torch.randint(0, V, (2, 16)) for _ in range(2)]
    act = prunefx.score(model, dg, "activation", calibration=calibration)
    l2 = prunefx.score(model, dg, "l2")
    assert act.used[g.id] == "activation"
    assert int(act.values[g.id].argmin()) == 5
    assert int(l2.values[g.id].argmax()) == 5
    with pytest.raises(prunefx.PrunefxError, match="needs calibration"):
        prunefx.score(model, dg, "activation")


def test_seven_billion_widths_analyse_on_the_meta_device():
    """Two layers of Llama-2-7B's widths on the meta device: nothing is allocated, heads and MLP widths group."""
    cfg = T.LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=2, num_attention_heads=32,
                        num_key_value_heads=32, vocab_size=32000)  # fmt: skip
    with torch.device("meta"):
        model = T.LlamaForCausalLM(cfg)
    dg = prunefx.analyze(model, (torch.zeros(1, 8, dtype=torch.long, device="meta"),))
    assert all(t.device.type == "meta" for t in (*model.parameters(), *model.buffers()))
    sizes = sorted(g.channels for g in dg.prunable)
    assert sizes == [32, 32, 4096, 11008, 11008]  # heads x2, the residual stream, MLP x2


def test_bias_compensation_folds_into_gpt2_conv1d_biases():
    """Hugging Face's Conv1D stores its weight (in, out): compensation finds the input dim from the analysis."""
    model, x = _build("gpt2")
    x = (torch.randint(0, V, (4, 16)),)
    # the generic API: pfx_hf.prune would keep GPT-2's heads (its config cannot write fewer), and c_attn's are wanted
    config = prunefx.PlanConfig(ratio=0.3, scope="local", ignore=pfx_hf.stream_patterns(model), uniform_layers=True)
    result = prunefx.prune(model, x, config, criterion="l2", bias_compensation=True)
    folded = dict(result.compensation.folded)
    assert folded == {f"transformer.h.{i}.{p}.c_proj": "bias" for i in range(2) for p in ("attn", "mlp")}
    assert not result.compensation.skipped
    assert result.verified.ok and result.verified.exact, result.verified.message


@pytest.mark.filterwarnings("ignore::prunefx.errors.TiedScoresWarning")  # random-init weights: near-tied norms
@pytest.mark.parametrize(("name", "readers"), [
    ("llama", ("model.layers.{}.self_attn.o_proj", "model.layers.{}.mlp.down_proj")),
    ("gpt2", ("transformer.h.{}.attn.c_proj", "transformer.h.{}.mlp.c_proj")),
])
def test_refit_fits_the_projections_that_read_pruned_heads_and_mlp_units(name, readers):
    # The re-fit on a decoder: o_proj / down_proj (Linear) and GPT-2's c_proj (Conv1D, weight (in, out)) read the
    # cut heads and MLP units; their least-squares weights bring the logits closer on tokens the fit never saw.
    model, x = _build(name)
    g = torch.Generator().manual_seed(5)
    calib = [torch.randint(0, V, (8, 16), generator=g) for _ in range(12)]
    held_out = torch.randint(0, V, (8, 16), generator=g)
    with torch.no_grad():
        want = model(held_out).logits
    config = prunefx.PlanConfig(ratio=0.5, scope="local", ignore=pfx_hf.stream_patterns(model))
    errors = {}
    for on in (False, True):
        result = prunefx.prune(copy.deepcopy(model), x, config, criterion="l2", refit=on,
                               calibration=calib if on else None, bias_compensation=False)
        assert result.verified.ok and result.verified.exact, result.verified.message  # structure proved first
        with torch.no_grad():
            errors[on] = float((result.model(held_out).logits - want).norm() / want.norm())
        if on:
            applied = {x.name for x in result.refit.layers if x.applied}
            assert {r.format(i) for r in readers for i in range(2)} <= applied, result.refit.layers
            assert result.refit.after < result.refit.before
    assert errors[True] < errors[False]


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow)
                                  for n in sorted(HEADS_NOT_EXPRESSIBLE)])
def test_pfx_hf_prune_keeps_heads_the_config_cannot_write_so_the_plan_saves(name, tmp_path):
    model, x = _build(name)
    result = pfx_hf.prune(model, x, prunefx.PlanConfig(ratio=0.3, scope="local"))
    assert result.verified.ok and _pruned_kinds(result) == {"mlp"}, result.plan.summary()
    assert not [w for w in result.warnings if "model.config" in w]
    pfx_hf.save_pretrained(model, tmp_path / "hf")
    again = type(model).from_pretrained(tmp_path / "hf").eval()
    assert _same_outputs(model, again, x) <= 1e-5


def test_the_users_own_save_pretrained_round_trips_after_prune(tmp_path):
    # pfx_hf.prune writes the pruned widths into model.config in place: the plain HF path needs no prunefx
    model, x = _build("llama")
    before = model.config.intermediate_size
    result = pfx_hf.prune(model, x, prunefx.PlanConfig(ratio=0.3, scope="local"))
    assert result.verified.ok and not [w for w in result.warnings if "model.config" in w]
    assert model.config.intermediate_size == model.model.layers[0].mlp.up_proj.out_features < before
    attn = model.model.layers[0].self_attn
    assert model.config.num_key_value_heads == attn.k_proj.out_features // model.config.head_dim
    model.save_pretrained(tmp_path / "plain")
    again = T.AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    assert _same_outputs(model, again, x) <= 1e-5


def test_a_config_that_cannot_express_the_pruned_model_is_left_and_warned():
    model, x = _build("bert")  # BERT derives head_dim from hidden_size / heads: pruned heads cannot be written
    heads = model.config.num_attention_heads
    prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.3, scope="local", ignore=pfx_hf.stream_patterns(model),
                                               uniform_layers=True), criterion="l2")  # heads pruned anyway
    with pytest.warns(pfx_hf.ConfigStaleWarning, match="model.config still holds the unpruned widths"):
        said = pfx_hf.update_config(model)
    assert model.config.num_attention_heads == heads and "prunefx.save" in said


def test_a_tokenizer_style_batch_is_keyword_inputs_through_prune_and_calibration():
    """``{"input_ids", "attention_mask"}`` (what a tokenizer returns) as example inputs and calibration batches."""
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**GQA)).eval()
    original = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, :3] = 0  # left padding: the mask changes the output, so it must reach the model
    batch = {"input_ids": torch.randint(0, V, (2, 8), generator=g), "attention_mask": mask}
    calibration = [{"input_ids": torch.randint(0, V, (4, 8), generator=g), "attention_mask": torch.ones(4, 8,
                   dtype=torch.int64)} for _ in range(4)]
    result = pfx_hf.prune(model, batch, prunefx.PlanConfig(ratio=0.3, scope="local"), criterion="activation",
                          calibration=calibration)
    assert result.verified.ok and result.verified.exact, result.verified.message
    assert _pruned_kinds(result) == {"heads", "mlp"}, result.plan.summary()
    with torch.no_grad():
        masked = original(**batch).logits
        unmasked = original(input_ids=batch["input_ids"]).logits
        assert not torch.allclose(masked[1], unmasked[1], atol=1e-4)  # the mask matters for this batch
        assert model(**batch).logits.shape == masked.shape


def test_falcons_transposed_weights_are_inferred_and_its_mlp_pruned_exactly():
    """Falcon computes ``x @ weight.T`` (aten numpy_T, no rule): probed as a transpose, its MLP becomes prunable."""
    torch.manual_seed(0)
    model = T.FalconForCausalLM(T.FalconConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2,
                                               num_attention_heads=4)).eval()
    x = _ids()
    dg = prunefx.analyze(model, x)
    assert dg.inferred_ops and all("numpy_T: input 0 dim 0 identity -> dim 1" in v for v in dg.inferred_ops.values())
    assert not dg.unknown_ops and dg.prunable
    original = copy.deepcopy(model)
    result = pfx_hf.prune(model, x, prunefx.PlanConfig(ratio=0.3, scope="local"))
    assert result.verified.ok and result.verified.exact, result.verified.message
    before, after = prunefx.metrics.measure(original, x).macs, prunefx.metrics.measure(model, x).macs
    assert after < before
    # the plan's estimate follows the layers whose forward is their own code (x @ weight.T): within 2%
    est = result.plan.estimate
    assert est["macs_after"] / est["macs_before"] == pytest.approx(after / before, rel=0.02)


def test_per_layer_widths_are_exact_differ_by_layer_and_round_trip_through_prunefx_save(tmp_path):
    # per_layer=True: one global ranking, each layer its own MLP width; the config has one value per field, so it
    # is left as it was (warned) and prunefx.save / load rebuild the pruned model from a fresh one
    model, x = _build("llama")
    original = copy.deepcopy(model.config)
    with pytest.warns(pfx_hf.ConfigStaleWarning, match="model.config still holds the unpruned widths"):
        result = pfx_hf.prune(model, x, prunefx.PlanConfig(params=0.6), per_layer=True)
    assert result.verified.ok and not result.plan.target.get("uniform_layers")
    widths = [layer.mlp.up_proj.out_features for layer in model.model.layers]
    assert len(set(widths)) > 1 and max(widths) <= original.intermediate_size, widths
    assert model.config.intermediate_size == original.intermediate_size  # untouched: it cannot say the widths
    kept = sum(p.numel() for p in model.parameters()) / sum(
        p.numel() for p in T.AutoModelForCausalLM.from_config(original).parameters())
    assert abs(kept - 0.6) <= 0.02, kept
    prunefx.save(model, result.plan, tmp_path / "pruned.pt")
    again = prunefx.load(tmp_path / "pruned.pt", lambda: T.AutoModelForCausalLM.from_config(original)).eval()
    assert [layer.mlp.up_proj.out_features for layer in again.model.layers] == widths
    assert _same_outputs(model, again, x) <= 1e-5
