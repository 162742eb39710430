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
* Fused inference kernels FlopCounterMode does not know are added with the same products, so the
  count does not depend on which kernel ran: CPU flash attention, nn.MultiheadAttention's and
  nn.TransformerEncoderLayer's fast paths (projections, QK^T, AV, feed-forward, layer norms).
* Everything else (activations, pooling, elementwise adds, softmax, RMSNorm's decomposed ops...)
  is not counted and listed in ``Measurement.uncounted``, except pure data movement (views, cat,
  copies, indexing, tensor creation), which costs no arithmetic.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from prunefx._registry import put
from prunefx.metrics.common import MetricsError, as_args, check_model, input_shapes, meta_forward, rejected, untouched

aten = torch.ops.aten

CONVENTIONS = {
    "flops": "FLOPs = 2 x MACs (one multiply-accumulate = 2 floating-point operations)",
    "counted": "convolution, linear/matmul and scaled-dot-product attention via torch FlopCounterMode "
    "(conv: out.numel() x Cin/groups x prod(kernel) MACs, bias ignored), plus the fused CPU attention "
    "and transformer fast-path kernels it misses, counted as the same products",
    "norms": "MACs per input element: batch norm with running stats 1; layer/group/instance norm and "
    "training-mode batch norm 3 (2 for mean and variance, 1 for scale-and-shift); layer norm's "
    "elementwise affine +1",
    "not_counted": "activations, pooling, elementwise arithmetic, softmax (listed as uncounted ops)",
}

# Ops that move, copy or create data without arithmetic (views are recognised by their schema);
# seeing them is not a gap in the count.
_FREE_OPS = frozenset(
    {
        aten.cat, aten.stack, aten.clone, aten.copy_, aten._to_copy, aten._unsafe_view, aten.expand_copy,
        aten.repeat, aten.flip, aten.roll, aten.constant_pad_nd, aten.index, aten._unsafe_index,
        aten.index_select, aten.gather, aten.select_scatter, aten.slice_scatter, aten._local_scalar_dense,
        aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d,
        aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle, aten.native_channel_shuffle,
        aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
        aten.zeros, aten.zeros_like, aten.new_zeros, aten.ones, aten.ones_like, aten.new_ones,
        aten.full, aten.full_like, aten.new_full, aten.fill_, aten.zero_, aten.arange, aten.scalar_tensor,
        aten.lift_fresh_copy,
    }
)


def _per_element(macs_per_element: Callable[..., int]) -> Callable[..., int]:
    """Turn a MACs-per-input-element rule into a FlopCounterMode formula (FLOPs, input shape first)."""

    def formula(input_shape: torch.Size, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        return 2 * input_shape.numel() * macs_per_element(*args, **kwargs)

    return formula


def _batch_norm(weight: Any, bias: Any, *rest: Any) -> int:
    # rest is (running_mean, running_var, training, momentum, eps), or (training, momentum, eps) for
    # the no_stats overload, which has no running statistics and so always computes them.
    uses_running_stats = len(rest) == 5 and not rest[2]
    return 1 if uses_running_stats else 3


def _layer_norm(normalized_shape: Any, weight: Any, *rest: Any) -> int:
    return 4 if weight is not None else 3


# FlopCounterMode's custom_mapping takes formulas over shapes, returning FLOPs.
_NORM_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._native_batch_norm_legit_no_training: _per_element(lambda *a, **k: 1),
    aten._native_batch_norm_legit: _per_element(_batch_norm),
    aten.native_batch_norm: _per_element(_batch_norm),
    aten.native_layer_norm: _per_element(_layer_norm),
    aten.native_group_norm: _per_element(lambda *a, **k: 3),
}


def _cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    # The CPU flash kernel is missing from FlopCounterMode's registry, so on real CPU tensors
    # attention would count as zero; it computes the same QK^T and AV products as the CUDA kernels.
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _attention_macs(query: torch.Size, key: torch.Size) -> int:
    """MACs of self/cross attention with fused projections: Q, K, V and output projections, QK^T and AV."""
    *batch, tgt, embed = query
    src = key[-2]
    return math.prod(batch) * (2 * tgt * embed * embed + 2 * src * embed * embed + 2 * tgt * src * embed)


def _native_mha(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    # nn.MultiheadAttention's inference fast path (eval, no_grad, batch_first) runs as this one
    # fused op, which FlopCounterMode does not know; the slow path's mm/bmm give the same count.
    return 2 * _attention_macs(query, key)


def _native_encoder_layer(
    src: torch.Size, embed_dim: int, num_heads: int, qkv_weight: Any, qkv_bias: Any, proj_weight: Any,
    proj_bias: Any, use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: Any, norm_bias_1: Any,
    norm_weight_2: Any, norm_bias_2: Any, ffn_weight_1: torch.Size, *args: Any, out_shape: Any = None, **kwargs: Any,
) -> int:
    # nn.TransformerEncoderLayer's inference fast path fuses attention, both layer norms (elementwise
    # affine: 4 MACs per element each) and the feed-forward block into this one op.
    hidden, embed = ffn_weight_1
    ffn = 2 * math.prod(src[:-1]) * hidden * embed
    return 2 * (_attention_macs(src, src) + ffn + 2 * 4 * src.numel())


def grouped_mm_flops(mat_a: Any, mat_b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """FLOPs of ``torch._grouped_mm``: every output element is a K-long dot product; a 2-D x 2-D call groups K,
    so its G outputs of (M, N) together sum one M x N x K product."""
    k = mat_a[-1]
    out = math.prod(out_shape) if len(mat_a) != 2 or len(mat_b) != 2 else math.prod(out_shape[-2:])
    return 2 * out * k


_ATTENTION_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa,
    aten._native_multi_head_attention: _native_mha,
    aten._transformer_encoder_layer_fwd: _native_encoder_layer,
    aten._grouped_mm: grouped_mm_flops,  # a mixture of experts' dispatch; FlopCounterMode has no formula for it
}
_REGISTERED: dict[Any, Callable[..., int]] = {}  # register_flops: a library's own ops


def register_flops(op: Any, formula: Callable[..., int], *, replace: bool = False) -> None:
    """Count ``op`` (an op overload packet) with ``formula(*arg shapes, out_shape=..., **kwargs) -> FLOPs``, as
    FlopCounterMode's ``custom_mapping`` takes it (a library's custom op that runs opaque to the counter)."""
    put(_REGISTERED, op, formula, what="register_flops", replace=replace)


@dataclass(frozen=True)
class Measurement:
    """Cost of one forward pass: MACs (FLOPs = 2 x MACs), breakdowns, parameters and size."""

    macs: int
    params: int  # parameter elements, shared parameters counted once
    buffers: int  # buffer elements (BatchNorm running stats, ...)
    size_bytes: int | None  # len(torch.save(model.state_dict())); None for a model on the meta device
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


def _count(model: nn.Module, run: Callable[[], Any]) -> tuple[Any, set[Any]]:
    # Imported here: torch.utils.flop_counter pulls in triton (~1 s), which `import prunefx` should not pay.
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping={**_NORM_FORMULAS, **_ATTENTION_FORMULAS, **_REGISTERED})
    recorder = _OpRecorder()
    # The recorder is entered first so it sits below the counter: it sees the ops the counter
    # finally executes, after the counter's own decompositions.
    with untouched(model), torch.no_grad(), recorder, counter:
        run()
    return counter, recorder.seen


def _device_of(model: nn.Module, args: tuple[Any, ...]) -> str:
    for t in (*model.parameters(), *model.buffers(), *tree_flatten(args)[0]):
        if isinstance(t, torch.Tensor):
            return str(t.device)
    return "cpu"


def _serialized_size(model: nn.Module) -> int | None:
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        return None  # meta tensors hold no data, so the file size would be a made-up number
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getbuffer().nbytes


def _module_breakdown(
    counts: Mapping[str, Mapping[Any, int]], model: nn.Module, by: Literal["module", "leaf"]
) -> dict[str, int]:
    # FlopCounterMode names modules "<RootClass>.<fqn>"; "Global" and the bare root hold the total.
    prefix = type(model).__name__ + "."
    macs = {name[len(prefix) :]: sum(ops.values()) // 2 for name, ops in counts.items() if name.startswith(prefix)}
    return {
        name: macs[name]
        for name, module in model.named_modules()
        if name in macs and (by == "module" or next(module.children(), None) is None)
    }


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
    ``by="module"`` keys ``per_module`` by every module with counted MACs, each including its
    children's; ``by="leaf"`` keeps only modules without children.

    >>> m = measure(torchvision.models.resnet50(), torch.randn(1, 3, 224, 224))
    >>> m.macs / 1e9, m.flops / 1e9  # ~4.1 GMACs, ~8.2 GFLOPs
    """
    check_model(model, "measure")
    if by not in ("module", "leaf"):
        raise MetricsError(f"by must be 'module' or 'leaf', got {by!r}.")
    args = as_args(example_inputs, model)
    result = None
    if use_meta:
        try:
            result = _count(model, lambda: meta_forward(model, args)), "meta"
        except Exception:  # noqa: BLE001 - no meta kernel or data-dependent shapes: count on a real forward
            result = None
    if result is None:
        try:
            result = _count(model, lambda: model(*args)), _device_of(model, args)
        except Exception as exc:  # any failure of the user's forward is a bad-input error
            raise rejected(exc, args) from exc
    (counter, seen), ran_on = result
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
