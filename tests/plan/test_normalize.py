"""PlanConfig.normalize: per-group score scaling makes one global ranking blind to a layer's scale.

The property that matters: folding a BatchNorm's scale into the next conv leaves the function unchanged, so a
normalised global plan must keep the same channels; a raw one does not (the test would catch a no-op).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import prunefx
from prunefx.errors import ScoreScaleWarning
from prunefx.importance import score
from prunefx.plan import CostModel, PlanConfig, PlanError, PruningPlan, make_plan
from prunefx.plan.config import NORMALIZE
from prunefx.plan.plan import SCALE_SPREAD
from prunefx.plan.solve import _normalized

TESTS = Path(__file__).resolve().parents[1]
MODES = ("mean", "max", "sum", "standard")
FACTOR = 20.0  # the BatchNorm's output shrinks by this, the next conv's weight grows by it


def _cnn(seed: int = 0) -> nn.Sequential:
    """Conv-BN-ReLU x3 and a pooled Linear head, BatchNorms with random non-uniform affine and statistics."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for c_in, c_out in ((3, 8), (8, 12), (12, 16)):
        bn = nn.BatchNorm2d(c_out)
        with torch.no_grad():  # distinct gammas: the cut is decided by scores, not by tie-breaking
            bn.weight.uniform_(0.2, 1.2)
            bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), bn, nn.ReLU()]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)]
    return nn.Sequential(*layers).eval()


def _fold(model: nn.Sequential, factor: float) -> nn.Sequential:
    """A copy whose second BatchNorm's gamma and beta are divided by ``factor`` and the next conv's weight
    multiplied by it: ReLU is positively homogeneous, so the function is unchanged."""
    folded = _cnn()
    folded.load_state_dict(model.state_dict())
    with torch.no_grad():
        folded[4].weight /= factor
        folded[4].bias /= factor
        folded[6].weight *= factor
    return folded.eval()


def _plan(model: nn.Module, x: torch.Tensor, cfg: PlanConfig) -> PruningPlan:
    dg = prunefx.analyze(model, x)
    return make_plan(dg, score(model, dg, "bn_scale"), cfg, cost=CostModel(model, dg, (x,)))


def _kept(plan: PruningPlan) -> dict[int, tuple[int, ...]]:
    return {g.group: g.keep for g in plan.groups}


@pytest.mark.parametrize("target", [{"flops": 0.5}, {"ratio": 0.4}])
def test_normalised_global_plan_ignores_a_folded_batchnorm_scale(target):
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    folded = _fold(model, FACTOR)
    with torch.no_grad():
        want, got = model(x), folded(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))  # the same function
    for mode in MODES:
        before = _plan(model, x, PlanConfig(**target, normalize=mode))
        after = _plan(folded, x, PlanConfig(**target, normalize=mode))
        assert before.pruned, mode  # something is cut, so "the same" is not "nothing"
        assert _kept(after) == _kept(before), mode
    raw_before = _plan(model, x, PlanConfig(**target))
    raw_after = _plan(folded, x, PlanConfig(**target))
    assert _kept(raw_after) != _kept(raw_before)  # raw scores follow the fold: the invariance is normalisation's
    shrunk = next(g for g in raw_after.groups if g.before == 12)  # the second BatchNorm's group
    assert shrunk.after < next(g for g in raw_before.groups if g.before == 12).after


def _width_ms(cases):
    """A synthetic timer: a conv or linear layer costs in x out channels / 64 ms (a stand-in for real timing)."""
    out = {}
    for sig, case in cases.items():
        layer = case.layer
        if isinstance(layer, nn.Conv2d):
            out[sig] = layer.in_channels * layer.out_channels / 64
        else:
            out[sig] = layer.in_features * layer.out_features / 64 if isinstance(layer, nn.Linear) else 0.0
    return out


