"""The stages every pipeline shares: baseline, sparsity, prune (experts, depth, width, re-fit), fine-tune, report."""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any

from torch import nn

from prunefx._config import ConfigError, to_dict
from prunefx._io import atomic_write
from prunefx.errors import PrunefxError, ScoreScaleWarning, TiedScoresWarning
from prunefx.pipeline.controls import control_rows
from prunefx.pipeline.diagnose import score_warnings, sparsity_warnings
from prunefx.pipeline.job import (
    CALIBRATION_BATCHES,
    DEPTH_PLAN,
    ModelRole,
    StageContext,
    higher_is_better,
    nothing_to_prune,
    saved_plans,
)
from prunefx.pipeline.records import (
    BaselineDone,
    FrozenGroup,
    LatencyTarget,
    PruneDone,
    ReportDone,
    Skipped,
    SparsityDone,
    TrainDone,
    Width,
    warnings_of,
)
from prunefx.pipeline.run_config import StageSpec
from prunefx.plan import PlanConfig
from prunefx.train.sparsity import SparsityConfig, sparsity_stats


def baseline_stage(ctx: StageContext) -> BaselineDone:
    b = ctx.backend
    history = None
    if b.checkpoint is not None:
        model = b.from_checkpoint()
        source = f"checkpoint {b.checkpoint}"
        b.save(model, "baseline")
    else:
        trained = b.train("baseline", "init", StageSpec(b.baseline_epochs), None)
        model, history = trained.model, tuple(trained.history)
        source = f"trained from {b.name} for {b.baseline_epochs} epochs"
    return BaselineDone(source=source, history=history, metrics=b.evaluate("baseline", model))


def sparsity_stage(ctx: StageContext) -> SparsityDone | Skipped:
    sp, b = ctx.job.prune.sparsity, ctx.backend
    if sp.epochs == 0:
        return Skipped(skipped="prune.sparsity.epochs is 0")
    config = sp.config.resolved(b.architecture(), b.example_inputs())  # residual BNs named once, in every rank
    # scratch: the baseline's initial weights, trained with the penalty from the first step
    trained = b.train("sparse", "init" if sp.start == "scratch" else "baseline", sp, config)
    # The saved model's gammas: what the prune stage ranks (for YOLO the EMA weights ultralytics saves).
    saved = b.load("sparse") if b.dist.is_main else trained.model
    thresholds = sorted({1e-3, 1e-2, 1e-1, config.threshold})
    gammas = sparsity_stats(saved, modules=_penalised(saved, config), thresholds=thresholds)
    return SparsityDone(history=tuple(trained.history), distill=trained.distill, ranks=trained.ranks,
                        gammas=gammas.flat(), warnings=tuple(sparsity_warnings(gammas, config)),
                        metrics=b.evaluate("sparse", trained.model))


def _penalised(model: nn.Module, config: SparsityConfig) -> list[str]:
    from prunefx.train.sparsity import BNSparsity

    return list(BNSparsity(model, exclude=config.exclude).modules)


