"""`precisecoder transfer` against a recording fake OpenAI server: the exact request bodies of each splice mode
for hand-made donor traces, and `transfer compare`'s Tables 4/8 on hand-made summaries."""

from __future__ import annotations

import json

import pytest
from eval_fakes import TASKS
from fake_openai import FakeOpenAI

from jaxrl import cli, prompts
from jaxrl.eval.evaluate import batch_seed
from jaxrl.eval.protocol import EvalSettings
from jaxrl.studies import transfer
from models.tokenizer import load_tokenizer
from reward.schema import write_tasks

FENCE = "```"
DONOR_SETTINGS = EvalSettings(thinking_budget=8, max_tokens=20, clean_thinking_budget=12)
TRACES = {t.task_id: f"The donor reads {t.task_id} closely.\nOnly one line is wrong." for t in TASKS}
TRACES["ident#clean"] = None  # a donor sample without a think block: an empty trace


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3_5")


@pytest.fixture
def donor(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, TASKS)
    d = tmp_path / "donor"
    d.mkdir()
    summary = {"model": {"name": "donor-rl"}, "settings": DONOR_SETTINGS.to_json(), "task_set": str(tasks),
               "buggy": {}}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "predictions.jsonl").write_text("".join(
        json.dumps({"task_id": t.task_id, "sample": 0, "thinking": TRACES[t.task_id]}) + "\n" for t in TASKS))
    return d


def answers(prefix: str) -> dict[str, str]:
    return {t.prompt: f"{prefix}{FENCE}python\n{t.solution}{FENCE}" for t in TASKS}


def run(server, donor, out, mode, *extra) -> int:
    return cli.main(["transfer", "--donor", str(donor), "--engine", "openai", "--base-url", server.base_url,
                     "--model-name", server.model, "--tokenizer", "qwen3_5", "--mode", mode, "--out", str(out),
                     "--workers", "2", "--no-progress", *extra])


def body(prompt, max_tokens: int, task_id: str) -> dict:
    return {"model": "fake-model", "n": 1, "temperature": DONOR_SETTINGS.temperature, "top_p": 1.0,
            "max_tokens": max_tokens,
            "seed": batch_seed(0, task_id), "prompt": prompt, "logprobs": 1}


def first_bodies(server) -> list[dict]:
    return [b for path, b in server.requests if path == "/v1/completions" and isinstance(b["prompt"], list)]


def test_at_once_closes_the_donor_block_and_leaves_the_answer_room(tok, donor, tmp_path):
    out = tmp_path / "at-once"
    with FakeOpenAI(answers(""), decode=tok.decode) as server:
        assert run(server, donor, out, "at-once") == 0
    sent = sorted(first_bodies(server), key=lambda b: tok.decode(b["prompt"]))
    want = []
    for t in TASKS:
        trace = TRACES[t.task_id] or ""
        text = tok.render_chat(prompts.messages("minimal", t.prompt, t.buggy_code))
        assert text.endswith("<think>\n")
        want.append(body(tok.encode(f"{text}{trace}\n</think>\n\n"), 12, t.task_id))  # room 20 − 8
    assert sent == sorted(want, key=lambda b: tok.decode(b["prompt"]))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["transfer"] == {"donor": str(donor.resolve()), "donor_name": "donor-rl", "mode": "at-once",
                                   "control": False, "without_trace": 1}
    assert summary["buggy"]["pass"]["value"] == 1.0  # the fake answers every task with its solution
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert all(p["think_opened"] is False and p["thinking"] is None for p in preds)
    assert json.loads((out / "transfer.json").read_text())["mode"] == "at-once"


