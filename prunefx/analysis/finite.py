"""Non-finite model state: the first parameter or buffer whose NaN/inf would make scores and the check meaningless."""

from __future__ import annotations

import torch
from torch import nn

from prunefx.errors import PrunefxError


def first_non_finite(model: nn.Module) -> str | None:
    """``"parameter 'name' holds NaN (k of n values)"`` for the first bad tensor of ``model``; None if none.

    A parameter may hold neither NaN nor inf. A buffer may hold inf on purpose (a causal mask filled with -inf, as in
    Whisper's decoder), except a norm's running statistics; NaN in any buffer is a corrupt statistic."""
    tensors = _valued(model)
    if not _any_bad(tensors):
        return None
    for kind, name, t, inf_is_bad in tensors:  # rare: name the first bad tensor, exactly
        with torch.no_grad():
            good = torch.isfinite(t.detach()) if inf_is_bad else ~torch.isnan(t.detach())
            if bool(good.all()):
                continue
            nan = int(torch.isnan(t.detach()).sum())
        bad = t.numel() - int(good.sum())
        what = "NaN" if nan == bad else "inf" if nan == 0 else "NaN and inf"
        return f"{kind} {name!r} holds {what} ({bad} of {t.numel()} values)"
    return None


def _valued(model: nn.Module) -> list[tuple[str, str, torch.Tensor, bool]]:
    """(kind, name, tensor, inf is bad) for every parameter and buffer that holds floating values."""
    norms = {n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._NormBase)}
    tensors = [("parameter", n, t, True) for n, t in model.named_parameters()]
    tensors += [("buffer", n, t, n.rpartition(".")[0] in norms) for n, t in model.named_buffers()]
    # meta and lazy (not yet shaped) tensors hold no values; integer tensors (num_batches_tracked) cannot be NaN
    return [x for x in tensors if not (nn.parameter.is_lazy(x[2]) or x[2].device.type == "meta"
                                       or x[2].layout != torch.strided
                                       or not (x[2].is_floating_point() or x[2].is_complex()))]


def _any_bad(tensors: list[tuple[str, str, torch.Tensor, bool]]) -> bool:
    """Whether any tensor holds a bad value: one read of each (its largest magnitude, where NaN and inf propagate
    and nothing overflows), batched per device and dtype, on one thread.

    The scan is memory-bound: a second thread buys little when idle and, with another job on the cores, makes
    each tensor's parallel region wait for a busy core (ViT-B/16: 2 s with two threads against 0.2 s idle)."""
    batches: dict[tuple[torch.device, torch.dtype, bool], list[torch.Tensor]] = {}
    for _, _, t, inf_is_bad in tensors:
        if t.numel():
            batches.setdefault((t.device, t.dtype, inf_is_bad), []).append(t.detach())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for (_, dtype, inf_is_bad), group in batches.items():
                if dtype.is_complex:
                    group = [torch.view_as_real(t) for t in group]
                peaks = torch.stack(torch._foreach_norm(group, float("inf")))
                if not bool((peaks.isfinite() if inf_is_bad else ~peaks.isnan()).all()):
                    return True
    finally:
        torch.set_num_threads(threads)
    return False


def check_finite(model: nn.Module) -> None:
    """Raise :class:`PrunefxError` naming the first parameter or buffer of ``model`` that holds a bad NaN or inf."""
    bad = first_non_finite(model)
    if bad:
        raise PrunefxError(
            f"{type(model).__name__} {bad}: its channel scores and the pruned model's check would be meaningless; "
            "load weights saved before training diverged, or re-initialise that tensor, first"
        )
