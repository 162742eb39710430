"""Example inputs from text: shapes with dtypes (``1x1x1024``, ``1x128:int64``), tensor files, a factory.

The command line's ``--input`` (repeatable) reads these, so a model whose input is not an image (1-D frames,
token ids, several tensors, inputs taken by name) is analysed, pruned and counted on inputs it accepts::

    prunefx analyze pkg.mod:make_net --input 1x1x1024                   # one positional input
    prunefx prune pkg.mod:make_lm --input 1x128:int64 --flops 0.5       # token ids
    prunefx prune pkg.mod:make_vlm --input input_ids=1x16:int64 --input pixel_values=1x3x32x32   # by name
    prunefx prune pkg.mod:make_net --input pkg.mod:make_inputs          # the user's function builds them

``NAME=`` makes an item a keyword input (bound by the forward's signature, :mod:`prunefx.capture.inputs`).
Floating inputs are uniform in [0, 1); integer ones (token ids, indices) uniform in [0, INT_HIGH), valid for any
vocabulary of at least that many entries; both seeded, so two runs see the same input. A file (``.pt``) is read
weights-only (tensors and plain containers, never code) the way ``prunefx.prune`` reads its example inputs: a
tensor is one input, a list or tuple is that many positional inputs (each a tensor or a dict of tensors), a dict
of tensors is keyword inputs (``model(**batch)``, as a tokenizer's output is called). A factory
``package.module:function`` is called with no arguments and returns any of those (or a
:class:`~prunefx.capture.inputs.Inputs`); like a factory SPEC, it runs the code it names: that is what it is for.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prunefx.capture.inputs import Inputs
from prunefx.errors import SpecError

INT_HIGH = 16  # integer example inputs are drawn from [0, INT_HIGH)
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "bool": torch.bool,
}  # fmt: skip
_SHAPE = re.compile(r"\d+(x\d+)*")
# An example input is for analysis and a few forward passes: 2**28 elements (1 GiB of float32) is far beyond any
# model's input, and refusing above it keeps a typo (1x1x100000x100000) from reaching the allocator.
MAX_ELEMENTS = 2**28
MAX_DIMS = 16
FORMAT = ("a shape with an optional dtype, e.g. 1x1x1024 or 1x128:int64, a .pt file of tensors, or a "
          "package.module:function that returns the inputs")


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
    shown = text if len(text) <= 60 else f"{text[:57]}..."
    # A size of over 12 digits is over the cap anyway (and int() of thousands of digits is itself an error).
    sizes = [int(d) if len(d) <= 12 else MAX_ELEMENTS + 1 for d in shape.split("x")] if _SHAPE.fullmatch(shape) else []
    if not sizes or any(d < 1 for d in sizes):
        raise SpecError(f"--input {shown!r}: the shape must be positive sizes joined by 'x'; give {FORMAT}.")
    if dtype and dtype not in DTYPES:
        raise SpecError(f"--input {shown!r}: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}.")
    if len(sizes) > MAX_DIMS:
        raise SpecError(f"--input {shown!r}: {len(sizes)} dimensions, more than the {MAX_DIMS} an example input may "
                        "have; give the shape the model takes, e.g. 1x3x224x224.")
    if math.prod(sizes) > MAX_ELEMENTS:
        raise SpecError(f"--input {shown!r}: more than {MAX_ELEMENTS:,} elements, the most an example input from a "
                        "shape may have (it is only for analysis); give a smaller shape (batch 1 and the model's "
                        "usual size, e.g. 1x3x224x224), or pass a .pt file of the tensors.")
    return InputSpec(tuple(sizes), DTYPES[dtype] if dtype else torch.float32)


def example_inputs(items: Sequence[str], *, seed: int = 0) -> Inputs:
    """The example inputs ``items`` describe, in order: positional ones, then ``NAME=``-keyword ones."""
    generator = torch.Generator().manual_seed(seed)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for item in items:
        name, eq, rest = item.partition("=")
        if eq:
            name = name.strip()
            if not name.isidentifier():
                raise SpecError(f"--input {item!r}: {name!r} is not a parameter name; give NAME={FORMAT}")
            if name in kwargs:
                raise SpecError(f"--input {item!r}: {name} is given twice")
            read = _one(rest, generator, item)
            if len(read.args) != 1 or read.kwargs:
                raise SpecError(f"--input {item!r}: a keyword input is one tensor; give NAME=SHAPE or NAME=FILE "
                                "(a file of one tensor)")
            kwargs[name] = read.args[0]
        else:
            if kwargs:
                raise SpecError(f"--input {item!r}: positional inputs come before the NAME= ones")
            read = _one(item, generator, item)
            if read.kwargs and (args or kwargs):
                raise SpecError(f"--input {item!r}: a file of keyword inputs gives them all; give it alone or "
                                "give each as NAME=FILE")
            args.extend(read.args)
            kwargs.update(read.kwargs)
    return Inputs(*args, **kwargs)


def _one(text: str, generator: torch.Generator, item: str) -> Inputs:
    path = Path(text)
    try:
        is_file = path.is_file()
    except OSError:  # a name too long for a file (a shape of thousands of digits): not a file, then
        is_file = False
    if path.suffix in (".pt", ".pth") or is_file:
        return _from_file(path)
    return Inputs(parse_input(text).tensor(generator))


def _from_file(path: Path) -> Inputs:
    if not path.is_file():
        raise SpecError(f"--input {path}: no such file; give {FORMAT}.")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)  # tensors and containers only: no code runs
    except Exception as exc:  # noqa: BLE001 - any failure to read is the file's problem, named in one line
        raise SpecError(f"--input {path}: not a weights-only tensor file ({type(exc).__name__}: "
                        f"{str(exc).strip().splitlines()[0][:200]}); save inputs with torch.save(tensor_or_list, path)"
                        ) from None
    return as_inputs(data, f"--input {path}: holds")


def _tensors(x: Any) -> bool:
    return isinstance(x, torch.Tensor) or (
        isinstance(x, dict) and bool(x) and all(isinstance(t, torch.Tensor) for t in x.values()))


def as_inputs(data: Any, what: str) -> Inputs:
    """``data`` read as ``prunefx.prune`` reads example inputs; SpecError (``what`` it is, then its type) when it
    holds something else."""
    if isinstance(data, Inputs):
        return data
    if isinstance(data, torch.Tensor):
        return Inputs(data)
    if isinstance(data, (list, tuple)) and data and all(_tensors(t) for t in data):
        return Inputs(*data)
    if isinstance(data, dict) and data and all(isinstance(k, str) for k in data) and _tensors(data):
        return Inputs(**data)
    raise SpecError(f"{what} {type(data).__name__}, not a tensor, a list of tensors, a dict of tensors (keyword "
                    "inputs) or prunefx.Inputs(...); save or return the model's inputs as one of those")


__all__ = ["DTYPES", "FORMAT", "INT_HIGH", "MAX_ELEMENTS", "InputSpec", "as_inputs", "example_inputs", "parse_input"]
