"""Qwen3 dense: parity with transformers' PyTorch model on the CPU."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hf_qwen3 import VARIANTS, hf_logits, make_hf
from transformers import Qwen3ForCausalLM

import models
from models.qwen3 import Qwen3, Qwen3Config

FP32_TOL = 1e-4
# bf16 (weights and activations, both sides): our logits stay within 2% of the
# largest logit of transformers' bf16 logits, and our error against the fp32
# reference is at most 1.5x transformers' own bf16 error (+1e-3).
BF16_REL = 2e-2


@pytest.fixture(scope="module", params=["tied", "untied"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = make_hf(path, **VARIANTS[request.param])
    return path, hf


@pytest.fixture(scope="module")
def tiny_bias(tmp_path_factory):
    path = tmp_path_factory.mktemp("bias")
    return path, make_hf(path, **VARIANTS["bias"])


def _ids(b=2, t=13, seed=0):
    return np.random.RandomState(seed).randint(1, 128, (b, t)).astype(np.int32)


def test_config_from_hf_reads_transformers_layout(tiny):
    path, hf = tiny
    cfg = models.load_config(path)
    assert isinstance(cfg, Qwen3Config)
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.rope_theta) == (24, 2, 10000.0)
    assert cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert Qwen3Config.from_hf(cfg.to_hf()) == cfg


def test_config_errors_name_the_key():
    good = json.loads(json.dumps(Qwen3Config(128, 64, 96, 2, 4, 2, 24, 1e4).to_hf()))
    del good["vocab_size"]
    with pytest.raises(KeyError, match="vocab_size"):
        Qwen3Config.from_hf(good)
    with pytest.raises(ValueError, match="multiple"):
        Qwen3Config(128, 64, 96, 2, 4, 3, 24, 1e4)
    with pytest.raises(ValueError, match="unsupported model_type"):
        models.load_config({"model_type": "llama"})


def test_fp32_logits_match_transformers(tiny):
    path, hf = tiny
    ids = _ids()
    ours = models.from_pretrained(path)
    out = np.asarray(ours(jnp.asarray(ids)))
    assert out.shape == (2, 13, 128)
    np.testing.assert_allclose(out, hf_logits(hf, ids), atol=FP32_TOL, rtol=0)


def test_fp32_logits_match_transformers_with_attention_bias(tiny_bias):
    path, hf = tiny_bias
    ids = _ids()
    ours = models.from_pretrained(path)
    assert ours.layers.self_attn.o_proj.bias is not None
    np.testing.assert_allclose(np.asarray(ours(jnp.asarray(ids))), hf_logits(hf, ids), atol=FP32_TOL, rtol=0)


def test_bf16_logits_within_stated_bound(tiny):
    path, hf = tiny
    ids = _ids()
    ref = hf_logits(hf, ids)
    hf_bf16 = hf_logits(Qwen3ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval(), ids)
    ours = models.from_pretrained(path, dtype=jnp.bfloat16)
    assert ours.layers.mlp.up_proj.kernel[...].dtype == jnp.bfloat16
    out = np.asarray(ours(jnp.asarray(ids)).astype(jnp.float32))
    assert np.abs(out - hf_bf16).max() <= BF16_REL * np.abs(hf_bf16).max()
    assert np.abs(out - ref).max() <= 1.5 * np.abs(hf_bf16 - ref).max() + 1e-3


def test_packed_equals_unpacked(tiny):
    path, _ = tiny
    model = models.from_pretrained(path)
    a, b = _ids(1, 5, seed=1), _ids(1, 8, seed=2)
    packed = np.concatenate([a, b, np.zeros((1, 3), np.int32)], axis=1)
    seg = np.array([[1] * 5 + [2] * 8 + [0] * 3], np.int32)
    out = np.asarray(model(jnp.asarray(packed), segment_ids=jnp.asarray(seg)))
    np.testing.assert_allclose(out[:, :5], np.asarray(model(jnp.asarray(a))), atol=1e-5, rtol=0)
    np.testing.assert_allclose(out[:, 5:13], np.asarray(model(jnp.asarray(b))), atol=1e-5, rtol=0)
    # explicit positions give the same result as the ones derived from segment ids
    pos = np.array([list(range(5)) + list(range(8)) + [0, 0, 0]], np.int32)
    out2 = model(jnp.asarray(packed), segment_ids=jnp.asarray(seg), positions=jnp.asarray(pos))
    np.testing.assert_array_equal(out, np.asarray(out2))


def test_left_padding_mask(tiny):
    path, hf = tiny
    model = models.from_pretrained(path)
    ids = _ids(3, 9, seed=3)
    mask = np.ones_like(ids)
    mask[0, :4] = 0
    mask[1, :1] = 0
    ids = ids * mask
    out = np.asarray(model(jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
    ref = hf_logits(hf, ids, attention_mask=mask, position_ids=pos)
    keep = mask.astype(bool)
    np.testing.assert_allclose(out[keep], ref[keep], atol=FP32_TOL, rtol=0)
    # a padded row equals the same row without padding
    np.testing.assert_allclose(out[0, 4:], np.asarray(model(jnp.asarray(ids[:1, 4:])))[0], atol=1e-5, rtol=0)
    assert np.isfinite(out).all()


def test_hidden_and_lm_head_give_logits(tiny):
    path, _ = tiny
    model = models.from_pretrained(path)
    ids = jnp.asarray(_ids())
    h = model(ids, return_hidden=True)
    w = model.lm_head_weight()
    assert h.shape == (2, 13, 64) and w.shape == (128, 64)
    np.testing.assert_allclose(np.asarray(h @ w.T), np.asarray(model(ids)), atol=1e-5, rtol=0)
    if model.config.tie_word_embeddings:
        assert model.lm_head is None


def test_layers_are_stacked_and_remat_keeps_gradients():
    cfg = Qwen3Config(128, 64, 96, 3, 4, 2, 24, 1e4)
    model = Qwen3(cfg, rngs=nnx.Rngs(0))
    assert model.layers.self_attn.q_proj.kernel.shape == (3, 64, 4, 24)
    assert model.layers.self_attn.q_proj.kernel.get_metadata("axes") == ("layers", "embed", "q_heads", "head_dim")
    ids = jnp.asarray(_ids())

    def loss(m):
        return jnp.mean(jax.nn.log_softmax(m(ids))[..., 0])

    model.remat = False
    g1 = nnx.jit(nnx.grad(loss))(model)
    model.remat = True
    g2 = nnx.jit(nnx.grad(loss))(model)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=0)
