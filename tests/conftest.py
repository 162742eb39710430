"""Test-wide setup: ultralytics offline with a repo-local config dir, before anything imports it."""

import os
from pathlib import Path

import pytest

from prunefx.integrations.ultralytics.env import default_config_dir, setup_offline

# pytest-xdist (CI runs `-n 2`): each worker computes on one thread, so two workers fill two cores instead of each
# spreading over all of them; the variables reach subprocesses and libraries that read them (OpenMP, MKL).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[_var] = "1"
# ultralytics rewrites its settings.json in place (no temp file), so each worker keeps its own config dir.
_YOLO_DIR = os.environ.get("YOLO_CONFIG_DIR") or default_config_dir()
setup_offline(Path(_YOLO_DIR) / _WORKER if _WORKER else None)
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


_THREADS = 1 if _WORKER else __import__("torch").get_num_threads()  # torch's default: one per physical core


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
    # Each test starts on the session's thread count (ultralytics' select_device and a few tests set their own).
    torch.set_num_threads(_THREADS)


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


# Slow tests run in the same command as the rest while a wall-clock budget lasts (CI has 90 minutes for install
# + tests + the wheel and oldest-torch checks). Each process counts from its own start (an xdist worker from its
# own). Past the budget a slow test is skipped with that reason, and the run fails with a summary of what did not
# run: a skipped slow test never reads as a pass. On a quiet 2-core machine the whole suite needs well under it.
_START = __import__("time").monotonic()
_SLOW_BUDGET_S = float(os.environ.get("PRUNEFX_SLOW_BUDGET_S", 75 * 60))
_BUDGET = "slow-test budget"
_over_budget: list[str] = []  # node ids skipped for the budget (in the xdist controller: from every worker)


def pytest_runtest_setup(item):
    import time

    if item.get_closest_marker("slow") and time.monotonic() - _START > _SLOW_BUDGET_S:
        pytest.skip(f"{_BUDGET} of {_SLOW_BUDGET_S:.0f} s used up (PRUNEFX_SLOW_BUDGET_S)")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and report.when == "setup" and _BUDGET in str(report.longrepr):
        _over_budget.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _over_budget and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if _over_budget:
        terminalreporter.section(_BUDGET, red=True, bold=True)
        terminalreporter.write_line(f"FAILED: {len(_over_budget)} slow tests did not run, the {_SLOW_BUDGET_S:.0f} s "
                                    "budget (PRUNEFX_SLOW_BUDGET_S) ran out: the suite is too slow for CI's limit")
        for nodeid in _over_budget[:20]:
            terminalreporter.write_line(f"  {nodeid}")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests sharing a fixture of tests/ wider than a function run on one xdist worker, which builds it once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if item.get_closest_marker("xdist_group"):
            continue  # the module chose its group
        shared = [d for name in (info.names_closure if info else ()) for d in info.name2fixturedefs.get(name, ())
                  if d.scope != "function" and d.baseid]  # baseid "": a plugin's fixture (tmp_path_factory, ...)
        session = sorted(d.argname for d in shared if d.scope == "session")
        if session:
            item.add_marker(pytest.mark.xdist_group(f"session:{session[0]}"))
        elif shared:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
