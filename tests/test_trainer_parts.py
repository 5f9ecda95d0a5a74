"""Trainer stages one by one: task stream, rollout rows, reward terms, reward pipeline, metrics."""

import dataclasses
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from engines import DecoderEngine
from jaxrl import advantages as A
from jaxrl import batching, losses
from jaxrl import metrics as M
from jaxrl import rewards as R
from jaxrl import tasks as T
from jaxrl.rollout import Completion, SamplingParams
from models.qwen3 import Qwen3, Qwen3Config
from reward.schema import AssertTests, Task
from reward.score import Score

EXAMPLES = "reward/examples/tasks.jsonl"


def _task(i, clean=False):
    code = f"def f():\n    return {i}\n"
    return Task(f"t{i}", f"b{i % 3}", "p", code, code if clean else code.replace(str(i), str(i + 1)),
                AssertTests("assert True\n"))


class CharTokenizer:
    """A byte-level stand-in tokenizer for model-level tests (ids < 64)."""

    pad_id, stop_ids, family = 0, (1,), "qwen3"

    def encode(self, text):
        return [2 + (ord(c) % 60) for c in text]

    def decode(self, ids):
        return "".join(chr(97 + i % 26) for i in ids)

    def render_chat(self, messages, enable_thinking=True):
        return "".join(m["content"] for m in messages)[:40]


def test_task_stream_order_resume_and_host_slices():
    tasks = [_task(i) for i in range(7)]
    tok = CharTokenizer()
    a = T.TaskStream(tasks, 4, 3, tok, "minimal")
    ids = [[r.task.task_id for r in next(a)] for _ in range(5)]
    assert all(len(b) == 4 for b in ids)
    first_epoch = [t for b in ids for t in b][:7]
    assert sorted(first_epoch) == sorted(t.task_id for t in tasks)  # an epoch is a permutation
    b = T.TaskStream(tasks, 4, 3, tok, "minimal")
    assert [[r.task.task_id for r in next(b)] for _ in range(5)] == ids  # the seed fixes the order
    c = T.TaskStream(tasks, 4, 3, tok, "minimal")
    next(c), next(c)
    d = T.TaskStream(tasks, 4, 3, tok, "minimal")
    d.set_state(json.loads(json.dumps(c.get_state())))
    assert [[r.task.task_id for r in next(d)] for _ in range(3)] == ids[2:]
    halves = [T.TaskStream(tasks, 4, 3, tok, "minimal", i, 2) for i in range(2)]
    for want in ids:
        got = [r.task.task_id for h in halves for r in next(h)]
        assert got == want
    assert T.TaskStream(tasks, 4, 4, tok, "minimal").get_state() == {"next_index": 0}
    with pytest.raises(T.DataError, match="does not split over 3 hosts"):
        T.TaskStream(tasks, 4, 0, tok, "minimal", 0, 3)


def test_clean_rows_share_and_one_per_base_problem():
    tasks = [_task(i) for i in range(9)]
    mixed = T.with_clean_rows(tasks, 0.25, seed=0)
    clean = [t for t in mixed if t.is_clean]
    assert len(clean) == 3 and len({t.base_id for t in clean}) == 3  # round(1/3 · 9), 3 base problems
    assert all(t.buggy_code == t.solution for t in clean)
    assert T.with_clean_rows(tasks, 0.0, 0) == tasks


def test_missing_and_malformed_task_files(tmp_path):
    with pytest.raises(T.DataError, match="data.train: no such file"):
        T.read_tasks(str(tmp_path / "nope.jsonl"), "train")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": 1}\n')
    with pytest.raises(T.DataError, match="data.val: "):
        T.read_tasks(str(bad), "val")
    assert len(T.read_tasks(EXAMPLES, "train", 2)) == 2


def _completion(ids, lps, forced=None):
    return Completion(tuple(ids), tuple(lps), "stop", "", None, "", tuple(forced or [False] * len(ids)))


def test_rollout_rows_layout():
    rows = batching.rollout_rows([[5, 6, 7], [8]], [[_completion([9, 10], [-0.5, -0.25])],
                                                    [_completion([11, 12, 13], [-1, -2, 0], [False, False, True])]],
                                 prompt_len=4, max_tokens=4, pad_id=0)
    np.testing.assert_array_equal(rows["tokens"], [[0, 5, 6, 7, 9, 10, 0, 0], [0, 0, 0, 8, 11, 12, 13, 0]])
    np.testing.assert_array_equal(rows["segment_ids"], [[0, 1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1, 0]])
    np.testing.assert_array_equal(rows["loss_mask"], [[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1, 0, 0]])
    np.testing.assert_array_equal(rows["old_logp"][0, 4:6], [-0.5, -0.25])
    with pytest.raises(ValueError, match="exceeds the batch's prompt length"):
        batching.rollout_rows([[1] * 5], [[_completion([2], [0.0])]], 4, 4, 0)


