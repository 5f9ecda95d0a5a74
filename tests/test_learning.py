"""The loop's plumbing learns: a reward a tiny model can learn (emit one given token) rises.

Sampling (`DecoderEngine`), rollout rows, GRPO advantages by name and the jitted train step
are the trainer's own pieces; a wrong gradient sign, a misaligned log-prob or a lost
advantage makes the reward fall or stay flat instead.
"""

import jax
import numpy as np
from flax import nnx

from engines import DecoderEngine
from jaxrl import advantages as A
from jaxrl import batching
from jaxrl import train_step as ts
from jaxrl.rollout import SamplingParams
from models import sharding as msh
from models.qwen3 import Qwen3, Qwen3Config

TARGET = 7


class Tok:
    pad_id, stop_ids = 0, (1,)

    def decode(self, ids):
        return ""


def test_reward_for_one_token_rises():
    cfg = Qwen3Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0)
    mesh = msh.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    model = Qwen3(cfg, rngs=nnx.Rngs(0), remat=False)
    step_cfg = ts.TrainStepConfig(optimizer=ts.OptimizerConfig(learning_rate=1e-2, weight_decay=0.0),
                                  logp_from=8)
    tx = ts.make_optimizer(step_cfg.optimizer)
    state, graphdef, rest = ts.init_train_state(model, tx, mesh)
    engine = DecoderEngine(nnx.merge(graphdef, state.params, rest), Tok())
    prompts = [list(np.random.default_rng(i).integers(2, 32, 3 + i)) for i in range(4)]
    g, max_tokens = 8, 4
    adv_cfg = A.AdvantageConfig("grpo", (1.0,))
    step = None
    history = []
    for i in range(30):
        groups = engine.generate(prompts, SamplingParams(n=g, max_tokens=max_tokens, seed=i, thinking_budget=None))
        reward = np.asarray([[sum(t == TARGET for t in c.token_ids) / max_tokens for c in grp] for grp in groups],
                            np.float32)
        history.append(float(reward.mean()))
        adv = np.asarray(A.compute_advantages(adv_cfg, reward[..., None])).reshape(-1)
        batch = batching.make_batch(batching.rollout_rows(prompts, groups, 8, max_tokens, 0), adv)
        if step is None:
            abstract = jax.eval_shape(lambda x: x, (state, batch))
            step = ts.jit_train_step(graphdef, rest, tx, step_cfg, mesh, *abstract)
        state, _ = step(state, batch)
        engine.update_weights(nnx.merge(graphdef, state.params, rest), step=i + 1)
    first, last = np.mean(history[:5]), np.mean(history[-5:])
    assert first < 0.15, history
    assert last > 0.5 and last > 3 * first, history
