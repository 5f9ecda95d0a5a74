"""The `sglang` engine against a REAL sglang-jax server (`precisecoder serve`), compared with the `jax` engine.

One server per module, on a random 2-layer Qwen3 (head_dim 128, the real vocabulary) whose
LM head is scaled so that sampled first tokens can be tested against the softmax. Skips
when `.venv-sglang-jax` is absent.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from sglang_jax_servers import needs_sglang_jax, save_random_qwen3, serve

import models
from jaxrl.cli import main
from jaxrl.rollout import SamplingParams, make_engine
from jaxrl.rollout.http import request_json
from models.tokenizer import load_tokenizer

pytestmark = [needs_sglang_jax, pytest.mark.slow]  # ~40 s for the server to start, ~2 min in all

TOK = load_tokenizer("qwen3")
MESSAGES = [[{"role": "user", "content": f"Fix the bug in line {i}: return a - b"}] for i in range(3)]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang_jax")
    save_random_qwen3(root / "a", seed=0, logit_scale=25.0)
    save_random_qwen3(root / "b", seed=1, logit_scale=25.0)
    return root


@pytest.fixture(scope="module")
def server(models_dir):
    with serve(models_dir / "a") as urls:
        yield urls[0]


@pytest.fixture(scope="module")
def engines(models_dir, server):
    """(jax engine on model a, sglang engine on the server, which serves a)."""
    jax_engine = make_engine("jax", model=models.from_pretrained(models_dir / "a"), tokenizer=TOK)
    return jax_engine, make_engine("sglang", urls=[server], tokenizer=TOK)


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "messages": m}) + "\n" for i, m in enumerate(MESSAGES)))
    return path


def _generate(out, *argv):
    assert main(["generate", *map(str, argv), "--out", str(out), "--no-progress"]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_greedy_generate_equals_the_jax_engine(models_dir, server, prompts_file, tmp_path):
    common = ["--prompts", prompts_file, "--temperature", 0, "--max-tokens", 24, "--thinking-budget", "none"]
    want = _generate(tmp_path / "jax.jsonl", "--model", models_dir / "a", *common)
    got = _generate(tmp_path / "sglang.jsonl", "--engine", "sglang", "--url", server, "--tokenizer", "qwen3", *common)
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert g["token_ids"] == w["token_ids"] and len(w["token_ids"]) == 24
        assert (g["finish_reason"], g["text"]) == (w["finish_reason"], w["text"])
        np.testing.assert_allclose(g["logprobs"], w["logprobs"], atol=1e-4, rtol=0)


def _first_token_probs(model_dir, prompt, temperature, top_k, top_p):
    """The sampling distribution of the first token: softmax(logits / T) after top-k, then top-p."""
    model = models.from_pretrained(model_dir)
    z = np.asarray(model(jnp.asarray([prompt])))[0, -1].astype(np.float64) / temperature
    if top_k:
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-p)
        keep = np.cumsum(p[order]) - p[order] < top_p  # the smallest set whose mass reaches top_p
        p[order[~keep]] = 0
        p /= p.sum()
    return p


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.5)])
def test_sampled_first_tokens_match_the_softmax(models_dir, server, tmp_path, temperature, top_k, top_p):
    """400 first tokens from each engine, against the exact distribution (chi-square, pooled tail)."""
    prompt = TOK.encode(TOK.render_chat(MESSAGES[0]))
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"id": 0, "input_ids": prompt}) + "\n")
    common = ["--prompts", path, "--n", 400, "--temperature", temperature, "--top-k", top_k, "--top-p", top_p,
              "--max-tokens", 1, "--thinking-budget", "none", "--seed", 5]
    probs = _first_token_probs(models_dir / "a", prompt, temperature, top_k, top_p)
    support = probs > 0
    runs = {"jax": _generate(tmp_path / "jax.jsonl", "--model", models_dir / "a", *common),
            "sglang": _generate(tmp_path / "sglang.jsonl", "--engine", "sglang", "--url", server,
                                "--tokenizer", "qwen3", *common)}
    logp = np.log(_first_token_probs(models_dir / "a", prompt, temperature, 0, 1.0))
    for name, rows in runs.items():
        tokens = [r["token_ids"][0] for r in rows]
        counts = np.bincount(tokens, minlength=probs.size)
        assert counts[~support].sum() == 0, name
        expected = probs[support] * len(tokens)
        kept = expected >= 5
        obs = np.append(counts[support][kept], counts[support][~kept].sum())
        exp = np.append(expected[kept], expected[~kept].sum())
        obs, exp = (obs, exp) if exp[-1] > 0 else (obs[:-1], exp[:-1])
        assert kept.sum() >= 5 and scipy.stats.chisquare(obs, exp).pvalue > 1e-3, name
        # the reported log-prob: the tempered, untruncated one
        np.testing.assert_allclose([r["logprobs"][0] for r in rows], logp[tokens], atol=1e-4, rtol=0)


def test_stop_finish_reason_and_thinking_budget_equal_the_jax_engine(engines):
    jax_engine, sglang_engine = engines
    prompts = [TOK.encode(TOK.render_chat(m)) for m in MESSAGES]
    greedy = SamplingParams(temperature=0.0, max_tokens=16, thinking_budget=None)
    free = jax_engine.generate(prompts, greedy)
    # a stop id that greedy decoding meets at position 5 of prompt 0: that sample stops there
    stop = free[0][0].token_ids[5]
    thinking = [p + [TOK.think_id] for p in prompts]  # prompts that open a think block
    cases = [(prompts, SamplingParams(temperature=0.0, max_tokens=16, thinking_budget=None, stop_token_ids=(stop,))),
             (thinking, SamplingParams(temperature=0.0, max_tokens=16, thinking_budget=4)),
             (thinking, SamplingParams(temperature=0.0, max_tokens=5, thinking_budget=4)),
             (thinking, SamplingParams(n=3, temperature=0.0, max_tokens=12, thinking_budget=0))]
    for case_prompts, params in cases:
        want = jax_engine.generate(case_prompts, params)
        got = sglang_engine.generate(case_prompts, params)
        for wg, gg in zip(want, got):
            for w, g in zip(wg, gg):
                assert (g.token_ids, g.forced, g.finish_reason, g.budget_hit, g.text, g.thinking, g.answer) == (
                    w.token_ids, w.forced, w.finish_reason, w.budget_hit, w.text, w.thinking, w.answer), params
                np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-4, rtol=0)
    stopped = sglang_engine.generate(prompts, cases[0][1])[0][0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop and len(stopped.token_ids) <= 6
    budgeted = sglang_engine.generate(thinking, cases[1][1])[0][0]
    assert budgeted.budget_hit and any(budgeted.forced) and budgeted.forced[4]


def test_update_weights_from_disk_serves_the_new_weights(models_dir, server, engines):
    jax_a, sglang_engine = engines
    jax_b = make_engine("jax", model=models.from_pretrained(models_dir / "b"), tokenizer=TOK)
    prompts = [TOK.encode(TOK.render_chat(m)) for m in MESSAGES]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, thinking_budget=None)
    on_a = [g[0].token_ids for g in jax_a.generate(prompts, greedy)]
    on_b = jax_b.generate(prompts, greedy)
    assert on_a != [g[0].token_ids for g in on_b]  # the two checkpoints differ where it shows
    answer = request_json("POST", server + "/update_weights_from_disk", {"model_path": str(models_dir / "b")})
    assert answer["success"] is True and "Succeeded" in answer["message"]
    assert request_json("GET", server + "/get_model_info")["model_path"] == str(models_dir / "b")
    for want, got in zip(on_b, sglang_engine.generate(prompts, greedy)):
        assert got[0].token_ids == want[0].token_ids
        np.testing.assert_allclose(got[0].logprobs, want[0].logprobs, atol=1e-4, rtol=0)
    # a directory that is not a model: SGLang's 400 with success false, the weights stay
    with pytest.raises(RuntimeError, match="could not load the weights of step 2"):
        sglang_engine.update_weights(str(models_dir / "missing"), step=2)
    assert [g[0].token_ids for g in sglang_engine.generate(prompts, greedy)] == [g[0].token_ids for g in on_b]
    sglang_engine.update_weights(str(models_dir / "a"), step=3)  # back: the other tests' server serves a
    assert [g[0].token_ids for g in sglang_engine.generate(prompts, greedy)] == on_a


def test_serve_native_endpoints(server):
    assert request_json("GET", server + "/health_generate") in (None, "")
    assert "Cache flushed" in request_json("POST", server + "/flush_cache")
    answer = request_json("POST", server + "/generate", {"input_ids": [[1, 2, 3]], "return_logprob": True,
                                                         "sampling_params": [{"max_new_tokens": 2, "temperature": 0}]})
    assert len(answer) == 1 and len(answer[0]["output_ids"]) == 2
    assert answer[0]["meta_info"]["finish_reason"]["type"] == "length"
