"""recalibrate_bn: every BatchNorm's running statistics become the mean over the calibration batches of the batch
statistics its input has (computed here independently with F.batch_norm in batch-statistics mode), dropout stays
off, and modes, momenta and weights are put back."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from prunefx.train.bn_recalibration import recalibrate_bn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.drop = nn.Dropout(0.5)
        self.conv2, self.bn2 = nn.Conv2d(6, 5, 1, bias=False), nn.BatchNorm2d(5)
        self.free = nn.BatchNorm2d(5, track_running_stats=False)

    def forward(self, x):
        return self.free(self.bn2(self.conv2(self.drop(torch.relu(self.bn1(self.conv1(x)))))))


def _expected(net: Net, batches: list[torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per BatchNorm: mean over batches of its input's per-channel mean and unbiased variance, BatchNorms upstream
    normalising by their batch's statistics (what a training-mode BatchNorm does), dropout off."""
    stats: dict[str, list] = {"bn1": [], "bn2": []}
    with torch.no_grad():
        for x in batches:
            z1 = net.conv1(x)
            stats["bn1"].append((z1.mean((0, 2, 3)), z1.var((0, 2, 3), unbiased=True)))
            h = F.batch_norm(z1, None, None, net.bn1.weight, net.bn1.bias, training=True, eps=net.bn1.eps)
            z2 = net.conv2(torch.relu(h))
            stats["bn2"].append((z2.mean((0, 2, 3)), z2.var((0, 2, 3), unbiased=True)))
    return {k: (torch.stack([m for m, _ in v]).mean(0), torch.stack([s for _, s in v]).mean(0))
            for k, v in stats.items()}


def test_running_stats_equal_the_calibration_batch_statistics():
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():  # stale statistics, far from the calibration data's
        for bn in (net.bn1, net.bn2):
            bn.running_mean.fill_(-5.0)
            bn.running_var.fill_(0.01)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    batches = [torch.randn(8, 3, 8, 8) * 3 + 2 for _ in range(3)]
    weights = {k: v.clone() for k, v in net.named_parameters()}
    want = _expected(net, batches)
    done = recalibrate_bn(net, batches)
    assert done.layers == ("bn1", "bn2") and done.batches == 3
    for name, (mean, var) in want.items():
        bn = getattr(net, name)
        torch.testing.assert_close(bn.running_mean, mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(bn.running_var, var, rtol=1e-5, atol=1e-5)
        assert bn.momentum == 0.1 and int(bn.num_batches_tracked) == 3
    assert not any(m.training for m in net.modules())  # evaluation mode everywhere, as before
    assert all(torch.equal(weights[k], v) for k, v in net.named_parameters())
    # in evaluation mode the recalibrated first BatchNorm now normalises its input to mean ~0 over the data
    with torch.no_grad():
        out = torch.cat([net.bn1(net.conv1(x)) - net.bn1.bias[:, None, None] for x in batches])
    assert out.mean((0, 2, 3)).abs().max() < 1e-4


def test_training_mode_is_put_back_and_no_batch_is_refused():
    net = Net().train()
    recalibrate_bn(net, [(torch.randn(4, 3, 8, 8),)])  # a batch as a tuple of positional inputs
    assert all(m.training for m in net.modules())
    with pytest.raises(ValueError, match="no batch"):
        recalibrate_bn(net, [])
