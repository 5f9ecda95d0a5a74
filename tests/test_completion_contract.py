"""The `Completion` contract: a completion ended by a stop token keeps it in `token_ids` and not in
`text` (the stop token is stripped in one place, `make_completion`). The `jax` engine's case is
tests/test_rollout_jax.py's stop test (its compiled programs are there); `openai` servers return
text without it and the engine adds none (tests/test_rollout_openai.py)."""

from pathlib import Path

from fake_servers import FakeSGLang

import engines  # noqa: F401  (registers test-scripted)
from jaxrl.demo.tokenizer import load_demo_tokenizer
from jaxrl.rollout import SamplingParams, make_engine
from jaxrl.rollout.http import RetryPolicy
from jaxrl.rollout.text import TokenSpec
from jaxrl.tasks import render
from reward.schema import load_tasks

TOKENIZER = load_demo_tokenizer()
TASKS = str(Path(__file__).resolve().parents[1] / "reward" / "examples" / "tasks.jsonl")


def assert_stopped_without_stop_text(c, stop_ids, decode):
    assert c.finish_reason == "stop" and c.token_ids[-1] in stop_ids
    assert c.text == decode(c.token_ids[:-1]) and not c.text.endswith(decode(c.token_ids[-1:]))


def test_scripted_engine():
    tasks = load_tasks(TASKS)
    engine = make_engine("test-scripted", model=None, tokenizer=TOKENIZER, tasks=TASKS, prompt="demo")
    groups = engine.generate([render(t, TOKENIZER, "demo").prompt_ids for t in tasks], SamplingParams(n=2))
    for c in (c for g in groups for c in g):
        assert_stopped_without_stop_text(c, TOKENIZER.stop_ids, TOKENIZER.decode)
        assert "<|im_end|>" not in c.text


def test_sglang_engine_on_the_fake_server():
    server = FakeSGLang(p_eos=0.5)
    try:
        words = type("Words", (), {"decode": staticmethod(lambda ids: "".join(f"<{i}>" for i in ids))})()
        engine = make_engine("sglang", urls=[server.url], tokenizer=words, retry=RetryPolicy(attempts=2, timeout=10),
                             tokens=TokenSpec(stop_ids=(2,), think_open=5, think_close=6, close_think=(7, 6, 8)))
        out = engine.generate([[1, 20, 30]], SamplingParams(n=8, max_tokens=12, thinking_budget=None, seed=3))
        stopped = [c for c in out[0] if c.finish_reason == "stop"]
        assert stopped, "p_eos=0.5 over 8 samples of 12 tokens: some stop"
        for c in stopped:
            assert_stopped_without_stop_text(c, (2,), words.decode)
            assert "<2>" not in c.text
        for c in out[0]:
            if c.finish_reason == "length":
                assert c.text == words.decode(c.token_ids)
    finally:
        server.close()
