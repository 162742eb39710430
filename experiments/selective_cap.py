"""Selective sparsity with a per-BatchNorm cap: does capping what one layer may fade save the sparse model?

    python -m experiments.selective_cap            # 3 seeds x 2 targets x caps 1.0/0.9/0.75/0.5, ~30 min on 2 cores
    python -m experiments.selective_cap --quick    # smoke test

Each seed trains one baseline (the worth_it classification protocol: prunefx.zoo:bn_cnn_synthetic on the
synthetic set); every cell then runs selective TargetSparsity -> prune to the FLOPs target -> fine-tune from that
baseline with ``prune.sparsity.layer_cap`` set, and reports top-1 of the sparse, pruned and fine-tuned models.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from experiments._table import RESULTS, RUNS, machine_info, md_table, write_csv
from experiments.worth_it import QUICK, Sizes, _cls_config

CAPS = (1.0, 0.9, 0.75, 0.5)
TARGETS = {"2x": 0.5, "4x": 0.25}
FIELDS = ["seed", "target", "layer_cap", "baseline", "sparse", "pruned", "finetuned", "gflops"]
FULL = Sizes(seeds=(0, 1, 2), cls_epochs=20, cls_sparsity=6, cls_finetune=6, cls_model="prunefx.zoo:bn_cnn_synthetic",
             cls_size=32, cls_data={"n_train": 3000, "n_val": 500, "n_test": 2000}, threads=1)


def _run(config: dict[str, Any], root: Path, name: str) -> dict[str, Any]:
    from prunefx.pipeline import run_config
    from prunefx.report import load_report

    config = {**config, "name": name, "project": str(root)}
    path = root / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))  # JSON is YAML: the pipeline reads it as a config file
    run = run_config(path, [], log=lambda _: None)
    report = load_report(run.root)
    sparse = json.loads((run.root / "state.json").read_text())["stages"].get("sparsity") or {}
    report["sparse_top1"] = (sparse.get("metrics") or {}).get("top1")  # report.json has no sparse stage
    return report


def _top1(report: dict[str, Any], stage: str) -> float | None:
    st = report["stages"].get(stage)
    return None if st is None else st["metrics"].get("top1")


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes: 1 seed, tiny data, two caps")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--runs", type=Path, default=RUNS / "selective_cap")
    args = ap.parse_args(argv)
    sizes, caps = (QUICK, (1.0, 0.5)) if args.quick else (FULL, CAPS)
    info = machine_info(threads=sizes.threads)
    rows = []
    for seed in sizes.seeds:
        base = _cls_config(sizes, seed, 0.5, args.runs)
        base["prune"]["sparsity"]["epochs"] = 0
        base["prune"]["finetune"]["epochs"] = 0
        first = _run(base, args.runs, f"s{seed}-baseline")
        ckpt = args.runs / f"s{seed}-baseline" / "weights" / "baseline.pt"
        for group, target in TARGETS.items():
            for cap in caps:
                cfg = copy.deepcopy(_cls_config(sizes, seed, target, args.runs))
                cfg["checkpoint"] = str(ckpt)
                cfg["prune"]["sparsity"]["layer_cap"] = cap
                rep = _run(cfg, args.runs, f"s{seed}-{group}-cap{cap:g}")
                rows.append({"seed": seed, "target": group, "layer_cap": cap, "baseline": _top1(first, "baseline"),
                             "sparse": rep["sparse_top1"], "pruned": _top1(rep, "pruned"),
                             "finetuned": _top1(rep, "finetuned"), "gflops": rep["stages"]["finetuned"]["flops"] / 1e9})
                print(json.dumps(rows[-1]), flush=True)
    stem = "selective_cap_quick" if args.quick else "selective_cap"
    write_csv(rows, args.out / f"{stem}.csv", FIELDS, digits=4)
    return _write_md(rows, sizes, info, args, args.out / f"{stem}.md")


def _ms(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f} (1)"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f} ({len(values)})"


def _write_md(rows: list[dict[str, Any]], sizes: Sizes, info: dict[str, str], args: argparse.Namespace,
              path: Path) -> Path:
    base = {r["seed"]: r["baseline"] for r in rows}
    cells = []
    for group in TARGETS:
        for cap in dict.fromkeys(r["layer_cap"] for r in rows):
            sel = [r for r in rows if r["target"] == group and r["layer_cap"] == cap]
            if sel:
                cells.append([group, f"{cap:g}", f"{statistics.mean(r['gflops'] for r in sel):.4g}",
                              *(_ms([r[k] for r in sel]) for k in ("sparse", "pruned", "finetuned"))])
    lines = [
        "# Selective sparsity with a per-BatchNorm cap (`prune.sparsity.layer_cap`)", "",
        f"Command: `python -m experiments.selective_cap{' --quick' if args.quick else ''}`", "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), "",
        f"Setup: {sizes.cls_model} on the synthetic set {dict(sizes.cls_data)} at {sizes.cls_size} px; one "
        f"baseline per seed ({sizes.cls_epochs} epochs; top-1 {_ms(list(base.values()))}), then selective "
        f"TargetSparsity ({sizes.cls_sparsity} epochs, target 0.5 of the gammas, exclude_residual) -> prune "
        f"bn_scale to the FLOPs target -> fine-tune {sizes.cls_finetune} epochs; top-1 on the test split, mean ± "
        "std over the seeds (count in brackets). layer_cap 1.0 = no cap (the global rank alone).", "",
        *md_table(["target", "layer_cap", "GFLOPs", "sparse top-1", "pruned top-1", "fine-tuned top-1"], cells), "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(path)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
