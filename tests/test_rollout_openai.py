"""The `openai` engine against a local fake OpenAI-compatible server."""

import math

import pytest
from fake_servers import FakeOpenAI

from jaxrl.rollout import SamplingParams, make_engine
from jaxrl.rollout.http import RetryPolicy
from jaxrl.rollout.openai_engine import OpenAIEngine
from models.tokenizer import QwenTokenizer, _load_or_build

FAST = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05, timeout=10)
NO_BUDGET = SamplingParams(n=2, max_tokens=6, thinking_budget=None)


@pytest.fixture
def server(request):
    s = FakeOpenAI(**getattr(request, "param", {}))
    yield s
    s.close()


@pytest.fixture(scope="module")
def tok():
    return QwenTokenizer("qwen3_5", _load_or_build("qwen3_5"))


@pytest.mark.parametrize("server", [{"rate_limited": 3, "key": "sk-test"}], indirect=True)
def test_raw_completions_with_429s_and_the_key_from_the_environment(server, tok, monkeypatch):
    monkeypatch.setenv("EVAL_KEY", "sk-test")
    engine = make_engine("openai", base_url=server.url + "/v1", model="m", tokenizer=tok, api_key_env="EVAL_KEY",
                         retry=FAST)
    prompt = tok.encode(tok.render_chat([{"role": "user", "content": "hi"}], enable_thinking=False))
    out = engine.generate([prompt], SamplingParams(n=2, max_tokens=6, top_k=5, thinking_budget=None))
    assert server.count == 4  # three 429s, then the answer
    body = server.requests[-1][2]
    assert body["prompt"] == prompt and (body["n"], body["max_tokens"], body["top_k"]) == (2, 6, 5)
    for c in out[0]:
        assert c.text == FakeOpenAI.words(6, "a") and c.finish_reason == "length"
        assert tok.decode(c.token_ids) == c.text and c.logprobs == (-0.5,) * 6 and c.thinking is None


@pytest.mark.parametrize("server", [{"rate_limited": 100}], indirect=True)
def test_endless_429s_give_up_with_a_clear_error(server):
    engine = OpenAIEngine(server.url + "/v1", "m", retry=FAST)
    with pytest.raises(RuntimeError, match="kept failing after 4 tries: HTTP 429"):
        engine.generate([[1, 2]], NO_BUDGET)


def test_a_4xx_is_a_clear_error_at_once(server):
    engine = OpenAIEngine(server.url + "/v1", "missing", retry=FAST)
    with pytest.raises(ValueError, match="refused the request: HTTP 404.*does not exist"):
        engine.generate([[1, 2]], NO_BUDGET)
    assert server.count == 1
    server.key = "sk-right"  # no key in the environment: the server refuses, no retry
    with pytest.raises(ValueError, match="HTTP 401.*Incorrect API key"):
        unkeyed = OpenAIEngine(server.url + "/v1", "m", retry=FAST, api_key_env="PRECISECODER_UNSET_KEY")
        unkeyed.generate([[1]], NO_BUDGET)
    assert len(server.requests) == 2


@pytest.mark.parametrize("server", [{"delay": 0.05}], indirect=True)
def test_concurrency_limit(server):
    engine = OpenAIEngine(server.url + "/v1", "m", max_concurrency=3, retry=FAST)
    out = engine.generate([[1, i + 2] for i in range(12)], NO_BUDGET)
    assert len(out) == 12 and 1 <= server.max_in_flight <= 3
    assert all(math.isnan(lp) for g in out for c in g for lp in c.logprobs)  # no tokenizer: nothing lines up


def test_thinking_budget_on_raw_completions(server, tok):
    engine = OpenAIEngine(server.url + "/v1", "m", tokenizer=tok, retry=FAST)
    prompt = tok.encode(tok.render_chat([{"role": "user", "content": "fix"}]))  # Qwen3.5 opens <think>
    c = engine.generate([prompt], SamplingParams(n=1, max_tokens=12, thinking_budget=4))[0][0]
    first, second = (b for _, _, b in server.requests)
    assert first["max_tokens"] == 4 and second["max_tokens"] == 12 - 4 - 3
    assert second["prompt"] == tok.decode(prompt) + FakeOpenAI.words(4, "a") + "\n</think>\n\n"
    assert c.text == FakeOpenAI.words(4, "a") + "\n</think>\n\n" + FakeOpenAI.words(5, "b")
    assert (c.thinking, c.answer) == (FakeOpenAI.words(4, "a"), FakeOpenAI.words(5, "b").lstrip("\n"))
    assert c.budget_hit and sum(c.forced) == 3 and len(c.token_ids) == 12
    assert [lp for lp, f in zip(c.logprobs, c.forced) if f] == [0.0] * 3


@pytest.mark.parametrize("server", [{}, {"reasoning": True}], indirect=True)
def test_chat_completions_split_thinking(server):
    engine = OpenAIEngine(server.url + "/v1", "m", retry=FAST)
    out = engine.chat([[{"role": "user", "content": "fix"}]], SamplingParams(n=2, max_tokens=50))
    assert server.requests[-1][2]["messages"] == [{"role": "user", "content": "fix"}]
    for c in out[0]:
        assert (c.thinking, c.answer, c.finish_reason) == ("Line 2.", "Fixed.", "stop")
