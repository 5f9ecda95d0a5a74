"""`precisecoder eval --agent --model` end to end: the jax engine on a tiny random Qwen3 with the real tokenizer.

A random model solves nothing; what this shows is that the loop runs with the
embedded engine: every turn sampled with its own budget, the retry message
sent back, and the unchanged file scored.
"""

from __future__ import annotations

import json

from eval_fakes import TASKS
from hf_qwen3 import make_hf

from jaxrl import cli, prompts
from reward.schema import write_tasks


def test_agent_eval_with_the_jax_engine(tmp_path):
    model_dir = tmp_path / "tiny_qwen3"
    make_hf(model_dir, vocab_size=151936, hidden_size=32, intermediate_size=48, head_dim=16)
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, [TASKS[0], TASKS[3]])  # one buggy, one clean task
    out = tmp_path / "run"
    assert cli.main(["eval", "--agent", "--turns", "2", "--tasks", str(tasks), "--model", str(model_dir),
                     "--dtype", "float32", "--thinking-budget", "3", "--max-tokens", "5",
                     "--clean-thinking-budget", "3", "--samples", "2", "--out", str(out), "--workers", "2",
                     "--no-progress"]) == 0
    episodes = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    assert [(e["task_id"], e["sample"]) for e in episodes] == [(t.task_id, k) for t in (TASKS[0], TASKS[3])
                                                               for k in range(2)]
    for e in episodes:
        assert e["ended_by"] == "turns" and e["turns_used"] == 2 and e["no_valid_call"]
        assert [t["observation"] for t in e["turns"]] == [prompts.agent_retry()] * 2
        assert all(t["completion_tokens"] <= 5 and t["call"] is None for t in e["turns"])
    assert episodes[0]["turns"][0]["text"] != episodes[1]["turns"][0]["text"]  # the two samples of a task differ
    scores = [json.loads(x) for x in (out / "scores.jsonl").read_text().splitlines()]
    assert [s["unit"] for s in scores] == [0, 0, 1, 1] and [s["noop"] for s in scores[2:]] == [True, True]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["engine"] == "jax" and summary["agent"]["no_valid_call"] == 1.0
    assert summary["agent"]["turns_used"] == 2.0 and summary["agent"]["submitted"] == 0.0
