"""Graph passes: model -> model rewrites that keep the function (BatchNorm folding for deployment)."""

from prunefx.passes.fold_bn import FOLD_KEY, FoldError, fold_bn, foldable

__all__ = ["FOLD_KEY", "FoldError", "fold_bn", "foldable"]
