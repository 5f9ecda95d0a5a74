"""The demo tokenizer: exact round trips, special tokens, the chat format the engine and trainer expect."""

from jaxrl.demo import domain, prompt
from jaxrl.demo.tokenizer import DemoTokenizer
from models.tokenizer import render_chat


def test_round_trip_of_domain_text_and_arbitrary_ascii():
    tok = DemoTokenizer()
    for s in domain.generate(0, 20, "tok") + domain.generate(0, 5, "tokc", clean=True):
        text = tok.render_chat(prompt.task_messages(s.task)) + prompt.answer(s.rewrite()) + "<|im_end|>"
        assert tok.decode(tok.encode(text)) == text
    odd = "print('héllo')\t{x: [1, 2]} ~`|\\ \n\n\n"
    assert tok.decode(tok.encode(odd)) == odd.replace("é", "<|unk|>")


def test_domain_words_are_single_tokens():
    tok = DemoTokenizer()
    assert len(tok.encode("    y = x * 2\n")) == 7
    assert len(tok.encode("y is x times 2\n")) == 6
    assert tok.encode("```python\n") == [tok.token_id("```python"), tok.token_id("\n")]


def test_special_ids_and_skip_special():
    tok = DemoTokenizer()
    assert tok.pad_id == tok.endoftext_id == 0
    assert tok.eos_id == tok.im_end_id and tok.stop_ids == (tok.im_end_id, tok.endoftext_id)
    ids = tok.encode("<|im_start|>user\nhi<|im_end|><think>\n</think>")
    assert ids[0] == tok.im_start_id and tok.think_id in ids and tok.think_end_id in ids
    assert tok.decode(ids, skip_special=True) == "user\nhi<think>\n</think>"
    assert tok.encode("\n</think>\n\n") == [tok.token_id("\n"), tok.think_end_id, tok.token_id("\n\n")]


def test_chat_format_is_qwen3_thinking_off():
    tok = DemoTokenizer()
    messages = [{"role": "user", "content": "x is a plus b\nreturn x"}]
    expected = render_chat(messages, family="qwen3", enable_thinking=False)
    assert tok.render_chat(messages) == expected
    assert tok.render_chat(messages, enable_thinking=True) == expected


def test_save_and_load(tmp_path):
    tok = DemoTokenizer()
    tok.save_pretrained(tmp_path)
    again = DemoTokenizer.from_pretrained(tmp_path)
    assert again.vocab == tok.vocab and again.encode("y = x") == tok.encode("y = x")


def test_ids_beyond_the_vocabulary_decode_as_unk():
    tok = DemoTokenizer()
    assert tok.decode([tok.token_id("x"), tok.vocab_size + 3]) == "x<|unk|>"
    assert tok.decode([tok.token_id("x"), tok.vocab_size + 3], skip_special=True) == "x"
