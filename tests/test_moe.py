"""The mixture-of-experts layer: routing, dropless grouped matmul, capacity, expert parallelism, replay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models import moe, sharding
from models.qwen3_moe import Qwen3Moe, Qwen3MoeConfig

E, K, D, I = 8, 2, 16, 12


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    gate, up = (jnp.asarray(rng.standard_normal((E, D, I)) * 0.3, jnp.float32) for _ in range(2))
    down = jnp.asarray(rng.standard_normal((E, I, D)) * 0.3, jnp.float32)
    return gate, up, down


@jax.jit
def dense_reference(x, experts, weights, gate, up, down, keep=None):
    """Every token through every expert, then a mask of the (token, choice) pairs routed (and kept)."""
    h = jax.nn.silu(jnp.einsum("nd,edi->nei", x, gate)) * jnp.einsum("nd,edi->nei", x, up)
    every = jnp.einsum("nei,eid->ned", h, down)
    w = weights if keep is None else jnp.where(keep, weights, 0.0)
    combine = (jax.nn.one_hot(experts, E) * w[..., None]).sum(axis=1)  # [N, E]
    return jnp.einsum("ne,ned->nd", combine, every)


_ffn = jax.jit(moe.expert_ffn, static_argnames=("first_expert", "capacity"))


def _routing(n, seed=1):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.standard_normal((n, E)) * 2, jnp.float32)
    logits = logits.at[:, 6].add(-100.0)  # expert 6 gets no token at all
    return moe.route(logits, K, True, jnp.float32)


def test_dropless_grouped_matmul_equals_dense_reference():
    x = jnp.asarray(np.random.default_rng(2).standard_normal((37, D)), jnp.float32)
    weights, experts = _routing(37)
    assert not (experts == 6).any()
    got = _ffn(x, experts, weights, *_weights())
    np.testing.assert_allclose(np.asarray(got), np.asarray(dense_reference(x, experts, weights, *_weights())),
                               atol=1e-5, rtol=0)
    # a shard holding experts 4..7 computes exactly their part
    g, u, d = _weights()
    part = _ffn(x, experts, weights, g[4:], u[4:], d[4:], first_expert=4)
    keep = experts >= 4
    np.testing.assert_allclose(np.asarray(part), np.asarray(dense_reference(x, experts, weights, g, u, d, keep)),
                               atol=1e-5, rtol=0)


def test_capacity_drops_the_latest_tokens_of_an_overfull_expert():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((20, D)), jnp.float32)
    weights, experts = _routing(20, seed=4)
    cap = moe.capacity_for(20, K, E, 1.0)
    assert cap == 5 and moe.capacity_for(20, K, E, None) is None
    # expected: per expert, only the first `cap` pairs in (token, choice) order survive
    flat = np.asarray(experts).reshape(-1)
    seen: dict[int, int] = {}
    keep = np.zeros(flat.shape, bool)
    for i, e in enumerate(flat):
        keep[i] = seen.get(e, 0) < cap
        seen[e] = seen.get(e, 0) + 1
    assert not keep.all()  # some expert is over capacity
    got = _ffn(x, experts, weights, *_weights(), capacity=cap)
    want = dense_reference(x, experts, weights, *_weights(), keep=jnp.asarray(keep.reshape(20, K)))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)


def test_route_renormalizes_and_breaks_ties_toward_the_lower_index():
    probs = jnp.log(jnp.asarray([[0.3, 0.3, 0.3, 0.1], [0.1, 0.2, 0.2, 0.5]]))
    w, e = moe.route(probs, 2, False, jnp.float32)
    np.testing.assert_array_equal(np.asarray(e), [[0, 1], [3, 1]])
    np.testing.assert_allclose(np.asarray(w), [[0.3, 0.3], [0.5, 0.2]], rtol=1e-6)
    w, _ = moe.route(probs, 2, True, jnp.float32)
    np.testing.assert_allclose(np.asarray(w.sum(-1)), 1.0, rtol=1e-6)
    # replaying a call's own choices gives its weights exactly
    np.testing.assert_array_equal(np.asarray(moe.replay_weights(probs, e, True, jnp.float32)), np.asarray(w))


def test_load_balancing_loss_is_one_when_uniform_and_larger_when_skewed():
    n = 64
    lb = jax.jit(moe.load_balancing_loss, static_argnums=2)
    uniform = jnp.zeros((n, E))
    experts = jnp.asarray(np.stack([np.arange(n) % E, (np.arange(n) + 1) % E], 1))
    assert abs(float(lb(uniform, experts, E)) - 1.0) < 1e-6
    skewed = uniform.at[:, 0].set(5.0)
    assert float(lb(skewed, jnp.zeros((n, K), jnp.int32), E)) > 3.0
    # masked tokens do not count
    mask = jnp.arange(n) < n // 2
    assert abs(float(lb(uniform.at[n // 2:, 0].set(9.0), experts, E, mask)) - 1.0) < 1e-6


def _tiny_model(remat=True, **kw):
    cfg = Qwen3MoeConfig(128, 32, 48, 3, 4, 2, 8, 1e4, num_experts=E, num_experts_per_tok=K,
                         moe_intermediate_size=I, norm_topk_prob=True, **kw)
    model = Qwen3Moe(cfg, rngs=nnx.Rngs(0), remat=remat)
    for run in model.runs:  # sharper routers than the 0.02 init, so choices are not near-ties
        if run.mlp.__class__.__name__ == "SparseMoE":
            run.mlp.gate.kernel[...] = run.mlp.gate.kernel[...] * 40
    return model


def _loss(model, ids):
    logp = jax.nn.log_softmax(model(ids))
    return -jnp.mean(jnp.take_along_axis(logp[:, :-1], ids[:, 1:, None], axis=-1))


def test_dispatch_split_4_ways_equals_one_device_with_gradients():
    """On data 2 x expert 4, the expert-parallel feed-forward and its gradients (tokens, routing weights,
    experts) equal the single-shard computation."""
    x = jnp.asarray(np.random.default_rng(7).standard_normal((24, D)), jnp.float32)
    weights, experts = _routing(24, seed=8)

    def f(x, weights, *w):
        return jnp.sum(jnp.sin(moe.dispatch(x, experts, weights, *w)))

    grad = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3, 4)))
    want_value, want = grad(x, weights, *_weights())
    with sharding.use_mesh(sharding.make_mesh(data=2, fsdp=1, expert=4)):
        value, got = grad(x, weights, *_weights())
        assert "expert" in jax.jit(f).lower(x, weights, *_weights()).as_text()
    assert abs(float(value) - float(want_value)) <= 1e-5
    for a, b in zip(want, got):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=0)


@pytest.mark.slow  # about 60 s: compiles the whole model's gradient on 8 devices
def test_loss_and_gradients_with_experts_split_4_ways_equal_one_device():
    """8 CPU devices as fsdp 2 x expert 4 (2 experts per shard): loss and gradients equal 1 device's."""
    ids = jnp.asarray(np.random.default_rng(5).integers(0, 128, (4, 11)), jnp.int32)
    model = _tiny_model()
    step = nnx.jit(nnx.value_and_grad(_loss))
    want_loss, want_grads = step(model, ids)

    mesh = sharding.make_mesh(fsdp=2, expert=4)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "expert": 4, "tensor": 1}
    sharded = sharding.shard_model(_tiny_model(), mesh)
    gate = sharded.runs[0].mlp.experts.gate_proj[...]
    assert gate.sharding.spec[1] == "expert" and gate.addressable_shards[0].data.shape[1] == E // 4
    with sharding.use_mesh(mesh):
        got_loss, got_grads = nnx.jit(nnx.value_and_grad(_loss))(sharded, ids)
    assert abs(float(got_loss) - float(want_loss)) <= 1e-5
    for (path, a), (_, b) in zip(nnx.to_flat_state(want_grads), nnx.to_flat_state(got_grads)):
        np.testing.assert_allclose(np.asarray(b[...]), np.asarray(a[...]), atol=1e-5, rtol=0, err_msg=str(path))


