"""The language-model backend (``task: llm``): a Hugging Face causal LM and text, cut in depth and width,
re-fitted, distilled, and saved as Hugging Face checkpoints that ``from_pretrained`` loads without prunefx.

    prunefx prune configs/llm.yaml                                   # the embedded default, offline, minutes
    prunefx prune configs/llm.yaml model=path/to/checkpoint text=[corpus.txt] prune.target.params=0.7

* ``model``: a checkpoint directory (``config.json`` + weights, read offline: ``local_files_only``) or
  ``embedded``: :func:`prunefx.examples.stdlib_lm.trained_lm`, a 4-layer byte-level Llama trained here and cached.
  ``trust_code: true`` lets a checkpoint run its own modelling code (``trust_remote_code``).
* ``text``: files or directories of text (read as UTF-8), or ``stdlib`` (the standard-library corpus the
  embedded model was trained on); the last 10% of the tokens are held out. ``tokenizer``: ``auto`` (the
  checkpoint's own; bytes for the embedded model), ``bytes`` (token = byte) or a tokenizer directory.
* Windows of ``seq_len`` tokens, ``batch`` per batch: ``train_batches`` at seeded offsets (calibration, re-fit,
  distillation), ``val_batches`` spread over the held-out text (perplexity).

Stages: **baseline** (perplexity of the model as given), **prune** (``prune.depth`` removes decoder layers by the
depth oracle, then heads and MLP widths by :func:`prunefx.integrations.transformers.prune`, the config updated in
place; with ``prune.refit`` the perplexity right after the cut and after the re-fit), **finetune** (distillation
from the baseline mixed with the next-token loss, :func:`prunefx.train.recover`) and **report**. Each pruned model
is written with ``save_pretrained`` into ``weights/<role>/`` (with the tokenizer) and reloaded by
``AutoModelForCausalLM.from_pretrained`` before it counts as saved: a checkpoint that does not load as the model
it holds is removed and the run stops.
"""

from __future__ import annotations

import contextlib
import copy
import math
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunefx.data.text import mean_loss, next_token_loss, shifted_loss, windows
from prunefx.errors import PrunefxError
from prunefx.pipeline.backends.custom import CustomBackend, CustomJob
from prunefx.pipeline.job import Cuts, ModelRole, imported_on_call
from prunefx.pipeline.run_config import RUN_KEYS, ConfigError, check_keys
from prunefx.pipeline.rundir import RunDir
from prunefx.pipeline.runner import run_job
from prunefx.train.user_code import fenced

STAGES = ("baseline", "prune", "finetune", "report")
EMBEDDED = "embedded"
STDLIB = "stdlib"
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".jsonl", ".csv", ".tex", ".html")
DATA_KEYS = ("text", "tokenizer", "seq_len", "batch", "train_batches", "val_batches")
TOP_KEYS = ("task", "model", *DATA_KEYS, "trust_code", "prune", *RUN_KEYS)
HELD_OUT = 0.1  # the last tenth of the tokens: perplexity is measured there


