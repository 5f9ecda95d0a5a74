"""The JAX gated delta rule and causal conv1d against transformers' PyTorch reference functions."""

import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from models import gated_delta as gd

HK, HV, DK, DV = 2, 4, 16, 8


def _inputs(seed: int, batch: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return {
        "q": normal(batch, length, HK, DK),
        "k": normal(batch, length, HK, DK),
        "v": normal(batch, length, HV, DV),
        "g": -np.exp(normal(batch, length, HV)) * 0.3,
        "beta": 1 / (1 + np.exp(-normal(batch, length, HV))),
        "state": normal(batch, HV, DK, DV) * 0.5,
    }


def _torch(fn, x, **kwargs):
    t = {name: torch.from_numpy(a) for name, a in x.items()}
    o, s = fn(
        t["q"], t["k"], t["v"], g=t["g"], beta=t["beta"], initial_state=t["state"],
        output_final_state=True, use_qk_l2norm_in_kernel=True, **kwargs,
    )
    return o.numpy(), s.numpy()


@functools.partial(jax.jit, static_argnames=("fn", "chunk_size"))
def _run(fn, q, k, v, g, beta, state, segment_ids=None, chunk_size=None):
    kwargs = {} if chunk_size is None else {"chunk_size": chunk_size}
    return fn(gd.l2_normalize(q), gd.l2_normalize(k), v, g, beta, initial_state=state, segment_ids=segment_ids,
              **kwargs)


def _jax(fn, x, **kwargs):
    o, s = _run(fn, x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], **kwargs)
    return np.asarray(o), np.asarray(s)


@pytest.mark.parametrize("length", [1, 37, 64, 100, 150])
def test_chunked_matches_transformers_chunked(length):
    x = _inputs(length, 2, length)
    o_ref, s_ref = _torch(hf.torch_chunk_gated_delta_rule, x, chunk_size=64)
    o, s = _jax(gd.chunked_gated_delta_rule, x, chunk_size=64)
    np.testing.assert_allclose(o, o_ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(s, s_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [1, 23, 70])
def test_recurrent_matches_transformers_recurrent(length):
    x = _inputs(100 + length, 2, length)
    o_ref, s_ref = _torch(hf.torch_recurrent_gated_delta_rule, x)
    o, s = _jax(gd.recurrent_gated_delta_rule, x)
    np.testing.assert_allclose(o, o_ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(s, s_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("length", "chunk"), [(5, 16), (47, 16), (64, 16), (99, 32)])
def test_chunked_equals_recurrent(length, chunk):
    x = _inputs(200 + length, 2, length)
    o_rec, s_rec = _jax(gd.recurrent_gated_delta_rule, x)
    o, s = _jax(gd.chunked_gated_delta_rule, x, chunk_size=chunk)
    np.testing.assert_allclose(o, o_rec, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(s, s_rec, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 16, 64])
def test_unit_lower_inverse_matches_numpy(n):
    strict = np.tril(np.random.default_rng(n).standard_normal((3, n, n)), -1).astype(np.float32) * 0.5
    expect = np.linalg.inv(strict.astype(np.float64) + np.eye(n))
    np.testing.assert_allclose(jax.jit(gd.unit_lower_inverse)(strict), expect, atol=1e-5 * np.abs(expect).max(), rtol=0)


def test_gradients_of_chunked_equal_recurrent():
    x = _inputs(7, 1, 40)

    def loss(fn, q, k, v, g, beta, **kw):
        o, s = fn(gd.l2_normalize(q), gd.l2_normalize(k), v, g, beta, initial_state=x["state"], **kw)
        return jnp.sum(o * o) + jnp.sum(jnp.sin(s))

    args = tuple(x[n] for n in ("q", "k", "v", "g", "beta"))
    grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4, 5)), static_argnums=0, static_argnames="chunk_size")
    grads_rec = grad(gd.recurrent_gated_delta_rule, *args)
    grads = grad(gd.chunked_gated_delta_rule, *args, chunk_size=16)
    for a, b in zip(grads, grads_rec):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("rule", "kwargs"), [
    (gd.chunked_gated_delta_rule, {"chunk_size": 16}),
    (gd.recurrent_gated_delta_rule, {}),
])
def test_packed_segments_equal_separate_sequences(rule, kwargs):
    lengths = [(23, 50, 7), (1, 2, 77)]
    x = _inputs(11, 2, 80)
    seg = np.stack([np.repeat(np.arange(3), ls) for ls in lengths])
    o, s = _jax(rule, x, segment_ids=seg, **kwargs)
    for row, ls in enumerate(lengths):
        start = 0
        for i, n in enumerate(ls):
            piece = {name: a[row : row + 1, start : start + n] for name, a in x.items() if name != "state"}
            piece["state"] = x["state"][row : row + 1] if i == 0 else np.zeros_like(x["state"][:1])
            o_ref, s_ref = _jax(gd.recurrent_gated_delta_rule, piece)
            np.testing.assert_allclose(o[row, start : start + n], o_ref[0], atol=1e-5, rtol=1e-5)
            start += n
        np.testing.assert_allclose(s[row], s_ref[0], atol=1e-5, rtol=1e-5)