def test_continue_leaves_the_block_open_for_n_more_tokens(tok, donor, tmp_path):
    table = answers("and so the fix is clear.\n</think>\n\n")
    table["Return the sum of the list."] = "still thinking"  # hits the budget: the engine closes the block
    with FakeOpenAI(table, decode=tok.decode) as server:
        assert run(server, donor, tmp_path / "c3", "continue:3", "--control") == 0
    sent = first_bodies(server)
    for t in TASKS:
        text = tok.render_chat(prompts.messages("minimal", t.prompt, t.buggy_code))
        want = body(tok.encode(f"{text}{TRACES[t.task_id] or ''}\n"), 3, t.task_id)  # the first request stops at N
        assert want in sent
    forced = [b for path, b in server.requests if isinstance(b.get("prompt"), str)]
    assert len(forced) == 1 and forced[0]["prompt"].endswith("still thinking\n</think>\n\n")
    assert forced[0]["max_tokens"] == 3 + 12 - len(tok.encode("still thinking")) - len(tok.encode("\n</think>\n\n"))
    summary = json.loads((tmp_path / "c3" / "summary.json").read_text())
    assert summary["transfer"]["control"] is True and summary["settings"]["thinking_budget"] == 3
    preds = {p["task_id"]: p for p in map(json.loads, (tmp_path / "c3" / "predictions.jsonl").read_text().splitlines())}
    assert preds["g#b0"]["budget_hit"] is True and all(p["think_opened"] for p in preds.values())


def test_user_turn_appends_the_trace_to_the_user_message(tok, donor, tmp_path):
    with FakeOpenAI(answers("my own thought\n</think>\n\n"), decode=tok.decode) as server:
        assert run(server, donor, tmp_path / "ut", "user-turn") == 0
        sent = first_bodies(server)
        assert run(server, donor, tmp_path / "chat", "user-turn", "--api", "chat") == 0
    chats = [b for path, b in server.requests if path == "/v1/chat/completions"]
    for t in TASKS:
        messages = prompts.messages("minimal", t.prompt, t.buggy_code)
        messages[-1]["content"] += f"\n\n{transfer.USER_TURN_HEADER}\n\n{TRACES[t.task_id] or ''}"
        text = tok.render_chat(messages)
        assert body(tok.encode(text), 12 if t.is_clean else 8, t.task_id) in sent  # the donor's own budgets
        assert any(b["messages"] == messages for b in chats)


def test_sglang_receives_the_splice_as_token_ids_in_the_qwen3_template(donor, tmp_path):
    from fake_servers import FakeSGLang

    server = FakeSGLang(p_eos=0.2)  # reports model_type qwen3, whose template does not open the think block
    try:
        assert cli.main(["transfer", "--donor", str(donor), "--engine", "sglang", "--url", server.url,
                         "--mode", "at-once", "--out", str(tmp_path / "sg"), "--workers", "2", "--no-progress"]) == 0
        sent = [ids for method, path, body in server.requests if path == "/generate" for ids in body["input_ids"]]
    finally:
        server.close()
    qwen3 = load_tokenizer("qwen3")
    want = set()
    for t in TASKS:
        text = qwen3.render_chat(prompts.messages("minimal", t.prompt, t.buggy_code))
        assert text.endswith("<|im_start|>assistant\n")
        want.add(f"{text}<think>\n{TRACES[t.task_id] or ''}\n</think>\n\n")
    assert {qwen3.decode(ids) for ids in sent} == want


def test_a_chat_api_cannot_prefill_and_bad_modes_are_usage_errors(tok, donor, tmp_path, capsys):
    with FakeOpenAI(answers("")) as server:
        assert run(server, donor, tmp_path / "x", "at-once", "--api", "chat") == 2
        assert "use --mode user-turn or --api completions" in capsys.readouterr().err
        assert run(server, donor, tmp_path / "x", "continue:0") == 2
        assert capsys.readouterr().err.strip() == ("error: --mode must be at-once, continue:N (N >= 1) or "
                                                   "user-turn, got 'continue:0'")
        assert run(server, tmp_path / "nowhere", tmp_path / "x", "at-once") == 2
        assert server.requests == []


