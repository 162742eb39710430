"""The oracle: a pruned model must equal the original with the pruned channels masked to zero.

The masked run interprets the ORIGINAL model's fx graph and zeroes every pruned channel at every
tensor it appears in (labels from the analysis), and channels that live only inside a leaf module (the heads of
nn.MultiheadAttention) in that module's weights; it shares no code with the rewrite, which slices weights: the
masks are derived here from the plan and the channel classes, independently. Both runs use
the training-mode graph (every layer that learns, e.g. YOLO's raw head outputs) with evaluation semantics
(:class:`prunefx.capture.semantics.EvalInterpreter`: modules in eval mode, BatchNorm on running stats, dropout
and drop-path the identity, random draws replaced by their expectation), under no_grad, so both runs are
deterministic and nothing updates.

Every output is compared, by its path in the output structure (``out['logits'].feats``: tensors, tuples, lists,
dicts, namedtuples, dataclasses, Hugging Face ModelOutputs, nested; :func:`prunefx.analysis.outputs.output_leaves`),
and a comparison that cannot be made is a failure with its reason, never a pass: no tensor to compare, an output
missing on one side, a non-tensor value that differs, NaN/inf weights or outputs (named).

Robust, not just exact: float32 round-off grows with depth (a 200-layer random net drifts ~1e-3 relative), so
outputs beyond ``rtol`` are recomputed in float64 on copies (the float32 a graph names made float64 too) before
anything is called a mismatch, and a recheck that cannot run fails the check, saying so; and outputs downstream of
a discontinuous op (top-k, sort, argmax: a 1e-7 change of its input can swap two indices) are compared at that op:
the pruned run checks its input against the reference's and, when they agree, continues with the reference's
result.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn
from torch.fx.immutable_collections import immutable_dict
from torch.utils._pytree import tree_flatten, tree_map

from prunefx import _plugins
from prunefx.analysis import analyze
from prunefx.analysis.finite import first_non_finite
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.labels import Lab
from prunefx.analysis.outputs import default_free_outputs, output_leaves
from prunefx.capture.inputs import positional
from prunefx.capture.record import Capture
from prunefx.capture.semantics import DISCRETE, EvalInterpreter
from prunefx.capture.torch_export import export_graph
from prunefx.capture.trace import module_state_kept, trace, training_mode
from prunefx.plan import PlanError, PruningPlan, validate_plan

STATES = ("proven", "inexact", "failed")


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify`: ``state`` "proven" (``ok``: every output matched within ``rtol``), "inexact" (a
    pruned group passes through cross-channel statistics, so no exact equality exists; the pruned model runs in both
    modes with finite outputs, and ``max_rel_error`` says how far it moved) or "failed".

    ``ok`` is True only when proven; ``accepted`` also takes an inexact-by-design cut, which ``prunefx.prune``
    returns (labelled). Failed too when some output could not be compared at all (``problems``): nothing compared is
    no pass."""

    ok: bool  # proven equal: state == "proven"
    exact: bool  # False when a pruned group mixes channels in its statistics (LayerNorm, GroupNorm...)
    max_rel_error: float  # NaN when nothing was compared
    errors: tuple[float, ...]  # per output tensor: max |a - b| / max |a|
    inexact_groups: tuple[int, ...]
    runs_eval: bool
    runs_train: bool
    message: str
    notes: tuple[str, ...] = ()  # how it was checked: float64 recheck, replayed discrete ops, modes not checked
    outputs: tuple[str, ...] = ()  # the path of each compared output (``out['logits']``), as ``errors``
    problems: tuple[str, ...] = ()  # why the comparison is incomplete or meaningless; any one fails the check
    state: str = ""  # "proven" | "inexact" | "failed"; unset: from ok (other oracles prove or fail, never inexact)

    def __post_init__(self) -> None:
        if not self.state:  # frozen: set once, here
            object.__setattr__(self, "state", "proven" if self.ok else "failed")
        if self.state not in STATES or self.ok != (self.state == "proven"):
            raise ValueError(f"VerifyResult: state {self.state!r} with ok={self.ok}; state is one of {STATES} and ok "
                             "is True exactly when it is 'proven'")

    @property
    def accepted(self) -> bool:
        """Proven, or inexact by design (nothing exact to prove): what ``prunefx.prune`` may return."""
        return self.state != "failed"

    def headline(self) -> str:
        """One line for a summary: the message, led by the state when it is not a proof."""
        lead = {"proven": "", "inexact": "inexact by design, not proven equal: ", "failed": "FAILED: "}[self.state]
        return lead + self.message


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


