"""The oracle: a pruned model must equal the original with the pruned channels masked to zero.

The masked run interprets the ORIGINAL model's fx graph and zeroes every pruned channel at every
tensor it appears in (labels from the analysis), and channels that live only inside a leaf module (the heads of
nn.MultiheadAttention) in that module's weights; it shares no code with the rewrite, which slices weights: the
masks are derived here from the plan and the channel classes, independently. Both runs use
the training-mode graph (every layer that learns, e.g. YOLO's raw head outputs) with evaluation semantics
(:class:`prunefx.capture.semantics.EvalInterpreter`: modules in eval mode, BatchNorm on running stats, dropout
and drop-path the identity, random draws replaced by their expectation), under no_grad, so both runs are
deterministic and nothing updates.

Robust, not just exact: float32 round-off grows with depth (a 200-layer random net drifts ~1e-3 relative), so
outputs beyond ``rtol`` are recomputed in float64 on copies before anything is called a mismatch; and outputs
downstream of a discontinuous op (top-k, sort, argmax: a 1e-7 change of its input can swap two indices) are
compared at that op: the pruned run checks its input against the reference's and, when they agree, continues
with the reference's result.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn
from torch.fx.immutable_collections import immutable_dict
from torch.utils._pytree import tree_flatten, tree_map

from prunefx import _plugins
from prunefx.analysis import analyze
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.labels import Lab
from prunefx.analysis.outputs import default_free_outputs, drop_keys
from prunefx.capture.export import export_graph
from prunefx.capture.semantics import DISCRETE, EvalInterpreter
from prunefx.capture.trace import module_state_kept, trace, training_mode
from prunefx.plan import PlanError, PruningPlan, validate_plan


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify`; ``ok`` is True when every output matched within ``rtol``."""

    ok: bool
    exact: bool  # False when a pruned group mixes channels in its statistics (LayerNorm, GroupNorm...)
    max_rel_error: float
    errors: tuple[float, ...]  # per output tensor: max |a - b| / max |a|
    inexact_groups: tuple[int, ...]
    runs_eval: bool
    runs_train: bool
    message: str
    notes: tuple[str, ...] = ()  # how it was checked: float64 recheck, replayed discrete ops, modes not checked


class _EvalGraph(EvalInterpreter):
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
        if x is None or ref_x is None or x.shape != ref_x.shape or not _same_structure(out, ref_out):
            return out
        err = _rel(ref_x, x)
        if err > self.tol:
            self.diverged.append((n.name, err))
            return out
        if _equal(out, ref_out):
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


def _same_structure(a: Any, b: Any) -> bool:
    fa, fb = tree_flatten(a)[0], tree_flatten(b)[0]
    return len(fa) == len(fb) and all(
        (x.shape == y.shape and x.dtype == y.dtype) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        else type(x) is type(y) for x, y in zip(fa, fb, strict=True)
    )


def _equal(a: Any, b: Any) -> bool:
    fa, fb = tree_flatten(a)[0], tree_flatten(b)[0]
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(fa, fb, strict=True))


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


def _mask_specs(dg: DependencyGraph, plan: PruningPlan) -> dict[str, Any]:
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


def _inside_specs(dg: DependencyGraph, plan: PruningPlan) -> list[tuple[str, int, torch.Tensor]]:
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
def _weights_masked(gm: nn.Module, specs: list[tuple[str, int, torch.Tensor]]) -> Iterator[None]:
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


def _outputs(x: Any, free: tuple[str, ...] = ()) -> list[torch.Tensor]:
    """Output tensors, without the entries whose width may change (``free_outputs``)."""
    return [t for t in tree_flatten(drop_keys(x, free))[0] if isinstance(t, torch.Tensor)]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    scale = a.detach().abs().max().item() if a.numel() else 0.0
    diff = (a.detach() - b.detach()).abs().max().item() if a.numel() else 0.0
    return diff / max(scale, 1e-12)


def masked_outputs(
    original: nn.Module, dg: DependencyGraph, plan: PruningPlan, example_inputs: Sequence[Any]
) -> list[torch.Tensor]:
    """Outputs of the original model's graph with every pruned channel zeroed wherever it appears."""
    validate_plan(dg, plan, graph_rewrite=True)
    with training_mode(dg.gm, False), torch.no_grad(), _weights_masked(dg.gm, _inside_specs(dg, plan)):
        return _outputs(_EvalGraph(dg.gm, _mask_specs(dg, plan)).run(*example_inputs), default_free_outputs(original))


