"""Plan, rewrite and the masked-original oracle on small models."""

import copy
import math

import numpy as np
import pytest
import torch
import torchvision
from _nets import Patterns, randomize_bn
from torch import nn

import prunefx
import prunefx.checkpoint
from prunefx.analysis.roles import Kind
from prunefx.metrics import measure
from prunefx.plan import CostModel, PlanConfig, PlanError, PruningPlan, make_plan
from prunefx.transform.rewrite import apply_plan
from prunefx.verify import masked_outputs, verify


def _random_scores(dg, seed=0):
    rng = np.random.default_rng(seed)
    return {g.id: rng.random(g.channels) for g in dg.prunable}


def _prune(model, x, cfg, seed=0):
    original = copy.deepcopy(model)
    dg = prunefx.analyze(model, x)
    plan = make_plan(dg, _random_scores(dg, seed), cfg, cost=CostModel(model, dg, x))
    apply_plan(model, dg, plan)
    return original, dg, plan


@pytest.mark.parametrize("cfg", [PlanConfig(ratio=0.5), PlanConfig(flops=0.5), PlanConfig(ratio=0.3, scope="local"),
                                 PlanConfig(params=0.6, round_to=4)])
def test_patterns_model_equals_masked_original(cfg):
    model = randomize_bn(Patterns()).eval()
    x = torch.randn(2, 3, 16, 16)
    original, dg, plan = _prune(model, x, cfg)
    assert plan.pruned, "something must be pruned"
    result = verify(original, model, plan, x)
    assert result.ok and result.exact, result.message
    assert result.max_rel_error < 1e-4
    assert model(x).shape == original(x).shape
    assert sum(p.numel() for p in model.parameters()) < sum(p.numel() for p in original.parameters())


def test_flops_target_within_two_percent_of_measured():
    model = randomize_bn(torchvision.models.resnet18()).eval()
    x = torch.randn(1, 3, 64, 64)
    base = measure(model, x).macs
    for target in (0.7, 0.5, 0.35):
        m = copy.deepcopy(model)
        _prune(m, x, PlanConfig(flops=target))
        got = measure(m, x).macs / base
        assert abs(got - target) <= 0.02 * target, (target, got)


def test_ratio_removes_requested_fraction_and_never_empties_a_group():
    model = Patterns()
    x = torch.randn(1, 3, 16, 16)
    dg = prunefx.analyze(model, x)
    plan = make_plan(dg, _random_scores(dg), PlanConfig(ratio=0.5, max_ratio=1.0, min_channels=1))
    before = sum(g.before for g in plan.groups)
    after = sum(g.after for g in plan.groups)
    assert abs((before - after) / before - 0.5) < 0.05
    assert all(g.after >= 1 for g in plan.groups)


def test_clamps_round_to_and_local_ratio():
    model = torchvision.models.resnet18()
    x = torch.randn(1, 3, 32, 32)
    dg = prunefx.analyze(model, x)
    scores = _random_scores(dg)
    plan = make_plan(dg, scores, PlanConfig(ratio=0.6, max_ratio=0.5, round_to=8))
    for g in plan.groups:
        assert g.after >= math.ceil(0.5 * g.before)  # max_ratio clamp
        assert g.after % 8 == 0 or g.after == g.before  # round_to
    local = make_plan(dg, scores, PlanConfig(ratio=0.25, scope="local"))
    for g in local.groups:
        assert g.after == g.before - math.floor(0.25 * g.before)
        kept = np.sort(scores[g.group])[::-1][: g.after]
        assert set(np.asarray(scores[g.group])[list(g.keep)]) == set(kept)  # the best channels stay


def test_chunk_halves_keep_equal_counts():
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", verbose=False)
    x = torch.randn(1, 3, 64, 64)
    dg = prunefx.analyze(model, x)
    assert dg.ties, "C2f chunk(2) halves are tied"
    plan = make_plan(dg, _random_scores(dg), PlanConfig(ratio=0.5))
    after = {g.group: g.after for g in plan.groups}
    for gids, _ in dg.ties:
        assert len({after.get(g, dg.groups[g].channels) for g in gids}) == 1


