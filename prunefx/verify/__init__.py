"""The oracle: a pruned model must equal the original with the pruned channels masked to zero.

The masked run interprets the ORIGINAL model's fx graph and zeroes every pruned channel at every
tensor it appears in (labels from the analysis), and channels that live only inside a leaf module (the heads of
nn.MultiheadAttention) in that module's weights; it shares no code with the rewrite, which slices weights: the
masks are derived here from the plan and the channel classes, independently. Both runs use
the training-mode graph (every layer that learns, e.g. YOLO's raw head outputs) with evaluation semantics
(:class:`prunefx.capture.semantics.EvalInterpreter`: modules in eval mode, BatchNorm on running stats, dropout
and drop-path the identity, random draws replaced by their expectation), under no_grad, so both runs are
deterministic and nothing updates.

Every output is compared, by its path in the output structure (``out['logits'].feats``: tensors, tuples, lists,
dicts, namedtuples, dataclasses, Hugging Face ModelOutputs, nested; :func:`prunefx.analysis.outputs.output_leaves`),
and a comparison that cannot be made is a failure with its reason, never a pass: no tensor to compare, an output
missing on one side, a non-tensor value that differs, NaN/inf weights or outputs (named).

Robust, not just exact: float32 round-off grows with depth (a 200-layer random net drifts ~1e-3 relative), so
outputs beyond ``rtol`` are recomputed in float64 on copies (the float32 a graph names made float64 too) before
anything is called a mismatch, and a recheck that cannot run fails the check, saying so; and outputs downstream of
a discontinuous op (top-k, sort, argmax: a 1e-7 change of its input can swap two indices) are compared at that op:
the pruned run checks its input against the reference's and, when they agree, continues with the reference's
result.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from prunefx import _plugins
from prunefx.analysis import analyze
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.outputs import default_free_outputs
from prunefx.capture.inputs import positional
from prunefx.capture.record import Capture
from prunefx.capture.torch_export import export_graph
from prunefx.capture.trace import trace
from prunefx.plan import PlanError, PruningPlan, validate_plan
from prunefx.verify.compare import Comparison, compare_outputs, max_error
from prunefx.verify.masks import compare_masked, inside_specs, mask_specs, masked_outputs
from prunefx.verify.recheck import default_dtype, recheck, to_double, to_float64
from prunefx.verify.result import STATES, VerifyResult
from prunefx.verify.verdict import inexact_groups, non_finite_state, shares_weights, verdict
from prunefx.verify.whole import verify_whole


def verify(
    original: nn.Module,
    pruned: nn.Module,
    plan: PruningPlan,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    rtol: float = 1e-4,
    dg: DependencyGraph | None = None,
    capture: Capture = "auto",
) -> VerifyResult:
    """Check ``pruned`` against ``original`` (an unpruned copy) masked by ``plan``.

    Both are captured the same way (``capture``, or ``dg``'s): an fx graph, or for a torch.export analysis the ATen
    graph of the pruned model's own forward (so its rewritten attributes are what runs).

    >>> original = copy.deepcopy(model); result = prunefx.prune(model, x, cfg)
    >>> prunefx.verify(original, model, result.plan, x).ok
    """
    example_inputs = positional(original, example_inputs)
    _plugins.activate()
    if dg is not None and not shares_weights(dg.gm, original):
        raise PlanError("dg must be the analysis of `original` (the unpruned copy), not of the pruned model")
    dg = dg or analyze(original, example_inputs, capture=capture)
    validate_plan(dg, plan, graph_rewrite=True)
    # NaN/inf weights make every comparison NaN (which reads as "not deterministic"): name the tensor instead
    problems = [p for p in (non_finite_state(original, "the original"), non_finite_state(pruned, "the pruned model"))
                if p]
    masks = mask_specs(dg, plan), inside_specs(dg, plan)
    free = default_free_outputs(original)
    if dg.parts is not None:  # only parts were captured: the whole model is compared end to end
        return verify_whole(original, pruned, plan, example_inputs, dg, masks, rtol, problems)
    # captured as the analysis was: an export graph runs the pruned model's own forward (rewritten literals)
    if dg.capture == "export":
        gm = export_graph(pruned, example_inputs)
    else:
        gm = trace(pruned, example_inputs, training=dg.training)  # the mode the analysis traced in
    scores, notes = compare_masked(dg.gm, masks, gm, example_inputs, free, rtol)

    def in_float64() -> tuple[Comparison, list[str]]:
        with default_dtype(torch.float64):  # tensors the forward makes without a dtype (torch.ones(n))
            return compare_masked(to_float64(copy.deepcopy(dg.gm)), masks, to_float64(copy.deepcopy(gm)),
                            to_double(example_inputs), free, rtol, torch.float64)

    scores, notes = recheck(scores, notes, rtol, in_float64, not inexact_groups(dg, plan))
    return verdict(original, pruned, plan, example_inputs, dg, scores, notes, rtol, problems)

__all__ = ["STATES", "compare_outputs", "Comparison", "masked_outputs", "max_error", "verify", "VerifyResult"]
