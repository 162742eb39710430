"""Capture a model with ``torch.export`` (non-strict): an ATen-level GraphModule the analysis walks like an fx one.

    gm = export_graph(model, (input_ids,))

What symbolic tracing cannot follow (Python control flow on sizes, caches, decorators, mask utilities),
``torch.export`` runs for real on fake tensors and specialises. The result, ready for the analysis:
- one placeholder per example input, in order (non-tensor inputs such as ``use_cache=False`` are baked in);
- every node carries ``node.meta["prunefx_value"]`` (meta tensors from export's own fake values: no second shape
  pass runs and nothing is allocated, so models on the meta device work) and ``nn_module_stack``;
- parameters and buffers are ``get_attr`` nodes named as in the user's model and are the user's tensors, so the
  analysis records slice the user's modules (``ep.module()`` rebuilds plain containers: module types come from
  the user's model, see ``Engine(modules=...)``);
- wrappers that only switch grad mode or autocast (``wrap_with_set_grad_enabled``) are inlined.
The export runs in eval mode (every module's flag restored afterwards); sizes in the graph are literals.
Libraries declare what their models need with :func:`register_export` (transformers: ``use_cache=False``).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.fx.config
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from prunefx._registry import put
from prunefx.capture.inputs import positional
from prunefx.capture.record import CaptureInfo, set_capture_info
from prunefx.capture.trace import capture_settings, quote_targets, targets_quoted, training_mode
from prunefx.capture.values import VALUE_KEY
from prunefx.errors import TraceFailure

# type -> fn(model) giving the keyword arguments its export needs; the types listed are captured by export first.
_EXPORT: dict[type, Callable[[nn.Module], dict[str, Any]]] = {}


def register_export(cls: type, kwargs: Callable[[nn.Module], dict[str, Any]] | None = None, *,
                    replace: bool = False) -> None:
    """Capture models of type ``cls`` (and subclasses) with ``torch.export`` when ``capture="auto"``, passing
    ``kwargs(model)`` as keyword arguments (e.g. ``lambda m: {"use_cache": False}`` for transformers)."""
    put(_EXPORT, cls, kwargs or (lambda model: {}), what="register_export", replace=replace)


def prefers_export(model: nn.Module) -> bool:
    """True when a plugin registered the model's type for export capture."""
    return any(cls in _EXPORT for cls in type(model).__mro__)


def _kwargs_for(model: nn.Module) -> dict[str, Any]:
    for cls in type(model).__mro__:
        if cls in _EXPORT:
            return _EXPORT[cls](model)
    return {}


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    return x


def _wrappers() -> dict[Any, int]:
    """Higher-order ops that only change a mode around a subgraph -> index of the subgraph argument."""
    from torch._higher_order_ops.wrap import wrap_with_autocast, wrap_with_set_grad_enabled

    return {wrap_with_set_grad_enabled: 1, wrap_with_autocast: 4}


def _inline_wrappers(gm: fx.GraphModule) -> None:
    """Replace each mode-switching wrapper by the nodes of its subgraph (the ops inside are ordinary ops)."""
    wrappers = _wrappers()
    for node in list(gm.graph.nodes):
        k = wrappers.get(node.target) if node.op == "call_function" else None
        if k is None:
            continue
        sub: fx.GraphModule = getattr(gm, node.args[k].target)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        env = dict(zip(placeholders, node.args[k + 1 :], strict=True))
        result: Any = None
        with gm.graph.inserting_before(node):
            for sn in sub.graph.nodes:
                if sn.op == "placeholder":
                    continue
                if sn.op == "output":
                    result = fx.node.map_arg(sn.args[0], env.__getitem__)
                    continue
                if sn.op == "get_attr":  # a constant of the subgraph: hoist it into the parent
                    name = f"{node.args[k].target}_{sn.target}"
                    setattr(gm, name, getattr(sub, sn.target))
                    new = gm.graph.get_attr(name)
                else:
                    new = gm.graph.node_copy(sn, env.__getitem__)
                new.meta = {**node.meta, **sn.meta}  # the subgraph's nodes keep the wrapper's module stack
                env[sn] = new
        for user in list(node.users):  # outputs are read with getitem(node, i)
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(result[user.args[1]])
                gm.graph.erase_node(user)
        if node.users:
            node.replace_all_uses_with(result)
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()