def test_ignore_and_overrides():
    model = torchvision.models.resnet18()
    x = torch.randn(1, 3, 32, 32)
    dg = prunefx.analyze(model, x)
    plan = make_plan(dg, _random_scores(dg), PlanConfig(ratio=0.4, ignore=("layer4.*",)))
    ignored = {g.id for g in dg.prunable if any(n.startswith("layer4.") for n in g.modules())}
    assert ignored and not ignored & {g.group for g in plan.groups}
    with pytest.warns(UserWarning, match="matches no module"):
        make_plan(dg, _random_scores(dg), PlanConfig(ratio=0.4, ignore=("nope.*",)))
    local = make_plan(dg, _random_scores(dg), PlanConfig(ratio=0.1, scope="local", overrides=(("layer1.*", 0.5),)))
    for g in local.groups:
        r = 0.5 if any(n.startswith("layer1.") for n in dg.groups[g.group].modules()) else 0.1
        assert g.after == g.before - math.floor(r * g.before)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(ratio=1.0),
        dict(ratio=-0.1),
        dict(flops=0.0),
        dict(flops=1.5),
        dict(scope="layer"),
        dict(ignore=[3]),
        dict(ratio=0.5, flops=0.5),
        dict(ratio=0.5, round_to=0),
        dict(ratio=0.5, min_channels=0),
    ],
)
def test_bad_config_is_rejected(kwargs):
    with pytest.raises(PlanError):
        PlanConfig(**kwargs)


def test_the_default_target_is_stated_once():
    assert PlanConfig() == PlanConfig(flops=0.5) and PlanConfig(ratio=0.3).flops is None
    assert PlanConfig(ignore=["a.*"]).ignore == ("a.*",)  # lists from YAML/JSON are stored as tuples


def test_plan_for_another_model_fails_before_touching_anything():
    x = torch.randn(1, 3, 32, 32)
    a, b = torchvision.models.resnet18(), torchvision.models.resnet34()
    dga, dgb = prunefx.analyze(a, x), prunefx.analyze(b, x)
    plan = make_plan(dga, _random_scores(dga), PlanConfig(ratio=0.5))
    before = {k: v.clone() for k, v in b.state_dict().items()}
    with pytest.raises(PlanError, match="different model"):
        apply_plan(b, dgb, plan)
    assert all(torch.equal(before[k], v) for k, v in b.state_dict().items())


def test_plan_json_round_trip_and_reapply():
    model = randomize_bn(torchvision.models.resnet18()).eval()
    x = torch.randn(1, 3, 32, 32)
    twin = copy.deepcopy(model)
    _, _, plan = _prune(model, x, PlanConfig(ratio=0.4))
    again = PruningPlan.from_json(plan.to_json())
    assert again == plan
    apply_plan(twin, prunefx.analyze(twin, x), again)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values(), strict=True))


def test_save_load_round_trip(tmp_path):
    model = randomize_bn(Patterns()).eval()
    x = torch.randn(2, 3, 16, 16)
    _, _, plan = _prune(model, x, PlanConfig(ratio=0.4))
    path = prunefx.checkpoint.save(model, plan, tmp_path / "p.pt")
    payload = torch.load(path, weights_only=True)  # plain data: no pickled classes
    assert payload["format"] == "prunefx.checkpoint/1"
    loaded = prunefx.checkpoint.load(path, Patterns).eval()
    assert torch.allclose(loaded(x), model(x), atol=1e-6)
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(prunefx.PrunefxError, match="not a readable"):
        prunefx.checkpoint.load(tmp_path / "bad.pt", Patterns)


