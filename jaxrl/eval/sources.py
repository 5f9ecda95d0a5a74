"""What `precisecoder eval` evaluates: an engine, the tokenizer of its chat template, and a description.

- `--model PATH`: an HF safetensors directory, loaded with `models.from_pretrained`
  and sampled by the embedded `jax` engine; the tokenizer family comes from its
  config.json `model_type`.
- `--checkpoint DIR`: a `precisecoder train` checkpoint, restored onto the run's model.
- `--engine sglang --url URL`: SGLang servers, token ids in and out.
- `--engine openai --base-url URL --model-name NAME`: an OpenAI-compatible endpoint.
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


def tokenizer_of_model_dir(path: Path) -> QwenTokenizer:
    """The Qwen tokenizer of an HF model directory, by its config.json `model_type`."""
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
    return engine, tokenizer, {"name": directory.resolve().name, "engine": "jax", "path": str(directory), "dtype": dtype}


def open_source(kind: str, args: argparse.Namespace) -> tuple[Engine, QwenTokenizer, dict[str, Any]]:
    """(engine, tokenizer, model description) for the CLI arguments; `--name` overrides the name."""
    if kind == "jax" and args.model:
        engine, tokenizer, model = open_hf_model(args.model, args.dtype)
    else:
        raise SourceError(f"the {kind} engine is not available in this build")
    if args.name:
        model["name"] = args.name
    return engine, tokenizer, model
