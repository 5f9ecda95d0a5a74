"""Policy-gradient losses: chunked token log-probs, the clipped surrogate, KL, aggregation.

Conventions. Every per-token array is aligned with the token ids `tokens_BxT`:
`logp_BxT[b, t]` is log π(tokens[b, t] | tokens[b, :t]), and position 0, which no
position predicts, holds 0. `mask_BxT` is 1 on completion tokens (the ones the
policy wrote) and 0 on prompt and padding tokens, so `mask_BxT[:, 0]` is always 0.

Aggregation is expressed as weights: `loss_weights` turns a mask into `w_BxT` with
`loss = Σ_{b,t} w[b, t] · ℓ[b, t]`. Computing the weights once on the full batch and
summing over micro-batches gives exactly the full-batch loss and gradient.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from jaxrl.config import AGG_MODES

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KlEstimator = Literal["k1", "k3"]

# |log π − log π_old| beyond this is clamped before exp (verl clamps at 20 too).
MAX_LOG_RATIO = 20.0


def logprobs_from_logits(
    logits_BxTxV: jax.Array, tokens_BxT: jax.Array, temperature: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    """Token log-probs and entropies from full logits (the unchunked reference).

    log π(x_t | x_<t) = z_{t−1}[x_t] / τ − logsumexp(z_{t−1} / τ);  H_t = −Σ_v p_v log p_v.

    Returns:
        (logp_BxT, entropy_BxT), both 0 at position 0.
    """
    z_BxTxV = logits_BxTxV.astype(jnp.float32) / temperature
    logp_all_BxTxV = jax.nn.log_softmax(z_BxTxV, axis=-1)
    targets_BxT = jnp.roll(tokens_BxT, -1, axis=1)
    logp_BxT = jnp.take_along_axis(logp_all_BxTxV, targets_BxT[..., None], axis=-1)[..., 0]
    entropy_BxT = -(jnp.exp(logp_all_BxTxV) * logp_all_BxTxV).sum(-1)
    return _shift_right(logp_BxT), _shift_right(entropy_BxT)


def chunked_logprobs(
    hidden_BxTxH: jax.Array,
    lm_head_VxH: jax.Array,
    tokens_BxT: jax.Array,
    chunk_size: int = 512,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Token log-probs and entropies from final hidden states, a chunk of positions at a time.

    Same equation as `logprobs_from_logits` with z_t = W h_t, W of shape [V, H] (HF's
    `lm_head.weight`, or the tied embedding). Logits exist for only
    `chunk_size` positions at once (a scan whose body is rematerialized in the backward
    pass), so memory is O(B · chunk_size · V), not O(B · T · V): the point for a
    248k-token vocabulary. The entropy carries no gradient (it is a metric).

    Returns:
        (logp_BxT, entropy_BxT), both 0 at position 0.
    """
    b, t, h = hidden_BxTxH.shape
    chunk_size = min(chunk_size, t)  # never pad a short sequence up to a long chunk
    n_chunks = -(-t // chunk_size)
    pad = n_chunks * chunk_size - t
    targets_BxT = jnp.roll(tokens_BxT, -1, axis=1)
    hidden_BxTxH = jnp.pad(hidden_BxTxH, ((0, 0), (0, pad), (0, 0)))
    targets_BxT = jnp.pad(targets_BxT, ((0, 0), (0, pad)))
    hidden_NxBxCxH = hidden_BxTxH.reshape(b, n_chunks, chunk_size, h).swapaxes(0, 1)
    targets_NxBxC = targets_BxT.reshape(b, n_chunks, chunk_size).swapaxes(0, 1)

    @jax.checkpoint
    def chunk(h_BxCxH, tgt_BxC):
        z_BxCxV = jnp.einsum("bch,vh->bcv", h_BxCxH, lm_head_VxH,
                             preferred_element_type=jnp.float32) / temperature
        lse_BxC = jax.nn.logsumexp(z_BxCxV, axis=-1)
        logp_BxC = jnp.take_along_axis(z_BxCxV, tgt_BxC[..., None], axis=-1)[..., 0] - lse_BxC
        z_BxCxV = jax.lax.stop_gradient(z_BxCxV)
        lse_BxC = jax.lax.stop_gradient(lse_BxC)
        entropy_BxC = lse_BxC - (jax.nn.softmax(z_BxCxV, axis=-1) * z_BxCxV).sum(-1)
        return logp_BxC, entropy_BxC

    _, (logp_NxBxC, entropy_NxBxC) = jax.lax.scan(
        lambda carry, xs: (carry, chunk(*xs)), None, (hidden_NxBxCxH, targets_NxBxC))
    logp_BxT = logp_NxBxC.swapaxes(0, 1).reshape(b, -1)[:, :t]
    entropy_BxT = entropy_NxBxC.swapaxes(0, 1).reshape(b, -1)[:, :t]
    return _shift_right(logp_BxT), _shift_right(entropy_BxT)


def _shift_right(x_BxT: jax.Array) -> jax.Array:
    """Move predictions of position t + 1 (made at t) to position t + 1; 0 at position 0."""
    return jnp.pad(x_BxT[:, :-1], ((0, 0), (1, 0)))


def ppo_clip_loss(
    logp_BxT: jax.Array,
    old_logp_BxT: jax.Array,
    adv_BxT: jax.Array,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """PPO clipped surrogate per token, with clip-higher and optional dual clip.

    ρ = exp(clip(log π − log π_old, −20, 20)) (the clamp, as in verl, keeps one stale token
    from overflowing to inf and turning the whole gradient into NaN);
    ℓ = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A);
    dual clip (c > 1, Ye et al. 2020): where A < 0, ℓ = min(ℓ, −c·A).

    Returns:
        (loss_BxT, clipped_BxT) where `clipped_BxT` is 1 where a clip is active.
    """
    ratio_BxT = jnp.exp(jnp.clip(logp_BxT - old_logp_BxT, -MAX_LOG_RATIO, MAX_LOG_RATIO))
    unclipped_BxT = -adv_BxT * ratio_BxT
    clipped_ratio_BxT = jnp.clip(ratio_BxT, 1.0 - clip_low, 1.0 + clip_high)
    loss_BxT = jnp.maximum(unclipped_BxT, -adv_BxT * clipped_ratio_BxT)
    clipped_BxT = loss_BxT > unclipped_BxT
    if dual_clip is not None:
        dual_BxT = (adv_BxT < 0) & (loss_BxT > -dual_clip * adv_BxT)
        loss_BxT = jnp.where(dual_BxT, -dual_clip * adv_BxT, loss_BxT)
        clipped_BxT = clipped_BxT | dual_BxT
    return loss_BxT, clipped_BxT.astype(loss_BxT.dtype)


def kl_penalty(logp_BxT: jax.Array, ref_logp_BxT: jax.Array, estimator: KlEstimator = "k3") -> jax.Array:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π (Schulman's k1 and k3).

    k1 = log π − log π_ref;  k3 = π_ref/π − log(π_ref/π) − 1 (non-negative, low variance).
    """
    log_ratio_BxT = jnp.clip(ref_logp_BxT - logp_BxT, -MAX_LOG_RATIO, MAX_LOG_RATIO)
    if estimator == "k1":
        return -log_ratio_BxT
    if estimator == "k3":
        return jnp.exp(log_ratio_BxT) - log_ratio_BxT - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1 or k3")


def loss_weights(
    mask_BxT: jax.Array,
    mode: AggMode = "token-mean",
    segment_ids_BxT: jax.Array | None = None,
    norm_constant: float | None = None,
) -> jax.Array:
    """Weights w with `Σ w·ℓ` the aggregated loss; a sequence is a (row, segment) pair.

    token-mean:               Σ_{i,t} m ℓ / Σ_{i,t} m
    seq-mean-token-sum:       (1/S) Σ_i Σ_t m ℓ
    seq-mean-token-mean:      (1/S) Σ_i (Σ_t m ℓ / Σ_t m)
    seq-mean-token-sum-norm:  Σ_{i,t} m ℓ / (S · L), Dr.GRPO's constant normalizer L
                              (`norm_constant`, default the padded length T)
    S counts sequences with at least one masked token. With `segment_ids_BxT`, packed
    rows give the same weights as one sequence per row.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose from {AGG_MODES}")
    m_BxT = mask_BxT.astype(jnp.float32)
    if mode == "token-mean":
        return m_BxT / jnp.maximum(m_BxT.sum(), 1.0)
    b, t = m_BxT.shape
    if segment_ids_BxT is None:
        segment_ids_BxT = jnp.zeros((b, t), jnp.int32)
    seq_BxT = jnp.arange(b)[:, None] * t + segment_ids_BxT
    counts_S = jax.ops.segment_sum(m_BxT.reshape(-1), seq_BxT.reshape(-1), num_segments=b * t)
    n_seqs = jnp.maximum((counts_S > 0).sum(), 1).astype(jnp.float32)
    if mode == "seq-mean-token-sum":
        return m_BxT / n_seqs
    if mode == "seq-mean-token-mean":
        return m_BxT / (jnp.maximum(counts_S[seq_BxT], 1.0) * n_seqs)
    return m_BxT / (n_seqs * (t if norm_constant is None else norm_constant))


def masked_mean(x_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """Mean of x over the masked tokens (0 when none are masked)."""
    m_BxT = mask_BxT.astype(x_BxT.dtype)
    return (x_BxT * m_BxT).sum() / jnp.maximum(m_BxT.sum(), 1.0)
