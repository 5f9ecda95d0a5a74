"""Multi-turn token rows: a hand-built reference, the rollout's prompts, and sampler-vs-trainer log-probs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from eval_fakes import TASKS
from hf_qwen3 import make_hf

import models
from jaxrl import losses, prompts
from jaxrl import train_step as ts
from jaxrl.agent.rollout import engine_sampler, run_episodes
from jaxrl.agent.tokens import Segment, episode_row, episode_rows
from jaxrl.batching import make_batch
from jaxrl.rollout import Completion, Engine, SamplingParams, make_engine
from models.tokenizer import load_tokenizer

ADD = TASKS[0]


def test_rows_against_a_hand_built_reference():
    episode = [Segment((1, 2, 3)), Segment((4, 5), (-0.5, -1.5), True), Segment((6,)),
               Segment((7, 8, 9), (-0.25, 0.0, -2.0), True, (False, True, False))]
    tokens, mask, logp = episode_row(episode)
    assert tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert mask.tolist() == [0, 0, 0, 1, 1, 0, 1, 0, 1]  # prompt, observation and the forced token masked
    assert logp.tolist() == [0, 0, 0, -0.5, -1.5, 0, -0.25, 0, -2.0]
    rows = episode_rows([episode, [Segment((1, 2)), Segment((3,), (-1.0,), True)]], pad_id=0)
    assert rows["tokens"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 0, 0, 0, 0, 0, 0]]
    assert rows["segment_ids"].tolist() == [[1] * 9, [1, 1, 1] + [0] * 6]
    assert rows["loss_mask"].tolist() == [[0, 0, 0, 1, 1, 0, 1, 0, 1], [0, 0, 1] + [0] * 6]
    assert rows["old_logp"][1].tolist() == [0, 0, -1.0] + [0] * 6
    with pytest.raises(ValueError, match="exceeds the row length 4"):
        episode_rows([episode], pad_id=0, length=4)
    with pytest.raises(ValueError, match="one log-prob per token"):
        Segment((1, 2), (-1.0,), True)


class ScriptEngine(Engine):
    """Replies each turn with the next scripted text, encoded, ended by `<|im_end|>` unless `open_end`;
    records every prompt. Log-probs are made up (-0.1 per token): it shows the layout, not the values."""

    def __init__(self, tokenizer, script, open_end=()):
        self.tokenizer, self.script, self.open_end = tokenizer, list(script), set(open_end)
        self.prompts: list[list[int]] = []

    def generate(self, prompts_, params):
        out = []
        for p in prompts_:
            turn = len(self.prompts)
            self.prompts.append(list(p))
            ids = self.tokenizer.encode(self.script[turn])
            ids += [] if turn in self.open_end else [self.tokenizer.im_end_id]
            out.append([Completion(tuple(ids), (-0.1,) * len(ids), "length" if turn in self.open_end else "stop",
                                   self.tokenizer.decode(ids), None, self.script[turn].split("</think>")[-1])])
        return out

    def update_weights(self, model, *, step):
        raise NotImplementedError


def test_each_turns_prompt_is_the_row_so_far():
    tok = load_tokenizer("qwen3_5")
    replies = ["Hmm.\n</think>\n\nNo idea.", "Look.\n</think>\n\n<function=view>\n</function>",
               "Done.\n</think>\n\n<function=submit>\n</function>"]
    engine = ScriptEngine(tok, replies, open_end={1})
    (rollout,) = run_episodes(engine_sampler(engine), tok, [(ADD, 0)], SamplingParams(max_tokens=64))
    assert rollout.episode.ended_by == "submit" and len(rollout.episode.turns) == 3
    first = tok.encode(tok.render_chat(prompts.agent_messages(ADD.prompt, ADD.buggy_code)))
    retry = tok.encode(f"\n<|im_start|>user\n{prompts.agent_retry()}<|im_end|>\n<|im_start|>assistant\n<think>\n")
    view = tok.encode("<|im_end|>\n<|im_start|>user\n1 def add(a, b):\n2     return a - b<|im_end|>\n"
                      "<|im_start|>assistant\n<think>\n")  # the second reply did not close its turn
    r1, r2, r3 = (tok.encode(r) for r in replies)
    end = [tok.im_end_id]
    assert engine.prompts == [first, first + r1 + end + retry, first + r1 + end + retry + r2 + view]
    tokens, mask, logp = episode_row(rollout.segments)
    assert tokens.tolist() == first + r1 + end + retry + r2 + view + r3 + end
    want = [0] * len(first) + [1] * (len(r1) + 1) + [0] * len(retry) + [1] * len(r2) + [0] * len(view) \
        + [1] * (len(r3) + 1)
    assert mask.tolist() == want
    np.testing.assert_allclose(logp, np.asarray(want) * np.float32(-0.1))


def test_sampler_and_trainer_log_probs_agree_over_a_three_turn_episode(tmp_path):
    """The jax engine's log-probs of every policy token of a 3-turn episode equal those the train
    step's `policy_loss` recomputes over the concatenated rows (<= 1e-4): the row is the sampler's context."""
    tok = load_tokenizer("qwen3")
    make_hf(tmp_path, vocab_size=151936, hidden_size=32, intermediate_size=48, head_dim=16)
    model = models.from_pretrained(tmp_path)
    engine = make_engine("jax", model=model, tokenizer=tok)
    t = 0.9
    rollouts = run_episodes(engine_sampler(engine), tok, [(ADD, 0), (TASKS[1], 0)],
                            SamplingParams(temperature=t, max_tokens=6, thinking_budget=None, seed=3), turns=3)
    assert all(len(r.episode.turns) == 3 for r in rollouts)  # a random model never submits
    rows = episode_rows([r.segments for r in rollouts], pad_id=tok.pad_id)
    policy = sum(len(s.token_ids) for r in rollouts for s in r.segments if s.policy)
    assert rows["loss_mask"].sum() == policy == 2 * 3 * 6
    batch = jax.tree.map(jnp.asarray, make_batch(rows, np.ones(2, np.float32)))
    weights = losses.loss_weights(batch.loss_mask_BxT)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    _, metrics = ts.policy_loss(params, graphdef, rest, batch, weights, weights,
                                ts.LossConfig(temperature=t, logp_chunk=64))
    assert float(metrics["logp_gap_max"]) <= 1e-4
