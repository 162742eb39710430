"""Transform: the only code that mutates a model (bias compensation, slicing, attribute fixers, re-fit)."""

from prunefx.transform.compensate import Compensation, compensate
from prunefx.transform.fixers import owned_modules, register_fixer
from prunefx.transform.mha import PrunedMultiheadAttention
from prunefx.transform.refit import Refit, RefitLayer, check_calibration, refit
from prunefx.transform.rewrite import apply_plan

__all__ = ["Compensation", "compensate", "register_fixer", "owned_modules", "apply_plan", "PrunedMultiheadAttention",
           "Refit", "RefitLayer", "check_calibration", "refit"]
