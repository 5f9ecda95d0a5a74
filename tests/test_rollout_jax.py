"""The `jax` rollout engine against transformers, the train step's log-probs, and its own invariants."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
import torch
from flax import nnx
from hf_qwen3 import VARIANTS, make_hf
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

import models
from jaxrl import losses
from jaxrl.rollout import SamplingParams, make_engine
from jaxrl.rollout import jax_engine
from jaxrl.rollout.jax_engine import JaxEngine, bucket_length, bucket_rows
from jaxrl.rollout.text import TokenSpec
from models import sharding

PROMPTS = [[5, 9, 17, 33, 2, 90, 4], [11, 3], [100, 101, 102, 7, 8, 1, 64, 65, 66, 12, 13]]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("q3")
    hf = make_hf(path, **VARIANTS["untied"])
    return models.from_pretrained(path), hf


@pytest.fixture(scope="module")
def qwen3_5(tmp_path_factory):
    path = tmp_path_factory.mktemp("q35")
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=8,
                            linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                            eos_token_id=None)
    hf = Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or "dt_bias" in name:
                p.add_(0.2 * torch.randn_like(p))
            elif p.ndim > 1:
                p.normal_(0.0, 0.1)
    hf.save_pretrained(path)
    return models.from_pretrained(path), hf


@pytest.fixture(params=["qwen3", "qwen3_5"])
def family(request):
    return request.getfixturevalue(request.param)


@pytest.fixture(params=["qwen3", pytest.param("qwen3_5", marks=pytest.mark.slow)])
def family_slow35(request):
    """Both families; Qwen3.5 (the costlier compile) only in the slow run."""
    return request.getfixturevalue(request.param)


def _hf_greedy(hf, prompt, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=n, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].double().numpy()


def test_buckets():
    assert [bucket_rows(n) for n in (1, 2, 3, 5, 7, 9, 13, 17, 96, 97)] == [1, 2, 3, 6, 8, 12, 16, 24, 96, 128]
    assert bucket_rows(5, 4) == 8 and bucket_rows(3, 8) == 8
    assert [bucket_length(n) for n in (1, 16, 17, 100)] == [16, 16, 32, 128]


def test_greedy_equals_transformers(family):
    """Temperature 0 is greedy: every prompt (left-padded together) continues as transformers' greedy generate."""
    model, hf = family
    engine = make_engine("jax", model=model)
    out = engine.generate(PROMPTS, SamplingParams(n=2, temperature=0.0, max_tokens=12, thinking_budget=None))
    for prompt, group in zip(PROMPTS, out):
        want = _hf_greedy(hf, prompt, 12)
        assert [list(c.token_ids) for c in group] == [want, want]
        assert all(c.finish_reason == "length" for c in group)


