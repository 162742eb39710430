"""Example inputs from text (``--input``): shapes, dtypes, files; bad text is one error naming the format."""

from __future__ import annotations

import pytest
import torch

from prunefx.errors import SpecError
from prunefx.inputs import INT_HIGH, InputSpec, example_inputs, parse_input
from prunefx.spec import load_spec


def test_shapes_and_dtypes_parse() -> None:
    assert parse_input("1x1x1024") == InputSpec((1, 1, 1024), torch.float32)
    assert parse_input("2x128:int64") == InputSpec((2, 128), torch.int64)
    assert parse_input(" 3:bool ") == InputSpec((3,), torch.bool)


@pytest.mark.parametrize("bad", ["", "1xq", "1x0x3", "x3", "2x3:complex"])
def test_bad_text_names_the_format(bad: str) -> None:
    with pytest.raises(SpecError, match=r"--input .*(1x128:int64|use one of)"):
        parse_input(bad)


def test_values_are_seeded_and_in_range() -> None:
    a, ids = example_inputs(["2x3x5", "4x64:int64"]).args
    again, ids_again = example_inputs(["2x3x5", "4x64:int64"]).args
    assert torch.equal(a, again) and torch.equal(ids, ids_again)
    assert a.dtype == torch.float32 and 0 <= a.min() and a.max() < 1
    assert ids.dtype == torch.int64 and 0 <= int(ids.min()) and int(ids.max()) < INT_HIGH


def test_files_hold_a_tensor_a_list_or_a_dict(tmp_path) -> None:
    x, y = torch.randn(1, 2, 3), torch.arange(4)
    torch.save(x, tmp_path / "one.pt")
    torch.save([x, y], tmp_path / "two.pt")
    torch.save({"a": x}, tmp_path / "mapping.pt")
    torch.save([{"a": x}], tmp_path / "batch.pt")
    (one,) = example_inputs([str(tmp_path / "one.pt")]).args
    assert torch.equal(one, x)
    first, second = example_inputs([str(tmp_path / "two.pt")]).args
    assert torch.equal(first, x) and torch.equal(second, y)
    keywords = example_inputs([str(tmp_path / "mapping.pt")])  # a dict is keyword inputs, as model(**batch)
    assert keywords.args == () and set(keywords.kwargs) == {"a"} and torch.equal(keywords.kwargs["a"], x)
    (batch,) = example_inputs([str(tmp_path / "batch.pt")]).args  # a dict inside a list: one positional input
    assert set(batch) == {"a"} and torch.equal(batch["a"], x)


def test_named_items_are_keyword_inputs_after_the_positional_ones(tmp_path) -> None:
    torch.save(torch.ones(2, 3), tmp_path / "mask.pt")
    got = example_inputs(["1x4", "ids=1x8:int64", f"mask={tmp_path / 'mask.pt'}"])
    assert len(got.args) == 1 and got.args[0].shape == (1, 4)
    assert list(got.kwargs) == ["ids", "mask"] and got.kwargs["ids"].dtype == torch.int64
    assert torch.equal(got.kwargs["mask"], torch.ones(2, 3))
    with pytest.raises(SpecError, match="positional inputs come before"):
        example_inputs(["ids=1x8:int64", "1x4"])
    with pytest.raises(SpecError, match="given twice"):
        example_inputs(["ids=1x8:int64", "ids=1x2"])
    with pytest.raises(SpecError, match="not a parameter name"):
        example_inputs(["1ids=1x8"])


def test_a_factory_builds_the_inputs(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    loaded = load_spec("_factories:two_tower", inputs=["_factories:keyword_inputs"])
    ids, mask, pixels = loaded.example_inputs  # bound by position: attention_mask at its default
    assert ids.shape == (2, 5) and mask is None and pixels.shape == (2, 3, 8, 8)
    with pytest.raises(SpecError, match="give it alone"):
        load_spec("_factories:two_tower", inputs=["_factories:keyword_inputs", "1x4"])
    with pytest.raises(SpecError, match="returned int"):
        load_spec("_factories:two_tower", inputs=["_factories:not_inputs"])
    with pytest.raises(SpecError, match="raised ValueError: no data here"):
        load_spec("_factories:two_tower", inputs=["_factories:inputs_that_raise"])


class Unsafe:
    pass


def test_a_file_that_would_run_code_is_refused(tmp_path) -> None:
    torch.save({"x": Unsafe()}, tmp_path / "code.pt")
    with pytest.raises(SpecError, match="not a weights-only tensor file"):
        example_inputs([str(tmp_path / "code.pt")])
    with pytest.raises(SpecError, match="no such file"):
        example_inputs([str(tmp_path / "missing.pt")])
    torch.save(3, tmp_path / "number.pt")
    with pytest.raises(SpecError, match="holds int, not a tensor"):
        example_inputs([str(tmp_path / "number.pt")])


def test_load_spec_takes_inputs_instead_of_an_image(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    loaded = load_spec("_factories:token_mlp", inputs=["1x12:int64"])
    (ids,) = loaded.example_inputs
    assert ids.shape == (1, 12) and ids.dtype == torch.int64 and loaded.given
    assert loaded.model(ids).shape == (1, 12, 16)
    with pytest.raises(SpecError, match="either --imgsz .* or --input"):
        load_spec("_factories:token_mlp", imgsz=32, inputs=["1x12:int64"])


def test_load_spec_binds_keyword_inputs_by_the_forwards_signature(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    loaded = load_spec("_factories:two_tower", inputs=["pixel_values=1x3x8x8"])
    assert loaded.example_inputs[0] is None and loaded.example_inputs[2].shape == (1, 3, 8, 8)
    assert len(loaded.example_inputs) == 3  # input_ids, attention_mask at their defaults, then pixel_values
    with pytest.raises(SpecError, match="not a parameter of TwoTower.forward"):
        load_spec("_factories:two_tower", inputs=["pixels=1x3x8x8"])
