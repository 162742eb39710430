"""Save and reload pruned models: the plan plus a plain state_dict (``torch.load(weights_only=True)``).

    prunefx.save(model, plan, "pruned.pt")
    model = prunefx.load("pruned.pt", lambda: torchvision.models.resnet50())
    prunefx.save(model, [depth.plan, width.plan], "both.pt")    # plans in the order they were applied

Loading re-applies the plan to a fresh model from the factory (same analysis, same fingerprint), then
loads the weights, so no pickled classes are needed and the file cannot run code on load. A depth plan
(:class:`~prunefx.plan.depth.DepthPlan`) is re-applied by finding its blocks in the fresh model's graph and
bypassing them as its recorded calls say; several plans (depth, then width, or the other way) apply in order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunefx._io import atomic_torch_save, load_torch_file, read_json
from prunefx.analysis import analyze
from prunefx.analysis.blocks import residual_blocks
from prunefx.capture.inputs import positional, rebuilt
from prunefx.errors import PrunefxError, UntrustedFileError
from prunefx.plan import PruningPlan
from prunefx.plan.depth import SCHEMA as DEPTH_SCHEMA
from prunefx.plan.depth import DepthPlan
from prunefx.transform.depth import BlockCall, remove_blocks
from prunefx.transform.rewrite import apply_plan

FORMAT = "prunefx.checkpoint/1"
FORMAT_STEPS = "prunefx.checkpoint/2"  # several plans (depth and width), applied in order
Plan = PruningPlan | DepthPlan


def save(model: nn.Module, plan: Plan | Sequence[Plan], path: str | os.PathLike) -> Path:
    """Write ``{"format", "plan", "state_dict"}`` atomically (temp file, then rename); several plans, or a depth
    plan, as ``{"format": .../2, "plans": [...], "state_dict"}``."""
    path = Path(path)
    if path.is_dir():
        raise PrunefxError(f"prunefx.save: {path} is a directory; give the path of the file to write, e.g. "
                           f"{path / 'pruned.pt'}")
    plans = [plan] if isinstance(plan, (PruningPlan, DepthPlan)) else list(plan)
    if not plans or not all(isinstance(p, (PruningPlan, DepthPlan)) for p in plans):
        raise PrunefxError("prunefx.save takes the PruningPlan or DepthPlan a prune returned (result.plan), or a "
                           "list of them in the order they were applied")
    if len(plans) == 1 and isinstance(plans[0], PruningPlan):
        payload = {"format": FORMAT, "plan": plans[0].to_dict(), "state_dict": model.state_dict()}
    else:
        payload = {"format": FORMAT_STEPS, "plans": [p.to_dict() for p in plans], "state_dict": model.state_dict()}
    atomic_torch_save(payload, path)
    return path


def _plans(payload: dict, path: str | os.PathLike) -> list[Plan]:
    fix = "it was not written by prunefx.save (or was edited since): save the model again"
    if payload.get("format") == FORMAT:
        return [plan_from_dict(payload.get("plan"), f"{path}: its plan", fix=fix)]
    plans = payload.get("plans")
    if not isinstance(plans, list) or not plans:
        raise PrunefxError(f"{path}: its plans are {type(plans).__name__}, not a list of plans; {fix}")
    return [plan_from_dict(d, f"{path}: its plan {i}", fix=fix) for i, d in enumerate(plans)]


def plan_from_dict(data: Any, where: str, *, fix: str, kind: type | tuple[type, ...] = (PruningPlan, DepthPlan),
                   error: type[Exception] = PrunefxError) -> Plan:
    """The plan ``to_dict`` wrote (a PruningPlan, or a DepthPlan by its schema), type-checked where it is applied;
    ``error`` naming ``where`` and ``fix`` for anything else (a damaged or edited file)."""
    try:
        if not isinstance(data, dict):
            raise TypeError(f"an object was expected, got {type(data).__name__}")
        plan = DepthPlan.from_dict(data) if data.get("schema") == DEPTH_SCHEMA else PruningPlan.from_dict(data)
        if isinstance(plan, PruningPlan):
            for g in plan.groups:
                values = (g.group, g.before, g.after, *g.keep)
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                    raise TypeError(f"group {g.group!r}: group, before, after and keep must be integers")
    except KeyError as exc:
        raise error(f"{where} is not a valid prunefx plan (missing {exc}); {fix}") from None
    except (PrunefxError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise error(f"{where} is not a valid prunefx plan ({str(exc)[:300]}); {fix}") from None
    if not isinstance(plan, kind):
        raise error(f"{where} is a {type(plan).__name__}, not the plan expected there; {fix}")
    return plan


def read_plan(path: str | os.PathLike, *, fix: str, kind: type | tuple[type, ...] = (PruningPlan, DepthPlan),
              error: type[Exception] = PrunefxError) -> Plan:
    """A plan saved as JSON (a run's ``plan.json`` / ``depth_plan.json``), read by :func:`prunefx._io.read_json`
    and :func:`plan_from_dict`."""
    data = read_json(path, error, missing=f"{path} is missing; {fix}", what="is not valid JSON", fix=fix, expect=dict)
    return plan_from_dict(data, str(path), fix=fix, kind=kind, error=error)


def _reapply_depth(model: nn.Module, plan: DepthPlan, inputs: tuple) -> None:
    """Bypass ``plan``'s blocks in a fresh ``model``: found again in its graph, called as the plan recorded."""
    search = residual_blocks(model, analyze(model, inputs).gm, plan.remove)
    if search.refused:
        path, why = search.refused[0]
        raise PrunefxError(f"the depth plan removes {path}, which the fresh model does not have as a residual "
                           f"block ({why}): give the factory of the model that was pruned")
    calls = {p: BlockCall(*c) for p, c in plan.calls}
    remove_blocks(model, search.blocks, calls)


def load(
    path: str | os.PathLike,
    base_model_factory: Callable[[], nn.Module],
    *,
    graph_rewrite: bool = False,
    example_inputs: Sequence[Any] | None = None,
) -> nn.Module:
    """Rebuild a pruned model: fresh model from ``base_model_factory`` -> re-apply the plan -> load weights.

    Returns the module to use (as :func:`prunefx.apply_plan` does): the model, or the rewritten GraphModule when
    the plan was made with ``graph_rewrite`` (recorded in the plan; the argument forces it for older plans).
    ``example_inputs``: what the re-analysis feeds the model (default: zeros of the plan's input shapes and dtypes,
    keyword inputs at the positions they were bound to; a plan from before dtypes were recorded gets float zeros).
    """
    try:
        payload = load_torch_file(path)  # weights-only: a prunefx.save file is tensors and plain data
    except FileNotFoundError:
        raise PrunefxError(f"no checkpoint at {path}") from None
    except UntrustedFileError as exc:
        raise PrunefxError(
            f"{path} is not a prunefx checkpoint: it holds pickled objects beyond tensors and plain data, which "
            "prunefx.save never writes (it was not unpickled)"
        ) from exc
    except Exception as exc:  # an empty, truncated or foreign file
        detail = f": {exc}" if str(exc) else ""
        raise PrunefxError(f"{path} is not a readable prunefx checkpoint ({type(exc).__name__}{detail})") from exc
    if not isinstance(payload, dict) or payload.get("format") not in (FORMAT, FORMAT_STEPS):
        raise PrunefxError(f"{path} is not a prunefx checkpoint (expected format {FORMAT!r} or {FORMAT_STEPS!r})")
    plans = _plans(payload, path)
    plan = plans[0]
    model = base_model_factory()
    if example_inputs is not None:
        inputs = positional(model, example_inputs)
    elif plan.input_kinds:
        inputs = rebuilt(plan.input_shapes, plan.input_kinds)
        if inputs is None:
            raise PrunefxError(f"{path}: the plan's example inputs were not plain tensors; pass "
                               "prunefx.load(..., example_inputs=...) as they were given to prune")
    else:
        inputs = tuple(torch.zeros(s) for s in plan.input_shapes)
    pruned = model
    for step in plans:
        if isinstance(step, DepthPlan):
            _reapply_depth(pruned, step, inputs)
            continue
        rewrite = graph_rewrite or bool(step.target.get("graph_rewrite"))
        pruned = apply_plan(pruned, analyze(pruned, inputs), step, graph_rewrite=rewrite)
    pruned.load_state_dict(payload["state_dict"])
    return pruned