def test_routing_replay_gives_the_recorded_forward_exactly():
    """Replaying a forward's expert choices reproduces its logits bit for bit, and imposes them when params move."""
    model = _tiny_model(remat=False, decoder_sparse_step=2)
    ids = jnp.asarray(np.random.default_rng(6).integers(0, 128, (2, 9)), jnp.int32)
    logits, (experts, router_logits) = model(ids, return_routing=True)
    assert experts.shape == (2, 9, 1, K) and router_logits.shape == (2, 9, 1, E)
    replayed, (same, _) = model(ids, routing=experts, return_routing=True)
    np.testing.assert_array_equal(np.asarray(replayed), np.asarray(logits))
    np.testing.assert_array_equal(np.asarray(same), np.asarray(experts))
    # after an update that changes routing, replay keeps the old choices
    for run in model.runs:
        if run.mlp.__class__.__name__ == "SparseMoE":
            run.mlp.gate.kernel[...] = -run.mlp.gate.kernel[...]
    _, (moved, _) = model(ids, return_routing=True)
    assert (np.asarray(moved) != np.asarray(experts)).any()
    _, (kept, _) = model(ids, routing=experts, return_routing=True)
    np.testing.assert_array_equal(np.asarray(kept), np.asarray(experts))


def _rl_batch():
    from jaxrl import train_step as ts

    rng = np.random.default_rng(0)
    mask = (np.arange(12) >= 4).astype(np.float32)[None].repeat(8, 0)
    return ts.Batch(jnp.asarray(rng.integers(0, 128, (8, 12)), jnp.int32), jnp.asarray(mask),
                    jnp.asarray(np.where(mask > 0, -np.log(128), 0.0), jnp.float32),
                    jnp.asarray(rng.standard_normal((8, 1)), jnp.float32))


