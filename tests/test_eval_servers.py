"""`precisecoder eval` against fake OpenAI-compatible and SGLang servers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from eval_fakes import ANSWERS, TASKS
from fake_openai import FakeOpenAI

from jaxrl import cli, prompts
from models.tokenizer import load_tokenizer
from reward.schema import write_tasks

FENCE = "```"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3_5")


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, TASKS)
    return path


def eval_args(server, tasks_file, out, *extra) -> list[str]:
    return ["eval", "--tasks", str(tasks_file), "--engine", "openai", "--base-url", server.base_url,
            "--model-name", server.model, "--out", str(out), "--workers", "2", "--no-progress", *extra]


def lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_completions_api_scores_equal_precisecoder_score(tok, tasks_file, tmp_path):
    out = tmp_path / "run"
    with FakeOpenAI(ANSWERS, decode=tok.decode, fail_first=2) as server:  # two 429s first: retried
        assert cli.main(eval_args(server, tasks_file, out, "--api", "completions", "--tokenizer", "qwen3_5")) == 0
        bodies = [b for path, b in server.requests if path == "/v1/completions"]
    first = [b for b in bodies if isinstance(b["prompt"], list)]
    want = {tok.render_chat(prompts.messages("minimal", t.prompt, t.buggy_code)): t for t in TASKS}
    assert len(first) == len(TASKS) + 2  # the two refused requests were sent again
    assert {tok.decode(b["prompt"]) for b in first} == set(want)
    for b in first:  # the first request of a thinking prompt stops at the task's thinking budget
        task = want[tok.decode(b["prompt"])]
        assert b["max_tokens"] == (16384 if task.is_clean else 4096) and b["model"] == "fake-model"

    preds = lines(out / "predictions.jsonl")
    assert [p["task_id"] for p in preds] == [t.task_id for t in TASKS]
    assert preds[0]["response"] == ANSWERS[TASKS[0].prompt] and preds[0]["think_opened"] is True
    assert cli.main(["score", "--tasks", str(tasks_file), "--predictions", str(out / "predictions.jsonl"),
                     "--out", str(tmp_path / "scored.jsonl"), "--workers", "2", "--no-progress"]) == 0
    assert (tmp_path / "scored.jsonl").read_text() == (out / "scores.jsonl").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == {"name": "fake-model", "engine": "openai", "api": "completions",
                                     "base_url": server.base_url, "served_model": "fake-model",
                                     "tokenizer": "qwen3_5"}
    assert summary["settings"]["temperature"] == 0.6  # eval's default, the paper's (B.6)
    assert summary["buggy"]["pass"]["value"] == pytest.approx(1 / 3)


def test_chat_api_keeps_reasoning_apart_and_sends_the_abstain_prompt_verbatim(tok, tasks_file, tmp_path):
    out = tmp_path / "run"
    with FakeOpenAI(ANSWERS) as server:
        assert cli.main(eval_args(server, tasks_file, out, "--prompt", "abstain")) == 0
        bodies = [b for path, b in server.requests if path == "/v1/chat/completions"]
    assert sorted(json.dumps(b["messages"]) for b in bodies) == \
        sorted(json.dumps(prompts.messages("abstain", t.prompt, t.buggy_code)) for t in TASKS)
    assert "Code:\n\n```python\n" in bodies[0]["messages"][1]["content"]
    add = lines(out / "predictions.jsonl")[0]
    assert add["thinking"] == "Minus should be plus." and add["think_opened"] is False
    assert add["response"] == f"<think>\nMinus should be plus.\n</think>\n\n{FENCE}python\ndef add(a, b):\n" \
                              f"    return a + b\n{FENCE}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["prompt"] == "abstain" and summary["buggy"]["pass"]["value"] == pytest.approx(1 / 3)


def test_refine_candidates_reach_the_server_verbatim(tok, tasks_file, tmp_path):
    candidates = tmp_path / "candidates.jsonl"
    cands = {t.task_id: f"{t.solution}# candidate {t.task_id}\n" for t in TASKS}
    candidates.write_text("".join(json.dumps({"task_id": k, "code": v}) + "\n" for k, v in cands.items()))
    with FakeOpenAI(ANSWERS, decode=tok.decode) as server:
        for api in ("chat", "completions"):
            assert cli.main(eval_args(server, tasks_file, tmp_path / api, "--prompt", "refine", "--candidates",
                                      str(candidates), "--api", api)) == 0
        chat = [b["messages"] for path, b in server.requests if path == "/v1/chat/completions"]
        raw = [tok.decode(b["prompt"]) for path, b in server.requests
               if path == "/v1/completions" and isinstance(b["prompt"], list)]
    want = [prompts.messages("refine", t.prompt, t.buggy_code, cands[t.task_id]) for t in TASKS]
    assert sorted(map(json.dumps, chat)) == sorted(map(json.dumps, want))
    assert sorted(raw) == sorted(tok.render_chat(m) for m in want)
    assert "Candidate fix:\n\n```python\n" in want[0][1]["content"]


KILL = """
import sys
from jaxrl import cli
sys.exit(cli.main({args!r}))
"""


def test_cli_resumes_after_sigkill(tok, tasks_file, tmp_path):
    out = tmp_path / "run"
    with FakeOpenAI(ANSWERS, delay_s=1.0) as server:
        args = eval_args(server, tasks_file, out, "--concurrency", "1")
        proc = subprocess.Popen([sys.executable, "-c", KILL.format(args=args)], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None:
                if (out / "predictions.jsonl").exists() and len(lines(out / "predictions.jsonl")) >= 2:
                    break
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kept = {p["task_id"] for p in lines(out / "predictions.jsonl")}
        assert 2 <= len(kept) < len(TASKS) and not (out / "summary.json").exists()
        before = len(server.requests)
        server.delay_s = 0.0
        assert cli.main(args) == 0
        resent = [b for _, b in server.requests[before:]]
    assert len(resent) == len(TASKS) - len(kept)
    kept_prompts = [t.prompt for t in TASKS if t.task_id in kept]
    assert not any(p in b["messages"][1]["content"] for p in kept_prompts for b in resent)
    assert [p["task_id"] for p in lines(out / "predictions.jsonl")] == [t.task_id for t in TASKS]


def test_a_server_that_refuses_is_one_error_line(tasks_file, tmp_path, capsys):
    with FakeOpenAI({}) as server:  # no table entry: HTTP 400 for every prompt
        code = cli.main(eval_args(server, tasks_file, tmp_path / "run"))
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("error: sampling failed") and "rerun the same command" in err and err.count("\n") == 1


def test_sglang_engine_sends_the_rendered_prompt_as_token_ids(tasks_file, tmp_path):
    from fake_servers import FakeSGLang

    server = FakeSGLang(p_eos=0.2)
    try:
        out = tmp_path / "run"
        assert cli.main(["eval", "--tasks", str(tasks_file), "--engine", "sglang", "--url", server.url,
                         "--out", str(out), "--workers", "2", "--no-progress", "--samples", "2"]) == 0
        sent = [ids for method, path, body in server.requests if path == "/generate" for ids in body["input_ids"]]
    finally:
        server.close()
    tok = load_tokenizer("qwen3")  # the fake reports model_type qwen3
    want = {tok.render_chat(prompts.messages("minimal", t.prompt, t.buggy_code)) for t in TASKS}
    assert {tok.decode(ids) for ids in sent} == want
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["name"] == "fake" and summary["model"]["tokenizer"] == "qwen3"
    assert summary["samples"] == 10 and summary["invalid"]["share"] == 1.0  # random tokens hold no program
