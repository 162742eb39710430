"""Attributes of container modules that their forward reads and that follow their children's widths.

Leaf layers are fixed from their own tensors (``prunefx.rewrite``); containers such as ultralytics'
``C2f`` keep a Python int (``self.c``) that must follow ``cv1``'s new width. Fixers are keyed by type
and registered lazily for libraries that are installed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from torch import nn

ContainerFixer = Callable[[nn.Module], None]
_CONTAINER_FIXERS: dict[type, ContainerFixer] = {}


def register_container_fixer(*types: type) -> Callable[[ContainerFixer], ContainerFixer]:
    def deco(fn: ContainerFixer) -> ContainerFixer:
        for t in types:
            _CONTAINER_FIXERS[t] = fn
        return fn

    return deco


def _register_ultralytics() -> None:
    # Only when the model's library is already imported (importing ultralytics has side effects).
    block = sys.modules.get("ultralytics.nn.modules.block")
    if block is None or block.C2f in _CONTAINER_FIXERS:
        return

    @register_container_fixer(block.C2f, block.C2PSA)
    def _halves(m: nn.Module) -> None:
        # forward_split / C2PSA.forward split cv1's output into (c, c): the analysis ties the halves'
        # counts (chunk(2)), so c is half the new width.
        m.c = m.cv1.conv.out_channels // 2


def fix_container_attributes(model: nn.Module) -> None:
    """Run every registered container fixer, and refresh ultralytics' per-layer ``np`` param counts."""
    _register_ultralytics()
    for m in model.modules():
        for cls in type(m).__mro__:
            fix = _CONTAINER_FIXERS.get(cls)
            if fix is not None:
                fix(m)
                break
        if hasattr(m, "np") and isinstance(getattr(m, "np"), int) and hasattr(m, "f") and hasattr(m, "i"):
            m.np = sum(p.numel() for p in m.parameters())
