"""Count MACs/FLOPs, parameters and serialized size of one forward pass.

Conventions (also in ``CONVENTIONS``, which reports copy verbatim):

* 1 MAC is one multiply-accumulate; **FLOPs = 2 x MACs** everywhere in prunefx.
* Convolutions, linear layers (mm/addmm/bmm/baddbmm) and scaled-dot-product attention are counted
  by ``torch.utils.flop_counter.FlopCounterMode``: a conv costs out.numel() x Cin/groups x prod(kernel)
  MACs, bias ignored; attention costs the two batched products QK^T and AV (causal masks not discounted).
* Normalisations, which FlopCounterMode leaves out, are added here, in MACs per input element:
  batch norm with running statistics (inference) is one per-channel scale-and-shift, **1**;
  a norm that computes statistics on the fly (layer/group/instance norm, batch norm in training)
  costs **2** for mean and variance plus **1** to apply the per-channel scale and shift, **3**;
  layer norm's elementwise affine varies inside the normalised group, so it cannot be folded into
  that scale and adds **1** more (4).
* Everything else (activations, pooling, elementwise adds, softmax, RMSNorm's decomposed ops...)
  is not counted and listed in ``Measurement.uncounted``, except pure data movement (views, cat,
  copies, indexing, tensor creation), which costs no arithmetic.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from .common import MetricsError, as_args, check_model, input_shapes, rejected, untouched

aten = torch.ops.aten

CONVENTIONS = {
    "flops": "FLOPs = 2 x MACs (one multiply-accumulate = 2 floating-point operations)",
    "counted": "convolution, linear/matmul and scaled-dot-product attention via torch FlopCounterMode "
    "(conv: out.numel() x Cin/groups x prod(kernel) MACs, bias ignored)",
    "norms": "MACs per input element: batch norm with running stats 1; layer/group/instance norm and "
    "training-mode batch norm 3 (2 for mean and variance, 1 for scale-and-shift); layer norm's "
    "elementwise affine +1",
    "not_counted": "activations, pooling, elementwise arithmetic, softmax (listed as uncounted ops)",
}

# Ops that move or create data without arithmetic; seeing them is not a gap in the count.
_FREE_OPS = frozenset(
    {
        aten.cat, aten.stack, aten.clone, aten.contiguous, aten.copy_, aten._to_copy, aten.to,
        aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
        aten.zeros, aten.zeros_like, aten.new_zeros, aten.ones, aten.ones_like, aten.new_ones,
        aten.full, aten.full_like, aten.new_full, aten.fill_, aten.zero_, aten.arange, aten.scalar_tensor,
        aten.lift_fresh, aten.lift_fresh_copy, aten.detach, aten.alias, aten.repeat, aten.expand_copy,
        aten.index, aten.index_select, aten.gather, aten.select_scatter, aten.slice_scatter,
        aten.constant_pad_nd, aten.flip, aten.roll, aten.upsample_nearest1d, aten.upsample_nearest2d,
        aten.upsample_nearest3d, aten._unsafe_view, aten.split_with_sizes, aten.unbind, aten.t,
        aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle, aten.native_channel_shuffle,
    }
)


def _per_element(macs_per_element: Callable[..., int]) -> Callable[..., int]:
    """Turn a MACs-per-input-element rule into a FlopCounterMode formula (FLOPs, input shape first)."""

    def formula(input_shape: torch.Size, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return 2 * input_shape.numel() * macs_per_element(*args, **kwargs)

    return formula


def _batch_norm(weight: Any, bias: Any, mean: Any, var: Any, training: bool, *rest: Any) -> int:
    return 3 if training else 1


def _layer_norm(normalized_shape: Any, weight: Any, *rest: Any) -> int:
    return 4 if weight is not None else 3


# FlopCounterMode's custom_mapping takes formulas over shapes, returning FLOPs.
_NORM_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._native_batch_norm_legit_no_training: _per_element(lambda *a, **k: 1),
    aten._native_batch_norm_legit: _per_element(lambda *a, **k: 3),  # training or no running stats
    aten.native_batch_norm: _per_element(_batch_norm),
    aten.native_layer_norm: _per_element(_layer_norm),
    aten.native_group_norm: _per_element(lambda *a, **k: 3),
}


def _cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    # The CPU flash kernel is missing from FlopCounterMode's registry, so on real CPU tensors
    # attention would count as zero; it computes the same QK^T and AV products as the CUDA kernels.
    return sdpa_flop_count(query, key, value)


_ATTENTION_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
}


@dataclass(frozen=True)
class Measurement:
    """Cost of one forward pass: MACs (FLOPs = 2 x MACs), breakdowns, parameters and size."""

    macs: int
    params: int  # parameter elements, shared parameters counted once
    buffers: int  # buffer elements (BatchNorm running stats, ...)
    size_bytes: int  # len(torch.save(model.state_dict()))
    per_module: dict[str, int] = field(hash=False)  # module name -> MACs (see measure()'s ``by``)
    per_op: dict[str, int] = field(hash=False)  # aten op -> MACs
    uncounted: tuple[str, ...]  # aten ops that ran without a formula and are not pure data movement
    input_shapes: tuple[tuple[int, ...], ...]
    ran_on: str  # "meta" when shapes alone sufficed, else the device of the real forward

    @property
    def flops(self) -> int:
        """2 x MACs."""
        return 2 * self.macs

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; ``macs`` and ``flops`` (= 2 x macs) are both spelled out."""
        return {
            "macs": self.macs,
            "flops": self.flops,
            "params": self.params,
            "buffers": self.buffers,
            "size_bytes": self.size_bytes,
            "per_module_macs": dict(self.per_module),
            "per_op_macs": dict(self.per_op),
            "uncounted_ops": list(self.uncounted),
            "input_shapes": [list(s) for s in self.input_shapes],
            "ran_on": self.ran_on,
        }


