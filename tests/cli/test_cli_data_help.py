"""``prunefx data shapes --help`` shows its defaults: "[default: ...]" in the help is text, not rich markup."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from prunefx.cli.main import app


def test_shapes_help_shows_the_defaults_of_both_sets() -> None:
    result = CliRunner().invoke(app, ["data", "shapes", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    text = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", result.output))
    for option, default, hard in (("--n-train", 384, 1200), ("--n-val", 96, 300), ("--imgsz", 128, 160)):
        assert re.search(rf"{option} .*?\[default: {default}; --hard {hard}\]", text), (option, result.output)
    assert "\\[" not in result.output  # the escape itself is not shown
