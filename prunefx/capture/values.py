"""Give every fx node a value without touching the model: meta tensors first, a real no-grad eval pass
as fallback.

The meta pass swaps every parameter and buffer for a meta tensor of the same shape (``functional_call``)
so nothing is allocated, BatchNorm statistics cannot move and models already on the meta device work.
Ops with data-dependent shapes have no meta kernel; then the graph runs for real in eval mode under
``torch.no_grad`` on a copy of the parameters and buffers. Both passes interpret the training-mode graph with
evaluation semantics (:mod:`prunefx.capture.semantics`), and every module's attributes are restored afterwards
(a leaf that caches tensors in forward, e.g. anchors, would otherwise keep meta tensors), so the model is left
exactly as it was. Results are stored as meta tensors (or plain Python values) in ``node.meta["prunefx_value"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_map

from prunefx._state import submodules
from prunefx.capture.meta_shapes import fast_function, fast_method, fast_module
from prunefx.capture.semantics import EvalInterpreter
from prunefx.capture.trace import module_state_kept, training_mode
from prunefx.errors import ShapeError

VALUE_KEY = "prunefx_value"


# Leaf modules whose output has the input's shape and dtype: on meta tensors their kernels (BatchNorm's
# decomposition above all) cost more than the whole rest of the pass, and the answer is known.
_SHAPE_PRESERVING = (
    nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm, nn.LayerNorm, nn.GroupNorm,
    nn.modules.dropout._DropoutNd, nn.Identity, nn.ReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Hardswish,
    nn.Hardsigmoid, nn.Sigmoid, nn.Tanh, nn.LeakyReLU, nn.ELU, nn.Mish, nn.PReLU,
)


class _Recorder(EvalInterpreter):
    def call_module(self, target: str, args: tuple, kwargs: dict) -> Any:
        module = self.submodules.get(target)
        if module is None:
            module = self.fetch_attr(target)
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.device.type == "meta" and not kwargs and len(args) == 1:
            if isinstance(module, _SHAPE_PRESERVING):
                return x
            out = fast_module(module, args, kwargs)
            if out is not None:
                return out
        return module(*args, **kwargs)

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        out = fast_function(target, args, kwargs)
        return out if out is not None else super().call_function(target, args, kwargs)

    def call_method(self, target: str, args: tuple, kwargs: dict) -> Any:
        out = fast_method(target, args, kwargs)
        return out if out is not None else super().call_method(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        # fx.Interpreter.run_node without its per-node traceback metadata (two context managers and a log call): on
        # meta tensors that bookkeeping cost as much as the kernels. Errors still name the node (Interpreter.run).
        self._node = n
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        out = getattr(self, n.op)(n.target, args, kwargs)
        if isinstance(out, torch.Tensor):
            n.meta[VALUE_KEY] = _to_meta(out)
        else:
            n.meta[VALUE_KEY] = tree_map(_to_meta, out)
        return out


class _Runner(nn.Module):
    """Wraps the GraphModule so functional_call can swap its parameters while the Interpreter runs."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__()
        self.gm = gm
        self.free_values = True  # a real pass frees each value after its last use; meta values hold no memory

    def forward(self, *args: Any) -> Any:
        return _Recorder(self.gm, garbage_collect_values=self.free_values).run(*args)


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.device.type != "meta":
        return torch.empty_like(x, device="meta")
    return x


def _on_meta(model: nn.Module) -> bool:
    return any(t is not None and t.device.type == "meta"
               for m in submodules(model) for t in (*m._parameters.values(), *m._buffers.values()))


def propagate(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """Record a value for every node of ``gm``; returns which pass succeeded ("meta" or "eval")."""
    with module_state_kept(gm):
        return _propagate(gm, example_inputs)


def _propagate(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    runner = _Runner(gm)
    meta_inputs = tree_map(_to_meta, tuple(example_inputs))
    try:
        runner.free_values = False
        if _on_meta(gm):
            runner(*meta_inputs)
        else:
            state = {
                f"gm.{k}": torch.empty_like(v, device="meta")
                for k, v in (*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False))
            }
            torch.func.functional_call(runner, state, meta_inputs, tie_weights=False, strict=False)
        return "meta"
    except Exception as meta_exc:  # no meta kernel / data-dependent shape: run for real
        runner.free_values = True
        if _on_meta(gm):
            raise ShapeError(f"shape propagation on the meta device failed: {meta_exc}") from meta_exc
        first_error = meta_exc
    try:
        # A copy of the state: a leaf's own forward may still update a buffer in place.
        state = {
            f"gm.{k}": v.detach().clone()
            for k, v in (*gm.named_parameters(remove_duplicate=False), *gm.named_buffers(remove_duplicate=False))
        }
        with training_mode(gm, False), torch.no_grad():
            torch.func.functional_call(runner, state, tuple(example_inputs), tie_weights=False, strict=False)
    except Exception as exc:  # noqa: BLE001
        shapes = [tuple(x.shape) for x in example_inputs if isinstance(x, torch.Tensor)]
        raise ShapeError(
            f"the model does not run on example inputs of shape {shapes}: {type(exc).__name__}: "
            f"{str(exc).split(chr(10) + chr(10) + 'While executing')[0]}. "
            "Pass inputs the model accepts (e.g. --imgsz / the right number of channels)."
        ) from first_error
    return "eval"


def value(node_or_const: Any) -> Any:
    """The recorded value of an fx node, or the constant itself."""
    if isinstance(node_or_const, fx.Node):
        return node_or_const.meta.get(VALUE_KEY)
    return node_or_const