def prune_stage(ctx: StageContext) -> PruneDone:
    from prunefx.report import write_graph
    from prunefx.view.graph_data import graph_data

    spec, b = ctx.job.prune, ctx.backend
    source: ModelRole = "sparse" if ctx.ran("sparsity") else "baseline"
    model = b.load(source).eval()
    kwargs = b.score_kwargs(spec.criterion)
    if spec.refit or spec.plan.scope == "sensitivity":  # taylor's labelled batches serve these too: passed once
        kwargs.setdefault("calibration", b.calibration(CALIBRATION_BATCHES))
    depth, experts, config = None, None, spec.plan
    if spec.depth.remove or spec.experts.keep < 1:
        from prunefx.metrics import measure

        before = measure(model, b.example_inputs())
        experts = _cut_experts(ctx, model) if spec.experts.keep < 1 else None
        depth = _cut_depth(ctx, model) if spec.depth.remove else None
        config, restated = _width_config(ctx, before, measure(model, b.example_inputs()))
        (depth.record if depth is not None else experts).update(restated)
    cut: dict[str, float] = {}  # the metrics right after the cut, before the re-fit changes the weights
    if spec.refit and spec.steps == 1 and b.cuts.before_refit:
        def measure_cut(pruned: nn.Module) -> None:
            ctx.log("  the cut alone, before the re-fit:")
            cut.update(b.evaluate("pruned", pruned, alone=True))

        kwargs["on_cut"] = measure_cut
    with warnings.catch_warnings():  # score_warnings below logs tied scores with the run's own fix, once
        warnings.simplefilter("ignore", TiedScoresWarning)
        warnings.simplefilter("ignore", ScoreScaleWarning)  # the report carries it below, as prune() phrased it
        result = b.cuts.width(model, b.prune_inputs(), config, criterion=spec.criterion, check=spec.verify,
                              bias_compensation=spec.bias_compensation, deployment=b.deployment(), steps=spec.steps,
                              refit=spec.refit, **kwargs)
    reason = nothing_to_prune(result.graph, result.plan, b.name)
    if reason:
        raise ConfigError(reason)
    if not result.plan.pruned:
        target = ", ".join(f"{k} {v:g}" for k, v in spec.target.items())
        raise ConfigError(f"the target ({target}) is already met: the plan removes no channel from {b.name}; "
                          "lower it (e.g. prune.target.flops=0.5, --flops 0.5)")
    if result.verified is not None and not result.verified.accepted:  # proven, or inexact by design (labelled)
        raise PrunefxError(f"the pruned model differs from the masked original: {result.verified.message}")
    verify = result.verified.headline() if result.verified is not None else "skipped (prune.verify=false)"
    latency = None
    if result.latency is not None:  # a latency target: the rounds of planning against measured latency
        latency = LatencyTarget(met=result.latency.met, note=result.latency.note,
                                rounds=tuple(asdict(r) for r in result.latency.rounds))
    est = result.plan.estimate
    sparsity = ctx.done("sparsity")
    found = score_warnings(result, spec.criterion, sparsity.gamma_stats if isinstance(sparsity, SparsityDone) else None)
    if note := result.plan.score_scale_note():  # raw scores of very differently scaled groups under one threshold
        found.append(note)
    partial = None
    if result.parts is not None:  # the model's own forward was not captured: what was pruned and what was not
        partial = result.parts.to_dict()
        found.append(result.parts.describe().replace("\n", "; "))
    atomic_write(ctx.root / "plan.json", result.plan.to_json().encode())
    if depth is not None:
        atomic_write(ctx.root / DEPTH_PLAN, json.dumps(depth.plan.to_dict(), indent=1).encode())
    write_graph(ctx.root, graph_data(result.graph, result.plan))  # report.html draws the graph from it
    b.save(result.model, "pruned", result.plan if depth is None else [depth.plan, result.plan])
    ctx.log(f"  {len(result.plan.pruned)} of {len(result.plan.groups)} groups pruned; verify: {verify}")
    return PruneDone(
        source=source,
        verify=verify,
        widths=tuple(Width(name=result.graph.groups[g.group].label, before=g.before, after=g.after)
                     for g in result.plan.groups),
        # groups prune() froze because pruning them failed the oracle (the target was planned again without them)
        frozen_by_check=tuple(FrozenGroup(name=result.graph.groups[g].label, reason=why)
                              for g, why in result.frozen_by_check),
        latency_target=latency,
        macs_kept_estimate=est["macs_after"] / est["macs_before"] if est.get("macs_before") else None,
        warnings=tuple(found),
        partial_capture=partial,
        refit=None if result.refit is None else {**result.refit.to_dict(), "calibration": b.calibration_source,
                                                 **({"metrics_before": cut} if cut else {})},
        depth=None if depth is None else depth.record,
        experts=experts,
        sensitivity=({**result.sensitivity.to_dict(), "calibration": b.calibration_source}
                     if result.sensitivity is not None else None),
        metrics=b.evaluate("pruned", result.model, alone=True),  # only rank 0 runs this stage
    )


@dataclass(frozen=True)
class _DepthCut:
    plan: Any  # the DepthPlan
    record: dict[str, Any]  # PruneDone.depth


