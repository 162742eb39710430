"""One validator for every config dataclass: ``from_dict`` builds it from plain data, ``to_dict`` turns it back.

Both are driven by the dataclass's fields and annotations, so a setting is declared once (its type and default in
the dataclass, its range checks in ``__post_init__``) and reads the same from Python, YAML, JSON and ``key=value``:

    cfg = from_dict(PlanConfig, {"flops": "5e-1", "ignore": ["model.22.*"]}, where="prune")
    assert from_dict(PlanConfig, to_dict(cfg)) == cfg

Conversions: an int is a float; a string that parses as a number is a float where a float is expected (YAML 1.1
reads ``1e-3`` as a string); a list is a tuple; a mapping is a nested dataclass. A bool is never a number. An
unknown key is an error naming the closest known spelling.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar, Union

from prunefx.errors import PrunefxError

T = TypeVar("T")


class ConfigError(PrunefxError):
    """A config is invalid; the message names the key and the fix."""


def load_yaml(text: str, source: str) -> Any:
    """Parse YAML ``text`` (named ``source`` in errors) as plain data; an alias is a :class:`ConfigError`."""
    # Nested aliases expand exponentially once anything walks the data (a "billion laughs" file of ten lines is
    # billions of values), so the first alias (also a `<<: *name` merge) is refused before any value is built.
    # Syntax errors stay yaml.YAMLError for the caller to phrase.
    loader = _no_alias_loader()(text)
    loader.prunefx_source = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@functools.cache
def _no_alias_loader() -> type:
    import yaml  # on first use: `import prunefx` stays free of yaml

    class NoAliasLoader(yaml.SafeLoader):
        """SafeLoader whose composer refuses an alias event instead of resolving it to the anchored node."""

        prunefx_source = "the YAML document"

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                mark = event.start_mark
                raise ConfigError(
                    f"{self.prunefx_source} uses the YAML alias *{event.anchor} (line {mark.line + 1}); prunefx "
                    "configs take no anchors or aliases (nested aliases expand to billions of values): write the "
                    "values out in full"
                )
            return super().compose_node(parent, index)

    return NoAliasLoader


def check_keys(given: Iterable[Any], known: Iterable[str], where: str, *, what: str = "key") -> None:
    """Raise :class:`ConfigError` naming every unknown key in ``given`` with the closest known spelling."""
    known = sorted(known)
    bad = [k for k in given if k not in known]
    if not bad:
        return
    hints = []
    for k in bad:
        close = difflib.get_close_matches(str(k), known, n=1, cutoff=0.6)
        hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    plural = "s" if len(bad) > 1 else ""
    raise ConfigError(f"unknown {what}{plural} in {where}: {', '.join(hints)}; known {what}s: {', '.join(known)}")


def field_names(cls: type) -> tuple[str, ...]:
    """The keys ``from_dict(cls, ...)`` accepts: the dataclass's init fields."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_"))


