"""--input: analyze, flops and prune a model whose input is not an image; bad text is one error line, exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import prunefx
from prunefx.cli.main import app
from prunefx.metrics import measure

TESTS = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(autouse=True)
def factories_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))


def test_flops_of_token_ids_equal_the_librarys_count(tmp_path: Path) -> None:
    import _factories

    out = tmp_path / "flops.json"
    res = runner.invoke(app, ["flops", "_factories:token_mlp", "--input", "1x128:int64", "--json", str(out)])
    assert res.exit_code == 0, res.output
    counted = json.loads(out.read_text())
    ids = torch.zeros(1, 128, dtype=torch.int64)
    expected = measure(_factories.token_mlp().eval(), (ids,))
    assert counted["macs"] == expected.macs and counted["params"] == expected.params


def test_a_1d_model_is_pruned_and_verified_on_its_own_input_shape(tmp_path: Path) -> None:
    res = runner.invoke(app, ["prune", "_factories:frames_cnn", "--input", "2x1x1024", "--flops", "0.5",
                              "--criterion", "l1", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["input_shapes"] == [[2, 1, 1024]]
    pruned = prunefx.load(tmp_path / "run" / "pruned.pt", __import__("_factories").frames_cnn)
    assert pruned(torch.rand(2, 1, 1024)).shape == (2, 8)


def test_bad_input_text_is_one_error_line_with_exit_2() -> None:
    res = runner.invoke(app, ["analyze", "_factories:frames_cnn", "--input", "1xq"])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "1x128:int64" in res.output


@pytest.mark.parametrize("shape", ["1x1x100000x100000", "1x" + "9" * 5000, "1x" * 40 + "1"],
                         ids=["40 GB", "5000 digits", "41 dims"])
def test_a_huge_input_shape_is_one_line_before_anything_is_allocated(shape: str) -> None:
    """``--input 1x1x100000x100000`` (40 GB of floats) used to reach the allocator: a traceback, or the OOM killer."""
    res = runner.invoke(app, ["analyze", "_factories:frames_cnn", "--input", shape], env={"COLUMNS": "300"})
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0, res.output
    assert "Traceback" not in res.output
    assert re.search(r"more than 268,435,456 elements, the most .*give a smaller shape|more than the 16", res.output)


def test_batch_with_given_inputs_is_refused_naming_the_fix() -> None:
    res = runner.invoke(app, ["flops", "_factories:frames_cnn", "--input", "1x1x1024", "--batch", "4"])
    assert res.exit_code == 2 and "give the batch in its shape" in res.output


def test_keyword_inputs_by_name_prune_and_count_the_forward_they_name(tmp_path: Path) -> None:
    import _factories

    px = torch.rand(1, 3, 8, 8)
    out = tmp_path / "flops.json"
    res = runner.invoke(app, ["flops", "_factories:two_tower", "--input", "pixel_values=1x3x8x8", "--json", str(out)])
    assert res.exit_code == 0, res.output
    expected = measure(_factories.two_tower(), {"pixel_values": px})  # the image tower only: ids not given
    assert json.loads(out.read_text())["macs"] == expected.macs
    res = runner.invoke(app, ["prune", "_factories:two_tower", "--input", "input_ids=2x5:int64", "--input",
                              "pixel_values=2x3x8x8", "--ratio", "0.5", "--criterion", "l1", "--out",
                              str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    pruned = prunefx.load(tmp_path / "run" / "pruned.pt", _factories.two_tower)
    assert pruned.mlp[0].out_features < 32
    assert pruned(input_ids=torch.zeros(2, 5, dtype=torch.int64), pixel_values=torch.rand(2, 3, 8, 8)).shape == (2, 4)


def test_a_wrong_input_name_is_one_error_line_naming_the_parameters() -> None:
    res = runner.invoke(app, ["analyze", "_factories:two_tower", "--input", "pixels=1x3x8x8"])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0
    assert "input_ids, attention_mask, pixel_values" in res.output
