"""The whole-model oracle of partial capture: the captured parts masked inside the original's own forward."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx.immutable_collections import immutable_dict
from torch.utils._pytree import tree_map

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.outputs import default_free_outputs
from prunefx.capture.trace import module_state_kept, training_mode
from prunefx.plan import PruningPlan
from prunefx.verify.compare import Comparison, compare_outputs, raised
from prunefx.verify.masks import EvalGraph, weights_masked
from prunefx.verify.recheck import default_dtype, recheck, to_double, to_float64
from prunefx.verify.result import VerifyResult
from prunefx.verify.verdict import inexact_groups, verdict


class _PartRun(EvalGraph):
    """The masked graph of the parts, running only the nodes one part's outputs need (``needed``; None: all)."""

    def __init__(self, gm: fx.GraphModule, masks: dict[str, Any], needed: set[str] | None) -> None:
        super().__init__(gm, masks)
        self.needed = needed

    def run_node(self, n: fx.Node) -> Any:
        if self.needed is None or n.op in ("placeholder", "get_attr", "output") or n.name in self.needed:
            return super().run_node(n)
        return None


def _part_nodes(gm: fx.GraphModule, paths: Sequence[str]) -> list[set[str] | None]:
    """Per part: the names of the nodes its call made (by the outermost module of each node's ``nn_module_stack``),
    plus those outside every part. All of them, not only the ancestors of its outputs: an in-place write into a
    buffer (``out[:, :4].copy_(y)``) is no ancestor of the output that returns the buffer. None: run every node."""
    index = {p: i for i, p in enumerate(paths)}
    needed: list[set[str]] = [set() for _ in paths]
    shared: set[str] = set()
    for n in gm.graph.nodes:
        stack = n.meta.get("nn_module_stack") or {}
        first = next(iter(stack.values()), None)
        owner = index.get(first[0]) if isinstance(first, tuple) and first else None
        (shared if owner is None else needed[owner]).add(n.name)
    if not all(needed):  # a graph without module stacks (or a part without nodes): run everything, to be safe
        return [None] * len(paths)
    return [s | shared for s in needed]


def _masked_whole(original: nn.Module, dg: DependencyGraph, nodes: dict[str, Any], inputs: tuple, calls: tuple) -> Any:
    """The original model's own forward, each call of a part answered by the part's masked graph on that call's
    inputs (so what the opaque code reads is what it reads from the masked original)."""
    paths = [p.path for p in dg.parts.parts]
    needed = _part_nodes(dg.gm, paths)
    busy = []  # a part that is a leaf of its own graph calls its module again: answer that call normally
    taken: list[list[Any]] = [[] for _ in paths]  # per part: its current call's inputs, as they were on entry

    def before(i: int):
        def fn(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not busy:  # cloned: the part's own forward (which runs first) may change its inputs in place
                taken[i].append(tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t,
                                         (tuple(args), dict(kwargs))))

        return fn

    def after(i: int):
        def fn(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if busy:
                return None
            busy.append(i)
            try:
                feed = [*calls[:i], taken[i].pop(), *calls[i + 1:]]
                out = _PartRun(dg.gm, nodes, needed[i]).run(*dg.parts.graph_inputs(feed, dg.capture == "export"))
                return _mutable(dg.parts.per_part(out)[i])
            finally:
                busy.pop()

        return fn

    handles = []
    for i, p in enumerate(paths):
        part = original.get_submodule(p)
        handles.append(part.register_forward_pre_hook(before(i), with_kwargs=True))
        handles.append(part.register_forward_hook(after(i), with_kwargs=True))
    try:
        return original(*inputs)
    finally:
        for h in handles:
            h.remove()


def _mutable(x: Any) -> Any:
    """A graph's output with fx's immutable lists and dicts made plain: the code after a part may edit them."""
    if isinstance(x, dict):
        return type(x)((k, _mutable(v)) for k, v in x.items()) if type(x) is not immutable_dict else \
            {k: _mutable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_mutable(v) for v in x]
    if type(x) is tuple:
        return tuple(_mutable(v) for v in x)
    return x


def _compare_whole(original: nn.Module, dg: DependencyGraph, masks: tuple[dict, list], pruned: nn.Module,
                   inputs: tuple, calls: tuple, free: tuple, dtype: torch.dtype | None = None
                   ) -> tuple[Comparison, list[str]]:
    """Per-output relative errors of the pruned model's own forward against the masked original, end to end."""
    nodes, weights = masks
    with training_mode(original, False), training_mode(dg.gm, False), torch.no_grad(), \
            module_state_kept(original), weights_masked(dg.gm, weights):
        reference = _masked_whole(original, dg, nodes, inputs, calls)
    try:
        with training_mode(pruned, False), torch.no_grad(), module_state_kept(pruned):
            got = pruned(*inputs)
    except Exception as exc:  # noqa: BLE001 - a pruned model that breaks is the finding, not an error of verify
        return raised(exc), []
    return compare_outputs(reference, got, free, dtype), []


def verify_whole(original: nn.Module, pruned: nn.Module, plan: PruningPlan, inputs: tuple, dg: DependencyGraph,
                  masks: tuple[dict, list], rtol: float, problems: list[str]) -> VerifyResult:
    """The oracle for a partial capture: the whole models' own forwards (eval mode) on the example inputs, the
    original with every part answered by its masked graph; the code between the parts runs as it is."""
    free = default_free_outputs(original)
    scores, notes = _compare_whole(original, dg, masks, pruned, inputs, dg.parts.calls, free)

    def in_float64() -> tuple[Comparison, list[str]]:
        orig64, gm64 = copy.deepcopy((original, dg.gm))  # one memo: the copied graph holds the copied parts
        with default_dtype(torch.float64):  # tensors the uncaptured code makes without a dtype
            return _compare_whole(orig64.double(), replace(dg, gm=to_float64(gm64)), masks,
                                  copy.deepcopy(pruned).double(), to_double(inputs), to_double(dg.parts.calls), free,
                                  torch.float64)

    scores, notes = recheck(scores, notes, rtol, in_float64, not inexact_groups(dg, plan))
    notes.append(f"partial capture: checked end to end through the forwards that were not captured; parts "
                 f"{', '.join(p.path for p in dg.parts.parts)}")
    return verdict(original, pruned, plan, inputs, dg, scores, notes, rtol, problems)


__all__ = ["verify_whole"]
