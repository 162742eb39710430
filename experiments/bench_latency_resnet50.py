"""Does a 2x MACs reduction turn into a 2x CPU speedup? ResNet-50 at batch 32, with and without round_to=8.

    python -m experiments.bench_latency_resnet50 [--quick] [--threads 2] [--out experiments/results]

Issue 4's setup (Torch-Pruning reaches speedup / MACs ratio ~0.81 on it): ResNet-50 pruned to half its MACs
with round_to 1 and 8, timed as is, with BatchNorm folded, and folded + channels_last. A preset of
:mod:`experiments.bench_latency`.
"""

from __future__ import annotations

from pathlib import Path

from experiments.bench_latency import VARIANTS
from experiments.bench_latency import main as bench


def main(argv: list[str] | None = None) -> Path:
    return bench(argv, module="experiments.bench_latency_resnet50", models=["resnet50"], targets=[0.5],
                 batches=[32], variants=list(VARIANTS), repeats=10, stem="latency_resnet50")


if __name__ == "__main__":
    main()
