"""Orbax train checkpoints: round trip with RNG and Grain state, last N kept, restore onto
another mesh, and a process killed during a save leaving the previous checkpoint usable."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl import train_step as ts
from jaxrl.checkpoint import Checkpointer, abstract_with_shardings
from models import sharding as msh
from models.qwen3 import Qwen3, Qwen3Config

CFG = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=4, rope_theta=10000.0)
TX = ts.make_optimizer(ts.OptimizerConfig(learning_rate=1e-3))


def make_mesh(*shape):
    return msh.make_mesh(*shape, devices=jax.devices()[:int(np.prod(shape))])


def sharded_state(mesh_shape, seed=0):
    mesh = make_mesh(*mesh_shape)
    state, _, _ = ts.init_train_state(Qwen3(CFG, rngs=nnx.Rngs(seed)), TX, mesh)
    return state, mesh


def target_on(state_like, mesh):
    abstract = jax.eval_shape(lambda s: s, state_like)
    return abstract_with_shardings(abstract, ts.state_shardings(abstract, mesh))


def host(tree):
    return [np.array(x) for x in jax.tree.leaves(tree)]


def test_round_trip_onto_another_mesh_with_rng_and_grain_state(tmp_path):
    state, _ = sharded_state((8, 1, 1))
    # A non-trivial optimizer state: perturb the Adam moments and the step.
    state = state.replace(step=jnp.asarray(7, jnp.int32),
                          opt_state=jax.tree.map(lambda x: x + 0.5, state.opt_state))
    it = iter(grain.MapDataset.range(100).shuffle(seed=3).to_iter_dataset())
    consumed = [next(it) for _ in range(5)]
    key = jax.random.key(42)
    ckpt = Checkpointer(tmp_path, max_to_keep=2)
    ckpt.save(state, key, {"data": it.get_state(), "note": "x"})
    want_next = [next(it) for _ in range(5)]
    ckpt.wait()

    mesh_b = make_mesh(1, 4, 2)
    restored, rkey, extra = Checkpointer(tmp_path).restore(target_on(state, mesh_b))
    for a, b in zip(host(state), host(restored)):
        np.testing.assert_array_equal(a, b)
    assert int(restored.step) == 7
    assert np.array_equal(jax.random.key_data(rkey), jax.random.key_data(key))
    assert jax.random.normal(rkey).item() == jax.random.normal(key).item()
    assert extra["note"] == "x"
    want_sh = ts.state_shardings(jax.eval_shape(lambda s: s, state), mesh_b)
    for arr, sh in zip(jax.tree.leaves(restored), jax.tree.leaves(want_sh)):
        assert arr.sharding.is_equivalent_to(sh, arr.ndim)
    assert any(len(set(sh.spec) - {None}) == 2 for sh in jax.tree.leaves(want_sh))  # truly 2-D sharded

    it2 = iter(grain.MapDataset.range(100).shuffle(seed=3).to_iter_dataset())
    it2.set_state(extra["data"])
    assert [next(it2) for _ in range(5)] == want_next
    assert consumed != want_next


def test_restore_params_reads_the_parameters_alone_onto_another_mesh(tmp_path):
    state, _ = sharded_state((8, 1, 1))
    state = state.replace(step=jnp.asarray(3, jnp.int32))
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(state, jax.random.key(0))
    mesh_b = make_mesh(1, 4, 2)
    abstract = jax.eval_shape(lambda p: p, state.params)
    shardings = msh.state_shardings(abstract, mesh_b)
    params, step = ckpt.restore_params(abstract_with_shardings(abstract, shardings))
    assert step == 3
    for a, b in zip(host(state.params), host(params), strict=True):
        np.testing.assert_array_equal(a, b)
    for arr, sh in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
        assert arr.sharding.is_equivalent_to(sh, arr.ndim)
    with pytest.raises(FileNotFoundError, match="step 4"):
        ckpt.restore_params(abstract_with_shardings(abstract, shardings), 4)
    ckpt.close()


def test_keeps_last_n_and_rejects_a_saved_step(tmp_path):
    state, _ = sharded_state((1, 1, 1))
    ckpt = Checkpointer(tmp_path, max_to_keep=2)
    for step in range(1, 5):
        ckpt.save(state.replace(step=jnp.asarray(step, jnp.int32)), jax.random.key(step), {"step": step})
    ckpt.wait()
    assert ckpt.all_steps() == [3, 4]
    assert ckpt.latest_step() == 4
    _, _, extra = ckpt.restore(target_on(state, make_mesh(1, 1, 1)), step=3)
    assert extra["step"] == 3 and extra["hosts"] == [None] and extra["host"] is None
    with pytest.raises(ValueError, match="already saved"):
        ckpt.save(state.replace(step=jnp.asarray(4, jnp.int32)), jax.random.key(0))
    ckpt.close()
    with pytest.raises(FileNotFoundError):
        Checkpointer(tmp_path / "empty").restore(target_on(state, make_mesh(1, 1, 1)))


CHILD = textwrap.dedent("""
    import asyncio, sys
    import jax, jax.numpy as jnp
    from orbax.checkpoint._src.path import async_path
    from jaxrl import train_step as ts
    from jaxrl.checkpoint import Checkpointer

    rename = async_path.rename

    async def held_rename(src, dst):
        # Step 2 is fully written but not yet renamed into place: the parent kills us here,
        # whatever the machine's load (a kill timed by the clock could land before or after).
        if dst.name == "2":
            print("saving 2", flush=True)
            await asyncio.sleep(3600)
        return await rename(src, dst)

    async_path.rename = held_rename

    def state(step, value):
        params = {"w": jnp.full((64, 1024), value, jnp.float32)}
        return ts.TrainState(step=jnp.asarray(step, jnp.int32), params=params, opt_state=())

    ckpt = Checkpointer(sys.argv[1], max_to_keep=3)
    ckpt.save(state(1, 1.0), jax.random.key(1), {"step": 1})
    ckpt.wait()
    print("saved 1", flush=True)
    ckpt.save(state(2, 2.0), jax.random.key(2), {"step": 2})
    ckpt.wait()
    print("saved 2", flush=True)
""")


def test_kill_during_save_leaves_previous_checkpoint(tmp_path):
    """SIGKILL while step 2's directory is written but not renamed into place (Orbax's private
    rename is held in the child, so the kill lands there at any load)."""
    ckpt_dir = tmp_path / "ckpt"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(ckpt_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env,
                            cwd=pathlib.Path(__file__).parents[1])
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith("saving 2"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=600)
    assert lines == ["saved 1", "saving 2"], lines
    assert proc.returncode == -signal.SIGKILL
    leftovers = [p.name for p in ckpt_dir.iterdir() if p.name.startswith("2")]
    assert leftovers and all("tmp" in name for name in leftovers), leftovers  # killed mid-save

    mesh = make_mesh(1, 1, 1)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    target = ts.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32, sharding=rep),
                           params={"w": jax.ShapeDtypeStruct((64, 1024), jnp.float32, sharding=rep)},
                           opt_state=())
    ckpt = Checkpointer(ckpt_dir)
    assert ckpt.all_steps() == [1]
    state, key, extra = ckpt.restore(target)
    assert int(state.step) == 1 and extra["step"] == 1
    assert float(state.params["w"].min()) == float(state.params["w"].max()) == 1.0
    assert np.array_equal(jax.random.key_data(key), jax.random.key_data(jax.random.key(1)))
    # The interrupted step can be written again.
    ckpt.save(state.replace(step=jnp.asarray(2, jnp.int32)), key, {"step": 2})
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2]
