"""A fake OpenAI-compatible server on 127.0.0.1 that answers from a fixed table and records every request.

`/v1/completions` answers a prompt (text, or token ids decoded with `decode`)
with the table entry whose key the prompt contains (the text continues the
opened think block, as a Qwen3.5 server would); `/v1/chat/completions` looks the key up in the messages and returns the
thinking apart as `reasoning_content` (as SGLang and vLLM reasoning parsers do)
and the answer as `content`. A table entry that is a list is a script of replies:
entry i answers a conversation with i assistant turns so far (chat messages, or
`<|im_start|>assistant` turns of a token prompt), so multi-turn agents can be replayed.
The first `fail_first` requests get a 429.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    def __init__(self, answers: dict[str, str], model: str = "fake-model", fail_first: int = 0,
                 delay_s: float = 0.0, decode=None):
        self.answers, self.model, self.fail_first, self.delay_s = answers, model, fail_first, delay_s
        self.decode = decode  # token ids -> text, for prompts sent as token ids
        self.requests: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with fake.lock:
                    fake.requests.append((self.path, body))
                    failing = len(fake.requests) <= fake.fail_first
                if failing:
                    self._send(429, {"error": {"message": "rate limited", "type": "rate_limit"}})
                    return
                if fake.delay_s:
                    threading.Event().wait(fake.delay_s)
                self._send(*fake.answer(self.path, body))

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that hangs up early is not the test's concern

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def lookup(self, text: str, turn: int = 0) -> str | None:
        value = next((v for k, v in self.answers.items() if k in text), None)
        return value[turn] if isinstance(value, list) else value

    def answer(self, path: str, body: dict) -> tuple[int, dict]:
        n = int(body.get("n", 1))
        usage = {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30}
        if path.endswith("/chat/completions"):
            messages = body.get("messages", [])
            text = self.lookup(json.dumps(messages, ensure_ascii=False).replace("\\n", "\n"),
                               sum(m.get("role") == "assistant" for m in messages))
            if text is None:
                return 400, {"error": {"message": "no table entry for these messages"}}
            reasoning, content = text.split("</think>", 1) if "</think>" in text else (text, "")
            message = {"role": "assistant", "content": content.lstrip("\n"), "reasoning_content": reasoning.rstrip("\n")}
            finish = "stop" if "</think>" in text else "length"
            choices = [{"index": i, "message": message, "finish_reason": finish} for i in range(n)]
            return 200, {"id": "chatcmpl-fake", "object": "chat.completion", "model": self.model,
                         "choices": choices, "usage": usage}
        if path.endswith("/completions"):
            prompt = body.get("prompt")
            prompt = prompt if isinstance(prompt, str) else self.decode(prompt) if self.decode else ""
            text = self.lookup(prompt, prompt.count("<|im_start|>assistant") - 1)
            if text is None:
                return 400, {"error": {"message": "no table entry for this prompt"}}
            finish = "stop" if "</think>" in text else "length"
            choices = [{"index": i, "text": text, "finish_reason": finish, "logprobs": None} for i in range(n)]
            return 200, {"id": "cmpl-fake", "object": "text_completion", "model": self.model,
                         "choices": choices, "usage": usage}
        return 404, {"error": {"message": f"no route {path}"}}

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