class _OpRecorder(TorchDispatchMode):
    """Record the packet of every aten op that actually executes."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[Any] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.add(func._overloadpacket)
        return func(*args, **(kwargs or {}))


def _is_free(op: Any) -> bool:
    return op in _FREE_OPS or any(o.is_view for o in (getattr(op, n) for n in op.overloads()))


def _count(model: nn.Module, run: Callable[[], Any]) -> tuple[FlopCounterMode, set[Any]]:
    counter = FlopCounterMode(display=False, custom_mapping={**_NORM_FORMULAS, **_ATTENTION_FORMULAS})
    recorder = _OpRecorder()
    # The recorder is entered first so it sits below the counter: it sees the ops the counter
    # finally executes, after the counter's own decompositions.
    with untouched(model), torch.no_grad(), recorder, counter:
        run()
    return counter, recorder.seen


def _meta_run(model: nn.Module, args: tuple[Any, ...]) -> Callable[[], Any]:
    # functional_call swaps parameters and buffers for meta stand-ins only for the call, so nothing is
    # computed or allocated and the real running statistics cannot move.
    state = {
        name: t.to("meta")
        for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False))
    }
    meta_args = tree_map_only(torch.Tensor, lambda t: t.to("meta"), args)
    return lambda: torch.func.functional_call(model, state, meta_args, strict=False, tie_weights=True)


def _device_of(model: nn.Module, args: tuple[Any, ...]) -> str:
    for t in (*model.parameters(), *model.buffers(), *(a for a in args if isinstance(a, torch.Tensor))):
        return str(t.device)
    return "cpu"


def _serialized_size(model: nn.Module) -> int:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes


def _module_breakdown(
    counts: Mapping[str, Mapping[Any, int]], model: nn.Module, by: Literal["module", "leaf"]
) -> dict[str, int]:
    # FlopCounterMode names modules "<RootClass>.<fqn>"; strip the root so names match named_modules().
    prefix = type(model).__name__ + "."
    modules = dict(model.named_modules())
    out = {}
    for name, ops in counts.items():
        if not name.startswith(prefix):
            continue  # "Global" and the root itself: that is the total
        fqn = name[len(prefix) :]
        if by == "leaf" and fqn in modules and any(True for _ in modules[fqn].children()):
            continue
        out[fqn] = sum(ops.values()) // 2
    return out


def measure(
    model: nn.Module,
    example_inputs: Any,
    *,
    by: Literal["module", "leaf"] = "module",
    use_meta: bool = True,
) -> Measurement:
    """Count MACs (FLOPs = 2 x MACs), parameters, buffers and state_dict size of ``model(*example_inputs)``.

    The forward runs in eval mode under ``torch.no_grad``; training flags, BatchNorm statistics and any
    attribute the forward caches are restored afterwards. With ``use_meta`` it first runs on meta
    tensors (shapes only, no compute) and falls back to a real forward if an op has no meta kernel.
    ``by="module"`` keys ``per_module`` by every module that ran, each including its children;
    ``by="leaf"`` keeps only modules without children.

    >>> m = measure(torchvision.models.resnet50(), torch.randn(1, 3, 224, 224))
    >>> m.macs / 1e9, m.flops / 1e9  # ~4.1 GMACs, ~8.2 GFLOPs
    """
    check_model(model, "measure")
    if by not in ("module", "leaf"):
        raise MetricsError(f"by must be 'module' or 'leaf', got {by!r}.")
    args = as_args(example_inputs)
    counter = seen = None
    ran_on = "meta"
    if use_meta:
        try:
            counter, seen = _count(model, _meta_run(model, args))
        except Exception:  # noqa: BLE001 - no meta kernel or data-dependent shapes: count on a real forward
            counter = None
    if counter is None:
        ran_on = _device_of(model, args)
        try:
            counter, seen = _count(model, lambda: model(*args))
        except Exception as exc:  # noqa: BLE001 - any failure of the user's forward is a bad-input error
            raise rejected(exc, args) from exc
    assert seen is not None
    counts = counter.get_flop_counts()
    per_op = {str(op): flops // 2 for op, flops in counts.get("Global", {}).items()}
    registry = counter.flop_registry
    return Measurement(
        macs=sum(per_op.values()),
        params=sum(p.numel() for p in model.parameters()),
        buffers=sum(b.numel() for b in model.buffers()),
        size_bytes=_serialized_size(model),
        per_module=_module_breakdown(counts, model, by),
        per_op=per_op,
        uncounted=tuple(sorted(str(op) for op in seen if op not in registry and not _is_free(op))),
        input_shapes=input_shapes(args),
        ran_on=ran_on,
    )
