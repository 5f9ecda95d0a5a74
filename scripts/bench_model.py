"""Benchmark our Qwen3, Qwen3.5 or their MoE models against transformers' PyTorch model on this CPU, in one run.

Measures, on the same random model (saved by transformers, loaded by us):
- training: forward + backward tokens/s of a next-token cross-entropy loss;
- decoding: greedy tokens/s of our jitted decoder vs transformers' `generate`;
- compile times of our forward for two depths (scanned layers: flat in depth).

    python scripts/bench_model.py [--json] [--family qwen3|qwen3_5|qwen3_moe|qwen3_5_moe] [--layers 4]
                                  [--compile-depths 4,32] [--experts 16 --top-k 4 --moe-mlp 192]

With --json the last line is
{"train_ratio_vs_torch": .., "decode_ratio_vs_torch": ..} (ours / theirs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
from transformers import Qwen3Config as HFQwen3Config

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import models  # noqa: E402
from models.decode import Decoder  # noqa: E402
from models.checkpoint import load_config, model_class  # noqa: E402


# family -> (HF config class, HF model class)
FAMILIES = {"qwen3": (HFQwen3Config, Qwen3ForCausalLM), "qwen3_5": (Qwen3_5TextConfig, Qwen3_5ForCausalLM),
            "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
            "qwen3_5_moe": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM)}


def _hf_config(a, layers: int):
    """The HF config of the benchmarked model; Qwen3.5's DeltaNet layers reuse the attention head sizes.

    MoE families: `--experts` experts of FFN `--moe-mlp`, `--top-k` active (renormalized); Qwen3.5-MoE's
    shared expert has FFN `--moe-mlp` too.
    """
    kw = dict(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.mlp, num_hidden_layers=layers,
              num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
              tie_word_embeddings=True)
    if a.family.endswith("_moe"):
        kw.update(num_experts=a.experts, num_experts_per_tok=a.top_k, moe_intermediate_size=a.moe_mlp)
        if a.family == "qwen3_5_moe":
            kw.update(shared_expert_intermediate_size=a.moe_mlp)
        else:
            kw.update(norm_topk_prob=True)
    if a.family.startswith("qwen3_5"):
        kw.update(linear_key_head_dim=a.head_dim, linear_value_head_dim=a.head_dim,
                  linear_num_key_heads=a.kv_heads, linear_num_value_heads=a.heads, eos_token_id=None)
    else:
        kw.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    return FAMILIES[a.family][0](**kw)


def _best_of(fns, reps: int) -> list[float]:
    """Best wall time of each function, the functions taking turns (fair under a varying load)."""
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t)
    return best


def bench_train(a, hf, ours) -> tuple[float, float]:
    rs = np.random.RandomState(0)
    ids_np = rs.randint(0, a.vocab, (a.batch, a.seq))
    ids_t = torch.tensor(ids_np)

    def torch_step():
        hf.zero_grad(set_to_none=True)
        hf(ids_t, labels=ids_t).loss.backward()

    def loss(m, ids):
        logits = m(ids)[:, :-1].astype(jnp.float32)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    graphdef, state = nnx.split(ours)
    step = jax.jit(jax.value_and_grad(lambda st, ids: loss(nnx.merge(graphdef, st), ids)))
    ids = jnp.asarray(ids_np, jnp.int32)

    def jax_step():
        jax.block_until_ready(step(state, ids))

    hf.train()
    torch_step()
    jax_step()
    tokens = a.batch * a.seq
    t_jax, t_torch = _best_of([jax_step, torch_step], a.reps)
    hf.eval()
    return tokens / t_jax, tokens / t_torch


def bench_decode(a, hf, ours) -> tuple[float, float]:
    rs = np.random.RandomState(1)
    prompt = rs.randint(1, a.vocab, (a.decode_batch, a.prompt))
    dec = Decoder(ours)

    def jax_gen():
        out = dec.generate(jnp.asarray(prompt, jnp.int32), max_new_tokens=a.new_tokens)
        jax.block_until_ready(out["tokens"])
        return out

    def torch_gen():
        with torch.no_grad():
            return hf.generate(torch.tensor(prompt), attention_mask=torch.ones_like(torch.tensor(prompt)),
                               max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
                               pad_token_id=0, eos_token_id=None)

    ours_tokens = np.asarray(jax_gen()["tokens"])
    theirs = torch_gen()[:, a.prompt:].numpy()
    agree = float((ours_tokens == theirs).mean())
    tokens = a.decode_batch * a.new_tokens
    t_jax, t_torch = _best_of([jax_gen, torch_gen], a.reps)
    return tokens / t_jax, tokens / t_torch, agree


def step_time(a, ours, max_len: int, steps: int = 20) -> float:
    """Milliseconds per jitted decode step with a cache of `max_len` slots."""
    dec = Decoder(ours)
    cache = dec.init_cache(a.decode_batch, max_len)
    ones = jnp.ones((a.decode_batch, a.prompt), jnp.int32)
    logits, cache = dec.prefill(dec.state, cache, ones, ones)
    ids = jnp.ones((a.decode_batch,), jnp.int32)
    logits, cache = dec.step(dec.state, cache, ids)
    jax.block_until_ready(logits)
    t = time.perf_counter()
    for _ in range(steps):
        logits, cache = dec.step(dec.state, cache, ids)
    jax.block_until_ready(logits)
    return (time.perf_counter() - t) / steps * 1e3


def compile_time(a, layers: int) -> float:
    cfg = load_config(json.loads(_hf_config(a, layers).to_json_string()))
    model = nnx.eval_shape(lambda: model_class(cfg)(cfg, rngs=nnx.Rngs(0), remat=a.remat))
    graphdef, state = nnx.split(model)
    ids = jax.ShapeDtypeStruct((a.batch, a.seq), jnp.int32)

    def loss(st, ids):
        return jnp.mean(nnx.merge(graphdef, st)(ids).astype(jnp.float32))

    t = time.perf_counter()
    jax.jit(jax.value_and_grad(loss)).lower(state, ids).compile()
    return time.perf_counter() - t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="end with one JSON line of the ratios")
    p.add_argument("--family", choices=sorted(FAMILIES), default="qwen3", help="model family (default: qwen3)")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--mlp", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--experts", type=int, default=16, help="MoE families: routed experts")
    p.add_argument("--top-k", type=int, default=4, help="MoE families: experts per token")
    p.add_argument("--moe-mlp", type=int, default=192, help="MoE families: FFN width of each expert")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--decode-batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--remat", action=argparse.BooleanOptionalAction, default=True,
                   help="recompute layer activations in the backward pass (our default)")
    p.add_argument("--step-lengths", default="", help="comma-separated cache sizes to time one decode step for")
    p.add_argument("--compile-depths", default="4,32", help="comma-separated depths to time compiles for ('' skips)")
    a = p.parse_args(argv)

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    hf = FAMILIES[a.family][1](_hf_config(a, a.layers)).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = models.from_pretrained(d, remat=a.remat)

    moe = f", experts {a.experts} (top {a.top_k}) of {a.moe_mlp}" if a.family.endswith("_moe") else ""
    print(f"config: {a.family}, vocab {a.vocab}, hidden {a.hidden}, mlp {a.mlp}{moe}, layers {a.layers}, heads {a.heads}/{a.kv_heads}"
          f" x {a.head_dim}, remat {a.remat}; load average {os.getloadavg()[0]:.1f}; cpu threads {os.cpu_count()},"
          f" torch threads {torch.get_num_threads()}, jax {jax.__version__}, torch {torch.__version__}")
    ours_train, torch_train = bench_train(a, hf, ours)
    print(f"train fwd+bwd  batch {a.batch} x {a.seq}: ours {ours_train:,.0f} tok/s, torch {torch_train:,.0f} tok/s,"
          f" ratio {ours_train / torch_train:.2f}")
    ours_dec, torch_dec, agree = bench_decode(a, hf, ours)
    print(f"greedy decode  batch {a.decode_batch}, prompt {a.prompt}, {a.new_tokens} new: ours {ours_dec:,.0f} tok/s,"
          f" transformers generate {torch_dec:,.0f} tok/s, ratio {ours_dec / torch_dec:.2f}"
          f" (tokens agree: {agree:.0%})")
    for n in [int(x) for x in a.step_lengths.split(",") if x]:
        print(f"decode step, batch {a.decode_batch}, cache of {n} slots: {step_time(a, ours, n):.1f} ms")
    for depth in [int(x) for x in a.compile_depths.split(",") if x]:
        print(f"compile forward+backward, {depth} layers: {compile_time(a, depth):.1f} s")
    if a.json:
        print(json.dumps({"train_ratio_vs_torch": round(ours_train / torch_train, 3),
                          "decode_ratio_vs_torch": round(ours_dec / torch_dec, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
