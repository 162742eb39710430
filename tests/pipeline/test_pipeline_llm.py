"""`prunefx prune configs/llm.yaml`: a causal LM cut in depth and width, re-fitted, distilled, saved for HF."""

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from prunefx.cli.main import app
from prunefx.data.text import mean_loss, windows
from prunefx.pipeline.run_config import ConfigError

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "llm.yaml")
# CI's xdist workers (--dist loadgroup): test_pipeline_llm.py and test_pipeline_custom.py run on one worker, whose
# base temp dir holds the example models they train once (the _cache fixture below)
pytestmark = pytest.mark.xdist_group("examples_cache")
SMALL = ["seq_len=64", "batch=4", "train_batches=8", "val_batches=2", "prune.finetune.epochs=1"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    # the embedded model is trained once per test session (about 80 s), outside the repository
    monkeypatch.setenv("PRUNEFX_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _prune(*args: str):
    return CliRunner().invoke(app, ["prune", CONFIG, *args])


def _reload(path: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()


def _val_windows(ids: torch.Tensor, seq: int = 64, batch: int = 4, n: int = 2) -> list[tuple]:
    return windows(ids[int(len(ids) * 0.9):], n, batch, seq, seed=None)


@pytest.mark.slow
def test_the_embedded_model_is_cut_in_depth_and_width_refitted_distilled_and_saved_for_hf(tmp_path: Path) -> None:
    from prunefx.examples.stdlib_lm import corpus

    result = _prune(f"project={tmp_path}", "name=lm", *SMALL)
    assert result.exit_code == 0, result.output
    run = tmp_path / "lm"
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "complete" and list(state["stages"]) == ["baseline", "prune", "finetune", "report"]
    prune = state["stages"]["prune"]
    assert len(prune["depth"]["removed"]) == 1 and prune["depth"]["verify"].startswith("pruned model ==")
    assert float(prune["depth"]["verify"].rsplit("max rel error ", 1)[1].split()[0]) <= 1e-4  # the oracle's number
    report = json.loads((run / "report.json").read_text())
    kept = report["stages"]["pruned"]["params"] / report["stages"]["baseline"]["params"]
    assert kept == pytest.approx(0.5, rel=0.02)  # the target counts the model given, the depth cut included
    # the checkpoints are plain HF ones: from_pretrained without prunefx, one layer fewer, the reported perplexity
    ids = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).long()
    val = _val_windows(ids)
    for role, stage in (("pruned", "prune"), ("finetuned", "finetune")):
        model = _reload(run / "weights" / role)
        assert model.config.num_hidden_layers == 3 and len(model.model.layers) == 3
        assert sum(p.numel() for p in model.parameters()) == report["stages"][role]["params"]
        assert math.exp(mean_loss(model, val)) == pytest.approx(state["stages"][stage]["metrics"]["ppl"], rel=1e-4)
    before = prune["refit"]["metrics_before"]["ppl"]  # right after the cut, before the re-fit
    ppl = {k: state["stages"][k]["metrics"]["ppl"] for k in ("baseline", "prune", "finetune")}
    assert ppl["baseline"] < 10 and math.isfinite(before)
    assert before > ppl["baseline"] and ppl["finetune"] < ppl["prune"]
    assert not list((run / "weights").glob(".*"))  # no temp directory left behind


def _checkpoint(root: Path, text: str, moe: bool = False) -> Path:
    """A random-init 2-layer Llama (``moe``: Mixtral, 4 experts, top 2) with its own BPE tokenizer trained on
    ``text``, as save_pretrained writes them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    torch.manual_seed(0)
    kind = transformers.MixtralConfig if moe else transformers.LlamaConfig
    config = kind(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None, **({"num_local_experts": 4, "num_experts_per_tok": 2}
                                                          if moe else {}))
    path = root / "ckpt"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def _digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_a_checkpoint_directory_and_its_own_tokenizer_on_the_users_text(tmp_path: Path) -> None:
    import inspect

    text = inspect.getsource(json) * 4
    ckpt = _checkpoint(tmp_path, text)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(text)
    before = _digest(ckpt)
    result = _prune(f"model={ckpt}", f"text={tmp_path / 'docs'}", f"project={tmp_path}", "name=c", *SMALL,
                    "prune.depth.remove=0", "prune.target.params=0.8", "prune.criterion=l2", "prune.refit=false",
                    "prune.finetune.epochs=0")
    assert result.exit_code == 0, result.output
    assert _digest(ckpt) == before  # the user's checkpoint is read, never written
    run = tmp_path / "c"
    saved = run / "weights" / "pruned"
    assert (saved / "tokenizer.json").is_file()  # the pruned checkpoint carries the tokenizer
    model = _reload(saved)
    report = json.loads((run / "report.json").read_text())
    assert report["stages"]["pruned"]["params"] / report["stages"]["baseline"]["params"] == pytest.approx(0.8,
                                                                                                         rel=0.02)
    # the perplexity was measured on the checkpoint's own tokens of the held-out text
    ids = torch.tensor(transformers.AutoTokenizer.from_pretrained(saved)(text, add_special_tokens=False)["input_ids"])
    state = json.loads((run / "state.json").read_text())
    assert math.exp(mean_loss(model, _val_windows(ids))) == pytest.approx(state["stages"]["prune"]["metrics"]["ppl"],
                                                                         rel=1e-4)
    assert "finetune" not in report["stages"] or state["stages"]["finetune"].get("skipped")


def test_a_mixture_of_experts_loses_experts_then_widths_and_reloads(tmp_path: Path) -> None:
    import inspect

    text = inspect.getsource(json) * 4
    ckpt = _checkpoint(tmp_path, text, moe=True)
    (tmp_path / "a.txt").write_text(text)
    result = _prune(f"model={ckpt}", f"text={tmp_path / 'a.txt'}", f"project={tmp_path}", "name=m", *SMALL,
                    "prune.depth.remove=0", "prune.experts.keep=0.5", "prune.target.params=0.4", "prune.criterion=l2",
                    "prune.refit=false", "prune.finetune.epochs=0")
    assert result.exit_code == 0, result.output
    run = tmp_path / "m"
    state = json.loads((run / "state.json").read_text())
    experts = state["stages"]["prune"]["experts"]
    assert all(len(k) == 2 for k in experts["kept"].values()) and len(experts["kept"]) == 2
    assert "router logits at -inf" in experts["verify"] and experts["params_kept"] > 0.4
    model = _reload(run / "weights" / "pruned")
    assert model.config.num_local_experts == 2 and model.config.intermediate_size < 128  # experts, then widths
    report = json.loads((run / "report.json").read_text())
    assert report["stages"]["pruned"]["params"] / report["stages"]["baseline"]["params"] == pytest.approx(0.4,
                                                                                                         rel=0.03)
    assert "Expert cut first" in (run / "report.md").read_text()


def test_bad_inputs_are_one_line_each_before_any_run_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    cases = {
        f"model={tmp_path / 'empty'}": "no checkpoint directory",
        f"text={tmp_path / 'missing.txt'}": "does not exist",
        "prune.depth.criterion=cosine": "prune.depth",
        "prune.controls=[narrow]": "prune.controls",
        "prune.experts.keep=0": "prune.experts.keep",
        "seq_len=1": "seq_len",
        "tokenizer=nowhere": "tokenizer nowhere",
    }
    for arg, says in cases.items():
        result = _prune(arg, f"project={tmp_path / 'runs'}", "name=x")
        assert result.exit_code != 0, arg
        assert says in result.output, (arg, result.output)
        assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


def test_a_checkpoint_that_does_not_reload_as_the_model_is_never_kept(tmp_path: Path) -> None:
    from prunefx.pipeline.backends.llm import LlmBackend, LlmJob

    ckpt = _checkpoint(tmp_path, "def f(x):\n    return x + 1\n" * 400)
    job = LlmJob.from_config({"task": "llm", "model": str(ckpt), "text": str(ckpt / "tokenizer.json"),
                              "seq_len": 32, "batch": 2, "train_batches": 2, "val_batches": 2,
                              "prune": {"target": {"params": 0.8}}})
    backend = LlmBackend(job, log=lambda _msg: None)
    backend.root = tmp_path / "run"
    backend.root.mkdir()
    model = backend.load("baseline")
    model.config.intermediate_size = 64  # a config that no longer describes the weights
    with pytest.raises(Exception, match="does not load|differs"):
        backend.save(model, "pruned")
    assert not (backend.root / "weights" / "pruned").exists()
    assert not list((backend.root / "weights").glob(".*"))


def test_depth_needs_a_pipeline_that_can_save_it() -> None:
    from prunefx.pipeline.backends.classify import ClassifyBackend
    from prunefx.pipeline.run_config import PruneSpec
    from prunefx.pipeline.runner import preflight

    spec = PruneSpec.parse({"target": {"flops": 0.5}, "depth": {"remove": 1}}, train_keys=())

    class Stub:
        cuts = ClassifyBackend.cuts
        name = "torchvision:resnet18"

    with pytest.raises(ConfigError, match="cannot save a depth-pruned model"):
        preflight(spec, Stub())
