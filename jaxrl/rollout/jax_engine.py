"""The embedded JAX sampler: batched, jitted, sharded sampling for Qwen3 and Qwen3.5/3.6.

How a call runs (`JaxEngine.generate`):

1. Prompts are cut into batches of at most `max_rows // n` prompts (the n samples of
   one prompt into batches of `max_rows` when n exceeds it). A batch is
   left-padded to a prompt-length bucket and prefilled once (`Decoder.prefill`);
   each prompt's cache (KV, DeltaNet conv and recurrent state, bookkeeping) is then
   fanned out to its n sample rows by a gather along the batch axes.
2. Rows are decoded in compiled segments of `segment` steps (a `lax.while_loop`
   that also ends once every row is done). Each step samples every row with its
   own key (`sample_chunk` rows at a time, bounding the top-k / top-p temporaries),
   applies the thinking budget and the stops, and runs one model step.
3. Between segments the host collects the new tokens; when the live rows fit a
   smaller row bucket, the finished ones are dropped by a gather, so finished rows
   stop costing work.

Shapes are bucketed (prompt lengths to powers of two from 16, rows to 2^k or
3·2^k, a multiple of the mesh's batch shards), so an RL loop compiles a handful of
programs once. Compiled functions take the weights as an argument:
`update_weights` swaps them without recompiling.

Randomness: row (prompt i, sample j) of a call with seed s draws its t-th token
with `fold_in(fold_in(fold_in(key(s), i), j), t)`. A sample therefore depends only
on (seed, i, j) and the model, not on batching, bucketing, compaction or the
number of devices or hosts.

On several hosts a call is one collective over a global batch: each host passes its
own prompts, builds its block of every per-row array from them, reads back only its
own rows, and every control decision (batches, shapes, another segment, compaction)
is taken from data all hosts share, so all run the same programs in the same order.

Log-probs are those of the sampled token under `softmax(logits / temperature)`,
before top-k / top-p truncation (under `softmax(logits)` when greedy): what the
train step recomputes. Tokens appended by the thinking budget carry 0.0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl import hosts
from jaxrl.rollout.engine import Completion, Engine, SamplingParams, register_engine
from jaxrl.rollout.text import TokenSpec, make_completion, prompt_opens_think
from models import decode
from models import sharding as msh

Array = jax.Array
NO_BUDGET = 2**30  # a thinking budget no completion reaches


def bucket_length(n: int, minimum: int = 16) -> int:
    """The prompt-length bucket of `n`: the next power of two, at least `minimum`."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())


