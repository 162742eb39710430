"""One call from model to pruned model: analyze -> score -> plan -> apply, and a model that fails the oracle is
never returned.

    result = prunefx.prune(model, torch.randn(1, 3, 224, 224), PlanConfig(flops=0.5), criterion="bn_scale")
    print(result.plan.summary())

With ``check`` (the default) the plan is first applied to a copy and verified against the masked original. When
that fails, the groups responsible are found by bisection over the plan's groups (each trial: a fresh copy pruned
with a subset), frozen with the reason "failed the exactness check" and the ops and source lines on their path,
and the same target is planned again; only a plan whose copy passes is applied to ``model``. If none does,
:class:`VerificationError` is raised and ``model`` is left untouched.

Each step is public on its own (``analyze``, ``importance.score``, ``make_plan``, ``apply_plan``,
``verify``) so research code can swap in its own criterion or plan.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
from torch import nn

from prunefx import compensation as bias
from prunefx._config import from_dict
from prunefx.analysis import Capture, DependencyGraph, analyze
from prunefx.analysis.parts import PartialCapture, check_inputs
from prunefx.capture.inputs import Inputs, positional
from prunefx.errors import PrunefxError, ScoreScaleWarning, TiedScoresWarning, VerificationError
from prunefx.importance import Scores, compensates, score, ties_at_cut
from prunefx.metrics import Deployment
from prunefx.plan import CostModel, GroupPlan, PlanConfig, PlanError, PruningPlan, make_plan
from prunefx.plan.latency import LatencyModel, LatencyOutcome
from prunefx.plan.measured import plan_for_latency
from prunefx.plan.sensitivity import SensitivityCurves
from prunefx.plan.widths import with_registered_widths
from prunefx.sensitivity import calibration_batches
from prunefx.sensitivity import measure as measure_sensitivity
from prunefx.steps import prune_in_steps
from prunefx.transform import Compensation, Refit, apply_plan, check_calibration, owned_modules
from prunefx.transform import refit as refit_layers  # prune()'s own refit is its flag
from prunefx.verify import VerifyResult, verify

_MAX_ROUNDS = 3  # localise-freeze-replan rounds before giving up
_MAX_CULPRITS = 8  # groups found per round
NO_DATA = ("no calibration data: the cut was made from the weights and the example inputs alone; a few batches of "
           "real inputs (prunefx.prune(..., calibration=[x1, x2, ...])) would re-fit it by least squares to the "
           "original's outputs")


@dataclass(frozen=True)
class PruneResult:
    """What :func:`prune` did: the plan, the analysis it was made from, the scores and the check."""

    model: nn.Module  # the module to use: the pruned model, or the rewritten GraphModule (graph_rewrite)
    plan: PruningPlan
    graph: DependencyGraph
    scores: Scores
    verified: VerifyResult | None
    # bias compensation: what was folded, or the decision not to (applied, why, held-out errors); None: not considered
    compensation: Compensation | None = None
    refit: Refit | None = None  # the re-fit after the cut (refit=True): each layer's calibration error before/after
    latency: LatencyOutcome | None = None  # a latency target's rounds: planned vs measured, re-plans
    frozen_by_check: tuple[tuple[int, str], ...] = ()  # (group id, reason): groups that failed the oracle
    warnings: tuple[str, ...] = ()  # what prune() warned about (tied scores, score scales), for a CLI or report
    sensitivity: SensitivityCurves | None = None  # scope="sensitivity": the measured damage curves planned on
    steps: tuple[PruneResult, ...] = ()  # prune(steps=k): each cut's own result (plan relative to the model it cut)
    notes: tuple[str, ...] = ()  # what prune() wants said beside the plan (no data: what data would add)

    @property
    def parts(self) -> PartialCapture | None:
        """Set when the model's own forward could not be captured: the parts pruned, the opaque code and its share."""
        return self.graph.parts

    def summary(self) -> str:
        """The plan's summary, then the check's state, bias compensation, the re-fit and the notes, a line each."""
        lines = [self.plan.summary()]
        lines.append("check: " + (self.verified.headline() if self.verified is not None else "skipped (check=False)"))
        if self.compensation is not None:
            lines.append(self.compensation.line())
        if self.refit is not None:
            lines.append(f"re-fit on {self.refit.batches} calibration batch(es): relative output error "
                         f"{self.refit.before:.4g} -> {self.refit.after:.4g} over {len(self.refit.layers)} layer(s)")
        lines += [*self.warnings, *self.notes]
        return "\n".join(lines)


