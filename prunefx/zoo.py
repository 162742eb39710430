"""Small classifiers with BatchNorm for the classification pipeline's configs and tests (``package.module:factory``).

>>> model = bn_cnn(num_classes=10, in_channels=1)       # config: model: prunefx.zoo:bn_cnn

The pipeline passes ``num_classes`` and ``in_channels`` (from the dataset) to a factory that accepts them.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def _block(cin: int, cout: int) -> list[nn.Module]:
    # No conv bias: the BatchNorm after it has one, and its gamma is what network slimming ranks.
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def bn_cnn(num_classes: int = 10, in_channels: int = 1, widths: Sequence[int] = (32, 64, 64, 128)) -> nn.Sequential:
    """Four 3x3 conv-BN-ReLU blocks, 2x2 max-pools after the 2nd and 3rd, global average pool, one Linear.

    >>> bn_cnn(10, 3)(torch.zeros(2, 3, 32, 32)).shape   # torch.Size([2, 10])
    """
    w1, w2, w3, w4 = widths
    return nn.Sequential(*_block(in_channels, w1), *_block(w1, w2), nn.MaxPool2d(2), *_block(w2, w3), nn.MaxPool2d(2),
                         *_block(w3, w4), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w4, num_classes))


def bn_cnn_small(
    num_classes: int = 10, in_channels: int = 3, widths: Sequence[int] = (32, 64, 64, 128)
) -> nn.Sequential:
    """A cheaper :func:`bn_cnn` for 32 px images: a max-pool right after the first block too (about 1/2 the MACs).

    >>> bn_cnn_small(10, 3)(torch.zeros(2, 3, 32, 32)).shape   # torch.Size([2, 10])
    """
    w1, w2, w3, w4 = widths
    return nn.Sequential(
        *_block(in_channels, w1),
        nn.MaxPool2d(2),
        *_block(w1, w2),
        *_block(w2, w3),
        nn.MaxPool2d(2),
        *_block(w3, w4),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(w4, num_classes),
    )


def bn_cnn_synthetic(num_classes: int = 10, in_channels: int = 3) -> nn.Sequential:
    """The :func:`bn_cnn_small` used by ``experiments/classify_slimming.py`` on the synthetic set (5.2 M MACs at 32 px).

    >>> bn_cnn_synthetic()(torch.zeros(2, 3, 32, 32)).shape   # torch.Size([2, 10])
    """
    return bn_cnn_small(num_classes, in_channels, widths=(16, 32, 32, 64))


__all__ = ["bn_cnn", "bn_cnn_small", "bn_cnn_synthetic"]
