"""Run code on a model and put every module's attributes back afterwards (below every unit: capture and metrics)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from operator import is_not

from torch import nn

_DICTS = (dict, OrderedDict)


def submodules(root: nn.Module) -> list[nn.Module]:
    """``root`` and every module below it, each once (``root.modules()`` without its name strings: this is hot)."""
    seen, stack, out = {id(root)}, [root], []
    while stack:
        mod = stack.pop()
        out.append(mod)
        for child in mod._modules.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                stack.append(child)
    return out


@contextmanager
def attributes_kept(root: nn.Module) -> Iterator[None]:
    """Restore every submodule's attributes (added, replaced or deleted ones) when the block ends.

    The dicts a module holds are restored too, by content: parameters, buffers and children, and the hook dicts.
    Forwards leave state behind: ultralytics' Detect caches anchors for the last input shape (meta tensors after
    a meta pass), transformers installs output-capturing hooks on the first call and marks the model; restoring the
    mark but not the hooks would install them twice on the next call (every hidden state recorded twice).
    """
    saved, empty = [], []  # most held dicts are empty hook dicts: those only need to be empty again
    for m in submodules(root):
        d = vars(m)
        saved.append((d, d.copy()))
        for v in d.values():
            if type(v) in _DICTS:
                if v:
                    saved.append((v, v.copy()))
                else:
                    empty.append(v)
    try:
        yield
    finally:
        for live, old in saved:
            # Same keys in the same order and the same objects: untouched (map(is_not) runs in C, this is hot).
            if live.keys() != old.keys() or any(map(is_not, live.values(), old.values())):
                live.clear()
                live.update(old)
        if any(empty):
            for live in empty:
                live.clear()
