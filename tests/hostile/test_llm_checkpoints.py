"""Checkpoints in the LLM pipeline and the Hugging Face helpers: every broken file is one line naming the file or
tensor, a pickle is never unpickled beyond weights-only (none in a run directory at all), a full disk names the
directory, and a depth no model can lose is refused before any compute."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from _hostile import REPO, Sandbox, _Payload, assert_refused, assert_untouched, invoke

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from safetensors import SafetensorError

from prunefx.errors import StorageError

CONFIG = REPO / "configs" / "llm.yaml"
SMALL = ["seq_len=16", "batch=2", "train_batches=2", "val_batches=1", "tokenizer=bytes", "prune.finetune.epochs=0",
         "project=runs", "name=r"]
FULL = "Error while serializing: I/O error: No space left on device (os error 28)"  # what safetensors raises


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture
def ckpt(sandbox: Sandbox) -> Path:
    """A 2-layer byte-vocabulary Llama as save_pretrained writes it, and a text file, in the sandbox."""
    _llama().save_pretrained(sandbox.root / "ckpt")
    (sandbox.root / "text.txt").write_text("def f(x):\n    return x + 1\n" * 200)
    return sandbox.root / "ckpt"


def _prune(*args: str):
    return invoke("prune", CONFIG, "text=text.txt", *SMALL, *args)


def _plant_pickle(box: Sandbox, directory: Path) -> None:
    """A pickled pytorch_model.bin whose unpickling writes the marker, and no safetensors beside it."""
    for p in directory.glob("model*.safetensors*"):
        p.unlink()
    torch.save({"model.embed_tokens.weight": _Payload(f"open({str(box.marker)!r}, 'w').close()")},
               directory / "pytorch_model.bin")


def test_a_config_that_disagrees_with_the_weights_names_the_tensor(sandbox: Sandbox, ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 48}))
    before = sandbox.snapshot()
    assert_refused(_prune("model=ckpt"), r"^error: model ckpt does not load: ckpt: tensor "
                                         r"'model\.layers\.0\.mlp\.down_proj\.weight' is \(32, 64\) in "
                                         r"model\.safetensors but \(32, 48\) in the LlamaForCausalLM its config\.json "
                                         r"describes; .*fix config\.json")
    assert_untouched(sandbox, before)


def test_a_truncated_safetensors_file_is_named(sandbox: Sandbox, ckpt: Path) -> None:
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = sandbox.snapshot()
    assert_refused(_prune("model=ckpt"), r"ckpt/model\.safetensors is not a readable safetensors file \(.*\); it is "
                                         r"truncated or damaged")
    assert_untouched(sandbox, before)


def test_a_pickled_checkpoint_is_never_unpickled(sandbox: Sandbox, ckpt: Path) -> None:
    _plant_pickle(sandbox, ckpt)
    before = sandbox.snapshot()
    assert_refused(_prune("model=ckpt"), r"model ckpt was not loaded: its pickled weights hold objects beyond "
                                         r"tensors.*convert the checkpoint to safetensors")
    assert_untouched(sandbox, before)  # the marker: no payload ran


def test_a_pickle_planted_in_a_run_directory_is_never_read(sandbox: Sandbox, ckpt: Path) -> None:
    """A run's own checkpoints are read from safetensors only: a pytorch_model.bin put in their place is refused."""
    from prunefx.pipeline.backends.llm import LlmBackend, LlmJob
    from prunefx.pipeline.run_config import ConfigError

    job = LlmJob.from_config({"task": "llm", "model": "ckpt", "text": "text.txt", "seq_len": 16, "batch": 2,
                              "train_batches": 2, "val_batches": 1, "tokenizer": "bytes"})
    backend = LlmBackend(job, log=lambda _: None)
    backend.root = sandbox.project / "r"
    backend.root.mkdir(parents=True)
    backend.save(backend.load("baseline"), "pruned")
    pruned = backend.root / "weights" / "pruned"
    _plant_pickle(sandbox, pruned)
    backend._models.clear()  # a resumed run: nothing held in memory
    with pytest.raises(ConfigError, match=rf"^model {pruned} does not load: no safetensors checkpoint in {pruned}"):
        backend.load("pruned")
    assert not sandbox.marker.exists()


