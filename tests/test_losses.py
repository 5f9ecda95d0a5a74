"""Losses against NumPy re-derivations: chunked log-probs, clipped surrogate, KL, aggregation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl import losses as L


def _np_logprobs(hidden, w, tokens, temperature=1.0):
    z = (hidden.astype(np.float64) @ w.astype(np.float64).T) / temperature
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    b, t = tokens.shape
    logp = np.zeros((b, t))
    ent = np.zeros((b, t))
    for i in range(b):
        for j in range(1, t):
            logp[i, j] = logp_all[i, j - 1, tokens[i, j]]
            p = np.exp(logp_all[i, j - 1])
            ent[i, j] = -(p * logp_all[i, j - 1]).sum()
    return logp, ent


def _inputs(seed=0, b=2, t=11, h=8, v=37):
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(b, t, h)).astype(np.float32)
    w = rng.normal(size=(v, h)).astype(np.float32)
    tokens = rng.integers(0, v, size=(b, t))
    return hidden, w, tokens


@pytest.mark.parametrize("chunk", [1, 4, 11, 16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_match_numpy(chunk, temperature):
    hidden, w, tokens = _inputs()
    logp, ent = L.chunked_logprobs(jnp.asarray(hidden), jnp.asarray(w), jnp.asarray(tokens),
                                   chunk_size=chunk, temperature=temperature)
    want_logp, want_ent = _np_logprobs(hidden, w, tokens, temperature)
    np.testing.assert_allclose(logp, want_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, want_ent, rtol=1e-5, atol=1e-5)
    ref_logp, ref_ent = L.logprobs_from_logits(jnp.asarray(hidden @ w.T), jnp.asarray(tokens), temperature)
    np.testing.assert_allclose(ref_logp, want_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref_ent, want_ent, rtol=1e-5, atol=1e-5)


def test_chunked_logprobs_gradient_matches_unchunked():
    hidden, w, tokens = _inputs(1)
    mask = jnp.asarray(np.arange(11)[None, :] >= 3).repeat(2, 0)

    def f_chunked(hh, ww):
        return (L.chunked_logprobs(hh, ww, jnp.asarray(tokens), chunk_size=4)[0] * mask).sum()

    def f_full(hh, ww):
        return (L.logprobs_from_logits(hh @ ww.T, jnp.asarray(tokens))[0] * mask).sum()

    g1 = jax.grad(f_chunked, argnums=(0, 1))(jnp.asarray(hidden), jnp.asarray(w))
    g2 = jax.grad(f_full, argnums=(0, 1))(jnp.asarray(hidden), jnp.asarray(w))
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_chunked_logprobs_never_materialize_full_logits():
    """Forward and backward temporaries stay far below one [B, T, V] float32 array."""
    b, t, h, v, chunk = 2, 512, 16, 8192, 32
    full_bytes = b * t * v * 4

    def loss(hh, ww, tok):
        return L.chunked_logprobs(hh, ww, tok, chunk_size=chunk)[0].sum()

    args = (jax.ShapeDtypeStruct((b, t, h), jnp.float32), jax.ShapeDtypeStruct((v, h), jnp.float32),
            jax.ShapeDtypeStruct((b, t), jnp.int32))
    chunked = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile().memory_analysis()
    assert chunked.temp_size_in_bytes < full_bytes / 4, chunked.temp_size_in_bytes

    def loss_full(hh, ww, tok):
        return L.logprobs_from_logits(hh @ ww.T, tok)[0].sum()

    full = jax.jit(jax.grad(loss_full, argnums=(0, 1))).lower(*args).compile().memory_analysis()
    assert full.temp_size_in_bytes >= full_bytes  # the check above can tell the difference


def _np_ppo(logp, old, adv, lo, hi, dual=None):
    ratio = np.exp(logp - old)
    loss = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - lo, 1 + hi))
    if dual is not None:
        loss = np.where(adv < 0, np.minimum(loss, -dual * adv), loss)
    return loss


@pytest.mark.parametrize("dual", [None, 3.0])
def test_ppo_clip_loss_matches_numpy(dual):
    rng = np.random.default_rng(2)
    logp = rng.normal(size=(4, 9)) * 0.1 - 2
    old = logp + rng.normal(size=(4, 9)) * 0.8
    adv = rng.normal(size=(4, 9))
    got, clipped = L.ppo_clip_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), 0.2, 0.28, dual)
    np.testing.assert_allclose(got, _np_ppo(logp, old, adv, 0.2, 0.28, dual), rtol=1e-5, atol=1e-6)
    assert 0 < float(clipped.mean()) < 1


def test_ppo_clip_hand_values():
    # ratio e^{0.5} ≈ 1.6487 with A = +1: clipped at 1 + 0.28, loss −1.28.
    # ratio e^{-0.5} ≈ 0.6065 with A = +1: unclipped (min picks ρA), loss −0.6065.
    # ratio e^{2} ≈ 7.389 with A = −1: loss max(7.389, 1.28) = 7.389; dual clip c = 3 caps it at 3.
    logp = jnp.array([[0.5, -0.5, 2.0]])
    old = jnp.zeros((1, 3))
    adv = jnp.array([[1.0, 1.0, -1.0]])
    loss, clipped = L.ppo_clip_loss(logp, old, adv, 0.2, 0.28)
    np.testing.assert_allclose(loss, [[-1.28, -np.exp(-0.5), np.exp(2.0)]], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[1.0, 0.0, 0.0]])
    loss, clipped = L.ppo_clip_loss(logp, old, adv, 0.2, 0.28, dual_clip=3.0)
    np.testing.assert_allclose(loss, [[-1.28, -np.exp(-0.5), 3.0]], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[1.0, 0.0, 1.0]])


def test_ppo_on_policy_gradient_is_policy_gradient():
    """At ρ = 1 the surrogate's gradient is −A ∇log π (clipping is inactive)."""
    logp = jnp.array([-1.0, -2.0, -0.5])
    adv = jnp.array([0.3, -1.2, 2.0])
    g = jax.grad(lambda lp: L.ppo_clip_loss(lp, jax.lax.stop_gradient(lp), adv)[0].sum())(logp)
    np.testing.assert_allclose(g, -adv, rtol=1e-6)


