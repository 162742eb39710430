"""The oracle's verdict: :class:`VerifyResult` (proven, inexact by design, or failed) and what it compared."""

from __future__ import annotations

from dataclasses import dataclass

STATES = ("proven", "inexact", "failed")


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify`: ``state`` "proven" (``ok``: every output matched within ``rtol``), "inexact" (a
    pruned group passes through cross-channel statistics, so no exact equality exists; the pruned model runs in both
    modes with finite outputs, and ``max_rel_error`` says how far it moved) or "failed".

    ``ok`` is True only when proven; ``accepted`` also takes an inexact-by-design cut, which ``prunefx.prune``
    returns (labelled). Failed too when some output could not be compared at all (``problems``): nothing compared is
    no pass."""

    ok: bool  # proven equal: state == "proven"
    exact: bool  # False when a pruned group mixes channels in its statistics (LayerNorm, GroupNorm...)
    max_rel_error: float  # NaN when nothing was compared
    errors: tuple[float, ...]  # per output tensor: max |a - b| / max |a|
    inexact_groups: tuple[int, ...]
    runs_eval: bool
    runs_train: bool
    message: str
    notes: tuple[str, ...] = ()  # how it was checked: float64 recheck, replayed discrete ops, modes not checked
    outputs: tuple[str, ...] = ()  # the path of each compared output (``out['logits']``), as ``errors``
    problems: tuple[str, ...] = ()  # why the comparison is incomplete or meaningless; any one fails the check
    state: str = ""  # "proven" | "inexact" | "failed"; unset: from ok (other oracles prove or fail, never inexact)

    def __post_init__(self) -> None:
        if not self.state:  # frozen: set once, here
            object.__setattr__(self, "state", "proven" if self.ok else "failed")
        if self.state not in STATES or self.ok != (self.state == "proven"):
            raise ValueError(f"VerifyResult: state {self.state!r} with ok={self.ok}; state is one of {STATES} and ok "
                             "is True exactly when it is 'proven'")

    @property
    def accepted(self) -> bool:
        """Proven, or inexact by design (nothing exact to prove): what ``prunefx.prune`` may return."""
        return self.state != "failed"

    def headline(self) -> str:
        """One line for a summary: the message, led by the state when it is not a proof."""
        lead = {"proven": "", "inexact": "inexact by design, not proven equal: ", "failed": "FAILED: "}[self.state]
        return lead + self.message


__all__ = ["STATES", "VerifyResult"]
