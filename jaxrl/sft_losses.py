"""Supervised losses of the baselines: masked token-level SFT and the DPO sigmoid loss.

Same conventions as `jaxrl.losses`: `logp_BxT[b, t]` is log π(tokens[b, t] | tokens[b, :t])
(0 at position 0) and `mask_BxT` is 1 on the assistant's tokens only (the response the
model learns to write), 0 on the prompt and on padding. Both losses take an explicit
normalizer so that summing them over micro-batches gives exactly the full-batch loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def response_mask(prompt_len_B: jax.Array, length_B: jax.Array, seq_len: int) -> jax.Array:
    """1 on positions prompt_len ≤ t < length (the response), 0 on the prompt and the padding after it."""
    t_1xT = jnp.arange(seq_len)[None, :]
    return ((t_1xT >= prompt_len_B[:, None]) & (t_1xT < length_B[:, None])).astype(jnp.float32)


def sequence_logprobs(logp_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """log π(y | x) = Σ_t m_t · log π(y_t | x, y_<t), one per sequence."""
    return (logp_BxT * mask_BxT).sum(axis=-1)


def sft_loss(logp_BxT: jax.Array, mask_BxT: jax.Array, num_tokens: jax.Array | float | None = None) -> jax.Array:
    """Token-level negative log-likelihood on the response tokens.

    L = −(1/N) Σ_{b,t} m_{b,t} · log π(y_{b,t} | ·),  N = Σ m over the full batch
    (`num_tokens`; default: this batch's Σ m, at least 1).
    """
    n = jnp.maximum(mask_BxT.sum(), 1.0) if num_tokens is None else num_tokens
    return -(logp_BxT * mask_BxT).sum() / n


def dpo_loss(policy_chosen_B: jax.Array, policy_rejected_B: jax.Array, ref_chosen_B: jax.Array,
             ref_rejected_B: jax.Array, beta: float, num_pairs: jax.Array | float | None = None
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The DPO sigmoid loss (Rafailov et al., 2023, eq. 7) over sequence log-probs.

    z = β [(log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))],
    L = −(1/P) Σ log σ(z), P pairs in the full batch (`num_pairs`; default: this batch's).

    Returns:
        (loss, metrics): the mean margin z / β, the implicit rewards β(log π − log π_ref)
        of chosen and rejected, and the share of pairs with z > 0, each summed / P.
    """
    p = policy_chosen_B.shape[0] if num_pairs is None else num_pairs
    chosen_B = beta * (policy_chosen_B - ref_chosen_B)
    rejected_B = beta * (policy_rejected_B - ref_rejected_B)
    z_B = chosen_B - rejected_B
    loss = -jax.nn.log_sigmoid(z_B).sum() / p
    metrics = {"reward_chosen": chosen_B.sum() / p, "reward_rejected": rejected_B.sum() / p,
               "margin": (z_B / beta).sum() / p, "accuracy": (z_B > 0).astype(jnp.float32).sum() / p}
    return loss, metrics
