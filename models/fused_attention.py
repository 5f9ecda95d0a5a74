"""Fused self-attention kernels that never materialize the `[B, N, T, S]` scores.

The plain path (`layers.attend`) holds float32 scores for every query and key;
at the paper's 6,144-token rollouts that is most of a step's memory. The
kernels here compute the same causal, segment-masked, grouped-query softmax
attention block by block:

- `splash`: Pallas splash attention (TPU). A Mosaic kernel cannot be
  partitioned by XLA, so under an active mesh the call is wrapped in
  `shard_map` (batch over the batch axes, heads over the head axes) and each
  device runs the kernel on its own shard. `interpret=True` runs the same
  kernel in Pallas' interpreter (any backend; how the CPU tests check it).
- `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")` (NVIDIA GPUs);
  the segment mask goes in as a boolean `[B, 1, T, S]` array, not float scores.

Both take the self-attention of one block (no KV cache): queries and keys are
the same tokens, `segment_ids [B, T]` say which packed sequence each token
belongs to (0 = padding, which no real token sees). Outputs at padding
positions are unspecified; callers mask them out, as the losses do.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models import sharding as msh

Array = jax.Array

IMPLS = ("xla", "splash", "cudnn")
SPLASH_BLOCK = 128  # the kernel's tile: sequences are padded to a multiple of it


def check_impl(impl: str) -> str:
    """`impl` if it names an attention implementation, else a ValueError listing them."""
    if impl not in IMPLS:
        raise ValueError(f"attention_impl {impl!r} is not one of {IMPLS}")
    return impl


@functools.lru_cache(maxsize=32)
def _splash_kernel(heads: int, seq: int, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    mask = sa.MultiHeadMask([sa.CausalMask((seq, seq)) for _ in range(heads)])
    block = min(SPLASH_BLOCK, seq)
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    return sa.make_splash_mha_single_device(mask, block_sizes=sizes, interpret=interpret)


def splash_attention(q: Array, k: Array, v: Array, segment_ids: Array, scale: float, *,
                     interpret: bool = False) -> Array:
    """Causal GQA self-attention with Pallas splash attention.

    Args:
      q: `[B, T, N, H]`; k, v: `[B, K, T, H]` (the layout of `layers.attend`),
        N a multiple of K, query head n using kv head n // (N/K).
      segment_ids: `[B, T]`, 0 = padding.
      scale: multiplies the scores (applied to q before the kernel).
      interpret: run the kernel in Pallas' interpreter instead of Mosaic.

    Returns:
      `[B, T, N, H]` in q's dtype.
    """
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, t, n, h = q.shape
    pad = (-t) % SPLASH_BLOCK
    qh = (q * jnp.asarray(scale, q.dtype)).transpose(0, 2, 1, 3)  # [B, N, T, H]
    k, v = k.astype(q.dtype), v.astype(q.dtype)
    seg = segment_ids.astype(jnp.int32)
    if pad:  # padded slots form segment 0 with the real padding: no real token sees them
        qh = jnp.pad(qh, ((0, 0), (0, 0), (0, pad), (0, 0)))
        k, v = (jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (k, v))
        seg = jnp.pad(seg, ((0, 0), (0, pad)))

    def local(qh, k, v, seg):
        kernel = _splash_kernel(qh.shape[1], qh.shape[2], interpret)
        return jax.vmap(lambda q1, k1, v1, s1: kernel(q1, k1, v1, segment_ids=sa.SegmentIds(s1, s1)))(qh, k, v, seg)

    mesh = msh.current_mesh()
    if mesh is None:
        out = local(qh, k, v, seg)
    else:
        # Heads split as the kv heads allow (an axis that divides K divides N = K·G too), so
        # each shard's q heads use exactly its own kv heads; batch over the batch axes.
        spec = msh.logical_to_spec(("batch", "act_kv_heads", None, None), msh.current_rules(), k.shape, mesh)
        seg_spec = jax.sharding.PartitionSpec(spec[0], None)
        out = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, seg_spec), out_specs=spec,
                            check_vma=False)(qh, k, v, seg)
    return out[:, :, :t].transpose(0, 2, 1, 3)


def cudnn_attention(q: Array, k: Array, v: Array, segment_ids: Array, scale: float, *,
                    implementation: str = "cudnn") -> Array:
    """Causal GQA self-attention with `jax.nn.dot_product_attention`.

    Same arguments as `splash_attention`. `implementation="xla"` runs the same call
    through XLA on any backend (how the CPU tests check the mask and layout).
    """
    seg = segment_ids.astype(jnp.int32)
    allowed = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
    out = jax.nn.dot_product_attention(
        q, k.swapaxes(1, 2).astype(q.dtype), v.swapaxes(1, 2).astype(q.dtype), mask=allowed[:, None],
        scale=scale, is_causal=True, implementation=implementation)
    return out.astype(q.dtype)


def fused_attention(impl: str, q: Array, k: Array, v: Array, segment_ids: Array, scale: float) -> Array:
    """Dispatch to the kernel named by `impl` ("splash" or "cudnn")."""
    if impl == "splash":
        return splash_attention(q, k, v, segment_ids, scale)
    if impl == "cudnn":
        return cudnn_attention(q, k, v, segment_ids, scale)
    raise ValueError(f"no fused kernel for attention_impl {impl!r}")


def scores_bytes(batch: int, heads: int, q_len: int, kv_len: int) -> int:
    """Bytes of the float32 scores the plain path materializes (for planning)."""
    return int(np.prod([batch, heads, q_len, kv_len], dtype=np.int64)) * 4
