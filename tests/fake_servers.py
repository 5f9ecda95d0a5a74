"""Local stand-ins for SGLang and OpenAI-compatible servers (127.0.0.1 only), for the engine tests.

`FakeSGLang` speaks SGLang 0.5.23's native JSON (`/generate`, `/update_weights_from_disk`,
`/flush_cache`, `/health_generate`, `/get_model_info`) and checks every request against
the contract of SGLang's `sglang.api.v1` schema: the field names and types below are
those of its `GenerateRequest` and `SamplingParams` (unknown sampling keys are rejected
there, so they are here) and of `UpdateWeightFromDiskReqInput`. When the real schema
module (`sglang.api.v1.api_types`) is importable, requests and answers also go through it.
"""

from __future__ import annotations

import http.server
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

try:  # the generated schema of a real SGLang install, when present
    from sglang.api.v1 import api_types as sglang_schema
except Exception:  # noqa: BLE001 - sglang does not import on machines without its GPU stack
    sglang_schema = None

GENERATE_FIELDS = {
    "rid", "text", "input_ids", "stream", "sampling_params", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "token_ids_logprob", "return_hidden_states", "return_text_in_logprobs", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "routed_dp_rank",
    "disagg_prefill_dp_rank", "image_data", "mm_hashes", "video_data", "audio_data", "extra_key", "priority",
    "cache_salt", "require_reasoning", "lora_path", "session_params", "kv_hints", "routing_key",
    "max_thinking_tokens", "session_id", "custom_logit_processor", "custom_labels", "images_config",
    "return_prompt_token_ids", "routed_experts_start_len", "return_sampling_mask", "modalities",
}  # fmt: skip
SAMPLING_FIELDS = {  # name -> accepted JSON types
    "max_new_tokens": (int,), "stop": (str, list), "stop_token_ids": (list,), "stop_regex": (str, list),
    "temperature": (int, float), "top_p": (int, float), "top_k": (int,), "min_p": (int, float),
    "frequency_penalty": (int, float), "presence_penalty": (int, float), "repetition_penalty": (int, float),
    "min_new_tokens": (int,), "n": (int,), "json_schema": (str,), "regex": (str,), "ebnf": (str,),
    "structural_tag": (str,), "ignore_eos": (bool,), "skip_special_tokens": (bool,),
    "spaces_between_special_tokens": (bool,), "no_stop_trim": (bool,), "stream_interval": (int,),
    "logit_bias": (dict,), "sampling_seed": (int,), "custom_params": (object,), "beam_width": (int,),
    "watermark": (dict,), "choice": (list,),
}  # fmt: skip
UPDATE_FIELDS = {
    "model_path": (str,), "load_format": (str,), "abort_all_requests": (bool,), "weight_version": (str,),
    "is_async": (bool,), "torch_empty_cache": (bool,), "keep_pause": (bool,), "recapture_cuda_graph": (bool,),
    "token_step": (int,), "flush_cache": (bool,), "manifest": (dict,),
}  # fmt: skip


class ContractError(ValueError):
    pass


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _typed(v: Any, types: tuple) -> bool:
    if v is None:
        return True
    if int in types and _is_int(v):
        return True
    return any(isinstance(v, t) and not (isinstance(v, bool) and t is not bool) for t in types)


def check_generate(body: Any) -> int:
    """Raise ContractError unless `body` is a valid batched /generate request; returns the batch size."""
    if not isinstance(body, dict):
        raise ContractError("body is not an object")
    unknown = set(body) - GENERATE_FIELDS
    if unknown:
        raise ContractError(f"fields SGLang does not know: {sorted(unknown)}")
    ids = body.get("input_ids")
    if not (isinstance(ids, list) and ids and all(isinstance(x, list) and x and all(_is_int(t) and t >= 0 for t in x)
                                                   for x in ids)):
        raise ContractError("input_ids must be a non-empty list of non-empty token-id lists")
    sp = body.get("sampling_params")
    sps = sp if isinstance(sp, list) else [sp]
    if isinstance(sp, list) and len(sp) != len(ids):
        raise ContractError("one sampling_params per input_ids entry")
    for p in sps:
        if not isinstance(p, dict):
            raise ContractError("sampling_params must be objects")
        for k, v in p.items():
            if k not in SAMPLING_FIELDS:
                raise ContractError(f"unknown field `{k}` in sampling_params")
            if not _typed(v, SAMPLING_FIELDS[k]):
                raise ContractError(f"sampling_params.{k} has the wrong type: {v!r}")
        if "stop_token_ids" in p and not all(_is_int(t) for t in p["stop_token_ids"]):
            raise ContractError("stop_token_ids must be integers")
        if p.get("top_k", -1) != -1 and p["top_k"] < 1:
            raise ContractError("top_k must be -1 (disable) or at least 1")
        if "top_p" in p and not 0 < p["top_p"] <= 1:
            raise ContractError("top_p must be in (0, 1]")
    if not isinstance(body.get("return_logprob", False), bool):
        raise ContractError("return_logprob must be a boolean")
    if sglang_schema is not None:
        sglang_schema.GenerateRequest.from_json_value(body)
    return len(ids)


