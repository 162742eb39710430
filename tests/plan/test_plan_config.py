"""PlanConfig's one target: resolved once from whichever field is set, the default when none is."""

import pytest

from prunefx.plan import PlanConfig, PlanError
from prunefx.plan.config import DEFAULT_TARGET, TARGETS


@pytest.mark.parametrize("field", TARGETS)
def test_target_is_the_field_that_is_set(field):
    cfg = PlanConfig(**{field: 0.25})
    assert cfg.target == (field, 0.25)
    assert [k for k in TARGETS if getattr(cfg, k) is not None] == [field]


def test_no_target_is_the_default_target():
    assert PlanConfig().target == DEFAULT_TARGET
    assert PlanConfig(scope="local").target == DEFAULT_TARGET


def test_two_targets_are_refused():
    with pytest.raises(PlanError, match="exactly one target"):
        PlanConfig(flops=0.5, params=0.5)


@pytest.mark.parametrize(
    "cfg,needs",
    [
        (PlanConfig(latency=0.5), True),
        (PlanConfig(flops=0.5, round_to="auto"), True),
        (PlanConfig(flops=0.5, round_to=8), False),
        (PlanConfig(ratio=0.3), False),
    ],
)
def test_needs_latency_for_a_latency_target_or_auto_rounding(cfg, needs):
    assert cfg.needs_latency is needs
