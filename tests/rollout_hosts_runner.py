"""The `jax` engine as one of several hosts (or alone): samples a fixed script of calls, writes the completions.

Usage: python tests/rollout_hosts_runner.py OUT.json [PORT PROCESS_ID NUM_PROCESSES]

Alone it passes every prompt of each call; as process i of P it passes its block of
them (blocks as even as possible, earlier hosts one more), so the hosts' outputs in
process order must equal the lone run's. XLA_FLAGS from the caller's environment apply.
"""

import json
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl import hosts
from jaxrl.rollout import SamplingParams
from jaxrl.rollout.jax_engine import JaxEngine
from jaxrl.rollout.text import TokenSpec
from models import sharding as msh
from models.checkpoint import load_config, model_class

ARCH = dict(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, rope_theta=10000.0, tie_word_embeddings=False)
PROMPTS = [[5, 9, 17, 33, 2, 40, 4], [11, 3], [30, 31, 32, 7, 8, 1, 60, 61, 62, 12, 13], [6], [21, 22, 23, 24]]
# (prompts used, sampling): fan-out over several prompts with top-k/top-p in two row chunks; n over the
# per-host row limit (split into sample batches); one prompt in all (hosts after the first pass none).
CALLS = [(5, SamplingParams(n=3, temperature=1.0, top_k=8, top_p=0.9, max_tokens=20, thinking_budget=None, seed=7)),
         (5, SamplingParams(n=10, temperature=0.8, max_tokens=12, thinking_budget=None, seed=11)),
         (1, SamplingParams(n=2, temperature=1.0, max_tokens=9, thinking_budget=None, seed=5))]


def block(items, index, count):
    per, extra = divmod(len(items), count)
    start = index * per + min(index, extra)
    return items[start:start + per + (index < extra)]


def main(out, port=None, index=0, count=1):
    if port is not None:
        hosts.initialize(f"127.0.0.1:{port}", int(count), int(index))
    index, count = jax.process_index(), jax.process_count()
    mesh = msh.make_mesh(1, -1, 1)
    cfg = load_config(ARCH)
    model = msh.init_sharded(lambda: model_class(cfg)(cfg, dtype=jnp.float32, param_dtype=jnp.float32,
                                                      rngs=nnx.Rngs(0)), mesh)
    engine = JaxEngine(model, mesh=mesh, tokens=TokenSpec(stop_ids=(1, 2, 3)), prompt_opens_think=False,
                       max_rows=16, segment=4, sample_chunk=8)
    results = []
    for used, params in CALLS:
        groups = engine.generate(block(PROMPTS[:used], index, count), params)
        results.append([[{"tokens": list(c.token_ids), "logprobs": list(c.logprobs), "finish": c.finish_reason}
                         for c in group] for group in groups])
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
