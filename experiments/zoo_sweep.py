"""External model zoos through ``prunefx.prune(ratio=0.3)``, with Torch-Pruning's outcome beside it (issue 15).

    python -m experiments.run zoo_sweep --run                 # every model of experiments/_zoo_models.py
    python -m experiments.run zoo_sweep --quick               # run the representative subset (what the test runs)
    python -m experiments.run zoo_sweep --run --only yolo,hf: --resume --tp
    python -m experiments.run zoo_sweep                       # only re-write the tables from the stored results

Each model runs in its own worker, forked from a driver that imported torch and the zoos once (``nice`` 15, 1 torch
thread, ``--timeout`` seconds): build (seeded, eval
mode), then ``prunefx.prune(model, inputs, PlanConfig(ratio=0.3))`` (bn_scale, bias compensation, the oracle,
failing groups frozen and re-planned). The status of a model:
- ``ok``: pruned, and the pruned model equals the masked original (``verified.ok``), or is inexact by design
  (``verified.state == "inexact"``: groups through LayerNorm and the like);
- ``ok, frozen by check``: the same, after groups that failed the oracle were frozen (reasons in the table);
- ``nothing prunable``: every group frozen, each with its stated reason (the top reasons are in the table);
- ``refused``: ``VerificationError``, no plan to the target passed the oracle, the model was left untouched;
- ``returned a failing model``: ``prune`` returned ``verified.accepted == False`` (must never happen);
- ``crash`` (any other exception), ``timeout``, ``build failed``, ``worker died``.
With ``--tp``, Torch-Pruning 1.6.1 (MetaPruner, group L2 magnitude, 30%, the last Linear ignored) runs on the
same build in its own worker: does it run, does the pruned model run, does it keep the output shapes (Torch-Pruning
has no equivalence check).

Raw rows go to ``<out>/zoo_sweep.jsonl`` (and ``zoo_sweep_tp.jsonl``), one JSON line per model, appended as each
worker ends (``--resume`` skips ids already there); the tables ``zoo_sweep.csv`` / ``zoo_sweep.md`` are written
from them, with the summary: counts per zoo and the issue's goals (100% "OK or frozen with a reason", >= 95% with
at least half of the channels prunable).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from experiments import _table as table
from experiments import _zoo_models as zoo

STEM = "zoo_sweep"
TIMEOUT_S = 300
RATIO = 0.3
GOOD = ("ok", "ok, frozen by check", "nothing prunable")  # "OK or frozen with a stated reason"
# Dims no structured pruner removes, though the analysis sees them as a layer's or a parameter's dims: what a model
# returns (its classes, boxes or hidden states) and the rows of lookup tables (an embedding's vocabulary, a
# relative-position bias table's positions). They are counted apart ("fixed channels"), so the prunable share of a
# small-width model is not decided by a 1000-class head, a 32k-token vocabulary or a table of window offsets.
FIXED_REASONS = ("model output", "embedding rows are looked up by token id",
                 "relative position bias rows are looked up by position")
CSV_FIELDS = [
    "model", "zoo", "status", "prunable_share", "internal_share", "channels", "fixed_channels", "groups",
    "prunable_groups", "pruned_groups", "frozen_reasons", "frozen_by_check", "inferred_ops", "inferred",
    "analysis_s", "prune_s", "wall_s",
    "max_rel_error", "params_m", "inputs",
    "error", "where", "tp_status", "tp_s", "tp_error",
]  # fmt: skip


# ---- worker side ---------------------------------------------------------------------------------------------
def _where(exc: BaseException) -> str:
    """The innermost prunefx line of the traceback, and the innermost line overall."""
    tb = traceback.extract_tb(exc.__traceback__)
    pfx = [f"{fr.filename.split('/prunefx/', 1)[1]}:{fr.lineno} {fr.name}" for fr in tb if "/prunefx/" in fr.filename]
    last = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return "; ".join(x for x in (pfx[-1] if pfx else "", last) if x)


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().split("\n")[0][:300]


def _reason_key(reason: str) -> str:
    """A frozen reason with node and module names taken out, so equal causes count together."""
    key = re.sub(r" \(node '[^']*'\)", "", reason)
    return re.sub(r"(module|node) '[^']*'", r"\1 '*'", key)[:160]


def _is_channel_group(group: Any, buffers: set[str]) -> bool:
    """A group of a layer's or a learnable parameter's channels; dims only of buffers (index tables) are not."""
    return any(m.kind.value == "module" or (m.kind.value == "param" and m.name not in buffers) for m in group.members)


def census(dg: Any) -> dict[str, Any]:
    """Channels, prunable share and the top frozen reasons (by channels) of an analysis."""
    buffers = {name for name, _ in dg.gm.named_buffers()}
    groups = [g for g in dg.groups if _is_channel_group(g, buffers)]
    total = sum(g.channels for g in groups)
    prunable = sum(g.channels for g in groups if g.prunable)
    reasons: Counter[str] = Counter()
    for g in groups:
        if not g.prunable and g.reasons:
            reasons[_reason_key(g.reasons[0])] += g.channels
    fixed = sum(v for k, v in reasons.items() if k in FIXED_REASONS)
    return {
        "groups": len(dg.groups), "prunable_groups": len(dg.prunable), "channels": total,
        "prunable_share": round(prunable / total, 4) if total else 0.0, "fixed_channels": fixed,
        "internal_share": round(prunable / (total - fixed), 4) if total > fixed else 0.0,
        "frozen_reasons": [[k, v] for k, v in reasons.most_common(3)], "analysis_s": round(dg.seconds, 3),
        # ops with no rule whose channel map was probed (prunefx.analysis.inferred): nodes, and the distinct ops
        "inferred_ops": len(dg.inferred_ops),
        "inferred": sorted({v.split(":")[0] for v in dg.inferred_ops.values()})[:3],
    }  # fmt: skip


def run_one(mid: str) -> dict[str, Any]:
    """Build one model and prune it at 30% with the oracle on; the row of the table (without Torch-Pruning)."""
    import torch

    import prunefx
    from prunefx.errors import VerificationError

    row: dict[str, Any] = {"model": mid, "zoo": mid.split(":", 1)[0]}
    try:
        model, inputs = zoo.build(mid)
    except Exception as exc:  # noqa: BLE001 - a model the zoo cannot build is a row of the table
        return {**row, "status": "build failed", "error": _first_line(exc), "where": _where(exc)}
    row["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 3)
    row["inputs"] = " ".join("x".join(map(str, x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__
                             for x in inputs)
    t0 = time.perf_counter()
    try:
        res = prunefx.prune(model, inputs, prunefx.PlanConfig(ratio=RATIO))
    except Exception as exc:  # noqa: BLE001 - every failure is recorded with where it happened
        row.update(prune_s=round(time.perf_counter() - t0, 2), error=_first_line(exc), where=_where(exc))
        row["status"] = "refused" if isinstance(exc, VerificationError) else "crash"
        try:  # what the analysis alone says (its census), when it runs
            row.update(census(prunefx.analyze(zoo.build(mid)[0], inputs)))
        except Exception as exc2:  # noqa: BLE001 - the crash may be in the analysis itself
            row["analysis_error"] = _first_line(exc2)
        return row
    row["prune_s"] = round(time.perf_counter() - t0, 2)
    row.update(census(res.graph))
    row["pruned_groups"] = len(res.plan.pruned)
    row["frozen_by_check"] = [[g, _reason_key(r)] for g, r in res.frozen_by_check][:3]
    v = res.verified
    row["max_rel_error"] = v.max_rel_error
    if not v.accepted:  # proven, or inexact by design (LayerNorm groups): both are returned by prune()
        row.update(status="returned a failing model", error=v.message[:300])
    elif not res.graph.prunable:
        row["status"] = "nothing prunable"
    else:
        row["status"] = "ok, frozen by check" if res.frozen_by_check else "ok"
    return row


def run_tp(mid: str) -> dict[str, Any]:
    """Torch-Pruning's MetaPruner at 30% on the same build: does it run, and keep the output shapes."""
    import torch
    import torch_pruning as tp
    from torch import nn
    from torch.utils._pytree import tree_flatten

    model, inputs = zoo.build(mid)

    def shapes(out: Any) -> list[tuple[int, ...]]:
        return [tuple(t.shape) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]

    with torch.no_grad():
        before = shapes(model(*inputs))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    t0 = time.perf_counter()
    try:
        pruner = tp.pruner.MetaPruner(
            model, inputs if len(inputs) > 1 else inputs[0], importance=tp.importance.GroupMagnitudeImportance(p=2),
            pruning_ratio=RATIO, ignored_layers=linears[-1:],
        )  # fmt: skip
        pruner.step()
    except Exception as exc:  # noqa: BLE001 - Torch-Pruning's failures are the comparison
        return {"model": mid, "tp_status": "crash", "tp_error": _first_line(exc)}
    row = {"model": mid, "tp_s": round(time.perf_counter() - t0, 2)}
    try:
        with torch.no_grad():
            after = shapes(model.eval()(*inputs))
    except Exception as exc:  # noqa: BLE001 - a pruned model that no longer runs
        return {**row, "tp_status": "pruned model crashes", "tp_error": _first_line(exc)}
    return {**row, "tp_status": "ran" if after == before else "changes output shapes"}


