"""Standalone copies of a model's layers at other widths: what a latency table times.

    case = resized(model.layer1[0].conv1, in_width=48, out_width=32, input_shape=(1, 64, 56, 56))

One registry keyed by layer type (looked up along the type's MRO) says how to rebuild a layer with ``in_width``
input and ``out_width`` output channels (None: unchanged) and how its input shape changes. Convolutions and
linear layers are rebuilt with a bias: that is how they run once BatchNorm is folded into them. A layer type
without a builder is not timed on its own (its time stays in the model's unexplained remainder).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from prunefx._registry import put
from prunefx.metrics.latency_table import LayerCase

Builder = Callable[[nn.Module, int, int, tuple[int, ...]], "LayerCase | None"]
_BUILDERS: dict[type[nn.Module], tuple[Builder, bool]] = {}


def register_timed_layer(layer_type: type[nn.Module], builder: Builder, *, per_channel: bool = False,
                         replace: bool = False) -> None:
    """Teach latency tables to rebuild ``layer_type`` at other widths.

    ``builder(module, in_width, out_width, input_shape)`` returns the LayerCase or None when that width is
    impossible. ``per_channel``: input and output are the same channels (norms), so only ``in_width`` counts.
    """
    put(_BUILDERS, layer_type, (builder, per_channel), what="register_timed_layer", replace=replace)


def _lookup(module: nn.Module) -> tuple[Builder, bool] | None:
    for cls in type(module).__mro__:
        if cls in _BUILDERS:
            return _BUILDERS[cls]
    return None


def timed(module: nn.Module) -> bool:
    """Whether latency tables can rebuild this layer at other widths."""
    return _lookup(module) is not None


def per_channel(module: nn.Module) -> bool:
    """Whether the layer's input and output are the same channels (BatchNorm, LayerNorm, depthwise conv)."""
    found = _lookup(module)
    if found is None:
        return False
    if isinstance(module, nn.modules.conv._ConvNd):
        return module.groups > 1 and module.groups == module.in_channels == module.out_channels
    return found[1]


def resized(
    module: nn.Module, in_width: int | None, out_width: int | None, input_shape: tuple[int, ...]
) -> LayerCase | None:
    """A standalone copy of ``module`` with the given widths and the input shape it then gets (None: cannot)."""
    found = _lookup(module)
    if found is None:
        return None
    builder, same = found
    if same or per_channel(module):
        out_width = in_width
    return builder(module, in_width, out_width, tuple(int(s) for s in input_shape))


def _conv(m: nn.modules.conv._ConvNd, a: int | None, b: int | None, shape: tuple[int, ...]) -> LayerCase | None:
    a = m.in_channels if a is None else a
    b = m.out_channels if b is None else b
    if m.groups == 1:
        groups = 1
    elif m.groups == m.in_channels:  # depthwise (with a channel multiplier when out > in): one group per channel
        groups = a
        if b % a:
            return None
    else:  # grouped: the analysis keeps the same positions in every group, so both widths stay divisible
        groups = m.groups
        if a % groups or b % groups:
            return None
    if a < 1 or b < 1:
        return None
    base = next(c for c in type(m).__mro__ if c.__module__ == nn.Conv2d.__module__ and not c.__name__.startswith("_"))
    common = {"stride": m.stride, "padding": m.padding, "dilation": m.dilation, "groups": groups, "bias": True}
    if m.transposed:
        layer = base(a, b, m.kernel_size, output_padding=m.output_padding, **common)
    else:
        layer = base(a, b, m.kernel_size, padding_mode=m.padding_mode, **common)
    return LayerCase(layer, (shape[0], a, *shape[2:]))


def _linear(m: nn.Linear, a: int | None, b: int | None, shape: tuple[int, ...]) -> LayerCase | None:
    a = m.in_features if a is None else a
    b = m.out_features if b is None else b
    if a < 1 or b < 1:
        return None
    return LayerCase(nn.Linear(a, b, bias=True), (*shape[:-1], a))


def _channel_norm(m: nn.Module, a: int | None, _b: int | None, shape: tuple[int, ...]) -> LayerCase | None:
    a = shape[1] if a is None else a
    if isinstance(m, nn.GroupNorm):
        if a % m.num_groups:
            return None
        layer: nn.Module = nn.GroupNorm(m.num_groups, a, eps=m.eps, affine=m.affine)
    else:
        layer = type(m)(a, eps=m.eps, affine=m.affine, track_running_stats=m.track_running_stats)
    return LayerCase(layer, (shape[0], a, *shape[2:]))


def _layer_norm(m: nn.LayerNorm, a: int | None, _b: int | None, shape: tuple[int, ...]) -> LayerCase | None:
    a = m.normalized_shape[-1] if a is None else a
    ns = (*m.normalized_shape[:-1], a)
    return LayerCase(nn.LayerNorm(ns, eps=m.eps, elementwise_affine=m.elementwise_affine), (*shape[:-1], a))


for _t in (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d):
    register_timed_layer(_t, _conv)
register_timed_layer(nn.Linear, _linear)
for _t in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
           nn.GroupNorm):
    register_timed_layer(_t, _channel_norm, per_channel=True)
register_timed_layer(nn.LayerNorm, _layer_norm, per_channel=True)
