"""What a capture records about itself: one frozen :class:`CaptureInfo` in ``gm.meta[META_KEY]``.

Written once by each front end (:func:`prunefx.capture.trace`, :func:`prunefx.capture.export_graph`) with
:func:`set_capture_info`, read only through :func:`capture_info`; a change (a note) is ``dataclasses.replace`` and
set again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch.fx as fx

META_KEY = "prunefx"

Capture = Literal["auto", "fx", "export"]  # how to capture a model (see prunefx.capture.select.capture_graph)
CapturedBy = Literal["fx", "export"]  # how a graph was captured


@dataclass(frozen=True)
class CaptureInfo:
    """How a GraphModule was captured.

    ``auto_leaves``: ``{qualified_name: reason}`` of submodules made leaves because their forward could not be
    traced. ``training``: the flag traced with (None: the modules' own flags). ``lifted_constants``: buffers the
    capture created for tensor constants in forward. ``specialised``: ``"file:line"`` -> the value a Python
    decision on sizes took (fx). ``decisions``: the decisions that read a traced value into Python, with the node
    read (fx; :mod:`prunefx.capture.concrete`). ``notes``: how the capture deviated from the default.
    """

    capture: CapturedBy = "fx"
    auto_leaves: dict[str, str] = field(default_factory=dict)
    training: bool | None = True
    lifted_constants: tuple[str, ...] = ()
    specialised: dict[str, Any] = field(default_factory=dict)
    decisions: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()


def capture_info(gm: fx.GraphModule) -> CaptureInfo:
    """The record of how ``gm`` was captured; the defaults (an fx training-mode trace, nothing recorded) for a
    GraphModule that prunefx did not capture (one passed to ``analyze`` as it is)."""
    info = gm.meta.get(META_KEY)
    return info if isinstance(info, CaptureInfo) else CaptureInfo()


def set_capture_info(gm: fx.GraphModule, info: CaptureInfo) -> None:
    """Record ``info`` as how ``gm`` was captured (replacing any earlier record)."""
    gm.meta[META_KEY] = info


__all__ = ["META_KEY", "Capture", "CapturedBy", "CaptureInfo", "capture_info", "set_capture_info"]
