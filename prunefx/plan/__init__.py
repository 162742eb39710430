"""Plan: from scores to a printable decision of which channels each group keeps."""

from prunefx.plan.config import PlanConfig, PlanError
from prunefx.plan.cost import CostModel
from prunefx.plan.plan import GroupPlan, PruningPlan, validate_plan
from prunefx.plan.solve import make_plan

__all__ = ["PlanConfig", "PlanError", "CostModel", "GroupPlan", "PruningPlan", "validate_plan", "make_plan"]
