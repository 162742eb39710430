"""Small models, one per coupling pattern, shared by the pruning tests."""

import torch
from torch import nn


def randomize_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BN affine params and running stats, so masking a channel changes outputs."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.9 + 0.1)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) - 0.5)
                m.running_mean.copy_((torch.rand(m.running_mean.shape, generator=g) - 0.5) * 0.4)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model


def cbr(cin: int, cout: int, k: int = 3, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
    )


class Patterns(nn.Module):
    """Residual add, SE broadcast mul, concat (incl. the same tensor twice), chunk halves, depthwise,
    grouped conv, channel shuffle, a shared module, and flatten into Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = cbr(3, 16)
        self.a = cbr(16, 16)
        self.se1 = nn.Conv2d(16, 4, 1)
        self.se2 = nn.Conv2d(4, 16, 1)
        self.split = cbr(16, 32, 1)
        self.branch = cbr(16, 16)
        self.dw = cbr(32, 32, 3, groups=32)
        self.gc = cbr(32, 32, 3, groups=4)
        self.shared = cbr(32, 32, 1)
        self.mix = cbr(96, 24, 1)
        self.head = nn.Linear(24 * 4 * 4, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.a(x)
        s = torch.sigmoid(self.se2(torch.relu(self.se1(x.mean((2, 3), keepdim=True)))))
        x = x * s
        a, b = self.split(x).chunk(2, 1)
        y = torch.cat([a, self.branch(b)], 1)
        b_, c, h, w = y.shape
        y = y.view(b_, 2, c // 2, h, w).transpose(1, 2).reshape(b_, c, h, w)  # channel shuffle
        y = self.gc(self.dw(y))
        z = torch.cat([self.shared(y), self.shared(y * 0.5), y], 1)
        z = self.mix(z)
        z = nn.functional.adaptive_avg_pool2d(z, 4)
        return self.head(z.flatten(1))
