"""Partial capture: when a model's own forward cannot be captured, the largest submodules that can be ("parts").

Tensor-dependent Python control flow in the root forward (``if scores.max() > t:``, a loop over
``torch.nonzero(...)`` in a detector's post-processing) defeats fx in both modes and torch.export, and automatic
leaves only help when the failure is inside a submodule. Then:

1. the model runs once concretely on the example inputs (evaluation mode, no grad, every attribute and buffer put
   back afterwards) with forward pre-hooks recording each submodule's inputs;
2. each top-level child is captured with its recorded inputs (:func:`prunefx.capture.capture_graph`, as for a
   whole model); a child that cannot be captured, or only as one automatic leaf, is opened and its children are
   tried, recursively; a submodule the forward never called, or one without parameters, is skipped;
3. the parts are captured together as one graph: a root (:class:`_Parts`) whose module tree holds exactly the
   parts under their names in the model (``backbone``, ``head.cls``), and whose forward calls each part with its
   recorded inputs. Record names are the model's own, so scoring, planning, compensation and the rewrite act on
   the model itself, and the plan is one joint plan over every part's groups (a FLOPs or parameter target is a
   fraction of the whole model's, see :class:`prunefx.plan.CostModel`, with the opaque code counted as fixed).

A part's outputs are its boundary: code that was not captured reads them, so their channels are frozen ("boundary
of part ..."); its inputs carry no channel labels, as a model's inputs. A part called more than once (a head
shared by several feature levels) is captured with its first call's inputs; the oracle
(:func:`prunefx.verify`) checks the whole model end to end and runs the masked graph for every call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import TreeSpec, tree_flatten, tree_map, tree_unflatten

from prunefx.analysis.labels import Lab
from prunefx.capture.record import Capture, capture_info, set_capture_info
from prunefx.capture.select import capture_graph
from prunefx.capture.trace import module_state_kept, trace, training_mode
from prunefx.errors import PrunefxError, TraceFailure

BOUNDARY = "boundary of part"  # the reason prefix of a part's frozen outputs


@dataclass(frozen=True)
class Part:
    """A submodule captured on its own: its name in the model, how often the forward called it, its share."""

    path: str
    calls: int
    params: int


@dataclass(frozen=True)
class Opaque:
    """A module whose forward could not be captured ("" is the model itself) and the first line of why."""

    path: str
    why: str


@dataclass(frozen=True)
class PartialCapture:
    """Which parts of a model were analysed, which forwards stayed opaque, and the share the opaque code holds."""

    parts: tuple[Part, ...]
    opaque: tuple[Opaque, ...]
    params_total: int
    opaque_params_share: float  # parameters outside every part (held by opaque modules or the root itself)
    opaque_macs_share: float | None  # MACs run outside every part on the example inputs (None: not counted)
    # per part: (args, kwargs) of its first call, the captured graph's inputs (tensors: not compared, not printed)
    calls: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    # a torch.export graph takes the calls' tensors flat and returns its outputs flat: their structure (one entry
    # per part) to rebuild them with; None for an fx graph, which keeps the structure
    out_spec: TreeSpec | None = field(default=None, compare=False, repr=False)

    def graph_inputs(self, calls: Sequence[Any], export: bool) -> tuple:
        """What the parts' graph takes for these calls: the calls themselves, or for export their tensors, flat."""
        return tuple(x for x in tree_flatten(tuple(calls))[0] if isinstance(x, torch.Tensor)) if export else \
            tuple(calls)

    def per_part(self, out: Any) -> Any:
        """The parts' graph's output as one entry per part."""
        return tree_unflatten(list(out), self.out_spec) if self.out_spec is not None else out

    def describe(self) -> str:
        """The lines the analysis summary prints: the parts, the opaque code and its share."""
        macs = "" if self.opaque_macs_share is None else f", {self.opaque_macs_share:.1%} of the MACs"
        parts = ", ".join(p.path + (f" (called {p.calls}x)" if p.calls > 1 else "") for p in self.parts)
        lines = [
            f"partial capture: the model's own forward could not be captured; analysed {len(self.parts)} part(s) "
            f"with their boundaries frozen: {parts}",
            f"opaque (not analysed, not pruned): {self.opaque_params_share:.1%} of the parameters{macs}",
        ]
        lines += [f"opaque forward of {o.path or '<root>'}: {o.why}" for o in self.opaque]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "parts": [{"path": p.path, "calls": p.calls, "params": p.params} for p in self.parts],
            "opaque": [{"path": o.path, "why": o.why} for o in self.opaque],
            "params_total": self.params_total,
            "opaque_params_share": self.opaque_params_share,
            "opaque_macs_share": self.opaque_macs_share,
        }


