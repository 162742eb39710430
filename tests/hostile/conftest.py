"""The ``sandbox`` fixture of the hostile-input tests (helpers in tests/_hostile.py)."""

import shutil
from pathlib import Path

import pytest
from _hostile import MODELS_PY, REPO, Sandbox


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    box = Sandbox(tmp_path / "work", tmp_path / "work" / "runs", tmp_path / "work" / "outside", tmp_path / "MARKER")
    box.root.mkdir()
    box.outside.mkdir()
    (box.outside / "keep.txt").write_text("a user's file next to the project\n")
    (box.root / "hostile_models.py").write_text(MODELS_PY)
    for name in ("yolo.yaml", "digits_cnn.yaml"):
        shutil.copy(REPO / "configs" / name, box.root / name)
    monkeypatch.chdir(box.root)
    return box
