"""`precisecoder eval --agent` against a fake OpenAI-compatible server replaying scripted replies."""

from __future__ import annotations

import json

import pytest
from eval_fakes import TASKS
from fake_openai import FakeOpenAI

from jaxrl import cli, prompts
from reward.fleet import Fleet
from reward.schema import Prediction, write_tasks
from reward.score import score_predictions

ADD, F, G, CLAMP, IDENT = TASKS
RETRY = prompts.agent_retry()


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<function={name}>\n{body}</function>"


def think(thought: str, answer: str) -> str:
    return f"{thought}\n</think>\n\n{answer}"


# One script per task (keyed by its prompt): reply i answers the conversation after i turns.
SCRIPT = {
    ADD.prompt: [think("Minus should be plus.", call("str_replace_editor", old_str="return a - b",
                                                     new_str="return a + b")),
                 think("Done.", call("submit"))],
    F.prompt: [think("Look first.", call("view", view_range="[2, 2]")),
               think("x is everywhere.", call("str_replace_editor", old_str="x", new_str="y")),
               think("Fix the first line.", "Sure:\n" + call("str_replace_editor", old_str="a = x - 1",
                                                              new_str="a = x + 1")),
               think("Write it out.", "```python\ndef f(x):\n    return x\n```"),
               think("Still thinking.", "I am not sure.")],
    G.prompt: [think("Just answer.", "```python\ndef g(xs):\n    return sum(xs)\n```")] * 5,
    CLAMP.prompt: [think("It is correct.", call("submit"))],
    IDENT.prompt: [think("Negate it.", call("str_replace_editor", old_str="return x", new_str="return -x")),
                   think("Done.", call("submit"))],
}
FILES = {  # the final file of each episode, by hand
    ADD.task_id: "def add(a, b):\n    return a + b\n",
    F.task_id: "def f(x):\n    a = x + 1\n    b = a * 2\n    c = b + 3\n    return c + 4\n",
    G.task_id: G.buggy_code,
    CLAMP.task_id: CLAMP.buggy_code,
    IDENT.task_id: "def ident(x):\n    return -x\n",
}


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, TASKS)
    return path


