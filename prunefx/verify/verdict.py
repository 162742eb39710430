"""The verdict on compared outputs: proven, inexact by design or failed, once the pruned model runs in both modes."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn

from prunefx.analysis.finite import first_non_finite
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.outputs import default_free_outputs
from prunefx.capture.trace import training_mode
from prunefx.plan import PruningPlan
from prunefx.verify.compare import Comparison, max_error, output_shapes
from prunefx.verify.result import VerifyResult


def non_finite_state(model: nn.Module, whose: str) -> str | None:
    """A line naming the first tensor of ``model`` whose NaN/inf makes its outputs compare to nothing; None if none."""
    bad = first_non_finite(model)
    return None if bad is None else (
        f"{bad.replace(' holds', f' of {whose} holds', 1)}, so its outputs compare to nothing; load finite weights "
        "(a checkpoint from before training diverged) and prune again")


def verdict(original: nn.Module, pruned: nn.Module, plan: PruningPlan, example_inputs: tuple, dg: DependencyGraph,
            scores: Comparison, notes: list[str], rtol: float, problems: list[str]) -> VerifyResult:
    """The verdict on the compared outputs, once the pruned model's own forward has run in both modes."""
    largest = max_error(scores.errors)
    problems = [*problems, *scores.problems]
    inexact = inexact_groups(dg, plan)
    runs_eval, runs_train, run_notes = runs_in_both_modes(original, pruned, example_inputs)
    notes.extend(run_notes)
    exact = not inexact
    passed = runs_eval and runs_train and not problems and (largest <= rtol if exact else math.isfinite(largest))
    state = "failed" if not passed else "proven" if exact else "inexact"
    if not (runs_eval and runs_train):
        msg = "the pruned model does not run (or changes output shapes) in " + (
            "eval and train mode" if not (runs_eval or runs_train) else "eval mode" if not runs_eval else "train mode")
    elif not exact:
        msg = (f"not exactly verifiable: groups {list(inexact)} pass through cross-channel ops (LayerNorm, "
               f"GroupNorm...); max rel. diff {largest:.3g} from the masked original")
    else:
        at = f" at {scores.names[scores.errors.index(largest)]}" if largest > rtol and largest in scores.errors else ""
        msg = f"max relative error {largest:.3g}{at} over {len(scores.errors)} output(s) (rtol {rtol})"
    if problems:  # first: they say why the numbers after them prove nothing
        msg = "not verified: " + "; ".join(problems) + "; " + msg
    if notes:
        msg += "; " + "; ".join(notes)
    return VerifyResult(state == "proven", exact, float(largest), tuple(scores.errors), inexact, runs_eval, runs_train,
                        msg, tuple(notes), tuple(scores.names), tuple(problems), state)


def inexact_groups(dg: DependencyGraph, plan: PruningPlan) -> tuple[int, ...]:
    """The pruned groups that pass through cross-channel statistics (LayerNorm...): no exact equality to check."""
    return tuple(gp.group for gp in plan.pruned if not dg.groups[gp.group].exact)


def shares_weights(gm: nn.Module, model: nn.Module) -> bool:
    mine = {id(t) for t in model.parameters()}
    return all(id(t) in mine for t in gm.parameters())


def runs_in_both_modes(original: nn.Module, pruned: nn.Module, example_inputs: tuple) -> tuple[bool, bool, list[str]]:
    """The pruned model's own forward works in eval and train mode with the original's output shapes.

    A mode the original itself cannot run in on these inputs (BatchNorm in train mode on one value per channel)
    is not checked, and the returned notes say so.
    """
    results, notes = [], []
    free = default_free_outputs(original)
    for train in (False, True):
        mode = "train" if train else "eval"
        # Train-mode forwards update BatchNorm statistics: buffers are restored afterwards instead of running
        # deep copies (a copy of each model per mode held a 600M-parameter ViT in memory four times).
        with _buffers_restored(original), _buffers_restored(pruned), training_mode(original, train), \
                training_mode(pruned, train), torch.no_grad():
            try:
                oa = output_shapes(original(*example_inputs), free)
            except Exception as exc:  # noqa: BLE001 - the original's own failure: nothing to compare with
                notes.append(f"{mode} mode not checked: the original does not run in it on these inputs "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
                results.append(True)
                continue
            try:
                results.append(oa == output_shapes(pruned(*example_inputs), free))
            except Exception:  # noqa: BLE001 - any failure of the pruned forward is the finding
                results.append(False)
    return results[0], results[1], notes


@contextlib.contextmanager
def _buffers_restored(model: nn.Module) -> Iterator[None]:
    """Every buffer's values (running stats, step counters) put back as they were when the block ends."""
    saved = []
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                saved.append((module, name, buf, buf.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, buf, value in saved:
                if module._buffers.get(name) is buf and buf.shape == value.shape:
                    buf.copy_(value)  # in place: whatever else holds this tensor sees the old values too
                else:  # the forward replaced the buffer: put the saved values back under its name
                    module._buffers[name] = value


__all__ = ["inexact_groups", "non_finite_state", "runs_in_both_modes", "shares_weights", "verdict"]
