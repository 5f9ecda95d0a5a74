"""Think-block detection and the thinking / answer split on the real Qwen tokenizers."""

import pytest

from jaxrl.rollout import make_engine
from jaxrl.rollout.text import TokenSpec, make_completion, prompt_opens_think, split_think
from reward.extract import extract_program
from models.tokenizer import QwenTokenizer, _load_or_build

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix it."}]


@pytest.fixture(scope="module", params=["qwen3", "qwen3_5"])
def tok(request):
    return QwenTokenizer(request.param, _load_or_build(request.param))


def test_token_spec_from_the_tokenizer(tok):
    spec = TokenSpec.from_tokenizer(tok)
    assert spec.stop_ids == (tok.im_end_id, tok.endoftext_id)
    assert tok.decode(spec.close_think) == "\n</think>\n\n" and tok.think_end_id in spec.close_think
    assert (spec.think_open, spec.think_close, spec.turn_start) == (tok.think_id, tok.think_end_id, tok.im_start_id)


def test_prompt_opens_think_follows_the_chat_template(tok):
    spec = TokenSpec.from_tokenizer(tok)
    thinking = tok.encode(tok.render_chat(MESSAGES))
    # Qwen3.5 opens <think> in a thinking-on prompt; Qwen3 leaves it to the model
    assert prompt_opens_think(thinking, spec) is (tok.family == "qwen3_5")
    assert not prompt_opens_think(tok.encode(tok.render_chat(MESSAGES, enable_thinking=False)), spec)
    # a prefilled chain of thought leaves the block open in both families
    assert prompt_opens_think(tok.encode(tok.render_chat(MESSAGES, prefill="First, the loop.")), spec)
    # a closed think block of an earlier turn does not count
    history = MESSAGES + [{"role": "assistant", "content": "<think>\nhm\n</think>\n\nDone."},
                          {"role": "user", "content": "Again."}]
    assert prompt_opens_think(tok.encode(tok.render_chat(history)), spec) is (tok.family == "qwen3_5")


def test_thinking_and_answer_split(tok):
    spec = TokenSpec.from_tokenizer(tok)
    body = tok.encode("Look at line 3.\n</think>\n\n```python\nx = 1\n```") + [tok.im_end_id]
    c = make_completion(body, [0.0] * len(body), [False] * len(body), "stop", True, spec, tok.decode)
    assert (c.thinking, c.answer) == ("Look at line 3.", "```python\nx = 1\n```")
    assert c.text == tok.decode(body[:-1]) and not c.budget_hit  # the stop token is not in the response
    assert extract_program(c.text, True) == "x = 1"
    sampled_open = tok.encode("<think>\nHmm.\n</think>\n\nAnswer.")
    assert [tok.decode(x) for x in split_think(sampled_open, False, spec)] == ["\nHmm.\n", "\n\nAnswer."]
    unclosed = tok.encode("still thinking")
    assert split_think(unclosed, True, spec) == (unclosed, [])
    assert split_think(unclosed, False, spec) == (None, unclosed)


def test_make_engine_knows_the_built_in_names():
    with pytest.raises(ValueError, match="unknown engine 'nope'; choose from jax, openai, sglang"):
        make_engine("nope")
