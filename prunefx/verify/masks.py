"""The masked run: the original's graph with every pruned channel zeroed, compared with the pruned graph."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_map

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.labels import Lab
from prunefx.analysis.outputs import default_free_outputs
from prunefx.capture.semantics import DISCRETE, EvalInterpreter
from prunefx.capture.trace import training_mode
from prunefx.plan import PruningPlan, validate_plan
from prunefx.verify.compare import (
    Comparison,
    compare_outputs,
    output_tensors,
    raised,
    rel_error,
    same_structure,
    same_values,
)


class EvalGraph(EvalInterpreter):
    """Runs a training-mode graph with eval semantics, optionally zeroing pruned channels after each node.

    ``record``: outputs of discontinuous ops are appended as (node name, input, output). ``replay``: such a
    reference list; at each discontinuous op whose input agrees with the reference's within ``tol``, the
    reference's output is used, so index choices that round-off could flip are taken from the reference.
    """

    def __init__(self, gm: fx.GraphModule, masks: dict[str, Any] | None = None, *,
                 record: list | None = None, replay: list | None = None, tol: float = 0.0) -> None:
        super().__init__(gm)
        self.masks = masks or {}
        self.record, self.replay, self.tol = record, replay, tol
        self.replayed: list[str] = []
        self.diverged: list[tuple[str, float]] = []
        self._k = 0

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if _is_discrete(n):
            out = self._discrete(n, out)
        spec = self.masks.get(n.name)
        return _apply(out, spec) if spec is not None else out

    def _discrete(self, n: fx.Node, out: Any) -> Any:
        x = _first_tensor(self.env, n)
        if self.record is not None:
            self.record.append((n.name, x, out))
            return out
        if self.replay is None or self._k >= len(self.replay):
            return out
        name, ref_x, ref_out = self.replay[self._k]
        self._k += 1
        if x is None or ref_x is None or x.shape != ref_x.shape or not same_structure(out, ref_out):
            return out
        err = rel_error(ref_x, x)
        if err > self.tol:
            self.diverged.append((n.name, err))
            return out
        if same_values(out, ref_out):
            return out
        self.replayed.append(f"{n.name} ({_describe(n)}; inputs agree to {err:.1g})")
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, ref_out)


def _is_discrete(n: fx.Node) -> bool:
    if n.op == "call_method":
        return n.target in DISCRETE and not _is_binary_minmax(n)
    if n.op == "call_function":
        try:
            return n.target in DISCRETE and not _is_binary_minmax(n)
        except TypeError:
            return False
    return False


def _is_binary_minmax(n: fx.Node) -> bool:
    """max(a, b) / min(a, b) between two tensors is element-wise, not a selection."""
    name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
    return name in ("max", "min") and len(n.args) > 1 and isinstance(n.args[1], fx.Node)


def _describe(n: fx.Node) -> str:
    return n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))


def _first_tensor(env: dict, n: fx.Node) -> torch.Tensor | None:
    for a in n.args:
        if isinstance(a, fx.Node) and isinstance(env.get(a), torch.Tensor):
            return env[a]
    return None


def _apply(out: Any, spec: Any) -> Any:
    if isinstance(out, torch.Tensor):
        for dim, mask in spec:
            shape = [1] * out.dim()
            shape[dim] = -1
            # zeroed, not multiplied by 0: a removed channel of a divisor (x / scale) is inf or nan before it is
            # masked, and nan * 0 would carry into every kept channel the next layer mixes it with
            keep = mask.to(device=out.device, dtype=torch.bool).view(shape)
            out = torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device))
        return out
    if isinstance(out, (tuple, list)):
        return type(out)(_apply(o, s) if s is not None else o for o, s in zip(out, spec, strict=True))
    return out


def _removed_classes(dg: DependencyGraph, plan: PruningPlan) -> np.ndarray:
    """Class ids (atom roots) of every channel the plan removes."""
    removed = []
    for gp in plan.groups:
        roots = dg.groups[gp.group].roots
        gone = np.ones(len(roots), dtype=bool)
        gone[list(gp.keep)] = False
        removed.append(roots[gone])
    return np.unique(np.concatenate(removed)) if removed else np.empty(0, np.int64)


def mask_specs(dg: DependencyGraph, plan: PruningPlan) -> dict[str, Any]:
    """Per node: (dim, 0/1 mask) for every labelled dim that holds a removed channel."""
    removed = _removed_classes(dg, plan)
    cache: dict[int, torch.Tensor | None] = {}

    def spec_of(v: Any) -> Any:
        if isinstance(v, Lab):
            out = []
            for d, arr in enumerate(v.dims):
                if arr is None:
                    continue
                key = id(arr)
                if key not in cache:
                    roots = dg.atoms.find(arr)
                    keep = ~((roots >= 0) & np.isin(roots, removed))
                    cache[key] = None if keep.all() else torch.from_numpy(keep.astype(np.float32))
                if cache[key] is not None:
                    out.append((d, cache[key]))
            return out or None
        if isinstance(v, (tuple, list)):
            inner = [spec_of(x) for x in v]
            return inner if any(x is not None for x in inner) else None
        return None

    specs = {}
    for name, v in dg.node_labels.items():
        s = spec_of(v)
        if s is not None:
            specs[name] = s
    return specs


def inside_specs(dg: DependencyGraph, plan: PruningPlan) -> list[tuple[str, int, torch.Tensor]]:
    """(parameter, dim, 0/1 mask) for every removed channel that lives only inside a leaf module (attention heads):
    no graph edge carries those channels, so they are masked in the original's weights instead."""
    removed = _removed_classes(dg, plan)
    out = []
    for key in sorted(dg.inside, key=str):
        roots = dg.atoms.find(dg.record_roots[key])
        keep = ~((roots >= 0) & np.isin(roots, removed))
        if not keep.all():
            out.append((key.name, key.role.dim, torch.from_numpy(keep.astype(np.float32))))
    return out


