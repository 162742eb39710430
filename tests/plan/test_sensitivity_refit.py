"""Sensitivity measured with the re-fit in the loop: a layer whose channels are linearly redundant (the re-fit
repairs cutting any of them) measures near-zero damage and is the one the allocation cuts; without the re-fit the
same cut measures real damage; prune(refit=True, scope="sensitivity") plans on re-fitted curves."""

import pytest
import torch
from torch import nn

import prunefx
from prunefx.plan import PlanConfig, PlanError, make_plan
from prunefx.sensitivity import measure


class Redundant(nn.Module):
    """Two branches from a 16-wide input, summed: ``a``'s 12 outputs are multiples of one affine feature (rank 1),
    so any kept one carries all that ``d`` reads; ``b``'s 12 ReLU features have independent linear parts, so ``c``
    cannot rebuild a cut one from the others. ``a``'s branch is 3x louder, so without a re-fit it looks the more
    sensitive."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a, self.d = nn.Linear(16, 12), nn.Linear(12, 8)
        self.b, self.c = nn.Linear(16, 12), nn.Linear(12, 8)
        with torch.no_grad():
            scale = torch.rand(12, generator=g) + 0.5
            self.a.weight.copy_(scale[:, None] * torch.randn(1, 16, generator=g) / 4)
            self.a.bias.copy_(scale * 0.3)
            for m in (self.b, self.c, self.d):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.weight.shape[1] ** 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            self.d.weight.mul_(3)  # the redundant branch dominates the sum: uncorrected, its cut looks the worse

    def forward(self, x):
        return self.c(torch.relu(self.b(x))) + self.d(self.a(x))


def _setup():
    model = Redundant().eval()
    g = torch.Generator().manual_seed(1)
    calib = [torch.randn(64, 16, generator=g) for _ in range(2)]
    dg = prunefx.analyze(model, calib[0][:1])
    a, b = dg.group_of("a").id, dg.group_of("b").id
    scores = prunefx.score(model, dg, "l1")
    return model, calib, dg, a, b, scores


def test_refit_curves_show_the_redundant_layer_free_and_the_allocation_cuts_it(tmp_path):
    model, calib, dg, a, b, scores = _setup()
    runs = []
    model.register_forward_pre_hook(lambda *_: runs.append(1))  # deep copies keep it: every pruned copy counts
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with_refit = measure(model, dg, scores, calib, refit=True, cache=tmp_path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is not touched
    assert with_refit.refit
    # 2 groups x 3 fractions x (targets pass + 1 re-fitted layer + measurement) x 2 batches + 2 reference batches
    assert len(runs) == with_refit.forwards == 2 * 3 * 3 * 2 + 2
    plain = measure(model, dg, scores, calib, cache=tmp_path)  # another key: measured, not read from the file above
    assert not plain.refit and plain.key != with_refit.key
    assert max(with_refit.get(a).damage) < 1e-3  # rank 1: the re-fit of b rebuilds its input from one channel
    assert min(plain.get(a).damage) > 0.05  # the same cuts without the re-fit do real damage
    assert min(with_refit.get(b).damage) > 0.02  # independent ReLU features: the re-fit of c cannot undo it
    # 10 of 24 channels: on the re-fitted curves all from a (to its lowest width, 2 = 12 x (1 - max_ratio 0.9))
    widths = {gp.group: gp.after for gp in
              make_plan(dg, scores, PlanConfig(ratio=0.4, scope="sensitivity"), sensitivity=with_refit).groups}
    assert widths == {a: 2, b: 12}
    widths = {gp.group: gp.after for gp in
              make_plan(dg, scores, PlanConfig(ratio=0.4, scope="sensitivity"), sensitivity=plain).groups}
    assert widths == {a: 12, b: 2}  # without the re-fit the cut lands on the layer no re-fit can repair


def test_prune_with_refit_plans_on_refitted_curves_and_keeps_the_output(tmp_path):
    model, calib, _, _, _, _ = _setup()
    x = calib[0][:1]
    with torch.no_grad():
        want = [model(c) for c in calib]
    result = prunefx.prune(model, x, PlanConfig(ratio=0.4, scope="sensitivity"), criterion="l1", refit=True,
                           calibration=calib, sensitivity_cache=tmp_path)
    assert result.verified.ok and result.sensitivity.refit
    assert result.model.a.out_features == 2 and result.model.b.out_features == 12
    with torch.no_grad():
        for c, y in zip(calib, want, strict=True):
            assert torch.linalg.norm(result.model(c) - y) < 1e-3 * torch.linalg.norm(y)


def test_refit_refuses_bias_compensation(tmp_path):
    model, calib, dg, _, _, scores = _setup()
    with pytest.raises(PlanError, match="replaces bias compensation"):
        measure(model, dg, scores, calib, refit=True, compensate_bias=True, cache=None)
