"""Serve a model with sglang-jax, plus the weight-update endpoint the trainer's `sglang` engine needs.

`precisecoder serve --model DIR --port P` replaces this process with
`jaxrl/rollout/sglang_jax_server.py` under sglang-jax's Python (`.venv-sglang-jax`, made by
`scripts/setup.sh sglang-jax`; or `--python`). That server answers SGLang's native
`/generate`, `/health_generate`, `/get_model_info`, `/flush_cache` and
`/update_weights_from_disk`; point `--engine sglang --url` or `rollout.options.urls` at it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SERVER = Path(__file__).resolve().parent / "rollout" / "sglang_jax_server.py"
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
VENV = Path(__file__).resolve().parents[1] / ".venv-sglang-jax"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="HF safetensors directory (models.save_pretrained writes one)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--device", choices=("cpu", "tpu"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--tp-size", type=int, default=1, help="devices per server (tensor parallel)")
    parser.add_argument("--max-running-requests", type=int,
                        help="requests decoded together (default on cpu: 1, see docs/pods.md; on tpu: sglang-jax's)")
    parser.add_argument("--disable-radix-cache", action="store_true",
                        help="no prefix cache (sglang-jax requires it for Qwen3.5's recurrent state)")
    parser.add_argument("--python", help=f"sglang-jax's Python (default: {VENV.name}/bin/python at the repo root, "
                                         "then $SGLANG_JAX_PYTHON)")


def server_command(args: argparse.Namespace) -> list[str]:
    """The command that runs the server; a ValueError says what is missing."""
    python = args.python or os.environ.get("SGLANG_JAX_PYTHON") or str(VENV / "bin" / "python")
    if not (Path(python).is_file() and os.access(python, os.X_OK)):
        hint = "" if args.python else "; run `scripts/setup.sh sglang-jax` or pass --python"
        raise ValueError(f"no sglang-jax Python at {python}{hint}")
    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise ValueError(f"--model {args.model}: no config.json (an HF safetensors directory is needed)")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: not a port")
    return [python, str(SERVER), "--model-path", str(model.resolve()), "--host", args.host, "--port", str(args.port),
            "--device", args.device, "--dtype", args.dtype, "--tp-size", str(args.tp_size),
            *(["--max-running-requests", str(args.max_running_requests)] if args.max_running_requests else []),
            *(["--disable-radix-cache"] if args.disable_radix_cache else [])]


def main(args: argparse.Namespace) -> int:
    try:
        command = server_command(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the project's packages must not shadow sglang-jax's pins
    if args.device == "cpu":  # as many CPU devices as the server's mesh has, whatever the caller forced
        flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
        env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_COUNT_FLAG}={args.tp_size}"])
        env["JAX_PLATFORMS"] = "cpu"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
    return 0  # not reached
