"""What to prune and under which limits: ``PlanConfig``, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prunefx._config import check_fields
from prunefx.errors import PrunefxError

Target = Literal["ratio", "flops", "params", "latency"]
TARGETS: tuple[Target, ...] = ("ratio", "flops", "params", "latency")
Normalize = Literal["none", "mean", "max", "sum", "standard"]
NORMALIZE: tuple[Normalize, ...] = ("none", "mean", "max", "sum", "standard")
DEFAULT_TARGET = ("flops", 0.5)  # the common ask: half the compute


class PlanError(PrunefxError):
    """A plan or a planning request is invalid (bad ratio, wrong model, violated constraint)."""


@dataclass(frozen=True)
class PlanConfig:
    """How much to prune and under which limits. Exactly one target: ratio, flops, params or latency.

    ratio: fraction of prunable channels to remove, in [0, 1). flops / params / latency: fraction of the
    model's MACs / parameters / measured latency to KEEP, in (0, 1] ("flops: 0.5" keeps half; latency is
    measured on a deployment, see ``prunefx.prune``). No target given: ``DEFAULT_TARGET``, the one default of
    the API, the CLI and the pipeline configs. scope "global": one score threshold over every group (network
    slimming), or for latency the greedy latency planner; "local": each group loses the same fraction;
    "sensitivity": each group's width from its measured damage curve, the least total damage that meets the target
    (curves measured on calibration batches, :mod:`prunefx.plan.sensitivity`; ``prunefx.prune(..., calibration=)``).
    normalize: how each group's scores are made comparable before a global ranking (global scope only; the order
    inside a group never changes): "none" ranks raw scores, "mean" / "max" / "sum" divide by the group's mean /
    max / sum of |score|, "standard" subtracts the group's mean and divides by its standard deviation.
    """

    ratio: float | None = None
    flops: float | None = None
    params: float | None = None
    latency: float | None = None
    scope: Literal["global", "local", "sensitivity"] = "global"
    min_channels: int = 1  # never prune a group below this many channels (never to zero)
    max_ratio: float = 0.9  # never remove more than this fraction of one group
    # kept widths rounded up to a multiple of this (hardware-friendly); "auto": to the fast edge of the measured
    # latency step each width falls on (needs a deployment to measure, like a latency target)
    round_to: int | Literal["auto"] = 1
    ignore: tuple[str, ...] = ()  # fnmatch patterns of module names whose groups are left alone
    overrides: tuple[tuple[str, float], ...] = ()  # (module pattern, ratio) for local per-layer ratios
    graph_rewrite: bool = False  # allow rewriting literal channel counts in the traced graph
    uniform_layers: bool = False  # groups with the same role in repeated layers keep equal counts (one config value)
    normalize: Normalize = "none"  # per-group score scaling before the global ranking (see the docstring)
    # (module pattern, kept counts the architecture accepts): a group holding the output channels of a module that
    # matches keeps the smallest of these counts at or above what the plan chose (a Hugging Face config that needs
    # hidden_size % heads == 0 accepts only some KV-head counts); the group's full width is always accepted
    allowed_widths: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        check_fields(self, error=PlanError)
        targets = [k for k in TARGETS if getattr(self, k) is not None]
        if not targets:
            object.__setattr__(self, *DEFAULT_TARGET)  # frozen: set once, here, before anyone sees it
        elif len(targets) != 1:
            raise PlanError(f"give exactly one target (ratio, flops, params or latency), got {targets}")
        if self.ratio is not None and not 0.0 <= self.ratio < 1.0:
            raise PlanError(f"ratio must be in [0, 1) (fraction of channels removed), got {self.ratio}")
        for k in ("flops", "params", "latency"):
            v = getattr(self, k)
            if v is not None and not 0.0 < v <= 1.0:
                raise PlanError(f"{k} must be in (0, 1] (fraction of the model's {k} kept), got {v}")
        if self.min_channels < 1:
            raise PlanError(f"min_channels must be >= 1 (a group is never pruned to zero), got {self.min_channels}")
        if not 0.0 < self.max_ratio <= 1.0:
            raise PlanError(f"max_ratio must be in (0, 1], got {self.max_ratio}")
        if self.round_to != "auto" and not (isinstance(self.round_to, int) and self.round_to >= 1):
            raise PlanError(f"round_to must be an integer >= 1 or 'auto', got {self.round_to!r}")
        for pat, r in self.overrides:
            if not 0.0 <= r < 1.0:
                raise PlanError(f"override ratio for {pat!r} must be in [0, 1), got {r}")
        for pat, counts in self.allowed_widths:
            if not counts or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in counts):
                raise PlanError(f"allowed_widths for {pat!r} must be positive channel counts, got {counts!r}")

    @property
    def target(self) -> tuple[Target, float]:
        """The one target set, as (field, value): ``PlanConfig(flops=0.5).target == ("flops", 0.5)``."""
        kind = next(k for k in TARGETS if getattr(self, k) is not None)  # exactly one, checked on construction
        return kind, getattr(self, kind)

    @property
    def needs_latency(self) -> bool:
        """Whether planning needs measured latencies: a latency target, or widths rounded to latency steps."""
        return self.latency is not None or self.round_to == "auto"