def test_logprobs_equal_transformers_and_the_train_step(family):
    """Sampled log-probs are log softmax(logits / T) of the untruncated distribution (float32, <= 1e-4)."""
    model, hf = family
    t = 0.8
    engine = JaxEngine(model)
    params = SamplingParams(n=3, temperature=t, top_k=20, top_p=0.9, max_tokens=10, thinking_budget=None, seed=4)
    out = engine.generate(PROMPTS, params)
    # transformers, one sequence at a time
    for prompt, group in zip(PROMPTS, out):
        for c in group:
            seq = prompt + list(c.token_ids)
            z = _hf_logits(hf, seq)[len(prompt) - 1:-1] / t
            want = z[np.arange(len(c.token_ids)), c.token_ids] - scipy.special.logsumexp(z, axis=-1)
            np.testing.assert_allclose(c.logprobs, want, atol=1e-4, rtol=0)
    # the train step's recomputation: exactly the sampled rows, right-padded into one batch with
    # segment ids (so positions restart at 0 in every row), through the same calls as policy_loss
    rows = [(p, c) for p, g in zip(PROMPTS, out) for c in g]
    width = max(len(p) + len(c.token_ids) for p, c in rows)
    tokens = np.zeros((len(rows), width), np.int32)
    seg, mask, old = (np.zeros_like(tokens) for _ in range(3))
    old = old.astype(np.float32)
    for r, (p, c) in enumerate(rows):
        seq = p + list(c.token_ids)
        tokens[r, :len(seq)], seg[r, :len(seq)] = seq, 1
        mask[r, len(p):len(seq)] = 1
        old[r, len(p):len(seq)] = c.logprobs
    hidden = model(jnp.asarray(tokens), segment_ids=jnp.asarray(seg), return_hidden=True)
    logp, _ = losses.chunked_logprobs(hidden, model.lm_head_weight(), jnp.asarray(tokens), 8, t)
    diff = np.abs(np.asarray(logp) - old) * mask
    assert mask.sum() == 3 * 3 * 10 and diff.max() <= 1e-4


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 8, 1.0), (1.5, 0, 0.6), (1.0, 12, 0.8)])
def test_first_token_distribution_matches_transformers_warpers(qwen3, temperature, top_k, top_p):
    """4096 first tokens of one prompt against softmax after transformers' temperature / top-k / top-p warpers."""
    model, hf = qwen3
    prompt = PROMPTS[0]
    engine = JaxEngine(model, max_rows=4096)
    out = engine.generate([prompt], SamplingParams(n=4096, temperature=temperature, top_k=top_k, top_p=top_p,
                                                   max_tokens=1, thinking_budget=None, seed=11))
    counts = np.bincount([g.token_ids[0] for g in out[0]], minlength=128)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)]
                                  + ([TopKLogitsWarper(top_k)] if top_k else [])
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
    logits = torch.tensor(_hf_logits(hf, prompt)[-1:], dtype=torch.float32)
    probs = torch.softmax(warpers(torch.tensor([prompt]), logits).double(), -1)[0].numpy()
    probs /= probs.sum()
    support = probs > 0
    assert counts[~support].sum() == 0
    if top_k:
        assert support.sum() <= top_k
    expected = probs[support] * counts.sum()
    merged = expected >= 5  # chi-square needs expected counts >= 5; pool the rest
    obs = np.append(counts[support][merged], counts[support][~merged].sum())
    exp = np.append(expected[merged], expected[~merged].sum())
    obs, exp = (obs, exp) if exp[-1] > 0 else (obs[:-1], exp[:-1])
    assert scipy.stats.chisquare(obs, exp).pvalue > 1e-3
    # the reported log-prob is the untruncated tempered one
    logp = torch.log_softmax(logits / temperature, -1)[0].numpy()
    first = out[0][0]
    assert abs(first.logprobs[0] - logp[first.token_ids[0]]) < 1e-4


def test_fan_out_equals_separate_prefills_and_batching_does_not_matter(family_slow35):
    """One prefill fanned out to n rows gives the samples of n separate prefills; batches and compaction neither."""
    model, _ = family_slow35
    params = SamplingParams(n=3, temperature=1.0, max_tokens=14, thinking_budget=None, seed=7)
    stop = SamplingParams(**{**params.__dict__, "stop_token_ids": (3, 17, 40)})
    a = JaxEngine(model).generate(PROMPTS, stop)
    b = JaxEngine(model, fan_out=False).generate(PROMPTS, stop)
    c = JaxEngine(model, max_rows=3, segment=4).generate(PROMPTS, stop)  # one prompt per batch, compaction
    for ga, gb, gc in zip(a, b, c):
        for x, y, z in zip(ga, gb, gc):
            assert x.token_ids == y.token_ids == z.token_ids
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
            np.testing.assert_allclose(x.logprobs, z.logprobs, atol=1e-5)
    assert any(x.finish_reason == "stop" for g in a for x in g)  # the stops cut some rows short


def test_samples_of_one_prompt_over_max_rows_run_in_batches_of_at_most_max_rows(qwen3, monkeypatch):
    model, _ = qwen3
    params = SamplingParams(n=7, temperature=1.0, top_k=5, top_p=0.9, max_tokens=6, thinking_budget=None, seed=2)
    whole = JaxEngine(model).generate(PROMPTS[:2], params)
    seen = []
    segment = jax_engine._segment
    monkeypatch.setattr(jax_engine, "_segment", lambda *a, **k: seen.append((a[2].logits.shape[0], k["chunk"]))
                        or segment(*a, **k))
    split = JaxEngine(model, max_rows=3, sample_chunk=2).generate(PROMPTS[:2], params)
    assert [[c.token_ids for c in g] for g in split] == [[c.token_ids for c in g] for g in whole]
    for g1, g2 in zip(whole, split):
        for a, b in zip(g1, g2):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert max(rows for rows, _ in seen) == 3 and {chunk for _, chunk in seen} == {1}