@dataclass(frozen=True)
class TextData:
    """Where the text comes from and how it is cut into batches (the config's data keys)."""

    text: tuple[str, ...] = (STDLIB,)
    tokenizer: str = "auto"  # auto | bytes | a tokenizer directory
    seq_len: int = 128
    batch: int = 16
    train_batches: int = 32
    val_batches: int = 8

    def __post_init__(self) -> None:
        for key in ("seq_len", "batch", "train_batches", "val_batches"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 + (key == "seq_len"):
                raise ConfigError(f"{key} must be a whole number >= {1 + (key == 'seq_len')}, got {value!r}")
        if not self.text:
            raise ConfigError("text is empty: give text files or directories, or text: stdlib")


@dataclass(frozen=True)
class LlmJob(CustomJob):
    """A validated ``task: llm`` config."""

    data_spec: TextData = TextData()
    trust_code: bool = False  # trust_remote_code for the checkpoint's own modelling code

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, config_name: str = "llm") -> LlmJob:
        """Check every key, before any work; raises :class:`ConfigError`."""
        check_keys(config, TOP_KEYS, "the config (task: llm: model, text, tokenizer, seq_len, batch, ..., prune:)")
        model = config.get("model", EMBEDDED)
        if not isinstance(model, str) or not model:
            raise ConfigError(f"model must be a checkpoint directory or {EMBEDDED!r}, got {model!r}")
        text = config.get("text", STDLIB)
        text = (text,) if isinstance(text, str) else text
        if not isinstance(text, (list, tuple)) or not all(isinstance(t, str) for t in text):
            raise ConfigError(f"text must be a path, a list of paths or {STDLIB!r}, got {text!r}")
        data = TextData(text=tuple(text), **{k: config[k] for k in DATA_KEYS[1:] if k in config})
        spec, distill = cls.recovery_spec(config, "the llm task", criterion="l2")
        trust = config.get("trust_code", False)
        if not isinstance(trust, bool):
            raise ConfigError(f"trust_code must be true or false, got {trust!r}")
        job = cls.build(config, config_name, spec, model=model, data=", ".join(text), metric="perplexity",
                        task_loss="next-token cross-entropy", distill=bool(distill), stages=STAGES,
                        data_spec=data, trust_code=trust)
        job.recover_config()  # the finetune block's keys are RecoverConfig's: checked now, not after the cut
        return job

    def check_inputs(self) -> None:
        if self.model != EMBEDDED and not (Path(self.model) / "config.json").is_file():
            raise ConfigError(f"model {self.model} is no checkpoint directory (no config.json in it); give a "
                              f"directory written by save_pretrained, or model={EMBEDDED}")
        for t in self.data_spec.text:
            if t != STDLIB and not Path(t).exists():
                raise ConfigError(f"text {t} does not exist; give text files or directories, or text={STDLIB}")
        tok = self.data_spec.tokenizer
        if tok not in ("auto", "bytes") and not Path(tok).is_dir():
            raise ConfigError(f"tokenizer {tok} is neither auto, bytes nor a tokenizer directory")


