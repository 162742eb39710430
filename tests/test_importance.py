"""Importance criteria: exact scores on hand-set weights, fallback, taylor, registry."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunefx
from prunefx import importance
from prunefx.analysis.roles import Kind
from prunefx.errors import PrunefxError
from prunefx.importance import CRITERIA, register_criterion, score


class Tiny(nn.Module):
    """Group A: c1.out + b1 + residual c2.out + b2 (two BNs); group B: c3.out -> c4.in (no BN);
    group C: c4.out flattened into fc (4 positions per channel); group D: fc.out (frozen: output)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 1, bias=False)
        self.b1 = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 4, 1, bias=False)
        self.b2 = nn.BatchNorm2d(4)
        self.c3 = nn.Conv2d(4, 3, 1)
        self.c4 = nn.Conv2d(3, 4, 1)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        a = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(a)) + a)
        return self.fc(torch.flatten(self.c4(F.relu(self.c3(y))), 1))


@pytest.fixture
def tiny():
    model = Tiny()
    dg = prunefx.analyze(model, torch.randn(1, 2, 2, 2))
    a, b, c, d = (dg.group_of(n) for n in ("c1", "c3", "c4", "fc"))
    assert (a.channels, b.channels, c.channels, d.channels) == (4, 3, 4, 3) and not d.prunable
    assert a is dg.group_of("c2") and len({a.id, b.id, c.id, d.id}) == 4
    return model, dg, a, b, c, d


def _set(p: torch.Tensor, values) -> None:
    with torch.no_grad():
        p.copy_(torch.as_tensor(values, dtype=p.dtype).reshape(p.shape))


def test_bn_scale_averages_every_batchnorm_of_the_group(tiny):
    model, dg, a, b, c, _ = tiny
    _set(model.b1.weight, [1.0, -2.0, 3.0, 0.5])
    _set(model.b2.weight, [0.2, 4.0, -1.0, 0.1])
    s = score(model, dg, "bn_scale")
    np.testing.assert_allclose(s.values[a.id], [0.6, 3.0, 2.0, 0.3])
    assert list(np.argsort(s.values[a.id])) == [3, 0, 2, 1]
    assert s.used[a.id] == "bn_scale"
    assert set(s.values) == {g.id for g in dg.prunable}


def test_group_without_batchnorm_falls_back_and_says_so(tiny):
    model, dg, a, b, c, d = tiny
    s = score(model, dg, "bn_scale")
    assert s.used[b.id] == s.used[c.id] == "l2 (fallback: no BatchNorm in group)"
    np.testing.assert_allclose(s.values[b.id], score(model, dg, "l2").values[b.id])
    s = score(model, dg, "bn_scale", fallback="random", groups=[b, d.id])
    assert s.used == {
        b.id: "random (fallback: no BatchNorm in group)",
        d.id: "random (fallback: no BatchNorm in group)",
    }
    s = score(model, dg, "bn_scale", fallback=None)
    assert b.id not in s.values and s.used[b.id] == "none: no BatchNorm in group"


def test_non_affine_batchnorm_does_not_count():
    model = nn.Sequential(nn.Conv2d(1, 3, 1), nn.BatchNorm2d(3, affine=False), nn.ReLU(), nn.Conv2d(3, 2, 1))
    dg = prunefx.analyze(model, torch.randn(1, 1, 2, 2))
    (g,) = dg.prunable
    assert score(model, dg).used[g.id] == "l2 (fallback: no BatchNorm in group)"


def test_l1_l2_normalise_each_member_and_ignore_biases(tiny):
    model, dg, a, b, c, _ = tiny
    _set(model.c3.weight, [[3, 0, 0, 0], [1, 1, 1, 0], [2, 2, 2, 2]])  # c3.out rows: L1 3,3,8; L2 3,sqrt3,4
    _set(model.c4.weight, [[1, 2, 3]] * 4)  # c4.in columns: L1 4,8,12; L2 2,4,6
    out_l1 = np.array([3, 3, 8]) / (14 / 3)
    out_l2 = np.array([3, np.sqrt(3), 4]) / ((7 + np.sqrt(3)) / 3)
    in_both = np.array([0.5, 1.0, 1.5])
    np.testing.assert_allclose(score(model, dg, "l1").values[b.id], (out_l1 + in_both) / 2)
    np.testing.assert_allclose(score(model, dg, "l2").values[b.id], (out_l2 + in_both) / 2)
    # Normalised per member: one layer's scale does not swamp the other; biases do not count.
    before = score(model, dg, "l2").values[b.id]
    with torch.no_grad():
        model.c4.weight.mul_(100.0)
        model.c3.bias.copy_(torch.tensor([100.0, 0.0, -5.0]))
    np.testing.assert_allclose(score(model, dg, "l2").values[b.id], before)