def _cut_depth(ctx: StageContext, model: nn.Module) -> _DepthCut:
    """Remove ``prune.depth.remove`` blocks of ``model`` in place, checked by the depth oracle."""
    spec, b = ctx.job.prune, ctx.backend
    d = spec.depth
    assert b.cuts.depth is not None  # preflight refused prune.depth otherwise
    result = b.cuts.depth(model, b.prune_inputs(), remove=d.remove, criterion=d.criterion, iterative=d.iterative,
                          calibration=b.calibration(CALIBRATION_BATCHES), check=spec.verify)
    verify = result.verified.message if result.verified is not None else "skipped (prune.verify=false)"
    ctx.log(f"  depth: removed {', '.join(result.plan.remove)} ({d.criterion}); verify: {verify}")
    record = {"removed": list(result.plan.remove), "criterion": result.plan.criterion,
              "scores": {p: s for p, s in result.plan.scores}, "verify": verify, "warnings": list(result.warnings)}
    return _DepthCut(result.plan, record)


def _cut_experts(ctx: StageContext, model: nn.Module) -> dict[str, Any]:
    """Remove ``1 - prune.experts.keep`` of every MoE layer's experts in place, checked by the expert oracle."""
    spec, b = ctx.job.prune, ctx.backend
    e = spec.experts
    assert b.cuts.experts is not None  # preflight refused prune.experts otherwise
    result = b.cuts.experts(model, b.calibration(CALIBRATION_BATCHES), keep=e.keep, criterion=e.criterion,
                            check=spec.verify)
    verify = result.verified.message if result.verified is not None else "skipped (prune.verify=false)"
    kept = {path: list(k) for path, k in result.plan.keep}
    ctx.log(f"  experts: {len(next(iter(kept.values()), []))} kept per MoE layer ({e.criterion}); verify: {verify}")
    return {"kept": kept, "criterion": e.criterion, "active_params": list(result.active_params), "verify": verify,
            "warnings": list(result.warnings)}


def _width_config(ctx: StageContext, before: Any, after: Any) -> tuple[PlanConfig, dict[str, Any]]:
    """The width plan's config after the expert / depth cuts: the target, a fraction of the model given, restated
    for the model they left; and what they kept."""
    spec = ctx.job.prune
    ((key, value),) = spec.target.items()
    kept = {"params": after.params / before.params, "flops": after.macs / before.macs}
    width = value if key == "ratio" else value / kept[key]
    if key != "ratio" and width >= 1.0:
        raise ConfigError(f"prune.depth / prune.experts alone keep {kept[key]:.3f} of the {key}, at or under the "
                          f"target prune.target.{key}={value:g}, leaving the width cut nothing to do; cut fewer "
                          "blocks or experts, or lower the target")
    restated = {"params_kept": kept["params"], "macs_kept": kept["flops"], "width_target": {key: width}}
    return replace(spec.plan, **{key: width}), restated


KEPT_CUT = "fine-tune made it worse: kept the cut model"


def finetune_stage(ctx: StageContext) -> TrainDone | Skipped:
    ft, b = ctx.job.prune.finetune, ctx.backend
    if ft.epochs == 0:
        return Skipped(skipped="prune.finetune.epochs is 0")
    trained = b.train("finetuned", "pruned", ft, None)
    metrics = b.evaluate("finetuned", trained.model)
    cut, key = ctx.metrics("prune"), b.primary_metric  # the prune stage's record: rank 0 only, which decides
    before, after = cut.get(key), metrics.get(key)
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and (
            after < before if higher_is_better(b) else after > before):
        # the user's metric is the judge: a fine-tune that lowered it is not the run's result
        b.save(b.load("pruned"), "finetuned", saved_plans(ctx.root))
        ctx.log(f"  {KEPT_CUT} ({key} {before:.4g} after the cut, {after:.4g} fine-tuned; "
                f"{'higher' if higher_is_better(b) else 'lower'} is better)")
        return TrainDone(history=tuple(trained.history), distill=trained.distill, ranks=trained.ranks,
                         metrics=cut, kept="pruned", finetuned_metrics=metrics)
    return TrainDone(history=tuple(trained.history), distill=trained.distill, ranks=trained.ranks, metrics=metrics)