def test_inexact_groups_are_reported_not_hidden():
    class LN(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.ln, self.fc2 = nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(self.ln(self.fc1(x)))

    model = LN().eval()
    x = torch.randn(4, 8)
    original, dg, plan = _prune(model, x, PlanConfig(ratio=0.5))
    result = verify(original, model, plan, x)
    assert not result.exact and result.inexact_groups
    assert "not exactly verifiable" in result.message
    assert model(x).shape == (4, 4)


def test_verify_catches_a_wrong_rewrite():
    model = randomize_bn(torchvision.models.resnet18()).eval()
    x = torch.randn(1, 3, 32, 32)
    original, dg, plan = _prune(model, x, PlanConfig(ratio=0.3))
    with torch.no_grad():  # corrupt one kept channel: the oracle must notice
        model.layer1[0].conv1.weight[0].mul_(2.0)
    assert not verify(original, model, plan, x).ok


def test_hard_coded_width_is_skipped_unless_graph_rewrite():
    class Hard(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
            self.fc = nn.Linear(16 * 4 * 4, 5)

        def forward(self, x):
            y = torch.relu(self.bn(self.conv(x)))
            return self.fc(y.view(x.shape[0], 16, -1).flatten(1))  # literal channel count in forward

    x = torch.randn(2, 3, 4, 4)
    model = randomize_bn(Hard()).eval()
    dg = prunefx.analyze(model, x)
    (g,) = dg.groups_of("conv")
    assert any(m.kind is Kind.CONST for m in g.members)
    plan = make_plan(dg, _random_scores(dg), PlanConfig(ratio=0.5))
    assert g.id in dict(plan.skipped) and "graph_rewrite" in dict(plan.skipped)[g.id]

    original = copy.deepcopy(model)
    plan = make_plan(dg, _random_scores(dg), PlanConfig(ratio=0.5, graph_rewrite=True))
    assert any(p.group == g.id and p.after < p.before for p in plan.groups)
    with pytest.raises(PlanError, match="graph_rewrite"):
        apply_plan(copy.deepcopy(model), prunefx.analyze(copy.deepcopy(model), x), plan)
    pruned = apply_plan(model, dg, plan, graph_rewrite=True)
    assert isinstance(pruned, torch.fx.GraphModule)  # the rewritten literal lives in the graph
    reference = masked_outputs(original, prunefx.analyze(original, x), plan, (x,))[0]
    assert torch.allclose(pruned(x), reference, atol=1e-5)


class _HardCodedWidth(nn.Module):
    """A literal channel count in forward (``view(b, 16, -1)``): only a graph rewrite can follow a pruned width."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.view(x.shape[0], 16, -1).mean(-1))


def test_graph_rewrite_through_prune_and_load(tmp_path):
    """prune() and load() hand back the module apply_plan returns (it was dropped: a crash in verify, or with
    check=False a model that does not run)."""
    x = torch.randn(2, 3, 4, 4)
    model = randomize_bn(_HardCodedWidth()).eval()
    result = prunefx.prune(copy.deepcopy(model), x, PlanConfig(ratio=0.5, graph_rewrite=True), criterion="l1")
    assert result.verified.ok, result.verified.message
    assert result.plan.pruned and result.model(x).shape == (2, 5)
    unchecked = prunefx.prune(copy.deepcopy(model), x, PlanConfig(ratio=0.5, graph_rewrite=True), check=False)
    assert unchecked.model(x).shape == (2, 5)
    path = prunefx.save(result.model, result.plan, tmp_path / "hard.pt")
    again = prunefx.load(path, _HardCodedWidth).eval()
    torch.testing.assert_close(again(x), result.model(x))


def test_cost_model_counts_every_normalized_dim():
    """A LayerNorm over (C, D) has two channel dims; the MACs estimate follows both (it once read only the first)."""

    class Norm2d(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 12), nn.Linear(12, 3)
            self.ln = nn.LayerNorm([6, 12])

        def forward(self, x):  # x: (B, 6, 8)
            return self.b(self.ln(self.a(x)))

    x = torch.randn(2, 6, 8)
    model = Norm2d().eval()
    dg = prunefx.analyze(model, x)
    (g,) = dg.groups_of("ln", "normalized1")
    assert g.prunable and g.modules("normalized1") == ["ln"]
    cost = CostModel(model, dg, (x,))
    keep = {g.id: np.arange(g.channels) < 6}  # half of the 12 features
    plan = make_plan(dg, {g.id: np.arange(g.channels, 0, -1.0)}, PlanConfig(ratio=0.5), cost=cost)
    pruned = apply_plan(copy.deepcopy(model), dg, plan)
    assert plan.groups[0].after == 6
    assert cost.macs(keep) == pytest.approx(measure(pruned, x).macs, rel=1e-6)


def test_plan_names_its_criterion_and_groups():
    """A plan made from ``score(...)`` says which criterion made it (it read 'by custom'), and every planned group
    carries its human name; a plan saved before labels existed still loads."""
    model = randomize_bn(Patterns()).eval()
    x = torch.randn(2, 3, 8, 8)
    dg = prunefx.analyze(model, x)
    plan = make_plan(dg, prunefx.score(model, dg, "l2"), PlanConfig(ratio=0.3))
    assert plan.criterion == "l2" and "by l2" in plan.summary()
    assert [g.label for g in plan.groups] == [dg.groups[g.group].label for g in plan.groups]
    assert make_plan(dg, _random_scores(dg), PlanConfig(ratio=0.3)).criterion == "custom"
    old = plan.to_dict()
    for g in old["groups"]:
        del g["label"]
    assert PruningPlan.from_dict(old).groups[0].label == ""


def test_verify_leaves_both_models_untouched():
    """The train-mode run updates BatchNorm statistics; verify puts every buffer back (no deep copies needed)."""
    model = randomize_bn(Patterns()).eval()
    x = torch.randn(2, 3, 8, 8)
    original, _, plan = _prune(model, x, PlanConfig(ratio=0.3))
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in (original, model)]
    assert verify(original, model, plan, x).ok
    for saved, now in zip(before, (original.state_dict(), model.state_dict()), strict=True):
        assert saved.keys() == now.keys() and all(torch.equal(saved[k], now[k]) for k in saved)
    assert not original.training and not model.training


def test_a_mode_the_original_cannot_run_is_not_held_against_the_pruned_model():
    """ResNet-18 at 32 px ends in 1x1 maps: BatchNorm in train mode at batch 1 fails for the original too."""
    model = randomize_bn(torchvision.models.resnet18()).eval()
    x = torch.randn(1, 3, 32, 32)
    original, _, plan = _prune(model, x, PlanConfig(ratio=0.3))
    result = verify(original, model, plan, x)
    assert result.ok and result.runs_train and "train mode not checked" in result.message


def _bn_net(gammas: torch.Tensor) -> nn.Module:
    """conv-BN-ReLU twice, then a classifier: two groups, both scored by bn_scale from ``gammas``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()
    with torch.no_grad():
        for bn in (model[1], model[4]):
            bn.weight.copy_(gammas)
    return model


@pytest.mark.parametrize("gamma", [0.0, 1.0])  # zeroed gammas, and a fresh BatchNorm's
def test_tied_gammas_are_warned_and_kept_in_the_result(gamma):
    from prunefx.errors import TiedScoresWarning
    from prunefx.pipeline.diagnose import score_warnings

    with pytest.warns(TiedScoresWarning) as record:
        result = prunefx.prune(_bn_net(torch.full((8,), gamma)), torch.randn(2, 3, 8, 8), PlanConfig(flops=0.5))
    (warning,) = [w for w in record if issubclass(w.category, TiedScoresWarning)]
    message = str(warning.message)
    assert warning.filename == __file__  # it points at the caller of prune()
    assert result.warnings == (message,) and result.plan.pruned
    assert "channel scores (bn_scale) are (near-)tied at the cut in 2 of 2 pruned group(s)" in message
    assert "train the model first" in message and "criterion='taylor'" in message
    assert ("every score of those groups is 0" in message) == (gamma == 0.0)
    (run,) = score_warnings(result, "bn_scale", None)  # the pipelines' warning is the same test
    assert "in 2 of 2 pruned group(s)" in run and "train with sparsity first" in run


def test_distinct_gammas_are_not_warned():
    import warnings

    from prunefx.errors import TiedScoresWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", TiedScoresWarning)
        result = prunefx.prune(_bn_net(torch.linspace(0.1, 1.0, 8)), torch.randn(2, 3, 8, 8), PlanConfig(flops=0.5))
    assert result.plan.pruned and result.warnings == ()


def test_a_mapping_is_read_as_a_plan_config():
    x = torch.randn(2, 3, 8, 8)
    given = prunefx.prune(_bn_net(torch.linspace(0.1, 1.0, 8)), x, {"flops": "0.6", "round_to": 2})
    typed = prunefx.prune(_bn_net(torch.linspace(0.1, 1.0, 8)), x, config=PlanConfig(flops=0.6, round_to=2))
    assert given.plan.to_dict() == typed.plan.to_dict() and given.plan.pruned