def test_generate_each_reports_each_prompt_once_as_soon_as_its_samples_stop(qwen3, monkeypatch):
    """`generate_each` calls back every prompt once, with the completions `generate` returns, right after
    the segment in which its last sample stopped: before decoding ends for prompts that stop early. Also
    when a prompt's samples are split over batches (reported after its last batch)."""
    model, _ = qwen3
    params = SamplingParams(n=3, temperature=1.0, max_tokens=14, thinking_budget=None, seed=7,
                            stop_token_ids=tuple(range(1, model.config.vocab_size, 6)))  # one token in six stops
    want = JaxEngine(model).generate(PROMPTS, params)
    segments, reported = [0], {}
    segment = jax_engine._segment
    monkeypatch.setattr(jax_engine, "_segment", lambda *a, **k: segments.__setitem__(0, segments[0] + 1)
                        or segment(*a, **k))

    def on_prompt(i, group):
        assert i not in reported
        reported[i] = (segments[0], [c.token_ids for c in group])

    got = JaxEngine(model, segment=4).generate_each(PROMPTS, params, on_prompt)
    ids = [[c.token_ids for c in g] for g in want]
    assert [[c.token_ids for c in g] for g in got] == ids
    assert {i: r[1] for i, r in reported.items()} == dict(enumerate(ids))
    stopped_in = [-(-max(len(t) for t in g) // 4) for g in ids]  # the segment of each prompt's last stop
    assert [reported[i][0] for i in range(len(PROMPTS))] == stopped_in
    assert min(stopped_in) < segments[0], (stopped_in, segments[0])  # some prompt was reported early

    segments[0], reported = 0, {}
    split = JaxEngine(model, max_rows=2, segment=4).generate_each(PROMPTS, params, on_prompt)
    assert [[c.token_ids for c in g] for g in split] == ids and sorted(reported) == [0, 1, 2]
    assert {i: r[1] for i, r in reported.items()} == dict(enumerate(ids))


def test_sampling_in_row_chunks_bounds_the_segments_temporaries():
    """XLA's own accounting of the compiled segment (scripts/rollout_memory.py) on a 32,768-token
    vocabulary: drawing 8 of 64 rows at a time needs far fewer temporary bytes than drawing all 64,
    whose top-k / top-p temporaries are [64, V]."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "rollout_memory.py"
    spec = importlib.util.spec_from_file_location("rollout_memory", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    engine = script.tiny_engine(vocab=32768, segment=4, sample_chunk=8)
    chunked, whole = (script.segment_memory(engine, 64, chunk)["temporaries"] for chunk in (8, 64))
    assert chunked < 0.5 * whole, (chunked, whole)


def test_seeds_are_deterministic_and_distinct(qwen3):
    model, _ = qwen3
    engine = JaxEngine(model)
    p = SamplingParams(n=4, temperature=1.0, max_tokens=8, thinking_budget=None, seed=1)
    first = engine.generate(PROMPTS, p)
    again = engine.generate(PROMPTS, p)
    other = engine.generate(PROMPTS, SamplingParams(**{**p.__dict__, "seed": 2}))
    ids = lambda out: [c.token_ids for g in out for c in g]
    assert ids(first) == ids(again)
    assert ids(first) != ids(other)
    assert len(set(ids(first))) == len(ids(first))  # the n samples of a prompt differ too


class Words:
    """A tokenizer's `decode` alone: token 7 reads `<7>`."""

    @staticmethod
    def decode(ids):
        return "".join(f"<{int(i)}>" for i in ids)


def test_stops_end_each_row_at_its_first_stop_token_and_leave_the_text(qwen3):
    """The `Completion` contract too: the stop token ends `token_ids`, not `text`."""
    model, _ = qwen3
    greedy = JaxEngine(model).generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=12,
                                                               thinking_budget=None))
    stop_id = greedy[2][0].token_ids[4]
    for engine, params in [
        (JaxEngine(model, Words(), tokens=TokenSpec()),
         SamplingParams(temperature=0.0, max_tokens=12, thinking_budget=None, stop_token_ids=(stop_id,))),
        (JaxEngine(model, Words(), tokens=TokenSpec(stop_ids=(stop_id,))),  # a tokenizer's own stop
         SamplingParams(temperature=0.0, max_tokens=12, thinking_budget=None)),
    ]:
        out = engine.generate(PROMPTS, params)
        for g, c in zip(greedy, out):
            full = list(g[0].token_ids)
            end = full.index(stop_id) + 1 if stop_id in full else 12
            assert list(c[0].token_ids) == full[:end]
            assert c[0].finish_reason == ("stop" if stop_id in full else "length")
            assert c[0].text == Words.decode(full[:end - 1] if stop_id in full else full)