def test_prefill_then_steps_equal_one_pass():
    x = _inputs(3, 2, 30)
    o_all, s_all = _jax(gd.recurrent_gated_delta_rule, x)
    prefix = {n: a[:, :20] for n, a in x.items() if n != "state"} | {"state": x["state"]}
    o, state = _jax(gd.chunked_gated_delta_rule, prefix, chunk_size=8)
    groups = HV // HK
    for t in range(20, 30):
        q = jnp.repeat(gd.l2_normalize(x["q"][:, t]), groups, axis=1) * DK**-0.5
        k = jnp.repeat(gd.l2_normalize(x["k"][:, t]), groups, axis=1)
        o_t, state = gd.gated_delta_step(q, k, x["v"][:, t], x["g"][:, t], x["beta"][:, t], state)
        np.testing.assert_allclose(o_t, o_all[:, t], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(state, s_all, atol=1e-5, rtol=1e-5)


def test_bf16_inputs_stay_close_to_float32():
    x = _inputs(5, 2, 90)
    o32, _ = _jax(gd.chunked_gated_delta_rule, x)
    x16 = {n: jnp.asarray(a, jnp.bfloat16) for n, a in x.items()}
    q, k = gd.l2_normalize(x16["q"]), gd.l2_normalize(x16["k"])
    o16, s16 = jax.jit(gd.chunked_gated_delta_rule)(
        q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), x16["v"], x16["g"], x16["beta"], x16["state"]
    )
    assert o16.dtype == jnp.bfloat16 and s16.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(o16, np.float32), o32, atol=5e-2, rtol=5e-2)


def _conv_inputs(seed, batch=2, length=13, channels=6, taps=4):
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((batch, length, channels)).astype(np.float32),
        rng.standard_normal((taps, channels)).astype(np.float32),
    )


def test_conv_matches_transformers():
    x, w = _conv_inputs(0)
    ref = hf.causal_conv1d_fn(
        torch.from_numpy(x).transpose(1, 2), torch.from_numpy(w.T.copy()), None, activation="silu"
    ).transpose(1, 2)
    y, state = gd.causal_conv1d(x, w)
    np.testing.assert_allclose(jax.nn.silu(y), ref.numpy(), atol=1e-6, rtol=1e-6)
    np.testing.assert_array_equal(state, x[:, -3:])


def test_conv_step_matches_transformers_update():
    x, w = _conv_inputs(1, length=1)
    rng = np.random.default_rng(2)
    hf_state = rng.standard_normal((2, 6, 4)).astype(np.float32)
    ref = hf.causal_conv1d_update(
        torch.from_numpy(x).transpose(1, 2), torch.from_numpy(hf_state.copy()),
        torch.from_numpy(w.T.copy()), None, "silu",
    )
    y, state = gd.causal_conv1d_step(x[:, 0], w, np.swapaxes(hf_state[:, :, 1:], 1, 2))
    np.testing.assert_allclose(jax.nn.silu(y), ref[:, :, 0].numpy(), atol=1e-6, rtol=1e-6)
    np.testing.assert_array_equal(state[:, -1], x[:, 0])


def test_conv_state_continues_and_segments_isolate():
    x, w = _conv_inputs(3, length=20)
    y_all, state_all = gd.causal_conv1d(x, w)
    y_a, state = gd.causal_conv1d(x[:, :9], w)
    y_b, state = gd.causal_conv1d(x[:, 9:15], w, state)
    ys = [y_a, y_b]
    for t in range(15, 20):
        y_t, state = gd.causal_conv1d_step(x[:, t], w, state)
        ys.append(y_t[:, None])
    np.testing.assert_allclose(jnp.concatenate(ys, 1), y_all, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(state, state_all, atol=0, rtol=0)

    seg = np.repeat([[0, 1, 2]], 2, axis=0).repeat([12, 6, 2], axis=1)
    y_seg, state_seg = gd.causal_conv1d(x, w, segment_ids=seg)
    for lo, hi in [(0, 12), (12, 18), (18, 20)]:
        y_ref, state_ref = gd.causal_conv1d(x[:, lo:hi], w)
        np.testing.assert_allclose(y_seg[:, lo:hi], y_ref, atol=1e-6, rtol=1e-6)
    np.testing.assert_array_equal(state_seg[:, 0], 0.0)
    np.testing.assert_array_equal(state_seg[:, 1:], state_ref[:, 1:])


def test_chunked_is_stable_for_nearly_parallel_keys():
    """Keys that barely change, β near 1 and almost no decay: the worst case for the UT inverse."""
    x = _inputs(13, 1, 128)
    base = x["k"][:, :1]
    x["k"] = base + 0.01 * x["k"]
    x["beta"] = np.full_like(x["beta"], 0.99)
    x["g"] = np.full_like(x["g"], -1e-4)
    o_rec, s_rec = _jax(gd.recurrent_gated_delta_rule, x)
    o, s = _jax(gd.chunked_gated_delta_rule, x)
    np.testing.assert_allclose(o, o_rec, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(s, s_rec, atol=1e-4, rtol=1e-4)
