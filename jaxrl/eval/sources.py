"""What `precisecoder eval` evaluates: an engine, the tokenizer of its chat template, and a description.

- `--model PATH`: an HF safetensors directory, loaded with `models.from_pretrained`
  and sampled by the embedded `jax` engine; the tokenizer family comes from its
  config.json `model_type`.
- `--checkpoint DIR`: a `precisecoder train` checkpoint, restored onto the run's model.
- `--engine sglang --url URL`: SGLang servers, token ids in and out.
- `--engine openai --base-url URL --served-model NAME`: an OpenAI-compatible endpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jaxrl.rollout.engine import Engine, make_engine
from models.tokenizer import QwenTokenizer, family_for_model_type, load_tokenizer


class SourceError(ValueError):
    """A model source that cannot be opened (one error line, exit code 2)."""


def saved_demo_tokenizer(path: Path) -> Any | None:
    """The tokenizer `precisecoder demo` saved beside its policy (`demo_vocab.json`), or None."""
    from jaxrl.demo.tokenizer import VOCAB_FILE, DemoTokenizer  # noqa: PLC0415

    return DemoTokenizer.from_pretrained(path) if (path / VOCAB_FILE).is_file() else None


def tokenizer_of_model_dir(path: Path) -> QwenTokenizer:
    """The tokenizer of an HF model directory: the demo's own if it saved one, else the Qwen
    tokenizer of its config.json `model_type`."""
    demo = saved_demo_tokenizer(path)
    if demo is not None:
        return demo
    config = path / "config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8"))["model_type"]
        return load_tokenizer(family_for_model_type(model_type))
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise SourceError(f"{config}: cannot read the model type ({e})") from None


def open_hf_model(path: str, dtype: str) -> tuple[Engine, QwenTokenizer, dict[str, Any]]:
    """The jax engine over an HF safetensors directory."""
    import jax.numpy as jnp  # noqa: PLC0415  (JAX only for the embedded engine)

    import models  # noqa: PLC0415

    directory = Path(path)
    if not directory.is_dir():
        raise SourceError(f"--model {path}: not a directory")
    tokenizer = tokenizer_of_model_dir(directory)
    model = models.from_pretrained(directory, dtype=jnp.dtype(dtype))
    engine = make_engine("jax", model=model, tokenizer=tokenizer)
    model_info = {"name": directory.resolve().name, "engine": "jax", "path": str(directory), "dtype": dtype}
    return engine, tokenizer, model_info


def open_checkpoint(directory: str, dtype: str | None = None) -> tuple[Engine, QwenTokenizer, dict[str, Any]]:
    """The jax engine over the policy of a trainer checkpoint (`jaxrl.saved_run.load_policy`: a run
    directory, its checkpoints/ or best/, or a step directory in them), at compute `dtype`
    (default: the run's)."""
    from jaxrl.errors import TrainError  # noqa: PLC0415
    from jaxrl.saved_run import load_policy  # noqa: PLC0415  (JAX only for the embedded engine)
    from models import sharding as msh  # noqa: PLC0415

    mesh = msh.make_mesh(1, -1, 1)
    try:
        model, cfg, step = load_policy(directory, dtype=dtype, mesh=mesh)
    except TrainError as e:
        raise SourceError(f"--checkpoint {e}") from None
    start = cfg.model.checkpoint  # a demo run starts from a base saved with its own tokenizer
    tokenizer = (start and saved_demo_tokenizer(Path(start))) or load_tokenizer(cfg.model.family)
    engine = make_engine("jax", model=model, tokenizer=tokenizer, mesh=mesh,
                         rules=msh.rules_from_mapping(cfg.mesh.rules))
    return engine, tokenizer, {"name": f"{cfg.name}@{step}", "engine": "jax", "checkpoint": str(directory),
                               "step": step, "dtype": cfg.model.dtype}


def _served_family(urls: list[str], retry: Any) -> str:
    """The tokenizer family of the model the first answering SGLang server reports (`/get_model_info`)."""
    from jaxrl.rollout.http import ConnectionFailed, HTTPStatusError, request_json  # noqa: PLC0415

    for url in urls:
        try:
            info = request_json("GET", url.rstrip("/") + "/get_model_info", timeout=retry.timeout)
        except (ConnectionFailed, HTTPStatusError):
            continue
        model_type = info.get("model_type") if isinstance(info, dict) else None
        try:
            return family_for_model_type(model_type)
        except KeyError:
            raise SourceError(f"{url} serves model_type {model_type!r}, not a Qwen family this project "
                              "knows; pass --tokenizer qwen3|qwen3_5") from None
    raise SourceError(f"none of the sglang servers answered: {', '.join(urls)}")


def open_server(kind: str, args: argparse.Namespace) -> tuple[Engine, QwenTokenizer, dict[str, Any]]:
    """The sglang or openai engine; per-request retries and timeout from the arguments."""
    from jaxrl.rollout.http import RetryPolicy  # noqa: PLC0415

    retry = RetryPolicy(attempts=args.retries + 1, timeout=args.request_timeout)
    if kind == "sglang":
        tokenizer = load_tokenizer(args.tokenizer or _served_family(args.url, retry))
        engine = make_engine("sglang", urls=args.url, tokenizer=tokenizer, retry=retry,
                             max_concurrency=args.concurrency)
        paths = sorted({str(info.get("model_path")) for info in engine.model_info.values() if info.get("model_path")})
        name = Path(paths[0]).name if paths else "sglang"
        return engine, tokenizer, {"name": name, "engine": "sglang", "url": list(args.url), "served_model": paths,
                                   "tokenizer": tokenizer.family}
    tokenizer = load_tokenizer(args.tokenizer or "qwen3_5")
    extra = {} if args.api == "completions" or not args.no_thinking else \
        {"chat_template_kwargs": {"enable_thinking": False}}
    engine = make_engine("openai", base_url=args.base_url, model=args.model_name, tokenizer=tokenizer,
                         max_concurrency=args.concurrency, retry=retry, extra_body=extra)
    return engine, tokenizer, {"name": args.model_name, "engine": "openai", "api": args.api,
                               "base_url": args.base_url, "served_model": args.model_name,
                               "tokenizer": tokenizer.family}


def open_source(kind: str, args: argparse.Namespace) -> tuple[Engine, QwenTokenizer, dict[str, Any]]:
    """(engine, tokenizer, model description) for the CLI arguments; `--name` overrides the name."""
    if kind == "jax" and args.model:
        engine, tokenizer, model = open_hf_model(args.model, args.dtype)
    elif kind == "jax":
        engine, tokenizer, model = open_checkpoint(args.checkpoint)
    else:
        engine, tokenizer, model = open_server(kind, args)
    if args.name:
        model["name"] = args.name
    return engine, tokenizer, model
