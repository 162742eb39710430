"""The oracle: a pruned model must equal the original with the pruned channels masked to zero.

The masked run interprets the ORIGINAL model's fx graph and zeroes every pruned channel at every
tensor it appears in (labels from the analysis); it shares no code with the rewrite, which slices
weights: the masks are derived here from the plan and the channel classes, independently. Both runs use
the training-mode graph (every layer that learns, e.g. YOLO's raw head outputs) with modules in eval mode
under no_grad, so BatchNorm uses running stats and nothing updates.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch import nn
from torch.utils._pytree import tree_flatten

from prunefx import _plugins
from prunefx.analysis import analyze
from prunefx.analysis.graph import DependencyGraph
from prunefx.analysis.labels import Lab
from prunefx.analysis.outputs import default_free_outputs, drop_keys
from prunefx.analysis.rules import TRAIN_ONLY
from prunefx.capture.trace import trace, training_mode
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


class _EvalGraph(fx.Interpreter):
    """Runs a training-mode graph with eval semantics, optionally zeroing pruned channels after each node."""

    def __init__(self, gm: fx.GraphModule, masks: dict[str, Any] | None = None) -> None:
        super().__init__(gm)
        self.masks = masks or {}

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        if target in TRAIN_ONLY:  # training=True baked into the trace: eval semantics here
            return args[0] if args else kwargs["input"]
        return super().call_function(target, args, kwargs)

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        spec = self.masks.get(n.name)
        return _apply(out, spec) if spec is not None else out


def _apply(out: Any, spec: Any) -> Any:
    if isinstance(out, torch.Tensor):
        for dim, mask in spec:
            shape = [1] * out.dim()
            shape[dim] = -1
            out = out * mask.to(out.dtype).view(shape)
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
    with training_mode(dg.gm, False), torch.no_grad():
        return _outputs(_EvalGraph(dg.gm, _mask_specs(dg, plan)).run(*example_inputs), default_free_outputs(original))


def verify(
    original: nn.Module,
    pruned: nn.Module,
    plan: PruningPlan,
    example_inputs: Sequence[Any] | torch.Tensor,
    *,
    rtol: float = 1e-4,
    dg: DependencyGraph | None = None,
) -> VerifyResult:
    """Check ``pruned`` against ``original`` (an unpruned copy) masked by ``plan``.

    >>> original = copy.deepcopy(model); result = prunefx.prune(model, x, cfg)
    >>> prunefx.verify(original, model, result.plan, x).ok
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    _plugins.activate()
    if dg is not None and not _shares_weights(dg.gm, original):
        raise PlanError("dg must be the analysis of `original` (the unpruned copy), not of the pruned model")
    dg = dg or analyze(original, example_inputs)
    reference = masked_outputs(original, dg, plan, example_inputs)
    gm = trace(pruned, example_inputs, training=True)
    with training_mode(gm, False), torch.no_grad():
        got = _outputs(_EvalGraph(gm).run(*example_inputs), default_free_outputs(original))
    if len(reference) == len(got):
        errors = tuple(_rel(a, b) for a, b in zip(reference, got, strict=True))
    else:
        errors = (float("inf"),)
    inexact = tuple(gp.group for gp in plan.pruned if not dg.groups[gp.group].exact)
    runs_eval, runs_train, notes = _runs(original, pruned, example_inputs)
    worst = max(errors, default=0.0)
    exact = not inexact
    ok = runs_eval and runs_train and (worst <= rtol if exact else np.isfinite(worst))
    if not (runs_eval and runs_train):
        msg = "the pruned model does not run (or changes output shapes) in eval or train mode"
    elif not exact:
        msg = (
            f"not exactly verifiable: groups {list(inexact)} pass through cross-channel ops; max rel. diff {worst:.3g}"
        )
    else:
        msg = f"max relative error {worst:.3g} over {len(errors)} output(s) (rtol {rtol})"
    msg = "; ".join([msg, *notes])
    return VerifyResult(bool(ok), exact, float(worst), errors, inexact, runs_eval, runs_train, msg)


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
