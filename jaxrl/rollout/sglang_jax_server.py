"""An sglang-jax server with `/update_weights_from_disk`: what `precisecoder serve` runs.

This file runs BY PATH under sglang-jax's own Python (`.venv-sglang-jax`, Python >= 3.12,
pins of its own): it imports only the standard library and `sgl_jax`, never the project's
packages. It starts sglang-jax's engine in this process (`enable_single_process`: the
scheduler is a thread, so its model runner is reachable) behind sglang-jax's own HTTP app,
which serves SGLang's native `/generate`, `/health_generate`, `/get_model_info` and
`/flush_cache`, and adds SGLang's `POST /update_weights_from_disk` (`model_path`,
optional `load_format`; answer `success`, `message`). An update reads the new
safetensors with the model's own sglang-jax weight loader into the running model, swaps
the flat parameter leaves the jitted forward takes (same shapes and shardings: nothing
recompiles) and flushes the prefix cache.

Usage: PY sglang_jax_server.py --model-path DIR --port P [--host H] [--device cpu|tpu] [...]
"""

import argparse
import asyncio
import os
import sys
import threading
import time

# Run by path, this file's directory (jaxrl/rollout, which holds an `http.py`) would shadow the stdlib.
if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]

# CPU caps that fit a small machine (the sglang-jax defaults ask for ~141 GB at start there);
# on TPU its own defaults apply unless given. One running request at a time: on the CPU with
# the native attention backend, sglang-jax 0.1.0rc0 decodes wrong tokens for some rows of a
# batch of several requests (greedy, float32; docs/pods.md, "Findings"), one at a time is exact.
CPU_DEFAULTS = {"max_total_tokens": 4096, "context_length": 1024, "max_running_requests": 1,
                "chunked_prefill_size": 512, "max_prefill_tokens": 512}
FLUSH_TRIES = 50  # the scheduler refuses a flush while it finishes its last batch: try again


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", choices=("cpu", "tpu"), default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--random-seed", type=int, default=0)
    for name in CPU_DEFAULTS:
        p.add_argument("--" + name.replace("_", "-"), type=int)
    p.add_argument("--disable-radix-cache", action="store_true",
                   help="no prefix cache (sglang-jax requires it for Qwen3.5's recurrent state)")
    p.add_argument("--log-level", default="warning")
    return p.parse_args(argv)


def server_args(args: argparse.Namespace):
    """sglang-jax's ServerArgs: token ids in and out, in-process scheduler, native attention on CPU."""
    from sgl_jax.srt.server_args import ServerArgs

    kwargs = {name: getattr(args, name) for name in CPU_DEFAULTS if getattr(args, name) is not None}
    if args.device == "cpu":
        # the fused gated-delta prefill (Qwen3.5's linear attention) needs a TPU mesh; its pure-JAX one runs anywhere
        kwargs = {**CPU_DEFAULTS, **kwargs, "attention_backend": "native", "disable_precompile": True,
                  "gdn_prefill_impl": "chunked_jax"}
    return ServerArgs(model_path=args.model_path, host=args.host, port=args.port, device=args.device,
                      dtype=args.dtype, tp_size=args.tp_size, random_seed=args.random_seed,
                      skip_tokenizer_init=True, enable_single_process=True, log_level=args.log_level,
                      disable_radix_cache=args.disable_radix_cache, **kwargs)


class WeightSwapper:
    """Loads a model directory into the running model runner; one update at a time."""

    def __init__(self):
        self.runner = None
        self.lock = threading.Lock()

    def capture(self, scheduler_info: dict) -> None:
        self.runner = scheduler_info["scheduler"].tp_worker.worker.model_runner

    def load(self, model_path: str, load_format: str | None) -> tuple[bool, str]:
        """(success, message), the answer SGLang gives."""
        import jax
        from flax import nnx

        if load_format not in (None, "auto", "safetensors"):
            return False, f"load_format {load_format!r} is not supported (safetensors only)"
        if not os.path.isfile(os.path.join(model_path, "config.json")):
            return False, f"{model_path}: no config.json"
        runner = self.runner
        with self.lock:
            old = runner.model_config.model_path
            start = time.perf_counter()
            try:
                runner.model_config.model_path = model_path
                runner.model.load_weights(runner.model_config)
                leaves, _ = jax.tree_util.tree_flatten(nnx.split(runner.model)[1])
                jax.block_until_ready(leaves)
            except Exception as e:  # noqa: BLE001 - the answer carries it; the old weights may be half replaced
                runner.model_config.model_path = old
                return False, f"failed to load {model_path}: {type(e).__name__}: {e}"
            runner.model_state_leaves = leaves
            runner.server_args.model_path = model_path
        return True, f"Succeeded to update model weights in {time.perf_counter() - start:.2f} s."


def add_update_route(app, state_of, swapper: WeightSwapper) -> None:
    """`POST /update_weights_from_disk` on sglang-jax's FastAPI app."""
    from fastapi import Request
    from fastapi.responses import ORJSONResponse

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not (isinstance(body, dict) and isinstance(body.get("model_path"), str)):
            return ORJSONResponse({"success": False, "message": "model_path (a string) is required",
                                   "num_paused_requests": 0}, status_code=400)
        ok, message = await asyncio.to_thread(swapper.load, body["model_path"], body.get("load_format"))
        if ok:
            manager = state_of().tokenizer_manager
            manager.model_path = body["model_path"]
            for _ in range(FLUSH_TRIES):
                flushed = await manager.flush_cache()
                if flushed.success:
                    break
                await asyncio.sleep(0.1)
            if not flushed.success:
                ok, message = False, f"weights loaded, but the cache was not flushed: {flushed.error_msg}"
        return ORJSONResponse({"success": ok, "message": message, "num_paused_requests": 0},
                              status_code=200 if ok else 400)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from sgl_jax.srt.entrypoints import http_server

    swapper = WeightSwapper()
    launch_threads = http_server._launch_subprocesses_or_threads

    def launch_and_capture(*a, **kw):
        out = launch_threads(*a, **kw)
        swapper.capture(out[2])  # `launch` then drops the scheduler from the info it serves
        return out

    http_server._launch_subprocesses_or_threads = launch_and_capture
    add_update_route(http_server.app, lambda: http_server._global_state, swapper)
    http_server.launch(server_args(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
