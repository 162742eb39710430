"""The oracle of depth pruning: the pruned model equals the original with the removed blocks' branches zeroed.

The reference is the original's captured graph run with every value a removed block adds onto its stream replaced
by zeros (so each removed block computes only its tail on its input); the pruned model runs its own forward. Nothing
here is shared with the rewrite (:mod:`prunefx.transform.depth`): the graph decides what "removed" means, the
rewrite only swaps modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from prunefx.analysis.blocks import ResidualBlock
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.outputs import default_free_outputs
from prunefx.capture.inputs import positional
from prunefx.capture.semantics import EvalInterpreter
from prunefx.capture.torch_export import export_graph
from prunefx.capture.trace import module_state_kept, trace, training_mode
from prunefx.verify.compare import compare_outputs, max_error
from prunefx.verify.result import VerifyResult


class _Zeroed(EvalInterpreter):
    def __init__(self, gm: fx.GraphModule, zeroed: set[str]) -> None:
        super().__init__(gm)
        self.zeroed = zeroed
        self.hit: set[str] = set()

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.zeroed and isinstance(out, torch.Tensor):
            self.hit.add(n.name)
            return torch.zeros_like(out)
        return out


def zeroed_outputs(gm: fx.GraphModule, blocks: Sequence[ResidualBlock], inputs: tuple) -> tuple[Any, set[str]]:
    """The original's graph output with ``blocks``' branches zeroed, and the branch nodes that were reached."""
    zeroed = {n for b in blocks for n in b.branches}
    run = _Zeroed(gm, zeroed)
    with torch.no_grad(), module_state_kept(gm), training_mode(gm, False):
        out = run.run(*inputs)
    return out, run.hit


def _pruned_outputs(dg: DependencyGraph, pruned: nn.Module, inputs: tuple) -> Any:
    """The pruned model captured as the analysis captured the original, run in evaluation mode."""
    gm = export_graph(pruned, inputs) if dg.capture == "export" else trace(pruned, inputs, training=dg.training)
    with torch.no_grad(), module_state_kept(gm), training_mode(gm, False):
        return EvalInterpreter(gm).run(*inputs)


def verify_depth(original: nn.Module, dg: DependencyGraph, pruned: nn.Module, blocks: Sequence[ResidualBlock],
                 example_inputs: Any, *, rtol: float = 1e-4) -> VerifyResult:
    """Check ``pruned`` against ``dg``'s graph (the capture of ``original``, unpruned) with ``blocks``' branches
    zeroed. Both run in evaluation mode, the pruned model captured the same way (an fx trace, or torch.export).
    A removed block whose branches the graph never reached, or an output with nothing to compare, fails it."""
    inputs = positional(original, example_inputs)
    reference, hit = zeroed_outputs(dg.gm, blocks, inputs)
    problems = [f"{b.path}'s branches were not reached in the captured graph" for b in blocks
                if not set(b.branches) <= hit]
    try:
        got = _pruned_outputs(dg, pruned, inputs)
    except Exception as exc:  # noqa: BLE001 - a pruned model that breaks is the finding, not an error of the check
        got, problems = None, [*problems, f"the pruned model raises {type(exc).__name__}: {str(exc)[:200]}"]
    scores = compare_outputs(reference, got, default_free_outputs(original)) if got is not None else None
    errors = tuple(scores.errors) if scores else ()
    problems += scores.problems if scores else []
    worst = max_error(list(errors))
    ok = not problems and bool(errors) and worst <= rtol
    names = ", ".join(b.path for b in blocks)
    if ok:
        message = f"pruned model == original with the branches of {names} zeroed: max rel error {worst:.2e}"
    else:
        why = problems[0] if problems else f"max rel error {worst:.2e} > {rtol:g}"
        message = f"pruned model != original with the branches of {names} zeroed: {why}"
    return VerifyResult(ok=ok, exact=True, max_rel_error=worst, errors=errors, inexact_groups=(),
                        runs_eval=got is not None, runs_train=False, message=message,
                        notes=("checked in evaluation mode",), outputs=tuple(scores.names) if scores else (),
                        problems=tuple(problems))