@contextlib.contextmanager
def _quiet_export():
    """No per-node source stack traces (a noticeable share of export's time; nothing here reads them) and no log
    lines from export's shape reasoning: a failure is reported once, as a TraceFailure."""
    saved = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    loggers = [logging.getLogger(n) for n in ("torch.fx.experimental.symbolic_shapes", "torch.export", "torch._export")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = saved
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def export_graph(
    model: nn.Module, example_inputs: Sequence[Any] | torch.Tensor, kwargs: dict[str, Any] | None = None
) -> fx.GraphModule:
    """Export ``model`` (eval mode, non-strict) into an ATen GraphModule with node values and module names."""
    if not isinstance(model, nn.Module):
        raise TraceFailure(f"expected a torch.nn.Module, got {type(model).__name__}; pass the model object itself")
    example_inputs = positional(model, example_inputs)
    params = inspect.signature(model.forward).parameters
    open_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in {**_kwargs_for(model), **(kwargs or {})}.items() if k in params or open_kwargs}
    printed = io.StringIO()  # on failure export prints its partial graph to stderr: the error below says it once
    with training_mode(model, False), capture_settings(model), _quiet_export():
        try:
            with contextlib.redirect_stderr(printed):
                ep = torch.export.export(model, example_inputs, kwargs, strict=False)
        except Exception as exc:  # reported with what to do about it
            first = (str(exc).strip().splitlines() or [""])[0][:400]
            raise TraceFailure(
                f"torch.export cannot capture {type(model).__name__}: {type(exc).__name__}: {first}\n"
                "  fixes: pass example inputs the model's forward accepts; make shape-dependent Python code static; "
                "or capture='fx' (symbolic tracing with automatic leaves)"
            ) from exc
    sys.stderr.write(printed.getvalue())  # a successful export's warnings are the user's to see
    with targets_quoted():  # a submodule named 'a"b': the unlifted module's code quotes it
        gm = ep.module()
    for name in ("train", "eval"):  # export forbids mode switches on its module; the graph itself is mode-free
        gm.__dict__.pop(name, None)
    gm._forward_pre_hooks.clear()  # the check of the original call signature: the graph takes the tensors only
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "placeholder" and not isinstance(node.meta.get("val"), torch.Tensor):
            node.replace_all_uses_with(node.meta.get("val"))  # use_cache=False and friends: constants now
            graph.erase_node(node)
        elif node.op == "call_module" and node.target == "_guards_fn":
            graph.erase_node(node)  # export's input-shape guards: this graph only ever sees these shapes
    graph._codegen = TensorInputs()  # the model's inputs as given (None, containers) in, flat outputs
    quote_targets(graph)
    _inline_wrappers(gm)
    for node in graph.nodes:
        if node.op == "get_attr":
            node.meta[VALUE_KEY] = tree_map(_to_meta, _attr(gm, node.target))
        elif node.op != "output":
            node.meta[VALUE_KEY] = tree_map(_to_meta, node.meta.get("val"))
    graph.lint()
    gm.recompile()
    tensors = (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    own = {n for n, _ in tensors}
    lifted = sorted(n for n, _ in (*gm.named_parameters(), *gm.named_buffers()) if n not in own)
    set_capture_info(gm, CaptureInfo(capture="export", training=False, lifted_constants=tuple(lifted)))
    return gm


def _tensor_leaves(args: tuple) -> list[torch.Tensor]:
    return [x for x in tree_leaves(args) if isinstance(x, torch.Tensor)]


class TensorInputs(fx.graph.CodeGen):
    """The exported graph called like the model: ``gm(*inputs)`` feeds the inputs' tensor leaves to the
    placeholders (export bakes every other leaf in: None for an input not given, ``use_cache=False``)."""

    def process_inputs(self, *inputs: Any) -> list[torch.Tensor]:
        return _tensor_leaves(inputs)

    def gen_fn_def(self, free_vars: list[str], maybe_return_annotation: str, *, expanded_def: bool = False) -> str:
        names = [v.split(":")[0].split("#")[0].strip() for v in free_vars if v != "self"]
        head = f"def {self._func_name}(self, *args){maybe_return_annotation}:"
        return head + (f"\n    {', '.join(names)}, = _tensor_leaves(args)" if names else "")

    def additional_globals(self) -> list[tuple[str, Any]]:
        return [("_tensor_leaves", _tensor_leaves)]

    def _gen_python_code(self, *args: Any, **kwargs: Any) -> Any:
        with targets_quoted():  # module names that are not identifiers ('a"b'), as quote_targets does for fx
            return super()._gen_python_code(*args, **kwargs)


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
