"""prunefx.prune never returns (and ``prunefx prune`` never saves) a model that fails the oracle: a deliberately
broken rule makes one group's pruning wrong; prune localises it, freezes it with the reason and replans."""

import copy
from pathlib import Path

import pytest
import torch
from _nets import randomize_bn
from torch import nn

import prunefx
from prunefx.analysis.rules import register_rule
from prunefx.analysis.rules._algebra import passthrough
from prunefx.errors import VerificationError
from prunefx.plan import PlanConfig
from prunefx.verify import verify


class ChannelFlip(nn.Module):
    """Reverses the channel order. The test registers a WRONG rule for it (labels pass straight through)."""

    def forward(self, x):
        return x.flip(1)


prunefx.register_leaf(ChannelFlip)  # opaque to tracing, so its (wrong) module rule is what the analysis uses
register_rule(ChannelFlip)(passthrough)  # deliberately broken: channel c really lands at position C-1-c


class Flipped(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.bn_a, self.flip = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), ChannelFlip()
        self.b, self.bn_b = nn.Conv2d(16, 24, 3, padding=1), nn.BatchNorm2d(24)
        self.c, self.bn_c, self.head = nn.Conv2d(24, 24, 1), nn.BatchNorm2d(24), nn.Conv2d(24, 5, 1)

    def forward(self, x):
        x = self.flip(torch.relu(self.bn_a(self.a(x))))
        x = torch.relu(self.bn_b(self.b(x)))
        return self.head(torch.relu(self.bn_c(self.c(x))))


def test_a_group_that_fails_the_check_is_frozen_and_the_target_replanned():
    model = randomize_bn(Flipped()).eval()
    x = torch.randn(2, 3, 8, 8)
    original = copy.deepcopy(model)
    dg = prunefx.analyze(copy.deepcopy(model), x)
    bad = dg.group_of("a").id
    result = prunefx.prune(model, x, PlanConfig(ratio=0.3), bias_compensation=False)
    assert [g for g, _ in result.frozen_by_check] == [bad]
    reason = dict(result.frozen_by_check)[bad]
    assert reason.startswith("failed the exactness check") and "flip" in reason  # names the op on the path
    assert not result.graph.groups[bad].prunable and result.graph.groups[bad].reasons[0] == reason
    assert bad not in {gp.group for gp in result.plan.pruned} and result.plan.pruned
    assert result.verified.ok, result.verified.message
    assert model.a.out_channels == 16 and model.b.out_channels < 24  # the rest still prunes to the target
    again = verify(original, model, result.plan, x)  # the returned model itself passes the oracle
    assert again.ok, again.message
    assert result.plan.frozen == result.frozen_by_check  # save/load re-freezes it (plan fingerprint matches)


def test_save_and_load_reapply_a_plan_with_groups_frozen_by_the_check(tmp_path):
    model = randomize_bn(Flipped()).eval()
    x = torch.randn(2, 3, 8, 8)
    fresh = copy.deepcopy(model)
    result = prunefx.prune(model, x, PlanConfig(ratio=0.3))
    prunefx.save(model, result.plan, tmp_path / "m.pt")
    loaded = prunefx.load(tmp_path / "m.pt", lambda: fresh)
    torch.testing.assert_close(loaded(x), model(x))


class Noise(nn.Module):
    """Random in eval mode too (inside a leaf, where the oracle cannot make it deterministic)."""

    def forward(self, x):
        return x + 0.1 * torch.randn_like(x)


prunefx.register_leaf(Noise)


def test_no_plan_passes_then_verification_error_and_the_model_untouched():
    model = randomize_bn(nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1),
                                       Noise())).eval()
    x = torch.randn(2, 3, 4, 4)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(VerificationError, match="even with nothing pruned"):
        prunefx.prune(model, x, PlanConfig(ratio=0.5))
    assert model[0].out_channels == 8
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_cli_writes_no_model_when_no_plan_passes(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from prunefx.cli.main import app

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["prune", "_factories:noisy_cnn", "--imgsz", "32", "--ratio", "0.5",
                                      "--no-latency", "--out", str(run)])
    assert result.exit_code == 2, result.output
    assert "even with nothing pruned" in result.output
    assert not (run / "pruned.pt").exists()


class Cells(nn.Module):
    """Eight blocks; after some, a NASNet-style projection runs only when the width is not 16."""

    def __init__(self, projected: tuple[int, ...]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(3 if i == 0 else 16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
            for i in range(8)
        )
        self.reduce = nn.ModuleDict({str(i): nn.Conv2d(16, 16, 1) for i in projected})
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x)
            if str(i) in self.reduce and x.size(1) != 16:
                x = self.reduce[str(i)](x)
        return self.head(x)


@pytest.mark.parametrize("projected", [(5,), (2, 5)])
def test_bisection_finds_each_failing_group_within_its_stated_bound_of_oracle_runs(monkeypatch, projected):
    import math

    import prunefx.analysis.groups
    from prunefx import api

    # The capture would freeze the projected blocks up front; without that, only the oracle can find them.
    monkeypatch.setattr(prunefx.analysis.groups, "_freeze_decided", lambda state, grouping: False)
    runs = []
    trial = api._Trial.__call__
    monkeypatch.setattr(api._Trial, "__call__", lambda self, dg, plan: runs.append(plan) or trial(self, dg, plan))
    model, x = randomize_bn(Cells(projected)).eval(), torch.randn(1, 3, 8, 8)
    dg = prunefx.analyze(copy.deepcopy(model), x)
    bad = {dg.group_of(f"blocks.{i}.0").id for i in projected}
    result = prunefx.prune(model, x, PlanConfig(ratio=0.5), criterion="l1", bias_compensation=False)

    assert {g for g, _ in result.frozen_by_check} == bad
    n, k = 8, len(projected)  # every block's group is pruned, one unit each
    bound = 1 + k * (math.ceil(math.log2(n)) + 1)
    for _, reason in result.frozen_by_check:
        found = int(reason.split("found in ")[1].split(" of at most ")[0])
        assert f"of at most {bound} oracle runs" in reason and f"k={k} failing of n={n}" in reason
        assert found == len(runs) - 2 <= bound  # runs: the whole plan, the bisection, the replanned plan
    assert all(model.blocks[i][0].out_channels == 16 for i in projected)
    assert all(model.blocks[i][0].out_channels < 16 for i in range(8) if i not in projected)
    assert result.verified.ok, result.verified.message
