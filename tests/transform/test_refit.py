"""Re-fit after the cut: each consumer of a pruned group gets the least-squares weights (numpy lstsq's solution)."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import prunefx
from prunefx.errors import PrunefxError
from prunefx.plan import PlanConfig, make_plan
from prunefx.transform.refit import refit
from prunefx.transform.rewrite import apply_plan

TINY = 1e-12  # ridge small enough that the solution is lstsq's to float64 round-off


def _cut(net: nn.Module, x: torch.Tensor, ratio: float = 0.5):
    """(the original, ``net`` pruned by l1 to ``ratio``, the analysis, the plan)."""
    original = copy.deepcopy(net)
    dg = prunefx.analyze(net, x)
    plan = make_plan(dg, prunefx.score(net, dg, "l1").values, PlanConfig(ratio=ratio), criterion="l1")
    assert plan.pruned, "the test needs a plan that prunes something"
    return original, apply_plan(net, dg, plan), dg, plan


def _inputs_to(model: nn.Module, layer: str, batches) -> list[torch.Tensor]:
    seen = []
    handle = model.get_submodule(layer).register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        for b in batches:
            model(*b)
    handle.remove()
    return seen


def _outputs_of(model: nn.Module, layer: str, batches) -> list[torch.Tensor]:
    seen = []
    handle = model.get_submodule(layer).register_forward_hook(lambda m, a, y: seen.append(y.detach()))
    with torch.no_grad():
        for b in batches:
            model(*b)
    handle.remove()
    return seen


def _lstsq(x: np.ndarray, y: np.ndarray, bias: bool) -> np.ndarray:
    if bias:
        x = np.concatenate([x, np.ones((x.shape[0], 1))], 1)
    return np.linalg.lstsq(x, y, rcond=None)[0]


def _patches(conv: nn.Conv2d, x: torch.Tensor) -> np.ndarray:
    p = F.unfold(x, conv.kernel_size, dilation=conv.dilation, padding=conv.padding, stride=conv.stride)
    return p.transpose(1, 2).reshape(-1, p.shape[1]).numpy()


def _rows(y: torch.Tensor) -> np.ndarray:
    return y.movedim(1, -1).reshape(-1, y.shape[1]).numpy()


def _batches(*shape, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g, dtype=torch.float64),) for _ in range(n)]


class MLP(nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 5, bias=bias)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_consumer_gets_the_least_squares_weights(bias):
    torch.manual_seed(0)
    net = MLP(bias).double().eval()
    calib = _batches(64, 6)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    result = refit(original, pruned, dg, plan, calib, ridge=TINY, holdout=0)
    x = torch.cat(_inputs_to(pruned, "fc2", calib)).numpy()
    y = torch.cat(_outputs_of(original, "fc2", calib)).numpy()
    want = _lstsq(x, y, bias)
    np.testing.assert_allclose(pruned.fc2.weight.detach().numpy(), want[:16 // 2].T, rtol=1e-7, atol=1e-9)
    if bias:
        np.testing.assert_allclose(pruned.fc2.bias.detach().numpy(), want[-1], rtol=1e-7, atol=1e-9)
    (layer,) = result.layers
    assert layer.name == "fc2" and layer.applied and layer.rows == 3 * 64
    assert layer.after < layer.before  # pruning half of fc1 hurt, the re-fit recovers part of it
    # the report's error is the actual relative error of the re-fitted layer on the calibration
    got = torch.cat(_outputs_of(pruned, "fc2", calib)).numpy()
    assert layer.after == pytest.approx(np.linalg.norm(got - y) / np.linalg.norm(y), rel=1e-6)


class ConvNet(nn.Module):
    def __init__(self, stride: int, groups: int = 1):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 8, 3, padding=1, stride=stride, groups=groups)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


@pytest.mark.parametrize("stride,groups", [(1, 1), (2, 1), (1, 2)])
def test_conv_consumer_matches_lstsq_on_patches(stride, groups):
    torch.manual_seed(0)
    net = ConvNet(stride, groups).double().eval()
    calib = _batches(4, 3, 8, 8)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    result = refit(original, pruned, dg, plan, calib, ridge=TINY, holdout=0)
    assert [x.name for x in result.layers] == ["c2"] and result.layers[0].applied
    c2 = pruned.c2
    x = np.concatenate([_patches(c2, t) for t in _inputs_to(pruned, "c2", calib)])
    y = np.concatenate([_rows(t) for t in _outputs_of(original, "c2", calib)])
    d, opg = x.shape[1] // groups, 8 // groups  # each group's patch features and outputs
    for j in range(groups):
        want = _lstsq(x[:, j * d:(j + 1) * d], y[:, j * opg:(j + 1) * opg], bias=True)
        w = c2.weight.detach()[j * opg:(j + 1) * opg].reshape(opg, -1).numpy()
        np.testing.assert_allclose(w, want[:-1].T, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(c2.bias.detach()[j * opg:(j + 1) * opg].numpy(), want[-1], rtol=1e-6, atol=1e-8)
    assert result.layers[0].after < result.layers[0].before


class Depthwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 12, 1)
        self.dw = nn.Conv2d(12, 12, 3, padding=1, groups=12)
        self.c3 = nn.Conv2d(12, 6, 1)

    def forward(self, x):
        return self.c3(torch.relu(self.dw(torch.relu(self.c1(x)))))


def test_depthwise_per_channel_and_the_next_layer_reads_the_refitted_one():
    torch.manual_seed(0)
    net = Depthwise().double().eval()
    calib = _batches(4, 3, 8, 8)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    result = refit(original, pruned, dg, plan, calib, ridge=TINY, holdout=0)
    assert [x.name for x in result.layers] == ["dw", "c3"]  # graph order: c3 regresses on the re-fitted dw
    kept = pruned.dw.out_channels
    keep = next(gp.keep for gp in plan.groups if gp.after < gp.before)
    x = np.concatenate([_patches(pruned.dw, t) for t in _inputs_to(pruned, "dw", calib)])
    y = np.concatenate([_rows(t) for t in _outputs_of(original, "dw", calib)])[:, list(keep)]
    for c in range(kept):  # channel c's output regresses on channel c's 3x3 patch only
        want = _lstsq(x[:, c * 9:(c + 1) * 9], y[:, c:c + 1], bias=True)
        np.testing.assert_allclose(pruned.dw.weight.detach()[c].reshape(-1).numpy(), want[:-1, 0], rtol=1e-6,
                                   atol=1e-8)
    x3 = torch.cat(_inputs_to(pruned, "c3", calib)).movedim(1, -1).reshape(-1, kept).numpy()  # after dw's re-fit
    y3 = np.concatenate([_rows(t) for t in _outputs_of(original, "c3", calib)])
    want = _lstsq(x3, y3, bias=True)
    np.testing.assert_allclose(pruned.c3.weight.detach().reshape(6, kept).numpy(), want[:-1].T, rtol=1e-6, atol=1e-8)
    assert all(x.after < x.before for x in result.layers)


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2, self.b2 = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)

    def forward(self, x):
        return self.b2(self.c2(torch.relu(self.c1(x))))


def test_bias_free_conv_before_batchnorm_folds_its_intercept_into_running_mean():
    torch.manual_seed(0)
    net = BNNet().double().eval()
    with torch.no_grad():
        net.c1.bias.uniform_(0.5, 1.0)  # removed channels carry a mean the intercept must absorb
    calib = _batches(4, 3, 8, 8)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    mean_before = pruned.b2.running_mean.clone()
    result = refit(original, pruned, dg, plan, calib, ridge=TINY, holdout=0)
    x = np.concatenate([_rows(t) for t in _inputs_to(pruned, "c2", calib)])
    y = np.concatenate([_rows(t) for t in _outputs_of(original, "c2", calib)])
    want = _lstsq(x, y, bias=True)
    np.testing.assert_allclose(pruned.c2.weight.detach().reshape(8, -1).numpy(), want[:-1].T, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose((mean_before - pruned.b2.running_mean).numpy(), want[-1], rtol=1e-6, atol=1e-8)
    assert result.layers[0].applied


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.a, self.b = nn.Linear(6, 16), nn.Linear(16, 4), nn.Linear(16, 4)
        self.b.weight = self.a.weight  # one Parameter, two layers

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.a(h) + self.b(h)


def test_a_tied_weight_consumer_is_skipped_with_its_reason():
    torch.manual_seed(0)
    net = Tied().double().eval()
    calib = _batches(64, 6)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    weight = pruned.a.weight.detach().clone()
    result = refit(original, pruned, dg, plan, calib)
    skipped = dict(result.skipped)
    assert set(skipped) == {"a", "b"} and "shared" in skipped["a"] and not result.layers
    assert torch.equal(pruned.a.weight, weight)


def test_no_calibration_batch_is_refused():
    torch.manual_seed(0)
    net = MLP(True).double().eval()
    original, pruned, dg, plan = _cut(net, torch.randn(4, 6, dtype=torch.float64))
    with pytest.raises(PrunefxError, match="no batch"):
        refit(original, pruned, dg, plan, [])


def test_rows_are_capped_and_fewer_rows_than_unknowns_is_skipped():
    torch.manual_seed(0)
    net = ConvNet(1).double().eval()
    calib = _batches(4, 3, 8, 8)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    result = refit(original, copy.deepcopy(pruned), dg, plan, calib, max_rows=300, holdout=0)
    assert result.layers[0].rows == 3 * (300 // 3)  # 256 positions per batch, 100 sampled from each
    weight = pruned.c2.weight.detach().clone()
    few = refit(original, pruned, dg, plan, calib, max_rows=30)  # 30 rows, 8 * 9 + 1 unknowns per output
    assert not few.layers and "fewer calibration rows" in dict(few.skipped)["c2"]
    assert torch.equal(pruned.c2.weight, weight)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        ins, outs = [3, 16, 32], [16, 32, 32]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1, bias=False) for a, b in zip(ins, outs, strict=True))
        self.bns = nn.ModuleList(nn.BatchNorm2d(b) for b in outs)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns, strict=True):
            x = torch.relu(bn(conv(x)))
        return self.fc(x.mean((2, 3)))


def _small_cnn():
    torch.manual_seed(0)
    net = SmallCNN().eval()
    with torch.no_grad():
        for bn in net.bns:  # trained-looking statistics, so a cut channel's loss is not trivially constant
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.1, 0.3)
    return net


@pytest.mark.filterwarnings("ignore::prunefx.errors.TiedScoresWarning")  # a few random-init l1 norms tie
def test_prune_with_refit_verifies_and_is_closer_to_the_original_on_held_out_inputs():
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(8, 3, 12, 12, generator=g) for _ in range(8)]
    held_out = torch.randn(32, 3, 12, 12, generator=g)
    x = calib[0][:1]
    base = _small_cnn()
    with torch.no_grad():
        want = base(held_out)
    errs = {}
    for on in (False, True):
        net = copy.deepcopy(base)
        result = prunefx.prune(net, x, {"ratio": 0.5}, criterion="l1", refit=on, calibration=calib if on else None)
        assert result.verified is not None and result.verified.ok  # the oracle proved the structure first
        with torch.no_grad():
            errs[on] = ((result.model(held_out) - want).norm() / want.norm()).item()
        if on:
            fitted = result.refit
            assert [x.name for x in fitted.layers] == ["convs.1", "convs.2", "fc"]  # every reader of a cut group
            # capped: 8 batches x 144 positions x 8 images; a fifth of them held out to measure the errors on
            assert all(x.rows + x.held_out == 8192 and 0.15 < x.held_out / 8192 < 0.25 for x in fitted.layers[:2])
            assert fitted.after < fitted.before and all(x.after <= x.before for x in fitted.layers)
            assert result.compensation is None  # the re-fit replaces bias compensation
        else:
            assert result.refit is None
    assert errs[True] < 0.8 * errs[False]


@pytest.mark.filterwarnings("ignore::prunefx.errors.TiedScoresWarning")
def test_one_calibration_tensor_is_one_batch():
    """calibration=x (a tensor, not a list of batches) is read as one batch, not split into its samples."""
    net = _small_cnn()
    x = torch.randn(16, 3, 12, 12, generator=torch.Generator().manual_seed(2))
    result = prunefx.prune(net, x[:1], {"ratio": 0.5}, criterion="l1", refit=True, calibration=x)
    assert result.refit is not None and result.refit.batches == 1
    # the convs see 16 images x 144 positions; fc sees 16 rows, fewer than its unknowns
    assert [layer.name for layer in result.refit.layers] == ["convs.1", "convs.2"]
    assert [name for name, _ in result.refit.skipped] == ["fc"]


@pytest.mark.filterwarnings("ignore::prunefx.errors.TiedScoresWarning")
def test_calibration_turns_the_refit_on_unless_told_otherwise():
    """Data means re-fit: calibration= alone re-fits; refit=False, or bias compensation asked for, does not."""
    calib = [torch.randn(4, 3, 12, 12, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    x = calib[0][:1]

    def cut(**kw):
        return prunefx.prune(_small_cnn(), x, {"ratio": 0.5}, criterion="bn_scale", calibration=calib, **kw)

    auto = cut()
    assert auto.refit is not None and auto.refit.layers and auto.compensation is None, auto.summary()
    assert "re-fit on 3 calibration batch(es)" in auto.summary() and "a few batches" not in auto.summary()
    off = cut(refit=False)
    assert off.refit is None and off.compensation is not None and off.compensation.held_out == 1  # measured instead
    asked = cut(bias_compensation=True)  # compensation, which the re-fit would replace, was asked for
    assert asked.refit is None and asked.compensation.applied
    with pytest.raises(PrunefxError, match="refit=True replaces bias compensation"):
        cut(refit=True, bias_compensation=True)


def test_refit_without_calibration_is_refused_before_any_work():
    net = _small_cnn()
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(PrunefxError, match="refit=True needs calibration"):
        prunefx.prune(net, torch.randn(1, 3, 12, 12), {"ratio": 0.5}, criterion="l1", refit=True)
    after = net.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_a_calibration_batch_the_model_cannot_take_is_refused_with_the_model_whole():
    net = _small_cnn()
    before = copy.deepcopy(net.state_dict())
    with pytest.raises(PrunefxError, match="calibration batch 1 does not run"):
        prunefx.prune(net, torch.randn(1, 3, 12, 12), {"ratio": 0.5}, criterion="l1", refit=True,
                      calibration=[torch.randn(2, 3, 12, 12), torch.randn(2, 5, 12, 12)])
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_calibration_pairs_are_read_as_inputs_and_targets():
    from prunefx.api import _calibration_inputs

    class TwoInputs(nn.Module):
        def forward(self, x, z=None):
            return x if z is None else x + z

    x, y, z = torch.ones(1), torch.zeros(1), torch.full((1,), 2.0)
    got = _calibration_inputs([x, (x, y), [x, z], ([x, z], y), {"z": z, "x": x}], TwoInputs())
    assert [tuple(t.item() for t in b) for b in got] == [(1.0,), (1.0,), (1.0, 2.0), (1.0, 2.0), (1.0, 2.0)]
    with pytest.raises(PrunefxError, match="calibration batch 0 is a str"):
        _calibration_inputs(["x"], TwoInputs())


def test_held_out_rows_judge_the_fit_and_the_applied_weights_use_every_row():
    torch.manual_seed(0)
    net = MLP(True).double().eval()
    calib = _batches(64, 6)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    (layer,) = refit(original, pruned, dg, plan, calib, ridge=TINY, holdout=0.2).layers
    assert layer.applied and layer.rows + layer.held_out == 3 * 64 and 20 < layer.held_out < 60
    assert layer.after < layer.before  # measured on the held-out rows
    x = torch.cat(_inputs_to(pruned, "fc2", calib)).numpy()
    want = _lstsq(x, torch.cat(_outputs_of(original, "fc2", calib)).numpy(), bias=True)
    np.testing.assert_allclose(pruned.fc2.weight.detach().numpy(), want[:-1].T, rtol=1e-7, atol=1e-9)


def test_an_overfitted_refit_is_not_applied():
    torch.manual_seed(0)
    net = MLP(True).double().eval()
    calib = _batches(14, 6, n=1)  # 9 rows fitted for 9 unknowns per output: an exact fit of noise
    original, pruned, dg, plan = _cut(net, calib[0][0])
    weight, bias = pruned.fc2.weight.detach().clone(), pruned.fc2.bias.detach().clone()
    (layer,) = refit(original, pruned, dg, plan, calib, ridge=0.0, holdout=0.3).layers
    assert not layer.applied and "not better on the held-out rows" in layer.why and layer.after == layer.before
    assert torch.equal(pruned.fc2.weight, weight) and torch.equal(pruned.fc2.bias, bias)


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv1d(4, 12, 3, padding=1), nn.Conv1d(12, 6, 3, padding=1, stride=2)

    def forward(self, x):
        return self.c2(torch.relu(self.c1(x)))


def test_conv1d_consumer_matches_lstsq_on_its_windows():
    torch.manual_seed(0)
    net = Conv1dNet().double().eval()
    calib = _batches(4, 4, 32)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    (layer,) = refit(original, pruned, dg, plan, calib, ridge=TINY, holdout=0).layers
    assert layer.name == "c2" and layer.rows == 3 * 4 * 16
    # windows by Tensor.unfold on the padded sequence (not the 2-D path the re-fit takes): (rows, channels x 3)
    x = np.concatenate([F.pad(t, (1, 1)).unfold(2, 3, 2).permute(0, 2, 1, 3).reshape(-1, t.shape[1] * 3).numpy()
                        for t in _inputs_to(pruned, "c2", calib)])
    y = np.concatenate([_rows(t) for t in _outputs_of(original, "c2", calib)])
    want = _lstsq(x, y, bias=True)
    np.testing.assert_allclose(pruned.c2.weight.detach().reshape(6, -1).numpy(), want[:-1].T, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(pruned.c2.bias.detach().numpy(), want[-1], rtol=1e-6, atol=1e-8)


class Refused(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 12, 1)
        self.reflect = nn.Conv2d(12, 4, 3, padding=1, padding_mode="reflect")
        self.up = nn.ConvTranspose2d(12, 4, 2, stride=2)

    def forward(self, x):
        h = torch.relu(self.c1(x))
        return self.reflect(h).sum() + self.up(h).sum()


def test_reflect_padding_and_transposed_convs_are_skipped_with_their_reason():
    torch.manual_seed(0)
    net = Refused().double().eval()
    calib = _batches(2, 3, 8, 8)
    original, pruned, dg, plan = _cut(net, calib[0][0])
    result = refit(original, pruned, dg, plan, calib)
    skipped = dict(result.skipped)
    assert not result.layers
    assert "padding_mode='reflect'" in skipped["reflect"] and "transposed" in skipped["up"]


@pytest.mark.filterwarnings("ignore::prunefx.errors.TiedScoresWarning")
def test_targets_taken_per_layer_give_the_same_weights_as_one_pass():
    # Over max_target_bytes (an LLM's dozens of wide layers) the original's outputs are taken layer by layer, each
    # pass stopped after that layer: the rows, and so the re-fitted weights, must be the one-pass ones.
    g = torch.Generator().manual_seed(3)
    calib = [(torch.randn(8, 3, 12, 12, generator=g),) for _ in range(3)]
    original, pruned, dg, plan = _cut(_small_cnn(), calib[0][0][:1])
    fitted = {}
    for bound in (1 << 30, 0):
        net = copy.deepcopy(pruned)
        fitted[bound] = (refit(original, net, dg, plan, calib, max_target_bytes=bound), net.state_dict())
    one, per = fitted[1 << 30][0], fitted[0][0]
    assert (one.targets, per.targets) == ("one pass", "per layer")
    assert one.original_passes == 3 and per.original_passes == 3 + 3 * len(per.layers)  # counting + one per layer
    assert [x.name for x in per.layers] == [x.name for x in one.layers] and len(one.layers) == 3
    for a, b in zip(one.layers, per.layers, strict=True):
        assert a.applied == b.applied and a.rows == b.rows and a.held_out == b.held_out
        assert a.after == pytest.approx(b.after, rel=1e-6, abs=1e-9)
    for k, v in fitted[1 << 30][1].items():
        torch.testing.assert_close(fitted[0][1][k], v, rtol=1e-6, atol=1e-7)
