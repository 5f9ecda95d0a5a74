"""Check the `sglang` engine's requests (and the test fake's answers) against SGLang's own JSON schema.

SGLang's `/generate` validates bodies with a generated module, `sglang/api/v1/api_types.py`,
which needs only `msgspec`, but `import sglang` pulls in its GPU stack. This script loads
that one file from an unpacked SGLang wheel, plugs it into the test fake, runs the
engine (thinking budget, stops, top-k/top-p, several prompts) and decodes every request
the fake received with `GenerateRequest.from_json_value` (the fake decodes its own
answers with `GenerateResponse.from_json_value`).

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl && cd /tmp/sgl && unzip -q sglang-*.whl 'sglang/api/*'
    pip install msgspec
    python scripts/check_sglang_contract.py /tmp/sgl/sglang/api/v1/api_types.py
"""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import fake_servers  # noqa: E402
from jaxrl.rollout import SamplingParams  # noqa: E402
from jaxrl.rollout.sglang_engine import SGLangEngine  # noqa: E402
from jaxrl.rollout.text import TokenSpec  # noqa: E402


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("sglang_api_types", sys.argv[1])
    schema = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(schema)
    fake_servers.sglang_schema = schema
    server = fake_servers.FakeSGLang(p_eos=0.05)
    try:
        tokens = TokenSpec(stop_ids=(2,), think_open=5, think_close=6, close_think=(7, 6, 8), turn_start=1)
        engine = SGLangEngine([server.url], tokens=tokens)
        engine.generate([[1, 20, 5], [1, 21], [1, 22, 23, 5]], SamplingParams(
            n=3, temperature=0.7, top_k=20, top_p=0.9, max_tokens=12, thinking_budget=4, stop_token_ids=(11,)))
        engine.generate([[1, 20]], SamplingParams(n=2, temperature=0.0, max_tokens=5, thinking_budget=None))
        bodies = [b for _, path, b in server.requests if path == "/generate"]
        for body in bodies:
            schema.GenerateRequest.from_json_value(body)
    finally:
        server.close()
    print(f"{len(bodies)} /generate requests and their answers decode with {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