# ---- driver side ---------------------------------------------------------------------------------------------
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "YOLO_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
       "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}  # fmt: skip
NICE = 15


def _preload() -> None:
    """Import torch, prunefx and the installed zoos once in the driver: every forked worker starts with them
    (importing them per worker took longer than pruning most models)."""
    import importlib

    os.environ.update(ENV)
    from prunefx.integrations.ultralytics.env import setup_offline

    setup_offline()  # before ultralytics is imported
    import torch

    torch.set_num_threads(1)
    for pkg in ("timm", "torchvision", "transformers", "ultralytics", "prunefx"):
        if importlib.util.find_spec(pkg) is not None:
            importlib.import_module(pkg)


def _child(mid: str, tp: bool, conn: Any) -> None:
    """A forked worker: nice, one thread, one model; sends its row and exits without running atexit hooks."""
    os.nice(NICE)
    try:
        conn.send(run_tp(mid) if tp else run_one(mid))
    finally:
        conn.close()
        os._exit(0)


def sweep(ids: list[str], path: Path, tp: bool, resume: bool, timeout: int, jobs: int) -> None:
    """Each id in its own forked worker (``jobs`` at a time, ``timeout`` s each); rows appended to ``path``."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    done = set(_read(path)) if resume else set()
    if not resume and path.exists():
        kept = [r for m, r in _read(path).items() if m not in ids]  # rows of other ids stay
        path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    todo = [m for m in ids if m not in done]
    _preload()
    ctx = mp.get_context("fork")
    key = "tp_status" if tp else "status"
    running: dict[Any, tuple[str, Any, float]] = {}  # connection -> (id, process, start time)
    while todo or running:
        while todo and len(running) < jobs:
            mid = todo.pop(0)
            if resume and mid in _read(path):  # another driver on the same results got to it first
                continue
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(mid, tp, send), daemon=True)
            proc.start()
            send.close()
            running[recv] = (mid, proc, time.time())
        ready = wait(list(running), timeout=1.0)
        now = time.time()
        for conn in list(running):
            mid, proc, t0 = running[conn]
            if conn in ready:
                try:
                    row = conn.recv()
                except EOFError:  # the worker died without a row (killed for memory, a segfault)
                    proc.join(5)
                    row = {"model": mid, key: "worker died", ("tp_error" if tp else "error"): f"rc={proc.exitcode}"}
            elif now - t0 > timeout:
                row = {"model": mid, key: "timeout", ("tp_s" if tp else "wall_s"): timeout}
            else:
                continue
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            conn.close()
            del running[conn]
            row.setdefault("zoo", mid.split(":", 1)[0])
            if tp:
                row["tp_run"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0))
            elif "wall_s" not in row:
                row["wall_s"] = round(now - t0, 1)
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{mid:50s} {row.get(key)} {(row.get('error') or row.get('tp_error') or '')[:90]}", flush=True)


def _read(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    return {r["model"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


# ---- tables --------------------------------------------------------------------------------------------------
def _reasons(row: dict[str, Any]) -> str:
    items = [f"{k} ({v} ch)" for k, v in row.get("frozen_reasons") or []]
    items += [f"failed the check: {r}" for _, r in row.get("frozen_by_check") or []]
    return "; ".join(items)


def internal_share(row: dict[str, Any]) -> float | None:
    """Prunable channels over the channels that are not fixed dims (see FIXED_REASONS).

    Rows stored before the census counted fixed channels get them from their top three frozen reasons: a lower
    bound on the share (a fixed-dim reason outside the top three stays in the denominator).
    """
    if "internal_share" in row or row.get("prunable_share") is None:
        return row.get("internal_share")
    total = row["channels"]
    fixed = sum(v for k, v in row.get("frozen_reasons") or [] if k in FIXED_REASONS)
    return round(row["prunable_share"] * total / (total - fixed), 4) if total > fixed else 0.0


def _half(row: dict[str, Any], share: str) -> bool:
    value = internal_share(row) if share == "internal" else row.get("prunable_share")
    return row["status"] in GOOD[:2] and (value or 0) >= 0.5


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per zoo and status, and the issue's two goals as fractions of all rows."""
    n = len(rows)
    good = sum(r["status"] in GOOD for r in rows)
    half = sum(_half(r, "internal") for r in rows)
    half_all = sum(_half(r, "all") for r in rows)
    per_zoo = {z: Counter(r["status"] for r in rows if r["zoo"] == z) for z in zoo.ZOO_PACKAGES}
    return {"n": n, "good": good, "half": half, "half_all": half_all, "per_zoo": per_zoo}


