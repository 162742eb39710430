"""What an untrusted ultralytics model yaml may say: ultralytics' ``parse_model`` runs parts of it as code.

It evaluates the ``activation:`` string with ``eval`` and calls whatever global of ``ultralytics.nn.tasks`` a layer
names (``torch_safe_load``, ``check_requirements``, ...). Unless the yaml is trusted, the activation must be a
``torch.nn`` activation with literal arguments (``nn.SiLU()``, ``torch.nn.LeakyReLU(0.1)``) and every layer's
module a model layer class; layer arguments are literals or names of parse_model's variables (``nc``), which it
reads without running anything.

    check_model_yaml(yaml_model_load("evil.yaml"), "evil.yaml")   # raises UntrustedFileError
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping
from typing import Any

from torch import nn

from prunefx._io import TRUST_HINT
from prunefx.errors import PrunefxError, TrustWarning, UntrustedFileError

# The activations a yaml may name: torch.nn's activation module (plus Identity, "no activation").
ACTIVATIONS = frozenset(nn.modules.activation.__all__) | {"Identity"}


def check_model_yaml(cfg: Mapping[str, Any], name: str, *, trust_checkpoint: bool = False) -> None:
    """Refuse a model yaml (as ``yaml_model_load`` read it) whose build would run code, unless it is trusted.

    Raises :class:`UntrustedFileError` for code and :class:`PrunefxError` for a layer no module answers to;
    a trusted yaml that needs the trust gets a TrustWarning naming it instead.
    """
    problems = _code_in(cfg)
    for layer in _layers(cfg):
        module = layer[2] if isinstance(layer, (list, tuple)) and len(layer) == 4 else None
        if isinstance(module, str) and _layer_class(module) is None and not _exists(module):
            close = difflib.get_close_matches(module, _layer_names(), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise PrunefxError(f"model yaml {name}: unknown layer module {module!r}{hint}")
    if not problems:
        return
    if trust_checkpoint:
        import warnings

        warnings.warn(f"building {name} with {problems[0]} evaluated (trust_checkpoint)", TrustWarning, stacklevel=2)
        return
    raise UntrustedFileError(
        f"model yaml {name} was not built: ultralytics would run part of it as code ({problems[0]}); name only "
        f"torch.nn activations (e.g. activation: nn.SiLU()) and ultralytics' layer modules, or {TRUST_HINT}"
    )


def _code_in(cfg: Mapping[str, Any]) -> list[str]:
    """Each part of ``cfg`` that parse_model would evaluate or call beyond known layers, described."""
    found = []
    act = cfg.get("activation")
    if act is not None and not _known_activation(act):
        found.append(f"activation {act!r} is not a torch.nn activation with literal arguments")
    for i, layer in enumerate(_layers(cfg)):
        module = layer[2] if isinstance(layer, (list, tuple)) and len(layer) == 4 else None
        if isinstance(module, str) and _layer_class(module) is None and _exists(module):
            found.append(f"layer {i} names {module!r}, which is not a model layer")
    return found


def _layers(cfg: Mapping[str, Any]) -> list[Any]:
    return [*(cfg.get("backbone") or []), *(cfg.get("head") or [])]


def _known_activation(act: Any) -> bool:
    """``[torch.]nn.Name(literal, ...)`` with Name one of :data:`ACTIVATIONS` (what parse_model may eval safely)."""
    if not isinstance(act, str):
        return False
    try:
        call = ast.parse(act.strip(), mode="eval").body
    except SyntaxError:
        return False
    if not isinstance(call, ast.Call):
        return False
    path, node = [], call.func
    while isinstance(node, ast.Attribute):
        path.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return False
    path.append(node.id)
    if path[1:] not in (["nn"], ["nn", "torch"]) or path[0] not in ACTIVATIONS:
        return False
    try:
        for arg in (*call.args, *(kw.value for kw in call.keywords)):
            ast.literal_eval(arg)
    except ValueError:
        return False
    return all(kw.arg is not None for kw in call.keywords)  # no **kwargs


def _layer_class(module: str) -> type[nn.Module] | None:
    """The class parse_model resolves ``module`` to, if it is a model layer (an nn.Module subclass)."""
    obj = _resolve(module)
    return obj if isinstance(obj, type) and issubclass(obj, nn.Module) else None


def _exists(module: str) -> bool:
    return _resolve(module) is not None


def _resolve(module: str) -> Any:
    """What parse_model's lookup of a layer's module string finds (``nn.X``, ``torchvision.ops.X``, a tasks global)."""
    if module.startswith("nn."):
        return getattr(nn, module[3:], None)
    if module.startswith("torchvision.ops."):
        import torchvision

        return getattr(torchvision.ops, module[16:], None)
    from ultralytics.nn import tasks

    return vars(tasks).get(module)


def _layer_names() -> list[str]:
    from ultralytics.nn import tasks

    return [k for k, v in vars(tasks).items() if isinstance(v, type) and issubclass(v, nn.Module)]
