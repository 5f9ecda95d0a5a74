"""Sample completions for a JSONL file of prompts with any rollout engine.

A prompt line is {"id": ..., "messages": [...]} (rendered with the model's chat template,
thinking on) or {"id": ..., "input_ids": [...]}. Each sample becomes one output line:
{"id", "sample", "token_ids", "logprobs", "finish_reason", "text"}. Lines are written as
each batch of prompts finishes, so an interrupted run keeps what it has done.

Engines: `jax` (default; the model from --model, an HF safetensors directory, or
--checkpoint, a trainer run directory), `sglang` (--url, repeatable) and `openai`
(--base-url and --served-model; the API key comes from $OPENAI_API_KEY).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from jaxrl.rollout import Engine, SamplingParams, make_engine
from reward.cli_args import output_file_error, token_budget, user_path
from reward.outfile import json_line


class GenerateError(Exception):
    """Bad input or arguments: one line for the user, exit code 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", type=user_path,
                        help="HF safetensors directory of a Qwen3 or Qwen3.5/3.6 model (jax engine)")
    source.add_argument("--checkpoint", type=user_path,
                        help="trainer run directory (config.yaml + checkpoints/): its latest "
                             "checkpoint's policy; or its checkpoints/ or best/, or one step "
                             "directory in them (jax engine)")
    parser.add_argument("--prompts", type=user_path, required=True, help="JSONL of {id, messages} or {id, input_ids}")
    parser.add_argument("--out", type=user_path, required=True, help="write one JSON line per sample here")
    parser.add_argument("--engine", choices=("jax", "sglang", "openai"), default="jax")
    defaults = SamplingParams()
    parser.add_argument("--n", type=int, default=defaults.n, help="samples per prompt (default: 1)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="0 is greedy (default: 1)")
    parser.add_argument("--top-p", type=float, default=defaults.top_p, help="nucleus mass (default: 1, all)")
    parser.add_argument("--top-k", type=int, default=defaults.top_k, help="keep the k likeliest (default: 0, all)")
    parser.add_argument("--max-tokens", type=int, default=defaults.max_tokens,
                        help=f"completion tokens, thinking included (default: {defaults.max_tokens})")
    parser.add_argument("--thinking-budget", type=token_budget, default=defaults.thinking_budget,
                        help="close an open think block after B tokens, or `none` "
                             f"(default: {defaults.thinking_budget})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="sampling seed (default: 0)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="compute dtype of the jax engine (default: float32)")
    parser.add_argument("--url", action="append", default=[], help="an SGLang server (repeat for several)")
    parser.add_argument("--base-url", help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--served-model", "--model-name", dest="served_model", help="model name for the openai engine")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over; by default prompts whose samples are already in --out are skipped")
    parser.add_argument("--tokenizer", choices=("qwen3", "qwen3_5"),
                        help="tokenizer family for the server engines (default: from --model, else qwen3_5)")
    parser.add_argument("--batch-size", type=int, default=16, help="prompts per engine call (default: 16)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


# ---------------------------------------------------------------------------- inputs


def _family_of(directory: Path) -> str:
    from models.tokenizer import family_for_model_type

    try:
        model_type = json.loads((directory / "config.json").read_text(encoding="utf-8"))["model_type"]
        return family_for_model_type(model_type)
    except (OSError, ValueError, KeyError) as e:
        raise GenerateError(f"{directory}: cannot read the model type from config.json ({e})") from None


def read_prompts(path: str, tokenizer: Any) -> list[tuple[Any, list[int]]]:
    """(id, prompt token ids) per line; a bad line is a GenerateError naming it."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise GenerateError(f"--prompts {path}: {e}") from None
    prompts = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise GenerateError(f"{where}: not JSON ({e})") from None
        if not isinstance(obj, dict) or "id" not in obj:
            raise GenerateError(f"{where}: a prompt is an object with an `id`")
        if ("messages" in obj) == ("input_ids" in obj):
            raise GenerateError(f"{where}: give exactly one of `messages` and `input_ids`")
        if "input_ids" in obj:
            ids = obj["input_ids"]
            if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                           for t in ids)):
                raise GenerateError(f"{where}: `input_ids` must be a non-empty list of non-negative integers")
        else:
            messages = obj["messages"]
            if not (isinstance(messages, list) and messages and all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in messages)):
                raise GenerateError(f"{where}: `messages` must be a non-empty list of {{role, content}} strings")
            try:
                ids = tokenizer.encode(tokenizer.render_chat(messages))
            except ValueError as e:
                raise GenerateError(f"{where}: {e}") from None
        if max(ids) >= tokenizer.vocab_size:
            raise GenerateError(f"{where}: token id {max(ids)} is outside the vocabulary ({tokenizer.vocab_size})")
        prompts.append((obj["id"], ids))
    if not prompts:
        raise GenerateError(f"--prompts {path}: no prompts")
    return prompts


def tokenizer_for(args: argparse.Namespace) -> Any:
    """The tokenizer of the model the arguments name (cheap: reads a config, loads no weights)."""
    from models.tokenizer import load_tokenizer

    if args.model:
        directory = Path(args.model)
        if not directory.is_dir():
            raise GenerateError(f"--model {args.model}: not a directory")
        return load_tokenizer(_family_of(directory))
    if args.checkpoint:
        from jaxrl.config import load_config
        from jaxrl.errors import TrainError
        from jaxrl.saved_run import locate_run

        try:
            run, _, _ = locate_run(args.checkpoint)
        except TrainError as e:
            raise GenerateError(f"--checkpoint {e}") from None
        try:
            return load_tokenizer(load_config(run / "config.yaml").model.family)
        except (ValueError, OSError) as e:
            raise GenerateError(f"--checkpoint {run}: {e}") from None
    return load_tokenizer(args.tokenizer or "qwen3_5")


def open_engine(args: argparse.Namespace, tokenizer: Any) -> Engine:
    """The engine the arguments ask for."""
    if args.engine == "jax":
        import jax.numpy as jnp

        import models

        if args.model:
            return make_engine("jax", model=models.from_pretrained(args.model, dtype=jnp.dtype(args.dtype)),
                               tokenizer=tokenizer)
        from jaxrl.eval.sources import SourceError, open_checkpoint

        try:
            return open_checkpoint(args.checkpoint, dtype=args.dtype)[0]
        except SourceError as e:
            raise GenerateError(str(e)) from None
    if args.engine == "sglang":
        return make_engine("sglang", urls=args.url, tokenizer=tokenizer)
    return make_engine("openai", base_url=args.base_url, model=args.served_model, tokenizer=tokenizer)


# ---------------------------------------------------------------------------- main


def main(args: argparse.Namespace) -> int:
    try:
        params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                max_tokens=args.max_tokens, thinking_budget=args.thinking_budget, seed=args.seed)
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.engine != "jax" and args.checkpoint:
            raise GenerateError(f"--checkpoint serves the jax engine only, not {args.engine}")
        if args.engine == "jax" and not (args.model or args.checkpoint):
            raise GenerateError("the jax engine needs --model or --checkpoint")
        if args.engine == "sglang" and not args.url:
            raise GenerateError("the sglang engine needs --url (one per server)")
        if args.engine == "openai" and not (args.base_url and args.served_model):
            raise GenerateError("the openai engine needs --base-url and --served-model")
        if not Path(args.prompts).is_file():
            raise GenerateError(f"--prompts {args.prompts}: no such file")
        problem = output_file_error(args.out)
        if problem or os.path.realpath(args.out) == os.path.realpath(args.prompts):
            raise GenerateError(f"--out {problem or 'is also --prompts'}")
        tokenizer = tokenizer_for(args)
        prompts = read_prompts(args.prompts, tokenizer)
        done = set() if args.overwrite else finished_prompts(args.out, params.n)
        todo = [(pid, ids) for pid, ids in prompts if _key(pid) not in done]
        if not todo:
            print(f"all {len(prompts)} prompts already have {params.n} samples in {args.out} "
                  "(--overwrite to start over)", file=sys.stderr)
            return 0
        engine = open_engine(args, tokenizer)
    except (GenerateError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if done:
        print(f"resuming: {len(prompts) - len(todo)} of {len(prompts)} prompts already in {args.out}",
              file=sys.stderr)
    progress = None
    if not args.no_progress:
        from tqdm import tqdm

        progress = tqdm(total=len(todo) * params.n, desc="generate", unit="sample", dynamic_ncols=True)
    written = 0
    try:
        with engine, open(args.out, "a" if done else "w", encoding="utf-8") as out:
            for start in range(0, len(todo), args.batch_size):
                batch = todo[start:start + args.batch_size]
                # a seed per batch, so batches draw different streams and a run is reproducible
                batch_params = dataclasses.replace(params, seed=params.seed * 1_000_003 + start)
                groups = engine.generate([ids for _, ids in batch], batch_params)
                out.write("".join(json_line({"id": pid, "sample": j, "token_ids": list(c.token_ids),
                                             "logprobs": list(c.logprobs), "finish_reason": c.finish_reason,
                                             "text": c.text})
                                  for (pid, _), group in zip(batch, groups) for j, c in enumerate(group)))
                out.flush()
                written += len(batch)
                if progress is not None:
                    progress.update(len(batch) * params.n)
    except KeyboardInterrupt:
        print(f"precisecoder generate: interrupted; {len(prompts) - len(todo) + written} of {len(prompts)} prompts "
              f"are in {args.out} and the same command goes on from there", file=sys.stderr)
        return 130
    finally:
        if progress is not None:
            progress.close()
    print(f"wrote {len(todo) * params.n} samples of {len(todo)} prompts to {args.out}", file=sys.stderr)
    return 0


def _key(prompt_id: Any) -> str:
    return json.dumps(prompt_id, sort_keys=True)


def finished_prompts(path: str, n: int) -> set[str]:
    """Keys of the prompts with all `n` samples in an earlier run's `path`, which keeps only their lines.

    The lines of a prompt cut off by an interrupt (and a torn last line) are dropped, so
    that prompt is sampled again.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return set()
    except (OSError, UnicodeDecodeError) as e:
        raise GenerateError(f"--out {path}: cannot read the earlier run ({e}); pass --overwrite") from None
    samples: dict[str, set[int]] = {}
    kept: list[tuple[str, str]] = []
    for line in lines:
        try:
            obj = json.loads(line)
            key, sample = _key(obj["id"]), obj["sample"]
        except (ValueError, KeyError, TypeError):
            continue
        samples.setdefault(key, set()).add(sample)
        kept.append((key, line))
    done = {key for key, got in samples.items() if set(range(n)) <= got}
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for key, line in kept if key in done))
    return done
