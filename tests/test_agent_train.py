"""Agentic RL (`rollout.agent`): config errors, episodes through the trainer's stages, the tiny agentic
config end to end with the jax engine, and its exact resume after SIGKILL.

The scripted engine below plays real tool calls (half of each group fixes the file, the other
half only views it, then every episode submits), so groups are mixed and the gradient is not
zero; the jax-engine runs show that the sampler's log-probs over the concatenated episode are
the trainer's.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_train_e2e import finish, records, train as train_process, wait_for

from jaxrl import cli, hosts, prompts
from jaxrl.agent.rollout import engine_sampler, run_episodes
from jaxrl.agent.tokens import episode_rows
from jaxrl.agent.train import AGENT_COLUMNS, agent_columns, summary_completion
from jaxrl.config import load_config
from jaxrl.metrics import read_metrics
from jaxrl.rollout import Completion, Engine, SamplingParams
from jaxrl.rewards import RewardPipeline
from jaxrl.tasks import read_tasks
from jaxrl.trainer import train
from jaxrl.validate import validate
from models.tokenizer import load_tokenizer
from reward.fleet import Fleet
from reward.sandbox import Limits
from reward.schema import Prediction
from reward.score import score_predictions

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = str(REPO / "reward" / "examples" / "tasks.jsonl")
TASKS = read_tasks(EXAMPLES, "train")
TOK = load_tokenizer("qwen3")
ARCH = dict(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)
LOGPROB = -1.0


def overrides(out, **extra):
    """tiny_agent on the example tasks with a one-layer model, no validation: 2 steps, saved each step."""
    base = {"data.build": None, "data.train": EXAMPLES, "model.architecture": ARCH, "rollout.group_size": 2,
            "rollout.agent.max_context": 1024, "reward.workers": 2, "validation.val_tasks": 0,
            "validation.gt_debug_tasks": 0, "run.steps": 2, "run.save_every": 1, "run.best_metric": None,
            "run.out": str(out), "run.progress": False, "run.tensorboard": False}
    return [f"{k}={json.dumps(v)}" for k, v in {**base, **extra}.items()]


def without_times(out):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "share/"))}
            for r in read_metrics(Path(out) / "metrics.jsonl")]


class FixOrLook(Engine):
    """Turn 1: even rows of the batch replace the whole buggy file by the solution, odd rows view it;
    turn 2: every episode submits. Log-probs are a constant (the layout, not a policy)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def reply(self, prompt_ids, row):
        text = self.tokenizer.decode(list(prompt_ids))
        if text.count("<|im_start|>assistant") > 1:
            return "Done.\n</think>\n\n<function=submit>\n</function>"
        if row % 2:
            return "Look.\n</think>\n\n<function=view>\n</function>"
        task = next(t for t in TASKS if t.prompt in text)
        return (f"Fix.\n</think>\n\n<function=str_replace_editor>\n<parameter=old_str>{task.buggy_code}"
                f"</parameter>\n<parameter=new_str>{task.solution}</parameter>\n</function>")

    def generate(self, prompts, params):
        out = []
        for row, p in enumerate(prompts):
            answer = self.reply(p, row)
            ids = self.tokenizer.encode(answer) + [self.tokenizer.im_end_id]
            out.append([Completion(tuple(ids), (LOGPROB,) * len(ids), "stop", answer, answer.split("</think>")[0],
                                   answer.split("</think>")[-1].strip())])
        return out

    def update_weights(self, model, *, step):
        pass


