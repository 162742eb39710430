"""Test-wide setup: ultralytics offline with a repo-local config dir, before anything imports it."""

import os

import pytest

from prunefx.integrations.ultralytics.env import setup_offline

setup_offline()
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Refuse DNS lookups and socket connects, recording each attempt (nothing may download)."""
    import socket

    attempts: list[str] = []

    def refuse_lookup(host, *args, **kwargs):
        attempts.append(f"getaddrinfo {host}")
        raise socket.gaierror(socket.EAI_NONAME, "network disabled in tests")

    def refuse_connect(self, address):
        attempts.append(f"connect {address}")
        raise OSError("network disabled in tests")

    monkeypatch.setattr(socket, "getaddrinfo", refuse_lookup)
    monkeypatch.setattr(socket.socket, "connect", refuse_connect)
    return attempts


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)


def _malloc_trim():
    """glibc's malloc_trim, or a no-op where there is none (another libc, macOS)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return lambda _pad: 0


_TRIM = _malloc_trim()


@pytest.fixture(autouse=True)
def _release_memory():
    """After each test: collect cyclic garbage and hand freed heap back to the OS.

    fx GraphModules are reference cycles (graph <-> nodes <-> module), so a traced zoo model's weights wait for a
    full collection, which the generational collector runs rarely; thousands of tests in one process (the CI
    command) would otherwise keep several models' weights, and glibc their freed pages, alive at once.
    """
    yield
    import gc

    gc.collect()
    _TRIM(0)


# Slow tests run in the same command as the rest, while a wall-clock budget lasts (CI has 90 minutes for install
# (~10) + tests, and a slow test started near the end may take a few more); past it they are skipped with a reason,
# never silently dropped. On a quiet 2-core machine the whole suite needs well under the budget.
_START = __import__("time").monotonic()
_SLOW_BUDGET_S = float(os.environ.get("PRUNEFX_SLOW_BUDGET_S", 60 * 60))


def pytest_runtest_setup(item):
    import time

    if item.get_closest_marker("slow") and time.monotonic() - _START > _SLOW_BUDGET_S:
        pytest.skip(f"slow-test budget of {_SLOW_BUDGET_S:.0f} s used up (PRUNEFX_SLOW_BUDGET_S)")
