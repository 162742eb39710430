"""Output comparison shared by every oracle: outputs matched by path, relative errors, what could not be compared."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten

from prunefx.analysis.outputs import output_leaves


def same_structure(a: Any, b: Any) -> bool:
    fa, fb = tree_flatten(a)[0], tree_flatten(b)[0]
    return len(fa) == len(fb) and all(
        (x.shape == y.shape and x.dtype == y.dtype) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
        else type(x) is type(y) for x, y in zip(fa, fb, strict=True)
    )


def same_values(a: Any, b: Any) -> bool:
    fa, fb = tree_flatten(a)[0], tree_flatten(b)[0]
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(fa, fb, strict=True))


@dataclass
class Comparison:
    """Each compared output's path and relative error, and what could not be compared (each one a failure)."""

    names: list[str] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    other_dtype: list[str] = field(default_factory=list)  # outputs not in the dtype the comparison asked for


def compare_outputs(reference: Any, got: Any, free: tuple[str, ...], dtype: torch.dtype | None = None) -> Comparison:
    """``got`` against ``reference`` leaf by leaf, matched by path (``output_leaves``, without the ``free`` keys):
    tensors and floats by relative error, other values by equality. ``dtype``: what floating outputs must be."""
    ref, out = dict(output_leaves(reference, free)), dict(output_leaves(got, free))
    s = Comparison()
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
            err = rel_error(a, b)
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


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
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


def max_error(errors: Sequence[float]) -> float:
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


def output_tensors(x: Any, free: tuple[str, ...] = ()) -> list[torch.Tensor]:
    return [t for _, t in output_leaves(x, free) if isinstance(t, torch.Tensor)]


def output_shapes(x: Any, free: tuple[str, ...]) -> list[tuple[str, tuple[int, ...]]]:
    return [(p, tuple(t.shape)) for p, t in output_leaves(x, free) if isinstance(t, torch.Tensor)]


def raised(exc: Exception) -> Comparison:
    first = str(exc).split("\n")[0][:200]
    return Comparison(["out"], [float("inf")], [f"the pruned model raises {type(exc).__name__}: {first}"])


__all__ = ["compare_outputs", "Comparison", "max_error", "output_shapes", "output_tensors", "raised", "rel_error",
           "same_structure", "same_values"]