def _rl_step(mesh, aux_coef):
    from jaxrl import train_step as ts
    from jaxrl.config import LossConfig

    batch = _rl_batch()
    step_cfg = ts.TrainStepConfig(loss=LossConfig(router_aux_coef=aux_coef))
    tx = ts.make_optimizer(step_cfg.optimizer)
    state, graphdef, rest = ts.init_train_state(_tiny_model(), tx, mesh)
    abstract = lambda x: jax.eval_shape(lambda y: y, x)  # noqa: E731
    step = ts.jit_train_step(graphdef, rest, tx, step_cfg, mesh, abstract(state), abstract(batch))
    new, metrics = step(state, batch)
    return jax.tree.leaves(jax.tree.map(np.asarray, new.params)), jax.tree.map(float, metrics)


@pytest.mark.slow  # 25-55 s: compiles two RL updates
def test_router_aux_loss_is_off_by_default_and_adds_its_weighted_term():
    one = sharding.make_mesh(devices=jax.devices()[:1])
    _, plain = _rl_step(one, 0.0)
    _, with_aux = _rl_step(one, 0.5)
    assert "router_aux" not in plain and with_aux["router_aux"] >= 1.0  # 1.0 only when perfectly balanced
    assert abs(with_aux["loss"] - plain["loss"] - 0.5 * with_aux["router_aux"]) <= 1e-5


@pytest.mark.slow  # about 60 s: compiles the RL update on 1 and on 8 devices
def test_rl_update_with_experts_split_4_ways_equals_one_device():
    """jaxrl's sharded PPO step (with the router loss on) on fsdp 2 x expert 4 gives one device's update."""
    want, want_m = _rl_step(sharding.make_mesh(devices=jax.devices()[:1]), 0.1)
    got, got_m = _rl_step(sharding.make_mesh(fsdp=2, expert=4), 0.1)
    assert abs(got_m["loss"] - want_m["loss"]) <= 1e-5 and abs(got_m["grad_norm"] - want_m["grad_norm"]) <= 1e-5
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