@dataclass
class _Scores:
    """Each compared output's path and relative error, and what could not be compared (each one a failure)."""

    names: list[str] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    other_dtype: list[str] = field(default_factory=list)  # outputs not in the dtype the comparison asked for


def _score(reference: Any, got: Any, free: tuple[str, ...], dtype: torch.dtype | None = None) -> _Scores:
    """``got`` against ``reference`` leaf by leaf, matched by path (``output_leaves``, without the ``free`` keys):
    tensors and floats by relative error, other values by equality. ``dtype``: what floating outputs must be."""
    ref, out = dict(output_leaves(reference, free)), dict(output_leaves(got, free))
    s = _Scores()
    missing, extra = [p for p in ref if p not in out], [p for p in out if p not in ref]
    if missing:
        s.problems.append(f"the pruned model's output has no {_names(missing)}, the original's has")
    if extra:
        s.problems.append(f"the pruned model's output has {_names(extra)}, the original's has not")
    for path, a in ref.items():
        if path not in out:
            continue
        b = out[path]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            err = _rel(a, b)
            s.names.append(path)
            s.errors.append(err)
            if not math.isfinite(err):
                s.problems.extend(_non_finite(path, a, b))
            if dtype is not None and any(t.is_floating_point() and t.dtype != dtype for t in (a, b)):
                s.other_dtype.append(f"{path} came out in {a.dtype if a.dtype != dtype else b.dtype}")
        elif isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            s.problems.append(f"{path} is a {_kind(a)} in the original's output and a {_kind(b)} in the pruned model's")
        elif type(a) is float and type(b) is float:  # a Python float (loss.item()) rounds as a tensor does
            s.names.append(path)
            s.errors.append(abs(a - b) / max(abs(a), 1e-12) if a != b else 0.0)
        elif not _same_value(a, b):
            s.problems.append(f"{path} differs and is no tensor to compare ({_short(a)} vs {_short(b)})")
    if not any(isinstance(v, torch.Tensor) for v in ref.values()):
        s.problems.append(
            f"nothing to compare: the original's output {_short(reference)} holds no tensor prunefx can reach; "
            "return tensors, or tuples, lists, dicts, dataclasses or registered pytree types of them, from forward")
    return s


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |a| (over a's finite values); inf when the shapes differ, NaN when either holds NaN."""
    if a.shape != b.shape:
        return float("inf")
    if not a.numel():
        return 0.0
    a, b = a.detach(), b.detach()
    if not all(t.is_floating_point() or t.is_complex() for t in (a, b)):  # indices, masks: equal or not
        return 0.0 if bool((a == b).all()) else float("inf")
    # equal values count as 0: matching infs (a masked -inf logit) are no error, where inf - inf would be NaN
    diff = torch.where(a == b, 0.0, (a - b).abs()).max().item()
    finite = torch.isfinite(a)
    scale = a.abs()[finite].max().item() if bool(finite.any()) else 0.0
    return diff / max(scale, 1e-12)


def _worst(errors: Sequence[float]) -> float:
    """The largest error; NaN when any is NaN (``max`` would skip a NaN that is not first) or none was compared."""
    if not errors or any(math.isnan(e) for e in errors):
        return float("nan")
    return max(errors)


def _non_finite(path: str, a: torch.Tensor, b: torch.Tensor) -> list[str]:
    """The side(s) whose output at ``path`` holds NaN/inf that the other does not match."""
    out = []
    for whose, t in (("the original's (pruned channels zeroed)", a), ("the pruned model's", b)):
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            out.append(f"{path} of {whose} output holds NaN/inf ({bad} of {t.numel()} values), where no relative "
                       "error is defined; check the weights and the example inputs")
    return out


def _names(paths: list[str]) -> str:
    return ", ".join(paths[:4]) + (f" (+{len(paths) - 4})" if len(paths) > 4 else "")


def _kind(x: Any) -> str:
    return "tensor" if isinstance(x, torch.Tensor) else type(x).__name__


def _short(x: Any) -> str:
    text = repr(x) if not isinstance(x, torch.Tensor) else f"tensor{tuple(x.shape)}"
    return text if len(text) <= 60 else text[:57] + "..."


def _same_value(a: Any, b: Any) -> bool:
    """Equal non-tensor leaves; False where ``==`` is not a plain bool (arrays) or raises."""
    if a is b:
        return True
    try:
        same = a == b
        return same if isinstance(same, bool) else bool(np.all(same)) if isinstance(same, np.ndarray) else False
    except Exception:  # noqa: BLE001 - a leaf whose comparison breaks cannot be shown equal
        return False


def _tensors(x: Any, free: tuple[str, ...] = ()) -> list[torch.Tensor]:
    return [t for _, t in output_leaves(x, free) if isinstance(t, torch.Tensor)]


def _shapes(x: Any, free: tuple[str, ...]) -> list[tuple[str, tuple[int, ...]]]:
    return [(p, tuple(t.shape)) for p, t in output_leaves(x, free) if isinstance(t, torch.Tensor)]


def masked_outputs(
    original: nn.Module, dg: DependencyGraph, plan: PruningPlan, example_inputs: Sequence[Any]
) -> list[torch.Tensor]:
    """Outputs of the original model's graph with every pruned channel zeroed wherever it appears."""
    validate_plan(dg, plan, graph_rewrite=True)
    with training_mode(dg.gm, False), torch.no_grad(), _weights_masked(dg.gm, _inside_specs(dg, plan)):
        return _tensors(_EvalGraph(dg.gm, _mask_specs(dg, plan)).run(*example_inputs), default_free_outputs(original))


def _compare(ref_gm: fx.GraphModule, masks: tuple[dict, list], gm: fx.GraphModule, inputs: tuple, free: tuple,
             tol: float, dtype: torch.dtype | None = None) -> tuple[_Scores, list[str]]:
    """Per-output relative errors of ``gm`` against the masked ``ref_gm``, and notes on replayed discrete ops.

    ``masks``: per node the (dim, mask) of removed channels, and the inside weights to zero (``_inside_specs``)."""
    record: list = []
    nodes, weights = masks
    with training_mode(ref_gm, False), torch.no_grad(), _weights_masked(ref_gm, weights):
        reference = _EvalGraph(ref_gm, nodes, record=record).run(*inputs)
    run = _EvalGraph(gm, replay=record, tol=tol)
    try:
        with training_mode(gm, False), torch.no_grad():
            got = run.run(*inputs)
    except Exception as exc:  # noqa: BLE001 - a pruned model that breaks is the finding, not an error of verify
        return _raised(exc), []
    notes = []
    if run.replayed:
        notes.append(f"discontinuous ops compared at their inputs and replayed: {', '.join(run.replayed[:4])}"
                     + (f" (+{len(run.replayed) - 4})" if len(run.replayed) > 4 else ""))
    if run.diverged:
        name, err = run.diverged[0]
        notes.append(f"the input of discontinuous op {name} differs by {err:.3g}")
    return _score(reference, got, free, dtype), notes


def _raised(exc: Exception) -> _Scores:
    first = str(exc).split("\n")[0][:200]
    return _Scores(["out"], [float("inf")], [f"the pruned model raises {type(exc).__name__}: {first}"])


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
                   inputs: tuple, calls: tuple, free: tuple, dtype: torch.dtype | None = None
                   ) -> tuple[_Scores, list[str]]:
    """Per-output relative errors of the pruned model's own forward against the masked original, end to end."""
    nodes, weights = masks
    with training_mode(original, False), training_mode(dg.gm, False), torch.no_grad(), \
            module_state_kept(original), _weights_masked(dg.gm, weights):
        reference = _masked_whole(original, dg, nodes, inputs, calls)
    try:
        with training_mode(pruned, False), torch.no_grad(), module_state_kept(pruned):
            got = pruned(*inputs)
    except Exception as exc:  # noqa: BLE001 - a pruned model that breaks is the finding, not an error of verify
        return _raised(exc), []
    return _score(reference, got, free, dtype), []