def prune(
    model: nn.Module,
    example_inputs: Sequence[Any] | Mapping[str, Any] | Inputs | torch.Tensor,
    config: PlanConfig | Mapping[str, Any] | None = None,
    *,
    criterion: str = "bn_scale",
    check: bool = True,
    bias_compensation: bool | None = None,
    capture: Capture = "auto",
    deployment: Deployment | None = None,
    latency_cache: str | os.PathLike[str] | None = "default",
    steps: int = 1,
    calibration: Iterable[Any] | None = None,
    refit: bool | None = None,
    sensitivity_cache: str | os.PathLike[str] | None = "default",
    on_cut: Callable[[nn.Module], None] | None = None,
    **score_kwargs: Any,
) -> PruneResult:
    """Prune ``model`` in place to ``config``'s target and (with ``check``) verify it against the masked original.

    ``config`` defaults to ``PlanConfig()``: keep half the FLOPs; a mapping of its fields (``{"flops": 0.5}``) works.
    ``example_inputs``: a tensor, the positional inputs (a list or tuple), keyword inputs (a mapping,
    ``{"input_ids": ids, "pixel_values": px}``) or both (``prunefx.Inputs(x, mask=m)``); keyword inputs are bound by
    ``model.forward``'s signature (:mod:`prunefx.capture.inputs`), so every stage runs the same call.

    ``bias_compensation`` folds the removed channels' mean contribution into their consumers first; the oracle then
    checks against the equally compensated original. Default (None), for a criterion registered to compensate
    (``bn_scale``) and no re-fit: with ``calibration``, kept only if it lowers the output error on held-out
    calibration batches; without, only for the groups the criterion itself scored (BatchNorm gammas, not the ``l2``
    fallback) (:mod:`prunefx.compensation`). ``PruneResult.compensation`` says what was decided and why.
    ``capture`` ("auto", "fx", "export") is how :func:`prunefx.analyze` captures the model.
    A latency target (``PlanConfig(latency=0.5)``) or ``round_to="auto"`` is measured on ``deployment``
    (default: torch on the CPU with torch's threads, the example's batch): the model's layers are timed at
    candidate widths into a latency table cached under ``latency_cache`` (None: not cached; see
    :mod:`prunefx.metrics.latency_table`), the plan is solved against it, and for a latency target the
    pruned model is measured end to end against the original and re-planned while it misses by more than
    5% either way, the prediction calibrated on the measured plans (at most 4 plans;
    ``PruneResult.latency`` says how it went: plans, predicted and measured fractions, the miss and its side).
    ``steps=k`` reaches the target in k cuts, re-analysing and re-scoring between them (:mod:`prunefx.steps`).
    ``score_kwargs`` go to :func:`prunefx.importance.score` (``fallback``, ``loss_fn``, ``seed``).
    ``calibration``: the user's data, passed once (read once into a list): batches of model inputs, or
    ``(inputs, targets)`` pairs (what criterion "taylor" needs); it goes to :func:`prunefx.importance.score` as
    is, and wherever prunefx runs the model on it (``refit``) each batch's model inputs are read by
    :func:`_calibration_inputs`' rule: a 2-tuple is ``(inputs, targets)``; inputs are a tensor, a list of
    positional inputs, or keyword inputs (a dict, e.g. a tokenizer's batch, or ``prunefx.Inputs``).
    ``refit`` re-fits, after the cut, every layer that lost input channels by least squares to reproduce the
    original layer's output on ``calibration`` (:func:`prunefx.transform.refit`; it replaces bias compensation);
    the oracle checks the structure before it, ``PruneResult.refit`` gives each layer's error before and after.
    Default (None): on when ``calibration`` is given (and ``bias_compensation=True`` is not); ``refit=False`` says
    no. Without data ``PruneResult.notes`` (and ``summary()``) say that a few batches of real inputs would re-fit it.
    Costs (layers re-fitted + 2) forward passes over the calibration batches. ``on_cut(model)`` is called with
    the pruned model once the oracle passed and before the re-fit changes it (to measure the cut alone).
    ``PlanConfig(scope="sensitivity")`` measures each group's damage curve on ``calibration`` first
    (:mod:`prunefx.sensitivity`: the relative output error, or with ``loss_fn`` the loss increase; cached under
    ``sensitivity_cache``, None: not cached) and plans the least total damage; ``PruneResult.sensitivity``.
    Raises :class:`VerificationError` (model untouched) when no plan to the target passes the oracle.
    When the cut falls among (near-)tied scores (a fresh or zeroed BatchNorm's gammas), a
    :class:`~prunefx.errors.TiedScoresWarning` says so and ``PruneResult.warnings`` keeps it; so does a
    :class:`~prunefx.errors.ScoreScaleWarning` when a global plan over raw scores (``normalize="none"``) spans
    groups whose score scales differ more than 10x (``PruningPlan.score_scale_note``).

    When the model's own forward cannot be captured (tensor-dependent Python control flow in it), the largest
    submodules that can be are pruned with their boundaries frozen (:mod:`prunefx.analysis.parts`): one joint plan
    over all their groups, a FLOPs or parameter target a fraction of the whole model's (the opaque code counts
    as fixed cost, so a target below it is not reachable), verified end to end on the whole model.
    ``PruneResult.parts`` and the plan's summary say which parts and what stayed opaque.
    """
    if isinstance(calibration, torch.Tensor):  # one batch (list() would split it into samples)
        calibration = [calibration]
    calibration = None if calibration is None else list(calibration)  # read once: scored, then re-fitted on
    if refit is None:  # data means re-fit, unless bias compensation was asked for (the re-fit replaces it)
        refit = calibration is not None and not bias_compensation
    if steps != 1 or not isinstance(steps, int) or isinstance(steps, bool):
        passed = dict(locals())  # every argument, whatever prune() grows, goes to each cut unchanged
        for own in ("model", "example_inputs", "config", "steps", "score_kwargs"):
            del passed[own]
        return prune_in_steps(prune, model, example_inputs, _plan_config(config), steps, **passed, **score_kwargs)
    example_inputs = positional(model, example_inputs)
    config = with_registered_widths(model, _plan_config(config))
    refit_inputs = _refit_inputs(model, calibration, bias_compensation) if refit else None  # before any work
    if config.scope == "sensitivity" and calibration is None:  # refused before any work
        raise PlanError("scope='sensitivity' measures each group's damage on calibration data: pass "
                        "prunefx.prune(..., calibration=[x, ...]) (a few batches of model inputs)")
    compensating = not refit and calibration is not None and (bias_compensation or (
        bias_compensation is None and compensates(criterion)))
    batches = _calibration_inputs(calibration, model) if compensating else None  # its means, and its measurement
    dg = analyze(model, example_inputs, capture=capture)
    _check_capture(dg, config)
    owned = owned_modules(model)
    scores = score(model, dg, criterion, **({"calibration": calibration} if calibration is not None else {}),
                   **score_kwargs)
    chosen = bias.intent(criterion, bias_compensation, refit, scores, batches)
    curves = None
    if config.scope == "sensitivity":  # damage measured as the cut will be made (compensated, re-fitted or neither)
        curves = measure_sensitivity(
            model, dg, scores, calibration, loss_fn=score_kwargs.get("loss_fn"), compensate_bias=chosen is not None,
            config=config, example_inputs=example_inputs, cache=sensitivity_cache, refit=refit_inputs is not None,
        )
    cost = CostModel(model, dg, example_inputs) if check or config.target[0] in ("flops", "params") else None
    latency, outcome = None, None
    if config.needs_latency:
        plan, outcome, latency = plan_for_latency(
            model, dg, scores, config, example_inputs, apply=apply_plan, capture=capture, deployment=deployment,
            cache=latency_cache, cost=cost, owned_constants=owned, sensitivity=curves,
        )
    else:
        plan = make_plan(dg, scores, config, cost=cost, owned_constants=owned, sensitivity=curves)
    extra = _target_extras(dg, latency)
    plan = replace(plan, target={**plan.target, **extra})
    verified = None
    if check:  # checked with compensation on where it is still to be measured: the plan must be final first
        trial = _Trial(model, example_inputs, config, chosen)
        replan = partial(_replan, scores=scores, config=config, cost=cost, latency=latency, owned=owned, extra=extra,
                         sensitivity=curves)
        dg, plan, verified = _checked_plan(trial, dg, plan, replan)
    if chosen is not None and chosen.measure:
        chosen = bias.decide(model, dg, plan, example_inputs, chosen, graph_rewrite=config.graph_rewrite)
        if check and not chosen.on:  # the copy handed back must be the one verified: checked again, uncompensated
            trial.chosen = chosen
            verified = trial(dg, plan)
            if not _ok(verified):
                raise VerificationError(f"{dg.model_name}: the uncompensated cut failed the check ({_why(verified)}) "
                                        "where the compensated one passed; the model was not changed. Report it.")
    said = _warn_ties(scores, plan) + _warn_scales(plan)
    compensation = bias.apply(model, dg, plan, example_inputs, chosen)
    original = copy.deepcopy(model) if refit_inputs is not None else None  # the re-fit's targets
    pruned = apply_plan(model, dg, plan, graph_rewrite=config.graph_rewrite)
    if check:
        trial.assert_same(pruned)  # the structure the oracle proved, before the re-fit changes values
    if on_cut is not None:
        on_cut(pruned)
    refitted = refit_layers(original, pruned, dg, plan, refit_inputs) if refit_inputs is not None else None
    return PruneResult(model=pruned, plan=plan, graph=dg, scores=scores, verified=verified, compensation=compensation,
                       refit=refitted, latency=outcome, frozen_by_check=dg.frozen_by_check, warnings=said,
                       sensitivity=curves, notes=() if calibration is not None else (NO_DATA,))