def report_stage(ctx: StageContext) -> ReportDone:
    from prunefx.metrics import compare_latency, measure
    from prunefx.report import Stage, build_report, write_report

    spec, b, run = ctx.job.prune, ctx.backend, ctx.run
    x = b.example_inputs()
    roles: dict[str, tuple[ModelRole, str]] = {"baseline": ("baseline", "baseline"), "pruned": ("pruned", "prune")}
    if ctx.ran("finetune"):
        roles["finetuned"] = ("finetuned", "finetune")
    models = {name: b.load(role).cpu().eval() for name, (role, _) in roles.items()}
    # The stages are timed in alternating rounds, so a slow spell of the machine hits them all alike.
    timed = compare_latency(models, x, b.deployment(), max_seconds=spec.latency_max_s,
                            progress=ctx.progress.latency_round if ctx.progress else None) if spec.latency else {}
    cut = next((t.cut_short for t in timed.values() if t.cut_short), None)
    if cut:
        ctx.log(f"  latency: {cut} (prune.latency_max_s); the report's timings rest on fewer repeats")
    stages = {name: Stage(measure(m, x), timed.get(name),
                          {**ctx.metrics(roles[name][1]), **b.extra_costs(m)})
              for name, m in models.items()}
    pr = ctx.done("prune")
    assert isinstance(pr, PruneDone)  # the report follows the prune stage in every job
    sparsity = ctx.done("sparsity")
    sparse = sparsity if isinstance(sparsity, SparsityDone) else None
    settings = {
        "config": dict(ctx.job.config),
        "criterion": spec.criterion,
        "target": spec.target,
        "verify": pr.verify,
        "pruned_from": pr.source,
        "stage_seconds": {k: v.get("seconds") for k, v in run.state["stages"].items()},
        **({"sparsity": {"metrics": to_dict(sparse.metrics) if sparse else None,
                         "gammas": to_dict(sparse.gammas) if sparse else None}}
           if "sparsity" in ctx.job.stages else {}),
        **({"latency_timing": {"max_seconds": spec.latency_max_s, "rounds": next(iter(timed.values())).rounds,
                               "cut_short": cut}} if timed else {}),
        **({"latency_target": to_dict(pr.latency_target)} if pr.latency_target else {}),
        **({"experts": dict(pr.experts)} if pr.experts else {}),  # the experts each MoE layer kept, first
        **({"depth": dict(pr.depth)} if pr.depth else {}),  # the blocks the depth cut removed, before the width cut
        **({"refit": dict(pr.refit)} if pr.refit else {}),  # calibration error before/after, per layer
        **({"sensitivity": dict(pr.sensitivity)} if pr.sensitivity else {}),  # per-group damage curves, plotted
        **b.settings(),
    }
    warnings = [w for s in ("sparsity", "prune", "controls") for w in warnings_of(ctx.done(s))]
    ft = ctx.done("finetune")
    if isinstance(ft, TrainDone) and ft.kept == "pruned":  # both models' metrics, and which one the run kept
        key = b.primary_metric
        settings["finetune"] = {"kept": "pruned", "note": KEPT_CUT, "metric": key,
                                "higher_is_better": higher_is_better(b), "metrics_cut": dict(ft.metrics),
                                "metrics_finetuned": dict(ft.finetuned_metrics or {})}
        warnings.append(f"{KEPT_CUT}: {key} {ft.metrics[key]:.4g} after the cut, "
                        f"{(ft.finetuned_metrics or {})[key]:.4g} after fine-tuning "
                        f"({'higher' if higher_is_better(b) else 'lower'} is better); the final weights are the cut's")
    report = build_report(model=b.name, baseline=stages["baseline"], pruned=stages["pruned"],
                          finetuned=stages.get("finetuned"), settings=settings, warnings=warnings,
                          widths=[(w.name, w.before, w.after) for w in pr.widths],
                          controls=control_rows(ctx, x))
    write_report(ctx.root, report)
    return ReportDone(macs_kept=report["stages"]["pruned"]["macs"] / report["stages"]["baseline"]["macs"],
                      files=tuple(sorted(p.name for p in ctx.root.iterdir() if p.is_file())))


__all__ = ["KEPT_CUT", "baseline_stage", "finetune_stage", "prune_stage", "report_stage", "sparsity_stage"]