def _summary(tmp_path, name, values, transfer_info=None):
    d = tmp_path / name
    d.mkdir()
    cols = dict(zip(("pass", "precision", "recall", "f1", "lines"), values))
    summary = {"model": {"name": name}, "buggy": {k: {"value": v, "ci": [v, v]} for k, v in cols.items()}}
    if transfer_info:
        summary["transfer"] = transfer_info
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_compare_prints_the_deltas_and_the_share_of_the_gain_recovered(tmp_path, capsys):
    alone = _summary(tmp_path, "receiver", (0.40, 0.20, 0.50, 0.30, 3.00))
    base = _summary(tmp_path, "base", (0.50, 0.30, 0.60, 0.40, 2.50))
    trained = _summary(tmp_path, "trained", (0.60, 0.50, 0.70, 0.55, 1.50))
    info = {"donor": str(trained), "donor_name": "trained", "mode": "at-once", "control": False, "without_trace": 0}
    with_donor = _summary(tmp_path, "with", (0.45, 0.30, 0.55, 0.36, 2.50), info)
    control = _summary(tmp_path, "ctl", (0.42, 0.22, 0.50, 0.31, 2.90),
                       {**info, "donor": str(base), "donor_name": "base", "control": True})
    longer = _summary(tmp_path, "longer", (0.50, 0.35, 0.60, 0.40, 2.00), {**info, "mode": "continue:64"})
    assert cli.main(["transfer", "compare", str(with_donor), str(control), str(longer), "--alone", str(alone),
                     "--base", str(base), "--out", str(tmp_path / "t.md"), "--plot", str(tmp_path / "f13.png")]) == 0
    table = capsys.readouterr().out
    assert "| receiver | – | alone | 40.0 | 20.0 | 50.0 | 30.0 | 3.00 |" in table
    assert "| trained | at-once | +5.0 | +10.0 | +5.0 | +6.0 | -0.50 |" in table
    # recovered = Δ / (trained − base): precision 0.10 / 0.20, lines −0.5 / −1.0; the control against the same gap
    assert "| trained | at-once | 50% | 50% | 50% | 40% | 50% |" in table
    assert "| base (control) | at-once | 20% | 10% | 0% | 7% | 10% |" in table
    assert "| trained | continue:64 | +10.0 | +15.0 |" in table
    assert (tmp_path / "t.md").read_text() in table and (tmp_path / "f13.png").stat().st_size > 1000


@pytest.mark.slow
def test_transfer_with_the_jax_engine_on_a_tiny_random_model(tmp_path):
    """The real embedded sampler (about 2 min on 2 cores): a donor eval, then each splice mode on its traces."""
    import torch
    from test_eval_jax import TINY
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    model = tmp_path / "tiny"
    torch.manual_seed(0)
    Qwen3_5ForCausalLM(Qwen3_5TextConfig(**TINY)).save_pretrained(model)
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, TASKS[:2])
    common = ["--model", str(model), "--dtype", "float32", "--workers", "2", "--no-progress"]
    assert cli.main(["eval", "--tasks", str(tasks), "--out", str(tmp_path / "donor"), "--thinking-budget", "6",
                     "--max-tokens", "12", *common]) == 0
    for mode in ("at-once", "continue:3", "user-turn"):
        out = tmp_path / mode.replace(":", "")
        assert cli.main(["transfer", "--donor", str(tmp_path / "donor"), "--mode", mode, "--out", str(out),
                         *common]) == 0
        preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
        assert [p["task_id"] for p in preds] == [t.task_id for t in TASKS[:2]]
        if mode == "at-once":  # the think block is closed in the prompt: only answer tokens, 12 − 6 of them
            assert all(not p["think_opened"] and p["completion_tokens"] <= 6 for p in preds)
        elif mode == "continue:3":  # 3 more thinking tokens, then the engine closes the block
            assert all(p["think_opened"] and p["completion_tokens"] <= 9 for p in preds)
        else:
            assert all(p["think_opened"] and p["completion_tokens"] <= 12 for p in preds)