def from_dict(cls: type[T], data: Any, where: str = "", *, error: type[PrunefxError] = ConfigError) -> T:
    """Build dataclass ``cls`` from a mapping, converting and checking each value against its annotation.

    ``where`` prefixes every message (``prune.sparsity``). The class's own ``__post_init__`` checks run too; their
    :class:`~prunefx.errors.PrunefxError` comes back as ``error`` with ``where`` in front.
    """
    label = where or cls.__name__
    if not isinstance(data, Mapping):
        raise error(f"{label} must be a block of keys ({', '.join(field_names(cls))}), got {data!r}")
    names = field_names(cls)
    try:
        check_keys(data, names, label)
    except ConfigError as exc:
        raise error(str(exc)) from None
    missing = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise error(f"{label}: missing {', '.join(repr(m) for m in missing)}")
    hints = _hints(cls)
    kwargs = {k: convert(v, hints[k], f"{where}.{k}" if where else k, error=error) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except PrunefxError as exc:
        if isinstance(exc, error) and not where:
            raise
        raise error(f"{where}: {exc}" if where else str(exc)) from exc


def check_fields(obj: Any, *, error: type[PrunefxError] = ConfigError) -> None:
    """Check every field of dataclass instance ``obj`` against its annotation, storing the converted value.

    Call it first in ``__post_init__``: a config built in Python (``TrainConfig(optimizer="adam")``) then gets the
    same checks and conversions (a list stored as a tuple, an int as a float) as one read by :func:`from_dict`.
    """
    hints = _hints(type(obj))
    for name in field_names(type(obj)):
        value = getattr(obj, name)
        converted = convert(value, hints[name], name, error=error)
        if converted is not value:
            object.__setattr__(obj, name, converted)  # frozen dataclasses too: this runs during construction


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def convert(value: Any, kind: Any, key: str, *, error: type[PrunefxError] = ConfigError) -> Any:
    """``value`` as annotation ``kind`` (see the module docstring), or ``error`` naming ``key`` and the type."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        inner = options[0] if len(options) == 1 else None
        if inner is not None and (dataclasses.is_dataclass(inner) or typing.get_origin(inner) is not None):
            return convert(value, inner, key, error=error)  # X | None: X's own message says what is wrong inside
        for option in options:
            try:
                return convert(value, option, key, error=error)
            except PrunefxError:
                continue
        raise error(f"{key} must be {describe(kind)}, got {value!r}")
    if origin is Literal:
        if value in args and not isinstance(value, bool):
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise error(f"{key} must be one of {', '.join(repr(a) for a in args)}, got {value!r}{hint}")
    if dataclasses.is_dataclass(kind):
        return value if isinstance(value, kind) else from_dict(kind, value, key, error=error)
    if origin in (tuple, list) or kind in (tuple, list):
        of_strings = args and (args[0] is str or typing.get_origin(args[0]) is Literal)
        if isinstance(value, str) and of_strings and (len(args) == 1 or args[-1] is Ellipsis):
            value = [value]  # one pattern / one item: `augment: crop`, `ignore: model.22.*`
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
            raise error(f"{key} must be {describe(kind)}, got {value!r}")
        items = list(value)
        if origin is tuple and args and args[-1] is not Ellipsis:  # a fixed-length tuple: (pattern, ratio)
            if len(items) != len(args):
                raise error(f"{key} must be {describe(kind)}, got {value!r}")
            out = [convert(v, a, f"{key}[{i}]", error=error) for i, (v, a) in enumerate(zip(items, args, strict=True))]
        else:
            item = args[0] if args else Any
            out = [convert(v, item, f"{key}[{i}]", error=error) for i, v in enumerate(items)]
        if all(a is b for a, b in zip(out, items, strict=True)) and type(value) is (origin or kind):
            return value  # already right: keep the object (check_fields stores only what changed)
        return tuple(out) if (origin or kind) is tuple else out
    if origin in (dict, Mapping) or kind in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise error(f"{key} must be {describe(kind)}, got {value!r}")
        vkind = args[1] if len(args) == 2 else Any
        return {str(k): convert(v, vkind, f"{key}.{k}", error=error) for k, v in value.items()}
    if kind is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise error(f"{key} must be a number, got {value!r}")
        return value if type(value) is float else float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(f"{key} must be an integer, got {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise error(f"{key} must be true/false, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise error(f"{key} must be a string, got {value!r}")
        return value
    if isinstance(kind, type) and not isinstance(value, kind):
        raise error(f"{key} must be {describe(kind)}, got {value!r}")
    return value


def describe(kind: Any) -> str:
    """An annotation in words, for messages: ``a number or null``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (tuple, list) or kind in (tuple, list):
        return "a list"
    if origin in (dict, Mapping) or kind in (dict, Mapping) or dataclasses.is_dataclass(kind):
        return "a block of keys"
    names = {type(None): "null", str: "a string", float: "a number", int: "an integer", bool: "true/false"}
    return names.get(kind, getattr(kind, "__name__", str(kind)))


def to_dict(obj: Any) -> Any:
    """A dataclass (recursively) as plain JSON/YAML data: tuples become lists; ``from_dict`` reads it back."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {name: to_dict(getattr(obj, name)) for name in field_names(type(obj))}
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return [to_dict(v) for v in obj]
    return obj


__all__ = ["ConfigError", "check_fields", "check_keys", "convert", "describe", "field_names", "from_dict", "load_yaml",
           "to_dict"]
