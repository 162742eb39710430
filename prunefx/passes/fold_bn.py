"""Fold eval-mode BatchNorm into the convolution or linear layer that feeds it (torch.fx ``fuse``, guarded).

    deployed = fold_bn(model.eval(), torch.randn(1, 3, 224, 224))   # a GraphModule; model is untouched

A BatchNorm in eval mode is an affine map per channel, so ``bn(conv(x))`` equals one convolution with scaled
weights and a shifted bias. The fold is only exact and only safe when nothing else sees the conv's output
(torch.fx's guard: "conv output has no other user"), when the conv module is called from one place (its
weights change for every caller), and when the BatchNorm uses running statistics of the conv's channel dim.
Every BatchNorm left unfolded is listed with the reason in ``gm.meta[FOLD_KEY]["kept"]``.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_eval

from prunefx.capture import VALUE_KEY, propagate, trace
from prunefx.capture.inputs import positional
from prunefx.errors import PrunefxError

FOLD_KEY = "prunefx_fold_bn"
_BN = nn.modules.batchnorm._BatchNorm
# producer type -> the BatchNorm types that normalise its channel dim (dim 1 of its output)
_PAIRS: tuple[tuple[type[nn.Module], tuple[type[nn.Module], ...]], ...] = (
    (nn.Conv1d, (nn.BatchNorm1d,)),
    (nn.Conv2d, (nn.BatchNorm2d,)),
    (nn.Conv3d, (nn.BatchNorm3d,)),
    (nn.ConvTranspose1d, (nn.BatchNorm1d,)),
    (nn.ConvTranspose2d, (nn.BatchNorm2d,)),
    (nn.ConvTranspose3d, (nn.BatchNorm3d,)),
    (nn.Linear, (nn.BatchNorm1d,)),
)


class FoldError(PrunefxError):
    """A model cannot be folded as asked (training mode, not a module); the message says what to do."""


@dataclass(frozen=True)
class Fold:
    """One decision: the BatchNorm node, the producer it folds into (None when kept), and why it was kept."""

    bn: str  # qualified name of the BatchNorm module
    node: str  # fx node of the BatchNorm call
    into: str | None  # qualified name of the conv / linear it folds into
    reason: str = ""  # why it stays, when into is None


def _producer_ok(producer: nn.Module, bn: nn.Module, out_value: Any) -> str:
    """'' when ``bn`` may fold into ``producer``; otherwise why not."""
    allowed = next((bns for kind, bns in _PAIRS if type(producer) is kind), None)
    if allowed is None:
        return f"its input comes from {type(producer).__name__}, not a convolution or linear layer"
    if type(bn) not in allowed:
        return f"{type(bn).__name__} does not match {type(producer).__name__}'s dimensionality"
    if not bn.track_running_stats or bn.running_mean is None or bn.running_var is None:
        return "it has no running statistics (track_running_stats=False): it normalises with batch statistics"
    if isinstance(producer, nn.Linear):
        # BatchNorm1d normalises dim 1; that is the linear's features only for a 2-D (N, C) output
        shape = getattr(out_value, "shape", None)
        if shape is None:
            return "the linear layer's output shape is unknown (pass example inputs)"
        if len(shape) != 2:
            return f"the linear output is {len(shape)}-D: BatchNorm1d would normalise dim 1, not the features"
    out_channels = producer.out_features if isinstance(producer, nn.Linear) else producer.out_channels
    if bn.num_features != out_channels:
        return f"it has {bn.num_features} features, the producer {out_channels} channels"
    return ""


def foldable(gm: fx.GraphModule) -> list[Fold]:
    """Every BatchNorm call in ``gm`` with the producer it can fold into, or the reason it cannot."""
    modules = dict(gm.named_modules())
    calls = Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), _BN):
            continue
        bn = modules[node.target]
        src = node.args[0] if node.args else None
        reason = ""
        if len(node.args) != 1 or node.kwargs or not isinstance(src, fx.Node) or src.op != "call_module":
            reason = "its input is not the output of a module call"
        elif len(src.users) > 1:
            reason = f"the output of {src.target} has other users ({len(src.users)}), which must see it unnormalised"
        elif calls[src.target] > 1:
            reason = f"{src.target} is called {calls[src.target]} times; folding would change every call"
        else:
            reason = _producer_ok(modules[src.target], bn, src.meta.get(VALUE_KEY))
        into = None if reason else str(src.target)
        out.append(Fold(str(node.target), node.name, into, reason))
    return out


def _check_eval(model: nn.Module) -> None:
    training = [name or type(model).__name__ for name, m in model.named_modules() if isinstance(m, _BN) and m.training]
    if training:
        raise FoldError(
            f"fold_bn needs BatchNorm in eval mode ({training[0]} is training: it would normalise with batch "
            "statistics, which no folded weight can reproduce); call model.eval() first"
        )


def fold_bn(
    model: nn.Module, example_inputs: Sequence[Any] | torch.Tensor | None = None, *, inplace: bool = False
) -> fx.GraphModule:
    """A GraphModule computing what ``model`` computes in eval mode, with foldable BatchNorms folded away.

    ``example_inputs`` let the pass see shapes (a linear layer's BatchNorm1d is folded only for 2-D outputs)
    and bind ``forward``'s arguments; without them the trace uses ``forward``'s signature. ``model`` is
    copied unless ``inplace``. Raises :class:`FoldError` for a model with BatchNorm in training mode.
    ``gm.meta[FOLD_KEY]`` lists ``folded`` (bn, producer) pairs and ``kept`` (bn, reason) pairs.
    """
    if not isinstance(model, nn.Module):
        raise FoldError(f"fold_bn() needs a torch.nn.Module, got {type(model).__name__}")
    _check_eval(model)
    if example_inputs is not None:
        example_inputs = positional(model, example_inputs)
    work = model if inplace else copy.deepcopy(model)
    gm = trace(work, example_inputs, training=False)
    if example_inputs is not None:
        # The meta pass runs the eval forward, which may cache tensors as module attributes (ultralytics' Detect
        # keeps its anchors): those would be meta tensors poisoning the first real forward, so they are undone.
        saved = [(m, dict(vars(m))) for m in work.modules()]
        try:
            propagate(gm, example_inputs)
        finally:
            for m, before in saved:
                vars(m).clear()
                vars(m).update(before)
    modules = dict(gm.named_modules())
    decisions = foldable(gm)
    nodes = {n.name: n for n in gm.graph.nodes}
    for d in decisions:
        if d.into is None:
            continue
        bn_node = nodes[d.node]
        producer = modules[d.into]
        fused = fuse_linear_bn_eval(producer, modules[d.bn]) if isinstance(producer, nn.Linear) else (
            fuse_conv_bn_eval(producer, modules[d.bn], transpose=isinstance(producer, nn.modules.conv._ConvTransposeNd))
        )
        parent, _, leaf = d.into.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, leaf, fused)
        bn_node.replace_all_uses_with(bn_node.args[0])
        gm.graph.erase_node(bn_node)
    gm.delete_all_unused_submodules()
    gm.training = work.training
    gm.graph.lint()
    gm.recompile()
    gm.meta[FOLD_KEY] = {
        "folded": [(d.bn, d.into) for d in decisions if d.into],
        "kept": [(d.bn, d.reason) for d in decisions if not d.into],
    }
    return gm
