"""A word-level tokenizer sized for the demo domain, with the Qwen chat special tokens.

The demo policy is a Qwen3-architecture model small enough to train from scratch
on two CPU cores, so its vocabulary is the domain's words (about 170 ids, each
keyword, name and operator one token, most with their leading space) plus every
printable ASCII character as a fallback, so any ASCII text round-trips. A
character outside that set encodes as `<|unk|>`.

It offers what the rollout engine, the trainer and the evaluation use of
`models.tokenizer.QwenTokenizer`: the same special tokens and ids attributes
(`eos_id`, `pad_id`, `stop_ids`, `think_id`, ...), `encode` / `encode_batch` /
`decode`, and `render_chat` in Qwen3's chat format. The demo policy does not
think: its generation prompt always closes an empty think block (Qwen3's
thinking-off prompt), whatever `enable_thinking` says, so training,
evaluation and SFT see the same prompt. The thinking variant's tokenizer
(`thinking=True`, `jaxrl.demo.thinking`) leaves the block open instead.
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
from collections.abc import Mapping, Sequence
from pathlib import Path

from jaxrl.demo import domain
from models.tokenizer import THINK_EMPTY, THINK_OPEN

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|unk|>")
# Special tokens that stay in text decoded with skip_special (as in QwenTokenizer).
TEXT_LIKE = frozenset({"<think>", "</think>"})
VOCAB_FILE = "demo_vocab.json"
_WORDS = ("```python", "```", "\n\n", "    ", "def", "return", "user", "assistant", "system", "):", "is",
          "plus", "minus", "times", "=", "+", "-", "*", "f", "  #",
          *domain.COMMENTED_PROMPT.split(), *domain.ARGS, *domain.NAMES, *domain.DIGITS)


def default_vocab() -> tuple[str, ...]:
    """Specials, then domain words with and without a leading space, then single ASCII characters."""
    words = [w for word in _WORDS for w in ((word, " " + word) if word[0].isalnum() or word in "=+-*" else (word,))]
    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = list(SPECIALS)
    for token in words + chars:
        if token not in vocab:
            vocab.append(token)
    return tuple(vocab)


class DemoTokenizer:
    """Greedy longest-match tokenizer over a fixed vocabulary, with Qwen3's chat format.

    Attributes:
      family: "qwen3", the chat format it renders (`models.tokenizer.FAMILIES`: a prompt
        that leaves no think block open), so code that asks the family how a prompt
        ends treats it like Qwen3's; the vocabulary is the demo's own.
      vocab: the token strings, in id order.
      vocab_size: number of ids.
      eos_id: <|im_end|>, the end of an assistant turn.
      endoftext_id, pad_id: <|endoftext|> (id 0), also the padding id.
      im_start_id, im_end_id, think_id, think_end_id, unk_id: ids of those special tokens.
      stop_ids: ids that end a sampled completion.
      thinking: the generation prompt opens `<think>` when `enable_thinking` (the thinking variant).
    """

    family = "qwen3"

    def __init__(self, vocab: Sequence[str] | None = None, thinking: bool = False):
        self.vocab = tuple(vocab) if vocab is not None else default_vocab()
        self.thinking = thinking
        if len(set(self.vocab)) != len(self.vocab):
            raise ValueError("vocabulary has duplicate tokens")
        missing = [s for s in SPECIALS if s not in self.vocab]
        if missing:
            raise ValueError(f"vocabulary lacks special tokens {missing}")
        self._ids = {token: i for i, token in enumerate(self.vocab)}
        self._special_ids = frozenset(self._ids[s] for s in SPECIALS if s not in TEXT_LIKE)
        multi = sorted((t for t in self.vocab if len(t) > 1), key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, multi)) + "|.", re.DOTALL)
        self.vocab_size = len(self.vocab)
        self.endoftext_id = self.token_id("<|endoftext|>")
        self.pad_id = self.endoftext_id
        self.im_start_id = self.token_id("<|im_start|>")
        self.im_end_id = self.token_id("<|im_end|>")
        self.eos_id = self.im_end_id
        self.think_id = self.token_id("<think>")
        self.think_end_id = self.token_id("</think>")
        self.unk_id = self.token_id("<|unk|>")
        self.stop_ids = (self.im_end_id, self.endoftext_id)

    def token_id(self, token: str) -> int:
        """The id of one token string (KeyError if it is not a single token)."""
        if token not in self._ids:
            raise KeyError(f"{token!r} is not a token of the demo vocabulary")
        return self._ids[token]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, longest match first; special-token strings become their ids."""
        return [self._ids.get(piece, self.unk_id) for piece in self._pattern.findall(text)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of `ids`; `skip_special` drops control tokens but keeps <think> and </think>.

        An id outside the vocabulary (a model whose embedding table is padded) decodes as <|unk|>.
        """
        n, unk = self.vocab_size, self.unk_id
        ids = [i if 0 <= i < n else unk for i in ids]
        return "".join(self.vocab[i] for i in ids if not (skip_special and i in self._special_ids))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        enable_thinking: bool = True,
        add_generation_prompt: bool = True,
        prefill: str | None = None,
    ) -> str:
        """Qwen3's chat format, `<|im_start|>role\\ncontent<|im_end|>\\n` a turn.

        The generation prompt is `<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n` (an
        empty, closed think block) whatever `enable_thinking` says: the demo policy
        answers at once. A `thinking` tokenizer with `enable_thinking` ends it with
        `<think>\\n` instead, left open. `prefill` follows. Assistant turns keep no thinking.
        """
        if prefill is not None and not add_generation_prompt:
            raise ValueError("prefill continues the generation prompt; set add_generation_prompt=True")
        out = []
        for message in messages:
            role, content = message["role"], message.get("content")
            content = content if isinstance(content, str) else ""
            if role not in ("system", "user", "assistant"):
                raise ValueError(f"Unsupported role: {role}")
            if role == "assistant" and "</think>" in content:
                content = content.split("</think>")[-1].lstrip("\n")
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        if add_generation_prompt:
            opening = THINK_OPEN if self.thinking and enable_thinking else THINK_EMPTY
            out.append("<|im_start|>assistant\n" + opening + (prefill or ""))
        return "".join(out)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Writes `demo_vocab.json` (the token strings in id order; for a thinking tokenizer
        `{"vocab": [...], "thinking": true}`); `from_pretrained` reads it."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        saved = {"vocab": list(self.vocab), "thinking": True} if self.thinking else list(self.vocab)
        (directory / VOCAB_FILE).write_text(json.dumps(saved, ensure_ascii=False) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> DemoTokenizer:
        saved = json.loads((Path(directory) / VOCAB_FILE).read_text())
        return cls(saved["vocab"], thinking=saved["thinking"]) if isinstance(saved, dict) else cls(saved)


@functools.cache
def load_demo_tokenizer() -> DemoTokenizer:
    """The demo tokenizer over the default vocabulary (one shared instance)."""
    return DemoTokenizer()


assert THINK_OPEN == "<think>\n"  # the think block the engine closes with "\n</think>\n\n" ends in our vocabulary
