"""Reshapes that split one channel dim into several (heads x head_dim) or merge several into one.

A position (h, d) of the flat dim disappears when index h of the heads dim OR index d of the head_dim dim is
removed: a product, which union-find cannot express. The reshape rule therefore gives every factor dim that varies
its own fresh labels and records a :class:`Product`. Once the whole graph has been walked, :func:`resolve` makes ONE
factor per product the pruning unit (each flat position is coupled to its index along that factor: a whole head,
or the same offset in every head) and freezes the others, so every removal is still a valid reshape.

Deciding after the walk lets later ops speak: RoPE slices head_dim in halves, ``unbind`` picks q, k and v apart,
``scaled_dot_product_attention`` derives its scale from head_dim -- each freezes a factor, and the one left is
chosen. When several stay free, the order of preference is: a factor whose size the code leaves free (``-1``, or
read from the tensor itself) over one written as a literal (changing it needs a rewrite); then a factor that is a
batch dim of a contraction (attention heads: ``q @ k^T`` is computed per head); then the outermost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prunefx.analysis.atoms import AtomTable


@dataclass(frozen=True, eq=False)
class Product:
    """``grid[i_0, ..., i_k]`` (atoms of the flat dim, reshaped) goes iff some ``factors[j][1][i_axis]`` goes."""

    grid: np.ndarray  # atoms of the flat dim, shaped like the factor dims (non-varying dims included)
    factors: tuple[tuple[int, np.ndarray], ...]  # (axis of grid, the atoms labelling that factor dim)
    literal: tuple[bool, ...]  # per factor: its size is a literal in the code
    where: str


def removable(atoms: AtomTable, arr: np.ndarray) -> bool:
    """Some class of ``arr`` can still be removed."""
    roots = np.unique(atoms.find(arr))
    roots = roots[roots >= 0]
    return bool((atoms.frozen_reason(roots) < 0).any()) if roots.size else False


def _choose(atoms: AtomTable, p: Product, k: int) -> None:
    axis, chosen = p.factors[k]
    shape = [1] * p.grid.ndim
    shape[axis] = len(chosen)
    atoms.union(p.grid, np.broadcast_to(chosen.reshape(shape), p.grid.shape), f"{p.where}: one unit per index")
    for j, (_, other) in enumerate(p.factors):
        if j != k:
            atoms.freeze(other, f"{p.where}: the reshape keeps whole units along another dim")


def _rank(atoms: AtomTable, p: Product, k: int, tagged: np.ndarray, literal: np.ndarray) -> tuple[bool, bool, int]:
    """Preference of factor ``k``: not a literal, then a batch dim of a contraction, then the outermost."""
    axis, a = p.factors[k]
    roots = atoms.find(a)
    is_literal = p.literal[k] or bool(np.isin(roots, literal).any())
    return (not is_literal, bool(np.isin(roots, tagged).any()), -axis)


def resolve(
    atoms: AtomTable, products: Sequence[Product], batch_tags: Sequence[np.ndarray], literals: Sequence[np.ndarray]
) -> list[tuple[Product, int]]:
    """Pick one factor per product (see the module docstring); returns ``(product, chosen index or -1)``.

    ``batch_tags``: atoms that are batch dims of a contraction. ``literals``: atoms whose count a literal in the
    graph sets (a factor meeting one is treated as literal even when this reshape wrote ``-1`` for it).
    A forced choice (one factor left free) is made first, since every choice freezes factors of other products.
    """
    tags = np.concatenate(batch_tags) if len(batch_tags) else np.empty(0, np.int64)
    lits = np.concatenate(literals) if len(literals) else np.empty(0, np.int64)
    pending = list(products)
    done: list[tuple[Product, int]] = []
    while pending:
        pick = None
        for p in pending:
            free = [k for k, (_, a) in enumerate(p.factors) if removable(atoms, a)]
            if len(free) <= 1:
                pick = (p, free[0] if free else -1)
                break
        if pick is None:  # every product has a real choice: decide the first in graph order
            p = pending[0]
            tagged, literal = np.unique(atoms.find(tags)), np.unique(atoms.find(lits))  # roots move with each union
            free = [k for k, (_, a) in enumerate(p.factors) if removable(atoms, a)]
            ranked = [(_rank(atoms, p, k, tagged, literal), k) for k in free]
            pick = (p, max(ranked)[1])
        p, k = pick
        pending.remove(p)
        if k < 0:
            atoms.freeze(p.grid, f"{p.where}: every dim of the reshape is frozen")
        else:
            _choose(atoms, p, k)
        done.append((p, k))
    return done