def bucket_rows(n: int, multiple: int = 1) -> int:
    """The row bucket of `n`: the smallest 2^k or 3·2^k >= n, rounded up to a multiple of `multiple`."""
    p = 1
    while p < n and not (p >= 2 and p * 3 // 2 >= n):
        p *= 2
    b = p if p >= n else p * 3 // 2
    return -(-b // multiple) * multiple


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Rows:
    """Decoding state of a batch of sample rows.

    Attributes:
        cache: the model's decoding cache.
        logits: next-token logits `[B, V]`, float32.
        keys: each row's PRNG key data `[B, 2]` (uint32).
        count: tokens emitted so far `[B]`.
        done: the row has stopped (or is padding) `[B]`.
        in_think: the row is inside a think block `[B]`.
        think_count: tokens sampled inside the current think block `[B]`.
        force_pos: index into the forced close-think tokens, -1 when not forcing `[B]`.
    """

    cache: decode.Cache
    logits: Array
    keys: Array
    count: Array
    done: Array
    in_think: Array
    think_count: Array
    force_pos: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class StepConsts:
    """Per-call constants of the step (traced, so new values do not recompile)."""

    stop_ids: Array  # [E] int32, padded with -1
    close_ids: Array  # [C] int32, the forced close-think tokens
    think_open: Array  # [] int32, -1 for none
    think_close: Array  # [] int32
    budget: Array  # [] int32
    limit: Array  # [] int32, max_tokens


def _batch_axes(model: nnx.Module) -> Any:
    """Per cache leaf, the axis that grows with the batch (None for leaves without one)."""
    one, two = jax.eval_shape(lambda: model.init_cache(1, 8)), jax.eval_shape(lambda: model.init_cache(2, 8))

    def axis(a, b):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        return diff[0] if diff else None

    return jax.tree.map(axis, one, two)


def _take(model: nnx.Module, rows: Rows, idx: Array) -> Rows:
    """Rows `idx` of every batch axis (a gather: fan-out and compaction)."""
    cache = jax.tree.map(lambda x, ax: x if ax is None else jnp.take(x, idx, axis=ax), rows.cache,
                         _batch_axes(model))
    rest = {f.name: jnp.take(getattr(rows, f.name), idx, axis=0) for f in dataclasses.fields(Rows) if f.name != "cache"}
    return Rows(cache=cache, **rest)


# The compiled programs are module-level with the model's graph as a static argument, so
# engines over the same architecture (and new weights) share them.


@functools.partial(jax.jit, static_argnames=("graphdef", "max_len"))
def _begin(graphdef: nnx.GraphDef, state: nnx.State, ids: Array, mask: Array, prompt_of_row: Array, keys: Array,
           valid: Array, in_think: Array, budget: Array, *, max_len: int) -> Rows:
    """Prefill the prompts `[P, L]` into a cache of `max_len` slots, then fan them out to their rows."""
    model = nnx.merge(graphdef, state)
    cache = model.init_cache(ids.shape[0], max_len)
    h, cache = model(ids, attention_mask=mask, cache=cache, return_hidden=True)
    logits = model.logits(h[:, -1:])[:, 0].astype(jnp.float32)
    zeros = jnp.zeros((ids.shape[0],), jnp.int32)
    prompts = Rows(cache, logits, jnp.zeros((ids.shape[0], 2), jnp.uint32), zeros, zeros.astype(bool),
                   zeros.astype(bool), zeros, zeros)
    # `count` and `think_count` stay the zeros gathered by the row-sharded `prompt_of_row`: fresh zeros
    # would be replicated, unlike what `_segment` returns, and compile `_segment` a second time.
    rows = _take(model, prompts, prompt_of_row)
    force = jnp.where(in_think & (budget <= 0), 0, -1).astype(jnp.int32)
    return dataclasses.replace(rows, keys=keys, done=~valid, in_think=in_think, force_pos=force)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _compact(graphdef: nnx.GraphDef, state: nnx.State, rows: Rows, idx: Array, valid: Array) -> Rows:
    """Keep rows `idx`; positions where `valid` is False become finished padding."""
    rows = _take(nnx.merge(graphdef, state), rows, idx)
    return dataclasses.replace(rows, done=rows.done | ~valid)


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "sampling", "chunk"), donate_argnames=("rows",))
def _segment(graphdef: nnx.GraphDef, state: nnx.State, rows: Rows, consts: StepConsts, *, steps: int,
             sampling: decode.SamplingParams, chunk: int) -> tuple[Rows, Array, Array, Array, Array]:
    """Up to `steps` decoding steps, sampling `chunk` rows at a time; returns the rows, tokens / log-probs /
    forced flags `[B, steps]`, steps run."""
    b = rows.logits.shape[0]
    out_tok = jnp.zeros((b, steps), jnp.int32)
    out_logp = jnp.zeros((b, steps), jnp.float32)
    out_forced = jnp.zeros((b, steps), bool)
    n_close = consts.close_ids.shape[0]

    def cond(c):
        i, rows, *_ = c
        return (i < steps) & ~jnp.all(rows.done)

    def body(c):
        i, r, out_tok, out_logp, out_forced = c
        keys = jax.vmap(lambda k, t: jax.random.fold_in(jax.random.wrap_key_data(k), t))(r.keys, r.count)
        ids, logp = decode.sample_rows(r.logits, keys, sampling, chunk)
        forcing = r.force_pos >= 0
        if n_close:
            ids = jnp.where(forcing, consts.close_ids[jnp.clip(r.force_pos, 0, n_close - 1)], ids)
        live = ~r.done
        ids = jnp.where(live, ids, 0).astype(jnp.int32)
        logp = jnp.where(live & ~forcing, logp, 0.0)
        out_tok = out_tok.at[:, i].set(ids)
        out_logp = out_logp.at[:, i].set(logp)
        out_forced = out_forced.at[:, i].set(live & forcing)
        count = r.count + live.astype(jnp.int32)

        # The think block: a sampled <think> opens it, a sampled </think> or the end of
        # the forced close ends it; sampled tokens inside count against the budget.
        sampled = live & ~forcing
        opens = sampled & (ids == consts.think_open) & ~r.in_think
        force_pos = jnp.where(forcing, r.force_pos + 1, r.force_pos)
        force_ended = forcing & (force_pos >= n_close)
        force_pos = jnp.where(force_ended, -1, force_pos)
        closes = (sampled & (ids == consts.think_close)) | force_ended
        in_think = (r.in_think | opens) & ~closes
        counted = sampled & r.in_think & ~closes
        think_count = jnp.where(opens, 0, r.think_count + counted.astype(jnp.int32))
        start = live & in_think & (think_count >= consts.budget) & (force_pos < 0) & (n_close > 0)
        force_pos = jnp.where(start, 0, force_pos).astype(jnp.int32)

        stopped = sampled & jnp.isin(ids, consts.stop_ids)
        done = r.done | stopped | (count >= consts.limit)
        model = nnx.merge(graphdef, state)
        h, cache = model(ids[:, None], cache=r.cache, return_hidden=True)
        logits = model.logits(h)[:, 0].astype(jnp.float32)
        r = Rows(cache, logits, r.keys, count, done, in_think, think_count, force_pos)
        return i + 1, r, out_tok, out_logp, out_forced

    i, rows, out_tok, out_logp, out_forced = jax.lax.while_loop(
        cond, body, (jnp.zeros((), jnp.int32), rows, out_tok, out_logp, out_forced))
    return rows, out_tok, out_logp, out_forced, i


