"""Parametrized weights: weight_norm is pruned through its parametrization; state-sized ones freeze, saying why."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

import prunefx


def wrapped(wrap, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(wrap(nn.Conv1d(3, 8, 3, padding=1)), nn.ReLU(), wrap(nn.Conv1d(8, 4, 1)), nn.Flatten(),
                         wrap(nn.Linear(40, 6))).eval()


def test_weight_norm_is_pruned_through_its_parametrization() -> None:
    model, x = wrapped(weight_norm), torch.randn(2, 3, 10)
    original = copy.deepcopy(model)
    result = prunefx.prune(model, x, prunefx.PlanConfig(ratio=0.5), criterion="l1")
    pruned = result.model
    assert result.verified is not None and result.verified.ok and result.verified.errors
    assert pruned[0].out_channels == 4 and pruned[2].in_channels == 4, result.plan.summary()
    for i in (0, 2):  # still weight-normed, g and v resized
        assert parametrize.is_parametrized(pruned[i], "weight")
    g, v = pruned[0].parametrizations.weight.original0, pruned[0].parametrizations.weight.original1
    assert g.shape == (4, 1, 1) and v.shape == (4, 3, 3)
    # the computed weights are the original's kept rows (out of conv 0) and kept columns (into conv 2)
    keep = {gp.before: torch.as_tensor(gp.keep) for gp in result.plan.groups}  # conv 0's 8 and conv 2's 4
    torch.testing.assert_close(pruned[0].weight, original[0].weight[keep[8]], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pruned[2].weight, original[2].weight[keep[4]][:, keep[8]], rtol=1e-5, atol=1e-6)
    pruned.train()
    pruned(x).sum().backward()  # g and v are still the trainable parameters
    assert g.grad is not None and v.grad is not None


def test_under_export_the_traced_weight_norm_op_freezes_loudly() -> None:
    # torch.export traces through the parametrization (aten._weight_norm over g and v): no rule maps it back to the
    # module's weight yet. Probed, its rows map one to one but each row's norm mixes the input channels, so those
    # freeze, said per node, and with them every group
    dg = prunefx.analyze(wrapped(weight_norm), (torch.randn(2, 3, 10),), capture="export")
    assert not any(g.prunable for g in dg.groups)
    assert set(dg.inferred_ops) == {"_weight_norm", "_weight_norm_1", "_weight_norm_2"} and not dg.unknown_ops
    assert any("probed op: mixes positions" in r and "_weight_norm" in r for g in dg.groups for r in g.reasons)


def test_spectral_norm_freezes_its_channels_naming_the_fix() -> None:
    model = wrapped(spectral_norm)
    dg = prunefx.analyze(model, (torch.randn(2, 3, 10),))
    conv0 = dg.groups_of("0", "out")[0]
    assert not conv0.prunable
    assert any("_SpectralNorm" in r and "remove_parametrizations" in r for r in conv0.reasons)


class Doubled(nn.Module):
    """A parametrization with no right_inverse: its input cannot be re-derived from a sliced weight."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return 2 * w


def test_a_parametrization_without_right_inverse_freezes() -> None:
    torch.manual_seed(0)
    conv = nn.Conv1d(3, 8, 1)
    parametrize.register_parametrization(conv, "weight", Doubled())
    model = nn.Sequential(conv, nn.ReLU(), nn.Conv1d(8, 4, 1)).eval()
    dg = prunefx.analyze(model, (torch.randn(2, 3, 5),))
    (group,) = dg.groups_of("0", "out")
    assert not group.prunable and any("no right_inverse" in r for r in group.reasons)


def test_the_deprecated_hook_weight_norm_is_one_clear_error_and_the_model_is_untouched() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.utils.weight_norm(nn.Conv1d(3, 8, 1)), nn.ReLU(), nn.Conv1d(8, 4, 1)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(prunefx.PrunefxError, match=r"module '0' uses the deprecated torch.nn.utils.weight_norm.*"
                                                   r"parametrizations.weight_norm"):
        prunefx.prune(model, torch.randn(2, 3, 5), prunefx.PlanConfig(ratio=0.5), criterion="l1")
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
