"""Bias compensation: fold what the removed channels still contributed into the layers that read them.

A channel pruned because its BatchNorm gamma is ~0 still outputs a near-constant ``act(beta)``; removing
it shifts every consumer's output by ``W[:, c] * value``. Measuring each removed channel's mean at each
consumer's input and adding ``sum_c W[:, c] * mean_c`` to the consumer's bias (or subtracting it from the
running mean of the BatchNorm right after it) keeps the model close to the unpruned one right after
pruning. Exact for a channel that is constant at a 1x1 conv or Linear; for a k x k conv with padding it is
exact away from the borders (the padded positions never saw the constant).

Call it before ``apply_plan`` (it needs the original widths); it changes values, never shapes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn

from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.roles import IN, Kind, ParamDim, RecordKey
from prunefx.capture.trace import training_mode
from prunefx.plan import PruningPlan
from prunefx.transform.keep import keep_by_root, kept_positions


@dataclass(frozen=True)
class Compensation:
    """Which consumers absorbed the removed channels' contribution, and which could not, and why; with
    ``prunefx.prune``'s choice: whether it was applied at all, to which groups, why, and the errors it measured."""

    folded: tuple[tuple[str, str], ...]  # (consumer, where: "bias" | "<bn name>.running_mean")
    skipped: tuple[tuple[str, str], ...]  # (consumer, reason)
    applied: bool = True  # False: prune() decided against it (``why``); nothing was folded
    why: str = ""  # how prune() decided
    groups: tuple[int, ...] | None = None  # the groups whose removed channels were compensated; None: every group
    error_with: float | None = None  # held-out relative output error vs the unpruned model, compensated
    error_without: float | None = None  # the same cut uncompensated
    held_out: int = 0  # calibration batches those errors were measured on (0: not measured)

    def line(self) -> str:
        """One sentence for a summary: applied or not, and why."""
        return f"bias compensation {'applied' if self.applied else 'not applied'}: {self.why}" if self.why else (
            f"bias compensation folded into {len(self.folded)} layer(s), {len(self.skipped)} skipped")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a report."""
        return {"applied": self.applied, "why": self.why, "groups": None if self.groups is None else list(self.groups),
                "error_with": self.error_with, "error_without": self.error_without, "held_out": self.held_out,
                "folded": [list(x) for x in self.folded], "skipped": [list(x) for x in self.skipped]}


def _pruned_inputs(dg: DependencyGraph, plan: PruningPlan) -> dict[str, torch.Tensor]:
    sorted_roots, keep = keep_by_root(dg, plan)
    out = {}
    for (kind, name, role), roots in dg.record_roots.items():
        if kind is Kind.MODULE and role == IN:
            kept = set(kept_positions(roots, sorted_roots, keep).tolist())
            gone = [p for p in range(len(roots)) if p not in kept]
            if gone:
                out[name] = torch.tensor(gone)
    return out


def compensate(
    model: nn.Module,
    dg: DependencyGraph,
    plan: PruningPlan,
    example_inputs: Sequence[Any],
    *,
    calibration: Iterable[Sequence[Any]] = (),
    groups: Collection[int] | None = None,
) -> Compensation:
    """Shift consumers' biases by the mean contribution of their soon-removed input channels.

    The means are taken over ``example_inputs`` and every ``calibration`` batch (each a tuple of positional inputs).
    ``groups``: compensate only these groups' removed channels (None: every pruned group's)."""
    if groups is not None:  # a group left out of the plan keeps its channels, as far as the consumers know
        plan = replace(plan, groups=tuple(gp for gp in plan.groups if gp.group in set(groups)))
    targets = _pruned_inputs(dg, plan)
    folded, skipped, means, counts, hooks = [], [], {}, {}, []
    layers, in_dims = {}, {}
    for name in targets:
        m = model.get_submodule(name)
        in_dim = _weight_in_dim(dg, name)
        conv = isinstance(m, nn.modules.conv._ConvNd)
        if in_dim is not None and (not conv or (m.groups == 1 and not m.transposed)):
            layers[name], in_dims[name] = m, in_dim
        else:
            skipped.append((name, f"{type(m).__name__} (grouped/transposed/other layers are not compensated)"))

    def hook(name: str):
        def fn(module: nn.Module, args: tuple) -> None:
            x = args[0].detach()
            dim = x.dim() - 1 if module.weight.dim() == 2 else 1  # a matrix reads the last dim, a conv dim 1
            reduce = [d for d in range(x.dim()) if d != dim]
            means[name] = means.get(name, 0) + x.mean(reduce)
            counts[name] = counts.get(name, 0) + 1

        return fn

    for name, m in layers.items():
        hooks.append(m.register_forward_pre_hook(hook(name)))
    try:
        with training_mode(model, False), torch.no_grad():
            for batch in (tuple(example_inputs), *calibration):
                model(*batch)
    finally:
        for h in hooks:
            h.remove()

    followers = _single_bn_follower(dg.gm)
    with torch.no_grad():
        for name, m in layers.items():
            if name not in means:
                skipped.append((name, "not called on the example inputs"))
                continue
            gone = targets[name]
            mean = means[name] / counts[name]
            w = m.weight.movedim(in_dims[name], 1)[:, gone]  # (out, in, *kernel) whatever the stored layout
            w = w.sum(dim=tuple(range(2, w.dim()))) if w.dim() > 2 else w
            delta = w @ mean[gone].to(w.dtype)
            bn_name = followers.get(name)
            if bn_name is not None:
                model.get_submodule(bn_name).running_mean.sub_(delta)  # BN(z + d) with mean mu - d == BN(z) shifted
                folded.append((name, f"{bn_name}.running_mean"))
            elif m.bias is not None:
                m.bias.add_(delta)
                folded.append((name, "bias"))
            else:
                skipped.append((name, "no bias and no BatchNorm right after it"))
    return Compensation(tuple(folded), tuple(skipped), groups=None if groups is None else tuple(sorted(groups)))


def _weight_in_dim(dg: DependencyGraph, name: str) -> int | None:
    """The dim of ``name.weight`` that the layer's input channels index (Linear/conv: 1; Hugging Face's Conv1D,
    stored (in, out): 0), read from the analysis records; None when the weight is not recorded against them."""
    in_roots = dg.record_roots.get(RecordKey(Kind.MODULE, name, IN))
    if in_roots is None:
        return None
    for d in range(5):
        roots = dg.record_roots.get(RecordKey(Kind.PARAM, f"{name}.weight", ParamDim(d)))
        if roots is not None and np.array_equal(roots, in_roots):
            return d
    return None


def _single_bn_follower(gm: fx.GraphModule) -> dict[str, str]:
    """Layer -> the BatchNorm (with running stats) that alone consumes its output."""
    modules = dict(gm.named_modules())
    out = {}
    for node in gm.graph.nodes:
        if node.op != "call_module" or len(node.users) != 1:
            continue
        user = next(iter(node.users))
        bn = modules.get(user.target) if user.op == "call_module" else None
        if isinstance(bn, nn.modules.batchnorm._BatchNorm) and bn.track_running_stats and bn.running_mean is not None:
            out[str(node.target)] = str(user.target)
    return out
