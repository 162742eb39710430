"""Bias compensation: removing channels whose BN gamma is 0 leaves a 1x1 / Linear consumer's output unchanged;
prune() applies it only where it helps (measured with data, BatchNorm-scored groups without)."""

import copy
import warnings

import pytest
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


class Res1d(nn.Module):
    """A BN-free residual Conv1d classifier: bn_scale falls back to l2 in every group."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = nn.Conv1d(2, c, 3, padding=1)
        self.a1, self.a2 = nn.Conv1d(c, c, 3, padding=1), nn.Conv1d(c, c, 3, padding=1)
        self.head = nn.Linear(c, 3)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = x + self.a2(torch.relu(self.a1(x)))
        return self.head(torch.relu(x).mean(2))


def _waves(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Three classes of noisy sine by frequency, offset by 1 (inputs a random example tensor does not resemble)."""
    t = torch.linspace(0, 1, 16)
    y = torch.randint(0, 3, (n,), generator=g)
    wave = torch.sin((y + 1).float()[:, None] * 2 * torch.pi * t + torch.rand(n, 1, generator=g) * 6)
    return torch.stack([wave, 0.3 * torch.randn(n, 16, generator=g)], 1) + 1.0, y


@pytest.fixture(scope="module")
def trained_res1d():
    """Res1d trained for 200 Adam steps (seed 0) to separate the classes; held-out data (seed 1)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    net = Res1d()
    opt = torch.optim.Adam(net.parameters(), 1e-2)
    for _ in range(200):
        x, y = _waves(32, g)
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net.eval(), _waves(256, torch.Generator().manual_seed(1))


def _cut(net, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", prunefx.errors.TiedScoresWarning)
        return prunefx.prune(copy.deepcopy(net), torch.randn(1, 2, 16, generator=torch.Generator().manual_seed(2)),
                             PlanConfig(flops=0.5), **kw)


def _error_and_accuracy(net, pruned, x, y):
    with torch.no_grad():
        want, got = net(x), pruned(x)
    return ((got - want).norm() / want.norm()).item(), (got.argmax(1) == y).float().mean().item()


def test_without_data_a_bn_free_net_gets_no_compensation_which_would_raise_its_error(trained_res1d):
    net, (x, y) = trained_res1d
    default, forced, off = _cut(net), _cut(net, bias_compensation=True), _cut(net, bias_compensation=False)
    assert set(default.scores.used.values()) == {"l2 (fallback: no BatchNorm in group)"}
    assert not default.compensation.applied and not default.compensation.folded
    assert "BatchNorm" in default.compensation.why and "bias compensation not applied" in default.summary()
    assert forced.compensation.applied and forced.compensation.folded  # the caller's True is honoured
    assert off.compensation is None
    e_forced, a_forced = _error_and_accuracy(net, forced.model, x, y)
    e_off, a_off = _error_and_accuracy(net, off.model, x, y)
    assert e_forced > e_off  # the case the default must avoid: compensation on this trained net makes it worse
    with torch.no_grad():  # the default is the uncompensated cut: as accurate as bias_compensation=False
        assert torch.equal(default.model(x), off.model(x))
    assert _error_and_accuracy(net, default.model, x, y)[1] == a_off >= a_forced
    assert default.verified.ok and "a few batches of real inputs" in default.summary()  # no data: what data adds


def test_with_data_compensation_that_raises_the_held_out_error_is_not_applied(trained_res1d):
    net, (x, y) = trained_res1d
    calib = [_waves(32, torch.Generator().manual_seed(3))[0]]  # one batch: held out, means from the example alone
    result = _cut(net, calibration=calib, refit=False)
    c = result.compensation
    assert not c.applied and c.held_out == 1 and c.error_with > c.error_without, c.why
    assert "did not lower" in c.why and result.verified.ok
    with torch.no_grad():
        assert torch.equal(result.model(x), _cut(net, bias_compensation=False).model(x))


def test_with_data_compensation_that_lowers_the_held_out_error_is_applied():
    net = _net()
    x = torch.randn(4, 3, 8, 8)
    calib = [torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    result = prunefx.prune(net, x, PlanConfig(ratio=0.25), criterion="bn_scale", calibration=calib, refit=False)
    c = result.compensation
    assert c.applied and c.folded and c.held_out == 1 and c.error_with < c.error_without, c.why
    assert "lowered" in c.why and result.verified.ok, result.verified.message


def test_without_data_only_groups_scored_by_batchnorm_are_compensated():
    net = _net()  # c1 / c2 feed BatchNorms; c3 has none, so its group falls back to l2
    x = torch.randn(4, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", prunefx.errors.TiedScoresWarning)  # b2's gammas are all 1
        result = prunefx.prune(net, x, PlanConfig(ratio=0.5, scope="local"), criterion="bn_scale")
    c3 = result.graph.group_of("c3").id
    pruned = {gp.group for gp in result.plan.pruned}
    assert c3 in pruned and result.scores.used[c3].startswith("l2")
    c = result.compensation
    assert c is not None and c.applied
    assert set(c.groups) == {g for g in pruned if result.scores.used[g] == "bn_scale"} and c3 not in c.groups
    assert "fc" not in dict(c.folded)  # the consumer of c3's channels keeps its bias
    assert result.verified.ok, result.verified.message
