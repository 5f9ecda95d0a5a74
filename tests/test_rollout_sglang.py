"""The `sglang` engine against local fake SGLang servers speaking its native JSON."""

import warnings

import pytest
from fake_servers import FakeSGLang, check_generate

from jaxrl.rollout import SamplingParams, make_engine
from jaxrl.rollout.http import RetryPolicy
from jaxrl.rollout.sglang_engine import ServerDroppedWarning, SGLangEngine
from jaxrl.rollout.text import TokenSpec

FAST = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.05, timeout=10)
SPEC = TokenSpec(stop_ids=(2,), think_open=5, think_close=6, close_think=(7, 6, 8), turn_start=1)
PROMPTS = [[1, 20 + i, 30 + i, 5] for i in range(8)]  # each turn opens <think> (5)
PARAMS = SamplingParams(n=3, temperature=1.0, max_tokens=12, thinking_budget=None, seed=4)


@pytest.fixture
def servers(request):
    made = []

    def make(**kw):
        s = FakeSGLang(**kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def _ids(out):
    return [[c.token_ids for c in g] for g in out]


def test_generate_sends_the_native_request_and_reads_the_answer(servers):
    server = servers()
    engine = make_engine("sglang", urls=[server.url], tokens=SPEC, retry=FAST)
    out = engine.generate(PROMPTS[:2], SamplingParams(n=3, temperature=0.7, top_k=20, top_p=0.9, max_tokens=12,
                                                      thinking_budget=None, stop_token_ids=(11,), seed=4))
    gens = [b for m, p, b in server.requests if p == "/generate"]
    assert len(gens) == 2  # a prompt's n samples in one request: one prefix in the server's cache
    for body, prompt in zip(sorted(gens, key=lambda b: b["input_ids"][0]), PROMPTS[:2]):
        assert check_generate(body) == 3 and body["input_ids"] == [prompt] * 3 and body["return_logprob"] is True
        sp = body["sampling_params"][0]
        assert (sp["temperature"], sp["top_k"], sp["top_p"], sp["max_new_tokens"]) == (0.7, 20, 0.9, 12)
        assert set(sp["stop_token_ids"]) == {2, 11} and len({p["sampling_seed"] for p in body["sampling_params"]}) == 3
    for g in out:
        for c in g:
            assert len(c.token_ids) == len(c.logprobs) <= 12 and all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason == ("stop" if c.token_ids[-1] in (2, 11) else "length")
            assert c.finish_reason == "stop" or len(c.token_ids) == 12
    # deterministic per seed (the fake, like SGLang with sampling_seed, is), different across seeds
    assert _ids(engine.generate(PROMPTS[:2], PARAMS)) == _ids(engine.generate(PROMPTS[:2], PARAMS))
    assert _ids(engine.generate(PROMPTS[:2], PARAMS)) != _ids(engine.generate(
        PROMPTS[:2], SamplingParams(**{**PARAMS.__dict__, "seed": 5})))


def test_thinking_budget_closes_the_block_and_continues(servers):
    server = servers(p_eos=0.0)
    engine = SGLangEngine([server.url], tokens=SPEC, retry=FAST)
    out = engine.generate([PROMPTS[0]], SamplingParams(n=2, max_tokens=12, thinking_budget=5, seed=1))
    for c in out[0]:
        assert c.token_ids[5:8] == (7, 6, 8) and c.forced == (False,) * 5 + (True,) * 3 + (False,) * 4
        assert c.logprobs[5:8] == (0.0, 0.0, 0.0) and c.budget_hit and len(c.token_ids) == 12
        assert c.finish_reason == "length"
    gens = [b for m, p, b in server.requests if p == "/generate"]
    assert [b["sampling_params"][0]["max_new_tokens"] for b in gens] == [5, 4]
    first, second = gens
    assert second["input_ids"][0] == PROMPTS[0] + list(out[0][0].token_ids[:8])  # prompt + thought + close


def test_a_server_that_dies_mid_batch_is_dropped_and_its_prompts_rerun(servers):
    healthy = servers(delay=0.02)
    reference = _ids(SGLangEngine([healthy.url], tokens=SPEC, retry=FAST).generate(PROMPTS, PARAMS))
    dying, other = servers(die_after=2, delay=0.02), servers(delay=0.02)
    engine = SGLangEngine([dying.url, other.url], tokens=SPEC, retry=FAST, max_concurrency=4)
    with pytest.warns(ServerDroppedWarning, match=f"dropping sglang server {dying.url}"):
        out = engine.generate(PROMPTS, PARAMS)
    assert _ids(out) == reference  # the re-run prompts gave the samples their seeds define
    assert engine.servers == [other.url] and dying.generated >= 3
    other.kill()
    with pytest.warns(ServerDroppedWarning), pytest.raises(RuntimeError, match="every sglang server"):
        engine.generate(PROMPTS[:1], PARAMS)


def test_retries_with_backoff_then_succeeds(servers):
    server = servers(fail_first=2)
    engine = SGLangEngine([server.url], tokens=SPEC, retry=FAST)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no server dropped
        out = engine.generate(PROMPTS[:1], PARAMS)
    assert len(out[0]) == 3 and sum(p == "/generate" for _, p, _ in server.requests) == 3


def test_a_bad_request_is_a_clear_error_not_a_dropped_server(servers):
    server = servers()
    engine = SGLangEngine([server.url], tokens=SPEC, retry=FAST)
    with pytest.raises(ValueError, match="top_p must be in"):
        engine._call(server.url, "POST", "/generate", {"input_ids": [[1]], "sampling_params": [{"top_p": 2.0}]})
    assert engine.servers == [server.url]


def test_unreachable_servers_at_start(servers):
    server = servers()
    dead = servers()
    dead.close()
    with pytest.warns(ServerDroppedWarning, match="left out of the pool"):
        engine = SGLangEngine([dead.url, server.url], tokens=SPEC, retry=FAST)
    assert engine.servers == [server.url] and engine.health() == {server.url: True}
    with pytest.warns(ServerDroppedWarning), pytest.raises(RuntimeError, match="none of the sglang servers"):
        SGLangEngine([dead.url], retry=FAST)


def test_update_weights_writes_safetensors_and_loads_them_everywhere(servers, tmp_path):
    from flax import nnx

    from models.qwen3 import Qwen3, Qwen3Config

    a, b = servers(), servers()
    cfg = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, rope_theta=1e4)
    model = Qwen3(cfg, rngs=nnx.Rngs(0))
    engine = SGLangEngine([a.url, b.url], tokens=SPEC, retry=FAST, weights_dir=tmp_path / "w", keep_weights=1)
    engine.update_weights(model, step=3)
    engine.update_weights(model, step=4)
    want = str((tmp_path / "w" / "step-00000004").resolve())
    for s in (a, b):
        assert s.loaded[-1] == want and s.flushes == 2
        body = [b for _, p, b in s.requests if p == "/update_weights_from_disk"][-1]
        assert body == {"model_path": want, "weight_version": "4", "flush_cache": True}
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["step-00000004"]  # older ones removed
    with pytest.raises(RuntimeError, match="could not load the weights"):
        engine.update_weights(str(tmp_path / "missing"), step=5)
