"""Calls into user code (a task's data, metric and loss; recover's metric, task_loss and data): any ``Exception`` or
``SystemExit`` becomes one :class:`UserCodeError` naming the function.

    metric = fenced(resolve_factory(spec), "metric", name=spec)
    value = metric(model, batches)   # "the metric examples.sine:metric raised ValueError: ...; fix the function"

``KeyboardInterrupt`` passes (Ctrl-C stops a run resumably), and so does a :class:`PrunefxError` (already one line
saying what to fix, e.g. from a prunefx call the function makes or a fenced call inside it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prunefx.errors import PrunefxError

F = TypeVar("F", bound=Callable[..., Any])


class UserCodeError(PrunefxError):
    """A function the user gave raised or exited; the message names it."""


def fenced(fn: F, what: str, *, name: str | None = None, fix: str = "fix the function") -> F:
    """``fn``, whose failures become a :class:`UserCodeError`: ``the <what> <name> raised <type>: <text>; <fix>``."""
    label = name or describe(fn)

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PrunefxError:
            raise
        except SystemExit as exc:  # an exit inside prunefx would end the run without its report, maybe with 0
            code = "" if exc.code is None else repr(exc.code)
            raise UserCodeError(f"the {what} {label} called sys.exit({code}) instead of returning; {fix} (it must "
                                "return, or raise an error)") from exc
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [""])[0][:300]
            raise UserCodeError(f"the {what} {label} raised {type(exc).__name__}"
                                f"{': ' + text if text else ''}; {fix}") from exc

    return call  # type: ignore[return-value]


def describe(fn: Any) -> str:
    """``module:qualname`` of a function (the form a config names it by), else its type's name."""
    qualname = getattr(fn, "__qualname__", None)
    module = getattr(fn, "__module__", None)
    if isinstance(qualname, str) and isinstance(module, str):
        return f"{module}:{qualname}"
    return type(fn).__name__


__all__ = ["UserCodeError", "describe", "fenced"]
