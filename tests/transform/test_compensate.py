"""Bias compensation: removing channels whose BN gamma is 0 leaves a 1x1 / Linear consumer's output unchanged."""


import torch
from torch import nn

import prunefx
from prunefx.plan import PlanConfig, make_plan
from prunefx.transform.compensate import compensate
from prunefx.transform.rewrite import apply_plan


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.c3 = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        x = torch.relu(self.c3(x))
        return self.fc(x.mean((2, 3)))


def _net():
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        for bn in (net.b1, net.b2):
            bn.bias.uniform_(0.2, 0.8)  # a removed channel still outputs relu(beta) > 0
            bn.running_var.uniform_(0.5, 1.5)
        net.b1.weight[::2] = 0.0  # network slimming drove half the gammas to zero
    return net


def test_zero_gamma_channels_removed_without_changing_outputs():
    x = torch.randn(4, 3, 8, 8)
    for compensated in (True, False):
        net = _net()
        reference = net(x)
        dg = prunefx.analyze(net, x)
        scores = prunefx.score(net, dg, "bn_scale").values
        plan = make_plan(dg, scores, PlanConfig(ratio=0.25), criterion="bn_scale")
        g = dg.group_of("c1")
        assert next(p for p in plan.groups if p.group == g.id).keep == tuple(range(1, 16, 2))
        if compensated:
            report = compensate(net, dg, plan, (x,))
            assert ("c2", "b2.running_mean") in report.folded
        apply_plan(net, dg, plan)
        err = (net(x) - reference).abs().max().item()
        if compensated:
            assert err < 1e-5  # c2 is 1x1: the constant relu(beta) is folded exactly
        else:
            assert err > 1e-2  # without it the removed constants are missing


def test_prune_api_compensates_and_still_verifies():
    net = _net()
    x = torch.randn(4, 3, 8, 8)
    reference = net(x)
    result = prunefx.prune(net, x, PlanConfig(ratio=0.25), criterion="bn_scale")
    assert result.compensation is not None and result.compensation.folded
    assert result.verified.ok, result.verified.message  # against the equally compensated original
    assert (net(x) - reference).abs().max().item() < 1e-5