class _Parts(nn.Module):
    """A root holding exactly the parts under their names in the model; forward calls each with its inputs."""

    def __init__(self, model: nn.Module, paths: Sequence[str]) -> None:
        super().__init__()
        self._paths = tuple(paths)
        for path in paths:
            owner: nn.Module = self
            *above, last = path.split(".")
            for i, name in enumerate(above):  # plain containers stand for the modules above a nested part
                if name not in owner._modules:
                    owner._modules[name] = _Container(".".join(above[: i + 1]))
                owner = owner._modules[name]
            owner._modules[last] = model.get_submodule(path)

    def forward(self, *calls: Any) -> tuple:
        pairs = zip(self._paths, calls, strict=True)
        return tuple(self.get_submodule(p)(*args, **kwargs) for p, (args, kwargs) in pairs)


class _Container(nn.Module):
    """Stands for a module above a part (its own forward is not captured)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path


def _first_lines(failure: BaseException) -> str:
    """The first line of a trace failure and the user's source line it names."""
    lines = str(failure).splitlines()
    where = next((ln.strip() for ln in lines if ln.strip().startswith("at ")), "")
    return (lines[0] if lines else type(failure).__name__) + (f" {where}" if where else "")


def _record_calls(model: nn.Module, inputs: tuple, names: set[str]) -> tuple[dict[str, Any], dict[str, int]]:
    """Per module named in ``names``: (args, kwargs) of its first call (cloned) and how often it was called."""
    first: dict[str, Any] = {}
    count: dict[str, int] = {}

    def hook(name: str):
        def fn(module: nn.Module, args: tuple, kwargs: dict) -> None:
            count[name] = count.get(name, 0) + 1
            if name not in first:  # cloned: the forward may change its inputs in place afterwards
                first[name] = tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t,
                                       (tuple(args), dict(kwargs)))

        return fn

    modules = dict(model.named_modules())
    handles = [modules[n].register_forward_pre_hook(hook(n), with_kwargs=True) for n in names]
    try:
        _run(model, inputs)
    finally:
        for h in handles:
            h.remove()
    return first, count


def _run(model: nn.Module, inputs: tuple) -> Any:
    """One concrete forward in evaluation mode (the model's own mode when eval fails), with nothing left changed."""
    failure = None
    for mode in (False, None):
        try:
            with training_mode(model, mode), torch.no_grad(), module_state_kept(model):
                return model(*inputs)
        except Exception as exc:  # noqa: BLE001 - reported below when no mode runs
            failure = failure or exc
    raise TraceFailure(
        f"{type(model).__name__} does not run on the example inputs ({type(failure).__name__}: "
        f"{str(failure).splitlines()[0][:200] if str(failure) else ''}); pass inputs its forward accepts"
    ) from failure