def _row_keys(seed: int, prompt_idx: np.ndarray, sample_idx: np.ndarray) -> np.ndarray:
    base = jax.random.key(seed)
    keys = jax.vmap(lambda i, j: jax.random.fold_in(jax.random.fold_in(base, i), j))(
        jnp.asarray(prompt_idx, jnp.uint32), jnp.asarray(sample_idx, jnp.uint32))
    return np.asarray(jax.random.key_data(keys))


def sample_chunk(rows: int, most: int, multiple: int) -> int:
    """Rows drawn at once in a batch of `rows`: the largest divisor of `rows` that is at most `most`
    (at least `multiple`) and a multiple of `multiple`, so that every device draws its share."""
    units = rows // multiple
    best = 1
    for k in range(1, units + 1):
        if units % k == 0 and k * multiple <= most:
            best = k
    return best * multiple


class JaxEngine(Engine):
    """Samples from an NNX Qwen model in process (see the module docstring).

    Args:
        model: a `models` Qwen3 or Qwen3.5 module (from `models.from_pretrained`).
        tokenizer: a `models.tokenizer.QwenTokenizer` for stop ids, the think block and
            decoded text; None gives empty texts and needs `tokens` for anything special.
        mesh: shard the weights and rows over this mesh (the training mesh); None runs
            on the default device.
        rules: logical-axis rules for `mesh`.
        tokens: the special tokens to act on (default: from `tokenizer`, plus the model
            config's eos ids).
        prompt_opens_think: force whether prompts open a think block; None reads it from
            each prompt's tokens (`text.prompt_opens_think`).
        max_rows: most sample rows decoded together (over all hosts); larger requests,
            also the n samples of one prompt, run in batches.
        segment: decoding steps per compiled segment (finished rows are dropped between).
        fan_out: prefill each prompt once and copy its cache to its n rows; False
            prefills every row (for benchmarks and tests).
        sample_chunk: most rows whose next token is drawn at once, bounding top-k / top-p's
            `[rows, vocab]` temporaries.
    """

    def __init__(self, model: nnx.Module, tokenizer: Any = None, *, mesh: Mesh | None = None,
                 rules: Sequence = msh.RULES, tokens: TokenSpec | None = None,
                 prompt_opens_think: bool | None = None, max_rows: int = 256, segment: int = 64,
                 fan_out: bool = True, sample_chunk: int = 64):
        if max_rows < 1 or segment < 1 or sample_chunk < 1:
            raise ValueError("max_rows, segment and sample_chunk must be positive")
        self.tokenizer = tokenizer
        if tokens is None:
            tokens = TokenSpec.from_tokenizer(tokenizer) if tokenizer is not None else TokenSpec()
            eos = model.config.eos_token_id
            extra = () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)
            tokens = dataclasses.replace(tokens, stop_ids=tuple(dict.fromkeys(tokens.stop_ids + extra)))
        self.tokens = tokens
        self.prompt_opens_think = prompt_opens_think
        self.mesh, self.rules = mesh, tuple(rules)
        self.max_rows, self.segment, self.fan_out, self.sample_chunk = max_rows, segment, fan_out, sample_chunk
        self.vocab_size = model.config.vocab_size
        self.graphdef, state = nnx.split(model)
        self.weights_step: int | None = None
        self._shardings = self._row_sharding = None
        # A call is one global batch: every host's rows are one block of it, `_slot` this host's.
        self._hosts, self._slot, self._row_multiple = 1, 0, 1
        if mesh is not None:
            self._shardings = msh.state_shardings(state, mesh, self.rules)
            batch_spec = msh.logical_to_spec(("batch",), self.rules, None, mesh)[0]
            axes = () if batch_spec is None else (batch_spec,) if isinstance(batch_spec, str) else batch_spec
            self._row_multiple = math.prod(mesh.shape[a] for a in axes)
            self._row_sharding = NamedSharding(mesh, PartitionSpec(batch_spec))
            self._hosts = jax.process_count()
            if self._row_multiple % self._hosts:
                raise ValueError(f"the mesh's batch axes ({self._row_multiple} devices) do not split over "
                                 f"{self._hosts} hosts: the jax engine needs each host to hold its own rows")
            start, stop = hosts.row_block(self._row_sharding, self._row_multiple)
            self._slot = start // (stop - start)
        self._host_multiple = self._row_multiple // self._hosts
        self.state = self._place(state)

    # ------------------------------------------------------------------ weights

    def _place(self, state: nnx.State) -> nnx.State:
        return state if self._shardings is None else jax.device_put(state, self._shardings)

    def update_weights(self, model: Any, *, step: int) -> None:
        """Decode with `model`'s weights (an nnx Module or State of the same graph) from now on.

        Weights are cast to the engine's dtypes and placed on its shardings, so the
        compiled programs are reused.
        """
        new = nnx.state(model) if isinstance(model, nnx.Module) else model
        if jax.tree.structure(new) != jax.tree.structure(self.state):
            raise ValueError("update_weights got weights of a different model structure than the engine's")
        new = jax.tree.map(lambda x, old: jnp.asarray(x, old.dtype), new, self.state)
        self.state = self._place(new)
        self.weights_step = step

    # ------------------------------------------------------------------ host loop

    def _consts(self, params: SamplingParams) -> StepConsts:
        t = self.tokens
        stops = tuple(dict.fromkeys(t.stop_ids + tuple(params.stop_token_ids)))
        width = -(-max(len(stops), 1) // 8) * 8  # a few fixed widths, so new stop lists rarely recompile
        budget = NO_BUDGET if params.thinking_budget is None or t.think_open is None else params.thinking_budget
        # numpy, not device arrays: on several hosts every host passes the same values (replicated).
        return StepConsts(stop_ids=np.asarray(stops + (-1,) * (width - len(stops)), np.int32),
                          close_ids=np.asarray(t.close_think, np.int32),
                          think_open=np.asarray(-1 if t.think_open is None else t.think_open, np.int32),
                          think_close=np.asarray(-1 if t.think_close is None else t.think_close, np.int32),
                          budget=np.asarray(budget, np.int32), limit=np.asarray(params.max_tokens, np.int32))

    def _opens(self, prompt: Sequence[int]) -> bool:
        if self.prompt_opens_think is not None:
            return self.prompt_opens_think
        return prompt_opens_think(prompt, self.tokens)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions per prompt (token ids), in prompt order.

        On several hosts (a mesh over their devices) this is a collective: every host
        calls it with its own prompts and the same parameters, the hosts' prompts in
        process order make one global batch sampled with process 0's seed, and each
        host gets its own completions.
        """
        return self._generate(prompts, params, None)

    def generate_each(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                      on_prompt: Callable[[int, list[Completion]], None]) -> list[list[Completion]]:
        """`generate`, calling `on_prompt(i, completions)` between decoding segments as soon as every
        sample of this host's prompt i has stopped (the samples are those `generate` returns)."""
        return self._generate(prompts, params, on_prompt)

    def _generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                  on_prompt: Callable[[int, list[Completion]], None] | None) -> list[list[Completion]]:
        prompts = [list(map(int, p)) for p in prompts]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if min(p) < 0 or max(p) >= self.vocab_size:
                raise ValueError(f"prompt {i} has a token id outside [0, {self.vocab_size})")
        lengths, seed, offset = self._share([len(p) for p in prompts], params)
        width = max(map(len, lengths))  # every host runs `width` prompts: those with fewer pad
        local = prompts + [prompts[0] if prompts else [0]] * (width - len(prompts))
        lengths = [ls + [ls[0] if ls else 1] * (width - len(ls)) for ls in lengths]
        results: list[list[Completion]] = [[] for _ in local]

        def finished(a: int, p: int, group: list[Completion]) -> None:
            """The samples of batch prompt `p` (prompt a + p) of one batch have stopped."""
            results[a + p] += group
            if on_prompt is not None and a + p < len(prompts) and len(results[a + p]) == params.n:
                on_prompt(a + p, results[a + p])

        for a, b, samples in self._batches(width, params.n):
            length = bucket_length(max(max(ls[a:b]) for ls in lengths))
            self._generate_batch(local[a:b], range(offset + a, offset + b), samples, length, params, seed,
                                 functools.partial(finished, a))
        return results[:len(prompts)]

    def _share(self, lengths: list[int], params: SamplingParams) -> tuple[list[list[int]], int, int]:
        """Every host's prompt lengths, the call's seed and this host's first global prompt index."""
        if self._hosts == 1:
            return [lengths], params.seed, 0
        mine = {"lengths": lengths, "params": dataclasses.asdict(dataclasses.replace(params, seed=0)),
                "seed": params.seed}
        every = hosts.gather_json(mine)
        differing = [p for p, h in enumerate(every) if h["params"] != every[0]["params"]]
        if differing:
            raise ValueError(f"hosts 0 and {differing[0]} called generate with different sampling parameters: "
                             f"{every[0]['params']} vs {every[differing[0]]['params']}")
        counts = [len(h["lengths"]) for h in every]
        return [h["lengths"] for h in every], every[0]["seed"], sum(counts[:jax.process_index()])

    def _batches(self, prompts: int, n: int) -> list[tuple[int, int, range]]:
        """(first prompt, end prompt, samples) of each batch of at most `max_rows` rows over all hosts."""
        cap = max(1, self.max_rows // self._hosts)
        if n <= cap:
            k = cap // n
            return [(a, min(a + k, prompts), range(n)) for a in range(0, prompts, k)]
        return [(p, p + 1, range(s, min(s + cap, n))) for p in range(prompts) for s in range(0, n, cap)]

    def _put(self, x: np.ndarray) -> Array:
        """This host's block of rows of a global batch, as a global array."""
        if self._row_sharding is None:
            return jnp.asarray(x)
        return hosts.from_host_rows(np.asarray(x), self._row_sharding)

    def _generate_batch(self, prompts: list[list[int]], index: range, samples: range, length: int,
                        params: SamplingParams, seed: int,
                        finished: Callable[[int, list[Completion]], None]) -> None:
        """Samples `samples` of `prompts` (global prompt indices `index`), left-padded to `length`;
        `finished(p, completions)` as soon as every sample of prompt p has stopped."""
        sampling = decode.SamplingParams(params.temperature, params.top_p, params.top_k)
        consts = self._consts(params)
        opened = [self._opens(p) for p in prompts]
        stops = set(int(x) for x in np.asarray(consts.stop_ids) if x >= 0)
        spec = dataclasses.replace(self.tokens, stop_ids=tuple(stops))
        decode_text = None if self.tokenizer is None else self.tokenizer.decode
        left = {p: len(samples) for p in range(len(prompts))}  # samples of prompt p still decoding
        max_len = length + -(-params.max_tokens // self.segment) * self.segment
        meta = [(p, s) for p in range(len(prompts)) for s in samples]
        n_rows = bucket_rows(len(meta), self._host_multiple)
        meta += [None] * (n_rows - len(meta))

        if self.fan_out:
            batch = bucket_rows(len(prompts), self._host_multiple)
            prefill = [prompts[i] if i < len(prompts) else prompts[0] for i in range(batch)]
            prompt_of_row = [self._slot * batch + (m[0] if m else 0) for m in meta]
        else:
            batch = n_rows
            prefill = [prompts[m[0]] if m else prompts[0] for m in meta]
            prompt_of_row = [self._slot * batch + r for r in range(n_rows)]
        ids = np.zeros((batch, length), np.int32)
        mask = np.zeros((batch, length), np.int32)
        for r, p in enumerate(prefill):
            ids[r, length - len(p):], mask[r, length - len(p):] = p, 1
        keys = _row_keys(seed, np.array([index[m[0] if m else 0] for m in meta]),
                         np.array([m[1] if m else 0 for m in meta]))
        valid = np.array([m is not None for m in meta])
        in_think = np.array([bool(m) and opened[m[0]] for m in meta])

        with self._mesh_context():
            rows = _begin(self.graphdef, self.state, self._put(ids), self._put(mask),
                          self._put(np.asarray(prompt_of_row, np.int32)), self._put(keys), self._put(valid),
                          self._put(in_think), consts.budget, max_len=max_len)
            out: dict[tuple[int, int], tuple[list, list, list]] = {m: ([], [], []) for m in meta if m}
            final: dict[tuple[int, int], Completion] = {}
            counts = np.zeros(n_rows, np.int64)
            while True:
                block = (self._slot * n_rows, (self._slot + 1) * n_rows)
                rows, tok, logp, forced, _ = _segment(self.graphdef, self.state, rows, consts, steps=self.segment,
                                                      sampling=sampling,
                                                      chunk=sample_chunk(n_rows * self._hosts, self.sample_chunk,
                                                                         self._row_multiple))
                new_counts = hosts.host_rows(rows.count, block)
                tok, logp, forced = (hosts.host_rows(x, block) for x in (tok, logp, forced))
                for r, m in enumerate(meta):
                    k = int(new_counts[r] - counts[r])
                    if m and k:
                        for buf, src in zip(out[m], (tok, logp, forced)):
                            buf.extend(src[r, :k].tolist())
                # Whether to go on and how far to compact: decided alike on every host, from every host's rows.
                done = hosts.all_rows(rows.done).reshape(self._hosts, n_rows)
                for r, m in enumerate(meta):
                    if m and done[self._slot, r] and m not in final:
                        final[m] = self._completion(*out.pop(m), opened[m[0]], stops, spec, decode_text)
                        left[m[0]] -= 1
                        if not left[m[0]]:
                            finished(m[0], [final[(m[0], s)] for s in samples])
                most = int((~done).sum(axis=1).max())
                if not most:
                    break
                live = [r for r, m in enumerate(meta) if m and not done[self._slot, r]]
                smaller = bucket_rows(most, self._host_multiple)
                if smaller < n_rows:
                    idx = live + [live[0] if live else 0] * (smaller - len(live))
                    keep = np.arange(smaller) < len(live)
                    rows = _compact(self.graphdef, self.state, rows,
                                    self._put(np.asarray(idx, np.int32) + self._slot * n_rows), self._put(keep))
                    meta = [meta[r] for r in live] + [None] * (smaller - len(live))
                    new_counts = new_counts[idx]
                    n_rows = smaller
                counts = new_counts

    @staticmethod
    def _completion(toks: list[int], lps: list[float], frc: list[bool], opened: bool, stops: set[int],
                    spec: TokenSpec, decode_text: Any) -> Completion:
        """The completion of one stopped row from its collected tokens, log-probs and forced flags."""
        stopped = bool(toks) and toks[-1] in stops and not frc[-1]
        return make_completion(toks, lps, frc, "stop" if stopped else "length", opened, spec, decode_text)

    def _mesh_context(self):
        if self.mesh is None:
            return contextlib.nullcontext()
        return msh.use_mesh(self.mesh, self.rules)


@register_engine("jax")
def make_jax_engine(model: nnx.Module, tokenizer: Any = None, **kwargs: Any) -> JaxEngine:
    """`make_engine("jax", model=..., tokenizer=..., mesh=None, ...)`: see `JaxEngine`."""
    return JaxEngine(model, tokenizer, **kwargs)
