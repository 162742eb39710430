"""Typed names for what the analysis records: the kind of a record and the role of its channels.

A record is one sliceable thing whose positions the analysis labels: a module's channel dim (``Out``, ``In``,
``Channel``, ``Normalized(j)``), a parameter or buffer dim (``ParamDim(d)``), or a literal in the traced graph that
counts channels (``Literal(path)``, e.g. ``view(b, 512, -1)``). ``str(role)`` is the text tables and JSON show
(``out``, ``in``, ``channel``, ``normalized0``, ``dim1``, ``args[1]``); :func:`parse_role` reads it back.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import NamedTuple


class Kind(enum.Enum):
    """What a record slices: a module's attributes, a parameter/buffer, or a constant in the graph."""

    MODULE = "module"
    PARAM = "param"
    CONST = "const"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Out:
    """A module's output channels (conv/linear out_features, embedding dim)."""

    def __str__(self) -> str:
        return "out"


@dataclass(frozen=True)
class In:
    """A module's input channels (conv in_channels, linear in_features)."""

    def __str__(self) -> str:
        return "in"


@dataclass(frozen=True)
class Channel:
    """The channels of a per-channel layer (BatchNorm, GroupNorm, PReLU): input and output are the same; or a layer's
    inner channels between its input and output (the heads' rows of nn.MultiheadAttention)."""

    def __str__(self) -> str:
        return "channel"


@dataclass(frozen=True)
class Normalized:
    """Dim ``j`` of a LayerNorm/RMSNorm ``normalized_shape``."""

    j: int

    def __str__(self) -> str:
        return f"normalized{self.j}"


@dataclass(frozen=True)
class ParamDim:
    """Dim ``dim`` of a parameter or buffer."""

    dim: int

    def __str__(self) -> str:
        return f"dim{self.dim}"


@dataclass(frozen=True)
class Literal:
    """A literal int at ``node.args[path[0]][path[1]]...`` that equals a channel count."""

    path: tuple[int, ...]

    def __str__(self) -> str:
        return "args" + "".join(f"[{p}]" for p in self.path)


ModuleRole = Out | In | Channel | Normalized
Role = Out | In | Channel | Normalized | ParamDim | Literal
OUT, IN, CHANNEL = Out(), In(), Channel()


class RecordKey(NamedTuple):
    """Identifies a record: its kind, the module / parameter qualified name (or fx node name), and the role."""

    kind: Kind
    name: str
    role: Role


_PATTERNS = (
    (re.compile(r"normalized(\d+)"), lambda m: Normalized(int(m.group(1)))),
    (re.compile(r"dim(\d+)"), lambda m: ParamDim(int(m.group(1)))),
    (re.compile(r"args((?:\[\d+\])+)"), lambda m: Literal(tuple(int(x) for x in re.findall(r"\d+", m.group(1))))),
)


def parse_role(text: str | Role) -> Role:
    """The role a string names (``"out"``, ``"dim1"``, ``"args[1][0]"``...); a role is returned as is."""
    if not isinstance(text, str):
        return text
    fixed = {"out": OUT, "in": IN, "channel": CHANNEL}
    if text in fixed:
        return fixed[text]
    for pattern, make in _PATTERNS:
        m = pattern.fullmatch(text)
        if m:
            return make(m)
    raise ValueError(f"unknown role {text!r}: expected out, in, channel, normalized<j>, dim<d> or args[i]...")