def _macs(model: nn.Module, inputs: tuple) -> dict[str, float] | None:
    """FLOPs per module path ("" the whole model) of one evaluation-mode forward, each including its children's."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter:
            _run(model, inputs)
    except Exception:  # noqa: BLE001 - a share of MACs is a nicety: the summary omits it when it cannot be counted
        return None
    root = type(model).__name__
    out = {}
    for key, ops in counter.get_flop_counts().items():
        if key == root or key.startswith(root + "."):
            out[key[len(root) + 1:]] = float(sum(ops.values()))
    return out


def _leafed(gm: fx.GraphModule, paths: Sequence[str]) -> list[str]:
    """The parts that the capture could only keep as automatic leaves (nothing inside them analysed)."""
    auto = capture_info(gm).auto_leaves
    return [p for p in paths if p in auto]


def _capture(model: nn.Module, paths: Sequence[str], calls: tuple, capture: Capture, leaves: Sequence[str]):
    """The parts captured as one graph, as :func:`prunefx.capture.capture_graph` captures a model.

    In the parts' root, a part whose training-mode forward fails (a detector asserting that training needs
    targets) becomes an automatic leaf instead of sending the trace to evaluation mode, as it would at the top
    of a model: then the parts are traced in evaluation mode, with the same note."""
    parts = _Parts(model, paths)
    gm = capture_graph(parts, calls, capture, leaves=leaves)
    leafed = _leafed(gm, paths)
    if not leafed or capture == "export" or capture_info(gm).training is False:
        return gm
    try:
        in_eval = trace(parts, calls, leaves=leaves, training=False)
    except TraceFailure:
        return gm
    if len(_leafed(in_eval, paths)) >= len(leafed):
        return gm
    why = capture_info(gm).auto_leaves[leafed[0]]
    set_capture_info(in_eval, replace(capture_info(in_eval), notes=(
        f"traced in evaluation mode: the training-mode forward of part {leafed[0]!r} cannot be traced ({why}); "
        "layers only training runs are not analysed",
    )))
    return in_eval


def _capturable(model: nn.Module, path: str, call: Any, capture: Capture, leaves: Sequence[str]) -> str | None:
    """None when the part ``path`` captures on its own with its recorded call; else the first line of why not."""
    try:
        gm = _capture(model, [path], (call,), capture, leaves)
    except TraceFailure as exc:  # named after the part's own type, not the root that held it for capturing
        return _first_lines(exc).replace(_Parts.__name__, type(model.get_submodule(path)).__name__)
    if _leafed(gm, [path]):  # captured only as one opaque leaf: nothing inside it would be analysed
        return capture_info(gm).auto_leaves[path]
    return None


def find_parts(
    model: nn.Module,
    inputs: tuple,
    root_failure: TraceFailure,
    *,
    capture: Capture = "auto",
    leaves: Sequence[str] = (),
) -> tuple[fx.GraphModule, PartialCapture]:
    """The parts of ``model`` (see the module docstring) captured as one graph, and what was left opaque."""
    parts: list[str] = []
    opaque = [Opaque("", _first_lines(root_failure))]
    calls: dict[str, Any] = {}
    counts: dict[str, int] = {}
    frontier = [model]
    prefix = {id(model): ""}
    while frontier:
        children = [(prefix[id(m)] + ("." if prefix[id(m)] else "") + n, c)
                    for m in frontier for n, c in m.named_children()]
        named = {n for n, c in children if next(c.parameters(), None) is not None}
        if not named:
            break
        try:
            first, count = _record_calls(model, inputs, named)
        except TraceFailure as exc:  # e.g. a model on the meta device: its branches on data cannot be taken
            raise TraceFailure(f"{root_failure}\npartial capture is not possible either: {exc}") from exc
        calls.update(first)
        counts.update(count)
        frontier = []
        for name, child in children:
            if name not in named or name not in first:
                continue  # no parameters to prune, or never called on these inputs
            why = _capturable(model, name, first[name], capture, leaves)
            if why is None:
                parts.append(name)
            else:
                opaque.append(Opaque(name, why))
                prefix[id(child)] = name
                frontier.append(child)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    parts.sort(key=order.__getitem__)  # the model's order, not the order they were found in
    if not parts:
        raise TraceFailure(
            f"{root_failure}\npartial capture: no submodule of {type(model).__name__} that holds parameters could be "
            "captured on its own either; fix the first failure above (the model's own forward) to analyse it"
        )
    try:
        gm = _capture(model, parts, tuple(calls[p] for p in parts), capture, leaves)
    except TraceFailure as exc:
        raise TraceFailure(
            f"{root_failure}\npartial capture: the parts {parts} do not capture together: {exc}"
        ) from exc
    total = sum(p.numel() for p in model.parameters())
    inside = sum(p.numel() for p in _Parts(model, parts).parameters())
    flops = _macs(model, inputs)
    macs_share = None
    if flops and flops.get(""):
        macs_share = max(0.0, 1.0 - sum(flops.get(p, 0.0) for p in parts) / flops[""])
    out_spec = None
    if capture_info(gm).capture == "export":  # flat outputs: remember their structure
        with training_mode(model, False), torch.no_grad(), module_state_kept(model):
            out_spec = tree_flatten(_Parts(model, parts)(*(calls[p] for p in parts)))[1]
    info = PartialCapture(
        parts=tuple(Part(p, counts.get(p, 1), sum(t.numel() for t in model.get_submodule(p).parameters()))
                    for p in parts),
        opaque=tuple(opaque),
        params_total=total,
        opaque_params_share=(1.0 - inside / total) if total else 0.0,
        opaque_macs_share=macs_share,
        calls=tuple(calls[p] for p in parts),
        out_spec=out_spec,
    )
    return gm, info


def boundary_reasons(gm: fx.GraphModule, groups: list, node_labels: dict, atoms, info: PartialCapture) -> list:
    """``groups`` with "model output" reasons replaced by the boundary of the part whose output holds them."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    try:
        per_part = info.per_part(out_node.args[0])
    except Exception:  # noqa: BLE001 - an output layout that does not fit: the reasons stay unnamed
        per_part = ()
    per_part = per_part if isinstance(per_part, (tuple, list)) else ()
    owner: dict[int, str] = {}  # class root -> part path
    if len(per_part) == len(info.parts):
        for part, value in zip(info.parts, per_part, strict=True):
            for node in tree_flatten(value)[0]:
                lab = node_labels.get(node.name) if isinstance(node, fx.Node) else None
                for lab_ in tree_flatten(lab)[0] if not isinstance(lab, Lab) else [lab]:
                    for arr in getattr(lab_, "dims", ()):
                        if arr is not None:
                            for r in np.unique(atoms.find(arr)):
                                owner.setdefault(int(r), part.path)
    new = []
    for g in groups:
        if any(r.startswith("model output") for r in g.reasons):
            paths = sorted({owner[int(r)] for r in np.unique(g.roots) if int(r) in owner})
            who = f" {', '.join(repr(p) for p in paths)}" if paths else ""
            reason = f"{BOUNDARY}{who}: its output is read by code that could not be captured"
            g = replace(g, reasons=tuple(re.sub(r"^model output.*", reason, r) for r in g.reasons))
        new.append(g)
    return new


def check_inputs(info: PartialCapture | None, what: str) -> None:
    """Refuse what needs the whole model as one graph (a latency table, literals rewritten in the graph)."""
    if info is not None:
        raise PrunefxError(
            f"{what} needs the whole model captured as one graph, but only parts of it were "
            f"({', '.join(p.path for p in info.parts)}); fix the opaque forward first:\n{info.describe()}"
        )


__all__ = ["BOUNDARY", "Opaque", "Part", "PartialCapture", "boundary_reasons", "check_inputs", "find_parts"]