def agent_args(server, tasks_file, out, *extra) -> list[str]:
    return ["eval", "--agent", "--tasks", str(tasks_file), "--engine", "openai", "--base-url", server.base_url,
            "--model-name", server.model, "--out", str(out), "--workers", "2", "--no-progress", *extra]


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_agent_episodes_and_scores_equal_hand_computed_ones(tasks_file, tmp_path, api):
    from models.tokenizer import load_tokenizer

    out = tmp_path / "run"
    with FakeOpenAI(SCRIPT, decode=load_tokenizer("qwen3_5").decode) as server:
        assert cli.main(agent_args(server, tasks_file, out, "--api", api)) == 0
        requests = list(server.requests)
    episodes = {e["task_id"]: e for e in lines(out / "episodes.jsonl")}
    assert list(episodes) == [t.task_id for t in TASKS]

    add = episodes[ADD.task_id]
    assert (add["ended_by"], add["turns_used"], add["failed_edits"], add["no_valid_call"]) == ("submit", 2, 0, False)
    first, second = add["turns"]
    assert first["thinking"] == "Minus should be plus."
    assert first["text"] == ("<think>\n" if api == "chat" else "") + SCRIPT[ADD.prompt][0]
    assert first["call"] == {"name": "str_replace_editor", "params": {"old_str": "return a - b",
                                                                      "new_str": "return a + b"}}
    assert first["observation"] == "Edit applied. Lines 1-2 now read:\n1 def add(a, b):\n2     return a + b"
    assert first["file"] == FILES[ADD.task_id] and first["valid"] and not first["edit_failed"]
    assert second["call"] == {"name": "submit", "params": {}} and second["observation"] == ""

    f = episodes[F.task_id]
    assert (f["ended_by"], f["turns_used"], f["failed_edits"], f["no_valid_call"]) == ("turns", 5, 1, False)
    assert [t["observation"] for t in f["turns"]] == [
        "2     a = x - 1",
        "Edit failed: old_str was found 2 times; it must occur exactly once (include more surrounding lines).",
        "Edit applied. Lines 1-5 now read:\n1 def f(x):\n2     a = x + 1\n3     b = a * 2\n4     c = b + 3\n"
        "5     return c + 4",
        RETRY, RETRY]
    assert [t["call"] is None for t in f["turns"]] == [False, False, False, True, True]
    assert [t["file"] for t in f["turns"]] == [F.buggy_code, F.buggy_code] + [FILES[F.task_id]] * 3
    g = episodes[G.task_id]
    assert (g["ended_by"], g["turns_used"], g["no_valid_call"], g["file"]) == ("turns", 5, True, G.buggy_code)
    assert [e["turns_used"] for e in episodes.values()] == [2, 5, 5, 1, 2]
    assert {tid: e["file"] for tid, e in episodes.items()} == FILES

    # what the model saw: the retry message after a reply without a call, the observation after a call
    if api == "chat":
        last_f = [b["messages"] for p, b in requests if F.prompt in json.dumps(b["messages"])][-1]
        assert [m["role"] for m in last_f] == ["system", "user"] + ["assistant", "user"] * 4
        assert last_f[-1]["content"] == RETRY and last_f[2]["content"] == call("view", view_range="[2, 2]")
        assert last_f[3]["content"] == "2     a = x - 1"
    # every turn has its own budget: thinking 4096 (clean 16384) with token prompts, 6144 in all through chat
    assert {b["max_tokens"] for _, b in requests} == ({6144, 18432} if api == "chat" else {4096, 16384})

    # the scores are the scorer's on the hand-made final files; the hand-known columns by hand
    with Fleet(workers=2, cache=False) as fleet:
        want = score_predictions([(t, Prediction(t.task_id, code=FILES[t.task_id])) for t in TASKS], fleet.run)
    assert lines(out / "scores.jsonl") == [json.loads(json.dumps(s.to_json())) for s in want]
    scores = {s["task_id"]: s for s in lines(out / "scores.jsonl")}
    assert (scores[ADD.task_id]["unit"], scores[ADD.task_id]["f1"]) == (1, 1.0)
    assert scores[F.task_id]["unit"] == 0 and scores[G.task_id]["unit"] == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["prompt"] == "agent"
    assert summary["agent"] == {"turns": 5, "run_tests": False, "prompt": "agent", "episodes": 5, "turns_used": 3.0,
                                "submitted": pytest.approx(0.6), "failed_edits": pytest.approx(0.2),
                                "no_valid_call": pytest.approx(0.2)}
    assert summary["buggy"]["pass"]["value"] == pytest.approx(1 / 3)
    assert summary["clean"]["noop"]["value"] == pytest.approx(0.5) and summary["clean"]["damage"]["value"] == 0.5
    report = (out / "report.md").read_text()
    assert "## Agent" in report and "| 3.00 | 60.0 | 0.20 | 20.0 |" in report

    # predictions.jsonl holds the final files: `precisecoder score` gives the same scores
    preds = lines(out / "predictions.jsonl")
    assert [(p["task_id"], p["code"]) for p in preds] == list(FILES.items())
    assert cli.main(["score", "--tasks", str(tasks_file), "--predictions", str(out / "predictions.jsonl"),
                     "--out", str(tmp_path / "scored.jsonl"), "--workers", "2", "--no-progress"]) == 0
    assert (tmp_path / "scored.jsonl").read_text() == (out / "scores.jsonl").read_text()


def test_a_rerun_keeps_the_episodes_and_other_settings_are_refused(tasks_file, tmp_path, capsys):
    out = tmp_path / "run"
    with FakeOpenAI(SCRIPT) as server:
        assert cli.main(agent_args(server, tasks_file, out)) == 0
        sent = len(server.requests)
        episodes = (out / "episodes.jsonl").read_text()
        assert cli.main(agent_args(server, tasks_file, out)) == 0
        assert len(server.requests) == sent  # nothing sampled again
        assert (out / "episodes.jsonl").read_text() == episodes
        assert cli.main(agent_args(server, tasks_file, out, "--turns", "3")) == 2  # refused before the model loads
    assert "holds a run with other agent" in capsys.readouterr().err


