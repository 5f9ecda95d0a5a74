"""The program inside a model response (docs/reward.md, "Extracting the program").

The answer is the text after the last `</think>`. A response whose think block
never closes has no answer: one that opens `<think>` itself (Qwen3) and one
that continues a prompt which already opened it (`think_opened=True`: the
Qwen3.5/3.6 chat template with thinking on ends the prompt with `<think>`).
Fenced blocks follow CommonMark: an
opening fence is 3+ backticks or tildes indented by at most 3 spaces (a
backtick fence's info string may not contain a backtick); the closing fence is
the same character, at least as long, indented by at most 3 spaces, with only
whitespace after it. An unclosed fence is not a block and ends the parse.

Choices the spec leaves open: `\\r\\n` and lone `\\r` count as line ends (as in
CommonMark); only spaces count as fence indentation (a tab indents 4 columns,
so a tab-indented fence is not a fence); container blocks (lists, block
quotes) are not parsed, so a line is a fence by its own indentation alone; a
closed block with no content lines yields the empty program.
"""

from __future__ import annotations

import re

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_PYTHON_INFO = frozenset({"python", "python3", "py"})
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


def prompt_opens_think(prompt: str) -> bool:
    """Whether a rendered chat prompt ends inside an open `<think>` block (the `think_opened` of its completions).

    Only the last turn counts (the text after the last `<|im_start|>`, the Qwen turn marker, when
    there is one), so a literal `<think>` in an earlier message does not count. True for Qwen3.5/3.6
    with thinking on and for a prefilled chain of thought that is not closed; False for thinking off
    (`<think>\n\n</think>`) and for Qwen3 with thinking on (its model writes `<think>` itself).
    """
    turn = prompt.rsplit("<|im_start|>", 1)[-1]
    return turn.rfind(_THINK_OPEN) > turn.rfind(_THINK_CLOSE)


def answer_text(response: str, think_opened: bool = False) -> str | None:
    """The part of a response after its thinking, or None if the think block never closes.

    Args:
        response: the completion, without the prompt.
        think_opened: True when the prompt already opened the think block, so the
            response starts inside it.
    """
    if _THINK_CLOSE in response:
        return response.rsplit(_THINK_CLOSE, 1)[1]
    if think_opened or response.lstrip().startswith(_THINK_OPEN):
        return None
    return response


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """The closed fenced code blocks of a Markdown text as (info string, content), in order."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening or (opening[2][0] == "`" and "`" in opening[3]):
            i += 1
            continue
        indent, fence, info = len(opening[1]), opening[2], opening[3].strip(" \t")
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        if end is None:
            break
        content = [_dedent(line, indent) for line in lines[i + 1:end]]
        blocks.append((info, "\n".join(content)))
        i = end + 1
    return blocks


def _dedent(line: str, indent: int) -> str:
    """Remove up to `indent` leading spaces."""
    spaces = len(line) - len(line.lstrip(" "))
    return line[min(spaces, indent):]


def _language(info: str) -> str:
    """The first word of an info string, lower-cased ("" when empty)."""
    words = info.split(maxsplit=1)
    return words[0].lower() if words else ""


def extract_program(response: str, think_opened: bool = False) -> str | None:
    """The program of a response: its last python block, else its last unlabelled block, else None.

    Args:
        response: the model's completion, without the prompt.
        think_opened: whether the rendered prompt ended inside an open `<think>` block
            (Qwen3.5/3.6 with thinking on). Then a response without `</think>` was
            cut off while thinking and has no program. Set it from the chat
            template, never from the response. Qwen3 and thinking-off prompts: False.
    """
    answer = answer_text(response, think_opened)
    if answer is None:
        return None
    blocks = fenced_blocks(answer)
    python = [content for info, content in blocks if _language(info) in _PYTHON_INFO]
    if python:
        return python[-1]
    bare = [content for info, content in blocks if not info]
    return bare[-1] if bare else None


def missing_program_reason(response: str, think_opened: bool = False) -> str | None:
    """Why `extract_program` finds no program, or None when it finds one.

    "think block never closed", "no closed code block", or "no python or
    unlabelled code block" (closed blocks in other languages only).
    """
    answer = answer_text(response, think_opened)
    if answer is None:
        return "think block never closed"
    if extract_program(response, think_opened) is not None:
        return None
    return "no python or unlabelled code block" if fenced_blocks(answer) else "no closed code block"
