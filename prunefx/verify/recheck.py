"""The float64 recheck: outputs beyond the tolerance recomputed in float64 on copies before a mismatch is called."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx as fx
from torch.utils._pytree import tree_map

from prunefx.verify.compare import Comparison, max_error


def recheck(scores: Comparison, notes: list[str], rtol: float, in_float64: Any, exact: bool
             ) -> tuple[Comparison, list[str]]:
    """The float64 comparison (``in_float64()``) in place of a float32 one whose error exceeds ``rtol``.

    float32 round-off grows with depth: recomputed in float64 (on copies), a real difference stays and round-off
    drops by ~1e9. A recheck that cannot run, or does not run in float64, leaves the float32 error unexplained: a
    problem (the check fails) when the plan is ``exact``, a note otherwise (an inexact plan is judged on finiteness,
    and float32 says that already)."""
    largest = max_error(scores.errors)
    if not rtol < largest < float("inf"):
        return scores, notes
    try:
        scores64, notes64 = in_float64()
    except Exception as exc:  # noqa: BLE001 - the model's own failure in float64 is reported, not raised
        failed = f"failed ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}); make the model run " \
                 "after .double()"
    else:
        if not scores64.other_dtype:
            return scores64, [f"float32 max relative error {largest:.3g}; recomputed in float64", *notes64]
        failed = f"did not run in float64 ({scores64.other_dtype[0]}); make its forward follow the inputs' dtype"
    if not exact:
        return scores, [*notes, f"float64 recheck {failed.split(';')[0]}"]
    scores.problems.append(f"float32 max relative error {largest:.3g} exceeds rtol {rtol} and the float64 recheck "
                           f"that tells round-off from a real difference {failed}, or pass a larger rtol")
    return scores, notes


def to_double(x: Any) -> Any:
    return tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, x)


def to_float64(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` (a copy) in float64: its parameters, buffers and constant tensors, and every float32 its graph names.

    Export graphs and forwards make float32 tensors themselves (``torch.arange(n, dtype=torch.float32)``,
    ``.float()``, ATen's ``_to_copy(x, dtype=torch.float32)``); left alone they would run the recheck in float32
    or fail it on a dtype mismatch. Tensors made without a dtype need :func:`default_dtype` while it runs."""
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
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """torch's default floating dtype set to ``dtype`` for the block, then put back as it was."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


__all__ = ["default_dtype", "recheck", "to_double", "to_float64"]
