"""The public surface (``prunefx.__all__``, the HF API, the CLI's commands and options, the config keys) equals the
checked-in ``tests/public_surface.json``, so that a change to it is deliberate; renamed modules keep an alias.

After a deliberate change: ``python tests/test_public_surface.py --write`` and commit the file with the change.
"""

from __future__ import annotations

import importlib
import json
import sys
import warnings
from pathlib import Path

import pytest

SURFACE = Path(__file__).with_name("public_surface.json")


def surface() -> dict[str, object]:
    """What users can name: Python names, CLI commands with their options, config keys per pipeline."""
    import typer.main

    import prunefx
    from prunefx._config import field_names
    from prunefx.cli.main import app
    from prunefx.integrations import transformers as pfx_hf
    from prunefx.pipeline.backends import classify, custom, llm
    from prunefx.pipeline.run_config import RUN_KEYS
    from prunefx.plan import PlanConfig
    from prunefx.train.recover import RecoverConfig

    def commands(group, prefix: str = "") -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for name, cmd in sorted(group.commands.items()):
            if hasattr(cmd, "commands"):
                found |= commands(cmd, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = sorted(
                    opt for p in cmd.params for opt in (p.opts if p.opts and p.opts[0].startswith("-") else [p.name]))
        return found

    return {
        "prunefx": sorted(prunefx.__all__),
        "prunefx.integrations.transformers": sorted(pfx_hf.__all__),
        "cli": commands(typer.main.get_command(app)),
        "config": {
            "run": sorted(RUN_KEYS),
            "classification": sorted(set(classify.TOP_KEYS)),
            "custom": sorted(set(custom.TOP_KEYS)),
            "llm": sorted(set(llm.TOP_KEYS)),
            "prune (PlanConfig)": sorted(field_names(PlanConfig)),
            "recover (RecoverConfig)": sorted(field_names(RecoverConfig)),
        },
    }


def test_public_surface_is_the_checked_in_one() -> None:
    expected = json.loads(SURFACE.read_text())
    now = surface()
    changed = sorted(k for k in expected.keys() | now.keys() if expected.get(k) != now.get(k))
    assert not changed, (f"the public surface changed in {changed}; if deliberate, run "
                         "`python tests/test_public_surface.py --write` and commit tests/public_surface.json")


@pytest.mark.parametrize("old", sorted(importlib.import_module("prunefx._renamed").RENAMED))
def test_renamed_module_keeps_an_alias(old: str) -> None:
    from prunefx._renamed import RENAMED

    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias = importlib.import_module(old)
    new = importlib.import_module(RENAMED[old])
    assert any(issubclass(w.category, FutureWarning) and RENAMED[old] in str(w.message) for w in caught)
    public = [n for n in getattr(new, "__all__", dir(new)) if not n.startswith("_")]
    assert public and all(getattr(alias, n) is getattr(new, n) for n in public)


def test_api_reference_lists_every_public_name() -> None:
    """docs/reference renders every name of ``prunefx.__all__`` and of the HF API (``::: module.name``)."""
    import re

    import prunefx
    from prunefx.integrations import transformers as pfx_hf

    pages = (Path(__file__).resolve().parents[1] / "docs" / "reference").glob("*.md")
    documented = {m.rsplit(".", 1)[-1] for p in pages for m in re.findall(r"^::: ([\w.]+)$", p.read_text(), re.M)}
    missing = sorted(n for n in (*prunefx.__all__, *pfx_hf.__all__) if n not in documented)
    assert not missing, f"public names with no ::: entry in docs/reference: {missing}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    SURFACE.write_text(json.dumps(surface(), indent=1) + "\n")
    print(f"wrote {SURFACE}")