def _compare(ref_gm: fx.GraphModule, masks: tuple[dict, list], gm: fx.GraphModule, inputs: tuple, free: tuple,
             tol: float):
    """Per-output relative errors of ``gm`` against the masked ``ref_gm``, and notes on replayed discrete ops.

    ``masks``: per node the (dim, mask) of removed channels, and the inside weights to zero (``_inside_specs``)."""
    record: list = []
    nodes, weights = masks
    with training_mode(ref_gm, False), torch.no_grad(), _weights_masked(ref_gm, weights):
        reference = _outputs(_EvalGraph(ref_gm, nodes, record=record).run(*inputs), free)
    run = _EvalGraph(gm, replay=record, tol=tol)
    try:
        with training_mode(gm, False), torch.no_grad():
            got = _outputs(run.run(*inputs), free)
    except Exception as exc:  # noqa: BLE001 - a pruned model that breaks is the finding, not an error of verify
        first = str(exc).split("\n")[0][:200]
        return (float("inf"),), [f"the pruned model raises {type(exc).__name__}: {first}"]
    if len(reference) != len(got):
        return (float("inf"),), []
    notes = []
    if run.replayed:
        notes.append(f"discontinuous ops compared at their inputs and replayed: {', '.join(run.replayed[:4])}"
                     + (f" (+{len(run.replayed) - 4})" if len(run.replayed) > 4 else ""))
    if run.diverged:
        name, err = run.diverged[0]
        notes.append(f"the input of discontinuous op {name} differs by {err:.3g}")
    return tuple(_rel(a, b) for a, b in zip(reference, got, strict=True)), notes


class _PartRun(_EvalGraph):
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
                   inputs: tuple, calls: tuple, free: tuple) -> tuple[tuple[float, ...], list[str]]:
    """Per-output relative errors of the pruned model's own forward against the masked original, end to end."""
    nodes, weights = masks
    with training_mode(original, False), training_mode(dg.gm, False), torch.no_grad(), \
            module_state_kept(original), _weights_masked(dg.gm, weights):
        reference = _outputs(_masked_whole(original, dg, nodes, inputs, calls), free)
    try:
        with training_mode(pruned, False), torch.no_grad(), module_state_kept(pruned):
            got = _outputs(pruned(*inputs), free)
    except Exception as exc:  # noqa: BLE001 - a pruned model that breaks is the finding, not an error of verify
        first = str(exc).split("\n")[0][:200]
        return (float("inf"),), [f"the pruned model raises {type(exc).__name__}: {first}"]
    if len(reference) != len(got):
        return (float("inf"),), []
    return tuple(_rel(a, b) for a, b in zip(reference, got, strict=True)), []


def _verify_whole(original: nn.Module, pruned: nn.Module, plan: PruningPlan, inputs: tuple, dg: DependencyGraph,
                  masks: tuple[dict, list], rtol: float) -> VerifyResult:
    """The oracle for a partial capture: the whole models' own forwards (eval mode) on the example inputs, the
    original with every part answered by its masked graph; the code between the parts runs as it is."""
    free = default_free_outputs(original)
    errors, notes = _compare_whole(original, dg, masks, pruned, inputs, dg.parts.calls, free)
    worst = max(errors, default=0.0)
    if rtol < worst < float("inf"):  # round-off, or a real difference: float64 tells them apart (see verify)
        try:
            orig64, gm64 = copy.deepcopy((original, dg.gm))  # one memo: the copied graph holds the copied parts
            errors64, _ = _compare_whole(orig64.double(), replace(dg, gm=gm64.double()), masks,
                                         copy.deepcopy(pruned).double(), _double(inputs), _double(dg.parts.calls),
                                         free)
            notes = [f"float32 max relative error {worst:.3g}; recomputed in float64"]
            errors = errors64
        except Exception as exc:  # noqa: BLE001 - a model that cannot run in float64 keeps its float32 result
            notes.append(f"float64 recheck not possible ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    notes.append(f"partial capture: checked end to end through the forwards that were not captured; parts "
                 f"{', '.join(p.path for p in dg.parts.parts)}")
    return _result(original, pruned, plan, inputs, dg, errors, notes, rtol)


def _double(x: Any) -> Any:
    return tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, x)


