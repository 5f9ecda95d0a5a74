"""The gated delta rule and the causal depthwise conv1d of Gated DeltaNet, in pure JAX.

Gated DeltaNet (Yang, Kautz and Hatamizadeh, 2024) keeps per head a matrix state
S ∈ R^{Dk×Dv} and for every token t writes

    S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,      o_t = S_tᵀ q_t,

with α_t = exp(g_t) ∈ (0, 1] and β_t ∈ (0, 1). `chunked_gated_delta_rule` is the
parallel form for training and prefill, `recurrent_gated_delta_rule` the token-by-
token form, `gated_delta_step` one decoding step. Arrays follow transformers'
layout: q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]`, g, β `[B, T, Hv]`, state
`[B, Hv, Dk, Dv]`; value head h reads key head h // (Hv / Hk). Queries are scaled by
Dk^-1/2 inside, as in transformers and flash-linear-attention; q and k arrive
already L2-normalized (see `l2_normalize`). The math runs in float32.

Packed sequences: an optional `segment_ids` `[B, T]` restarts the state wherever the
id changes, so no information crosses a segment boundary. An `initial_state`
belongs to the segment of the first token.
"""

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(Σ x² + eps) over the last axis, in float32 (flash-linear-attention's form)."""
    x = x.astype(jnp.float32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _heads_first(q, k, v, g, beta):
    """Repeats key heads to the value heads, casts to float32, moves heads before time."""
    groups = v.shape[2] // k.shape[2]
    q, k = (jnp.repeat(x, groups, axis=2) for x in (q, k))
    q = q * q.shape[-1] ** -0.5
    to_bhtd = lambda x: jnp.swapaxes(x.astype(jnp.float32), 1, 2)
    return to_bhtd(q), to_bhtd(k), to_bhtd(v), to_bhtd(g), to_bhtd(beta)


def _zero_state(q: jax.Array, v: jax.Array) -> jax.Array:
    return jnp.zeros((v.shape[0], v.shape[2], q.shape[-1], v.shape[-1]), jnp.float32)


def segment_starts(segment_ids: jax.Array) -> jax.Array:
    """[B, T] bool, True where a token's segment differs from its predecessor's (never at t = 0)."""
    return jnp.pad(segment_ids[:, 1:] != segment_ids[:, :-1], ((0, 0), (1, 0)))


def gated_delta_step(
    q_BxHxK: jax.Array,
    k_BxHxK: jax.Array,
    v_BxHxV: jax.Array,
    g_BxH: jax.Array,
    beta_BxH: jax.Array,
    state_BxHxKxV: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """One token of the rule, with heads already matched and q already scaled.

    S ← α S;  S ← S + k (β (v − Sᵀ k))ᵀ;  o = Sᵀ q   (the delta rule written as a correction).

    Returns:
        (o `[B, H, Dv]`, new state), both float32.
    """
    s = state_BxHxKxV * jnp.exp(g_BxH)[..., None, None]
    predicted = jnp.einsum("bhk,bhkv->bhv", k_BxHxK, s)
    delta = (v_BxHxV - predicted) * beta_BxH[..., None]
    s = s + k_BxHxK[..., :, None] * delta[..., None, :]
    return jnp.einsum("bhk,bhkv->bhv", q_BxHxK, s), s


def recurrent_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Token-by-token gated delta rule (a `lax.scan` of `gated_delta_step`).

    Args:
        q, k: `[B, T, Hk, Dk]`, L2-normalized.
        v: `[B, T, Hv, Dv]`.
        g: log decay `[B, T, Hv]`, ≤ 0.
        beta: write strength `[B, T, Hv]`.
        initial_state: `[B, Hv, Dk, Dv]` or None for zeros.
        segment_ids: `[B, T]` ints for packed sequences, or None.

    Returns:
        (o `[B, T, Hv, Dv]` in q's dtype, final state `[B, Hv, Dk, Dv]` float32).
    """
    out_dtype = q.dtype
    state = _zero_state(q, v) if initial_state is None else initial_state.astype(jnp.float32)
    q, k, v, g, beta = _heads_first(q, k, v, g, beta)
    keep = jnp.ones(q.shape[:1] + q.shape[2:3], jnp.float32)
    if segment_ids is not None:
        keep = 1.0 - segment_starts(segment_ids).astype(jnp.float32)

    def step(s, xs):
        q_t, k_t, v_t, g_t, b_t, keep_t = xs
        o_t, s = gated_delta_step(q_t, k_t, v_t, g_t, b_t, s * keep_t[:, None, None, None])
        return s, o_t

    time_major = lambda x: jnp.moveaxis(x, 2, 0)
    xs = tuple(time_major(x) for x in (q, k, v, g, beta)) + (jnp.swapaxes(keep, 0, 1),)
    state, o_TxBxHxV = jax.lax.scan(step, state, xs)
    return jnp.moveaxis(o_TxBxHxV, 0, 1).astype(out_dtype), state


def unit_lower_inverse(strict_NxN: jax.Array) -> jax.Array:
    """(I + L)⁻¹ for strictly lower triangular L `[..., N, N]`, N a power of two, by block doubling.

    With the inverses A⁻¹, B⁻¹ of the two diagonal halves known,
    [[A, 0], [C, B]]⁻¹ = [[A⁻¹, 0], [−B⁻¹ C A⁻¹, B⁻¹]]; starting from 1×1 blocks, log₂ N
    rounds of batched matmuls (no sequential triangular solve).
    """
    n = strict_NxN.shape[-1]
    if n & (n - 1):
        raise ValueError(f"chunk size {n} is not a power of two")
    batch = strict_NxN.shape[:-2]
    inv = jnp.ones(batch + (n, 1, 1), strict_NxN.dtype)  # [..., blocks, size, size]
    size = 1
    while size < n:
        blocks = strict_NxN.reshape(batch + (n // (2 * size), 2 * size, n // (2 * size), 2 * size))
        diagonal = jnp.moveaxis(jnp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)
        a_inv, b_inv = inv[..., 0::2, :, :], inv[..., 1::2, :, :]
        corner = -jnp.matmul(b_inv, jnp.matmul(diagonal[..., size:, :size], a_inv))
        inv = jnp.concatenate([jnp.concatenate([a_inv, jnp.zeros_like(a_inv)], -1),
                               jnp.concatenate([corner, b_inv], -1)], -2)
        size *= 2
    return inv[..., 0, :, :]


def chunked_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    chunk_size: int = 64,
) -> tuple[jax.Array, jax.Array]:
    """Chunk-parallel gated delta rule (the WY/UT form of DeltaNet), same contract as the recurrent one.

    Within a chunk of C tokens, with γ_i = Π_{s≤i} α_s and Γ_ij = γ_i / γ_j (i ≥ j):

        T  = (I + strict_tril(diag(β) K Kᵀ ∘ Γ))⁻¹,   U = T diag(β) V,   W = T diag(β γ) K,
        V' = U − W S,   O = (Q ∘ γ) S + tril(Q Kᵀ ∘ Γ) V',   S ← γ_C S + (K ∘ γ_C / γ)ᵀ V'.

    Only the last line is sequential (a `lax.scan` over chunks); the rest is matmuls.
    Segment boundaries zero Γ across segments and cut the state read and carry.
    `chunk_size` must be a power of two (see `unit_lower_inverse`).
    """
    out_dtype = q.dtype
    batch, length = q.shape[:2]
    state = _zero_state(q, v) if initial_state is None else initial_state.astype(jnp.float32)
    q, k, v, g, beta = _heads_first(q, k, v, g, beta)
    if segment_ids is None:
        segment_ids = jnp.zeros((batch, length), jnp.int32)

    pad = -length % chunk_size
    pad_time = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 3))
    q, k, v, g, beta = (pad_time(x) for x in (q, k, v, g, beta))
    seg = jnp.pad(segment_ids, ((0, 0), (0, pad)), mode="edge")
    n = (length + pad) // chunk_size
    chunks = lambda x: x.reshape(x.shape[:2] + (n, chunk_size) + x.shape[3:])
    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))  # [B, H, N, C, ...]

    seg_BxNxC = seg.reshape(batch, n, chunk_size)
    seg_in = jnp.concatenate([seg[:, :1], seg[:, chunk_size - 1 : -1 : chunk_size]], axis=1)  # [B, N]
    same_NxCxC = (seg_BxNxC[..., :, None] == seg_BxNxC[..., None, :])[:, None]
    reads_state = (seg_BxNxC == seg_in[..., None])[:, None].astype(jnp.float32)  # [B, 1, N, C]
    reaches_end = (seg_BxNxC == seg_BxNxC[..., -1:])[:, None].astype(jnp.float32)

    log_gamma = jnp.cumsum(g, axis=-1)
    causal = jnp.tril(jnp.ones((chunk_size, chunk_size), bool))
    log_ratio = log_gamma[..., :, None] - log_gamma[..., None, :]
    big_gamma = jnp.exp(jnp.where(causal & same_NxCxC, log_ratio, -jnp.inf))

    k_beta = k * beta[..., None]
    strict = jnp.tril(jnp.einsum("bhncd,bhnsd->bhncs", k_beta, k) * big_gamma, -1)
    t_inv = unit_lower_inverse(strict)
    gamma = jnp.exp(log_gamma)
    u = jnp.einsum("bhncs,bhnsv->bhncv", t_inv, v * beta[..., None])
    w = jnp.einsum("bhncs,bhnsk->bhnck", t_inv, k_beta * (gamma * reads_state)[..., None])
    intra = jnp.einsum("bhncd,bhnsd->bhncs", q, k) * big_gamma
    q_read = q * (gamma * reads_state)[..., None]
    k_write = k * (jnp.exp(log_gamma[..., -1:] - log_gamma) * reaches_end)[..., None]
    carry = gamma[..., -1] * reads_state[..., -1]  # [B, H, N]

    def chunk_step(s, xs):
        u_c, w_c, intra_c, q_c, k_c, carry_c = xs
        v_new = u_c - jnp.einsum("bhck,bhkv->bhcv", w_c, s)
        o_c = jnp.einsum("bhck,bhkv->bhcv", q_c, s) + jnp.einsum("bhcs,bhsv->bhcv", intra_c, v_new)
        s = s * carry_c[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", k_c, v_new)
        return s, o_c

    chunk_major = lambda x: jnp.moveaxis(x, 2, 0)
    xs = tuple(chunk_major(x) for x in (u, w, intra, q_read, k_write, carry))
    state, o_NxBxHxCxV = jax.lax.scan(chunk_step, state, xs)
    o = jnp.moveaxis(o_NxBxHxCxV, 0, 2).reshape(v.shape[:2] + (n * chunk_size, -1))[:, :, :length]
    return jnp.swapaxes(o, 1, 2).astype(out_dtype), state


def causal_conv1d(
    x_BxTxC: jax.Array,
    weight_KxC: jax.Array,
    state_BxKm1xC: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Causal depthwise conv over time: y_t = Σ_j w_{K−1−j} x_{t−j}, without activation.

    Args:
        x_BxTxC: inputs.
        weight_KxC: per-channel taps, oldest first (HF's conv1d.weight[:, 0, :] transposed).
        state_BxKm1xC: the K−1 inputs before x (zeros when None), part of x's first segment.
        segment_ids: `[B, T]`; taps never reach into another segment.

    Returns:
        (y `[B, T, C]` in x's dtype, new state: the last K−1 inputs, zeroed where they
        are not in the last token's segment).
    """
    taps, batch, length = weight_KxC.shape[0], x_BxTxC.shape[0], x_BxTxC.shape[1]
    if state_BxKm1xC is None:
        state_BxKm1xC = jnp.zeros((batch, taps - 1, x_BxTxC.shape[-1]), x_BxTxC.dtype)
    full = jnp.concatenate([state_BxKm1xC.astype(x_BxTxC.dtype), x_BxTxC], axis=1)
    if segment_ids is None:
        segment_ids = jnp.zeros((batch, length), jnp.int32)
    seg_full = jnp.concatenate([jnp.repeat(segment_ids[:, :1], taps - 1, axis=1), segment_ids], axis=1)
    w = weight_KxC.astype(jnp.float32)
    y = jnp.zeros(x_BxTxC.shape, jnp.float32)
    for tap in range(taps):
        window = jax.lax.dynamic_slice_in_dim(full, tap, length, axis=1).astype(jnp.float32)
        same = jax.lax.dynamic_slice_in_dim(seg_full, tap, length, axis=1) == segment_ids
        y = y + jnp.where(same[..., None], window, 0.0) * w[tap]
    tail_same = seg_full[:, length:] == segment_ids[:, -1:]
    new_state = jnp.where(tail_same[..., None], full[:, length:], 0)
    return y.astype(x_BxTxC.dtype), new_state


def causal_conv1d_step(
    x_BxC: jax.Array, weight_KxC: jax.Array, state_BxKm1xC: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """One decoding step of `causal_conv1d`: (y `[B, C]`, the shifted state)."""
    full = jnp.concatenate([state_BxKm1xC.astype(x_BxC.dtype), x_BxC[:, None]], axis=1)
    y = jnp.einsum("bkc,kc->bc", full.astype(jnp.float32), weight_KxC.astype(jnp.float32))
    return y.astype(x_BxC.dtype), full[:, 1:]
