"""Module attribute fixers: after slicing, re-derive the attributes a module's forward reads from its widths.

One registry for leaf layers (``in_channels``, ``num_features``, ``groups``...) and for containers that keep a Python
int following a child's width (ultralytics' ``C2f.c``); integrations register theirs when imported.

    @register_fixer(MyLayer)
    def _fix(m: MyLayer, widths: dict[ModuleRole, int]) -> None:  # analysed role -> new size ({} for containers)
        m.width = m.weight.shape[0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from prunefx._registry import put
from prunefx.analysis.roles import CHANNEL, IN, OUT, ModuleRole, Normalized


@dataclass(frozen=True)
class LiteralCount:
    """Key of a fixer's ``widths``: a literal channel count of the module's own forward, by its traced value
    (``self.heads`` was 8 in ``view(b, -1, self.heads, d)``); the value is the count it must become."""

    value: int


Fixer = Callable[[nn.Module, dict[ModuleRole | LiteralCount, int]], None]
_FIXERS: dict[type, Fixer] = {}
_OWNS_LITERALS: set[type] = set()


def register_fixer(*types: type, literals: bool = False, replace: bool = False) -> Callable[[Fixer], Fixer]:
    """Register how a module type's attributes follow its new widths: ``fix(module, widths)``.

    ``widths`` maps the module's analysed roles (OUT, IN, CHANNEL, Normalized(j) from ``prunefx.analysis.roles``) to
    new sizes; it is empty for a container, which re-derives its attributes from its children's tensors. The fixer
    runs for every module of the type after slicing.

    ``literals=True`` declares that the fixer rewrites every attribute the module's own forward turns into a channel
    count (``view(b, self.num_heads, ...)``): the literals the analysis recorded in that forward then follow the new
    widths without rewriting the traced graph (:func:`owned_modules`), and the oracle checks the claim. Such a
    fixer also finds, under :class:`LiteralCount` keys of ``widths``, the new value of each of those literals that
    changed (the module's ``heads`` attribute when whole heads went)."""

    def deco(fn: Fixer) -> Fixer:
        for t in types:
            put(_FIXERS, t, fn, what="register_fixer", replace=replace)
            if literals:
                _OWNS_LITERALS.add(t)
        return fn

    return deco


def owned_modules(model: nn.Module) -> frozenset[str]:
    """Names of the modules whose fixer was registered with ``literals=True``: a literal channel count recorded in
    one of their forwards follows the pruned widths once the fixers have run."""
    return frozenset(n for n, m in model.named_modules() if any(c in _OWNS_LITERALS for c in type(m).__mro__))


def fixer_for(module: nn.Module) -> Fixer | None:
    """The fixer registered for the module's type or its nearest registered base class."""
    for cls in type(module).__mro__:
        if cls in _FIXERS:
            return _FIXERS[cls]
    return None


def fix_attributes(model: nn.Module, widths: dict[str, dict[ModuleRole | LiteralCount, int]]) -> None:
    """Run every module's fixer: modules with analysed widths first, then the containers above them."""
    named = list(model.named_modules())
    for name, module in named:
        fix = fixer_for(module)
        if fix is not None and name in widths:
            fix(module, widths[name])
    for name, module in named:
        fix = fixer_for(module)
        if fix is not None and name not in widths:
            fix(module, {})


@register_fixer(nn.modules.conv._ConvNd, literals=True)  # a depthwise forward passes self.groups (re-derived)
def _fix_conv(m: nn.modules.conv._ConvNd, w: dict[ModuleRole, int]) -> None:
    depthwise = m.groups > 1 and m.groups == m.in_channels
    m.in_channels = w.get(IN, m.in_channels)
    m.out_channels = w.get(OUT, m.out_channels)
    if depthwise:
        m.groups = m.in_channels


@register_fixer(nn.Linear)
def _fix_linear(m: nn.Linear, w: dict[ModuleRole, int]) -> None:
    m.in_features = w.get(IN, m.in_features)
    m.out_features = w.get(OUT, m.out_features)


@register_fixer(nn.modules.batchnorm._NormBase)
def _fix_bn(m: nn.modules.batchnorm._NormBase, w: dict[ModuleRole, int]) -> None:
    m.num_features = w.get(CHANNEL, m.num_features)


@register_fixer(nn.GroupNorm)
def _fix_gn(m: nn.GroupNorm, w: dict[ModuleRole, int]) -> None:
    m.num_channels = w.get(CHANNEL, m.num_channels)


@register_fixer(nn.LayerNorm, nn.RMSNorm, literals=True)  # its forward passes self.normalized_shape
def _fix_ln(m: nn.Module, w: dict[ModuleRole, int]) -> None:
    shape = list(m.normalized_shape)
    for j in range(len(shape)):
        shape[j] = w.get(Normalized(j), shape[j])
    m.normalized_shape = tuple(shape)


@register_fixer(nn.Embedding)
def _fix_embedding(m: nn.Embedding, w: dict[ModuleRole, int]) -> None:
    m.embedding_dim = w.get(OUT, m.embedding_dim)


@register_fixer(nn.PReLU)
def _fix_prelu(m: nn.PReLU, w: dict[ModuleRole, int]) -> None:
    m.num_parameters = w.get(CHANNEL, m.num_parameters)
