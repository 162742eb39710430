"""Which experts to remove from a small trained mixture-of-experts language model, right after the cut?

    python -m experiments.expert_plans            # 4-layer, 8-expert top-2 Mixtral, seeds 0 and 1, keep 1/2 and 1/4
    python -m experiments.expert_plans --quick    # one seed, 60 training steps, keep 1/2 (smoke test)

The model is a transformers Mixtral (hidden 128, 4 layers, 8 experts of width 128 per layer, top-2 routing) trained
on the standard-library byte corpus of :mod:`prunefx.examples.stdlib_lm` with its recipe (600 steps of 16 x 128
bytes, AdamW 3e-3, cosine), cached under a key holding the corpus hash, the seed and the steps. Each plan keeps the
same number of experts in every layer with ``pfx_hf.prune_experts`` (checked by its oracle: pruned == original with
the removed experts' router logits at -inf) from the same weights:

- ``reap``: routing weight x expert output norm, averaged over the tokens routed to the expert (REAP);
- ``frequency``: the routing weight mass an expert receives;
- ``contribution``: routing weight x expert output norm, summed over the tokens routed to the expert;
- ``random``: experts kept at random (seeded), the control.

Calibration: the first 4 training batches (64 windows of 128 bytes); perplexity per byte on the 8 held-out batches,
no fine-tuning. Writes ``<out>/expert_plans.csv`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

from experiments._table import cpu_name, write_result

FIELDS = ["seed", "keep", "plan", "ppl", "params_kept", "seconds"]
VERSION = 1  # the cache key: bump when the model or the recipe changes


def _moe(seed: int, steps: int):
    import torch
    import transformers

    from prunefx.examples import stdlib_lm as lm

    torch.manual_seed(seed)
    config = transformers.MixtralConfig(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
                                        num_experts_per_tok=2, max_position_embeddings=lm.SEQ, bos_token_id=None,
                                        eos_token_id=None, pad_token_id=None)
    model = transformers.MixtralForCausalLM(config)
    return lm.train_lm(model, seed, steps, f"stdlib-moe-v{VERSION}-{lm.corpus_hash()}-seed{seed}-steps{steps}")


def run(seeds: list[int], keeps: list[float], steps: int) -> list[dict]:
    import torch

    from prunefx.examples import stdlib_lm as lm
    from prunefx.integrations import transformers as pfx_hf
    from prunefx.integrations.transformers.experts import moe_layers

    torch.set_num_threads(1)
    data = lm.make_data()
    calib, val = [x for x, _ in data["train"][:4]], data["val"]
    rows = []
    for seed in seeds:
        teacher = _moe(seed, steps)
        total = sum(p.numel() for p in teacher.parameters())
        rows.append({"seed": seed, "keep": 1.0, "plan": "unpruned", "ppl": round(lm.metric(teacher, val)["ppl"], 4),
                     "params_kept": 1.0, "seconds": 0.0})
        print(rows[-1], flush=True)
        for keep in keeps:
            for plan in ("reap", "frequency", "contribution", "random"):
                model = copy.deepcopy(teacher)
                kwargs: dict = {"criterion": plan}
                if plan == "random":
                    g = torch.Generator().manual_seed(seed)
                    kwargs = {"scores": {x.path: torch.rand(x.num_experts, generator=g).tolist()
                                         for x in moe_layers(model)}}
                t0 = time.perf_counter()
                result = pfx_hf.prune_experts(model, calib, keep=keep, **kwargs)
                seconds = time.perf_counter() - t0
                assert result.verified.accepted, result.verified.message
                rows.append({"seed": seed, "keep": keep, "plan": plan, "ppl": round(lm.metric(model, val)["ppl"], 4),
                             "params_kept": round(sum(p.numel() for p in model.parameters()) / total, 3),
                             "seconds": round(seconds, 2)})
                print(rows[-1], flush=True)
    return rows


def _markdown(rows: list[dict], argv: list[str]) -> str:
    from prunefx.examples.stdlib_lm import corpus_hash

    load = os.getloadavg()
    lines = [
        "# Expert plans on a small trained mixture-of-experts language model, right after the cut", "",
        f"Machine: {cpu_name()}, {os.cpu_count()} CPUs, 1 torch thread, load average {load[0]:.1f}. Command: "
        f"`python -m experiments.expert_plans {' '.join(argv)}`. Corpus hash {corpus_hash()}. Perplexity per byte on "
        "the held-out bytes (lower is better), no fine-tuning; mean over seeds, range in brackets.", "",
        "| experts kept | plan | ppl | params kept | seconds |", "|---|---|---|---|---|",
    ]
    for keep, plan in dict.fromkeys((r["keep"], r["plan"]) for r in rows):
        sel = [r for r in rows if (r["keep"], r["plan"]) == (keep, plan)]
        ppl = [r["ppl"] for r in sel]
        rng = f" [{min(ppl):.3f}, {max(ppl):.3f}]" if len(ppl) > 1 else ""
        lines.append(f"| {keep:g} | {plan} | {statistics.mean(ppl):.3f}{rng} | "
                     f"{statistics.mean(r['params_kept'] for r in sel):.3f} | "
                     f"{statistics.median(r['seconds'] for r in sel):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed, 60 training steps, keep 1/2")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default="experiments/results")
    args = ap.parse_args(argv)
    rows = run([0], [0.5], 60) if args.quick else run([int(s) for s in args.seeds.split(",")], [0.5, 0.25], 600)
    stem = "expert_plans_quick" if args.quick else "expert_plans"
    write_result(Path(args.out), stem, rows, FIELDS, _markdown(rows, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
