"""Analysis of 1B / 3B / 7B / 70B Llama-architecture configs on the meta device, prunefx vs Torch-Pruning.

    python -m experiments.llm_meta                      # 1b, 3b, 7b, 70b; Torch-Pruning where memory allows
    python -m experiments.llm_meta --sizes 1b --quick   # smoke test: 2 layers of the 1B config

Each measurement runs in a fresh subprocess (peak RSS is that process's ``ru_maxrss``, imports included),
one thread, under a wall-clock timeout:
- prunefx: the model is built on the meta device (no weights), then ``prunefx.analyze`` (torch.export capture,
  rules, grouping), then a plan to a parameter target (``PlanConfig(params=0.7, scope="local",
  uniform_layers=True)``, residual stream left alone, random scores because there are no weights to read) and the
  pruned model's Hugging Face config, derived from the meta model the plan was applied to.
- Torch-Pruning: ``DependencyGraph().build_dependency`` then ``get_all_groups``. It runs a real forward pass
  (transformers' mask code calls ``.item()``, which the meta device cannot), so the model gets real, unset
  (``to_empty``) bf16 weights on the CPU; a size whose weights do not fit in the free memory is not attempted.
Writes ``<out>/llm_meta.csv`` and ``<out>/llm_meta.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = {
    # Llama-3.2-1B / 3B and Llama-2-7B shapes (vocabulary included; tied embeddings where the originals tie them)
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
    # Llama-2-70B (GQA: 8 KV heads)
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=32000),
}
# analysis_s: prunefx.analyze (export + rules + groups) / Torch-Pruning's build_dependency; next_s: prunefx's plan to
# a params target + the pruned config / Torch-Pruning's get_all_groups. cpu_s: CPU time of the analysis (the machine
# is shared: wall time grows with the load average, CPU time much less).
FIELDS = ["size", "params_b", "tool", "status", "analysis_s", "analysis_cpu_s", "next_s", "groups", "prunable",
          "peak_rss_mb", "detail"]


def _prunefx(size: str, quick: bool) -> dict:
    import resource

    import torch

    torch.set_num_threads(1)
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    import prunefx
    from prunefx.integrations import transformers as hf
    from prunefx.transform import owned_modules

    cfg = dict(CONFIGS[size], **({"num_hidden_layers": 2} if quick else {}))
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**cfg))
    params = sum(p.numel() for p in model.parameters()) / 1e9
    ids = torch.zeros(1, 8, dtype=torch.long, device="meta")
    t0, c0 = time.perf_counter(), time.process_time()
    dg = prunefx.analyze(model, (ids,))
    t1, c1 = time.perf_counter(), time.process_time()
    scores = prunefx.score(model, dg, "random").values  # no weights on the meta device: the plan's shape is the point
    cfg_plan = prunefx.PlanConfig(params=0.7, scope="local", uniform_layers=True, ignore=hf.stream_patterns(model))
    plan = prunefx.make_plan(dg, scores, cfg_plan, cost=prunefx.CostModel(model, dg, (ids,)),
                             owned_constants=owned_modules(model))
    prunefx.apply_plan(model, dg, plan)
    config = hf.derived_config(model)
    t2 = time.perf_counter()
    return {"params_b": round(params, 3), "status": "ok", "analysis_s": round(t1 - t0, 2),
            "analysis_cpu_s": round(c1 - c0, 2), "next_s": round(t2 - t1, 2), "groups": len(dg.groups),
            "prunable": len(dg.prunable),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "detail": f"params kept {plan.estimate['params_after'] / plan.estimate['params_before']:.3f}; "
                      f"heads {config.num_attention_heads}/{cfg['num_attention_heads']}, "
                      f"kv {config.num_key_value_heads}, "
                      f"intermediate {config.intermediate_size}"}


def _torch_pruning(size: str, quick: bool) -> dict:
    import resource

    import torch

    torch.set_num_threads(1)
    import torch_pruning as tp
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    cfg = dict(CONFIGS[size], **({"num_hidden_layers": 2} if quick else {}))
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    model = model.to_empty(device="cpu").to(torch.bfloat16)  # unset values: the graph does not depend on them
    model.tie_weights()  # to_empty made the tied lm_head a tensor of its own
    params = sum(p.numel() for p in model.parameters()) / 1e9
    ids = torch.zeros(1, 8, dtype=torch.long)
    t0, c0 = time.perf_counter(), time.process_time()
    dg = tp.DependencyGraph().build_dependency(model, example_inputs=ids,
                                               forward_fn=lambda m, x: m(x, use_cache=False).logits)
    t1, c1 = time.perf_counter(), time.process_time()
    print(json.dumps({"params_b": round(params, 3), "status": "built", "analysis_s": round(t1 - t0, 2),
                      "analysis_cpu_s": round(c1 - c0, 2),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}), flush=True)
    groups = list(dg.get_all_groups())
    t2 = time.perf_counter()
    return {"params_b": round(params, 3), "status": "ok", "analysis_s": round(t1 - t0, 2),
            "analysis_cpu_s": round(c1 - c0, 2), "next_s": round(t2 - t1, 2), "groups": len(groups),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "detail": "build_dependency, then get_all_groups"}


def _free_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def _run(tool: str, size: str, quick: bool, timeout: float) -> dict:
    """Run one measurement in a fresh interpreter; the last JSON line it prints is the result."""
    cmd = [sys.executable, "-m", "experiments.llm_meta", "--child", tool, "--sizes", size]
    cmd += ["--quick"] if quick else []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    root = Path(__file__).resolve().parents[1]
    row = {"size": size, "tool": tool}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode == 0 and lines:
            row.update(json.loads(lines[-1]))
        else:
            last = (out.stderr.strip().splitlines() or ["?"])[-1]
            row.update(json.loads(lines[-1]) if lines else {})
            row.update(status=f"error (rc {out.returncode})", detail=last[:160])
    except subprocess.TimeoutExpired as exc:
        lines = [ln for ln in (exc.stdout or b"").decode().splitlines() if ln.startswith("{")]
        if lines:
            row.update(json.loads(lines[-1]))
        row.update(status=f"timeout ({timeout:.0f} s)", detail=row.get("detail", "") or
                   ("graph built, get_all_groups did not finish" if lines else "did not finish"))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1b,3b,7b,70b")
    ap.add_argument("--quick", action="store_true", help="2 layers of each config (smoke test)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--tp", action=argparse.BooleanOptionalAction, default=True, help="also run Torch-Pruning")
    ap.add_argument("--out", default="experiments/results")
    ap.add_argument("--child", choices=["prunefx", "torch_pruning"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = args.sizes.split(",")
    if args.child:
        fn = _prunefx if args.child == "prunefx" else _torch_pruning
        print(json.dumps(fn(sizes[0], args.quick)), flush=True)
        return 0
    rows = []
    for size in sizes:
        rows.append(_run("prunefx", size, args.quick, args.timeout))
        print(rows[-1], flush=True)
        if not args.tp:
            continue
        try:
            import torch_pruning  # noqa: F401
        except ImportError:
            rows.append({"size": size, "tool": "torch_pruning", "status": "not installed"})
            continue
        need = rows[-1].get("params_b", 0) * 2 * 1024 * 1.3 + 1500  # bf16 weights + a forward + imports, MB
        if _free_mb() < need:
            rows.append({"size": size, "tool": "torch_pruning", "status": "not run",
                         "detail": f"needs ~{need / 1024:.0f} GB of real weights, {_free_mb() / 1024:.0f} GB free"})
        else:
            rows.append(_run("torch_pruning", size, args.quick, args.timeout))
        print(rows[-1], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "llm_meta_quick" if args.quick else "llm_meta"
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    load = os.getloadavg()
    title = f"# Llama configs on the meta device: analysis time and peak RSS ({'quick' if args.quick else 'full'})"
    lines = [title, "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, 1 thread per run, "
             f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; timeout {args.timeout:.0f} s. "
             "Peak RSS includes importing torch and transformers (~0.77 GB).",
         "",
         f"Command: `python -m experiments.llm_meta {' '.join(argv if argv is not None else sys.argv[1:])}`", "",
             "| " + " | ".join(FIELDS) + " |", "|" + "---|" * len(FIELDS)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in FIELDS) + " |" for r in rows]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
