"""The depth plan: which residual blocks to remove, decided from their scores before anything is cut."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prunefx.errors import PrunefxError

SCHEMA = "prunefx.depth/1"


@dataclass(frozen=True)
class DepthPlan:
    """Blocks to remove, with every candidate's score (lower: less damage when removed) and the parameters left."""

    remove: tuple[str, ...]
    scores: tuple[tuple[str, float], ...]  # every removable block, in model order
    criterion: str
    params_before: int
    params_after: int
    target: str  # what was asked, in words
    model: str = ""  # the model's class name
    input_shapes: tuple[tuple[int, ...], ...] = ()  # the example inputs' shapes and kinds, as a PruningPlan's
    input_kinds: tuple[str, ...] = ()
    # per removed block, how it is called: (forward parameter of the stream, its position, the stream's place in
    # the output or None, the output's length, whether it is a list), so a reload rebuilds the same bypasses
    calls: tuple[tuple[str, tuple[str, int, int | None, int, bool]], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``torch.load(weights_only=True)`` reads it back), tagged with its schema."""
        return {**asdict(self), "schema": SCHEMA}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> DepthPlan:
        """The plan :meth:`to_dict` wrote (a PrunefxError naming the schema otherwise)."""
        schema = d.get("schema") if isinstance(d, Mapping) else None
        if schema != SCHEMA:
            raise PrunefxError(f"not a prunefx depth plan (schema {schema!r}); expected {SCHEMA!r}")
        return DepthPlan(
            remove=tuple(str(p) for p in d["remove"]), scores=tuple((str(p), float(s)) for p, s in d["scores"]),
            criterion=str(d["criterion"]), params_before=int(d["params_before"]),
            params_after=int(d["params_after"]), target=str(d["target"]), model=str(d.get("model", "")),
            input_shapes=tuple(tuple(int(i) for i in s) for s in d.get("input_shapes", ())),
            input_kinds=tuple(str(k) for k in d.get("input_kinds", ())),
            calls=tuple((str(p), (str(c[0]), int(c[1]), None if c[2] is None else int(c[2]), int(c[3]), bool(c[4])))
                        for p, c in d.get("calls", ())),
        )

    def summary(self) -> str:
        """The plan as text: the target, what goes, and each block's score."""
        gone = set(self.remove)
        lines = [f"depth plan ({self.criterion}; {self.target}): remove {len(self.remove)} of {len(self.scores)} "
                 f"blocks, params {self.params_before:,} -> {self.params_after:,} "
                 f"({self.params_after / max(self.params_before, 1):.1%})"]
        lines += [f"  {'-' if p in gone else ' '} {p:<40} {s:.4g}" for p, s in self.scores]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def plan_depth(scores: Mapping[str, float], params: Mapping[str, int], total: int, criterion: str, *,
               remove: int | None = None, keep_params: float | None = None,
               order: Sequence[str] | None = None) -> DepthPlan:
    """Remove the ``remove`` lowest-scored blocks, or the fewest lowest-scored ones that leave at most
    ``keep_params`` of the ``total`` parameters (``params``: each block's own). Exactly one target is given.
    ``order``: the order to remove them in instead of by score (iterative scoring decides it step by step)."""
    if (remove is None) == (keep_params is None):
        raise PrunefxError("give one depth target: remove=<number of blocks> or params=<fraction of parameters kept>")
    order = list(order) if order is not None else sorted(scores, key=lambda p: (scores[p], list(scores).index(p)))
    if remove is not None:
        if not 0 <= remove <= len(order):
            raise PrunefxError(f"remove={remove}, but the model has {len(order)} removable blocks: give 0 to "
                               f"{len(order)}")
        chosen, target = order[:remove], f"remove {remove} blocks"
    else:
        if not 0 < keep_params <= 1:
            raise PrunefxError(f"params={keep_params} is no fraction of the parameters to keep: give a value in (0, 1]")
        chosen, left = [], total
        for p in order:
            if left <= keep_params * total:
                break
            chosen.append(p)
            left -= params[p]
        if left > keep_params * total:
            floor = (total - sum(params.values())) / max(total, 1)
            raise PrunefxError(f"params={keep_params:g} cannot be met by removing blocks: without every removable "
                               f"block {floor:.1%} of the parameters remain; give params >= {floor:.3f}, or prune "
                               "widths too")
        target = f"params <= {keep_params:.1%}"
    kept = total - sum(params[p] for p in chosen)
    ordered = tuple(p for p in scores if p in set(chosen))
    return DepthPlan(ordered, tuple((p, float(s)) for p, s in scores.items()), criterion, total, kept, target)
