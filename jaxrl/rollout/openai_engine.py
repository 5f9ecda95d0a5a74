"""The `openai` engine: any OpenAI-compatible endpoint (vLLM, SGLang, a hosted API), for evaluation.

- `generate(prompts, params)` uses raw completions (`POST {base_url}/completions`) with the
  prompt as token ids, so a rendered chat prompt, or one that prefills a think block, is
  sent exactly. With a tokenizer, the thinking budget is enforced for prompts that open
  the think block: the first request stops at the budget, and a sample still inside it
  gets `\\n</think>\\n\\n` appended (as text) and is continued by a second request (a
  block the model opens itself, as Qwen3 does, is not budgeted here).
- `chat(conversations, params)` uses chat completions (`POST {base_url}/chat/completions`);
  the server renders the template. A `reasoning_content` field (vLLM's and SGLang's
  reasoning parsers) becomes the thinking.

Both send `n`, `temperature`, `top_p`, `max_tokens`, `seed` and `logprobs`, and `top_k`
when it is set (an extension vLLM and SGLang accept). The API key is read from the
environment variable `api_key_env` (default `OPENAI_API_KEY`; none is sent when it is
unset). At most `max_concurrency` requests are in flight; 429 and 5xx answers and
connection failures are retried with exponential backoff (honouring Retry-After); any
other 4xx is a `ValueError` carrying the server's message.

Token ids come from re-encoding the returned text with the tokenizer (empty without
one), so they can differ from the server's own tokens; a log-prob is NaN where the
server's per-token log-probs do not line up with them. This engine is for evaluation,
not for training.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl.rollout.engine import Completion, Engine, SamplingParams, register_engine
from jaxrl.rollout.http import HTTPStatusError, RetryPolicy, request_json, with_retries
from jaxrl.rollout.text import CLOSE_THINK_TEXT, TokenSpec, prompt_opens_think

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _split_text(text: str, opened: bool) -> tuple[str | None, str]:
    """(thinking, answer) of completion text, as `text.split_think` splits tokens."""
    if opened:
        begin = 0
    elif THINK_OPEN in text:
        begin = text.index(THINK_OPEN) + len(THINK_OPEN)
    else:
        return None, text
    rest = text[begin:]
    if THINK_CLOSE in rest:
        thinking, answer = rest.split(THINK_CLOSE, 1)
        return thinking.strip("\n"), answer.lstrip("\n")
    return rest.strip("\n"), ""


class OpenAIEngine(Engine):
    """Completions from an OpenAI-compatible server; see the module docstring.

    Args:
        base_url: the API root, e.g. `http://127.0.0.1:8000/v1`.
        model: the served model name.
        tokenizer: a `models.tokenizer.QwenTokenizer` (token ids of the answers, stop
            strings, think-block detection, the thinking budget).
        api_key_env: environment variable holding the API key.
        max_concurrency: requests in flight at once.
        retry: timeout, tries and backoff of each request.
        prompt_opens_think: force whether prompts open a think block (default: read the prompt).
        extra_body: more fields for every request (server-specific options).
    """

    def __init__(self, base_url: str, model: str, tokenizer: Any = None, *, api_key_env: str = "OPENAI_API_KEY",
                 max_concurrency: int = 8, retry: RetryPolicy = RetryPolicy(),
                 prompt_opens_think: bool | None = None, extra_body: Mapping[str, Any] | None = None):
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be positive")
        self.base_url, self.model, self.tokenizer = base_url.rstrip("/"), model, tokenizer
        self.tokens = TokenSpec.from_tokenizer(tokenizer) if tokenizer is not None else TokenSpec()
        key = os.environ.get(api_key_env)
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.max_concurrency, self.retry = max_concurrency, retry
        self.prompt_opens_think = prompt_opens_think
        self.extra_body = dict(extra_body or {})

    # ------------------------------------------------------------------ requests

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            answer = with_retries(lambda: request_json("POST", self.base_url + path, {**body, **self.extra_body},
                                                       headers=self.headers, timeout=self.retry.timeout),
                                  self.retry)
        except HTTPStatusError as e:
            if e.retryable:
                raise RuntimeError(f"{self.base_url}{path} kept failing after {self.retry.attempts} tries: "
                                   f"HTTP {e.status}: {e.body[:300]}") from None
            raise ValueError(f"{self.base_url}{path} refused the request: HTTP {e.status}: {e.body[:300]}") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            raise RuntimeError(f"{self.base_url}{path} answered without choices: {str(answer)[:300]}")
        return answer

    def _common(self, params: SamplingParams, n: int, max_tokens: int, index: int) -> dict[str, Any]:
        body = {"model": self.model, "n": n, "temperature": params.temperature, "top_p": params.top_p,
                "max_tokens": max_tokens, "seed": params.seed + index}
        if params.top_k:
            body["top_k"] = params.top_k
        if params.stop_token_ids:
            if self.tokenizer is None:
                raise ValueError("stop_token_ids need a tokenizer with the openai engine")
            body["stop"] = [self.tokenizer.decode([t]) for t in params.stop_token_ids]
        return body

    def _map(self, fn, items: Sequence[Any]) -> list[Any]:
        workers = max(1, min(self.max_concurrency, len(items)))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            return list(pool.map(fn, items))

    def _completion(self, text: str, thinking: str | None, answer: str, finish: str | None,
                    logprobs: Sequence[float] | None, forced_text: str = "") -> Completion:
        ids = tuple(self.tokenizer.encode(text)) if self.tokenizer is not None else ()
        lps = tuple(logprobs) if logprobs is not None and len(logprobs) == len(ids) else (math.nan,) * len(ids)
        forced = (False,) * len(ids)
        if forced_text and self.tokenizer is not None:
            start = len(self.tokenizer.encode(text[:text.index(forced_text)]))
            n_forced = len(self.tokenizer.encode(forced_text))
            forced = tuple(start <= i < start + n_forced for i in range(len(ids)))
            lps = tuple(0.0 if f else lp for f, lp in zip(forced, lps))
        return Completion(token_ids=ids, logprobs=lps, finish_reason="length" if finish == "length" else "stop",
                          text=text, thinking=thinking, answer=answer, forced=forced, budget_hit=bool(forced_text))

    # ------------------------------------------------------------------ raw completions

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` raw completions per token-id prompt."""
        jobs = [(i, list(map(int, p))) for i, p in enumerate(prompts)]
        for i, p in jobs:
            if not p:
                raise ValueError(f"prompt {i} is empty")
        return self._map(lambda job: self._raw_group(*job, params), jobs)

    def _raw_group(self, index: int, prompt: list[int], params: SamplingParams) -> list[Completion]:
        opened = (self.prompt_opens_think if self.prompt_opens_think is not None
                  else prompt_opens_think(prompt, self.tokens))
        budget = params.thinking_budget if self.tokenizer is not None else None
        first_cap = min(params.max_tokens, budget) if budget is not None and opened else params.max_tokens
        body = {**self._common(params, params.n, first_cap, index), "prompt": prompt, "logprobs": 1}
        choices = sorted(self._post("/completions", body)["choices"], key=lambda c: c.get("index", 0))
        if len(choices) != params.n:
            raise RuntimeError(f"{self.base_url}/completions returned {len(choices)} choices for n={params.n}")
        out = []
        for j, choice in enumerate(choices):
            text, finish = choice.get("text") or "", choice.get("finish_reason")
            logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
            forced_text = ""
            if budget is not None and opened and finish == "length" and THINK_CLOSE not in text:
                used = len(self.tokenizer.encode(text))
                forced_text = CLOSE_THINK_TEXT
                left = params.max_tokens - used - len(self.tokenizer.encode(forced_text))
                text += forced_text
                logprobs = None
                if left > 0:  # continue the answer after the forced close, within max_tokens
                    more = {**self._common(params, 1, left, index * 1_000_003 + j), "logprobs": 1,
                            "prompt": self.tokenizer.decode(prompt) + text}
                    cont = self._post("/completions", more)["choices"][0]
                    text += cont.get("text") or ""
                    finish = cont.get("finish_reason")
            thinking, answer = _split_text(text, opened)
            out.append(self._completion(text, thinking, answer, finish, logprobs, forced_text))
        return out

    # ------------------------------------------------------------------ chat

    def chat(self, conversations: Sequence[Sequence[Mapping[str, str]]], params: SamplingParams
             ) -> list[list[Completion]]:
        """`params.n` chat completions per conversation (a list of `{"role", "content"}` messages)."""
        jobs = list(enumerate(conversations))
        return self._map(lambda job: self._chat_group(*job, params), jobs)

    def _chat_group(self, index: int, messages: Sequence[Mapping[str, str]], params: SamplingParams
                    ) -> list[Completion]:
        body = {**self._common(params, params.n, params.max_tokens, index), "messages": list(messages),
                "logprobs": True}
        choices = sorted(self._post("/chat/completions", body)["choices"], key=lambda c: c.get("index", 0))
        out = []
        for choice in choices:
            message = choice.get("message") or {}
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content")
            if reasoning is not None:
                text, thinking, answer = f"{THINK_OPEN}\n{reasoning}{CLOSE_THINK_TEXT}{content}", reasoning, content
            else:
                text = content
                thinking, answer = _split_text(content, False)
            entries = (choice.get("logprobs") or {}).get("content")
            logprobs = None if not entries else [e.get("logprob", math.nan) for e in entries]
            out.append(self._completion(text, thinking, answer, choice.get("finish_reason"), logprobs))
        return out

    def update_weights(self, model: Any, *, step: int) -> None:
        """A remote endpoint serves its own weights: nothing to push."""
        raise NotImplementedError("the openai engine serves a remote model; it cannot take new weights")


@register_engine("openai")
def make_openai_engine(base_url: str, model: str, tokenizer: Any = None, **kwargs: Any) -> OpenAIEngine:
    """`make_engine("openai", base_url=..., model=..., tokenizer=...)`: see `OpenAIEngine`."""
    return OpenAIEngine(base_url, model, tokenizer, **kwargs)
