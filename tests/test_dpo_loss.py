"""The DPO sigmoid loss and the masked SFT loss, and their gradients, against a NumPy float64 re-derivation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl.losses import logprobs_from_logits
from jaxrl.sft_losses import dpo_loss, response_mask, sequence_logprobs, sft_loss

B, T, V = 4, 7, 11
BETA = 0.1
TOL = 1e-5


def _np_logsoftmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _np_token_logp(logits, tokens):
    """log π(x_t | x_<t) from logits at t − 1; 0 at position 0 (jaxrl.losses' convention)."""
    logp_all = _np_logsoftmax(logits)
    out = np.zeros(tokens.shape)
    for b in range(tokens.shape[0]):
        for t in range(1, tokens.shape[1]):
            out[b, t] = logp_all[b, t - 1, tokens[b, t]]
    return out, np.exp(logp_all)


def _np_dlogp_dlogits(probs, tokens, weight_BxT):
    """Σ_t w[b, t] · ∂ log π(x_t)/∂ z_{t−1} = w · (onehot(x_t) − p_{t−1}), placed at position t − 1."""
    grad = np.zeros(probs.shape)
    for b in range(tokens.shape[0]):
        for t in range(1, tokens.shape[1]):
            onehot = np.eye(probs.shape[-1])[tokens[b, t]]
            grad[b, t - 1] += weight_BxT[b, t] * (onehot - probs[b, t - 1])
    return grad


def _np_log_sigmoid(z):
    return -np.logaddexp(0.0, -z)


def _data(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(2, B, T, V)) * 2.0  # chosen, rejected
    tokens = rng.integers(0, V, size=(2, B, T))
    prompt_len = rng.integers(1, 3, size=(2, B))
    length = rng.integers(4, T + 1, size=(2, B))
    ref = rng.normal(size=(2, B)) * 3.0 - 10.0
    return logits, tokens, prompt_len, length, ref


def _np_mask(prompt_len, length):
    t = np.arange(T)[None, :]
    return ((t >= prompt_len[:, None]) & (t < length[:, None])).astype(np.float64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dpo_loss_and_gradient_match_numpy_float64(seed):
    logits, tokens, prompt_len, length, ref = _data(seed)
    masks = np.stack([_np_mask(prompt_len[i], length[i]) for i in range(2)])

    # NumPy float64: sequence log-probs, z, L = −mean log σ(z), ∂L/∂logits by hand.
    logps, probs = zip(*(_np_token_logp(logits[i], tokens[i]) for i in range(2)))
    seq = [(logps[i] * masks[i]).sum(-1) for i in range(2)]
    z = BETA * ((seq[0] - ref[0]) - (seq[1] - ref[1]))
    want_loss = -_np_log_sigmoid(z).mean()
    dl_dz = -(1.0 - 1.0 / (1.0 + np.exp(-z))) / B  # d/dz −log σ(z) = −σ(−z)
    sign = (1.0, -1.0)
    want_grad = np.stack([_np_dlogp_dlogits(probs[i], tokens[i], (sign[i] * BETA * dl_dz)[:, None] * masks[i])
                          for i in range(2)])

    def loss_fn(logits_2xBxTxV):
        seqs = []
        for i in range(2):
            logp, _ = logprobs_from_logits(logits_2xBxTxV[i], jnp.asarray(tokens[i]))
            seqs.append(sequence_logprobs(logp, response_mask(jnp.asarray(prompt_len[i]), jnp.asarray(length[i]), T)))
        return dpo_loss(seqs[0], seqs[1], jnp.asarray(ref[0]), jnp.asarray(ref[1]), BETA)

    (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(jnp.asarray(logits, jnp.float32))
    np.testing.assert_allclose(float(loss), want_loss, atol=TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(grad), want_grad, atol=TOL, rtol=0)
    np.testing.assert_allclose(float(metrics["margin"]), (z / BETA).mean(), atol=1e-4, rtol=0)
    assert float(metrics["accuracy"]) == pytest.approx((z > 0).mean())
    np.testing.assert_allclose(float(metrics["reward_chosen"]), (BETA * (seq[0] - ref[0])).mean(), atol=1e-4)


def test_dpo_loss_is_log_two_when_the_policy_is_the_reference():
    seq = jnp.asarray([-3.0, -8.0, -1.5])
    rejected = jnp.asarray([-4.0, -2.0, -9.0])
    loss, metrics = dpo_loss(seq, rejected, seq, rejected, BETA)
    assert float(loss) == pytest.approx(np.log(2.0), abs=1e-6)
    assert float(metrics["margin"]) == 0.0 and float(metrics["accuracy"]) == 0.0


def test_dpo_loss_is_stable_for_large_margins():
    loss, _ = dpo_loss(jnp.asarray([0.0, -1e4]), jnp.asarray([-1e4, 0.0]), jnp.zeros(2), jnp.zeros(2), BETA)
    # One pair at z = +1000 (loss ~0), one at z = −1000 (loss 1000): mean 500, finite.
    assert float(loss) == pytest.approx(500.0, rel=1e-6)


def test_micro_batches_sum_to_the_full_batch_loss():
    rng = np.random.default_rng(3)
    pc, pr, rc, rr = (jnp.asarray(rng.normal(size=6)) for _ in range(4))
    full, _ = dpo_loss(pc, pr, rc, rr, BETA)
    halves = sum(dpo_loss(pc[s], pr[s], rc[s], rr[s], BETA, num_pairs=6)[0] for s in (slice(0, 3), slice(3, 6)))
    assert float(halves) == pytest.approx(float(full), abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_sft_loss_counts_response_tokens_only(seed):
    logits, tokens, prompt_len, length, _ = _data(seed)
    logits, tokens, prompt_len, length = logits[0], tokens[0], prompt_len[0], length[0]
    mask = _np_mask(prompt_len, length)
    logp, probs = _np_token_logp(logits, tokens)
    n = mask.sum()
    want_loss = -(logp * mask).sum() / n
    want_grad = _np_dlogp_dlogits(probs, tokens, -mask / n)

    def loss_fn(z):
        lp, _ = logprobs_from_logits(z, jnp.asarray(tokens))
        return sft_loss(lp, response_mask(jnp.asarray(prompt_len), jnp.asarray(length), T))

    loss, grad = jax.value_and_grad(loss_fn)(jnp.asarray(logits, jnp.float32))
    np.testing.assert_allclose(float(loss), want_loss, atol=TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(grad), want_grad, atol=TOL, rtol=0)
    # The prompt's logits (those predicting prompt tokens) and the padding's get no gradient.
    for b in range(B):
        assert not np.asarray(grad)[b, : prompt_len[b] - 1].any()
        assert not np.asarray(grad)[b, length[b] - 1:].any()


def test_response_mask_and_empty_batch():
    mask = response_mask(jnp.asarray([1, 3]), jnp.asarray([4, 3]), 5)
    assert mask.tolist() == [[0, 1, 1, 1, 0], [0, 0, 0, 0, 0]]
    assert float(sft_loss(jnp.zeros((2, 5)), jnp.zeros((2, 5)))) == 0.0
