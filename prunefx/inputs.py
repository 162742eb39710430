"""Example inputs from text: shapes with dtypes (``1x1x1024``, ``1x128:int64``) or a saved tensor file.

The command line's ``--input`` (repeatable: one positional input each) reads these, so a model whose input is not
an image (1-D frames, token ids, several tensors) is analysed, pruned and counted on inputs it accepts::

    prunefx analyze pkg.mod:make_net --input 1x1x1024
    prunefx prune pkg.mod:make_lm --input 1x128:int64 --flops 0.5

Floating inputs are uniform in [0, 1); integer ones (token ids, indices) uniform in [0, INT_HIGH), valid for any
vocabulary of at least that many entries; both seeded, so two runs see the same input. A file (``.pt``) is read
weights-only (tensors and plain containers, never code): a tensor is one input, a list or tuple of tensors is
that many inputs, a dict of tensors is one input (a model whose forward takes a batch mapping).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prunefx.errors import SpecError

INT_HIGH = 16  # integer example inputs are drawn from [0, INT_HIGH)
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "bool": torch.bool,
}  # fmt: skip
_SHAPE = re.compile(r"\d+(x\d+)*")
FORMAT = "a shape with an optional dtype, e.g. 1x1x1024 or 1x128:int64, or a .pt file of tensors"


@dataclass(frozen=True)
class InputSpec:
    """One example input: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def tensor(self, generator: torch.Generator) -> torch.Tensor:
        """A seeded tensor of this shape and dtype (floats in [0, 1), integers in [0, INT_HIGH), booleans 0/1)."""
        if self.dtype.is_floating_point:
            return torch.rand(self.shape, generator=generator).to(self.dtype)
        high = 2 if self.dtype is torch.bool else INT_HIGH
        return torch.randint(0, high, self.shape, generator=generator).to(self.dtype)


def parse_input(text: str) -> InputSpec:
    """``SHAPE[:DTYPE]`` as an :class:`InputSpec`; SpecError names what is wrong and the format."""
    shape, _, dtype = text.strip().partition(":")
    if not _SHAPE.fullmatch(shape) or any(int(d) < 1 for d in shape.split("x")):
        raise SpecError(f"--input {text!r}: the shape must be positive sizes joined by 'x'; give {FORMAT}.")
    if dtype and dtype not in DTYPES:
        raise SpecError(f"--input {text!r}: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    return InputSpec(tuple(int(d) for d in shape.split("x")), DTYPES[dtype] if dtype else torch.float32)


def example_inputs(items: Sequence[str], *, seed: int = 0) -> tuple[Any, ...]:
    """The positional example inputs ``items`` describe, in order (each a shape spec or a tensor file)."""
    generator = torch.Generator().manual_seed(seed)
    out: list[Any] = []
    for item in items:
        path = Path(item)
        if path.suffix in (".pt", ".pth") or path.is_file():
            out.extend(_from_file(path))
        else:
            out.append(parse_input(item).tensor(generator))
    return tuple(out)


def _from_file(path: Path) -> list[Any]:
    if not path.is_file():
        raise SpecError(f"--input {path}: no such file; give {FORMAT}.")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)  # tensors and containers only: no code runs
    except Exception as exc:  # noqa: BLE001 - any failure to read is the file's problem, named in one line
        raise SpecError(f"--input {path}: not a weights-only tensor file ({type(exc).__name__}: "
                        f"{str(exc).strip().splitlines()[0][:200]}); save inputs with torch.save(tensor_or_list, path)"
                        ) from None
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, (list, tuple)) and data and all(isinstance(t, torch.Tensor) for t in data):
        return list(data)
    if isinstance(data, dict) and data and all(isinstance(t, torch.Tensor) for t in data.values()):
        return [dict(data)]
    raise SpecError(f"--input {path}: holds {type(data).__name__}, not a tensor, a list of tensors or a dict of "
                    "tensors; save the model's inputs with torch.save")


__all__ = ["DTYPES", "FORMAT", "INT_HIGH", "InputSpec", "example_inputs", "parse_input"]
