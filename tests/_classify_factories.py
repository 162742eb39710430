"""Model factories for the classification-pipeline tests (``_classify_factories:NAME`` SPECs)."""

from __future__ import annotations

import os

from torch import nn

from prunefx.zoo import bn_cnn


def tiny_bn_cnn(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """A narrower bn_cnn: the pipeline tests train it for a few epochs on 8x8 digits in seconds."""
    return bn_cnn(num_classes, in_channels, widths=(16, 32, 32, 64))


def fails_in_rank1(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """Builds in the parent process and in rank 0, raises in rank 1 of a distributed run (a failing worker)."""
    if os.environ.get("RANK") == "1":
        raise RuntimeError("simulated failure in rank 1")
    return tiny_bn_cnn(num_classes, in_channels)


def nothing_prunable(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    """A linear classifier: its only channels are the input's and the logits, both frozen."""
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))