def test_the_latency_planner_ranks_normalised_scores_too(tmp_path):
    from prunefx.metrics import Deployment
    from prunefx.metrics.latency_table import LatencyTable
    from prunefx.plan.latency import LatencyModel

    model, x = _cnn(), torch.randn(1, 3, 16, 16)
    folded = _fold(model, FACTOR)
    dg = prunefx.analyze(model, x)  # the fold changes values, not structure: one analysis and table serve both
    table = LatencyTable(Deployment(threads=1, batch=1), tmp_path, timer=_width_ms)
    full_ms = (3 * 8 + 8 * 12 + 12 * 16 + 16 * 10) / 64
    lat = LatencyModel(model, dg, table, base_ms=full_ms, config=PlanConfig(latency=1.0))

    def kept(m, mode):
        plan = make_plan(dg, score(m, dg, "bn_scale"), PlanConfig(latency=0.6, normalize=mode), latency=lat)
        assert plan.pruned and plan.estimate["latency_ms_planned"] <= 0.6 * full_ms + 1e-9
        return _kept(plan)

    for mode in MODES:
        assert kept(folded, mode) == kept(model, mode), mode
    assert kept(folded, "none") != kept(model, "none")


def test_local_scope_is_not_changed_by_normalisation():
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    raw = _plan(model, x, PlanConfig(ratio=0.4, scope="local"))
    for mode in MODES:
        assert _kept(_plan(model, x, PlanConfig(ratio=0.4, scope="local", normalize=mode))) == _kept(raw)


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_keeps_the_order_in_a_group_and_gives_its_scale(mode):
    rng = np.random.default_rng(1)
    scores = {0: rng.uniform(0.1, 2.0, 9), 3: 0.01 * rng.uniform(0.1, 2.0, 14), 5: rng.normal(3.0, 0.5, 7)}
    out = _normalized(scores, [0, 3, 5], mode)
    for g, s in scores.items():
        v = out[g]
        assert np.array_equal(np.argsort(v, kind="stable"), np.argsort(s, kind="stable"))
        assert np.all(np.diff(v[np.argsort(s)]) > 0)  # strictly increasing where the raw scores are
        match mode:
            case "mean":
                assert np.mean(np.abs(v)) == pytest.approx(1.0, rel=1e-12)
            case "max":
                assert np.max(np.abs(v)) == pytest.approx(1.0, rel=1e-12)
            case "sum":
                assert np.sum(np.abs(v)) == pytest.approx(1.0, rel=1e-12)
            case "standard":
                assert abs(np.mean(v)) < 1e-12 and np.std(v) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_degenerate_groups_are_left_on_scale_one(mode):
    scores = {0: np.zeros(6), 1: np.full(5, 0.7), 2: np.array([0.2, 0.9, 0.4])}
    out = _normalized(scores, [0, 1, 2], mode)
    assert all(np.all(np.isfinite(v)) for v in out.values())
    assert np.array_equal(out[0], np.zeros(6))  # all-zero scores are never divided by zero
    if mode == "standard":  # all-equal scores: centred to the mean (0), not blown up from round-off
        assert np.allclose(out[1], 0.0, atol=1e-12)
    else:
        assert np.allclose(out[1], 1.0 / {"mean": 1.0, "max": 1.0, "sum": 5.0}[mode], rtol=1e-12)


def test_none_leaves_the_scores_alone():
    scores = {0: np.array([3.0, 1.0, 2.0])}
    assert _normalized(scores, [0], "none") is scores


def test_score_scale_round_trips_and_old_plans_load():
    model, x = _cnn(), torch.randn(2, 3, 16, 16)
    plan = _plan(model, x, PlanConfig(ratio=0.4, normalize="max"))
    bns = [m for m in model if isinstance(m, nn.BatchNorm2d)]
    by_width = {bn.num_features: float(bn.weight.detach().abs().double().mean()) for bn in bns}
    for g in plan.groups:  # each group's mean |raw score|: bn_scale scores are |gamma|
        assert g.score_scale == pytest.approx(by_width[g.before], rel=1e-6)
    assert plan.target["normalize"] == "max"
    again = PruningPlan.from_json(plan.to_json())
    assert again == plan
    old = json.loads(plan.to_json())
    del old["target"]["normalize"]
    for g in old["groups"]:
        del g["score_scale"]
    loaded = PruningPlan.from_dict(old)
    assert all(g.score_scale is None for g in loaded.groups)
    assert loaded.score_spread() is None and loaded.score_scale_note() is None
    assert "normalize" not in _plan(model, x, PlanConfig(ratio=0.4)).target  # "none" is not recorded


