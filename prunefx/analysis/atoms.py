"""Channel atoms: one integer per produced channel, merged with a vectorised union-find.

Every channel a layer produces (a conv's output channel, a parameter's index along one dim) is an *atom*.
Coupling two channels (a residual add, a shared consumer) merges their atoms into one class; a class is
what gets kept or removed as a whole. Position -1 in a label array means "not a channel of any class":
it is never removed, and merging it with an atom freezes that atom.

An atom is *explained* once an op rule has said something about it (coupled, frozen, marked inexact, or
recorded it as a layer's channel). A parameter dim that is read in forward but never explained (an index
buffer, a weight whose ``.device`` was read) must not be pruned on its own: the engine freezes such classes.
"""

from __future__ import annotations

import numpy as np

NO_CHANNEL = -1


class AtomTable:
    """Atoms with union-find, per-atom freeze / inexact reasons and notes, all as numpy arrays."""

    def __init__(self, capacity: int = 1024) -> None:
        self._parent = np.arange(capacity, dtype=np.int64)
        self._frozen = np.full(capacity, -1, dtype=np.int64)  # index into self.reasons, -1 = free
        self._inexact = np.full(capacity, -1, dtype=np.int64)
        self._explained = np.zeros(capacity, dtype=bool)  # per class, held at its root (carried by union)
        self.size = 0
        self.reasons: list[str] = []
        self._reason_ids: dict[str, int] = {}
        self._explained_arrays: dict[int, np.ndarray] = {}  # arrays already explained, by id (held: ids stay unique)

    def new(self, n: int) -> np.ndarray:
        """Allocate ``n`` fresh atoms and return their ids."""
        start, stop = self.size, self.size + n
        if stop > len(self._parent):
            cap = max(stop, 2 * len(self._parent))
            grow = cap - len(self._parent)
            self._parent = np.concatenate([self._parent, np.arange(len(self._parent), cap)])
            self._frozen = np.concatenate([self._frozen, np.full(grow, -1, dtype=np.int64)])
            self._inexact = np.concatenate([self._inexact, np.full(grow, -1, dtype=np.int64)])
            self._explained = np.concatenate([self._explained, np.zeros(grow, dtype=bool)])
        self.size = stop
        return np.arange(start, stop, dtype=np.int64)

    def find(self, atoms: np.ndarray) -> np.ndarray:
        """Class representative of each atom (NO_CHANNEL stays NO_CHANNEL)."""
        atoms = np.asarray(atoms, dtype=np.int64)
        valid = atoms >= 0
        if not valid.all():
            out = atoms.copy()
            out[valid] = self.find(atoms[valid])
            return out
        parent = self._parent
        p = parent[atoms]
        while True:
            pp = parent[p]
            if np.array_equal(pp, p):
                break
            p = pp
        parent[atoms] = p  # path compression for the queried atoms
        return p

    def union(
        self, a: np.ndarray, b: np.ndarray, reason: str = "coupled with a channel that must be kept", *,
        explain: bool = True,
    ) -> None:
        """Merge a[i] with b[i] for every i (broadcasting). NO_CHANNEL on one side freezes the other.

        ``explain=False``: a merge that says nothing about what the channels are (one tensor read twice)."""
        a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        a, b = a.ravel(), b.ravel()
        a_none, b_none = a < 0, b < 0
        if a_none.any() or b_none.any():
            self.freeze(b[a_none & ~b_none], reason)
            self.freeze(a[b_none & ~a_none], reason)
            keep = ~(a_none | b_none)
            a, b = a[keep], b[keep]
        if a.size == 0:
            return
        ra, rb = self.find(a), self.find(b)
        if explain:
            self._explained[ra] = True
            self._explained[rb] = True
        while True:
            differ = ra != rb
            if not differ.any():
                return
            ra, rb = ra[differ], rb[differ]
            lo, hi = np.minimum(ra, rb), np.maximum(ra, rb)
            # Carry frozen / inexact marks to the surviving root before re-parenting.
            self._merge_marks(self._frozen, lo, hi)
            self._merge_marks(self._inexact, lo, hi)
            self._explained[lo[self._explained[hi]]] = True  # only True is written: duplicates in lo lose nothing
            self._parent[hi] = lo  # duplicates in `hi` lose writes; the loop re-checks until every pair agrees
            ra, rb = self.find(lo), self.find(hi)

    @staticmethod
    def _merge_marks(marks: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        take = (marks[lo] < 0) & (marks[hi] >= 0)
        marks[lo[take]] = marks[hi[take]]

    def _reason_id(self, reason: str) -> int:
        rid = self._reason_ids.get(reason)
        if rid is None:
            rid = self._reason_ids[reason] = len(self.reasons)
            self.reasons.append(reason)
        return rid

    def freeze(self, atoms: np.ndarray, reason: str) -> None:
        """Mark the classes of ``atoms`` as not prunable, with a reason (the first reason sticks)."""
        self._mark(self._frozen, atoms, reason)

    def mark_inexact(self, atoms: np.ndarray, reason: str) -> None:
        """Mark classes whose removal is not exactly equal to masking (cross-channel statistics)."""
        self._mark(self._inexact, atoms, reason)

    def explain(self, atoms: np.ndarray) -> None:
        """A rule has accounted for these atoms (recorded them as a layer's channels)."""
        # Explained never reverts (unions carry it), and one array is recorded for many roles (a BN's weight, bias
        # and running stats): each array object is explained once. Atom arrays are values, never written in place.
        if self._explained_arrays.get(id(atoms)) is atoms:
            return
        if isinstance(atoms, np.ndarray):
            self._explained_arrays[id(atoms)] = atoms
        flat = np.asarray(atoms, dtype=np.int64).ravel()
        self._explained[self.find(flat[flat >= 0])] = True

    def unexplained(self, atoms: np.ndarray) -> np.ndarray:
        """Mask over ``atoms``: True where no atom of the atom's class has been explained."""
        atoms = np.asarray(atoms, dtype=np.int64)
        ok = atoms >= 0
        out = np.zeros(len(atoms), dtype=bool)
        out[ok] = ~self._explained[self.find(atoms[ok])]
        return out

    def _mark(self, marks: np.ndarray, atoms: np.ndarray, reason: str) -> None:
        atoms = np.asarray(atoms, dtype=np.int64).ravel()
        atoms = atoms[atoms >= 0]
        if atoms.size == 0:
            return
        roots = self.find(atoms)
        self._explained[roots] = True
        free = marks[roots] < 0
        marks[roots[free]] = self._reason_id(reason)

    def frozen_reason(self, roots: np.ndarray) -> np.ndarray:
        """Reason id per class root (-1 when prunable)."""
        return self._frozen[roots]

    def inexact_reason(self, roots: np.ndarray) -> np.ndarray:
        return self._inexact[roots]