def _calibration_inputs(calibration: Iterable[Any], model: nn.Module) -> list[tuple]:
    """Each calibration batch's positional model inputs, by the rule of
    :func:`prunefx.sensitivity.calibration_batches` (a 2-tuple is ``(inputs, targets)``)."""
    return [inputs for inputs, _ in calibration_batches(calibration, model=model)]


def _refit_inputs(model: nn.Module, calibration: list | None, bias_compensation: bool | None) -> list[tuple]:
    """The re-fit's calibration batches, refused before any work when missing or not runnable on ``model``."""
    if calibration is None:
        raise PrunefxError("refit=True needs calibration data: pass calibration=[x, ...] (a few batches of model "
                           "inputs, or (inputs, targets) pairs) or leave refit off; the model was not changed")
    if bias_compensation:
        raise PrunefxError("refit=True replaces bias compensation (it re-solves each bias); leave "
                           "bias_compensation unset or False")
    batches = _calibration_inputs(calibration, model)
    check_calibration(model, batches)  # a batch the model cannot take is refused while it is whole
    return batches


def _check_capture(dg: DependencyGraph, config: PlanConfig) -> None:
    """Refuse what this capture cannot do: time the layers of a partial capture, return an exported graph."""
    if config.needs_latency:
        check_inputs(dg.parts, "a latency target or round_to='auto' (layers timed from the graph)")
    if config.graph_rewrite:
        check_inputs(dg.parts, "graph_rewrite (the rewritten graph is returned as the model)")
        if dg.capture == "export":
            raise PlanError("graph_rewrite needs an fx capture: this model was captured with torch.export, whose "
                            "graph cannot be returned as the model; pass capture='fx' (if fx can trace it) or leave "
                            "graph_rewrite off")


