"""How fast the HTML view is made and drawn: analysis, page building (data + layout) and the browser's render.

    python -m experiments.bench_html [--quick] [--models resnet18,densenet201,maxvit_t] [--loads 5]

Per model (torchvision, random init, analysed on the meta device at 224x224; ``ultralytics:NAME.yaml`` at 640):
``prunefx.analyze`` time; ``graph_data`` (the analysis as data) and ``groups_html`` (layout + page) times, each
the median of 3; the page's size; and, in headless Chromium (Debian's chromium + chromium-driver via selenium),
the wall time from ``driver.get(file://...)`` until the page has drawn the graph and painted once (median of
``--loads`` loads, one browser), plus the part of it spent in the page's script, and whether the slowest load
kept within ``--budget-s`` (3 s: a graph of 1,000+ nodes must open at once; this was a timed unit test, and a
loaded test machine is no place to time anything). Without a browser the render columns say so.

    python -m experiments.bench_html --models densenet201,maxvit_t     # the two large graphs against the budget
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import prunefx
from experiments import _table as table
from prunefx.report import groups_html
from prunefx.view.graph_data import graph_data

FIELDS = ["model", "nodes", "edges", "groups", "analyze_s", "graph_data_s", "page_s", "page_mb", "load_draw_s",
          "load_draw_max_s", "script_s", "within_budget"]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def _model(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    if name.startswith("ultralytics:"):
        from prunefx.integrations.ultralytics.env import setup_offline

        setup_offline()
        from prunefx.spec import load_spec

        loaded = load_spec(name, imgsz=640)
        return loaded.model, loaded.example_inputs
    from prunefx.spec import meta_torchvision

    return meta_torchvision(name), (torch.randn(1, 3, 224, 224, device="meta"),)


def _median_time(fn, n: int = 3) -> tuple[float, object]:
    times, out = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _browser():
    try:
        from selenium import webdriver
    except ImportError:
        return None, "no selenium (pip install -e '.[test]')"
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        return None, "no chromium (apt-get install chromium chromium-driver)"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,950"):
        options.add_argument(arg)
    return webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=options), ""


def _render(driver, path: Path, loads: int) -> tuple[list[float], list[float]]:
    from selenium.webdriver.support.ui import WebDriverWait

    walls, scripts = [], []
    for _ in range(loads):
        driver.get("about:blank")
        t0 = time.perf_counter()
        driver.get(path.as_uri())
        WebDriverWait(driver, 60, poll_frequency=0.005).until(
            lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        walls.append(time.perf_counter() - t0)
        scripts.append(driver.execute_script("return window.prunefxRenderMs") / 1e3)
    return walls, scripts


def run(args: argparse.Namespace) -> tuple[list[dict], str]:
    driver, why = _browser()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, inputs = _model(name)
            t0 = time.perf_counter()
            dg = prunefx.analyze(model, inputs)
            analyze_s = time.perf_counter() - t0
            data_s, data = _median_time(functools.partial(graph_data, dg))
            page_s, page = _median_time(functools.partial(groups_html, data))
            path = Path(tmp) / f"{name.replace(':', '_')}.html"
            path.write_text(page, encoding="utf-8")
            row = {"model": name, "nodes": data["summary"]["nodes"], "edges": data["summary"]["edges"],
                   "groups": data["summary"]["groups"], "analyze_s": analyze_s, "graph_data_s": data_s,
                   "page_s": page_s, "page_mb": len(page.encode()) / 1e6}
            if driver is not None:
                walls, scripts = _render(driver, path, args.loads)
                row.update(load_draw_s=statistics.median(walls), load_draw_max_s=max(walls),
                           script_s=statistics.median(scripts), within_budget=max(walls) <= args.budget_s)
            rows.append(row)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    if driver is not None:
        driver.quit()
    return rows, why


def write(rows: list[dict], why: str, args: argparse.Namespace, stem: str, command: str) -> Path:
    args.out.mkdir(parents=True, exist_ok=True)
    table.write_csv(rows, args.out / f"{stem}.csv", FIELDS)
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    browser = why or (f"Chromium headless 1500x950, median of {args.loads} loads (max in brackets); budget: the "
                      f"slowest load within {args.budget_s:g} s")
    lines = [f"# HTML view: build and render time ({', '.join(args.models)})", "",
             f"Command: `{command}`. {platform.machine()} CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch "
             f"threads, torch {torch.__version__}; analysis on the meta device; page build times are the median of 3; "
             f"browser: {browser}. Load average (1/5/15 min) at the end: {load} (the cores were "
             f"{'shared with other jobs' if float(load.split()[0]) > 1.5 else 'mostly idle'}).", "",
             "| model | nodes | edges | groups | analyze s | graph_data s | layout + page s | page MB "
             "| browser load + draw s | of which script s | within budget |", "|---" * 11 + "|"]
    for r in rows:
        render = (f"{r['load_draw_s']:.2f} [{r['load_draw_max_s']:.2f}] | {r['script_s']:.2f} | "
                  f"{'yes' if r['within_budget'] else '**no**'}" if "load_draw_s" in r else "- | - | -")
        lines.append(f"| {r['model']} | {r['nodes']} | {r['edges']} | {r['groups']} | {r['analyze_s']:.2f} | "
                     f"{r['graph_data_s']:.2f} | {r['page_s']:.2f} | {r['page_mb']:.2f} | {render} |")
    path = args.out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="resnet18 only, 2 loads")
    ap.add_argument("--models", type=lambda s: s.split(","),
                    default=["resnet18", "ultralytics:yolov8n.yaml", "efficientnet_b0", "densenet201",
                             "efficientnet_v2_l", "maxvit_t"])
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=3.0, help="the slowest load + draw a page may take")
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.loads = ["resnet18"], 2
    command = "python -m experiments.bench_html" + ("".join(f" {a}" for a in argv) if argv else "")
    rows, why = run(args)
    return write(rows, why, args, "html_render_quick" if args.quick else "html_render", command)


if __name__ == "__main__":
    main(sys.argv[1:])
