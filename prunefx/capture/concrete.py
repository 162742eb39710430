"""Concrete sizes while tracing: Python control flow on shapes follows the example inputs.

Symbolic tracing cannot decide ``if H != window:``, ``int(math.sqrt(T))``, ``range(x.shape[1])`` or
``(*x.shape[:-1], -1, head_dim)``: the values are proxies. They are sizes, though, and the example inputs fix
them. :class:`ConcreteValues` runs the graph traced so far on meta tensors (incrementally, only when Python asks
for a value), so the tracer can answer with the real bool / int / length. The graph is then specialised to the
example shapes, as the analysis already is (a plan's fingerprint names its input shapes). Past an op whose output
size depends on data (non-maximum suppression, ``nonzero``) meta tensors have no value; then, as the shape pass
does, the graph so far runs for real on the example inputs (no_grad; the tracer restores the model's state), and a
decision there (``if boxes.numel() > 4000:``) follows the example. On a model on the meta device such a condition
still fails, as before.

Each decision taken this way is recorded (``capture_info(gm).specialised``: source line -> value), and those
that read a size into Python (a condition, an index or ``range()``, ``float()``, ``len()`` of a tensor) also in
``capture_info(gm).decisions`` with the graph node they read. :class:`SizeDecision` re-evaluates one at other
sizes of the tensors it reads: the analysis freezes the channels whose pruning would flip it
(``elif prev.size(1) != self.filters:`` in a NASNet cell), since the graph only holds the branch the trace took.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.fx import _symbolic_trace
from torch.utils._pytree import tree_leaves, tree_map

from prunefx.capture.inputs import structured

# While tracing, fx patches Module.__call__ (and autowrapped functions) to record nodes; evaluating needs the
# real ones. torch.fx's own escape hatch for this is private; without it, no concrete values (the old behaviour).
_unpatched = getattr(_symbolic_trace, "_maybe_revert_all_patches", None)


class NoConcreteValue(Exception):
    """The node's value cannot be known from shapes alone (it depends on tensor data)."""


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x, device="meta")
    return x


class ConcreteValues:
    """Meta values of the nodes of a graph under construction, evaluated in order up to the node asked for."""

    def __init__(self, root: nn.Module, example_inputs: Sequence[Any]) -> None:
        self.root = root
        # one value per placeholder: structured inputs (a list of images) have one placeholder per leaf
        self.real_inputs = list(tree_leaves(tuple(example_inputs)) if structured(example_inputs) else example_inputs)
        self.inputs = [tree_map(_meta, x) for x in self.real_inputs]
        self.env: dict[fx.Node, Any] = {}
        self._placeholders = 0
        self._failed: fx.Node | None = None
        self.real = False  # evaluating on the example inputs themselves (after a data-dependent size)
        self._can_run_real = not any(t.device.type == "meta" for t in (*root.parameters(), *root.buffers()))

    def value(self, graph: fx.Graph, node: fx.Node) -> Any:
        """The meta value of ``node`` (a Python number for sizes), evaluating every earlier node not yet done."""
        if node in self.env:
            return self.env[node]
        if _unpatched is None:
            raise NoConcreteValue("this torch.fx cannot evaluate nodes while tracing")
        with _unpatched(), torch.no_grad():
            return self._evaluate(graph, node)

    def _evaluate(self, graph: fx.Graph, node: fx.Node) -> Any:
        for n in graph.nodes:
            if n in self.env:
                continue
            if self._failed is not None:
                raise NoConcreteValue(f"an earlier node ({self._failed.format_node()}) has no meta value")
            try:
                self.env[n] = self._run(n)
            except Exception as exc:  # no meta kernel, data-dependent op: no concrete answer from here on
                if not self.real and self._can_run_real:
                    self._go_real()  # evaluate again from the start on the real inputs
                    return self._evaluate(graph, node)
                self._failed = n
                raise NoConcreteValue(f"{n.format_node()}: {type(exc).__name__}: {exc}") from exc
            if n is node:
                break
        return self.env[node]

    def _go_real(self) -> None:
        self.real, self.env, self._placeholders = True, {}, 0
        self.inputs = self.real_inputs

    def _state(self, x: Any) -> Any:
        return x if self.real else _meta(x)

    def _load(self, a: Any) -> Any:
        return fx.node.map_arg(a, lambda n: self.env[n])

    def _run(self, n: fx.Node) -> Any:
        if n.op == "placeholder":
            i = self._placeholders
            self._placeholders += 1
            if i < len(self.inputs):
                return self.inputs[i]
            return n.args[0] if n.args else None  # a parameter bound to its default
        if n.op == "get_attr":
            obj: Any = self.root
            for part in str(n.target).split("."):
                obj = getattr(obj, part)
            return self._state(obj)
        args, kwargs = self._load(n.args), self._load(n.kwargs)
        if n.op == "call_function":
            return n.target(*args, **kwargs)
        if n.op == "call_method":
            return getattr(args[0], n.target)(*args[1:], **kwargs)
        if n.op == "call_module":
            module = self.root.get_submodule(str(n.target))
            if self.real:
                return module(*args, **kwargs)
            state = {k: _meta(v) for k, v in (*module.named_parameters(), *module.named_buffers())}
            return torch.func.functional_call(module, state, tuple(args), kwargs, tie_weights=False, strict=False)
        raise NoConcreteValue(f"no value for {n.op} nodes")


