"""How long channel-dependency analysis takes on the torchvision zoo, prunefx vs Torch-Pruning.

    python -m experiments.bench_analysis                  # every torchvision classification model
    python -m experiments.bench_analysis --quick          # 3 small models, 1 repeat (CI smoke test)
    python -m experiments.bench_analysis --models resnet50,swin_t --repeats 5

What is timed, per model, in one worker process (the median of ``--repeats`` runs, after an untimed warm-up
of both tools on a tiny model so that no lazy import is counted, and one untimed run of the tool on the model
itself: the tools run one after the other on each model, and the first to meet a shape would otherwise pay the
first-call costs of torch's kernels for both):
- prunefx: ``prunefx.analyze(model, x)`` = trace + shape propagation + grouping, model on the meta device
  (RegNets cannot be built on meta: they are built on the CPU without weight init, then moved to meta).
- tp_real: Torch-Pruning as its README uses it, ``DependencyGraph().build_dependency(model, x)`` followed by
  ``list(DG.get_all_groups())``, with a CPU model in eval mode and a real input (it runs a forward pass).
- tp_meta: the same calls with model and input on the meta device, Torch-Pruning's fastest setting.
Building the model is never timed. Torch-Pruning is optional (``pip install torch-pruning``); without it
only prunefx is timed. A run that exceeds ``--timeout`` seconds is killed and recorded as "timeout" (the
worker is restarted); an exception is recorded as "error: <type>".

Writes ``<out>/analysis_speed.csv`` and ``<out>/analysis_speed.md`` (machine, versions, settings, table).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import math
import multiprocessing as mp
import os
import statistics
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from experiments import _table as table

QUICK_MODELS = ["resnet18", "mobilenet_v3_small", "squeezenet1_1"]
TOOLS = ("prunefx", "tp_real", "tp_meta")
SLOW_THRESHOLD_S = 0.3  # analysis times above this are called out in the summary
BUILD_TIMEOUT_S = 600  # building (and initialising) a model is not timed, but must not hang forever
CSV_FIELDS = [
    "model", "params_m", "input", "prunefx_s", "prunefx_min_s", "prunefx_status", "nodes", "groups",
    "prunable_groups", "tp_real_s", "tp_real_status", "tp_meta_s", "tp_meta_status", "tp_groups",
    "tp_real_over_prunefx", "tp_meta_over_prunefx", "errors",
]  # fmt: skip


# ---- worker side: build, warm up, time ---------------------------------------------------------------------
def _input_size(name: str) -> int:
    return 299 if name == "inception_v3" else 224


def _build(name: str, device: str):
    """A torchvision model with random weights, in eval mode: on 'meta' (no memory) or 'cpu' (initialised)."""
    import torchvision

    if device == "cpu":
        return torchvision.models.get_model(name, weights=None).eval()
    from prunefx.spec import meta_torchvision

    return meta_torchvision(name).eval()


def _tiny():
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()


def _run(tool: str, model, x) -> dict[str, Any]:
    if tool == "prunefx":
        import prunefx

        dg = prunefx.analyze(model, x)
        return {"nodes": len(dg.gm.graph.nodes), "groups": len(dg.groups), "prunable_groups": len(dg.prunable)}
    import torch_pruning as tp

    dg = tp.DependencyGraph().build_dependency(model, example_inputs=x, verbose=False)
    return {"tp_groups": len(list(dg.get_all_groups()))}


def _worker(conn, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore")
    tools = ["prunefx"]
    try:
        import torch_pruning  # noqa: F401

        tools += ["tp_real", "tp_meta"]
    except ImportError:
        pass
    for tool in tools:  # warm-up: first-call costs (imports, dispatcher caches) are not what we measure
        dev = "meta" if tool == "tp_meta" else "cpu"
        _run(tool, _tiny().to(dev), torch.randn(1, 3, 16, 16, device=dev))
    conn.send(("ready", tools))
    while True:
        task = conn.recv()
        if task is None:
            return
        name, tool, repeats = task
        try:
            model = _build(name, "cpu" if tool == "tp_real" else "meta")
            s = _input_size(name)
            x = torch.randn(1, 3, s, s, device="meta" if tool == "tp_meta" else "cpu")
            conn.send(("built", sum(p.numel() for p in model.parameters())))
            _run(tool, model, x)  # untimed: first-call costs at this model's shapes (see the module docstring)
            for _ in range(repeats):
                t0 = time.perf_counter()
                info = _run(tool, model, x)
                conn.send(("repeat", time.perf_counter() - t0, info))
            conn.send(("done", None))
        except Exception as exc:  # noqa: BLE001 - any failure of the tool is a result
            first_line = str(exc).splitlines()[0][:160] if str(exc) else ""
            conn.send(("error", type(exc).__name__, first_line, traceback.format_exc(limit=-3)))
        finally:
            model = x = None
            gc.collect()


# ---- parent side: schedule, enforce timeouts, collect -----------------------------------------------------------
class Worker:
    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.proc = None
        self.conn = None
        self.tools: list[str] = []

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, self.threads), daemon=True)
        self.proc.start()
        kind, self.tools = self._recv(BUILD_TIMEOUT_S)
        assert kind == "ready"

    def _recv(self, timeout: float):
        if not self.conn.poll(timeout):
            raise TimeoutError
        return self.conn.recv()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
        self.proc = None

    def measure(self, name: str, tool: str, repeats: int, timeout: float) -> dict[str, Any]:
        """{'times': [...], 'info': {...}, 'params': n, 'status': 'ok' | 'timeout' | 'error: ...'}."""
        if self.proc is None:
            self.start()
        self.conn.send((name, tool, repeats))
        out: dict[str, Any] = {"times": [], "info": {}, "params": None, "status": "ok", "error": None}
        deadline = BUILD_TIMEOUT_S
        try:
            while True:
                msg = self._recv(deadline)
                if msg[0] == "built":
                    out["params"], deadline = msg[1], timeout
                elif msg[0] == "repeat":
                    out["times"].append(msg[1])
                    out["info"] = msg[2]
                elif msg[0] == "done":
                    return out
                else:
                    out["status"] = f"error: {msg[1]}"
                    out["error"] = f"{msg[1]}: {msg[2]}"
                    return out
        except TimeoutError:
            self.kill()  # the next measurement starts a fresh worker
            out["status"] = "timeout" if out["params"] is not None else "timeout (build)"
            return out


def bench(models: list[str], repeats: int, timeout: float, threads: int, tp: bool, log=print) -> list[dict]:
    worker = Worker(threads)
    worker.start()
    tools = [t for t in TOOLS if t in worker.tools and (tp or t == "prunefx")]
    rows = []
    try:
        for name in models:
            row: dict[str, Any] = {"model": name, "input": f"1x3x{_input_size(name)}x{_input_size(name)}"}
            for tool in tools:
                res = worker.measure(name, tool, repeats, timeout)
                row[f"{tool}_s"] = table.median(res["times"]) if res["status"] == "ok" else None
                row[f"{tool}_status"] = res["status"]
                if res["error"]:
                    row["errors"] = "; ".join(filter(None, [row.get("errors"), f"{tool}: {res['error']}"]))
                row.update(res["info"])
                if tool == "prunefx":
                    row["prunefx_min_s"] = min(res["times"]) if res["times"] else None
                if res["params"] is not None:
                    row["params_m"] = round(res["params"] / 1e6, 1)
            for tool in ("tp_real", "tp_meta"):
                a, b = row.get(f"{tool}_s"), row.get("prunefx_s")
                row[f"{tool}_over_prunefx"] = round(a / b, 2) if a and b else None
            rows.append(row)
            log(_progress(row))
    finally:
        if worker.proc is not None:
            worker.conn.send(None)
            worker.proc.join(10)
            worker.kill()
    return rows


def _progress(row: dict) -> str:
    parts = [f"{row['model']:22s}", f"prunefx {_fmt(row.get('prunefx_s'), row.get('prunefx_status'))}"]
    for tool in ("tp_real", "tp_meta"):
        if f"{tool}_status" in row:
            parts.append(f"{tool} {_fmt(row.get(f'{tool}_s'), row.get(f'{tool}_status'))}")
    return "  ".join(parts)


def _fmt(seconds: float | None, status: str | None) -> str:
    if seconds is not None:
        return f"{seconds:.3f}s"
    return status or "-"


# ---- reporting -----------------------------------------------------------------------------------------------------
def machine_info(threads: int, repeats: int, timeout: float) -> dict[str, str]:
    try:
        tp_version = importlib.metadata.version("torch-pruning")
    except importlib.metadata.PackageNotFoundError:
        tp_version = "not installed"
    return table.machine_info(threads, **{
        "torch-pruning": tp_version,
        "repeats": f"{repeats} per model and tool after one untimed run, statistic: median (prunefx_min_s: minimum)",
        "timeout": f"{timeout:g} s per run",
    })


def _cell(row: dict, tool: str) -> str:
    s = row.get(f"{tool}_s")
    return f"{s:.3f}" if s is not None else str(row.get(f"{tool}_status", "-"))


def _ratio(row: dict, tool: str) -> str:
    r = row.get(f"{tool}_over_prunefx")
    return f"{r:.1f}x" if r is not None else "-"


def summary(rows: list[dict]) -> list[str]:
    """Plain-text findings: how many models analysed, which exceed SLOW_THRESHOLD_S, Torch-Pruning ratios."""
    ok = [r for r in rows if r.get("prunefx_s") is not None]
    if not ok:
        return ["prunefx analysed no model"]
    lines = [f"prunefx analysed {len(ok)}/{len(rows)} models; median over models "
             f"{statistics.median(r['prunefx_s'] for r in ok):.3f} s"]  # fmt: skip
    slow = sorted((r for r in ok if r["prunefx_s"] > SLOW_THRESHOLD_S), key=lambda r: -r["prunefx_s"])
    names = ", ".join(f"{r['model']} {r['prunefx_s']:.2f}" for r in slow)
    lines.append(f"over {SLOW_THRESHOLD_S} s: {len(slow)} models" + (f": {names}" if slow else ""))
    for tool in ("tp_real", "tp_meta"):
        if not any(f"{tool}_status" in r for r in rows):
            continue
        ratios = [r[f"{tool}_over_prunefx"] for r in rows if r.get(f"{tool}_over_prunefx")]
        if ratios:
            geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
            spread = f"median {statistics.median(ratios):.2f}x, range {min(ratios):.2f}x - {max(ratios):.2f}x"
            lines.append(f"{tool} / prunefx on {len(ratios)} models: geometric mean {geo:.2f}x, {spread}")
        failed = [f"{r['model']} ({r[f'{tool}_status']})" for r in rows if r.get(f"{tool}_status", "ok") != "ok"]
        lines.append(f"{tool} failed on {len(failed)} models" + (": " + ", ".join(failed) if failed else ""))
    return lines


def write_md(rows: list[dict], info: dict[str, str], path: Path) -> None:
    out = ["# Channel-dependency analysis time: prunefx vs Torch-Pruning", ""]
    out += [f"- {k}: {v}" for k, v in info.items()]
    out += [
        "",
        "prunefx: `prunefx.analyze(model, x)` (trace + shapes + groups), model on meta, traced in train mode "
        "(aux heads included). tp_real: `tp.DependencyGraph().build_dependency(model, x)` + "
        "`list(DG.get_all_groups())`, CPU model in eval mode, real input. tp_meta: the same on meta. "
        "Times in seconds; ratio = Torch-Pruning time / prunefx time (higher: prunefx faster).",
        "",
        "| model | params (M) | prunefx s | groups (prunable) | TP real s | TP meta s | TP groups | real/pfx "
        "| meta/pfx |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        groups = f"{r['groups']} ({r['prunable_groups']})" if r.get("groups") is not None else "-"
        out.append(f"| {r['model']} | {r.get('params_m', '-')} | {_cell(r, 'prunefx')} | {groups} | "
                   f"{_cell(r, 'tp_real')} | {_cell(r, 'tp_meta')} | {r.get('tp_groups', '-')} | "
                   f"{_ratio(r, 'tp_real')} | {_ratio(r, 'tp_meta')} |")  # fmt: skip
    out += ["", "## Summary", ""] + [f"- {line}" for line in summary(rows)] + [""]
    path.write_text("\n".join(out))


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="analysis time (median, s)")
    for col in ("model", "params M", "prunefx", "groups", "TP real", "TP meta", "real/pfx", "meta/pfx"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        t.add_row(r["model"], str(r.get("params_m", "-")), _cell(r, "prunefx"), str(r.get("groups", "-")),
                  _cell(r, "tp_real"), _cell(r, "tp_meta"), _ratio(r, "tp_real"), _ratio(r, "tp_meta"))  # fmt: skip
    console = Console(width=140)
    console.print(t)
    for line in summary(rows):
        console.print(line)


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help=f"smoke test: {', '.join(QUICK_MODELS)}, 1 repeat")
    ap.add_argument("--models", help="comma-separated torchvision model names (default: all classification models)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per model and tool; the median is reported")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one run may take before it is killed")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads in the worker")
    ap.add_argument("--no-tp", action="store_true", help="time prunefx only, even if torch-pruning is installed")
    ap.add_argument("--out", type=Path, default=table.RESULTS, help="output directory")
    args = ap.parse_args(argv)

    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the spawned worker
    os.environ["MKL_NUM_THREADS"] = str(args.threads)
    if args.quick:
        models, repeats = QUICK_MODELS, 1
    else:
        import torchvision

        models = args.models.split(",") if args.models else torchvision.models.list_models(module=torchvision.models)
        repeats = args.repeats
    info = machine_info(args.threads, repeats, args.timeout)
    t0 = time.perf_counter()
    rows = bench(models, repeats, args.timeout, args.threads, tp=not args.no_tp)
    info["wall time"] = f"{time.perf_counter() - t0:.0f} s"
    args.out.mkdir(parents=True, exist_ok=True)
    table.write_csv(rows, args.out / "analysis_speed.csv", CSV_FIELDS, digits=4)
    write_md(rows, info, args.out / "analysis_speed.md")
    print_table(rows)
    print(f"wrote {args.out / 'analysis_speed.csv'} and {args.out / 'analysis_speed.md'}")
    return args.out / "analysis_speed.md"


if __name__ == "__main__":
    main()
