"""One entry point for the published tables: ``python -m experiments.run NAME [--quick] [args...]``.

    python -m experiments.run list                 # the experiments and the files they write
    python -m experiments.run latency_resnet50     # one table, full size
    python -m experiments.run all --quick          # every experiment at smoke-test size (what CI runs)

Each experiment is a module under ``experiments/`` with ``main(argv)`` writing ``<stem>.md`` and ``<stem>.csv``
into ``--out`` (default ``experiments/results``). With ``--quick`` and no ``--out`` this runner writes into
``experiments/results/quick/`` so a smoke run never overwrites a published table.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Experiment:
    module: str
    what: str
    needs: tuple[str, ...] = ()  # optional packages; without them the experiment says so and is skipped


EXPERIMENTS = {
    "analysis_speed": Experiment(
        "experiments.bench_analysis", "analysis time over the torchvision zoo vs Torch-Pruning"
    ),
    "prune_speed": Experiment("experiments.bench_prune", "score + plan + apply time vs Torch-Pruning's pruner.step()"),
    "latency_resnet50": Experiment(
        "experiments.bench_latency_resnet50", "ResNet-50 at 2x fewer MACs, batch 32 CPU latency"
    ),
    "latency_vs_macs": Experiment(
        "experiments.bench_latency", "ResNet-50 / MobileNetV2 at several targets, batch 1 and 32"
    ),
    "bias_compensation": Experiment(
        "experiments.bias_compensation", "top-1 right after pruning with/without compensation", ("sklearn",)
    ),
    "yolo_synthetic": Experiment("experiments.yolo_synthetic", "yolov8n / yolo11n pipeline at several GFLOPs targets"),
    "yolo_latency": Experiment("experiments.yolo_latency", "CPU latency of the yolo_synthetic tables' models"),
    "html_render": Experiment("experiments.bench_html", "HTML view: page build and browser render, 70-1,600 nodes"),
    "llm_meta": Experiment(
        "experiments.llm_meta", "1B / 3B / 7B Llama configs on the meta device: analysis time, peak RSS, vs TP",
        ("transformers",),
    ),
    "llm_criteria": Experiment(
        "experiments.llm_criteria", "importance criteria on a small trained LM, heads + MLP pruned, no fine-tuning",
        ("transformers",),
    ),
    "depth_plans": Experiment(
        "experiments.depth_plans", "decoder layers removed from a trained stdlib LM: 5 plans, distilled vs scratch",
        ("transformers", "accelerate"),
    ),
    "llm_baselines": Experiment("experiments.llm_baselines", "LLM baselines (reimpl.) vs prunefx", ("transformers",)),
    "llm_recovery": Experiment(
        "experiments.llm_recovery", "a trained stdlib LM at half the parameters: cut, re-fit, distilled vs scratch",
        ("transformers", "accelerate"),
    ),
    "expert_plans": Experiment(
        "experiments.expert_plans", "experts removed from a trained stdlib MoE: REAP / frequency / contribution",
        ("transformers",),
    ),
    "hard_calibration": Experiment(
        "experiments.hard_calibration", "yolov8n vs yolov8s from scratch on the hard shapes set, mAP per epoch"
    ),
    "worth_it": Experiment(
        "experiments.worth_it", "pruned big model vs the same budget from scratch (controls, verdict), both tasks"
    ),
    "selective_cap": Experiment(
        "experiments.selective_cap", "selective sparsity with a per-BatchNorm cap (layer_cap), 2x / 4x, 3 seeds"
    ),
    "latency_target": Experiment(
        "experiments.latency_target", "plans against measured latency vs FLOPs plans, torch and ONNX Runtime"
    ),
    "latency_accuracy": Experiment(
        "experiments.latency_accuracy", "accuracy at equal measured latency: latency plans vs FLOPs plans, 3 seeds"
    ),
    "import_time": Experiment(
        "experiments.import_time", "fresh-process time of import torch, import prunefx and prunefx --help"
    ),
    "zoo_sweep": Experiment(
        "experiments.zoo_sweep", "timm / torchvision / transformers / ultralytics zoos pruned at 30%, vs Torch-Pruning"
    ),  # a zoo whose package is missing is skipped inside, with a message
    "trained_plans_yolo": Experiment(
        "experiments.trained_plans_yolo", "trained YOLOv8n at 2x / 4x: prunefx raw / sensitivity + re-fit vs TP, mAP",
        ("ultralytics",),
    ),
}


def _optional(name: str, what: str) -> None:
    """Register an experiment whose module is added by work in progress, once the module exists."""
    if importlib.util.find_spec(f"experiments.{name}") is not None:
        EXPERIMENTS.setdefault(name, Experiment(f"experiments.{name}", what, ("sklearn",)))


_optional("classify_slimming", "classification pipeline: BN-scale at 2x / 4x fewer MACs, 3 seeds")
_optional("slimming", "network slimming with controls (random, L1, scratch, uniform) and Torch-Pruning")
_optional("trained_plans", "trained CNNs at 2x / 4x: raw / normalised / local / sensitivity, re-fit, vs TP, 3 seeds")


QUICK_OUT = Path(__file__).parent / "results" / "quick"


def run(name: str, argv: list[str]) -> object:
    exp = EXPERIMENTS[name]
    missing = [p for p in exp.needs if importlib.util.find_spec(p) is None]
    if missing:
        print(f"{name}: skipped, needs {', '.join(missing)} (pip install -e '.[test]')")
        return None
    return importlib.import_module(exp.module).main(argv)


def main(argv: list[str] | None = None) -> list[object]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        width = max(map(len, EXPERIMENTS))
        print(__doc__)
        for name, exp in EXPERIMENTS.items():
            print(f"  {name:<{width}}  {exp.what}  ({exp.module})")
        return []
    name, rest = argv[0], argv[1:]
    if "--quick" in rest and "--out" not in rest:
        rest += ["--out", str(QUICK_OUT)]
    names = list(EXPERIMENTS) if name == "all" else [name]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise SystemExit(f"unknown experiment {unknown[0]!r}; known: all, {', '.join(EXPERIMENTS)}")
    return [r for n in names if (r := run(n, rest)) is not None]


if __name__ == "__main__":
    main()