def test_a_full_disk_on_save_pretrained_names_the_directory(sandbox: Sandbox, ckpt: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from prunefx.integrations import transformers as pfx_hf
    from prunefx.pipeline.backends.llm import LlmBackend, LlmJob

    def full(self, *args, **kwargs):
        raise SafetensorError(FULL)

    job = LlmJob.from_config({"task": "llm", "model": "ckpt", "text": "text.txt", "seq_len": 16, "batch": 2,
                              "train_batches": 2, "val_batches": 1, "tokenizer": "bytes"})
    backend = LlmBackend(job, log=lambda _: None)
    backend.root = sandbox.project / "r"
    backend.root.mkdir(parents=True)
    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    with pytest.raises(StorageError, match=r"^cannot write .*runs/r/weights/pruned: no space left on the device; "
                                           r"free space there"):
        backend.save(backend.load("baseline"), "pruned")
    assert os.listdir(backend.root / "weights") == []  # no half-written save left
    with pytest.raises(StorageError, match=r"^cannot write .*out: no space left on the device"):
        pfx_hf.save_pretrained(_llama(), sandbox.root / "out")


@pytest.mark.filterwarnings("ignore::prunefx.errors.TargetMissedWarning")  # any plan that cuts something will do
def test_a_full_disk_while_a_checkpoint_is_pruned_names_the_shard(sandbox: Sandbox, ckpt: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import prunefx
    from prunefx.integrations import transformers as pfx_hf
    from prunefx.integrations.transformers import checkpoint as pfx_checkpoint

    model = pfx_hf.meta_model(ckpt)
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    dg = prunefx.analyze(model, (ids,))
    values = {g.id: torch.arange(g.channels, 0, -1).double().numpy() for g in dg.groups if g.prunable}
    plan = prunefx.make_plan(dg, values, prunefx.PlanConfig(ratio=0.3, uniform_layers=True,
                                                            ignore=pfx_hf.stream_patterns(model)))

    def full(*args, **kwargs):
        raise SafetensorError(FULL)

    monkeypatch.setattr(pfx_checkpoint, "save_file", full)
    with pytest.raises(StorageError, match=r"^cannot write .*out/model\.safetensors: no space left on the device"):
        pfx_hf.prune_checkpoint(ckpt, sandbox.root / "out", model, dg, plan)
    assert os.listdir(sandbox.root / "out") == []


def test_an_empty_text_file_is_one_line(sandbox: Sandbox, ckpt: Path) -> None:
    (sandbox.root / "empty.txt").write_text("")
    before = sandbox.snapshot()
    assert_refused(invoke("prune", CONFIG, "text=empty.txt", *SMALL, "model=ckpt"),
                   r"^error: text empty\.txt holds no text \(empty or whitespace only\); give files with text")
    assert_untouched(sandbox, before)


@pytest.mark.parametrize(("arg", "message"), [
    ("prune.depth.remove=2", r"prune\.depth\.remove=2, but LlamaForCausalLM can lose at most 1 of its 2 decoder "
                             r"layers: one of each kind stays.*; give remove <= 1$"),
    ("prune.depth.remove=3", r"prune\.depth\.remove=3, but LlamaForCausalLM can lose at most 1"),
    ("prune.experts.keep=0.5", r"prune\.experts\.keep=0\.5, but ckpt has no MoE layer prunefx knows; remove "
                               r"prune\.experts$"),
])
def test_a_cut_the_model_cannot_take_is_refused_before_any_compute(sandbox: Sandbox, ckpt: Path, arg: str,
                                                                   message: str) -> None:
    """Removing every decoder layer used to run the baseline and the cut, then blame an ignore pattern."""
    before = sandbox.snapshot()
    result = _prune("model=ckpt", arg)
    assert_refused(result, rf"^error: {message}")
    assert "baseline" not in result.output  # refused before the baseline ran
    assert not (sandbox.project / "r").exists()
    assert_untouched(sandbox, before)
