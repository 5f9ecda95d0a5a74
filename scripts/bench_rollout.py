"""Benchmark the `jax` rollout engine against transformers' sampling `generate` on this CPU, in one run.

On one random Qwen3 made by transformers (float32, saved and loaded by us):

- sampling throughput: P prompts x n samples, `max_new_tokens` each, temperature 1,
  top-p 1, no top-k and no stop token (every row runs to the end), our engine against
  `generate(do_sample=True, num_return_sequences=n)`; generated tokens per second;
- prompt fan-out: the engine with one prefill per prompt copied to its n rows, against
  the same engine prefilling each of the n rows itself, at long prompts.

Each measurement is the best of `--reps` timed runs after one warm-up (compiles), the
contenders taking turns so that a varying machine load hits both.

    python scripts/bench_rollout.py [--json] [--prompts 16] [--n 6] [--new-tokens 256]

With --json the last line is {"sampling_ratio_vs_torch": .., "fan_out_speedup": .., ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import models  # noqa: E402
from jaxrl.rollout import SamplingParams  # noqa: E402
from jaxrl.rollout.jax_engine import JaxEngine  # noqa: E402
from jaxrl.rollout.text import TokenSpec  # noqa: E402


def _best_of(fns, reps: int) -> list[float]:
    """Best wall time of each function, taking turns."""
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
    return best


def _prompts(rs: np.random.RandomState, count: int, low: int, high: int, vocab: int) -> list[list[int]]:
    return [rs.randint(0, vocab, rs.randint(low, high + 1)).tolist() for _ in range(count)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--prompt-len", type=int, nargs=2, default=(32, 64), metavar=("MIN", "MAX"),
                   help="prompt lengths of the throughput run")
    p.add_argument("--fan-out-prompt-len", type=int, default=512)
    p.add_argument("--fan-out-new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--mlp", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()

    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cpus; torch threads {torch.get_num_threads()}")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.mlp, num_hidden_layers=a.layers,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=32, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}, eos_token_id=None)
    hf = Qwen3ForCausalLM(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        model = models.from_pretrained(d)
    rs = np.random.RandomState(0)
    params = SamplingParams(n=a.n, temperature=1.0, top_p=1.0, top_k=0, max_tokens=a.new_tokens,
                            thinking_budget=None)
    no_stops = TokenSpec()
    engine = JaxEngine(model, tokens=no_stops, max_rows=a.prompts * a.n)

    # --- sampling throughput
    prompts = _prompts(rs, a.prompts, *a.prompt_len, a.vocab)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(q)) + q for q in prompts])
    mask = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in prompts])
    generated = a.prompts * a.n * a.new_tokens

    def ours():
        out = engine.generate(prompts, params)
        assert sum(len(c.token_ids) for g in out for c in g) == generated

    def theirs():
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                              num_return_sequences=a.n, max_new_tokens=a.new_tokens,
                              min_new_tokens=a.new_tokens, pad_token_id=0)
        assert out.shape == (a.prompts * a.n, width + a.new_tokens)

    t0 = time.perf_counter()
    ours()
    warm = time.perf_counter() - t0
    theirs()
    t_ours, t_theirs = _best_of([ours, theirs], a.reps)
    print(f"sampling {a.prompts} prompts x n={a.n} x {a.new_tokens} tokens: ours {generated / t_ours:,.0f} tok/s "
          f"({t_ours:.2f} s; first call with compiles {warm:.1f} s), transformers {generated / t_theirs:,.0f} tok/s "
          f"({t_theirs:.2f} s): ratio {t_theirs / t_ours:.2f}")

    # --- prompt fan-out
    long_prompts = _prompts(rs, a.prompts, a.fan_out_prompt_len, a.fan_out_prompt_len, a.vocab)
    fan_params = SamplingParams(n=a.n, temperature=1.0, max_tokens=a.fan_out_new_tokens, thinking_budget=None)
    separate = JaxEngine(model, tokens=no_stops, max_rows=a.prompts * a.n, fan_out=False)
    runs = {}

    def fanned():
        runs["fan"] = engine.generate(long_prompts, fan_params)

    def unfanned():
        runs["sep"] = separate.generate(long_prompts, fan_params)

    fanned()
    unfanned()
    t_fan, t_sep = _best_of([fanned, unfanned], a.reps)
    same = [c.token_ids for g in runs["fan"] for c in g] == [c.token_ids for g in runs["sep"] for c in g]
    print(f"fan-out at {a.fan_out_prompt_len}-token prompts, {a.fan_out_new_tokens} new tokens: one prefill per "
          f"prompt {t_fan:.2f} s, one per sample {t_sep:.2f} s: speed-up {t_sep / t_fan:.2f} (same samples: {same})")
    if a.json:
        print(json.dumps({
            "sampling_ratio_vs_torch": round(t_theirs / t_ours, 3),
            "ours_tokens_per_s": round(generated / t_ours, 1), "torch_tokens_per_s": round(generated / t_theirs, 1),
            "fan_out_speedup": round(t_sep / t_fan, 3), "fan_out_same_samples": same,
            "load_average": round(os.getloadavg()[0], 2),
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