def test_magnitude_averages_a_channels_repeated_positions(tiny):
    model, dg, a, b, c, _ = tiny
    fc = next(m for m in c.members if m.kind is Kind.PARAM and m.name == "fc.weight")
    assert [list(p) for p in fc.positions] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    _set(model.c4.weight, [[1, 1, 1]] * 4)  # c4.out rows all equal: normalised 1 each
    cols = np.arange(1, 17, dtype=float)  # fc column j has L1 norm 3 * (j + 1)
    _set(model.fc.weight, np.tile(cols, (3, 1)))
    fc_part = cols.reshape(4, 4).mean(1) / cols.mean()
    np.testing.assert_allclose(score(model, dg, "l1").values[c.id], (1 + fc_part) / 2)


def _by_hand_taylor(model, x, y, members):
    """|sum(w * dL/dw)| of each channel, from an ordinary backward on the same model in eval mode."""
    model.eval()
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    total = 0
    for name, dim in members:
        p = model.get_parameter(name)
        total = total + (p * p.grad).detach().movedim(dim, 0).reshape(p.shape[dim], -1).sum(1)
    model.zero_grad(set_to_none=True)
    return total.abs().numpy()


def test_taylor_matches_a_hand_computation_and_leaves_the_model_as_it_was(tiny):
    model, dg, a, b, c, _ = tiny
    x, y = torch.randn(5, 2, 2, 2), torch.tensor([0, 1, 2, 1, 0])
    model.train()
    model.c1.eval()
    model.c1.weight.requires_grad_(False)  # a frozen layer is still scored and stays frozen
    model.c2.weight.grad = torch.ones_like(model.c2.weight)  # a grad the user has: kept as is
    stats = model.b1.running_mean.clone()
    s = score(model, dg, "taylor", calibration=[(x, y)], loss_fn=F.cross_entropy)
    assert model.training and model.b1.training and not model.c1.training
    assert not model.c1.weight.requires_grad and model.c2.weight.requires_grad
    assert torch.equal(model.c2.weight.grad, torch.ones_like(model.c2.weight))
    assert all(p.grad is None for n, p in model.named_parameters() if n != "c2.weight")
    assert torch.equal(model.b1.running_mean, stats)  # calibration ran in eval mode
    model.c2.weight.grad = None

    model.c1.weight.requires_grad_(True)
    expect_b = _by_hand_taylor(model, x, y, [("c3.weight", 0), ("c3.bias", 0), ("c4.weight", 1)])
    expect_a = _by_hand_taylor(
        model,
        x,
        y,
        [
            ("c1.weight", 0),
            ("b1.weight", 0),
            ("b1.bias", 0),
            ("c2.weight", 1),
            ("c2.weight", 0),
            ("b2.weight", 0),
            ("b2.bias", 0),
            ("c3.weight", 1),
        ],
    )
    np.testing.assert_allclose(s.values[b.id], expect_b, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(s.values[a.id], expect_a, rtol=1e-5, atol=1e-9)
    assert s.used[a.id] == "taylor"


def test_taylor_averages_the_absolute_value_per_batch(tiny):
    model, dg, a, b, c, _ = tiny
    batches = [
        (torch.randn(4, 2, 2, 2), torch.tensor([0, 1, 2, 0])),
        (torch.randn(3, 2, 2, 2), torch.tensor([2, 2, 1])),
    ]
    two = score(model, dg, "taylor", calibration=batches, loss_fn=F.cross_entropy).values[b.id]
    each = [score(model, dg, "taylor", calibration=[bt], loss_fn=F.cross_entropy).values[b.id] for bt in batches]
    np.testing.assert_allclose(two, (each[0] + each[1]) / 2, rtol=1e-6)


def test_taylor_needs_calibration(tiny):
    model, dg, *_ = tiny
    with pytest.raises(PrunefxError, match="calibration"):
        score(model, dg, "taylor")


def test_random_is_seeded_per_group(tiny):
    model, dg, a, b, c, _ = tiny
    s1, s2 = score(model, dg, "random", seed=3), score(model, dg, "random", seed=3)
    assert all(np.array_equal(s1.values[k], s2.values[k]) for k in s1.values)
    assert not np.array_equal(s1.values[a.id], score(model, dg, "random", seed=4).values[a.id])
    assert np.array_equal(score(model, dg, "random", seed=3, groups=[b.id]).values[b.id], s1.values[b.id])


def test_unknown_criterion_lists_the_known_ones(tiny):
    model, dg, *_ = tiny
    with pytest.raises(PrunefxError, match="unknown importance criterion 'gamma'.*bn_scale, l1, l2, random, taylor"):
        score(model, dg, "gamma")
    with pytest.raises(PrunefxError, match="'nope'"):
        score(model, dg, "l1", fallback="nope")


def test_registered_criterion_is_used_and_checked(tiny, monkeypatch):
    model, dg, a, b, c, _ = tiny
    monkeypatch.setattr(importance, "CRITERIA", dict(CRITERIA))
    monkeypatch.setattr(importance, "_NOT_APPLICABLE", dict(importance._NOT_APPLICABLE))
    monkeypatch.setattr(importance, "_COMPENSATE", dict(importance._COMPENSATE))

    @register_criterion("channel_index", not_applicable="group has 3 channels")
    def channel_index(ctx, group):
        return None if group.channels == 3 else np.arange(group.channels)

    s = score(model, dg, "channel_index", fallback="l1")
    np.testing.assert_array_equal(s.values[a.id], [0, 1, 2, 3])
    assert s.used[b.id] == "l1 (fallback: group has 3 channels)"

    register_criterion("bad")(lambda ctx, group: np.zeros(1))
    with pytest.raises(PrunefxError, match="shape"):
        score(model, dg, "bad")


@pytest.mark.parametrize("name", sorted(CRITERIA))
def test_only_bn_scale_is_registered_to_compensate(name):
    """The built-in defaults of prune(bias_compensation=None): on for bn_scale (small gamma leaves beta), else off."""
    assert importance.compensates(name) is (name == "bn_scale")


def test_a_criterion_registered_to_compensate_gets_bias_compensation_by_default(tiny, monkeypatch):
    model, *_ = tiny
    monkeypatch.setattr(importance, "CRITERIA", dict(CRITERIA))
    monkeypatch.setattr(importance, "_NOT_APPLICABLE", dict(importance._NOT_APPLICABLE))
    monkeypatch.setattr(importance, "_COMPENSATE", dict(importance._COMPENSATE))
    register_criterion("l1_compensated", compensate=True)(CRITERIA["l1"])
    register_criterion("l1_plain")(CRITERIA["l1"])
    x = torch.randn(1, 2, 2, 2)

    def compensation(criterion, **kw):
        return prunefx.prune(Tiny().eval(), x, prunefx.PlanConfig(ratio=0.5), criterion=criterion, **kw).compensation

    assert compensation("l1_compensated") is not None
    assert compensation("l1_plain") is None
    assert compensation("l1_compensated", bias_compensation=False) is None  # the caller's choice wins
    assert compensation("l1_plain", bias_compensation=True) is not None
    assert not importance.compensates("never_registered")


def test_resnet_groups_are_scored_by_batchnorm():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None)
    dg = prunefx.analyze(model, torch.randn(1, 3, 32, 32))
    s = score(model, dg)
    assert set(s.used.values()) == {"bn_scale"}
    assert all(s.values[g.id].shape == (g.channels,) for g in dg.prunable)
    for crit in ("l1", "l2"):
        v = score(model, dg, crit).values
        assert all(np.isfinite(v[g.id]).all() and v[g.id].shape == (g.channels,) for g in dg.prunable)


