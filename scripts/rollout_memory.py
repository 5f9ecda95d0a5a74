"""Memory of the `jax` engine's decode segment for R rows x a V-token vocabulary, from XLA's own accounting.

Compiles (does not run) the engine's segment program on a random one-layer Qwen3 with
vocabulary V for each row count, with top-k and top-p on, twice: drawing the next
token `--sample-chunk` rows at a time (the engine's default) and all R rows at once (the
engine before it drew in chunks). Prints one line per (rows, chunk): the segment's
arguments (weights, the decoding state whose logits are R x V float32), its temporaries
and their sum, in MiB. A batch never exceeds the engine's `max_rows` (default 256) rows.

    python scripts/rollout_memory.py [--vocab 248320] [--rows 256 3000] [--sample-chunk 64]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl.rollout import SamplingParams  # noqa: E402
from jaxrl.rollout import jax_engine as je  # noqa: E402
from models import decode  # noqa: E402
from models.checkpoint import load_config, model_class  # noqa: E402

MIB = 2 ** 20
PARAMS = SamplingParams(temperature=1.0, top_k=5, top_p=0.95, thinking_budget=None)


def segment_memory(engine: je.JaxEngine, rows: int, chunk: int, params: SamplingParams = PARAMS
                   ) -> dict[str, float]:
    """XLA's argument / temporary / output bytes (MiB) of one compiled segment over `rows` rows."""
    prompt = jax.ShapeDtypeStruct((1, 16), jnp.int32)
    per_row = [jax.ShapeDtypeStruct((rows,), d) for d in (jnp.int32, jnp.uint32, bool, bool)]
    begin = jax.eval_shape(lambda s, ids, mask, por, keys, valid, think: je._begin(
        engine.graphdef, s, ids, mask, por, keys, valid, think, np.int32(0), max_len=16 + engine.segment),
        engine.state, prompt, prompt, per_row[0], jax.ShapeDtypeStruct((rows, 2), jnp.uint32), per_row[2],
        per_row[3])
    sampling = decode.SamplingParams(params.temperature, params.top_p, params.top_k)
    compiled = je._segment.lower(engine.graphdef, engine.state, begin, engine._consts(params), steps=engine.segment,
                                 sampling=sampling, chunk=chunk).compile()
    m = compiled.memory_analysis()
    out = {"arguments": m.argument_size_in_bytes / MIB, "temporaries": m.temp_size_in_bytes / MIB,
           "outputs": m.output_size_in_bytes / MIB}
    out["peak"] = out["arguments"] + out["temporaries"]  # outputs alias the donated rows
    return out


def tiny_engine(vocab: int, segment: int, sample_chunk: int) -> je.JaxEngine:
    """The engine on a random one-layer Qwen3 (hidden size 32) with a `vocab`-token vocabulary."""
    cfg = load_config(dict(model_type="qwen3", vocab_size=vocab, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                           rope_theta=10000.0, tie_word_embeddings=True))
    model = model_class(cfg)(cfg, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
    return je.JaxEngine(model, prompt_opens_think=False, segment=segment, sample_chunk=sample_chunk)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--rows", type=int, nargs="+", default=[256, 3000])
    p.add_argument("--sample-chunk", type=int, default=64)
    p.add_argument("--segment", type=int, default=64)
    a = p.parse_args()
    engine = tiny_engine(a.vocab, a.segment, a.sample_chunk)
    print(f"vocab {a.vocab}, top-k 5, top-p 0.95; MiB: logits state = rows x vocab x 4 B")
    for rows in a.rows:
        for chunk in (je.sample_chunk(rows, a.sample_chunk, 1), rows):
            m = segment_memory(engine, rows, chunk, PARAMS)
            print(f"rows {rows:5d}  chunk {chunk:5d}  logits {rows * a.vocab * 4 / MIB:8.0f}  arguments "
                  f"{m['arguments']:8.0f}  temporaries {m['temporaries']:8.0f}  peak {m['peak']:8.0f}", flush=True)


if __name__ == "__main__":
    main()
