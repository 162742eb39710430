"""BatchNorm recalibration: re-estimate every BatchNorm's running statistics on calibration batches after a cut.

    from prunefx.train.bn_recalibration import recalibrate_bn
    recalibrate_bn(pruned, [x1, x2, ...])    # a few batches of model inputs; no labels, no gradients

A cheap, common recovery after structured pruning: the cut changes what reaches each BatchNorm, so the
statistics it stored during training no longer normalise its input. Each one's running mean and variance are
reset and re-estimated by a forward over the batches in training mode without gradients and with
``momentum=None`` (PyTorch's cumulative moving average: the running statistics become the plain mean over the
batches of each batch's mean and unbiased variance). Only the BatchNorms run in training mode; every other
module stays in evaluation mode (dropout off), so the statistics are those of the network as it will be
evaluated. Afterwards each module's mode and each BatchNorm's momentum are put back. Cost: one forward per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Recalibration:
    """What :func:`recalibrate_bn` did: the BatchNorm layers re-estimated and how many batches they saw."""

    layers: tuple[str, ...]
    batches: int


def recalibrate_bn(model: nn.Module, calibration: Iterable[torch.Tensor | Sequence[Any]]) -> Recalibration:
    """Reset and re-estimate, in place, the running statistics of every BatchNorm of ``model`` on ``calibration``.

    ``calibration``: batches of model inputs, each a tensor (the one input) or a tuple of positional inputs.
    BatchNorms without running statistics (``track_running_stats=False``) are left alone. Raises ValueError
    when there is no batch.
    """
    batches = [(b,) if isinstance(b, torch.Tensor) else tuple(b) for b in calibration]
    if not batches:
        raise ValueError("recalibrate_bn: calibration yielded no batch; pass a few batches of model inputs")
    bns = {name: m for name, m in model.named_modules()
           if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats and m.running_mean is not None}
    modes = {m: m.training for m in model.modules()}
    momenta = {m: m.momentum for m in bns.values()}
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        model.eval()
        for m in bns.values():
            m.reset_running_stats()
            m.momentum = None  # cumulative average: every batch weighs the same, whatever the batch count
            m.train()
        with torch.no_grad():
            for batch in batches:
                model(*(x.to(device) if isinstance(x, torch.Tensor) else x for x in batch))
    finally:
        for m, momentum in momenta.items():
            m.momentum = momentum
        for m, flag in modes.items():
            m.train(flag)
    return Recalibration(tuple(bns), len(batches))


__all__ = ["Recalibration", "recalibrate_bn"]