def verify(
    original: nn.Module,
    pruned: nn.Module,
    plan: PruningPlan,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    rtol: float = 1e-4,
    dg: DependencyGraph | None = None,
    capture: str = "auto",
) -> VerifyResult:
    """Check ``pruned`` against ``original`` (an unpruned copy) masked by ``plan``.

    Both are captured the same way (``capture``, or ``dg``'s): an fx graph, or for a torch.export analysis the ATen
    graph of the pruned model's own forward (so its rewritten attributes are what runs).

    >>> original = copy.deepcopy(model); result = prunefx.prune(model, x, cfg)
    >>> prunefx.verify(original, model, result.plan, x).ok
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    _plugins.activate()
    if dg is not None and not _shares_weights(dg.gm, original):
        raise PlanError("dg must be the analysis of `original` (the unpruned copy), not of the pruned model")
    dg = dg or analyze(original, example_inputs, capture=capture)
    validate_plan(dg, plan, graph_rewrite=True)
    masks = _mask_specs(dg, plan), _inside_specs(dg, plan)
    free = default_free_outputs(original)
    if dg.parts is not None:  # only parts were captured: the whole model is compared end to end
        return _verify_whole(original, pruned, plan, example_inputs, dg, masks, rtol)
    # captured as the analysis was: an export graph runs the pruned model's own forward (rewritten literals)
    if dg.capture == "export":
        gm = export_graph(pruned, example_inputs)
    else:
        gm = trace(pruned, example_inputs, training=dg.training)  # the mode the analysis traced in
    errors, notes = _compare(dg.gm, masks, gm, example_inputs, free, rtol)
    worst = max(errors, default=0.0)
    if rtol < worst < float("inf"):
        # float32 round-off grows with depth: recompute both sides in float64 (on copies) before calling it a
        # mismatch; a real difference stays, round-off drops by ~1e9.
        try:
            errors64, notes64 = _compare(copy.deepcopy(dg.gm).double(), masks, copy.deepcopy(gm).double(),
                                         _double(example_inputs), free, rtol)
            notes = [f"float32 max relative error {worst:.3g}; recomputed in float64", *notes64]
            errors, worst = errors64, max(errors64, default=0.0)
        except Exception as exc:  # noqa: BLE001 - a model that cannot run in float64 keeps its float32 result
            notes.append(f"float64 recheck not possible ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
    return _result(original, pruned, plan, example_inputs, dg, errors, notes, rtol)


def _result(original: nn.Module, pruned: nn.Module, plan: PruningPlan, example_inputs: tuple, dg: DependencyGraph,
            errors: tuple[float, ...], notes: list[str], rtol: float) -> VerifyResult:
    """The verdict on the compared outputs, once the pruned model's own forward has run in both modes."""
    worst = max(errors, default=0.0)
    inexact = tuple(gp.group for gp in plan.pruned if not dg.groups[gp.group].exact)
    runs_eval, runs_train, run_notes = _runs(original, pruned, example_inputs)
    notes.extend(run_notes)
    exact = not inexact
    ok = runs_eval and runs_train and (worst <= rtol if exact else bool(np.isfinite(worst)))
    if not (runs_eval and runs_train):
        msg = "the pruned model does not run (or changes output shapes) in " + (
            "eval and train mode" if not (runs_eval or runs_train) else "eval mode" if not runs_eval else "train mode")
    elif not exact:
        msg = (
            f"not exactly verifiable: groups {list(inexact)} pass through cross-channel ops; max rel. diff {worst:.3g}"
        )
    else:
        msg = f"max relative error {worst:.3g} over {len(errors)} output(s) (rtol {rtol})"
    if notes:
        msg += "; " + "; ".join(notes)
    return VerifyResult(bool(ok), exact, float(worst), errors, inexact, runs_eval, runs_train, msg, tuple(notes))


def _shares_weights(gm: nn.Module, model: nn.Module) -> bool:
    mine = {id(t) for t in model.parameters()}
    return all(id(t) in mine for t in gm.parameters())


def _runs(original: nn.Module, pruned: nn.Module, example_inputs: tuple) -> tuple[bool, bool, list[str]]:
    """The pruned model's own forward works in eval and train mode with the original's output shapes.

    A mode the original itself cannot run in on these inputs (BatchNorm in train mode on one value per channel)
    is not checked, and the returned notes say so.
    """
    results, notes = [], []
    free = default_free_outputs(original)
    for train in (False, True):
        mode = "train" if train else "eval"
        # Train-mode forwards update BatchNorm statistics: buffers are restored afterwards instead of running
        # deep copies (a copy of each model per mode held a 600M-parameter ViT in memory four times).
        with _buffers_restored(original), _buffers_restored(pruned), training_mode(original, train), \
                training_mode(pruned, train), torch.no_grad():
            try:
                oa = _outputs(original(*example_inputs), free)
            except Exception as exc:  # noqa: BLE001 - the original's own failure: nothing to compare with
                notes.append(f"{mode} mode not checked: the original does not run in it on these inputs "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
                results.append(True)
                continue
            try:
                ob = _outputs(pruned(*example_inputs), free)
                results.append(len(oa) == len(ob) and all(x.shape == y.shape for x, y in zip(oa, ob, strict=True)))
            except Exception:  # noqa: BLE001 - any failure of the pruned forward is the finding
                results.append(False)
    return results[0], results[1], notes


@contextlib.contextmanager
def _buffers_restored(model: nn.Module) -> Iterator[None]:
    """Every buffer's values (running stats, step counters) put back as they were when the block ends."""
    saved = []
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                saved.append((module, name, buf, buf.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, buf, value in saved:
                if module._buffers.get(name) is buf and buf.shape == value.shape:
                    buf.copy_(value)  # in place: whatever else holds this tensor sees the old values too
                else:  # the forward replaced the buffer: put the saved values back under its name
                    module._buffers[name] = value
