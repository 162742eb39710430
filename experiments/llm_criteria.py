"""Which importance keeps a small trained language model best right after pruning heads and MLP widths?

    python -m experiments.llm_criteria            # Llama (GQA) and GPT-2 shapes, 2 seeds, 30% and 50% of channels
    python -m experiments.llm_criteria --quick    # one seed, fewer steps (smoke test)

The models are tiny (hidden 96, 4 layers) and trained from scratch on a synthetic language: a first-order Markov
chain over 96 tokens in which every token has 4 likely successors (entropy 1.13 nats per token, the floor of the
loss). After training, each model is pruned with ``prunefx.integrations.transformers.prune`` (heads as whole KV
groups + MLP widths, residual stream kept, ``uniform_layers``, per-layer ratio) at each ratio with each criterion,
starting from the same weights, and the held-out next-token loss is measured with no fine-tuning:
- ``random``: the control; ``l2``: weight norms; ``activation``: ||input|| x ||weight column|| over 8 calibration
  sequences; ``taylor``: |w . dL/dw| over the same calibration sequences.
- GPT-2 has biases: ``activation`` is also run with bias compensation (the removed channels' mean contribution
  folded into the consumers' biases).
Every pruned model is checked by the oracle (exact) before it is evaluated.
Writes ``<out>/llm_criteria.csv`` and ``<out>/llm_criteria.md``.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

from experiments._table import cpu_name, write_result

VOCAB, SEQ = 96, 32
FIELDS = ["model", "seed", "ratio", "criterion", "loss", "loss_increase", "params_kept", "exact", "seconds"]


def _chain(seed: int):
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    succ = torch.stack([torch.randperm(VOCAB, generator=g)[:4] for _ in range(VOCAB)])
    probs = torch.tensor([0.55, 0.25, 0.12, 0.08])
    return succ, probs, g


def _batch(succ, probs, g, n: int):
    import torch

    x = torch.empty(n, SEQ, dtype=torch.long)
    x[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for t in range(1, SEQ):
        pick = torch.multinomial(probs.expand(n, -1), 1, generator=g).squeeze(1)
        x[:, t] = succ[x[:, t - 1], pick]
    return x


def _model(kind: str, seed: int):
    import torch
    import transformers as T

    torch.manual_seed(seed)
    if kind == "llama":
        cfg = T.LlamaConfig(vocab_size=VOCAB, hidden_size=96, intermediate_size=256, num_hidden_layers=4,
                            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=SEQ)  # fmt: skip
        return T.LlamaForCausalLM(cfg)
    cfg = T.GPT2Config(vocab_size=VOCAB, n_embd=96, n_layer=4, n_head=8, n_inner=256, n_positions=SEQ,
                       bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    return T.GPT2LMHeadModel(cfg)


def _loss(model, x) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        return float(model(x, labels=x, use_cache=False).loss)


def _train(model, succ, probs, g, steps: int) -> None:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    model.train()
    for _ in range(steps):
        x = _batch(succ, probs, g, 32)
        loss = model(x, labels=x, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()


def run(kinds: list[str], seeds: list[int], ratios: list[float], steps: int) -> list[dict]:
    import torch

    import prunefx
    from prunefx.integrations import transformers as pfx_hf

    torch.set_num_threads(1)
    rows = []
    for kind in kinds:
        for seed in seeds:
            succ, probs, g = _chain(seed)
            model = _model(kind, seed)
            _train(model, succ, probs, g, steps)
            held_out, calib = _batch(succ, probs, g, 256), _batch(succ, probs, g, 8)
            base = _loss(model, held_out)
            rows.append({"model": kind, "seed": seed, "ratio": 0.0, "criterion": "unpruned", "loss": round(base, 4),
                         "loss_increase": 0.0, "params_kept": 1.0, "exact": True, "seconds": 0.0})  # fmt: skip
            n_params = sum(p.numel() for p in model.parameters())
            variants = [("random", {}), ("l2", {}), ("activation", {"calibration": [calib]}),
                        ("taylor", {"calibration": [(calib, calib)], "loss_fn": _lm_loss})]  # fmt: skip
            if kind == "gpt2":
                variants.append(("activation+compensation", {"calibration": [calib], "bias_compensation": True}))
            for ratio in ratios:
                for name, kwargs in variants:
                    pruned = copy.deepcopy(model).eval()
                    t0 = time.perf_counter()
                    result = pfx_hf.prune(pruned, (calib[:1],), prunefx.PlanConfig(ratio=ratio, scope="local"),
                                          criterion=name.split("+")[0], **kwargs)  # fmt: skip
                    assert result.verified.accepted, result.verified.message
                    loss = _loss(pruned, held_out)
                    rows.append({
                        "model": kind, "seed": seed, "ratio": ratio, "criterion": name, "loss": round(loss, 4),
                        "loss_increase": round(loss - base, 4),
                        "params_kept": round(sum(p.numel() for p in pruned.parameters()) / n_params, 3),
                        "exact": result.verified.exact, "seconds": round(time.perf_counter() - t0, 2),
                    })  # fmt: skip
                    print(rows[-1], flush=True)
    return rows


def _lm_loss(outputs, targets):
    import torch.nn.functional as F

    logits = outputs.logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[:, 1:].reshape(-1))


def _markdown(rows: list[dict], argv: list[str]) -> str:
    import statistics

    load = os.getloadavg()
    lines = [
        "# Importance criteria on a small trained language model, right after pruning (no fine-tuning)", "",
        f"Machine: {cpu_name()}, {os.cpu_count()} CPUs, 1 thread, load average {load[0]:.1f}. "
        f"Command: `python -m experiments.llm_criteria {' '.join(argv)}`. Held-out next-token loss (nats) on the "
        "synthetic Markov language (floor 1.13); mean over seeds, range in brackets.", "",
        "| model | ratio | criterion | loss | loss increase | params kept |", "|---|---|---|---|---|---|",
    ]  # fmt: skip
    order = {c: i for i, c in enumerate(dict.fromkeys(r["criterion"] for r in rows))}
    keys = sorted({(r["model"], r["ratio"], r["criterion"]) for r in rows}, key=lambda k: (k[0], k[1], order[k[2]]))
    for model, ratio, crit in keys:
        sel = [r for r in rows if (r["model"], r["ratio"], r["criterion"]) == (model, ratio, crit)]
        inc = [r["loss_increase"] for r in sel]
        rng = f" [{min(inc):.3f}, {max(inc):.3f}]" if len(inc) > 1 else ""
        lines.append(f"| {model} | {ratio} | {crit} | {statistics.mean(r['loss'] for r in sel):.3f} | "
                     f"{statistics.mean(inc):.3f}{rng} | {statistics.mean(r['params_kept'] for r in sel):.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one seed, 60 training steps, llama only, ratio 0.3")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--out", default="experiments/results")
    args = ap.parse_args(argv)
    if args.quick:
        rows = run(["llama"], [0], [0.3], 60)
    else:
        rows = run(["llama", "gpt2"], [int(s) for s in args.seeds.split(",")], [0.3, 0.5], args.steps)
    stem = "llm_criteria_quick" if args.quick else "llm_criteria"
    write_result(Path(args.out), stem, rows, FIELDS, _markdown(rows, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
