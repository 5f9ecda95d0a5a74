"""Decoding: a preallocated cache, jitted prefill and step, and a generate loop.

The cache is one pytree. `Cache.layers` is the family's own per-layer-kind
state (Qwen3: one stacked `KVCache [L, B, K, S, H]`; Qwen3.5 adds GDN conv and
recurrent states); the bookkeeping around it is shared:

- `index`: how many slots are filled (the same for every row; prompts are
  left-padded to a common length);
- `seg [B, S]`: 1 where a slot holds a real token, 0 for padding or empty;
- `next_pos [B]`: the position id of each row's next token.

A family's model takes `cache=` and calls `cache.advance(attention_mask,
shape)` to get positions, the attention mask and the bookkeeping for the new
tokens; its layers update `cache.layers`. Everything here is family-agnostic:
it needs only `model(ids, attention_mask=, cache=, return_hidden=True)`,
`model.logits(h)` and `model.init_cache(batch, max_len)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from models.layers import AttnMask

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Cache:
    """Decoding state for a batch: family layer states plus shared bookkeeping."""

    layers: Any
    index: Array  # [] int32
    seg: Array  # [B, S] int32
    next_pos: Array  # [B] int32

    @staticmethod
    def empty(layers: Any, batch: int, max_len: int) -> Cache:
        return Cache(layers, jnp.zeros((), jnp.int32), jnp.zeros((batch, max_len), jnp.int32),
                     jnp.zeros((batch,), jnp.int32))

    @property
    def max_len(self) -> int:
        return self.seg.shape[1]

    def advance(self, attention_mask: Array | None, shape: tuple[int, int]) -> tuple[Array, AttnMask, Cache]:
        """Account for `shape = (B, T)` new tokens written at slots `index .. index+T-1`.

        Returns their positions `[B, T]` (continuing each row; left padding gets
        position 0 and never counts), the attention mask over all cache slots,
        and the cache with `index`, `seg`, `next_pos` moved on (layers untouched).
        """
        b, t = shape
        valid = jnp.ones((b, t), jnp.int32) if attention_mask is None else attention_mask.astype(jnp.int32)
        positions = self.next_pos[:, None] + jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
        seg = jax.lax.dynamic_update_slice(self.seg, valid, (0, self.index))
        s = self.max_len
        q_idx = self.index + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        kv_idx = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
        mask = AttnMask(q_idx, kv_idx, valid, seg)
        new = Cache(self.layers, self.index + t, seg, self.next_pos + valid.sum(axis=1))
        return positions, mask, new


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token. temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"bad sampling params {self}")


def sample(logits: Array, key: Array, params: SamplingParams) -> tuple[Array, Array]:
    """Pick tokens from `logits [B, V]`; returns ids `[B]` and their log-probs `[B]`.

    The log-prob is under `softmax(logits / temperature)` before top-k/top-p
    truncation (under `softmax(logits)` when greedy), the distribution a
    policy-gradient ratio compares against.
    """
    logits = logits.astype(jnp.float32)
    if params.temperature == 0:
        ids = jnp.argmax(logits, axis=-1)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return ids, jnp.take_along_axis(logp, ids[:, None], axis=-1)[:, 0]
    scaled = logits / params.temperature
    logp = jax.nn.log_softmax(scaled, axis=-1)
    masked = scaled
    if params.top_k:
        kth = jax.lax.top_k(scaled, params.top_k)[0][:, -1:]
        masked = jnp.where(scaled < kth, -jnp.inf, masked)
    if params.top_p < 1.0:
        sorted_logits = jnp.sort(masked, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each token
        cutoff = jnp.min(jnp.where(before < params.top_p, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        masked = jnp.where(masked < cutoff, -jnp.inf, masked)
    ids = jax.random.categorical(key, masked, axis=-1)
    return ids, jnp.take_along_axis(logp, ids[:, None], axis=-1)[:, 0]


def sample_rows(logits: Array, keys: Array, params: SamplingParams, chunk: int) -> tuple[Array, Array]:
    """`sample` with a key per row (`keys [B]`), `chunk` rows at a time (`chunk` divides B).

    The top-k / top-p temporaries (sort, softmax, cumsum) are then `[chunk, V]`, not
    `[B, V]`. Chunk i holds rows i, i + B/chunk, ...: rows sharded in blocks over devices
    give every device its share of every chunk, so no rows move between devices.
    """
    def one(logits_V, key):
        ids, logp = sample(logits_V[None], key, params)
        return ids[0], logp[0]

    b, v = logits.shape
    if chunk >= b:
        return jax.vmap(one)(logits, keys)
    if b % chunk:
        raise ValueError(f"chunk={chunk} does not divide {b} rows")
    k = b // chunk
    logits_CxKxV, keys_CxK = logits.reshape(chunk, k, v), keys.reshape(chunk, k)

    def body(i, acc):
        ids, logp = jax.vmap(one)(jax.lax.dynamic_index_in_dim(logits_CxKxV, i, 1, keepdims=False),
                                  jax.lax.dynamic_index_in_dim(keys_CxK, i, 1, keepdims=False))
        return (jax.lax.dynamic_update_index_in_dim(acc[0], ids.astype(jnp.int32), i, 1),
                jax.lax.dynamic_update_index_in_dim(acc[1], logp, i, 1))

    init = (jnp.zeros((chunk, k), jnp.int32), jnp.zeros((chunk, k), jnp.float32))
    ids, logp = jax.lax.fori_loop(0, k, body, init)
    return ids.reshape(b), logp.reshape(b)


class Decoder:
    """Jitted prefill, step and generate for one model's graph.

    The compiled functions take the model's state explicitly, so new weights
    (after an RL update) reuse them without retracing. `step` donates the
    cache, and the generate loop carries it through a `while_loop`: both
    update it in place.

        dec = Decoder(model)
        out = dec.generate(prompt_ids, prompt_mask, max_new_tokens=64)
    """

    def __init__(self, model: nnx.Module):
        self.graphdef, self.state = nnx.split(model)
        self._init_cache = jax.jit(model.init_cache, static_argnums=(0, 1, 2))
        self.prefill = jax.jit(self._prefill)
        self.step = jax.jit(self._step, donate_argnames=("cache",))
        self._loop = jax.jit(self._loop_impl, static_argnames=("max_new_tokens", "params"))

    def init_cache(self, batch: int, max_len: int, dtype=None) -> Cache:
        """An empty cache, created under jit so that an active mesh shards it (batch, kv heads)."""
        return self._init_cache(batch, max_len, dtype)

    def _prefill(self, state, cache: Cache, ids: Array, mask: Array) -> tuple[Array, Cache]:
        """Run the prompt `[B, P]` through the model; returns last-position logits `[B, V]`."""
        model = nnx.merge(self.graphdef, state)
        h, cache = model(ids, attention_mask=mask, cache=cache, return_hidden=True)
        return model.logits(h[:, -1:])[:, 0], cache

    def _step(self, state, cache: Cache, ids: Array) -> tuple[Array, Cache]:
        """One token per row `[B]` → next logits `[B, V]`, cache updated in place."""
        model = nnx.merge(self.graphdef, state)
        h, cache = model(ids[:, None], cache=cache, return_hidden=True)
        return model.logits(h)[:, 0], cache

    def _loop_impl(self, state, cache: Cache, logits: Array, key: Array, eos: Array, *,
                   max_new_tokens: int, params: SamplingParams):
        b = logits.shape[0]
        tokens = jnp.zeros((b, max_new_tokens), jnp.int32)
        logps = jnp.zeros((b, max_new_tokens), jnp.float32)
        done = jnp.zeros((b,), bool)
        lengths = jnp.zeros((b,), jnp.int32)

        def cond(c):
            i, _, _, _, _, done, _, _ = c
            return (i < max_new_tokens) & ~jnp.all(done)

        def body(c):
            i, cache, logits, tokens, logps, done, lengths, key = c
            key, sub = jax.random.split(key)
            ids, lp = sample(logits, sub, params)
            ids = jnp.where(done, 0, ids).astype(jnp.int32)
            tokens = tokens.at[:, i].set(ids)
            logps = logps.at[:, i].set(jnp.where(done, 0.0, lp))
            lengths = lengths + (~done).astype(jnp.int32)
            done = done | jnp.isin(ids, eos)
            logits, cache = self._step(state, cache, ids)
            return i + 1, cache, logits, tokens, logps, done, lengths, key

        init = (jnp.zeros((), jnp.int32), cache, logits, tokens, logps, done, lengths, key)
        _, cache, _, tokens, logps, _, lengths, _ = jax.lax.while_loop(cond, body, init)
        return tokens, logps, lengths

    def generate(self, prompt_ids: Array, prompt_mask: Array | None = None, *, max_new_tokens: int,
                 params: SamplingParams = SamplingParams(), eos_ids: tuple[int, ...] = (), key: Array | None = None,
                 state: nnx.State | None = None, max_len: int | None = None) -> dict[str, Array]:
        """Sample up to `max_new_tokens` after left-padded prompts `[B, P]`.

        Returns `tokens [B, N]` (0 after a row's end), `logprobs [B, N]` and
        `lengths [B]` (tokens generated, counting the eos). A row ends at any
        of `eos_ids`; the loop stops when every row has ended.
        """
        state = self.state if state is None else state
        b, p = prompt_ids.shape
        mask = jnp.ones((b, p), jnp.int32) if prompt_mask is None else jnp.asarray(prompt_mask, jnp.int32)
        if max_len is not None and max_len < p + max_new_tokens:
            # The cache writes would clamp at its end and overwrite earlier slots: wrong tokens, no error.
            raise ValueError(f"max_len={max_len} cannot hold a prompt of {p} tokens plus "
                             f"max_new_tokens={max_new_tokens}; use max_len >= {p + max_new_tokens}")
        cache = self.init_cache(b, max_len or p + max_new_tokens)
        logits, cache = self.prefill(state, cache, jnp.asarray(prompt_ids, jnp.int32), mask)
        key = jax.random.key(0) if key is None else key
        eos = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)
        tokens, logps, lengths = self._loop(state, cache, logits, key, eos, max_new_tokens=max_new_tokens,
                                            params=params)
        return {"tokens": tokens, "logprobs": logps, "lengths": lengths}
