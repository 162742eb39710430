"""Test-wide setup: ultralytics offline with a repo-local config dir, before anything imports it."""

import os

import pytest

from prunefx.integrations.ultralytics_env import setup_offline

setup_offline()
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