def _verify_whole(original: nn.Module, pruned: nn.Module, plan: PruningPlan, inputs: tuple, dg: DependencyGraph,
                  masks: tuple[dict, list], rtol: float, problems: list[str]) -> VerifyResult:
    """The oracle for a partial capture: the whole models' own forwards (eval mode) on the example inputs, the
    original with every part answered by its masked graph; the code between the parts runs as it is."""
    free = default_free_outputs(original)
    scores, notes = _compare_whole(original, dg, masks, pruned, inputs, dg.parts.calls, free)

    def in_float64() -> tuple[_Scores, list[str]]:
        orig64, gm64 = copy.deepcopy((original, dg.gm))  # one memo: the copied graph holds the copied parts
        with _default_dtype(torch.float64):  # tensors the uncaptured code makes without a dtype
            return _compare_whole(orig64.double(), replace(dg, gm=_to_float64(gm64)), masks,
                                  copy.deepcopy(pruned).double(), _double(inputs), _double(dg.parts.calls), free,
                                  torch.float64)

    scores, notes = _recheck(scores, notes, rtol, in_float64, not _inexact(dg, plan))
    notes.append(f"partial capture: checked end to end through the forwards that were not captured; parts "
                 f"{', '.join(p.path for p in dg.parts.parts)}")
    return _result(original, pruned, plan, inputs, dg, scores, notes, rtol, problems)


