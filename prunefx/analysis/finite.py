"""Non-finite model state: the first parameter or buffer whose NaN/inf would make scores and the check meaningless."""

from __future__ import annotations

import torch
from torch import nn

from prunefx.errors import PrunefxError


def first_non_finite(model: nn.Module) -> str | None:
    """``"parameter 'name' holds NaN (k of n values)"`` for the first bad tensor of ``model``; None if none.

    A parameter may hold neither NaN nor inf. A buffer may hold inf on purpose (a causal mask filled with -inf, as in
    Whisper's decoder), except a norm's running statistics; NaN in any buffer is a corrupt statistic."""
    norms = {n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._NormBase)}
    tensors = [("parameter", n, t, True) for n, t in model.named_parameters()]
    tensors += [("buffer", n, t, n.rpartition(".")[0] in norms) for n, t in model.named_buffers()]
    for kind, name, t, inf_is_bad in tensors:
        # meta and lazy (not yet shaped) tensors hold no values; integer tensors (num_batches_tracked) cannot be NaN
        if nn.parameter.is_lazy(t) or t.device.type == "meta" or t.layout != torch.strided or not (
            t.is_floating_point() or t.is_complex()
        ):
            continue
        with torch.no_grad():
            good = torch.isfinite(t.detach()) if inf_is_bad else ~torch.isnan(t.detach())
            if bool(good.all()):
                continue
            nan = int(torch.isnan(t.detach()).sum())
        bad = t.numel() - int(good.sum())
        what = "NaN" if nan == bad else "inf" if nan == 0 else "NaN and inf"
        return f"{kind} {name!r} holds {what} ({bad} of {t.numel()} values)"
    return None


def check_finite(model: nn.Module) -> None:
    """Raise :class:`PrunefxError` naming the first parameter or buffer of ``model`` that holds a bad NaN or inf."""
    bad = first_non_finite(model)
    if bad:
        raise PrunefxError(
            f"{type(model).__name__} {bad}: its channel scores and the pruned model's check would be meaningless; "
            "load weights saved before training diverged, or re-initialise that tensor, first"
        )