def test_kl_estimators():
    rng = np.random.default_rng(3)
    logp = rng.normal(size=(3, 5)).astype(np.float32)
    ref = (logp + rng.normal(size=(3, 5)) * 0.3).astype(np.float32)
    logp64, ref64 = logp.astype(np.float64), ref.astype(np.float64)
    np.testing.assert_allclose(L.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k1"), logp64 - ref64, rtol=1e-6)
    lr = ref64 - logp64
    np.testing.assert_allclose(L.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k3"),
                               np.exp(lr) - lr - 1, rtol=1e-5, atol=1e-7)
    assert float(L.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k3").min()) >= 0
    for est in ("k1", "k3"):
        assert np.all(np.asarray(L.kl_penalty(jnp.asarray(logp), jnp.asarray(logp), est)) == 0.0)
    with pytest.raises(ValueError):
        L.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k2")


def _np_aggregate(loss, mask, mode, norm=None):
    rows = [(loss[i] * mask[i]).sum() for i in range(len(loss)) if mask[i].sum() > 0]
    lens = [mask[i].sum() for i in range(len(loss)) if mask[i].sum() > 0]
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum()
    if mode == "seq-mean-token-sum":
        return np.mean(rows)
    if mode == "seq-mean-token-mean":
        return np.mean([r / n for r, n in zip(rows, lens)])
    return np.sum(rows) / (len(rows) * (loss.shape[1] if norm is None else norm))


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_aggregation_matches_numpy(mode):
    rng = np.random.default_rng(4)
    loss = rng.normal(size=(5, 12))
    mask = (rng.random((5, 12)) < 0.6).astype(np.float32)
    mask[:, 0] = 0
    mask[3] = 0  # an all-padding row is not a sequence
    w = L.loss_weights(jnp.asarray(mask), mode)
    np.testing.assert_allclose((w * loss).sum(), _np_aggregate(loss, mask, mode), rtol=1e-5)
    if mode == "seq-mean-token-sum-norm":
        w = L.loss_weights(jnp.asarray(mask), mode, norm_constant=100.0)
        np.testing.assert_allclose((w * loss).sum(), _np_aggregate(loss, mask, mode, 100.0), rtol=1e-5)


def test_aggregation_hand_values():
    loss = jnp.array([[0.0, 1.0, 2.0, 3.0], [0.0, 4.0, 0.0, 0.0]])
    mask = jnp.array([[0, 1, 1, 1], [0, 1, 0, 0]])
    total = lambda mode: float((L.loss_weights(mask, mode) * loss).sum())  # noqa: E731
    assert total("token-mean") == pytest.approx(10 / 4)
    assert total("seq-mean-token-sum") == pytest.approx((6 + 4) / 2)
    assert total("seq-mean-token-mean") == pytest.approx((2 + 4) / 2)
    assert total("seq-mean-token-sum-norm") == pytest.approx(10 / (2 * 4))


@pytest.mark.parametrize("mode", L.AGG_MODES)
def test_packed_equals_unpacked_aggregation(mode):
    """Two sequences packed in one row (segment ids) weigh their tokens as two rows do."""
    rng = np.random.default_rng(5)
    loss_a, loss_b = rng.normal(size=6), rng.normal(size=6)
    mask_a = np.array([0, 0, 1, 1, 1, 0], np.float32)
    mask_b = np.array([0, 1, 1, 1, 1, 1], np.float32)
    unpacked = (L.loss_weights(jnp.asarray(np.stack([mask_a, mask_b])), mode, norm_constant=6.0)
                * np.stack([loss_a, loss_b])).sum()
    packed_mask = np.concatenate([mask_a, mask_b])[None]
    seg = np.array([[0] * 6 + [1] * 6])
    packed = (L.loss_weights(jnp.asarray(packed_mask), mode, jnp.asarray(seg), norm_constant=6.0)
              * np.concatenate([loss_a, loss_b])[None]).sum()
    np.testing.assert_allclose(packed, unpacked, rtol=1e-6)


def test_weights_over_microbatches_sum_to_full_batch():
    """Weights of the full batch, split by rows, sum per micro-batch to the full loss."""
    rng = np.random.default_rng(6)
    loss = rng.normal(size=(8, 10))
    mask = (rng.random((8, 10)) < 0.5).astype(np.float32)
    for mode in L.AGG_MODES:
        w = np.asarray(L.loss_weights(jnp.asarray(mask), mode))
        parts = sum((w[i::4] * loss[i::4]).sum() for i in range(4))
        np.testing.assert_allclose(parts, (w * loss).sum(), rtol=1e-6)


def test_masked_mean_and_unknown_mode():
    x = jnp.array([[1.0, 2.0, 3.0]])
    assert float(L.masked_mean(x, jnp.array([[0, 1, 1]]))) == pytest.approx(2.5)
    assert float(L.masked_mean(x, jnp.zeros((1, 3)))) == 0.0
    with pytest.raises(ValueError):
        L.loss_weights(jnp.ones((1, 3)), "sum")


def test_huge_log_ratio_keeps_the_gradient_finite():
    """A token with log π − log π_old = 100 would overflow exp; the clamp keeps loss and gradient finite."""
    old = jnp.array([[0.0, 0.0]])
    for adv, dual in ((1.0, None), (-1.0, None), (-1.0, 3.0)):
        def loss(logp):
            return L.ppo_clip_loss(logp, old, jnp.full((1, 2), adv), dual_clip=dual)[0].sum()
        value, grad = jax.value_and_grad(loss)(jnp.array([[100.0, 0.1]]))
        assert np.isfinite(value) and np.all(np.isfinite(grad))