def write_tables(rows: list[dict[str, Any]], tp_rows: dict[str, dict[str, Any]], stem: Path,
                 info: dict[str, str], not_run: list[str] = ()) -> Path:
    """``<stem>.csv`` and ``<stem>.md`` from the rows (model order as in the zoo list)."""
    order = {m: i for i, m in enumerate(zoo.model_ids())}
    rows = sorted(rows, key=lambda r: order.get(r["model"], len(order)))
    for r in rows:
        r.update({k: v for k, v in tp_rows.get(r["model"], {}).items() if k.startswith("tp_")})
    flat = [{**r, "frozen_reasons": _reasons(r), "frozen_by_check": len(r.get("frozen_by_check") or []),
             "internal_share": internal_share(r), "inferred": "; ".join(r.get("inferred") or [])} for r in rows]
    table.write_csv(flat, stem.with_suffix(".csv"), CSV_FIELDS)
    s = summary(rows)
    statuses = sorted({r["status"] for r in rows}, key=lambda st: (st not in GOOD, st))
    pct = (lambda k: f"{k} / {s['n']} ({100 * k / s['n']:.1f}%)") if s["n"] else str
    lines = [f"# External model zoos pruned at {RATIO:.0%} (prunefx.prune, oracle on)", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    lines += [
        "", "Produced by `python -m experiments.run zoo_sweep --run` (experiments/zoo_sweep.py; models in "
        "experiments/_zoo_models.py). Every model in its own worker (forked, `nice` 15, 1 torch thread).", "",
        *([f"Not run yet ({len(not_run)}, not counted below): {', '.join(not_run)}.", ""] if not_run else []),
        "## Goals (issue 15)", "",
        f"- OK or frozen with a stated reason: **{pct(s['good'])}** (goal 100%)",
        f"- pruned and verified with at least half of the internal channels prunable: **{pct(s['half'])}** "
        "(goal >= 95%); counting the fixed channels as well (a model's outputs, the rows of lookup tables), "
        f"at least half of all channels: {pct(s['half_all'])}",
        "", "## Per zoo", "",
    ]  # fmt: skip
    half = Counter(r["zoo"] for r in rows if _half(r, "internal"))
    per = [[z, sum(c.values()), *(c.get(st, 0) for st in statuses), half[z]] for z, c in s["per_zoo"].items()]
    head = ["zoo", "models", *statuses, "pruned with >= 50% of internal channels prunable"]
    lines += table.md_table(head, [*per, ["all", s["n"], *(
        sum(c.get(st, 0) for c in s["per_zoo"].values()) for st in statuses), s["half"]]])
    tp = Counter(r["tp_status"] for r in rows if r.get("tp_status"))
    if tp:
        runs = sorted({r["tp_run"] for r in rows if r.get("tp_run")})
        lines += ["", f"Torch-Pruning 1.6.1 on {sum(tp.values())} of these models (no equivalence check): "
                  + ", ".join(f"{k} {v}" for k, v in tp.most_common()) + f"; measured {'; '.join(runs)}."]
    lines += ["", "## Models", "", "Prunable share: channels in prunable groups over all channels of the analysis "
              "(groups of a layer or a learnable parameter; dims only of buffers, such as relative-position index "
              "tables, are not channels). Internal: the same over the channels that are not fixed dims ("
              + ", ".join(f'frozen as "{k}"' for k in FIXED_REASONS) + "), which no structured pruner removes; "
              "rows measured before the census counted them separately take them from their top three frozen "
              "reasons (a lower bound on the share). Frozen reasons: the top three by channels (node and module "
              "names elided).", ""]
    cells = []
    for r in rows:
        err = f"{r.get('error', '')} [{r.get('where', '')}]" if r.get("error") else ""
        cells.append([
            r["model"], r["status"], _fmt(r.get("prunable_share"), ".0%"), _fmt(internal_share(r), ".0%"),
            r.get("channels", ""),
            _cell(_reasons(r) or err or ""), _fmt(r.get("analysis_s"), ".2f"), _fmt(r.get("prune_s"), ".1f"),
            r.get("tp_status", ""),
        ])  # fmt: skip
    lines += table.md_table(["model", "status", "prunable", "internal", "channels", "frozen reasons / error",
                             "analysis s", "prune s", "Torch-Pruning"], cells)
    failing = [r for r in rows if r["status"] not in GOOD]
    if failing:
        lines += ["", "## Not OK", ""]
        lines += [f"- `{r['model']}` {r['status']}: {_cell(r.get('error', ''))} [{r.get('where', '')}]"
                  for r in failing]
    md = stem.with_suffix(".md")
    md.write_text("\n".join(lines) + "\n")
    return md


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:240]