def _ties(values, kept):
    scores = {g: np.asarray(v, dtype=np.float64) for g, v in enumerate(values)}
    return importance.ties_at_cut(scores, dict(enumerate(kept)), "bn_scale")


def test_ties_at_the_cut_are_found_from_scores_and_kept_channels():
    ones = _ties([np.ones(8), np.ones(8)], [range(4), range(8)])  # group 1 is planned but not cut
    assert (ones.groups, ones.pruned, ones.zero, ones.channels, ones.total, ones.boundary) == (1, 1, 0, 8, 16, 1.0)
    assert "(bn_scale) are (near-)tied at the cut in 1 of 1 pruned group(s): 8 of 16 channels" in ones.message()
    zeros = _ties([np.zeros(8)], [range(2)])
    assert (zeros.groups, zeros.zero, zeros.channels) == (1, 1, 8)
    assert "every score of those groups is 0 (8 of 8 channels)" in zeros.message("fix it")
    assert zeros.message("fix it").endswith("; fix it")
    # the kept 0.502 and 0.504 are within 1% of the cut 0.500: three of ten channels cannot be told apart
    near = [0.1, 0.2, 0.3, 0.4, 0.5, 0.502, 0.504, 0.8, 0.9, 1.0]
    assert _ties([near], [range(5, 10)]).channels == 3
    assert _ties([near, np.linspace(1, 2, 30)], [range(5, 10), range(30)]) is None  # 3 of 40 channels: under 10%
    pair = [0.1, 0.2, 0.3, 0.4, 0.5, 0.504, 0.6, 0.7, 0.8, 1.0]
    assert _ties([pair], [range(5, 10)]) is None  # one close pair in ten channels: chance, not a tie
    assert _ties([np.linspace(0.1, 1.0, 10)], [range(5, 10)]) is None  # distinct scores
    assert _ties([[0, 0, 0, 0, 1, 2, 3, 4]], [range(4, 8)]) is None  # dead channels cut among dead ones
    assert _ties([np.ones(8)], [range(8)]) is None  # nothing cut