def as_number(v: Any) -> Any:
    """A Python bool/int/float from a traced value, or raise NoConcreteValue (a tensor's data is unknown)."""
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, torch.Tensor) and v.device.type != "meta" and v.numel() == 1:  # a real run's scalar
        return v.item()
    raise NoConcreteValue(f"a value of type {type(v).__name__} is not known while tracing")


# How the Python code used a traced value, as recorded in capture_info(gm).decisions, and what it got from it.
# int() is not among them: its result enters the graph as a literal, which the rules account for like any literal
# channel count (a reshape argument is rewritten or its channels frozen).
USES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "condition": ("a Python condition", bool),
    "index": ("an index or range()", operator.index),
    "float": ("float()", float),
    "len": ("len() of or iteration over the tensor", len),
}


class SizeDecision:
    """A Python decision the trace took on sizes: which tensors' sizes it reads, and its outcome at other sizes."""

    def __init__(self, node: fx.Node, use: str, value_of: Callable[[fx.Node], Any]) -> None:
        self.node, self.use, self.value_of = node, use, value_of
        self.reads: list[fx.Node] = []  # tensors whose sizes the decision reads, in the order met
        self.chain: list[fx.Node] = []  # the size arithmetic between them and the decision, in graph order
        # Post-order walk back through non-tensor values (sizes, bools, shapes) to the tensors they were read from.
        # A node that is not plain arithmetic (a leaf returning a number) or holds tensors is taken as a constant.
        visited: set[fx.Node] = set()
        stack = [(node, False)]
        while stack:
            n, done = stack.pop()
            if done:
                self.chain.append(n)  # every input is finished by now: the stack is a DFS of a DAG
                continue
            if n in visited:
                continue
            visited.add(n)
            v = value_of(n)
            if isinstance(v, torch.Tensor):
                self.reads.append(n)
                continue
            if n.op not in ("call_function", "call_method") or any(isinstance(x, torch.Tensor) for x in tree_leaves(v)):
                continue
            stack.append((n, True))
            stack.extend((a, False) for a in reversed(n.all_input_nodes) if a not in visited)

    def outcome(self, shapes: dict[fx.Node, tuple[int, ...]] | None = None) -> Any:
        """What the decision gives when the tensors in ``shapes`` have those shapes (the rest as traced)."""
        env: dict[fx.Node, Any] = {}
        for n in self.reads:
            v = self.value_of(n)
            env[n] = torch.empty(shapes[n], dtype=v.dtype, device="meta") if shapes and n in shapes else v
        load = lambda a: fx.node.map_arg(a, lambda x: env[x] if x in env else self.value_of(x))  # noqa: E731
        for n in self.chain:
            args, kwargs = load(n.args), load(n.kwargs)
            if n.op == "call_function":
                env[n] = n.target(*args, **kwargs)
            else:
                env[n] = getattr(args[0], n.target)(*args[1:], **kwargs)
        return USES[self.use][1](env[self.node] if self.node in env else self.value_of(self.node))
