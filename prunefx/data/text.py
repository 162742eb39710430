"""Language-model batches from token ids: fixed-length windows, the next-token loss and perplexity."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def windows(ids: torch.Tensor, n: int, batch: int, seq: int, *, seed: int | None = 0) -> list[tuple]:
    """``n`` batches of ``batch`` windows of ``seq`` ids, each an ``(ids, ids)`` pair (targets = inputs, shifted by
    the loss): at seeded random offsets, or evenly spaced over ``ids`` (held-out text) when ``seed`` is None."""
    count = n * batch
    if len(ids) < seq + 1:
        raise ValueError(f"{len(ids)} tokens make no window of {seq}")
    if seed is None:
        stride = (len(ids) - seq) // count
        if stride < 1:
            raise ValueError(f"{len(ids)} tokens hold fewer than {count} distinct windows of {seq}")
        starts = torch.arange(count) * stride
    else:
        starts = torch.randint(0, len(ids) - seq, (count,), generator=torch.Generator().manual_seed(seed))
    stacked = torch.stack([ids[s:s + seq] for s in starts.tolist()])
    return [(w, w) for w in stacked.split(batch)]


def _logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def shifted_loss(out, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats per token) of a causal LM's output against the ids it read
    (a ``loss_fn(outputs, targets)``)."""
    logits = _logits(out)
    ids = ids.to(logits.device)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def next_token_loss(out, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """:func:`shifted_loss` on an ``(ids, ids)`` batch (a ``task_loss(outputs, batch)``)."""
    return shifted_loss(out, batch[1])


def mean_loss(model: nn.Module, batches: Sequence[tuple]) -> float:
    """:func:`next_token_loss` averaged over ``batches`` (equal-sized), the model on its own device."""
    device = next(model.parameters()).device  # recovery may evaluate it on its accelerator
    with torch.no_grad():
        return sum(float(next_token_loss(model(x.to(device)), (x, y))) for x, y in batches) / len(batches)


def perplexity(model: nn.Module, batches: Sequence[tuple]) -> float:
    """exp of :func:`mean_loss`: perplexity per token (lower is better)."""
    return math.exp(mean_loss(model, batches))