@contextlib.contextmanager
def weights_masked(gm: nn.Module, specs: list[tuple[str, int, torch.Tensor]]) -> Iterator[None]:
    """``gm``'s parameters with the removed inside positions zeroed for the block, then put back as they were."""
    saved = []
    try:
        with torch.no_grad():
            for name, dim, keep in specs:
                owner, _, attr = name.rpartition(".")
                t = getattr(gm.get_submodule(owner), attr)
                saved.append((t, t.detach().clone()))
                shape = [1] * t.dim()
                shape[dim] = -1
                t.mul_(keep.to(t.dtype).view(shape))
        yield
    finally:
        with torch.no_grad():
            for t, value in saved:
                t.copy_(value)


def masked_outputs(
    original: nn.Module, dg: DependencyGraph, plan: PruningPlan, example_inputs: Sequence[Any]
) -> list[torch.Tensor]:
    """Outputs of the original model's graph with every pruned channel zeroed wherever it appears."""
    validate_plan(dg, plan, graph_rewrite=True)
    with training_mode(dg.gm, False), torch.no_grad(), weights_masked(dg.gm, inside_specs(dg, plan)):
        out = EvalGraph(dg.gm, mask_specs(dg, plan)).run(*example_inputs)
        return output_tensors(out, default_free_outputs(original))


def compare_masked(ref_gm: fx.GraphModule, masks: tuple[dict, list], gm: fx.GraphModule, inputs: tuple, free: tuple,
             tol: float, dtype: torch.dtype | None = None) -> tuple[Comparison, list[str]]:
    """Per-output relative errors of ``gm`` against the masked ``ref_gm``, and notes on replayed discrete ops.

    ``masks``: per node the (dim, mask) of removed channels, and the inside weights to zero (``inside_specs``)."""
    record: list = []
    nodes, weights = masks
    with training_mode(ref_gm, False), torch.no_grad(), weights_masked(ref_gm, weights):
        reference = EvalGraph(ref_gm, nodes, record=record).run(*inputs)
    run = EvalGraph(gm, replay=record, tol=tol)
    try:
        with training_mode(gm, False), torch.no_grad():
            got = run.run(*inputs)
    except Exception as exc:  # noqa: BLE001 - a pruned model that breaks is the finding, not an error of verify
        return raised(exc), []
    notes = []
    if run.replayed:
        notes.append(f"discontinuous ops compared at their inputs and replayed: {', '.join(run.replayed[:4])}"
                     + (f" (+{len(run.replayed) - 4})" if len(run.replayed) > 4 else ""))
    if run.diverged:
        name, err = run.diverged[0]
        notes.append(f"the input of discontinuous op {name} differs by {err:.3g}")
    return compare_outputs(reference, got, free, dtype), notes


__all__ = ["compare_masked", "EvalGraph", "inside_specs", "mask_specs", "masked_outputs", "weights_masked"]
