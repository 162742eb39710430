"""Which layers to remove from a small trained language model, against width at the same size, and what distils back?

    python -m experiments.depth_plans            # 8-layer stdlib LM, seeds 0 and 1, 2 and 4 of 8 layers removed
    python -m experiments.depth_plans --quick    # 4 layers, one seed, 60 training steps (smoke test)

The teacher is :func:`prunefx.examples.stdlib_lm.trained_lm` with 8 layers (byte-level Llama, hidden 128, trained
600 steps of 16 x 128 bytes on ten standard-library modules; cached under a key holding the corpus hash, the seed
and the steps). Each plan removes whole decoder layers with ``pfx_hf.prune_depth`` (checked by the depth oracle:
pruned == original with those layers' residual branches zeroed) from the same weights:

- ``influence``: 1 - cosine of each layer's input and output, per token (ShortGPT's block influence);
- ``output``: the relative logit error with that layer alone removed;
- ``loss``: the calibration loss increase with that layer alone removed; ``loss, iterative``: one layer at a time,
  each the cheapest on the model without the layers chosen before it;
- ``last``: the last k layers before the final one (the "deepest layers" baseline), ``random``: k at random.

Calibration: the first 4 training batches (64 windows); perplexity per byte on the 8 held-out batches, right after
the cut. At the parameters the ``loss`` plan leaves, heads + MLP widths are cut instead (``pfx_hf.prune``, taylor
scores normalised by their mean per group, re-fit on the calibration batches), and half the layers plus widths;
the three are distilled from the teacher for 10% of the teacher's training tokens (``prunefx.recover``, logits KD
+ task loss), against the same depth trained from scratch on as many tokens (the control). Writes
``<out>/depth_plans.csv`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time
from pathlib import Path

from experiments._table import cpu_name, write_result

FIELDS = ["seed", "layers", "removed", "plan", "stage", "ppl", "params_kept", "blocks", "seconds"]


def _plans(k: int, n: int, seed: int) -> dict[str, dict]:
    last = [f"model.layers.{i}" for i in range(n - 1 - k, n - 1)]
    rnd = sorted(random.Random(seed).sample(range(n), k))
    return {"influence": {}, "output": {"criterion": "output"}, "loss": {"criterion": "output", "loss": True},
            "loss, iterative": {"criterion": "output", "loss": True, "iterative": True},
            "last": {"blocks": last}, "random": {"blocks": [f"model.layers.{i}" for i in rnd]}}


def run(seeds: list[int], layers: int, removed: list[int], steps: int, recover_share: float) -> list[dict]:
    import torch

    from prunefx.examples import stdlib_lm as lm
    from prunefx.integrations import transformers as pfx_hf

    torch.set_num_threads(1)
    data = lm.make_data()
    calib, val = data["train"][:4], data["val"]
    rows = []
    for seed in seeds:
        teacher = lm.trained_lm(seed, steps, layers=layers)
        total = sum(p.numel() for p in teacher.parameters())
        base = lm.metric(teacher, val)["ppl"]
        rows.append({"seed": seed, "layers": layers, "removed": 0, "plan": "unpruned", "stage": "teacher",
                     "ppl": round(base, 4), "params_kept": 1.0, "blocks": "", "seconds": 0.0})
        print(rows[-1], flush=True)
        budget = max(1, round(recover_share * steps))
        for k in removed:
            for name, how in _plans(k, layers, seed).items():
                model = copy.deepcopy(teacher)
                kwargs = {"criterion": how.get("criterion", "influence"), "calibration": [x for x, _ in calib]}
                if how.get("loss"):
                    kwargs.update(calibration=calib, loss_fn=lambda out, ids: lm.task_loss(out, (ids, ids)))
                if "blocks" in how:
                    kwargs.update(blocks=how["blocks"])
                if how.get("iterative"):
                    kwargs.update(iterative=True)
                t0 = time.perf_counter()
                result = pfx_hf.prune_depth(model, calib[0][0][:2], remove=k, **kwargs)
                seconds = time.perf_counter() - t0
                assert result.verified.accepted, result.verified.message
                kept = sum(p.numel() for p in model.parameters()) / total
                gone = ",".join(p.rsplit(".", 1)[1] for p in result.plan.remove)
                rows.append({"seed": seed, "layers": layers, "removed": k, "plan": name, "stage": "cut",
                             "ppl": round(lm.metric(model, val)["ppl"], 4), "params_kept": round(kept, 3),
                             "blocks": gone, "seconds": round(seconds, 2)})
                print(rows[-1], flush=True)
                if name != "loss":
                    continue
                target = kept
                rows.append(_distilled(model, teacher, data, val, rows[-1], budget, recover_share))
                print(rows[-1], flush=True)
                rows += _width_rows(teacher, data, calib, val, seed, layers, k, target, total, budget, recover_share)
                t0 = time.perf_counter()
                torch.manual_seed(seed)
                scratch = lm.train_lm(lm.tiny_llama(layers - k), seed, budget)
                rows.append({"seed": seed, "layers": layers, "removed": k, "plan": f"{layers - k} layers",
                             "stage": f"from scratch, {recover_share:.0%} tokens",
                             "ppl": round(lm.metric(scratch, val)["ppl"], 4),
                             "params_kept": round(sum(p.numel() for p in scratch.parameters()) / total, 3),
                             "blocks": "", "seconds": round(time.perf_counter() - t0, 2)})
                print(rows[-1], flush=True)
    return rows


def _distilled(model, teacher, data, val, row: dict, budget: int, share: float) -> dict:
    """``model`` distilled from ``teacher`` for ``budget`` steps (logits KD + task loss): its row."""
    import prunefx
    from prunefx.examples import stdlib_lm as lm

    t0 = time.perf_counter()
    prunefx.recover(model, teacher, data["train"], inputs=lambda b: b[0], task_loss=lm.task_loss,
                    config=prunefx.RecoverConfig(steps=budget, lr=1e-3, warmup=budget // 10, log_every=0),
                    log=lambda s: None)
    return {**row, "stage": f"distilled {share:.0%}", "ppl": round(lm.metric(model.eval(), val)["ppl"], 4),
            "seconds": round(time.perf_counter() - t0, 2)}


def _width_rows(teacher, data, calib, val, seed: int, layers: int, k: int, target: float, total: int, budget: int,
                share: float) -> list[dict]:
    """Heads + MLP widths (taylor scores, re-fit) to the depth plan's parameters, alone and after removing k // 2
    layers (loss plan), each right after the cut and distilled."""
    import prunefx
    from prunefx.examples import stdlib_lm as lm
    from prunefx.integrations import transformers as pfx_hf

    def loss(out, ids):
        return lm.task_loss(out, (ids, ids))

    out = []
    for name, depth in (("width", 0), (f"width + {k // 2} layers", k // 2))[: 2 if k // 2 else 1]:
        model = copy.deepcopy(teacher)
        t0 = time.perf_counter()
        gone = ""
        if depth:
            result = pfx_hf.prune_depth(model, calib[0][0][:2], remove=depth, criterion="output", calibration=calib,
                                        loss_fn=loss)
            assert result.verified.accepted, result.verified.message
            gone = ",".join(p.rsplit(".", 1)[1] for p in result.plan.remove)
        left = sum(p.numel() for p in model.parameters()) / total
        plan = prunefx.PlanConfig(params=min(1.0, target / left), normalize="mean")
        result = pfx_hf.prune(model, calib[0][0][:2], plan, criterion="taylor", calibration=calib, loss_fn=loss,
                              refit=True)
        assert result.verified.accepted, result.verified.message
        row = {"seed": seed, "layers": layers, "removed": k, "plan": name, "stage": "cut",
               "ppl": round(lm.metric(model, val)["ppl"], 4),
               "params_kept": round(sum(p.numel() for p in model.parameters()) / total, 3), "blocks": gone,
               "seconds": round(time.perf_counter() - t0, 2)}
        out += [row, _distilled(model, teacher, data, val, row, budget, share)]
        print(*out[-2:], sep="\n", flush=True)
    return out


def _markdown(rows: list[dict], argv: list[str]) -> str:
    from prunefx.examples.stdlib_lm import corpus_hash

    load = os.getloadavg()
    lines = [
        "# Depth, width and both on a small trained language model", "",
        f"Machine: {cpu_name()}, {os.cpu_count()} CPUs, 1 torch thread, load average {load[0]:.1f}. Command: "
        f"`python -m experiments.depth_plans {' '.join(argv)}`. Corpus hash {corpus_hash()}. Perplexity per byte on "
        "the held-out bytes (lower is better); mean over seeds, range in brackets; the layers each seed removed.", "",
        "| layers removed | plan | stage | ppl | params kept | layers (per seed) |", "|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r["removed"], r["plan"], r["stage"]) for r in rows))
    for removed, plan, stage in keys:
        sel = [r for r in rows if (r["removed"], r["plan"], r["stage"]) == (removed, plan, stage)]
        ppl = [r["ppl"] for r in sel]
        rng = f" [{min(ppl):.3f}, {max(ppl):.3f}]" if len(ppl) > 1 else ""
        blocks = " / ".join(r["blocks"] for r in sel if r["blocks"])
        lines.append(f"| {removed} | {plan} | {stage} | {statistics.mean(ppl):.3f}{rng} | "
                     f"{statistics.mean(r['params_kept'] for r in sel):.3f} | {blocks} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 layers, one seed, 60 training steps, 1 layer removed")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default="experiments/results")
    args = ap.parse_args(argv)
    if args.quick:
        rows = run([0], 4, [1], 60, 0.1)
    else:
        rows = run([int(s) for s in args.seeds.split(",")], 8, [2, 4], 600, 0.1)
    stem = "depth_plans_quick" if args.quick else "depth_plans"
    write_result(Path(args.out), stem, rows, FIELDS, _markdown(rows, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