def test_trainer_logprobs_on_the_rows_match_the_sampler():
    """The review's trap: with segment ids the update sees the sampler's context (gap ~1e-6);
    attending to the left padding instead moves the log-probs by orders of magnitude more."""
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0)
    model = Qwen3(cfg, rngs=nnx.Rngs(0), remat=False)
    engine = DecoderEngine(model, CharTokenizer())
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    groups = engine.generate(prompts, SamplingParams(n=2, max_tokens=12, temperature=1.0, seed=1,
                                                     thinking_budget=None))
    rows = batching.rollout_rows(prompts, groups, prompt_len=8, max_tokens=12, pad_id=0)
    tokens = jnp.asarray(rows["tokens"])
    mask = rows["loss_mask"] > 0
    assert mask.sum() > 20
    logp_seg, _ = losses.logprobs_from_logits(model(tokens, segment_ids=jnp.asarray(rows["segment_ids"])), tokens)
    logp_pad, _ = losses.logprobs_from_logits(model(tokens), tokens)
    gap_seg = np.abs(np.asarray(logp_seg) - rows["old_logp"])[mask].max()
    gap_pad = np.abs(np.asarray(logp_pad) - rows["old_logp"])[mask].max()
    assert gap_seg < 1e-5
    assert gap_pad > 100 * max(gap_seg, 1e-7)


def _score(unit, f1, lines, valid=True):
    return Score(task_id="t", valid=valid, unit=unit, precision=None, recall=None, f1=f1,
                 edited_lines=lines if valid else None, faults=1, faults_fixed=0, noop=False, damage=None,
                 reward=0.0)


def test_terms_and_weights_per_algorithm():
    from jaxrl import algorithms as AL

    buggy = Task("t", "b", "p", "a = 1\nb = 2\nc = 3\n", "a = 1\nb = 3\nc = 3\n", AssertTests("assert True\n"))
    clean = Task("c", "b", "p", "a = 1\n", "a = 1\n", AssertTests("assert True\n"))
    s = _score(1, 0.5, 2)
    invalid = _score(0, None, None, valid=False)

    def values(name, score, task, lam=1 / 3):
        return AL.resolve(name, None, None, None, {}, lam).term_values(score, task)

    assert values("precisecoder", s, buggy) == (1.0, 0.5) and AL.parts("precisecoder", None, None, 0.25)[1] == (0.75, 0.25)
    assert values("grpo_f1sum", invalid, buggy) == (0.0, 0.0)
    for name in ("grpo", "drgrpo", "rloo"):
        assert values(name, s, buggy) == (1.0,) and AL.parts(name, None, None, 1 / 3)[1] == (1.0,)
    assert values("ea_grpo", s, buggy) == (1.0, 2.0)
    assert values("grpo_clean_rows", invalid, buggy) == (0.0, 3.0, 0.0)  # invalid: ℓ = non-blank lines of C
    assert values("grpo_clean_rows", s, clean) == (1.0, 2.0, 1.0)
    # the other registered terms, each a pure function of the score row
    row = Score(task_id="t", valid=True, unit=0, precision=0.5, recall=0.25, f1=0.3, edited_lines=4, faults=1,
                faults_fixed=0, noop=False, damage=None, reward=0.0)
    got = {t: AL.get_term(t)(row, buggy) for t in ("precision", "recall", "gated_recall", "lines", "noop")}
    assert got == {"precision": 0.5, "recall": 0.25, "gated_recall": 0.0, "lines": -4.0, "noop": 0.0}
    assert AL.get_term("gated_recall")(dataclasses.replace(row, unit=1), buggy) == 0.25


def test_reward_pipeline_equals_sequential_scoring():
    """The threaded Grain map over one shared fleet gives exactly the scores of one sequential call,
    and leaves the process's absl flags as they were (a library must not parse them)."""
    from absl import flags

    from reward.fleet import Fleet
    from reward.sandbox import Limits
    from reward.schema import load_predictions, load_tasks
    from reward.score import score_predictions

    tasks = {t.task_id: t for t in load_tasks(EXAMPLES)}
    preds = load_predictions("reward/examples/predictions.jsonl")
    pairs = [(tasks[p.task_id], p) for p in preds] * 3
    parsed = flags.FLAGS.is_parsed()
    with Fleet(workers=2, cache=False) as fleet:
        pipeline = R.RewardPipeline(fleet, 1 / 3, 1, Limits(), threads=4)
        piped = pipeline(pairs)
        pipeline.close()
        want = score_predictions(pairs, fleet.run, lam=1 / 3, epsilon=1, limits=Limits())
    assert flags.FLAGS.is_parsed() == parsed
    assert [s.to_json() | {"runs": 0} for s in piped] == [s.to_json() | {"runs": 0} for s in want]


