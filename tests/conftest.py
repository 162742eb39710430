"""Test-wide setup: ultralytics offline with a repo-local config dir, before anything imports it."""

import os
from pathlib import Path

import pytest

_CACHE = Path(__file__).resolve().parents[1] / ".cache"
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", str(_CACHE / "yolo"))
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
