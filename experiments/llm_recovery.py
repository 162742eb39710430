"""How much of a trained LM's quality a plan at half the parameters keeps: right after the cut, after the re-fit,
after distillation with 1%, 3% and 10% of the teacher's tokens, against the same architecture trained from scratch.

    python -m experiments.llm_recovery --jobs 2   # 8-layer stdlib LM, seeds 0 and 1 at once (25 min, cached teachers)
    python -m experiments.llm_recovery --quick    # 4 layers, one seed, 60 teacher steps (smoke test)

The teacher is :func:`prunefx.examples.stdlib_lm.trained_lm` (byte-level Llama, hidden 128, 4 query heads over 2 KV
heads, MLP 384; ``llm_baselines.TEACHER_STEPS`` AdamW steps of 16 x 128 bytes, cached, the same models as the
baselines' table); the same recipe at half the steps is trained too, so the table shows how much the teacher still
gained from its last doubling of the steps (how near its plateau it is). Every plan
keeps 50% of the parameters WITHOUT the embeddings (each row states the exact fraction):

- ``width``: ``pfx_hf.prune`` (KV groups and MLP units, activation scores, raw: ``configs/llm.yaml``'s default,
  chosen from the baselines' table; the same widths in every layer, what a Llama config holds), with and without
  the least-squares re-fit;
- ``depth``: ``pfx_hf.prune_depth`` (whole decoder layers by block influence, ShortGPT's criterion), as many as
  gets closest to the budget; no re-fit (no layer lost inputs);
- ``depth + width``: a quarter of the layers removed first, then widths to the budget, re-fitted.

Calibration and re-fit: the first 4 training batches (64 windows). Distillation (:func:`prunefx.train.recover`,
the llm pipeline's recipe: KL on the logits at T = 1 mixed half and half with the next-token loss, AdamW at 1e-3,
warm-up an eighth of the steps, cosine) from the re-fitted model on fresh training windows of the teacher's batch
size, for 1%, 3% and 10% of the teacher's training tokens, each budget its own run from the same start. Control:
the pruned architecture (its saved config) initialised at random and trained by the teacher's own recipe on the
same number of tokens. Perplexity per byte on the 8 held-out batches (lower is better); every cut is checked by
prunefx's oracle. Writes ``<out>/llm_recovery.csv`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from pathlib import Path

from experiments._table import cpu_name, write_result
from experiments.llm_baselines import TARGET, TEACHER_STEPS, _count, _embedding_params

FIELDS = ["seed", "layers", "plan", "stage", "tokens", "ppl", "params_kept", "shape", "seconds"]
FRACTIONS = (0.01, 0.03, 0.10)  # of the teacher's training tokens
PLANS = ("width", "depth", "depth + width")


def _shape(model) -> str:
    cfg = model.config
    return (f"{cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} KV / {cfg.num_attention_heads} heads, "
            f"MLP {cfg.intermediate_size}")


def _cut(plan: str, teacher, calib, refit: bool):
    """A copy of ``teacher`` cut by ``plan`` to TARGET of the parameters without embeddings (oracle-checked)."""
    import prunefx
    from prunefx.integrations import transformers as pfx_hf

    model = copy.deepcopy(teacher)
    total, fixed, n = _count(teacher), _embedding_params(teacher), teacher.config.num_hidden_layers
    x, ids = calib[0][0][:2], [b for b, _ in calib]
    if plan != "width":
        remove = n // 4 if plan == "depth + width" else min(
            range(1, n), key=lambda k: abs(total * (1 - k / n) - TARGET * total))  # layers hold all but embeddings
        result = pfx_hf.prune_depth(model, x, remove=remove, calibration=ids)
        assert result.verified.accepted, result.verified.message
    if plan != "depth":
        width = (TARGET * total + fixed) / (_count(model) + fixed)  # PlanConfig(params=) counts every parameter

        # configs/llm.yaml's default scores (activation, raw), chosen from experiments/results/llm_baselines.md
        result = pfx_hf.prune(model, x, prunefx.PlanConfig(params=width, normalize="none"), criterion="activation",
                              calibration=calib, refit=refit)
        assert result.verified.accepted, result.verified.message
    return model


def _distill(student, teacher, steps: int, seed: int):
    from prunefx.examples import stdlib_lm as lm
    from prunefx.train import RecoverConfig, recover

    data = lm.make_data(n_train=steps)["train"]  # fresh seeded windows, the teacher's batch size
    cfg = RecoverConfig(steps=steps, lr=1e-3, warmup=steps // 8, temperature=1.0, task_weight=0.5, log_every=0,
                        seed=seed)
    recover(student, teacher, data, config=cfg, inputs=lambda b: b[0], task_loss=lm.task_loss, log=lambda s: None)
    return student.eval()


def _scratch(pruned, steps: int, seed: int):
    import torch
    import transformers

    from prunefx.examples import stdlib_lm as lm

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(pruned.config))
    return lm.train_lm(model, seed, steps)


def run(seeds: list[int], layers: int, steps: int) -> list[dict]:
    import torch

    from prunefx.examples import stdlib_lm as lm

    torch.set_num_threads(1)
    data = lm.make_data()
    calib, val = data["train"][:4], data["val"]
    tokens = steps * lm.BATCH * lm.SEQ
    rows = []

    def row(seed, plan, stage, n_tokens, model, seconds, total):
        rows.append({"seed": seed, "layers": layers, "plan": plan, "stage": stage, "tokens": n_tokens,
                     "ppl": round(lm.metric(model, val)["ppl"], 4), "params_kept": round(_count(model) / total, 4),
                     "shape": _shape(model), "seconds": round(seconds, 1)})
        print(rows[-1], flush=True)

    for seed in seeds:
        t0 = time.perf_counter()
        half = lm.trained_lm(seed, steps // 2, layers=layers)
        row(seed, "teacher, half the steps", "trained", tokens // 2, half, time.perf_counter() - t0, _count(half))
        t0 = time.perf_counter()
        teacher = lm.trained_lm(seed, steps, layers=layers)
        total = _count(teacher)
        row(seed, "teacher", "trained", tokens, teacher, time.perf_counter() - t0, total)
        for plan in PLANS:
            t0 = time.perf_counter()
            row(seed, plan, "cut", 0, _cut(plan, teacher, calib, refit=False), time.perf_counter() - t0, total)
            t0 = time.perf_counter()
            start = _cut(plan, teacher, calib, refit=plan != "depth")
            if plan != "depth":
                row(seed, plan, "re-fit", 0, start, time.perf_counter() - t0, total)
            for frac in FRACTIONS:
                n = max(1, round(frac * steps))
                t0 = time.perf_counter()
                row(seed, plan, "distilled", n * lm.BATCH * lm.SEQ, _distill(copy.deepcopy(start), teacher, n, seed),
                    time.perf_counter() - t0, total)
                t0 = time.perf_counter()
                row(seed, plan, "from scratch", n * lm.BATCH * lm.SEQ, _scratch(start, n, seed),
                    time.perf_counter() - t0, total)
    return rows


def _mean(rows, **match) -> list[float]:
    return [r["ppl"] for r in rows if all(r[k] == v for k, v in match.items())]


def _markdown(rows: list[dict], argv: list[str], steps: int) -> str:
    from prunefx.examples.stdlib_lm import corpus_hash

    load = os.getloadavg()
    seeds = sorted({r["seed"] for r in rows})
    teacher = statistics.mean(_mean(rows, plan="teacher"))
    tokens = next(r["tokens"] for r in rows if r["plan"] == "teacher")
    lines = [
        "# LLM recovery at half the parameters: cut, re-fit, distillation with 1-10% of the teacher's tokens", "",
        f"Machine: {cpu_name()}, {os.cpu_count()} CPUs, 1 torch thread, load average {load[0]:.1f}. Command: "
        f"`python -m experiments.llm_recovery {' '.join(argv)}`. Corpus hash {corpus_hash()}. Teacher: a "
        f"{rows[0]['layers']}-layer stdlib LM trained {steps} steps ({tokens:,} byte tokens), seeds "
        f"{', '.join(map(str, seeds))}. Target 50% of the parameters without the embeddings. Perplexity per byte on "
        "the held-out bytes (lower is better), mean over seeds, range in brackets; \"tokens\": the training bytes the "
        "stage consumed (distillation and from-scratch rows: the same count, as a share of the teacher's). Recipe "
        "and controls: see `experiments/llm_recovery.py`'s docstring. Seconds: the stage's own time (a "
        "teacher: the training, or the cache read).", "",
        "| plan | stage | tokens | ppl | vs teacher | params kept (w/o emb.) | shape | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in dict.fromkeys((r["plan"], r["stage"], r["tokens"]) for r in rows):
        sel = [r for r in rows if (r["plan"], r["stage"], r["tokens"]) == key]
        ppl = [r["ppl"] for r in sel]
        rng = f" [{min(ppl):.3f}, {max(ppl):.3f}]" if len(ppl) > 1 else ""
        share = f"{key[2]:,} ({key[2] / tokens:.0%})" if key[2] else "-"
        lines.append(f"| {key[0]} | {key[1]} | {share} | {statistics.mean(ppl):.3f}{rng} | "
                     f"{statistics.mean(ppl) / teacher:.3f} | {statistics.mean(r['params_kept'] for r in sel):.4f} | "
                     f"{' ; '.join(dict.fromkeys(r['shape'] for r in sel))} | "
                     f"{statistics.mean(r['seconds'] for r in sel):.1f} |")
    lines += ["", "Goals, per seed (distilled / from scratch / teacher ppl at 10% of the teacher's tokens):", ""]
    top = max(r["tokens"] for r in rows if r["stage"] == "distilled")
    for plan in PLANS:
        each, beats, within = [], True, True
        for s in seeds:
            d = _mean(rows, seed=s, plan=plan, stage="distilled", tokens=top)[0]
            f = _mean(rows, seed=s, plan=plan, stage="from scratch", tokens=top)[0]
            t = _mean(rows, seed=s, plan="teacher")[0]
            each.append(f"seed {s}: {d:.3f} / {f:.3f} / {t:.3f}")
            beats, within = beats and d < f, within and d <= 1.1 * t
        lines.append(f"- {plan}: {', '.join(each)}: distilled {'beats' if beats else 'does NOT beat'} from scratch; "
                     f"{'within' if within else 'NOT within'} 10% of the teacher")
    gain = [1 - math.log(_mean(rows, seed=s, plan="teacher")[0]) / math.log(
        _mean(rows, seed=s, plan="teacher, half the steps")[0]) for s in seeds]
    lines += ["", f"Teacher's plateau: doubling its steps from {steps // 2} to {steps} lowered the held-out loss by "
              f"{', '.join(f'{g:.1%}' for g in gain)} (seed {', '.join(map(str, seeds))}).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 layers, one seed, 60 teacher steps")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--out", default="experiments/results")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run in this many processes at once")
    args = ap.parse_args(argv)
    seeds, layers, steps = ([0], 4, 60) if args.quick else ([int(s) for s in args.seeds.split(",")], 8, TEACHER_STEPS)
    if args.jobs > 1:  # one seed per process, one torch thread each: the same rows as one process, in seed order
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            rows = [r for part in pool.map(run, [[s] for s in seeds], [layers] * len(seeds), [steps] * len(seeds))
                    for r in part]
    else:
        rows = run(seeds, layers, steps)
    stem = "llm_recovery_quick" if args.quick else "llm_recovery"
    write_result(Path(args.out), stem, rows, FIELDS, _markdown(rows, argv, steps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