def _target_extras(dg: DependencyGraph, latency: LatencyModel | None) -> dict[str, Any]:
    """What a plan's target records besides the config: where latency was measured, which code was not pruned."""
    extra = latency.measured_on() if latency is not None else {}
    if dg.parts is not None:  # saved with the plan and printed by its summary
        extra["partial_capture"] = dg.parts.to_dict()
    return extra


def _replan(
    frozen: DependencyGraph,
    *,
    scores: Scores,
    config: PlanConfig,
    cost: CostModel | None,
    latency: LatencyModel | None,
    owned: frozenset[str],
    extra: Mapping[str, Any],
    sensitivity: SensitivityCurves | None = None,
) -> PruningPlan:
    """The same target on the analysis with the groups that failed the check frozen."""
    again = make_plan(frozen, scores, config, cost=cost, latency=latency, owned_constants=owned,
                      sensitivity=sensitivity)
    return replace(again, target={**again.target, **extra})


def _plan_config(config: Any) -> PlanConfig:
    """``config`` as a PlanConfig: None is the default target, a mapping is checked field by field."""
    if config is None:
        return PlanConfig()  # its default target: plan.config.DEFAULT_TARGET
    if isinstance(config, PlanConfig):
        return config
    if isinstance(config, Mapping):  # unknown keys refused with the closest spelling, values converted and checked
        return from_dict(PlanConfig, config, "config", error=PlanError)
    raise PlanError(f"config must be a prunefx.PlanConfig or a mapping of its fields, got {type(config).__name__} "
                    f"{config!r}; write e.g. PlanConfig(flops=0.5) or {{'flops': 0.5}} (keep half the FLOPs)")


