"""Save and reload pruned models: the plan plus a plain state_dict (``torch.load(weights_only=True)``).

    prunefx.save(model, plan, "pruned.pt")
    model = prunefx.load("pruned.pt", lambda: torchvision.models.resnet50())

Loading re-applies the plan to a fresh model from the factory (same analysis, same fingerprint), then
loads the weights, so no pickled classes are needed and the file cannot run code on load.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from prunefx._io import atomic_torch_save, load_torch_file
from prunefx.analysis import analyze
from prunefx.capture.inputs import positional, rebuilt
from prunefx.errors import PrunefxError, UntrustedFileError
from prunefx.plan import PruningPlan
from prunefx.transform.rewrite import apply_plan

FORMAT = "prunefx.checkpoint/1"


def save(model: nn.Module, plan: PruningPlan, path: str | os.PathLike) -> Path:
    """Write ``{"format", "plan", "state_dict"}`` atomically (temp file, then rename)."""
    path = Path(path)
    payload = {"format": FORMAT, "plan": plan.to_dict(), "state_dict": model.state_dict()}
    atomic_torch_save(payload, path)
    return path


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
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise PrunefxError(f"{path} is not a prunefx checkpoint (expected format {FORMAT!r})")
    plan = PruningPlan.from_dict(payload["plan"])
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
    dg = analyze(model, inputs)
    pruned = apply_plan(model, dg, plan, graph_rewrite=graph_rewrite or bool(plan.target.get("graph_rewrite")))
    pruned.load_state_dict(payload["state_dict"])
    return pruned