def main(argv: list[str] | None = None) -> Path | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="store_true", help="run the workers (else only re-write the tables)")
    ap.add_argument("--only", default="", help="comma-separated substrings of model ids")
    ap.add_argument("--quick", action="store_true", help="run the representative subset (zoo.QUICK) into *_quick.*")
    ap.add_argument("--tp", action="store_true", help="also run Torch-Pruning beside each model")
    ap.add_argument("--resume", action="store_true", help="skip ids already in the results")
    ap.add_argument("--jobs", type=int, default=1, help="workers at a time")
    ap.add_argument("--timeout", type=int, default=TIMEOUT_S)
    ap.add_argument("--out", type=Path, default=table.RESULTS)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--tp-one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one or a.tp_one:
        import torch

        torch.set_num_threads(1)
        print(json.dumps(run_one(a.one) if a.one else run_tp(a.tp_one)), flush=True)
        return None
    stem = f"{STEM}_quick" if a.quick else STEM  # a smoke run never overwrites the published table
    ids = zoo.QUICK if a.quick else zoo.model_ids()
    ids = [m for m in ids if not a.only or any(s in m for s in a.only.split(","))]
    missing = {m: p for m in ids if (p := zoo.missing_package(m))}
    for pkg in sorted(set(missing.values())):
        print(f"skipping the models that need {pkg} (not installed)")
    ids = [m for m in ids if m not in missing]
    out: Path = a.out
    out.mkdir(parents=True, exist_ok=True)
    path, tp_path = out / f"{stem}.jsonl", out / f"{stem}_tp.jsonl"
    info_path = out / f"{stem}_info.json"  # the machine the stored rows were measured on
    info = json.loads(info_path.read_text()) if info_path.exists() and not (a.run or a.quick) else {}
    if a.run or a.quick:
        info = table.machine_info(threads=1, jobs=f"{a.jobs} worker(s) at a time, {a.timeout} s timeout each")
        sweep(ids, path, False, a.resume, a.timeout, a.jobs)
        if a.tp:
            if importlib_find("torch_pruning"):
                sweep(ids, tp_path, True, a.resume, a.timeout, a.jobs)
            else:
                print("Torch-Pruning is not installed: its column stays empty (pip install torch-pruning==1.6.1)")
        info["load average at end (1/5/15 min)"] = " ".join(f"{v:.1f}" for v in os.getloadavg())
        info_path.write_text(json.dumps(info, indent=1) + "\n")
    stored = _read(path)
    rows = [{"zoo": m.split(":", 1)[0], **r} for m, r in stored.items() if m in ids]
    md = write_tables(rows, _read(tp_path), out / stem, info, not_run=[m for m in ids if m not in stored])
    print(md.read_text().split("## Models")[0])
    return md


def importlib_find(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    main()