def test_thinking_budget_appends_the_close_and_the_answer_continues(family):
    """Budget 3 in a think block opened by the prompt: 3 sampled tokens, the forced close, then the answer."""
    model, _ = family
    prompt = [126, 5, 9, 17, 120]  # a turn (126 starts it) whose prompt opened <think> (120)
    plain = JaxEngine(model, tokens=TokenSpec())
    greedy = plain.generate([prompt], SamplingParams(temperature=0.0, max_tokens=10, thinking_budget=None))[0][0]
    # the crafted case: </think> and the close's other tokens are ids the model does not pick in its first 3 steps
    free_ids = [t for t in range(100, 126) if t not in greedy.token_ids[:3] and t != 120]
    close, nl, nl2 = free_ids[:3]
    spec = TokenSpec(think_open=120, think_close=close, close_think=(nl, close, nl2), turn_start=126)
    engine = JaxEngine(model, tokens=spec)
    c = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=10, thinking_budget=3))[0][0]
    head = list(greedy.token_ids[:3])
    assert list(c.token_ids[:6]) == head + [nl, close, nl2]
    assert c.forced == (False,) * 3 + (True,) * 3 + (False,) * 4 and c.budget_hit
    assert c.logprobs[3:6] == (0.0, 0.0, 0.0) and c.finish_reason == "length"
    # after the forced close the model continues greedily from prompt + everything so far, within max_tokens
    tail = plain.generate([prompt + head + [nl, close, nl2]],
                          SamplingParams(temperature=0.0, max_tokens=4, thinking_budget=None))[0][0]
    assert c.token_ids[6:] == tail.token_ids
    # no budget, or a prompt that did not open the block: nothing forced
    free = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=10, thinking_budget=None))[0][0]
    closed = engine.generate([prompt[:-1]], SamplingParams(temperature=0.0, max_tokens=10, thinking_budget=3))[0][0]
    assert free.token_ids == greedy.token_ids and not any(free.forced) and not any(closed.forced)
    # budget 0 closes at once
    zero = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=5, thinking_budget=0))[0][0]
    assert zero.token_ids[:3] == (nl, close, nl2) and zero.forced == (True,) * 3 + (False,) * 2
    # a sampled <think> opens the block (Qwen3's template leaves that to the model): make the
    # prompt's first greedy token the opener; budget 2 then counts from the token after it
    opener = greedy.token_ids[0]
    spec2 = TokenSpec(think_open=opener, think_close=close, close_think=(nl, close, nl2), turn_start=126)
    c2 = JaxEngine(model, tokens=spec2).generate([prompt], SamplingParams(
        temperature=0.0, max_tokens=8, thinking_budget=2))[0][0]
    assert c2.token_ids[:6] == greedy.token_ids[:3] + (nl, close, nl2)
    assert c2.forced[:6] == (False,) * 3 + (True,) * 3


def test_sharded_on_eight_devices_equals_one_device(family_slow35):
    model, _ = family_slow35
    params = SamplingParams(n=4, temperature=1.0, top_p=0.95, max_tokens=10, thinking_budget=None, seed=3)
    one = JaxEngine(model).generate(PROMPTS, params)
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    sharded = JaxEngine(model, mesh=mesh)
    assert sharded.state["embed_tokens"]["embedding"][...].sharding.mesh.size == 8
    eight = sharded.generate(PROMPTS, params)
    for g1, g8 in zip(one, eight):
        for a, b in zip(g1, g8):
            assert a.token_ids == b.token_ids
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_update_weights_reuses_the_compiled_programs(qwen3):
    model, _ = qwen3
    engine = JaxEngine(model)
    params = SamplingParams(n=2, temperature=0.0, max_tokens=6, thinking_budget=None)
    before = engine.generate(PROMPTS, params)
    compiled = lambda: (jax_engine._segment._cache_size(), jax_engine._begin._cache_size(),
                        jax_engine._compact._cache_size())
    sizes = compiled()
    # prompts of other lengths in the same bucket, and another seed, reuse them too
    engine.generate([p[:-1] for p in PROMPTS], SamplingParams(**{**params.__dict__, "seed": 9}))
    graphdef, state = nnx.split(model)
    perturbed = jax.tree.map(lambda x: x * 1.5, state)
    engine.update_weights(nnx.merge(graphdef, perturbed), step=1)
    after = engine.generate(PROMPTS, params)
    assert engine.weights_step == 1 and compiled() == sizes
    assert [c.token_ids for g in before for c in g] != [c.token_ids for g in after for c in g]
    fresh = JaxEngine(nnx.merge(graphdef, perturbed)).generate(PROMPTS, params)
    assert [c.token_ids for g in fresh for c in g] == [c.token_ids for g in after for c in g]
    with pytest.raises(ValueError, match="different model structure"):
        engine.update_weights({"x": jnp.zeros(3)}, step=2)


def test_bad_prompts_are_errors(qwen3):
    engine = JaxEngine(qwen3[0])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1], []], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="prompt 0 has a token id outside"):
        engine.generate([[1, 500]], SamplingParams(max_tokens=2))
