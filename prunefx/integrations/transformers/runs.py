"""The model the user gets runs as they will run it: its default call and, for a generative model, a cached
generation, on the example inputs.

The oracles check the cut with the KV cache off (a cache is no output to compare); a config rewrite or a removed
layer can still break the call with the cache on, or ``generate``. :func:`calls_that_run` records which of these
calls the model passes before a cut, :func:`broken_call` says which of them the pruned model fails: a call that
failed before the cut is not prunefx's to answer for.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from prunefx.capture.inputs import positional

CALLS = ("default call", "cached generation (2 tokens)")


def _keywords(model: nn.Module, inputs: tuple) -> dict[str, torch.Tensor]:
    """The tensor inputs of ``model(*inputs)`` by their forward parameters' names (what ``generate`` takes)."""
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return {}
    return {p.name: x for p, x in zip(params, inputs, strict=False) if isinstance(x, torch.Tensor)}


def _generate(model: nn.Module, inputs: tuple) -> None:
    kwargs = _keywords(model, inputs)
    if not kwargs:
        return
    gen = getattr(model, "generation_config", None)
    pad = {} if getattr(gen, "pad_token_id", None) is not None or getattr(gen, "eos_token_id", None) is None else {
        "pad_token_id": gen.eos_token_id if isinstance(gen.eos_token_id, int) else gen.eos_token_id[0]}
    model.generate(**kwargs, max_new_tokens=2, min_new_tokens=2, do_sample=False, num_beams=1, use_cache=True,
                   **pad)


def _calls(model: nn.Module) -> dict[str, Callable[[nn.Module, tuple], Any]]:
    calls: dict[str, Callable[[nn.Module, tuple], Any]] = {CALLS[0]: lambda m, x: m(*x)}
    can = getattr(model, "can_generate", None)
    try:
        generative = bool(can()) if callable(can) else False
    except Exception:  # noqa: BLE001 - a class whose check itself fails cannot generate
        generative = False
    if generative:
        calls[CALLS[1]] = _generate
    return calls


def _run(model: nn.Module, inputs: tuple, call: Callable[[nn.Module, tuple], Any]) -> str | None:
    """None when ``call`` runs on ``model``, else the error's type and first line."""
    from transformers.utils import logging

    was, verbosity = model.training, logging.get_verbosity()
    model.eval()
    logging.set_verbosity_error()  # generate's notes on its own settings: not the user's concern here
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call(model, inputs)
    except Exception as exc:  # noqa: BLE001 - whatever the model raises is the answer
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")
    finally:
        model.train(was)
        logging.set_verbosity(verbosity)
    return None


def calls_that_run(model: nn.Module, example_inputs: Any) -> tuple[str, ...]:
    """The calls of :data:`CALLS` ``model`` passes on ``example_inputs`` (run before a cut)."""
    inputs = positional(model, example_inputs)
    return tuple(name for name, call in _calls(model).items() if _run(model, inputs, call) is None)


def broken_call(model: nn.Module, example_inputs: Any, ran: tuple[str, ...]) -> str | None:
    """Why ``model`` fails one of the calls in ``ran`` (those it passed before the cut), or None when it passes
    them all."""
    inputs = positional(model, example_inputs)
    for name, call in _calls(model).items():
        if name not in ran:
            continue
        why = _run(model, inputs, call)
        if why is not None:
            return f"the pruned model fails its {name} on the example inputs ({why})"
    return None