def test_turn_budget_and_usage_errors(tasks_file, tmp_path, capsys):
    out = tmp_path / "run"
    with FakeOpenAI(SCRIPT) as server:
        assert cli.main(agent_args(server, tasks_file, out, "--turns", "1")) == 0
    assert [e["turns_used"] for e in lines(out / "episodes.jsonl")] == [1] * 5
    summary = json.loads((out / "summary.json").read_text())
    assert summary["agent"]["submitted"] == pytest.approx(0.2)  # only clamp submits on turn 1
    for extra, message in ((["--turns", "2"], "--turns and --agent-tests are for --agent"),
                           (["--agent-tests"], "--turns and --agent-tests are for --agent")):
        args = [a for a in agent_args(server, tasks_file, tmp_path / "x", *extra) if a != "--agent"]
        assert cli.main(args) == 2
        assert message in capsys.readouterr().err
    assert cli.main([*agent_args(server, tasks_file, tmp_path / "x"), "--prompt", "abstain"]) == 2
    assert "--agent has its own prompt" in capsys.readouterr().err


def test_run_tests_through_the_cli_gives_counts_only(tmp_path):
    script = {ADD.prompt: [think("Check.", call("run_tests")),
                           think("Fix.", call("str_replace_editor", old_str="a - b", new_str="a + b")),
                           think("Again.", call("run_tests")), think("Done.", call("submit"))]}
    out = tmp_path / "run"
    with FakeOpenAI(script) as server:
        tasks = tmp_path / "add.jsonl"
        write_tasks(tasks, [ADD])
        assert cli.main(agent_args(server, tasks, out, "--agent-tests")) == 0
        system = server.requests[0][1]["messages"][0]["content"]
    assert "run_tests — run the task's hidden unit tests" in system
    (episode,) = lines(out / "episodes.jsonl")
    assert [t["observation"] for t in episode["turns"]][::2] == ["Tests: 0 passed, 1 failed.",
                                                                 "Tests: 1 passed, 0 failed."]
    assert episode["ended_by"] == "submit"
    assert json.loads((out / "summary.json").read_text())["agent"]["run_tests"] is True


def test_sglang_engine_gets_the_episode_so_far_as_token_ids(tasks_file, tmp_path):
    from fake_servers import FakeSGLang

    from models.tokenizer import load_tokenizer

    server = FakeSGLang(p_eos=0.0)
    try:
        out = tmp_path / "run"
        assert cli.main(["eval", "--agent", "--turns", "3", "--tasks", str(tasks_file), "--engine", "sglang",
                         "--url", server.url, "--max-tokens", "6", "--thinking-budget", "none",
                         "--out", str(out), "--workers", "2", "--no-progress"]) == 0
        sent = [ids for _, path, body in server.requests if path == "/generate" for ids in body["input_ids"]]
    finally:
        server.close()
    tok = load_tokenizer("qwen3")  # the fake reports model_type qwen3
    retry = tok.encode(f"<|im_end|>\n<|im_start|>user\n{prompts.agent_retry()}<|im_end|>\n<|im_start|>assistant\n")
    first = {tok.render_chat(prompts.agent_messages(t.prompt, t.buggy_code)): t for t in TASKS}
    openings = [ids for ids in sent if tok.decode(ids) in first]
    assert len(sent) == 3 * len(TASKS) and {tok.decode(ids) for ids in openings} == set(first)
    for ids in sent:  # a later turn's prompt: an earlier one + its reply (<= 6 sampled ids) + the retry message
        if ids not in openings:
            earlier = [p for p in sent if len(p) < len(ids) and ids[:len(p)] == p]
            assert earlier and ids[-len(retry):] == retry
            assert 0 < len(ids) - len(max(earlier, key=len)) - len(retry) <= 6
    episodes = lines(out / "episodes.jsonl")
    assert [e["turns_used"] for e in episodes] == [3] * 5 and all(e["no_valid_call"] for e in episodes)