class LlmBackend(CustomBackend):
    """The runner's view of a causal LM on text (see :class:`prunefx.pipeline.job.Backend`)."""

    cuts = Cuts(width=imported_on_call("prunefx.integrations.transformers:prune"),
                depth=imported_on_call("prunefx.integrations.transformers:prune_depth"), before_refit=True,
                experts=imported_on_call("prunefx.integrations.transformers:prune_experts"))
    primary_metric = "ppl"

    def __init__(self, job: LlmJob, log: Callable[[str], None] = print) -> None:
        self.job, self.log = job, log
        self.root: Path | None = None
        self.name = "prunefx.examples.stdlib_lm (embedded)" if job.model == EMBEDDED else job.model
        self.checkpoint = job.model  # the baseline is the model as given: never trained here
        self._model = self._build()
        self._check_cuts()
        self._tokenizer = self._load_tokenizer()
        self._data = self._load_data()
        self._task_loss = next_token_loss
        self._models: dict[str, nn.Module] = {}
        self._baseline_metrics = self._evaluate(self._model)

    def _build(self) -> nn.Module:
        if self.job.model == EMBEDDED:
            from prunefx.examples.stdlib_lm import trained_lm

            return trained_lm().eval()
        return self._from_pretrained(Path(self.job.model)).eval()

    def _check_cuts(self) -> None:
        """Depth and expert targets the model cannot meet (every layer, the last of a kind, fewer experts than a
        token is routed to): refused before any compute, not after the baseline and the cut."""
        from prunefx.integrations.transformers.depth import check_depth
        from prunefx.integrations.transformers.experts import moe_layers, plan_experts

        spec = self.job.prune
        try:
            if spec.depth.remove:
                check_depth(self._model, spec.depth.remove)
        except PrunefxError as exc:
            raise ConfigError(f"prune.depth.{exc}") from None
        if spec.experts.keep < 1:
            layers = moe_layers(self._model)
            if not layers:
                raise ConfigError(f"prune.experts.keep={spec.experts.keep:g}, but {self.name} has no MoE layer "
                                  "prunefx knows; remove prune.experts")
            try:  # the counts alone decide whether the target can be met: any scores will do
                plan_experts(layers, {x.path: torch.zeros(x.num_experts) for x in layers}, "check",
                             keep=spec.experts.keep)
            except PrunefxError as exc:
                raise ConfigError(f"prune.experts: {exc}") from None

    def _from_pretrained(self, path: Path, *, run: bool = False) -> nn.Module:
        """The causal LM at ``path`` (``run``: one this run saved, read from safetensors only: a pickle planted
        in the run directory is never read); every failure one line naming the file or tensor."""
        from transformers import AutoModelForCausalLM

        from prunefx.integrations.transformers.checkpoint import check_shapes, meta_model, shards

        try:
            if run or any((path / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
                # the shapes config.json gives against the weights' headers (nothing loaded): a mismatch names the
                # tensor, a truncated or damaged shard its file
                check_shapes(path, shards(path)[0], meta_model(path, trust_remote_code=self.job.trust_code))
            with _quiet():
                return AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32,
                                                            trust_remote_code=self.job.trust_code,
                                                            use_safetensors=True if run else None, weights_only=True)
        except PrunefxError as exc:
            raise ConfigError(f"model {path} does not load: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - whatever transformers raises: one line naming the checkpoint
            raise ConfigError(_load_error(path, exc)) from None

    def _load_tokenizer(self) -> Any:
        tok = self.job.data_spec.tokenizer
        if tok == "bytes" or (tok == "auto" and self.job.model == EMBEDDED):
            vocab = self._model.get_input_embeddings().num_embeddings
            if vocab < 256:
                raise ConfigError(f"tokenizer bytes needs a vocabulary of >= 256 ids; {self.name} has {vocab}")
            return None
        from transformers import AutoTokenizer

        where = self.job.model if tok == "auto" else tok
        try:
            return AutoTokenizer.from_pretrained(where, local_files_only=True, trust_remote_code=self.job.trust_code)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"no tokenizer loads from {where} ({str(exc).splitlines()[0][:200]}); give tokenizer="
                              "bytes (byte ids) or tokenizer=DIR (a directory holding one)") from exc

    def _tokens(self) -> torch.Tensor:
        raw = b"".join(_read_text(t) for t in self.job.data_spec.text)
        if not raw.strip():
            raise ConfigError(f"text {', '.join(self.job.data_spec.text)} holds no text (empty or whitespace only); "
                              "give files with text, or text=stdlib")
        if self._tokenizer is None:
            return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
        tokenize = fenced(self._tokenizer, "tokenizer", name=type(self._tokenizer).__name__,  # may be remote code
                          fix="fix the tokenizer, or give tokenizer=bytes")
        ids = tokenize(raw.decode("utf-8", errors="replace"), add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def _load_data(self) -> dict[str, list[Any]]:
        d = self.job.data_spec
        limit = getattr(self._model.config, "max_position_embeddings", None)
        if isinstance(limit, int) and d.seq_len > limit:
            raise ConfigError(f"seq_len={d.seq_len} exceeds the model's max_position_embeddings ({limit}); lower it")
        ids = self._tokens()
        cut = int(len(ids) * (1 - HELD_OUT))
        try:
            return {"train": windows(ids[:cut], d.train_batches, d.batch, d.seq_len, seed=0),
                    "val": windows(ids[cut:], d.val_batches, d.batch, d.seq_len, seed=None)}
        except ValueError as exc:
            raise ConfigError(f"text: {len(ids)} tokens are too few for {d.val_batches} validation batches of "
                              f"{d.batch} x {d.seq_len} from the last {HELD_OUT:.0%} ({exc}); give more text or lower "
                              "val_batches / batch / seq_len") from None

    def _evaluate(self, model: nn.Module) -> dict[str, float]:
        was = model.training
        model.eval()
        try:
            nats = mean_loss(model, self._data["val"])
        finally:
            model.train(was)
        return {"ppl": math.exp(nats), "loss": nats}

    # ---- the runner's Backend (the rest is the custom task's) ---------------------------------------------------

    def score_kwargs(self, criterion: str) -> dict[str, Any]:
        if criterion != "taylor":
            return {}
        # taylor needs the loss: labelled batches (a list: positional inputs) and the next-token loss
        batches = [([x], y) for x, y in self._data["train"][:8]]
        return {"calibration": batches, "loss_fn": shifted_loss}

    @property
    def calibration_source(self) -> str:
        d = self.job.data_spec
        return f"training windows of {d.seq_len} tokens from {', '.join(d.text)}"

    def load(self, role: ModelRole) -> nn.Module:
        if role == "baseline":
            return copy.deepcopy(self._model)
        if role not in self._models:
            self._models[role] = self._from_pretrained(self.path(role), run=True).eval()
        return copy.deepcopy(self._models[role])

    def save(self, model: nn.Module, role: ModelRole, plan: Any = None) -> None:
        if role == "baseline":
            return  # the user's checkpoint, as given
        from prunefx.integrations.transformers.pretrained import write_error

        assert self.root is not None, "the runner sets root once the run directory is open"
        final = self.root / "weights" / role
        tmp: Path | None = None
        try:
            self.path(role)  # weights/ made
            tmp = Path(tempfile.mkdtemp(prefix=f".{role}-", dir=final.parent))
            with _quiet():
                model.save_pretrained(tmp)
            if self._tokenizer is not None:
                self._tokenizer.save_pretrained(tmp)
        except Exception as exc:  # a full or read-only disk: one line naming the directory, no half-written save
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            error = write_error(exc, final)
            if error is None:
                raise
            raise error from None
        try:
            self._check_reload(model, tmp, role)
            if final.exists():
                shutil.rmtree(final)  # this run's own earlier save of the role (a resumed stage)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._models[role] = copy.deepcopy(model).eval()

    def _check_reload(self, model: nn.Module, path: Path, role: str) -> None:
        """``from_pretrained(path)`` must give back ``model``: the same logits on the first validation batch."""
        x = self._data["val"][0][0][:2]
        try:
            again = self._from_pretrained(path, run=True).eval()
        except Exception as exc:  # noqa: BLE001 - whatever from_pretrained raises, the checkpoint is not kept
            why = str(exc).splitlines()[0][:300]
            raise PrunefxError(f"the {role} model's save_pretrained checkpoint does not load ({why}); nothing was "
                               "kept") from None
        was = model.training
        model.eval()
        with torch.no_grad():
            want, got = model(x).logits, again(x.to(next(again.parameters()).device)).logits.to(x.device)
        model.train(was)
        err = float((want - got).abs().max() / want.abs().max().clamp_min(1e-12))
        if not err <= 1e-5:
            raise PrunefxError(f"the {role} model reloaded by from_pretrained differs from it (max relative logit "
                               f"error {err:.2e}); nothing was kept")

    def path(self, role: ModelRole) -> Path:
        assert self.root is not None, "the runner sets root once the run directory is open"
        (self.root / "weights").mkdir(exist_ok=True)
        return self.root / "weights" / role

    def settings(self) -> dict[str, Any]:
        d = self.job.data_spec
        return {"model": self.name, "text": list(d.text), "tokenizer": "bytes" if self._tokenizer is None else
                type(self._tokenizer).__name__, "windows": {"seq_len": d.seq_len, "batch": d.batch,
                                                            "train_batches": d.train_batches,
                                                            "val_batches": d.val_batches},
                "metric": f"perplexity per token on {d.val_batches} x {d.batch} windows of the last "
                          f"{HELD_OUT:.0%} of the tokens (loss: nats per token)",
                "saved_as": "weights/<role>/: save_pretrained, checked by AutoModelForCausalLM.from_pretrained"}


@contextlib.contextmanager
def _quiet():
    """transformers' progress bars off (a save or load per stage: the run's log says what happens)."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def _load_error(path: Path, exc: BaseException) -> str:
    """The one line for a checkpoint transformers could not load."""
    import pickle

    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if "trust_remote_code" in str(exc):
        return f"model {path} does not load as a causal LM (it runs its own code: add trust_code=true if you trust it)"
    if isinstance(exc, pickle.UnpicklingError):  # weights-only loading refused a pickled checkpoint: nothing ran
        return (f"model {path} was not loaded: its pickled weights hold objects beyond tensors, and unpickling them "
                "could run any code they hold (prunefx loads weights-only); convert the checkpoint to safetensors")
    return f"model {path} does not load as a causal LM ({type(exc).__name__}: {first})"


def _read_text(source: str) -> bytes:
    """The bytes of a text source: the stdlib corpus, a file, or a directory's text files in sorted order."""
    if source == STDLIB:
        from prunefx.examples.stdlib_lm import corpus

        return corpus()
    path = Path(source)
    if path.is_file():
        return path.read_bytes()
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    if not files:
        raise ConfigError(f"text directory {path} holds no text file ({', '.join(TEXT_SUFFIXES)})")
    return b"\n".join(p.read_bytes() for p in files)


def run_llm_config(config: Mapping[str, Any], config_name: str, log: Callable[[str], None]) -> RunDir:
    """The language-model pipeline of a loaded config (``task: llm``)."""
    return run_llm(LlmJob.from_config(config, config_name=config_name), log=log)


def run_llm(job: LlmJob, *, log: Callable[[str], None] = print) -> RunDir:
    """Run (or resume) every stage of ``job``; returns the finished run directory."""
    return run_job(job, LlmBackend(job, log), log=log)


__all__ = ["STAGES", "LlmBackend", "LlmJob", "TextData", "run_llm", "run_llm_config"]
