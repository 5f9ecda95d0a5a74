"""Logical sharding rules and the 2x2x2 mesh on 8 fake CPU devices."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from models import sharding
from models.qwen3 import Qwen3, Qwen3Config

CFG = Qwen3Config(128, 64, 96, 2, 4, 2, 24, 1e4, tie_word_embeddings=False)


def test_make_mesh_sizes_and_errors():
    assert jax.device_count() == 8
    mesh = sharding.make_mesh(2, 2, 2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
    assert dict(sharding.make_mesh(data=2, tensor=2).shape) == {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
    assert dict(sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1]).shape)["fsdp"] == 1
    with pytest.raises(ValueError):
        sharding.make_mesh(3, -1, 1)
    with pytest.raises(ValueError):
        sharding.make_mesh(2, 2, 1)


def test_logical_to_spec_drops_axes_that_do_not_divide():
    mesh = sharding.make_mesh(2, 2, 2)
    assert sharding.logical_to_spec(("embed", "mlp"), shape=(64, 96), mesh=mesh) == P("fsdp", "tensor")
    # 3 kv heads cannot split over tensor=2: replicated on that dim
    assert sharding.logical_to_spec(("embed", "kv_heads", "head_dim"), shape=(64, 3, 8), mesh=mesh) == P("fsdp", None, None)
    # batch takes data and fsdp when both divide, only data when one row per data shard
    assert sharding.logical_to_spec(("batch", "seq"), shape=(8, 5), mesh=mesh) == P(("data", "fsdp"), None)
    assert sharding.logical_to_spec(("batch", "seq"), shape=(2, 5), mesh=mesh) == P("data", None)
    # a mesh axis is used once per array
    assert sharding.logical_to_spec(("vocab", "mlp")) == P("tensor", None)
    with pytest.raises(KeyError, match="nope"):
        sharding.logical_to_spec(("nope",))
    rules = sharding.rules_from_mapping({"embed": None, "mlp": ["fsdp", "tensor"]})
    assert sharding.logical_to_spec(("embed", "mlp"), rules, (64, 96), mesh) == P(None, ("fsdp", "tensor"))
    with pytest.raises(ValueError, match="unknown mesh axes"):
        sharding.rules_from_mapping({"embed": "model"})


def _qwen3_5():
    from transformers import Qwen3_5TextConfig

    from models.qwen3_5 import Qwen3_5, Qwen3_5Config

    hf = Qwen3_5TextConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=8,
                           linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
    return Qwen3_5(Qwen3_5Config.from_hf(json.loads(hf.to_json_string())), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("make", [lambda: Qwen3(CFG, rngs=nnx.Rngs(0)), _qwen3_5], ids=["qwen3", "qwen3_5"])
def test_every_parameter_has_logical_axes(make):
    """Every dimension of every parameter is named, and every name has a rule (none falls back silently)."""
    model = nnx.eval_shape(make)
    for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        axes = v.get_metadata("axes")
        assert len(axes) == len(v.shape), path
        assert all(a in dict(sharding.RULES) for a in axes), path


def test_init_sharded_places_each_parameter_by_rule():
    mesh = sharding.make_mesh(2, 2, 2)
    model = sharding.init_sharded(lambda: Qwen3(CFG, rngs=nnx.Rngs(0)), mesh)
    ref = Qwen3(CFG, rngs=nnx.Rngs(0))
    assert model.layers.self_attn.q_proj.kernel[...].sharding.spec == P(None, "fsdp", "tensor", None)
    assert model.lm_head.weight[...].sharding.spec == P("tensor", "fsdp")
    assert model.norm.weight[...].sharding.spec == P(None)
    for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(ref))):
        np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), atol=1e-6, err_msg=str(p))
    per_device = sharding.bytes_per_device(nnx.state(model), mesh)
    total = sum(x.nbytes for x in jax.tree.leaves(nnx.state(ref)))
    assert total / 4 <= per_device < total / 2


def test_forward_and_grad_on_2x2x2_mesh_equal_single_device():
    ref = Qwen3(CFG, rngs=nnx.Rngs(0))
    mesh = sharding.make_mesh(2, 2, 2)
    model = sharding.init_sharded(lambda: Qwen3(CFG, rngs=nnx.Rngs(0)), mesh)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 128, (4, 16)), jnp.int32)
    seg = jnp.asarray(np.repeat([[1] * 10 + [2] * 6], 4, axis=0), jnp.int32)

    def loss(m, ids, seg):
        logits = m(ids, segment_ids=seg)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), ids[:, 1:, None], -1))

    step = nnx.jit(nnx.value_and_grad(loss))
    want_l, want_g = step(ref, ids, seg)
    with sharding.use_mesh(mesh):
        ids_s = jax.device_put(ids, sharding.named_sharding(("batch", "seq"), ids.shape))
        got_l, got_g = step(model, ids_s, seg)
        logits = nnx.jit(lambda m, x: m(x))(model, ids_s)
    assert logits.sharding.spec[0] == ("data", "fsdp")
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref(ids)), atol=1e-5, rtol=0)
    np.testing.assert_allclose(float(got_l), float(want_l), atol=1e-6, rtol=0)
    for (p, a), (_, b) in zip(nnx.to_flat_state(got_g), nnx.to_flat_state(want_g)):
        np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), atol=1e-6, err_msg=str(p))


def test_shard_model_moves_an_existing_model_by_rule():
    mesh = sharding.make_mesh(2, 2, 2)
    model = Qwen3(CFG, rngs=nnx.Rngs(0))
    before = np.asarray(model.layers.mlp.down_proj.kernel[...])
    sharding.shard_model(model, mesh)
    k = model.layers.mlp.down_proj.kernel[...]
    assert k.sharding.spec == P(None, "tensor", "fsdp")
    np.testing.assert_array_equal(np.asarray(k), before)


def test_constrain_is_identity_without_a_mesh():
    x = jnp.ones((2, 3))
    assert sharding.constrain(x, ("batch", "seq")) is x
    assert sharding.current_mesh() is None


def test_greedy_decode_on_2x2x2_mesh_equals_single_device():
    from models.decode import Decoder

    ref = Qwen3(CFG, rngs=nnx.Rngs(0))
    mesh = sharding.make_mesh(2, 2, 2)
    model = sharding.init_sharded(lambda: Qwen3(CFG, rngs=nnx.Rngs(0)), mesh)
    ids = jnp.asarray(np.random.RandomState(1).randint(1, 128, (4, 6)), jnp.int32)
    mask = jnp.ones_like(ids).at[0, :2].set(0)
    want = Decoder(ref).generate(ids, mask, max_new_tokens=6)["tokens"]
    with sharding.use_mesh(mesh):
        dec = Decoder(model)
        cache = dec.init_cache(4, 12)
        assert cache.layers.k.sharding.spec[1] == ("data", "fsdp")
        got = dec.generate(ids, mask, max_new_tokens=6)["tokens"]
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