def check_update(body: Any) -> None:
    if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
        raise ContractError("update_weights_from_disk needs model_path (a string)")
    for k, v in body.items():
        if k not in UPDATE_FIELDS or not _typed(v, UPDATE_FIELDS[k]):
            raise ContractError(f"bad field {k}={v!r}")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a connection the fake cut on purpose


class FakeServer:
    """An HTTP server on 127.0.0.1 in a thread; `respond(method, path, body) -> (status, json or text)`."""

    def __init__(self):
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        self.dead = False
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with outer.lock:
                    outer.requests.append((method, self.path, body))
                result = outer.respond(method, self.path, body, dict(self.headers))
                if result is None:  # die: cut the connection without an answer
                    self.close_connection = True
                    self.connection.close()
                    return
                status, payload, headers = result if len(result) == 3 else (*result, {})
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def respond(self, method: str, path: str, body: Any, headers: dict) -> tuple | None:
        raise NotImplementedError

    def kill(self) -> None:
        """Stop listening (later connections are refused)."""
        self.dead = True
        threading.Thread(target=self._stop, daemon=True).start()

    def _stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def close(self) -> None:
        if not self.dead:
            self.dead = True
            self._stop()


class FakeSGLang(FakeServer):
    """SGLang's native API over a made-up model: tokens drawn from `random.Random(sampling_seed + prompt)`.

    A sample's tokens depend only on its input ids and sampling seed, so a prompt re-run on
    another server gives the same completion. `eos` ends a sample with probability `p_eos`
    per token; `die_after` generate requests are answered, then the server dies mid-request;
    `fail_first` requests get a 503 first. A weight update takes `update_delay` seconds;
    `events` records `(time.monotonic(), what, body)` for each /generate arrival ("generate",
    its request) and each update's start and answer ("update", "updated"; body None).
    """

    def __init__(self, *, vocab=(10, 60), eos=2, p_eos=0.08, die_after=None, fail_first=0, delay=0.0,
                 update_delay=0.0):
        self.vocab, self.eos, self.p_eos = vocab, eos, p_eos
        self.die_after, self.fail_first, self.delay = die_after, fail_first, delay
        self.update_delay = update_delay
        self.events: list[tuple[float, str, Any]] = []
        self.generated = 0
        self.loaded: list[str] = []
        self.flushes = 0
        super().__init__()

    def sample(self, ids: list[int], p: dict) -> dict:
        rng = random.Random(hash((p.get("sampling_seed", 0), tuple(ids))))
        stops = set(p.get("stop_token_ids") or ()) | {self.eos}
        out, logps, reason = [], [], {"type": "length", "length": p["max_new_tokens"]}
        for _ in range(p["max_new_tokens"]):
            t = self.eos if rng.random() < self.p_eos else rng.randrange(*self.vocab)
            out.append(t)
            logps.append([-3 * rng.random(), t, None])
            if t in stops:
                reason = {"type": "stop", "matched": t}
                break
        answer = {"text": " ".join(map(str, out)), "output_ids": out,
                  "meta_info": {"id": f"{rng.random():.12f}", "prompt_tokens": len(ids), "completion_tokens": len(out),
                                "finish_reason": reason, "output_token_logprobs": logps, "cached_tokens": 0}}
        if sglang_schema is not None:
            sglang_schema.GenerateResponse.from_json_value(answer)
        return answer

    def respond(self, method, path, body, headers):
        if self.dead:
            return None
        if path == "/get_model_info" and method == "GET":
            return 200, {"model_path": self.loaded[-1] if self.loaded else "/models/fake", "is_generation": True,
                         "weight_version": "default", "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
        if path == "/health_generate" and method == "GET":
            return 200, ""
        if path == "/flush_cache" and method == "POST":
            self.flushes += 1
            return 200, "Cache flushed.\n"
        if path == "/update_weights_from_disk" and method == "POST":
            self.events.append((time.monotonic(), "update", None))
            time.sleep(self.update_delay)
            try:
                check_update(body)
            except ContractError as e:
                return 400, {"success": False, "message": str(e), "num_paused_requests": 0}
            if not (Path(body["model_path"]) / "config.json").exists():
                return 400, {"success": False, "message": "no config.json", "num_paused_requests": 0}
            self.loaded.append(body["model_path"])
            self.events.append((time.monotonic(), "updated", None))
            return 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        if path == "/generate" and method == "POST":
            self.events.append((time.monotonic(), "generate", body))
            with self.lock:
                self.generated += 1
                n = self.generated
            if self.die_after is not None and n > self.die_after:
                self.kill()
                return None
            if n <= self.fail_first:
                return 503, {"error": "overloaded"}
            try:
                check_generate(body)
            except (ContractError, ValueError) as e:
                return 400, {"error": str(e)}
            time.sleep(self.delay)
            sps = body["sampling_params"]
            return 200, [self.sample(ids, sp) for ids, sp in zip(body["input_ids"], sps)]
        return 404, {"detail": "Not Found"}


class FakeOpenAI(FakeServer):
    """An OpenAI-compatible `/v1/completions` and `/v1/chat/completions` over made-up words.

    A choice is `max_tokens` words, one token each in the Qwen vocabularies.
    The first `rate_limited` requests get 429 with `Retry-After: 0`; a request for model
    "missing" gets 404; `key` is the API key it requires (None: any). It records the most
    requests it had in flight at once.
    """

    def __init__(self, *, rate_limited=0, key=None, delay=0.0, reasoning=False):
        self.rate_limited, self.key, self.delay, self.reasoning = rate_limited, key, delay, reasoning
        self.count = self.in_flight = self.max_in_flight = 0
        super().__init__()

    WORDS = {"a": (" the", " of", " and", " to", " in"), "b": (" is", " it", " for", " on", " that")}

    @classmethod
    def words(cls, n: int, tag: str) -> str:
        """n words, one token each: from set "a" for token-id prompts, "b" for text prompts."""
        return "".join(cls.WORDS[tag][i % 5] for i in range(n))

    def respond(self, method, path, body, headers):
        if self.key is not None and headers.get("Authorization") != f"Bearer {self.key}":
            return 401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
        with self.lock:
            self.count += 1
            n_req = self.count
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if n_req <= self.rate_limited:
                return 429, {"error": {"message": "Rate limit reached", "type": "requests"}}, {"Retry-After": "0"}
            if body.get("model") == "missing":
                return 404, {"error": {"message": "The model `missing` does not exist",
                                       "type": "invalid_request_error"}}
            time.sleep(self.delay)
            n, m = body.get("n", 1), body["max_tokens"]
            if path == "/v1/completions":
                tag = "a" if isinstance(body["prompt"], list) else "b"
                choices = [{"index": j, "text": self.words(m, tag), "finish_reason": "length",
                            "logprobs": {"tokens": [self.WORDS[tag][i % 5] for i in range(m)],
                                         "token_logprobs": [-0.5] * m}} for j in range(n)]
                return 200, {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": choices}
            if path == "/v1/chat/completions":
                message = ({"role": "assistant", "content": "Fixed.", "reasoning_content": "Line 2."} if self.reasoning
                           else {"role": "assistant", "content": "<think>\nLine 2.\n</think>\n\nFixed."})
                choices = [{"index": j, "message": message, "finish_reason": "stop", "logprobs": None}
                           for j in range(n)]
                return 200, {"id": "chat-1", "object": "chat.completion", "model": body["model"], "choices": choices}
            return 404, {"error": {"message": "not found"}}
        finally:
            with self.lock:
                self.in_flight -= 1
