"""Response → program extraction (docs/reward.md, "Extracting the program")."""

from hypothesis import given
from hypothesis import strategies as st

from reward.extract import answer_text, extract_program, fenced_blocks, missing_program_reason, prompt_opens_think


def test_plain_python_block():
    assert extract_program("Fixed:\n```python\nx = 1\ny = 2\n```\nDone.") == "x = 1\ny = 2"


def test_info_string_first_word_case_insensitive():
    assert extract_program("```Python3 title=fix.py\na\n```") == "a"
    assert extract_program("```PY\nb\n```") == "b"


def test_last_python_block_wins():
    text = "```python\nfirst\n```\n```python\nsecond\n```\n```\nbare\n```"
    assert extract_program(text) == "second"


def test_falls_back_to_last_bare_block():
    text = "```\none\n```\n```bash\nls\n```\n```\ntwo\n```\n```text\nthree\n```"
    assert extract_program(text) == "two"


def test_other_language_only_is_invalid():
    assert extract_program("```javascript\nx = 1\n```") is None
    assert extract_program("```pythonic\nx = 1\n```") is None


def test_no_code_block_is_invalid():
    assert extract_program("The bug is on line 3; change < to <=.") is None


def test_think_block_skipped():
    text = "<think>\n```python\nwrong\n```\n</think>\n```python\nright\n```"
    assert extract_program(text) == "right"


def test_text_after_last_think_close():
    text = "<think>a</think>```python\nx\n```</think>\n```python\ny\n```"
    assert extract_program(text) == "y"
    assert extract_program("<think>a</think>```python\nx\n```</think>no code") is None


def test_unclosed_think_has_no_answer():
    assert answer_text("  \n<think>\nI will write ```python\nx\n```") is None
    assert extract_program("  <think>\n```python\nx = 1\n```\n") is None


def test_prompt_opened_think_block_must_be_closed():
    """Qwen3.5/3.6 with thinking on: the prompt ends with <think>, so the response starts inside it."""
    draft = "The bug is the + 1. Draft:\n```python\nx = 1\n```\n"
    assert extract_program(draft) == "x = 1"  # a response to a prompt without an open think block
    assert extract_program(draft, think_opened=True) is None  # cut off while thinking
    assert answer_text(draft, think_opened=True) is None
    closed = draft + "</think>\nFixed:\n```python\nx = 2\n```"
    assert extract_program(closed, think_opened=True) == "x = 2"
    assert extract_program("thinking</think>\nno code", think_opened=True) is None
    # A Qwen3 response that opens the block itself and never closes it: invalid either way.
    assert extract_program("<think>\n" + draft) is None
    assert extract_program("<think>\n" + draft, think_opened=True) is None


def test_think_tag_later_in_text_does_not_hide_answer():
    assert extract_program("Here <think> is literal.\n```python\nx\n```") == "x"


def test_unclosed_fence_is_not_a_block_and_stops_parsing():
    text = "```python\nkept\n```\n```python\nnever closed\n"
    assert extract_program(text) == "kept"
    text = "```python\nkept\n```\n~~~\nopen\n```python\nhidden\n```\n"
    assert extract_program(text) == "kept"


def test_closing_fence_rules():
    # A shorter fence or other character does not close; a longer one does.
    assert extract_program("````python\n```\nx\n~~~~\n`````\n") == "```\nx\n~~~~"
    # Only whitespace may follow a closing fence.
    assert extract_program("```python\na\n``` no\nb\n```  \t\n") == "a\n``` no\nb"


def test_tilde_fence_and_backticks_in_info():
    assert extract_program("~~~python `x`\nv = 1\n~~~") == "v = 1"
    # A backtick fence whose info string holds a backtick is not a fence.
    assert fenced_blocks("``` py`x\na\n```") == []


def test_indentation_of_fences_and_content():
    text = "  ```python\n  def f():\n      return 1\n x\n   ```"
    assert extract_program(text) == "def f():\n    return 1\nx"
    assert fenced_blocks("    ```python\na\n    ```") == []


def test_crlf_line_ends():
    assert extract_program("```python\r\nx = 1\r\ny = 2\r\n```\r\n") == "x = 1\ny = 2"


def test_empty_block_is_empty_program():
    assert extract_program("```python\n```") == ""


@given(st.lists(st.text(alphabet="ab =()\t#`~\n", max_size=12).map(lambda s: s.replace("`", "").replace("~", "")),
                max_size=6))
def test_round_trip_of_fenced_program(lines):
    program = "\n".join(line.replace("\n", "") for line in lines)
    assert extract_program(f"<think>plan</think>\nAnswer:\n```python\n{program}\n```\n") == program


def test_info_string_is_trimmed_of_spaces_and_tabs_only():
    """CommonMark trims spaces and tabs; a no-break space makes a non-empty info string."""
    assert extract_program("```\u00a0\nq\n```") is None
    assert extract_program("``` \t\nq\n```") == "q"


def test_missing_program_reason():
    assert missing_program_reason("```python\nx\n```") is None
    assert missing_program_reason("draft ```python\nx\n```", think_opened=True) == "think block never closed"
    assert missing_program_reason("<think>\nplan") == "think block never closed"
    assert missing_program_reason("</think>\n```python\nnever closed\n") == "no closed code block"
    assert missing_program_reason("```bash\nls\n```") == "no python or unlabelled code block"


def test_prompt_opens_think_on_rendered_templates():
    user = "<|im_start|>user\nFix it. (Tags like <think> may appear in tasks.)<|im_end|>\n"
    assert prompt_opens_think(user + "<|im_start|>assistant\n<think>\n")  # Qwen3.5/3.6, thinking on
    assert not prompt_opens_think(user + "<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off
    assert not prompt_opens_think(user + "<|im_start|>assistant\n")  # Qwen3, thinking on: the model opens it
    assert prompt_opens_think(user + "<|im_start|>assistant\n<think>\nFirst, the loop")  # prefilled thought
    assert not prompt_opens_think("plain prompt")


def test_prompt_opens_think_on_the_project_chat_templates():
    from models.tokenizer import render_chat

    msgs = [{"role": "user", "content": "Fix the bug."}]
    for family in ("qwen3", "qwen3_5"):
        assert prompt_opens_think(render_chat(msgs, family=family, enable_thinking=True)) == (family == "qwen3_5")
        assert not prompt_opens_think(render_chat(msgs, family=family, enable_thinking=False))
        assert prompt_opens_think(render_chat(msgs, family=family, enable_thinking=True, prefill="The loop"))
        done = render_chat(msgs, family=family, enable_thinking=True, prefill="The loop\n</think>\n\n")
        assert not prompt_opens_think(done)
