"""The `sglang` engine: a client of SGLang's native HTTP API (pinned: SGLang 0.5.23), several servers at once.

Requests (the JSON contract of SGLang's `sglang.api.v1` schema, which `/generate` enforces):

- `POST /generate` with `input_ids` (a list of token lists), `sampling_params` (one dict per
  list entry: `max_new_tokens`, `temperature`, `top_p`, `top_k` (-1 = all), `stop_token_ids`,
  `sampling_seed`, `skip_special_tokens: false`, `no_stop_trim: true`) and
  `return_logprob: true`. The answer is one object per entry with `output_ids` and
  `meta_info.output_token_logprobs` (`[logprob, token_id, text]` per token) and
  `meta_info.finish_reason` (`{"type": "stop" | "length" | "abort", ...}`).
- `POST /update_weights_from_disk` with `model_path` (and `weight_version`, `flush_cache`),
  after `models.save_pretrained` wrote the new weights to a directory every server can read.
- `POST /flush_cache`, `GET /health_generate`, `GET /get_model_info`.

A prompt's n samples go to one server in one request, so its prefix cache holds the prompt
once. The thinking budget is enforced by the client exactly as the `jax` engine does:
a sample is generated up to the budget, and one still inside its think block gets the
tokens of `\\n</think>\\n\\n` appended before a second request continues it (`forced`).

SGLang reports log-probs of `softmax(logits / temperature)` before top-k / top-p
(`log_softmax(logits)` when greedy), the same quantity as the `jax` engine.

Failures: each request has a timeout and is retried with exponential backoff on
connection errors, 429 and 5xx; a server that still fails is dropped from the pool with
a `ServerDroppedWarning`, and its prompts are re-run from scratch on the servers left.
A 4xx answer is a `ValueError` (a bad request stays bad on any server).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import shutil
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxrl.rollout.engine import Completion, Engine, SamplingParams, register_engine
from jaxrl.rollout.http import ConnectionFailed, HTTPStatusError, RetryPolicy, request_json, with_retries
from jaxrl.rollout.text import TokenSpec, make_completion, prompt_opens_think, think_state

SGLANG_VERSION = "0.5.23"


class ServerDroppedWarning(RuntimeWarning):
    """A server stopped answering and was removed from the pool."""


class ServerDown(Exception):
    """One server failed a request after its retries."""


def _seed(seed: int, prompt: int, sample: int, round_: int) -> int:
    """A per-request sampling seed that depends only on its coordinates."""
    digest = hashlib.sha256(f"{seed}:{prompt}:{sample}:{round_}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclasses.dataclass
class _Sample:
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    forced: list[bool] = dataclasses.field(default_factory=list)
    finish: str | None = None


class SGLangEngine(Engine):
    """Completions from SGLang (or sglang-jax) servers; see the module docstring.

    Args:
        urls: the servers' base URLs (`http://host:30000`).
        tokenizer: a `models.tokenizer.QwenTokenizer` (stop ids, think block, text).
        tokens: the special tokens to act on (default: from `tokenizer`).
        weights_dir: where `update_weights` writes HF safetensors; must be readable by
            every server under the same path (a shared filesystem).
        keep_weights: weight directories kept in `weights_dir` (older ones are removed).
        prompt_opens_think: force whether prompts open a think block (default: read the prompt).
        retry: timeout, tries and backoff of each request.
        max_concurrency: requests in flight at once over all servers.
        api_key: sent as a bearer token (SGLang's `--api-key`).
    """

    def __init__(self, urls: Sequence[str], tokenizer: Any = None, *, tokens: TokenSpec | None = None,
                 weights_dir: str | os.PathLike | None = None, keep_weights: int = 2,
                 prompt_opens_think: bool | None = None, retry: RetryPolicy = RetryPolicy(),
                 max_concurrency: int = 64, api_key: str | None = None):
        if not urls:
            raise ValueError("the sglang engine needs at least one server URL")
        if max_concurrency < 1 or keep_weights < 1:
            raise ValueError("max_concurrency and keep_weights must be positive")
        self.tokenizer = tokenizer
        self.tokens = tokens or (TokenSpec.from_tokenizer(tokenizer) if tokenizer is not None else TokenSpec())
        self.weights_dir = None if weights_dir is None else Path(weights_dir)
        self.keep_weights = keep_weights
        self.prompt_opens_think = prompt_opens_think
        self.retry = retry
        self.max_concurrency = max_concurrency
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._lock = threading.Lock()
        self._load: dict[str, int] = {}
        self.model_info: dict[str, Any] = {}
        for url in dict.fromkeys(u.rstrip("/") for u in urls):
            try:
                self.model_info[url] = self._call(url, "GET", "/get_model_info")
                self._load[url] = 0
            except ServerDown as e:
                warnings.warn(f"sglang server {url} is not answering ({e}); left out of the pool",
                              ServerDroppedWarning, stacklevel=2)
        if not self._load:
            raise RuntimeError(f"none of the sglang servers answered: {', '.join(urls)}")
        self._written: list[Path] = []

    # ------------------------------------------------------------------ servers

    @property
    def servers(self) -> list[str]:
        """The servers still in the pool."""
        with self._lock:
            return list(self._load)

    def _call(self, url: str, method: str, path: str, body: Any = None) -> Any:
        try:
            return with_retries(lambda: request_json(method, url + path, body, headers=self.headers,
                                                     timeout=self.retry.timeout), self.retry)
        except HTTPStatusError as e:
            if e.retryable:
                raise ServerDown(str(e)) from None
            raise ValueError(f"sglang server rejected {path}: {e}") from None
        except ConnectionFailed as e:
            raise ServerDown(str(e)) from None

    def _acquire(self) -> str:
        with self._lock:
            if not self._load:
                raise RuntimeError("every sglang server has been dropped from the pool")
            url = min(self._load, key=self._load.get)
            self._load[url] += 1
            return url

    def _release(self, url: str) -> None:
        with self._lock:
            if url in self._load:
                self._load[url] -= 1

    def _drop(self, url: str, why: Exception) -> None:
        with self._lock:
            if self._load.pop(url, None) is None:
                return
            left = len(self._load)
        warnings.warn(f"dropping sglang server {url} from the pool ({why}); {left} left", ServerDroppedWarning,
                      stacklevel=3)

    def health(self) -> dict[str, bool]:
        """`GET /health_generate` on every server in the pool (a one-token generation)."""
        out = {}
        for url in self.servers:
            try:
                self._call(url, "GET", "/health_generate")
                out[url] = True
            except ServerDown:
                out[url] = False
        return out

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Completion]]:
        """`params.n` completions per prompt; each prompt's samples on one server."""
        prompts = [list(map(int, p)) for p in prompts]
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
        workers = max(1, min(self.max_concurrency, len(prompts)))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = [pool.submit(self._group, i, p, params) for i, p in enumerate(prompts)]
            return [f.result() for f in futures]

    def _group(self, index: int, prompt: list[int], params: SamplingParams) -> list[Completion]:
        """All samples of one prompt, moved to another server if theirs goes down."""
        while True:
            url = self._acquire()
            try:
                return self._group_on(url, index, prompt, params)
            except ServerDown as e:
                self._drop(url, e)
            finally:
                self._release(url)

    def _group_on(self, url: str, index: int, prompt: list[int], params: SamplingParams) -> list[Completion]:
        spec = self.tokens
        opened = self.prompt_opens_think if self.prompt_opens_think is not None else prompt_opens_think(prompt, spec)
        budget = params.thinking_budget if spec.think_open is not None else None
        stops = tuple(dict.fromkeys(spec.stop_ids + tuple(params.stop_token_ids)))
        samples = [_Sample() for _ in range(params.n)]
        for round_ in range(params.max_tokens + 1):
            todo = []
            for j, s in enumerate(samples):
                if s.finish is not None:
                    continue
                remaining = params.max_tokens - len(s.tokens)
                state = think_state(s.tokens, opened, spec)
                if budget is not None and state.inside and state.spent >= budget:
                    close = list(spec.close_think[:remaining])
                    s.tokens += close
                    s.logprobs += [0.0] * len(close)
                    s.forced += [True] * len(close)
                    remaining -= len(close)
                if remaining <= 0:
                    s.finish = "length"
                    continue
                cap = remaining
                if budget is not None and state.inside and state.spent < budget:
                    cap = min(cap, budget - state.spent)
                elif budget is not None and not state.seen and not s.tokens:
                    cap = min(cap, budget + 1)  # room for a sampled <think> and the budget after it
                todo.append((j, cap))
            if not todo:
                break
            body = {
                "input_ids": [prompt + samples[j].tokens for j, _ in todo],
                "sampling_params": [self._sampling(params, cap, stops, _seed(params.seed, index, j, round_))
                                    for j, cap in todo],
                "return_logprob": True,
            }
            answers = self._call(url, "POST", "/generate", body)
            if not isinstance(answers, list) or len(answers) != len(todo):
                raise ServerDown(f"{url}/generate answered {type(answers).__name__}, not {len(todo)} results")
            for (j, cap), answer in zip(todo, answers):
                self._absorb(url, samples[j], answer, cap)
        decode = None if self.tokenizer is None else self.tokenizer.decode
        spec_stops = dataclasses.replace(spec, stop_ids=stops)
        return [make_completion(s.tokens, s.logprobs, s.forced, s.finish, opened, spec_stops, decode)
                for s in samples]

    @staticmethod
    def _sampling(params: SamplingParams, cap: int, stops: tuple[int, ...], seed: int) -> dict[str, Any]:
        return {"max_new_tokens": cap, "temperature": params.temperature, "top_p": params.top_p,
                "top_k": params.top_k or -1, "stop_token_ids": list(stops), "sampling_seed": seed,
                "skip_special_tokens": False, "no_stop_trim": True}

    @staticmethod
    def _absorb(url: str, s: _Sample, answer: Any, cap: int) -> None:
        """Append one `/generate` result to a sample; a malformed one counts against the server."""
        try:
            meta = answer["meta_info"]
            entries = meta["output_token_logprobs"]
            ids = answer.get("output_ids") or [e[1] for e in entries]
            logprobs = [float(e[0]) if e[0] is not None else 0.0 for e in entries]
            reason = meta["finish_reason"]["type"]
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise ServerDown(f"{url}/generate answered without output ids, log-probs or finish reason ({e})")
        if reason == "abort":
            raise ServerDown(f"{url} aborted a request: {meta['finish_reason'].get('message')}")
        if len(ids) != len(logprobs) or len(ids) > cap:
            raise ServerDown(f"{url}/generate answered {len(ids)} ids, {len(logprobs)} log-probs for {cap} tokens")
        s.tokens += [int(t) for t in ids]
        s.logprobs += logprobs
        s.forced += [False] * len(ids)
        if reason == "stop":
            s.finish = "stop"
        elif len(ids) < cap:  # "length" short of our cap: the server's own context limit
            s.finish = "length"

    # ------------------------------------------------------------------ weights

    def update_weights(self, model: Any, *, step: int) -> None:
        """Write `model` (an nnx model; or a directory already written) as HF safetensors and load it everywhere.

        With an nnx model, every process of a multi-host trainer must call this
        (`save_pretrained` gathers the shards; process 0 writes and tells the servers), and
        no process returns before every server acknowledged the new weights: process 0's
        outcome is shared with all hosts (a collective, hence a barrier), so no host can
        sample the next step from the old weights, and a failed push fails on every host.
        """
        if isinstance(model, (str, os.PathLike)):
            self._push(Path(model), step)
            return
        if self.weights_dir is None:
            raise ValueError("update_weights needs weights_dir, a directory the servers can read")
        import jax

        from jaxrl import hosts
        from models.checkpoint import save_pretrained

        path = self.weights_dir / f"step-{step:08d}"
        save_pretrained(model, path)
        failure = None
        if jax.process_index() == 0:
            try:
                if self.tokenizer is not None:
                    self.tokenizer.save_pretrained(path)
                self._push(path, step)
            except Exception as e:  # noqa: BLE001 - re-raised below, after the other hosts heard of it
                failure = e
        failures = hosts.gather_json(None if failure is None else f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure
        if failures[0] is not None:
            raise RuntimeError(f"process 0 could not push the weights of step {step}: {failures[0]}")
        if jax.process_index() == 0:
            self._written.append(path)
            while len(self._written) > self.keep_weights:
                shutil.rmtree(self._written.pop(0), ignore_errors=True)

    def _flush(self, url: str, tries: int = 20) -> None:
        """`POST /flush_cache`; SGLang refuses it (400) while a finished batch is still being retired."""
        for attempt in range(tries):
            try:
                self._call(url, "POST", "/flush_cache")
                return
            except ServerDown as e:
                self._drop(url, e)
                return
            except ValueError:
                if attempt == tries - 1:
                    raise
                time.sleep(self.retry.wait(1))

    def _push(self, path: Path, step: int) -> None:
        """`/update_weights_from_disk` then `/flush_cache` on every server; returns once each answered."""
        body = {"model_path": str(path.resolve()), "weight_version": str(step), "flush_cache": True}
        for url in self.servers:
            try:
                answer = self._call(url, "POST", "/update_weights_from_disk", body)
            except ServerDown as e:
                self._drop(url, e)
                continue
            except ValueError as e:  # SGLang answers a failed load with 400 and success false
                answer = str(e)
            if not (isinstance(answer, dict) and answer.get("success")):
                raise RuntimeError(f"{url} could not load the weights of step {step} from {path}: {answer}")
            self._flush(url)
        if not self.servers:
            raise RuntimeError("every sglang server has been dropped from the pool")


@register_engine("sglang")
def make_sglang_engine(urls: Sequence[str], tokenizer: Any = None, model: Any = None, mesh: Any = None,
                       rules: Any = None, **kwargs: Any) -> SGLangEngine:
    """`make_engine("sglang", urls=[...], tokenizer=..., weights_dir=...)`: see `SGLangEngine`.

    Given the trainer's `model` (the trainer passes it, with its mesh and rules, which the
    servers do not need), the engine pushes it at once, so that the first rollouts come from
    the policy being trained (or resumed), not from whatever the servers were launched on.
    """
    del mesh, rules
    engine = SGLangEngine(urls, tokenizer, **kwargs)
    if model is not None:
        if engine.weights_dir is None:
            raise ValueError("training with the sglang engine needs rollout.options.weights_dir, a directory "
                             "every server can read, for the weight pushes")
        try:
            engine.update_weights(model, step=0)
        except RuntimeError as e:
            raise ValueError(f"pushing the initial weights to the servers failed: {e}") from None
    return engine