def _recheck(scores: _Scores, notes: list[str], rtol: float, in_float64: Any, exact: bool
             ) -> tuple[_Scores, list[str]]:
    """The float64 comparison (``in_float64()``) in place of a float32 one whose error exceeds ``rtol``.

    float32 round-off grows with depth: recomputed in float64 (on copies), a real difference stays and round-off
    drops by ~1e9. A recheck that cannot run, or does not run in float64, leaves the float32 error unexplained: a
    problem (the check fails) when the plan is ``exact``, a note otherwise (an inexact plan is judged on finiteness,
    and float32 says that already)."""
    worst = _worst(scores.errors)
    if not rtol < worst < float("inf"):
        return scores, notes
    try:
        scores64, notes64 = in_float64()
    except Exception as exc:  # noqa: BLE001 - the model's own failure in float64 is reported, not raised
        failed = f"failed ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}); make the model run " \
                 "after .double()"
    else:
        if not scores64.other_dtype:
            return scores64, [f"float32 max relative error {worst:.3g}; recomputed in float64", *notes64]
        failed = f"did not run in float64 ({scores64.other_dtype[0]}); make its forward follow the inputs' dtype"
    if not exact:
        return scores, [*notes, f"float64 recheck {failed.split(';')[0]}"]
    scores.problems.append(f"float32 max relative error {worst:.3g} exceeds rtol {rtol} and the float64 recheck "
                           f"that tells round-off from a real difference {failed}, or pass a larger rtol")
    return scores, notes


def _double(x: Any) -> Any:
    return tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, x)