def _warn_ties(scores: Scores, plan: PruningPlan) -> tuple[str, ...]:
    """Warn (TiedScoresWarning) when the plan cuts among tied scores; the warnings, for ``PruneResult``."""
    ties = ties_at_cut(scores, {gp.group: gp.keep for gp in plan.groups})
    if ties is None:
        return ()
    message = ties.message()
    warnings.warn(message, TiedScoresWarning, stacklevel=3)  # at the caller of prune()
    return (message,)


def _warn_scales(plan: PruningPlan) -> tuple[str, ...]:
    """Warn (ScoreScaleWarning) when a global plan ranked raw scores of very differently scaled groups."""
    note = plan.score_scale_note()
    if note is None:
        return ()
    warnings.warn(note, ScoreScaleWarning, stacklevel=3)  # at the caller of prune()
    return (note,)


class _Trial:
    """Applies a plan to a fresh copy of the model and verifies it; the model itself is never touched."""

    def __init__(self, model: nn.Module, inputs: tuple, config: PlanConfig, chosen: bias.Intent | None) -> None:
        self.model, self.inputs, self.config, self.chosen = model, inputs, config, chosen
        self.last_pruned: nn.Module | None = None
        self.runs = 0

    def __call__(self, dg: DependencyGraph, plan: PruningPlan) -> VerifyResult | Exception:
        self.runs += 1
        try:
            work, gm = copy.deepcopy((self.model, dg.gm))  # one memo: the copied graph shares the copied modules
        except Exception as exc:  # not a failed plan: no plan can be checked on a model that cannot be copied
            raise PrunefxError(
                f"{dg.model_name}: the check prunes a copy of the model, and it cannot be copied "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); {_copy_fix(self.model)} "
                "The model was not changed."
            ) from exc
        try:
            work_dg = replace(dg, gm=gm)
            bias.apply(work, work_dg, plan, self.inputs, self.chosen)
            reference, ref_gm = copy.deepcopy((work, gm))  # the compensated original, masked by the oracle
            pruned = apply_plan(work, work_dg, plan, graph_rewrite=self.config.graph_rewrite)
            result = verify(reference, pruned, plan, self.inputs, dg=replace(dg, gm=ref_gm))
        except Exception as exc:  # noqa: BLE001 - a plan whose rewrite or forward breaks is a failed trial
            return exc
        self.last_pruned = pruned
        return result

    def assert_same(self, pruned: nn.Module) -> None:
        """The model handed back is the one that was verified: same tensors, bit for bit."""
        want = self.last_pruned.state_dict() if self.last_pruned is not None else {}
        got = pruned.state_dict()
        if want.keys() != got.keys() or any(not torch.equal(want[k], got[k]) for k in want):
            raise VerificationError("internal error: the pruned model differs from the verified copy")


def _copy_fix(model: nn.Module) -> str:
    """How to make ``model`` copyable, for the error when copy.deepcopy refuses it."""
    from torch.nn.utils.weight_norm import WeightNorm

    old = [n for n, m in model.named_modules() if any(isinstance(h, WeightNorm) for h in m._forward_pre_hooks.values())]
    if old:
        return (f"module {old[0]!r} uses the deprecated torch.nn.utils.weight_norm (a hook deepcopy refuses): "
                "apply torch.nn.utils.parametrizations.weight_norm instead, which prunefx prunes.")
    return "make it copyable (copy.deepcopy(model) must work) or pass check=False to skip the check."


def _ok(result: VerifyResult | Exception) -> bool:
    """The trial passed: proven equal, or inexact by design (its state says which, and the result keeps it)."""
    return isinstance(result, VerifyResult) and result.accepted


def _why(result: VerifyResult | Exception) -> str:
    if isinstance(result, Exception):
        return f"{type(result).__name__}: {str(result).splitlines()[0][:200] if str(result) else ''}"
    return result.message


def _checked_plan(
    trial: _Trial, dg: DependencyGraph, plan: PruningPlan, replan: Any
) -> tuple[DependencyGraph, PruningPlan, VerifyResult]:
    """The plan (and the analysis with failing groups frozen) whose pruned copy passes the oracle."""
    result = trial(dg, plan)
    for _ in range(_MAX_ROUNDS):
        if _ok(result):
            return dg, plan, result
        if not plan.pruned:
            break
        culprits, found = _localise(trial, dg, plan, result)
        if not culprits:
            break
        dg = dg.with_frozen(tuple((g, f"{_reason(dg, g, why)}; {found}") for g, why in culprits))
        plan = replan(dg)
        result = trial(dg, plan)
    if _ok(result):
        return dg, plan, result
    raise VerificationError(
        f"{dg.model_name}: the pruned model differs from its masked original ({_why(result)}); "
        f"{len(dg.frozen_by_check)} group(s) frozen for failing the check, no plan to the target passed. "
        "The model was not changed. Report it with the model; prunefx.prune(..., check=False) skips the check."
    )


