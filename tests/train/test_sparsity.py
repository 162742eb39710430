"""BN-gamma L1 sparsity: exact hook term after clipping/unscaling, selection, schedule, real training."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunefx
from prunefx.errors import PrunefxError
from prunefx.train import BNSparsity, SparsityConfig, TargetSparsity, fraction_below, residual_bns, sparsity_stats
from prunefx.train.sparsity import GammaStats


def _mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)
    )


def _backward(model: nn.Module, scale: float = 1000.0) -> None:
    """A loss with gradients far larger than the clip norm, as in detection training."""
    (model(torch.randn(16, 4)) * scale).pow(2).mean().backward()


def test_hook_adds_exactly_s_sign_gamma_after_clipping():
    model = _mlp()
    with torch.no_grad():
        model[1].weight.copy_(torch.linspace(-1, 1, 8))  # both signs
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # no momentum: the update is -grad
    sp = BNSparsity(model, s=0.01).attach(opt)
    _backward(model)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert norm > 100  # clipping shrinks every gradient > 100x ...
    gammas = [model[1].weight, model[4].weight]
    before = [g.detach().clone() for g in gammas]
    clipped = [g.grad.clone() for g in gammas]
    opt.step()
    # Tolerances from float32 rounding, not a fixed atol: the clipped gradients c change with the thread count
    # (the backward's sums are split differently), and SGD computes g0 - (c + s) where this test writes
    # (g0 - c) - s. Each side rounds twice, by at most half an ulp of a value below |g0| + |c| + s, so they differ
    # by at most 2 eps of it (1.2e-7 at |g0| = 1, seen with one thread); 4 eps leaves a margin. A missing or
    # clipped L1 term is off by ~0.01.
    eps = torch.finfo(torch.float32).eps
    for g, g0, c in zip(gammas, before, clipped, strict=True):  # ... but not the L1 term, added after it
        step = 0.01 * torch.sign(g0)
        assert ((g.detach() - (g0 - c - step)).abs() <= 4 * eps * (g0.abs() + c.abs() + 0.01)).all()
        assert ((g.grad - (c + step)).abs() <= 2 * eps * (c.abs() + 0.01)).all()
    assert sp.steps == 1 and sp.step_s == 0.01


def test_select_penalises_only_the_smallest_fraction_of_gammas():
    model = _mlp()
    gammas = [model[1].weight, model[4].weight]
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([0.9, -0.1, 0.5, 0.2, 1.3, -0.7, 0.05, 0.8]))
        model[4].weight.copy_(torch.tensor([0.3, 1.1, -0.4, 0.6, 0.15, 1.0]))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    BNSparsity(model, s=0.01, select=0.5).attach(opt)
    for g in gammas:
        g.grad = torch.zeros_like(g)  # no loss gradient: the update is the penalty alone
    before = [g.detach().clone() for g in gammas]
    opt.step()
    flat = torch.cat(before).abs()
    smallest = flat <= flat.kthvalue(7).values  # 7 = ceil(0.5 * 14) smallest |gamma| over both layers
    moved = torch.cat([g.detach() for g in gammas]) != torch.cat(before)
    assert torch.equal(moved, smallest)
    torch.testing.assert_close(
        torch.cat([g.detach() for g in gammas])[smallest],
        (torch.cat(before) - 0.01 * torch.cat(before).sign())[smallest],
    )


def test_select_breaks_exact_ties_across_layers_not_by_index():
    model = _mlp()  # BatchNorm gammas start at exactly 1.0
    sp = BNSparsity(model, s=0.01, select=0.5)
    masks = sp.selected()
    assert sum(int(m.sum()) for m in masks) == 7
    assert all(0 < m.sum() < m.numel() for m in masks)  # by index: 7 of the first layer, none of the second
    assert all(torch.equal(a, b) for a, b in zip(masks, sp.selected(), strict=True))  # the same choice every step
    with pytest.raises(PrunefxError, match="select must be a fraction"):
        BNSparsity(model, select=1.0)


def test_select_never_takes_more_than_layer_cap_of_one_batchnorm():
    model = _mlp()
    with torch.no_grad():
        model[1].weight.copy_(torch.linspace(0.01, 0.08, 8))  # the whole first layer is smaller than the second
        model[4].weight.copy_(torch.linspace(0.5, 1.0, 6))
    masks = BNSparsity(model, s=0.01, select=0.5).selected()
    assert [int(m.sum()) for m in masks] == [7, 0]  # the global rank alone takes 7 of 8 from the first layer
    masks = BNSparsity(model, s=0.01, select=0.5, layer_cap=0.5).selected()
    assert [int(m.sum()) for m in masks] == [4, 3]  # 4 = floor(0.5 * 8); the rest are the second layer's smallest
    assert torch.equal(masks[0], (model[1].weight < 0.045).float())
    assert torch.equal(masks[1], (model[4].weight < 0.75).float())
    with pytest.raises(PrunefxError, match="layer_cap"):
        BNSparsity(model, select=0.5, layer_cap=0.0)
    # the one config setting reaches the regulariser the pipelines attach
    sp = SparsityConfig(selective=True, layer_cap=0.5).regularizer(model, total_steps=10)
    assert [int(m.sum()) for m in sp.selected()] == [4, 3]
    with pytest.raises(PrunefxError, match="layer_cap"):
        SparsityConfig(selective=True, layer_cap=1.5)


@pytest.mark.parametrize("explicit_unscale", [True, False])
def test_hook_runs_after_grad_scaler_unscales(explicit_unscale):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    BNSparsity(model, s=0.5, modules=["1"]).attach(opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaler.scale((model(torch.randn(16, 4)) ** 2).mean()).backward()
    g0 = model[1].weight.detach().clone()
    if explicit_unscale:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    true_grad = model[1].weight.grad / (1.0 if explicit_unscale else 2.0**10)
    scaler.step(opt)
    torch.testing.assert_close(model[1].weight.detach(), g0 - true_grad - 0.5 * torch.sign(g0), rtol=0, atol=1e-6)


def test_detach_removes_the_term_and_attach_twice_is_an_error():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sp = BNSparsity(model, s=0.01).attach(opt)
    with pytest.raises(PrunefxError, match="already attached"):
        sp.attach(opt)
    sp.detach()
    _backward(model, 1.0)
    grad = model[1].weight.grad.clone()
    opt.step()
    torch.testing.assert_close(model[1].weight.grad, grad, rtol=0, atol=0)
    sp.detach()  # harmless twice


def test_selection_exclude_patterns_and_unused_gammas():
    model = _mlp()
    assert list(BNSparsity(model).modules) == ["1", "4"]
    assert list(BNSparsity(model, exclude=["4"]).modules) == ["1"]
    assert list(BNSparsity(model, exclude="[14]").modules) == []  # fnmatch pattern
    assert list(BNSparsity(model, modules=["4"]).modules) == ["4"]
    with pytest.raises(PrunefxError, match="not a BatchNorm"):
        BNSparsity(model, modules=["0"])
    model[4].weight.requires_grad_(False)  # frozen gammas are left alone
    assert BNSparsity(model).gammas == [model[1].weight]

    # A gamma that got no gradient this step (branch not taken) is still pulled towards zero.
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    BNSparsity(model, s=0.25, modules=["1"]).attach(opt)
    g0 = model[1].weight.detach().clone()
    opt.step()
    torch.testing.assert_close(model[1].weight.detach(), g0 - 0.25, rtol=0, atol=0)


def test_schedule_sets_the_strength_of_each_step():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    seen = []
    sp = BNSparsity(model, s=1e-3, schedule=lambda step, s, gammas: seen.append((step, len(gammas))) or s * 2).attach(
        opt
    )
    for _ in range(3):
        _backward(model, 1.0)
        opt.step()
    assert seen == [(0, 2), (1, 2), (2, 2)] and sp.step_s == pytest.approx(8e-3)


class _Block(nn.Module):
    """conv -> bn -> (residual add with a second conv's bn) -> depthwise conv -> bn -> pointwise conv."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn_a = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
        self.b, self.bn_b = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
        self.dw, self.bn_dw = nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.BatchNorm2d(4)
        self.mid, self.bn_mid = nn.Conv2d(4, 6, 1), nn.BatchNorm2d(6)
        self.out = nn.Conv2d(6, 2, 1)

    def forward(self, x):
        y = self.bn_a(self.a(x)) + self.bn_b(self.b(x))
        y = self.bn_mid(self.mid(self.bn_dw(self.dw(y))))
        return self.out(y)


def test_residual_bns_finds_summed_branches_not_depthwise():
    dg = prunefx.analyze(_Block(), torch.randn(1, 3, 4, 4))
    assert residual_bns(dg) == ["bn_a", "bn_b", "bn_dw"]  # dw shares the residual group, not a producer

    class Chain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c, self.bn = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
            self.dw, self.bn_dw = nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.BatchNorm2d(4)
            self.out = nn.Conv2d(4, 2, 1)

        def forward(self, x):
            return self.out(self.bn_dw(self.dw(self.bn(self.c(x)))))

    assert residual_bns(prunefx.analyze(Chain(), torch.randn(1, 3, 4, 4))) == []


def test_sparsity_stats_and_fraction_below():
    model = _mlp()
    with torch.no_grad():
        model[1].weight.copy_(torch.tensor([0.0, -5e-4, 5e-3, -0.05, 0.5, 1.0, 2.0, -4.0]))
        model[4].weight.copy_(torch.tensor([1e-4, 1e-4, 0.2, 0.2, 0.2, 3.0]))
    st = sparsity_stats(model)
    assert st["bn_channels"] == 14
    assert st["below_0.001"] == pytest.approx(4 / 14)
    assert st["below_0.01"] == pytest.approx(5 / 14) and st["below_0.1"] == pytest.approx(6 / 14)
    assert st["max"] == pytest.approx(4.0) and st["q0.5"] == pytest.approx(0.2)
    assert sparsity_stats(model, ["4"])["below_0.001"] == pytest.approx(2 / 6)
    assert st.below[0.01] == pytest.approx(5 / 14) and st.quantiles[0.5] == pytest.approx(0.2)  # typed
    assert GammaStats.from_flat(st.flat()) == st and dict(st) == st.flat()  # the flat form state.json keeps
    assert list(st.flat())[:2] == ["bn_channels", "below_0.001"] and list(st.flat())[-1] == "max"
    # relative: each layer against its own largest |gamma| (4.0 and 3.0)
    assert fraction_below([model[1].weight, model[4].weight], 0.1, relative=True) == pytest.approx(9 / 14)


def test_target_sparsity_steers_the_log_speed_of_the_quantile():
    sched = TargetSparsity(target=0.5, total_steps=100, threshold=0.01, reach=0.5, gain=1.0, every=10, s_max=0.03,
                           aim=0.5)
    g = torch.ones(10)
    assert sched(0, 1e-3, [g]) == 1e-3  # first measurement: no speed yet
    assert sched(5, 1e-3, [g]) == 1e-3  # not a measuring step
    assert sched(10, 1e-3, [g]) == pytest.approx(1e-3 * math.e)  # median stuck, plan wants it to fall: up
    v = math.log(10) / 10  # median 1 -> 0.1 in 10 steps
    wanted = math.log(0.1 / 0.005) / (50 - 20)  # lands it on aim * threshold at step 50, safely below the threshold
    assert sched(20, 1e-3, [g * 0.1]) == pytest.approx(1e-3 * math.exp((wanted - v) / (wanted + v)))  # too fast: down
    assert sched(30, 1e-3, [g * 0.004]) < 1e-3  # below where it is steered: back off
    assert sched(40, 0.029, [g * 0.004]) < 0.029 and sched(50, 0.029, [g * 0.5]) == 0.03  # s_max
    with pytest.raises(PrunefxError):
        TargetSparsity(target=1.5, total_steps=10)


def test_target_sparsity_damps_the_noise_of_a_held_quantile():
    # Once q sits where it is steered (aim * threshold) both speeds are noise near 0: s moves by a fraction of the
    # gain, not by e.
    sched = TargetSparsity(target=0.5, total_steps=100, threshold=0.01, reach=0.5, every=10, aim=0.5)
    g = torch.ones(10)
    sched(0, 1.0, [g])  # plans q from 1 down to 0.005 by step 50
    sched(60, 1.0, [g * 0.00525])
    s = sched(70, 1.0, [g * 0.0049])  # q wobbled 7% across its set point
    assert 0.8 < s < 1.0
    assert TargetSparsity(total_steps=1000).every == 10 and TargetSparsity(total_steps=76).every == 2


def test_max_step_bounds_lr_times_s_at_the_optimizers_current_lr():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sp = BNSparsity(model, s=1e-3, schedule=lambda step, s, gammas: 10.0, max_step=0.01).attach(opt)
    opt.step()
    assert sp.step_s == pytest.approx(0.1)  # lr * s = 0.01
    opt.param_groups[0]["lr"] = 0.001  # a decayed lr lets s grow: the step, not s, is what is bounded
    opt.step()
    assert sp.step_s == pytest.approx(10.0)
    target = TargetSparsity(total_steps=10, threshold=0.03)
    assert target.max_step == pytest.approx(0.01) and BNSparsity(model, schedule=target).max_step == target.max_step


def test_sparsity_config_builds_the_regulariser_it_describes():
    model = _mlp()
    reg = SparsityConfig(s=2e-3, schedule="target", target=0.25, s_max=5e-3, selective=True, exclude=("4",)) \
        .regularizer(model, total_steps=200)
    assert list(reg.modules) == ["1"] and reg.select == 0.25 and reg.step_s == 2e-3
    assert isinstance(reg.schedule, TargetSparsity) and reg.schedule.s_max == 5e-3 and reg.schedule.target == 0.25
    assert reg.schedule.total_steps == 200 and reg.schedule.aim == 0.5  # selective: lockstep gammas, steered below
    assert SparsityConfig(schedule="target").regularizer(model, 200).schedule.aim == 1.0
    with pytest.raises(PrunefxError, match="aim"):
        TargetSparsity(total_steps=10, aim=0)
    plain = SparsityConfig(s=1e-4).regularizer(model, total_steps=10)
    assert plain.schedule is None and plain.select is None and plain.max_step is None
    with pytest.raises(PrunefxError, match="resolved"):
        SparsityConfig(exclude_residual=True).regularizer(model, 10)
    block = SparsityConfig(exclude_residual=True).resolved(_Block(), (torch.randn(1, 3, 4, 4),))
    assert block.exclude == ("bn_a", "bn_b", "bn_dw") and not block.exclude_residual


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return F.interpolate(x, size=12, mode="bilinear", align_corners=False), torch.tensor(d.target)


def _train_digits(x, y, target: float | None, epochs: int = 10, batch: int = 64, seed: int = 0):
    """SGD on a 4-conv BN CNN, clipped like ultralytics; returns (fraction of |gamma| < 1e-2, accuracy)."""

    def block(i: int, o: int) -> list[nn.Module]:
        return [nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU()]

    torch.manual_seed(seed)
    model = nn.Sequential(
        *block(1, 16),
        *block(16, 32),
        nn.MaxPool2d(2),
        *block(32, 32),
        nn.MaxPool2d(2),
        *block(32, 64),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    steps = epochs * math.ceil(len(x) / batch)
    if target is not None:
        BNSparsity(model, s=1e-3, schedule=TargetSparsity(target=target, total_steps=steps)).attach(opt)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convs: extra threads only add contention on shared cores
    try:
        for _ in range(epochs):
            for idx in torch.randperm(len(x)).split(batch):
                loss = F.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
                opt.step()
        with torch.no_grad():  # batch statistics: running ones lag gammas that moved in the last steps
            acc = (model(x).argmax(1) == y).float().mean().item()
    finally:
        torch.set_num_threads(threads)
    return sparsity_stats(model)["below_0.01"], acc


def test_target_sparsity_reaches_the_target_where_plain_training_does_not(digits):
    plain, plain_acc = _train_digits(*digits, target=None)
    sparse, sparse_acc = _train_digits(*digits, target=0.3)
    assert plain == 0.0 and plain_acc > 0.95
    assert sparse == pytest.approx(0.3, abs=0.1)
    assert sparse_acc > 0.9


@pytest.mark.slow
def test_target_sparsity_reaches_the_target_on_the_digits_config(tmp_path):
    """The shipped digits recipe: 4 sparsity epochs (76 steps) from the trained baseline, lr decaying to 0."""
    import json
    from pathlib import Path

    from prunefx.pipeline import run_config

    config = Path(__file__).resolve().parents[2] / "configs" / "digits_cnn.yaml"
    run = run_config(config, [f"project={tmp_path}", "prune.finetune.epochs=0", "prune.latency=false", "threads=1"],
                     log=lambda _: None)
    stages = json.loads((run.root / "state.json").read_text())["stages"]
    assert stages["sparsity"]["gammas"]["below_0.01"] == pytest.approx(0.5, abs=0.1)
    assert stages["prune"]["metrics"]["top1"] > 0.8  # selective: the cut removed the faded half only