def test_rollout_metrics_and_writer(tmp_path):
    scores = [_score(1, 1.0, 1), _score(0, 0.0, 3), _score(0, None, None, valid=False)]
    comps = [_completion([1, 2, 99, 3], [0] * 4), _completion([1, 2], [0] * 2), _completion([4], [0])]
    cols = M.rollout_columns(scores, comps, [True, True, True], think_end_id=99)
    m = M.rollout_metrics(cols, np.asarray([[1, 1.0], [0, 0.0], [0, 0.0]]), ("unit", "f1"), group_size=3)
    assert m["rollout/pass"] == pytest.approx(1 / 3) and m["rollout/edited_lines"] == 2.0
    assert m["rollout/edited_lines_pass"] == 1.0  # the passing rollout's line, not the failing one's 3
    assert (m["groups/all_pass"], m["groups/all_fail"], m["groups/mixed"]) == (0.0, 0.0, 1.0)
    assert m["reward/unverifiable"] == 0.0
    assert m["rollout/thinking_tokens"] == pytest.approx((3 + 2 + 1) / 3)
    assert m["rollout/valid"] == pytest.approx(2 / 3) and m["reward/unit"] == pytest.approx(1 / 3)
    w = M.MetricsWriter(tmp_path, tensorboard=True)
    for step in (1, 2, 3):
        w.write(step, {"rollout/pass": step / 10, "val/pass": math.nan})
    w.close()
    with open(w.path, "a") as f:
        f.write('{"step": 4, "torn')  # a kill mid-line
    assert [r["step"] for r in M.read_metrics(w.path)] == [1, 2, 3]
    assert M.read_metrics(w.path)[0]["val/pass"] is None
    M.MetricsWriter(tmp_path, tensorboard=False, resume_step=2).close()  # a resume from step 2
    assert [r["step"] for r in M.read_metrics(w.path)] == [1, 2]
    assert any((tmp_path / "tensorboard").iterdir())
    M.plot_curves(M.read_metrics(w.path), tmp_path / "curves.png", ("unit", "f1"))
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_group_composition_passing_lines_and_unverifiable_count():
    """Two groups of two: one all-pass, one mixed (over every rollout); `reward/unverifiable` counts
    score rows whose `status` is "unverifiable", and the `rollout/*` means leave them out."""
    rows = [_score(1, 1.0, 2), _score(1, 0.5, 4), _score(1, 1.0, 6), _score(0, 0.0, 30)]
    rows = [dataclasses.replace(r, status=st) for r, st in zip(rows, ("scored", "unverifiable", "scored", "unverifiable"))]
    comps = [_completion([1, 2], [0, 0])] * 4
    m = M.rollout_metrics(M.rollout_columns(rows, comps, [True] * 4, think_end_id=99), np.zeros((4, 1)), ("unit",),
                          group_size=2)
    assert m["rollout/edited_lines_pass"] == 4.0 and m["rollout/edited_lines"] == 4.0
    assert (m["groups/all_pass"], m["groups/all_fail"], m["groups/mixed"]) == (0.5, 0.0, 0.5)
    assert m["reward/unverifiable"] == 2.0
    all_fail = M.group_composition(np.zeros((3, 4)))
    assert all_fail == {"groups/all_pass": 0.0, "groups/all_fail": 1.0, "groups/mixed": 0.0}


def test_undivided_mesh_axes_are_reported():
    from models import sharding as msh

    cfg = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=4, rope_theta=1e4)
    _, params = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)[:2]
    found = msh.undivided(params, msh.make_mesh(1, 2, 4), msh.RULES)
    assert len(found) == 2 and all("kv_heads, size 2" in f and "['tensor']" in f for f in found)
    assert msh.undivided(params, msh.make_mesh(1, 4, 2), msh.RULES) == []


def test_hosts_initialize_joins_only_when_asked(monkeypatch):
    import jax

    from jaxrl import hosts

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(jax.config, "update", lambda *a: None)
    hosts.initialize()
    assert calls == []  # one process: nothing to join
    hosts.initialize(auto=True)  # --distributed: JAX detects the hosts (Cloud TPU, SLURM)
    assert calls[-1]["coordinator_address"] is None and calls[-1]["num_processes"] is None
    hosts.initialize("127.0.0.1:8476", 4, 2)
    assert calls[-1]["coordinator_address"] == "127.0.0.1:8476" and calls[-1]["process_id"] == 2