def _units(dg: DependencyGraph, plan: PruningPlan) -> list[list[int]]:
    """The plan's pruned groups, joined where equal-count ties bind them (a trial must keep ties whole)."""
    pruned = [gp.group for gp in plan.pruned]
    parent = {g: g for g in pruned}

    def find(g: int) -> int:
        while parent[g] != g:
            g = parent[g]
        return g

    for gids, _ in dg.ties:
        inside = [g for g in gids if g in parent]
        for g in inside[1:]:
            parent[find(g)] = find(inside[0])
    units: dict[int, list[int]] = {}
    for g in pruned:
        units.setdefault(find(g), []).append(g)
    return list(units.values())


def _restrict(plan: PruningPlan, groups: set[int]) -> PruningPlan:
    """``plan`` with only ``groups`` pruned; every other group keeps all its channels."""
    return replace(plan, groups=tuple(
        gp if gp.group in groups else GroupPlan(group=gp.group, before=gp.before, after=gp.before,
                                                keep=tuple(range(gp.before)),
                                                why="kept whole while localising a failure", label=gp.label)
        for gp in plan.groups
    ))


def _localise(
    trial: _Trial, dg: DependencyGraph, plan: PruningPlan, failed: Any
) -> tuple[list[tuple[int, str]], str]:
    """Groups whose pruning makes the check fail (``failed``: the whole plan's trial) and how they were found.

    Binary search over prefixes of the plan's n units (groups joined by equal-count ties): the shortest failing
    prefix ends with a culprit. It is set aside; if the remaining units still fail together, the search goes on
    from where it stopped, since the prefix before the culprit passed. k culprits take at most
    1 + k * (ceil(log2 n) + 1) oracle runs: one with nothing pruned, at most ceil(log2 n) per search, one per culprit
    to see whether the rest still fails. Returns (group id, what the failing trial said) for each group of each
    culprit unit, and "found in r of at most b oracle runs (...)".
    """
    runs = trial.runs
    nothing = trial(dg, _restrict(plan, set()))
    if not _ok(nothing):  # the oracle cannot judge this model at all: freezing groups would not help
        raise VerificationError(
            f"{dg.model_name}: the check fails even with nothing pruned ({_why(nothing)}); "
            + ("" if getattr(nothing, "problems", ()) else  # the oracle named what it could not compare
               "the model is not deterministic or does not run on these inputs in eval mode; ")
            + "the model was not changed."
        )

    def fails(units: list[list[int]]) -> Any:
        r = trial(dg, _restrict(plan, {g for u in units for g in u}))
        return None if _ok(r) else r

    pool: list[list[int]] = _units(dg, plan)
    n, found, why_all = len(pool), [], failed
    passed = 0  # pool[:passed] is known to pass (nothing pruned, at first)
    while why_all is not None and len(found) < _MAX_CULPRITS:
        lo, hi, why = passed + 1, len(pool), why_all  # the shortest failing prefix has length in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            r = fails(pool[:mid])
            if r is None:
                lo = mid + 1
            else:
                hi, why = mid, r
        found.append((pool[lo - 1], why))
        pool, passed = pool[: lo - 1] + pool[lo:], lo - 1
        why_all = fails(pool) if len(pool) > passed else None  # a pool that is the passing prefix passes
    k, bound = len(found), 1 + len(found) * (_ceil_log2(n) + 1)
    culprits = [(g, _why(why)) for unit, why in found for g in unit]
    return culprits, (f"found in {trial.runs - runs} of at most {bound} oracle runs "
                      f"(1 + k*(ceil(log2 n)+1), k={k} failing of n={n} pruned units)")


def _ceil_log2(n: int) -> int:
    return max(n - 1, 0).bit_length()


def _reason(dg: DependencyGraph, gid: int, why: str) -> str:
    """'failed the exactness check' with what the trial said and the ops and source lines the group runs through."""
    path = dg.path(gid)
    shown = ", ".join(path[:4]) + (f" (+{len(path) - 4} more)" if len(path) > 4 else "")
    return f"failed the exactness check when pruned ({why[:200]}); path: {shown or 'no traced op'}"



__all__ = ["PruneResult", "VerificationError", "prune"]