def test_config_errors_are_one_line_with_exit_2(tmp_path, capsys):
    cfg = tmp_path / "agent.yaml"
    for sets, message in [
        (["rollout.agent.turns=0"], "rollout.agent.turns must be >= 1, got 0"),
        (["rollout.agent.max_context=32"], "rollout.agent.max_context (32) must exceed rollout.max_tokens (32)"),
        (["rollout.agent.max_context=40000"], "rollout.agent.max_context=40000 exceeds the model's context of "
                                              "32768 tokens"),
        (["rollout.agent.max_context=400"], "rollout.agent.max_context=400: the longest first prompt (530 tokens)"),
        (["rollout.agent.tunrs=3"], "unknown key rollout.agent.tunrs"),
    ]:
        cfg.write_text(yaml.safe_dump({"base": "tiny_agent"}))
        args = ["train", "--config", str(cfg), "--out", str(tmp_path / "run")]
        args += [a for s in overrides(tmp_path / "run")[:2] + sets for a in ("--set", s)]
        assert cli.main(args) == 2, sets
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_context_budget_ends_an_episode_before_a_turn_that_might_not_fit():
    """With room for the prompt and one turn only, every episode stops after turn 1 (`context`), its row fits."""
    task = TASKS[0]
    first = len(TOK.encode(TOK.render_chat(prompts.agent_messages(task.prompt, task.buggy_code))))
    sp = SamplingParams(max_tokens=32)
    (r,) = run_episodes(engine_sampler(FixOrLook(TOK)), TOK, [(task, 0)], sp, turns=3, max_context=first + 32 + 5)
    assert r.episode.ended_by == "context" and len(r.episode.turns) == 1
    assert r.episode.file == task.solution  # the fix of turn 1 stays the prediction
    (free,) = run_episodes(engine_sampler(FixOrLook(TOK)), TOK, [(task, 0)], sp, turns=3)
    assert free.episode.ended_by == "submit" and len(free.episode.turns) == 2
    rows = episode_rows([free.segments], TOK.pad_id, 4096)
    c = summary_completion(free)
    assert rows["loss_mask"].sum() == len(c.token_ids) == sum(t.completion_tokens for t in free.episode.turns)
    np.testing.assert_allclose(rows["old_logp"][rows["loss_mask"] > 0], np.asarray(c.logprobs))
    assert agent_columns([r.episode, free.episode]).tolist() == [[1, 0, 0, 0, 1], [2, 1, 0, 0, 0]]
    assert len(AGENT_COLUMNS) == 5


def test_an_episode_keeps_calling_the_engine_while_another_host_still_runs(monkeypatch):
    """On several hosts a turn is a collective: a host whose episodes ended calls the engine with no
    prompts until every host's have ended."""
    calls = []
    engine = FixOrLook(TOK)
    sampler = engine_sampler(engine)
    monkeypatch.setattr(hosts, "gather_json", lambda running: [running, True])  # the other host never ends
    (r,) = run_episodes(lambda reqs, params: calls.append(len(reqs)) or sampler(reqs, params), TOK,
                        [(TASKS[0], 0)], SamplingParams(max_tokens=32), turns=4)
    assert r.episode.ended_by == "submit" and len(r.episode.turns) == 2
    assert calls == [1, 1, 0, 0]
    monkeypatch.setattr(hosts, "gather_json", lambda running: [running, False])
    calls.clear()
    run_episodes(lambda reqs, params: calls.append(len(reqs)) or sampler(reqs, params), TOK,
                 [(TASKS[0], 0)], SamplingParams(max_tokens=32), turns=4)
    assert calls == [1, 1]


def test_validation_of_an_agentic_run_scores_episodes_and_logs_the_agent_columns(tmp_path):
    """`rollout.agent` set: validation runs the tool loop (scripted: the even rows of a kind's turn-1 call
    fix the file, the odd rows view it, all submit at turn 2) and scores the final files."""
    cfg = load_config("tiny_agent", overrides(tmp_path / "run"))
    buggy = [t for t in TASKS if not t.is_clean]
    with Fleet(workers=2, cache=False) as fleet:
        pipeline = RewardPipeline(fleet, cfg.reward.lam, cfg.reward.epsilon, Limits(timeout_s=cfg.reward.timeout_s))
        metrics = validate(FixOrLook(TOK), TOK, pipeline, TASKS, cfg, seed=3)
        pipeline.close()
        files = [t.solution if i % 2 == 0 else t.buggy_code for i, t in enumerate(buggy)]
        want = score_predictions([(t, Prediction(t.task_id, code=f)) for t, f in zip(buggy, files)], fleet.run)
    assert [s.unit for s in want] == [1, 0, 1]  # the fixed files pass, the viewed ones stay buggy
    assert metrics["val/pass"] == pytest.approx(np.mean([s.unit for s in want]))
    assert metrics["val/f1"] == pytest.approx(np.mean([s.f1 for s in want]))
    assert metrics["gt_debug/noop"] == 1  # the clean task's "fix" replaces its code by itself
    for kind in ("val", "gt_debug"):
        assert {k: metrics[f"{kind}/agent/{k}"] for k in AGENT_COLUMNS} == {
            "turns_used": 2, "submitted": 1, "failed_edits": 0, "no_valid_call": 0, "out_of_context": 0}