def _to_float64(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` (a copy) in float64: its parameters, buffers and constant tensors, and every float32 its graph names.

    Export graphs and forwards make float32 tensors themselves (``torch.arange(n, dtype=torch.float32)``,
    ``.float()``, ATen's ``_to_copy(x, dtype=torch.float32)``); left alone they would run the recheck in float32
    or fail it on a dtype mismatch. Tensors made without a dtype need :func:`_default_dtype` while it runs."""
    gm.double()
    for n in gm.graph.nodes:
        n.args = fx.node.map_aggregate(n.args, _f64)
        n.kwargs = fx.node.map_aggregate(n.kwargs, _f64)
        if n.op == "call_method" and n.target == "float":
            n.target = "double"
        elif n.op == "get_attr":  # a constant the trace stored as a plain attribute, which .double() skips
            owner, _, name = n.target.rpartition(".")
            try:
                module = gm.get_submodule(owner)
                value = getattr(module, name)
            except AttributeError:  # an attribute of a non-module: nothing .double() would have reached either
                continue
            if isinstance(value, torch.Tensor) and value.dtype == torch.float32 and name not in module._parameters:
                if name in module._buffers:
                    module._buffers[name] = value.double()
                else:
                    setattr(module, name, value.double())
    gm.recompile()
    return gm


def _f64(a: Any) -> Any:
    return torch.float64 if a is torch.float32 else a


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default floating dtype set to ``dtype`` for the block, then put back as it was."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def verify(
    original: nn.Module,
    pruned: nn.Module,
    plan: PruningPlan,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    rtol: float = 1e-4,
    dg: DependencyGraph | None = None,
    capture: Capture = "auto",
) -> VerifyResult:
    """Check ``pruned`` against ``original`` (an unpruned copy) masked by ``plan``.

    Both are captured the same way (``capture``, or ``dg``'s): an fx graph, or for a torch.export analysis the ATen
    graph of the pruned model's own forward (so its rewritten attributes are what runs).

    >>> original = copy.deepcopy(model); result = prunefx.prune(model, x, cfg)
    >>> prunefx.verify(original, model, result.plan, x).ok
    """
    example_inputs = positional(original, example_inputs)
    _plugins.activate()
    if dg is not None and not _shares_weights(dg.gm, original):
        raise PlanError("dg must be the analysis of `original` (the unpruned copy), not of the pruned model")
    dg = dg or analyze(original, example_inputs, capture=capture)
    validate_plan(dg, plan, graph_rewrite=True)
    # NaN/inf weights make every comparison NaN (which reads as "not deterministic"): name the tensor instead
    problems = [p for p in (_non_finite_state(original, "the original"), _non_finite_state(pruned, "the pruned model"))
                if p]
    masks = _mask_specs(dg, plan), _inside_specs(dg, plan)
    free = default_free_outputs(original)
    if dg.parts is not None:  # only parts were captured: the whole model is compared end to end
        return _verify_whole(original, pruned, plan, example_inputs, dg, masks, rtol, problems)
    # captured as the analysis was: an export graph runs the pruned model's own forward (rewritten literals)
    if dg.capture == "export":
        gm = export_graph(pruned, example_inputs)
    else:
        gm = trace(pruned, example_inputs, training=dg.training)  # the mode the analysis traced in
    scores, notes = _compare(dg.gm, masks, gm, example_inputs, free, rtol)

    def in_float64() -> tuple[_Scores, list[str]]:
        with _default_dtype(torch.float64):  # tensors the forward makes without a dtype (torch.ones(n))
            return _compare(_to_float64(copy.deepcopy(dg.gm)), masks, _to_float64(copy.deepcopy(gm)),
                            _double(example_inputs), free, rtol, torch.float64)

    scores, notes = _recheck(scores, notes, rtol, in_float64, not _inexact(dg, plan))
    return _result(original, pruned, plan, example_inputs, dg, scores, notes, rtol, problems)


def _non_finite_state(model: nn.Module, whose: str) -> str | None:
    """A line naming the first tensor of ``model`` whose NaN/inf makes its outputs compare to nothing; None if none."""
    bad = first_non_finite(model)
    return None if bad is None else (
        f"{bad.replace(' holds', f' of {whose} holds', 1)}, so its outputs compare to nothing; load finite weights "
        "(a checkpoint from before training diverged) and prune again")


def _result(original: nn.Module, pruned: nn.Module, plan: PruningPlan, example_inputs: tuple, dg: DependencyGraph,
            scores: _Scores, notes: list[str], rtol: float, problems: list[str]) -> VerifyResult:
    """The verdict on the compared outputs, once the pruned model's own forward has run in both modes."""
    worst = _worst(scores.errors)
    problems = [*problems, *scores.problems]
    inexact = _inexact(dg, plan)
    runs_eval, runs_train, run_notes = _runs(original, pruned, example_inputs)
    notes.extend(run_notes)
    exact = not inexact
    passed = runs_eval and runs_train and not problems and (worst <= rtol if exact else math.isfinite(worst))
    state = "failed" if not passed else "proven" if exact else "inexact"
    if not (runs_eval and runs_train):
        msg = "the pruned model does not run (or changes output shapes) in " + (
            "eval and train mode" if not (runs_eval or runs_train) else "eval mode" if not runs_eval else "train mode")
    elif not exact:
        msg = (f"not exactly verifiable: groups {list(inexact)} pass through cross-channel ops (LayerNorm, "
               f"GroupNorm...); max rel. diff {worst:.3g} from the masked original")
    else:
        at = f" at {scores.names[scores.errors.index(worst)]}" if worst > rtol and worst in scores.errors else ""
        msg = f"max relative error {worst:.3g}{at} over {len(scores.errors)} output(s) (rtol {rtol})"
    if problems:  # first: they say why the numbers after them prove nothing
        msg = "not verified: " + "; ".join(problems) + "; " + msg
    if notes:
        msg += "; " + "; ".join(notes)
    return VerifyResult(state == "proven", exact, float(worst), tuple(scores.errors), inexact, runs_eval, runs_train,
                        msg, tuple(notes), tuple(scores.names), tuple(problems), state)


def _inexact(dg: DependencyGraph, plan: PruningPlan) -> tuple[int, ...]:
    """The pruned groups that pass through cross-channel statistics (LayerNorm...): no exact equality to check."""
    return tuple(gp.group for gp in plan.pruned if not dg.groups[gp.group].exact)


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
                oa = _shapes(original(*example_inputs), free)
            except Exception as exc:  # noqa: BLE001 - the original's own failure: nothing to compare with
                notes.append(f"{mode} mode not checked: the original does not run in it on these inputs "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
                results.append(True)
                continue
            try:
                results.append(oa == _shapes(pruned(*example_inputs), free))
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
