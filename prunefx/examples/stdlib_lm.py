"""A small causal language model on a corpus every machine has: the running Python's standard-library sources.

    model = trained_lm()                 # a 4-layer Llama (transformers), byte-level, trained on first use, cached
    data = make_data()                   # {"train": [(ids, ids), ...], "val": [...]}: 128-byte windows
    metric(model, data["val"])           # {"ppl": ..., "bits_per_byte": ...}

The corpus is a fixed list of ten standard-library modules (:data:`FILES`, present in CPython 3.11 and later),
read as bytes (token = byte, 256 ids); its SHA-256 (:func:`corpus_hash`) is part of the cache key and of every
result, since another Python version ships other sources. The last 10% of the bytes are held out for validation.
The trained model is a state_dict under ``$PRUNEFX_CACHE_DIR/examples`` (default ``.cache/examples``), keyed by
:data:`VERSION`, the corpus hash, the seed and the step count. Needs ``transformers`` (``prunefx[hf]``).
"""

from __future__ import annotations

import functools
import hashlib
import math
import sysconfig
from pathlib import Path

import torch
from torch import nn

from prunefx._extras import require
from prunefx.data.text import mean_loss, next_token_loss, windows
from prunefx.examples._cache import cached

VERSION = 1  # bump when the corpus list, the model or the recipe changes: the cache key
FILES = ("argparse.py", "dataclasses.py", "difflib.py", "enum.py", "functools.py", "inspect.py", "shutil.py",
         "tarfile.py", "textwrap.py", "typing.py")
SEQ, BATCH = 128, 16
STEPS, LR = 600, 3e-3  # AdamW, cosine decay


@functools.cache
def corpus() -> bytes:
    """The corpus: :data:`FILES` of this Python's standard library, concatenated in that order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    missing = [f for f in FILES if not (root / f).is_file()]
    if missing:
        raise FileNotFoundError(f"the standard library at {root} lacks {', '.join(missing)}; the corpus needs "
                                "CPython 3.11 or later with its sources")
    return b"".join((root / f).read_bytes() for f in FILES)


def corpus_hash() -> str:
    """SHA-256 of :func:`corpus`, first 16 hex digits."""
    return hashlib.sha256(corpus()).hexdigest()[:16]


def _split(name: str) -> torch.Tensor:
    ids = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).long()
    cut = int(len(ids) * 0.9)
    return ids[:cut] if name == "train" else ids[cut:]


def make_data(n_train: int = 32, n_val: int = 8, batch: int = BATCH, seq: int = SEQ) -> dict[str, list[tuple]]:
    """Batches of (ids, ids) byte windows: training windows at seeded random offsets, validation ones contiguous."""
    return {"train": windows(_split("train"), n_train, batch, seq, seed=0),
            "val": windows(_split("val"), n_val, batch, seq, seed=None)}


def tiny_llama(layers: int = 4) -> nn.Module:
    """A 4-layer (or ``layers``-layer) Llama: hidden 128, 4 query heads over 2 KV heads, MLP 384, byte vocabulary."""
    transformers = require("transformers", "prunefx.examples.stdlib_lm")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return transformers.LlamaForCausalLM(config)


def trained_lm(seed: int = 0, steps: int = STEPS, layers: int = 4) -> nn.Module:
    """:func:`tiny_llama` trained on the corpus's training bytes (cached; see the module docstring)."""
    torch.manual_seed(seed)
    return train_lm(tiny_llama(layers), seed, steps, f"stdlib-lm-v{VERSION}-{corpus_hash()}-seed{seed}-steps{steps}"
                    + (f"-layers{layers}" if layers != 4 else ""))


def train_lm(model: nn.Module, seed: int, steps: int, key: str | None = None) -> nn.Module:
    """``model`` trained by the recipe of :func:`trained_lm` (cached under ``key`` when given)."""

    def train(model: nn.Module) -> None:
        ids = _split("train")
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - SEQ, (BATCH,), generator=g)
            batch = torch.stack([ids[s:s + SEQ] for s in starts.tolist()])
            loss = task_loss(model(batch), (batch, batch))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()

    if key is None:
        model.train()
        train(model)
        return model.eval()
    return cached(model, key, train)


task_loss = next_token_loss  # next-byte cross-entropy (nats per byte)


def metric(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Perplexity per byte on ``batches`` (lower is better) and the same as bits per byte."""
    nats = mean_loss(model, batches)
    return {"ppl": math.exp(nats), "bits_per_byte": nats / math.log(2)}