def _spread_model() -> nn.Sequential:
    """The CNN with its second BatchNorm's gammas shrunk 50x: raw bn_scale scores on very different scales."""
    model = _cnn()
    with torch.no_grad():
        model[4].weight /= 50.0
    return model


def test_a_raw_global_plan_over_differently_scaled_groups_warns():
    model, x = _spread_model(), torch.randn(2, 3, 16, 16)
    scales = [float(m.weight.detach().abs().double().mean()) for m in model if isinstance(m, nn.BatchNorm2d)]
    with pytest.warns(ScoreScaleWarning) as record:
        result = prunefx.prune(model, x, PlanConfig(ratio=0.4), criterion="bn_scale")
    assert len([w for w in record if issubclass(w.category, ScoreScaleWarning)]) == 1
    spread = result.plan.score_spread()
    assert spread == pytest.approx(max(scales) / min(scales), rel=1e-6) and spread > SCALE_SPREAD
    note = result.plan.score_scale_note()
    assert note is not None and note in result.warnings and note in result.plan.summary()
    assert str(record[0].message) == note


def test_a_normalised_or_local_plan_does_not_warn():
    x = torch.randn(2, 3, 16, 16)
    for cfg in (PlanConfig(ratio=0.4, normalize="mean"), PlanConfig(ratio=0.4, scope="local")):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            result = prunefx.prune(_spread_model(), x, cfg, criterion="bn_scale")
        assert not [w for w in record if issubclass(w.category, ScoreScaleWarning)], cfg
        assert result.plan.score_spread() > SCALE_SPREAD  # the scales still differ; only the ranking is fair
        assert result.plan.score_scale_note() is None and result.warnings == ()


def test_an_unknown_mode_names_the_allowed_ones():
    with pytest.raises(PlanError, match="normalize must be one of 'none', 'mean', 'max', 'sum', 'standard'"):
        PlanConfig(normalize="median")


def test_pipeline_prune_key_parses_into_the_plan():
    from prunefx.pipeline.run_config import PruneSpec

    spec = PruneSpec.parse({"target": {"flops": 0.5}, "normalize": "mean"}, train_keys=())
    assert spec.plan.normalize == "mean"
    assert PruneSpec.parse(spec.to_dict(), train_keys=()).plan.normalize == "mean"
    with pytest.raises(prunefx.PrunefxError, match="normalize must be one of"):
        PruneSpec.parse({"normalize": "median"}, train_keys=())


def test_cli_normalize_reaches_the_plan_and_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from typer.testing import CliRunner

    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()  # before ultralytics is imported (the CLI imports it): it reads its environment at import
    from prunefx.cli.main import app
    from prunefx.cli.prune import Normalize

    assert tuple(m.value for m in Normalize) == NORMALIZE  # the option's choices are PlanConfig's
    monkeypatch.syspath_prepend(str(TESTS))  # tests/_factories.py: the CLI tests' models
    runs = {}
    for mode in ("mean", "none"):  # scaled_cnn: its two groups' gammas differ ~50x
        run = tmp_path / mode
        args = ["prune", "_factories:scaled_cnn", "--imgsz", "32", "--ratio", "0.4", "--normalize", mode,
                "--no-latency", "--out", str(run)]
        result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        runs[mode] = (PruningPlan.from_json((run / "plan.json").read_text()),
                      json.loads((run / "report.json").read_text())["warnings"])
    plan, said = runs["mean"]
    assert plan.target["normalize"] == "mean" and plan.score_scale_note() is None
    assert not any("normalize=" in w for w in said)
    plan, said = runs["none"]
    assert "normalize" not in plan.target and plan.score_spread() > SCALE_SPREAD
    assert plan.score_scale_note() in said  # the report carries prune()'s warning
    bad = CliRunner().invoke(app, ["prune", "_factories:tiny_cnn", "--normalize", "median", "--out", str(tmp_path)])
    assert bad.exit_code == 2
