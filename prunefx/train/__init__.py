"""Training helpers for pruning: network-slimming sparsity on BatchNorm gammas."""

from .sparsity import BNSparsity, Schedule, TargetSparsity, fraction_below, residual_bns, sparsity_stats

__all__ = ["BNSparsity", "Schedule", "TargetSparsity", "fraction_below", "residual_bns", "sparsity_stats"]