@pytest.mark.slow  # 48 s of CPU, 220 s wall at load 36 on 2 cores: one agentic step and its compiled update
def test_episodes_train_through_every_stage(tmp_path):
    """Scripted episodes: the final file is scored (the fixing half passes), groups are mixed, the
    gradient is not zero, and the loss covers exactly the replies' tokens."""
    cfg = load_config("tiny_agent", overrides(tmp_path / "run", **{"run.steps": 1}))
    last = train(cfg, engine_factory=lambda cfg, model, tok, mesh, rules: FixOrLook(tok))
    (row,) = without_times(tmp_path / "run")
    assert row["agent/turns_used"] == 2 and row["agent/submitted"] == 1 and row["agent/failed_edits"] == 0
    assert row["agent/no_valid_call"] == 0 and row["agent/out_of_context"] == 0
    # Of the two tasks drawn, at least one is buggy (one of the four is clean): its fixing episode
    # passes, its viewing one fails.
    assert row["rollout/pass"] == 0.5 and row["groups/mixed"] >= 0.5 and last["update/grad_norm"] > 0
    assert row["update/tokens"] == row["rollout/response_tokens"] * 4  # 2 tasks × G=2, every reply token trained


@pytest.mark.slow  # 394 s at load 30 on 2 cores (62 s at load 13): two steps of the jax engine, 3 turns each
def test_tiny_agent_trains_with_the_jax_engine_and_the_trainer_sees_the_samplers_log_probs(tmp_path):
    """Also the final validation (one val and one GT Debug task) runs as episodes of the tool loop."""
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(line for line in Path(EXAMPLES).read_text().splitlines(keepends=True) if "#clean" in line))
    train(load_config("tiny_agent", overrides(tmp_path / "run", **{
        "data.val": EXAMPLES, "data.gt_debug": str(clean), "validation.val_tasks": 1,
        "validation.gt_debug_tasks": 1})))
    rows = without_times(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["update/logp_gap_max"] <= 1e-4  # recomputed over the concatenated episodes, same params
        assert r["agent/turns_used"] == 3 and r["agent/no_valid_call"] == 1  # a random model never calls a tool
        assert r["update/tokens"] == 4 * r["rollout/response_tokens"] > 0
    assert "val/pass" not in rows[0]
    for kind in ("val", "gt_debug"):  # noise: every one of the 3 turns is a retry turn
        assert rows[1][f"{kind}/agent/turns_used"] == 3 and rows[1][f"{kind}/agent/no_valid_call"] == 1
    assert rows[1]["val/pass"] == 0 and rows[1]["gt_debug/noop"] == 1  # the files are left as they were


@pytest.mark.slow  # 489 s at load 27 on 2 cores: three `precisecoder train` processes, 6 agentic steps in all
def test_a_tiny_agentic_run_resumes_after_sigkill_to_the_same_metrics(tmp_path):
    def config(name):
        path = tmp_path / f"{name}.yaml"
        data = {"base": "tiny_agent"}
        for s in overrides(tmp_path / name, **{"run.steps": 3, "run.save_every": 2}):
            key, value = s.split("=", 1)
            node = data
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = json.loads(value)
        path.write_text(yaml.safe_dump(data))
        return path

    finish(train_process("--config", config("full")))
    want = records(tmp_path / "full")
    assert [r["step"] for r in want] == [1, 2, 3]
    proc = train_process("--config", config("mid"))
    # killed in the middle of step 3 (step 2 is saved and recorded)
    assert wait_for(lambda: (tmp_path / "mid" / "metrics.jsonl").is_file()
                    and len((tmp_path / "mid" / "metrics.jsonl").read_text().splitlines()) >= 2, proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finish(train_process("--config", tmp_path / "mid.yaml", "--resume"))
    assert records(tmp_path / "mid") == want
