"""Sizes written as ``width // k`` with ``k`` a literal of the code: per-block offsets, or whole blocks.

``head_dim = key.shape[-1] // self.heads`` then ``q.view(b, -1, self.heads, head_dim)`` stays valid after pruning in
two ways: ``k`` fixed and the same offsets removed from every block of ``width`` (head_dim shrinks), or head_dim
fixed and whole blocks removed, ``k`` following their count (``self.heads`` rewritten: fewer heads). The second is
the only one left once something fixes head_dim (``scaled_dot_product_attention`` deriving its scale from it, RoPE).
Which one holds is known only after the walk, so each such size is recorded as a :class:`Division` and decided
here, per literal: whole blocks when the dim it sized is frozen in any of its uses, same offsets otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from prunefx.analysis.atoms import AtomTable
from prunefx.analysis.products import removable

# (node name, ("args", i), owner module) of a literal in the traced graph
Where = tuple[str, tuple, str]


@dataclass(frozen=True, eq=False)
class Division:
    """A dim of ``len(out)`` positions sized ``width // k``, with ``k`` written at ``at``."""

    blocks: np.ndarray  # atoms of the divided width as (k, len(out)): blocks[b, d] is offset d of block b
    out: np.ndarray  # atoms of the dim the quotient sized
    at: Where
    where: str


def resolve(
    atoms: AtomTable,
    divisions: Sequence[Division],
    followers: dict[Where, list[Where]],
    constant: Callable[[Where, np.ndarray], None],
) -> None:
    """Decide every recorded division (see the module docstring).

    ``followers``: other literals that count the same blocks (``self.heads * head_dim`` written back as a width),
    rewritten with the divisor. ``constant(where, atoms)`` records a literal that must equal the kept count of atoms.
    """
    by_literal: dict[Where, list[Division]] = {}
    for d in divisions:
        by_literal.setdefault(d.at, []).append(d)
    for at, group in by_literal.items():
        whole = any(not removable(atoms, d.out) for d in group)
        for d in group:
            blocks = d.blocks
            if whole:
                atoms.freeze(d.out, f"{d.where}: whole blocks of {len(d.out)} are pruned, so this size stays")
                atoms.union(blocks, np.broadcast_to(blocks[:, :1], blocks.shape), f"{d.where}: one unit per block")
            else:
                atoms.union(blocks, np.broadcast_to(d.out, blocks.shape), f"{d.where}: the same offset in every block")
        if whole:
            lead = np.ascontiguousarray(group[0].blocks[:, 0])
            for lit in (at, *followers.get(at, ())):
                constant(lit, lead)
