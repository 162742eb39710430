"""Network slimming (bn_scale) through the classification pipeline at 2x and 4x fewer MACs, digits and synthetic.

    python -m experiments.classify_slimming [--quick] [--out experiments/results] [--runs runs/experiments]
        [--seeds 0 1 2] [--render]

Per dataset and training seed: one pipeline run trains the baseline, trains it with the BN-sparsity penalty, prunes
to 1/2 of the MACs and fine-tunes; a second run starts from that run's sparsity-trained weights
(``checkpoint=.../sparse.pt``, no second sparsity stage) and prunes to 1/4 of the MACs. Top-1 is on the held-out test
split; the table gives the mean (and spread) over the seeds. ``--quick`` is a smoke test (1 seed, tiny data).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from experiments import _table as table
from prunefx.pipeline.backends.classify import ClassifyJob, run_classify
from prunefx.pipeline.rundir import RunDir, RunError
from prunefx.report import load_report

# The recipes measured. Everything a run does is in its config.yaml under --runs.
RECIPES: dict[str, dict[str, Any]] = {
    "digits": {
        "model": "prunefx.zoo:bn_cnn",
        "dataset": {"name": "digits", "image_size": 8},
        "epochs": 12,
        "batch": 64,
        "lr": 0.1,
        "weight_decay": 5.0e-4,
        "augment": ["crop"],
        "crop_pad": 1,
        "sparsity": {"epochs": 6, "s": 2.0e-2, "schedule": "constant", "lr": 0.05},
        "finetune": {"epochs": 5, "lr": 0.02},
    },
    "synthetic": {
        "model": "prunefx.zoo:bn_cnn_synthetic",
        "dataset": {"name": "synthetic", "n_train": 4000, "n_val": 500, "n_test": 2000},
        "epochs": 10,
        "batch": 128,
        "lr": 0.1,
        "weight_decay": 5.0e-4,
        "augment": ["crop"],
        "crop_pad": 2,
        "warmup_epochs": 0.5,
        "sparsity": {"epochs": 5, "s": 1.0e-2, "schedule": "constant", "lr": 0.05},
        "finetune": {"epochs": 4, "lr": 0.02},
    },
}
TARGETS = {"2x": 0.5, "4x": 0.25}
FIELDS = [
    "dataset",
    "seed",
    "target",
    "macs_kept",
    "params_kept",
    "baseline_top1",
    "sparse_top1",
    "pruned_top1",
    "finetuned_top1",
    "finetuned_minus_baseline",
    "verify",
    "seconds",
]


def _config(
    dataset: str, seed: int, target: str, runs: Path, threads: int, quick: bool, checkpoint: Path | None = None
) -> dict[str, Any]:
    r = copy.deepcopy(RECIPES[dataset])
    if quick:
        r["epochs"], r["sparsity"]["epochs"], r["finetune"]["epochs"] = 2, 1, 1
        if dataset == "synthetic":
            r["dataset"] |= {"n_train": 512, "n_val": 128, "n_test": 256}
    sparsity, finetune = r.pop("sparsity"), r.pop("finetune")
    if checkpoint is not None:
        sparsity = {"epochs": 0}
    return {
        **r,
        "task": "classify",
        "seed": seed,
        "threads": threads,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "project": str(runs),
        "name": f"{dataset}-seed{seed}-{target}",
        "exist_ok": True,
        "prune": {
            "criterion": "bn_scale",
            "target": {"flops": TARGETS[target]},
            "latency": False,
            "sparsity": sparsity,
            "finetune": finetune,
        },
    }


def _run(config: dict[str, Any]) -> tuple[Path, float]:
    """Run one pipeline config, or reuse its finished run directory when the same config already completed there."""
    import yaml

    root = Path(config["project"]) / config["name"]
    try:
        state = RunDir.reload(root).state
        same = yaml.safe_load((root / "config.yaml").read_text()) == config
    except (OSError, ValueError, RunError):
        state, same = {}, False
    if same and state.get("status") == "complete":
        print(f"    reusing the finished run {root}", flush=True)
        return root, sum(v.get("seconds", 0) for v in state["stages"].values())
    start = time.perf_counter()
    run = run_classify(ClassifyJob.from_config(config), log=lambda msg: print(f"    {msg}", flush=True))
    return run.root, time.perf_counter() - start


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="1 seed, 1-2 epochs per stage, small synthetic set (smoke test)"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=table.RESULTS,
        help="where classify_slimming.{md,csv} go (--quick: classify_slimming_quick.{md,csv})",
    )
    ap.add_argument(
        "--runs", type=Path, default=None, help="run directories (default runs/experiments/classify_slimming[_quick])"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="training seeds (default 0 1 2; --quick: 0)")
    ap.add_argument("--render", action="store_true", help="only re-render the table from the existing CSV in --out")
    ap.add_argument("--datasets", nargs="+", default=["synthetic", "digits"], choices=list(RECIPES))
    args = ap.parse_args(argv)
    args.runs = args.runs or table.RUNS / (
        "classify_slimming_quick" if args.quick else "classify_slimming"
    )
    seeds = tuple(args.seeds) if args.seeds else (0,) if args.quick else (0, 1, 2)
    if args.render:
        rows = table.read_csv(args.out / f"{_stem(args)}.csv")
        path = args.out / f"{_stem(args)}.md"
        path.write_text(
            _markdown(rows, args, seeds, sum(r["seconds"] for r in rows), (float("nan"),) * 3, os.getloadavg())
        )
        return path
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for dataset in args.datasets:
        for seed in seeds:
            print(f"{dataset} seed {seed}: 2x (baseline, sparsity, prune, fine-tune)", flush=True)
            root2, s2 = _run(_config(dataset, seed, "2x", args.runs, args.threads, args.quick))
            print(f"{dataset} seed {seed}: 4x (from the 2x run's sparse weights)", flush=True)
            root4, s4 = _run(
                _config(
                    dataset, seed, "4x", args.runs, args.threads, args.quick, checkpoint=root2 / "weights" / "sparse.pt"
                )
            )
            base = load_report(root2)["stages"]["baseline"]
            for target, root, seconds in (("2x", root2, s2), ("4x", root4, s4)):
                rep = load_report(root)
                st = rep["stages"]
                state = RunDir.reload(root2).state
                rows.append(
                    {
                        "dataset": dataset,
                        "seed": seed,
                        "target": target,
                        "macs_kept": st["pruned"]["macs"] / base["macs"],
                        "params_kept": st["pruned"]["params"] / base["params"],
                        "baseline_top1": base["metrics"]["top1"],
                        "sparse_top1": state["stages"]["sparsity"]["metrics"]["top1"],
                        "pruned_top1": st["pruned"]["metrics"]["top1"],
                        "finetuned_top1": st["finetuned"]["metrics"]["top1"],
                        "finetuned_minus_baseline": st["finetuned"]["metrics"]["top1"] - base["metrics"]["top1"],
                        "verify": rep["settings"]["verify"],
                        "seconds": round(seconds, 1),
                    }
                )
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
            # Written after every seed: an interrupted sweep still leaves the rows it measured (the table says which).
            path = _write(rows, args, seeds, time.perf_counter() - started, load_before)
    print(f"wrote {path}")
    return path


def _write(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    seeds: tuple[int, ...],
    total: float,
    load_before: tuple[float, ...],
) -> Path:
    args.out.mkdir(parents=True, exist_ok=True)
    table.write_csv(rows, args.out / f"{_stem(args)}.csv", FIELDS)
    path = args.out / f"{_stem(args)}.md"
    path.write_text(_markdown(rows, args, seeds, total, load_before, os.getloadavg()))
    return path


def _stem(args: argparse.Namespace) -> str:
    return "classify_slimming_quick" if args.quick else "classify_slimming"


def _markdown(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    seeds: tuple[int, ...],
    total: float,
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
) -> str:
    def stat(sel: list[dict[str, Any]], key: str) -> str:
        v = [r[key] for r in sel]
        mean = statistics.fmean(v)
        spread = f" ± {statistics.stdev(v):.2%}" if len(v) > 1 else ""
        return f"{mean:.2%}{spread}"

    command = (
        "python -m experiments.classify_slimming"
        + (" --quick" if args.quick else "")
        + (f" --seeds {' '.join(map(str, seeds))}" if args.seeds else "")
    )
    lines = [
        "# Network slimming through the classification pipeline: 2x and 4x fewer MACs (bn_scale)",
        "",
        f"Command: `{command}` ({total / 60:.1f} min). Machine: {platform.machine()}, {os.cpu_count()} cores shared "
        + (
            f"with other jobs (load average {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end), "
            if load_before[0] == load_before[0]
            else "with other jobs, "
        )
        + f"{args.threads} torch threads, one process, torch {torch.__version__}, Python {sys.version.split()[0]}. "
        f"Training seeds {sorted({r['seed'] for r in rows})} of {list(seeds)} done"
        + (
            ""
            if args.quick or set(seeds) >= {0, 1, 2}
            else " (not the full sweep of seeds 0 1 2, which the plain command "
            "runs, reusing finished run directories; a synthetic seed takes ~15 min on this shared machine)"
        )
        + f" (data split and synthetic images fixed: dataset seed 0); mean ± standard "
        "deviation over the seeds. Top-1 on the held-out test split (digits: 270 images; synthetic: "
        f"{RECIPES['synthetic']['dataset']['n_test'] if not args.quick else 256} images).",
        "",
        "Per seed: baseline training -> BN-sparsity training (L1 on BatchNorm gammas) -> prune to the MACs target "
        "(global bn_scale ranking, bias compensation on, verified against the masked original) -> fine-tune. The "
        "4x run prunes the 2x run's sparsity-trained weights. MACs and params are the report's own counts, relative "
        "to the baseline. 'after sparsity' is the unpruned model pruning starts from (it has trained longer than the "
        "baseline); the last column compares the fine-tuned pruned model with it.",
        "",
        "| dataset | target | MACs kept | params kept | baseline | after sparsity | right after pruning | "
        "after fine-tuning | fine-tuned - baseline | fine-tuned - after sparsity |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for target in TARGETS:
            sel = [r for r in rows if r["dataset"] == dataset and r["target"] == target]
            if not sel:
                continue
            delta = [r["finetuned_minus_baseline"] for r in sel]
            lines.append(
                f"| {dataset} | {target} | {statistics.fmean(r['macs_kept'] for r in sel):.3f} | "
                f"{statistics.fmean(r['params_kept'] for r in sel):.3f} | {stat(sel, 'baseline_top1')} | "
                f"{stat(sel, 'sparse_top1')} | {stat(sel, 'pruned_top1')} | {stat(sel, 'finetuned_top1')} | "
                f"{statistics.fmean(delta) * 100:+.2f} points | "
                f"{statistics.fmean(r['finetuned_top1'] - r['sparse_top1'] for r in sel) * 100:+.2f} points |"
            )
    lines += ["", "Recipes (top-level training keys; `sparsity`/`finetune` override them for those stages):", ""]
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        lines.append(f"- {dataset}: `{RECIPES[dataset]}`")
    lines += [
        "",
        f"Per-run rows: `{_stem(args)}.csv` next to this file; every run's config.yaml, state.json "
        f"(per-epoch history) and report under `{args.runs}`.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
