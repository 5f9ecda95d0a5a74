"""Decoding: cache correctness, greedy parity with transformers' generate, no retracing."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hf_qwen3 import VARIANTS, make_hf

import models
from models.decode import Decoder, SamplingParams, sample, sample_rows


@pytest.fixture(scope="module", params=["tied", "untied"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, make_hf(path, **VARIANTS[request.param])


def _left_padded(seed=0):
    rs = np.random.RandomState(seed)
    ids = rs.randint(1, 128, (3, 7)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    mask[2, :1] = 0
    return ids * mask, mask


def test_greedy_equals_transformers_generate(tiny):
    path, hf = tiny
    ids, mask = _left_padded()
    with torch.no_grad():
        ref = hf.generate(torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=16,
                          do_sample=False, pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:].numpy()
    out = Decoder(models.from_pretrained(path)).generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=16)
    np.testing.assert_array_equal(np.asarray(out["tokens"]), ref)
    assert np.asarray(out["lengths"]).tolist() == [16, 16, 16]


def test_prefill_and_steps_match_full_forward(tiny):
    path, _ = tiny
    model = models.from_pretrained(path)
    ids, mask = _left_padded(1)
    dec = Decoder(model)
    full = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    cache = dec.init_cache(3, 12)
    logits, cache = dec.prefill(dec.state, cache, jnp.asarray(ids[:, :4]), jnp.asarray(mask[:, :4]))
    rows = mask[:, 3].astype(bool)  # rows whose 4th slot is a real token
    np.testing.assert_allclose(np.asarray(logits)[rows], full[rows, 3], atol=1e-5, rtol=0)
    for t in range(4, 7):
        logits, cache = dec.step(dec.state, cache, jnp.asarray(ids[:, t]))
        np.testing.assert_allclose(np.asarray(logits), full[:, t], atol=1e-5, rtol=0)
    assert int(cache.index) == 7
    np.testing.assert_array_equal(np.asarray(cache.next_pos), mask.sum(1))


def test_step_does_not_retrace_and_donates_the_cache(tiny):
    path, _ = tiny
    model = models.from_pretrained(path)
    dec = Decoder(model)
    chex.clear_trace_counter()
    step = jax.jit(chex.assert_max_traces(dec._step, n=1), donate_argnames=("cache",))
    cache = dec.init_cache(2, 10)
    logits, cache = dec.prefill(dec.state, cache, jnp.ones((2, 3), jnp.int32), jnp.ones((2, 3), jnp.int32))
    state = dec.state
    for t in range(5):
        old = cache.layers.k
        logits, cache = step(state, cache, jnp.argmax(logits, -1).astype(jnp.int32))
        assert old.is_deleted()  # donated: updated in place
        # new weights (as after an RL update) reuse the same compiled step
        state = jax.tree.map(lambda x: x * 1.0001, state)
    assert int(cache.index) == 8


def test_generate_reuses_compiled_functions_for_new_weights(tiny):
    path, _ = tiny
    dec = Decoder(models.from_pretrained(path))
    ids, mask = _left_padded(2)
    dec.generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=4)
    n_prefill, n_loop = dec.prefill._cache_size(), dec._loop._cache_size()
    state = jax.tree.map(lambda x: x * 0.9, dec.state)
    dec.generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=4, state=state)
    assert (dec.prefill._cache_size(), dec._loop._cache_size()) == (n_prefill, n_loop) == (1, 1)


def test_eos_ends_rows_and_sampling_logprobs(tiny):
    path, _ = tiny
    model = models.from_pretrained(path)
    dec = Decoder(model)
    ids, mask = _left_padded(3)
    greedy = np.asarray(dec.generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=8)["tokens"])
    eos = int(greedy[1, 2])
    out = dec.generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=8, eos_ids=(eos,))
    toks, lengths = np.asarray(out["tokens"]), np.asarray(out["lengths"])
    for r in range(3):
        hits = np.nonzero(greedy[r] == eos)[0]
        n = hits[0] + 1 if len(hits) else 8
        assert lengths[r] == n
        np.testing.assert_array_equal(toks[r, :n], greedy[r, :n])
        assert (toks[r, n:] == 0).all()
    # sampled tokens' log-probs equal log_softmax(logits / T) of a full forward over the sequence
    params = SamplingParams(temperature=0.7, top_p=0.9)
    out = dec.generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=5, params=params, key=jax.random.key(3))
    seq = np.concatenate([ids, np.asarray(out["tokens"])], axis=1)
    full = np.asarray(model(jnp.asarray(seq), attention_mask=jnp.asarray(np.pad(mask, ((0, 0), (0, 5)),
                                                                                   constant_values=1))))
    logp = jax.nn.log_softmax(full[:, 6:-1] / 0.7, axis=-1)
    want = np.take_along_axis(np.asarray(logp), np.asarray(out["tokens"])[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out["logprobs"]), want, atol=1e-4, rtol=0)


def test_sample_top_k_one_is_greedy_and_top_p_keeps_the_nucleus():
    logits = jnp.asarray(np.random.RandomState(0).randn(4, 50), jnp.float32)
    ids, _ = sample(logits, jax.random.key(0), SamplingParams(temperature=1.0, top_k=1))
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(jnp.argmax(logits, -1)))
    peaked = jnp.zeros((1, 4)).at[0, 2].set(10.0)
    picks = {int(sample(peaked, jax.random.key(i), SamplingParams(temperature=1.0, top_p=0.5))[0][0])
             for i in range(20)}
    assert picks == {2}


def test_sample_rows_in_chunks_draws_what_all_rows_at_once_draw():
    logits = jnp.asarray(np.random.RandomState(1).randn(12, 300) * 3, jnp.float32)
    keys = jax.random.split(jax.random.key(4), 12)
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.8)
    ids, logp = sample_rows(logits, keys, params, chunk=12)
    for chunk in (1, 3, 4, 6):
        got_ids, got_logp = jax.jit(sample_rows, static_argnums=(2, 3))(logits, keys, params, chunk)
        np.testing.assert_array_equal(np.asarray(got_ids), np.asarray(ids))
        np.testing.assert_allclose(np.asarray(got_logp), np.asarray(logp), rtol=1e-6)
    assert len(set(np.asarray(ids).tolist())) > 3  # rows drew with their own keys
    with pytest.raises(ValueError, match="does not divide"):
        sample_rows(logits, keys, params, chunk=5)


def test_a_cache_too_small_for_the_request_is_an_error(tiny):
    """Cache writes past the end would clamp and silently overwrite slots: refuse up front."""
    path, _ = tiny
    dec = Decoder(models.from_pretrained(path))
    ids, mask = _left_padded(3)
    with pytest.raises(ValueError, match="max_len=10 cannot hold a prompt of 7 tokens plus max_new_tokens=4"):
        dec.generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=4, max_len=10)
    out = dec.generate(jnp.asarray(ids), jnp.asarray(mask), max_new_tokens=4, max_len=11)
    assert out["tokens"].shape == (3, 4)
