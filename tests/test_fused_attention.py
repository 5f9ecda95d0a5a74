"""Fused attention (splash in Pallas' interpreter, dot_product_attention's call) against `layers.attend`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import fused_attention as fa
from models import sharding as msh
from models.layers import AttnMask, attend
from models.qwen3 import Qwen3, Qwen3Config
from models.qwen3_5 import Qwen3_5, Qwen3_5Config

splash_interpret = lambda q, k, v, seg, scale: fa.splash_attention(q, k, v, seg, scale, interpret=True)  # noqa: E731
dpa_xla = lambda q, k, v, seg, scale: fa.cudnn_attention(q, k, v, seg, scale, implementation="xla")  # noqa: E731
KERNELS = {"splash": splash_interpret, "dot_product_attention": dpa_xla}


def _inputs(b=2, t=200, n=4, kh=2, h=128, seed=0):
    r = np.random.default_rng(seed)
    q = jnp.asarray(r.normal(size=(b, t, n, h)), jnp.float32)
    k = jnp.asarray(r.normal(size=(b, kh, t, h)), jnp.float32)
    v = jnp.asarray(r.normal(size=(b, kh, t, h)), jnp.float32)
    # row 0: two packed sequences then padding; row 1: left padding then one sequence
    seg = np.zeros((b, t), np.int32)
    seg[0, :90], seg[0, 90:170] = 1, 2
    seg[1, 30:] = 1
    return q, k, v, jnp.asarray(seg)


@pytest.mark.parametrize("name", KERNELS)
def test_forward_and_gradients_match_attend(name):
    q, k, v, seg = _inputs()
    scale = 128 ** -0.5
    real = (seg != 0)[:, :, None, None]

    def loss(fn, q, k, v):
        o = fn(q, k, v, seg, scale)
        return jnp.sum(jnp.where(real, o, 0.0) * jnp.cos(jnp.arange(o.size).reshape(o.shape))), o

    ref_fn = lambda q, k, v, seg, scale: attend(q, k, v, AttnMask.full(seg), scale)  # noqa: E731
    (_, ref), ref_g = jax.value_and_grad(lambda *a: loss(ref_fn, *a), argnums=(0, 1, 2), has_aux=True)(q, k, v)
    (_, out), out_g = jax.value_and_grad(lambda *a: loss(KERNELS[name], *a), argnums=(0, 1, 2),
                                         has_aux=True)(q, k, v)
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, ref, 0), atol=2e-5, rtol=1e-5)
    for a, b in zip(out_g, ref_g):
        np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


def test_splash_under_a_mesh_runs_per_shard():
    """On a 2x2x2 CPU mesh the kernel runs in shard_map (batch and heads split) with the same result."""
    q, k, v, seg = _inputs(b=4, t=128, n=8, kh=4)
    ref = attend(q, k, v, AttnMask.full(seg), 0.1)
    mesh = msh.make_mesh(2, 2, 2)
    with msh.use_mesh(mesh):
        out = jax.jit(lambda *a: splash_interpret(*a, 0.1))(q, k, v, seg)
    real = (seg != 0)[:, :, None, None]
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, ref, 0), atol=2e-5, rtol=1e-5)


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="attention_impl 'flash'"):
        fa.check_impl("flash")


def _qwen3_cfg():
    return Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e6)


def _qwen3_5_cfg():
    return Qwen3_5Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, rope_theta=1e6, partial_rotary_factor=0.25,
                         layer_types=("linear_attention", "full_attention"), linear_key_head_dim=16,
                         linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4)


@pytest.mark.parametrize("family", [Qwen3, Qwen3_5])
def test_model_attention_impl_is_a_switch(family, monkeypatch):
    """A model built with attention_impl="cudnn" routes cache-free calls through the fused call."""
    cfg = _qwen3_cfg() if family is Qwen3 else _qwen3_5_cfg()
    ref = family(cfg, rngs=nnx.Rngs(0))
    fused = family(cfg, rngs=nnx.Rngs(0), attention_impl="cudnn")
    calls, original = [], fa.cudnn_attention

    def traced(q, k, v, seg, scale):
        calls.append(q.shape)
        return original(q, k, v, seg, scale, implementation="xla")

    monkeypatch.setattr(fa, "cudnn_attention", traced)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 128, (2, 24)), jnp.int32)
    seg = jnp.asarray(np.r_[np.ones(16), np.full(8, 2)].astype(np.int32))[None].repeat(2, 0)
    np.testing.assert_allclose(fused(ids, segment_ids=seg), ref(ids, segment_ids=seg), atol=2e-5, rtol=1e-5)
    assert calls, "the fused kernel was not called"
