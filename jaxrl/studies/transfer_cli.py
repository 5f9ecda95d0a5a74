"""Chain-of-thought transfer: a receiver model answers the donor's prompts with the donor's thinking spliced in.

  precisecoder transfer --donor EVAL_DIR (--model PATH | --checkpoint DIR
                        | --engine openai --base-url URL --model-name NAME | --engine sglang --url URL)
                        --mode at-once|continue:N|user-turn --out DIR [--control] [options]
  precisecoder transfer compare TRANSFER_DIR... --alone EVAL_DIR [--base EVAL_DIR] [--out FILE] [--plot PNG]

`transfer` writes the usual eval outputs (predictions.jsonl, scores.jsonl,
summary.json, report.md) and transfer.json (donor, mode, control). `--control`
marks the donor as the control: the untrained base's own thinking. `compare`
prints the paper's Tables 4/8: the receiver alone and with each donor, the deltas,
and with --base (the donor's untrained base evaluated alone) the share of the
donor's own training gain each transfer recovers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="[compare]")
    compare = actions.add_parser("compare", help="Tables 4/8: the receiver alone, with each donor, the deltas",
                                 description="Print the paper's Tables 4/8 from transfer runs.")
    compare.add_argument("runs", nargs="+", metavar="TRANSFER_DIR", help="directories written by `transfer`")
    compare.add_argument("--alone", required=True, metavar="EVAL_DIR", help="the receiver's own eval run")
    compare.add_argument("--base", metavar="EVAL_DIR",
                         help="the donor's untrained base, evaluated alone (for the share of the gain recovered)")
    compare.add_argument("--out", help="also write the table to this file")
    compare.add_argument("--plot", metavar="PNG", help="draw precision and pass against the receiver's extra "
                                                     "thinking tokens (at-once and continue:N runs; Fig 13)")

    what = parser.add_argument_group("donor and receiver")
    what.add_argument("--donor", help="the donor's eval run directory (its prompts and think blocks)")
    what.add_argument("--mode", help="at-once, continue:N or user-turn")
    what.add_argument("--control", action="store_true", help="the donor is the control (the untrained base)")
    what.add_argument("--tasks", help="the task JSONL (default: the donor run's task_set)")
    what.add_argument("--out", help="run directory for the receiver's outputs")
    what.add_argument("--model", metavar="PATH", help="receiver: an HF safetensors directory (jax engine)")
    what.add_argument("--checkpoint", metavar="DIR", help="receiver: a `precisecoder train` checkpoint (jax engine)")
    what.add_argument("--engine", choices=("jax", "sglang", "openai"), help="the receiver's engine")
    what.add_argument("--url", action="append", default=[], help="SGLang server URL (repeat for several)")
    what.add_argument("--base-url", help="OpenAI-compatible endpoint (raw completions prefill the assistant turn)")
    what.add_argument("--model-name", help="the served model's name (openai)")
    what.add_argument("--api", choices=("completions", "chat"), default="completions",
                      help="openai: raw completions (default; every mode) or chat (user-turn only)")
    what.add_argument("--name", help="the receiver's name in reports")
    what.add_argument("--tokenizer", choices=("qwen3", "qwen3_5"), help="the receiver's chat template (servers)")
    what.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="compute dtype of --model")
    run = parser.add_argument_group("execution")
    run.add_argument("--samples", type=int, default=1, help="receiver samples per task (default 1)")
    run.add_argument("--batch-size", type=int, default=None, help="prompts per engine call (16 jax, 1 servers)")
    run.add_argument("--concurrency", type=int, default=None, help="requests in flight to servers (default 16)")
    run.add_argument("--retries", type=int, default=3, help="extra attempts of a failed server request")
    run.add_argument("--request-timeout", type=float, default=600.0, help="seconds per HTTP request")
    run.add_argument("--workers", type=int, default=None, help="sandbox workers (default: CPU count)")
    run.add_argument("--isolation", choices=("auto", "bwrap", "rlimits"), default="auto", help="sandbox isolation")
    run.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _error(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _summary(directory: str) -> dict:
    path = Path(directory) / "summary.json"
    summary = json.loads(path.read_text(encoding="utf-8"))
    if not {"model", "buggy"} <= set(summary):
        raise ValueError(f"{path} is not an eval summary")
    return summary


def run_compare(args: argparse.Namespace) -> int:
    from jaxrl.studies.transfer import compare_table, thinking_curve  # noqa: PLC0415

    try:
        alone = _summary(args.alone)
        base = _summary(args.base) if args.base else None
        runs = [_summary(d) for d in args.runs]
        for d, r in zip(args.runs, runs):
            if "transfer" not in r:
                raise ValueError(f"{d} is not a transfer run (no transfer key in its summary.json)")
        donors = {r["transfer"]["donor"]: _summary(r["transfer"]["donor"]) for r in runs} if base else {}
    except (OSError, json.JSONDecodeError, ValueError) as e:
        return _error(str(e))
    table = compare_table(alone, runs, donors, base)
    print(table)
    if args.out:
        Path(args.out).write_text(table, encoding="utf-8")
    if args.plot:
        print(f"wrote {args.plot}" if thinking_curve(alone, runs, args.plot)
              else "no plot: no at-once or continue:N run of a non-control donor")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.action == "compare":
        return run_compare(args)
    from jaxrl.eval.cli import UsageError, engine_kind, open_engine  # noqa: PLC0415
    from jaxrl.eval.evaluate import EvalError  # noqa: PLC0415
    from jaxrl.studies import transfer  # noqa: PLC0415
    from reward.fleet import Fleet  # noqa: PLC0415
    from reward.schema import SchemaError, load_tasks  # noqa: PLC0415

    try:
        if not (args.donor and args.mode and args.out):
            raise UsageError("--donor, --mode and --out are required")
        if args.samples < 1:
            raise UsageError(f"--samples must be >= 1, got {args.samples}")
        mode = transfer.parse_mode(args.mode)
        kind = engine_kind(args)
        if kind == "openai" and args.api == "chat" and mode.prefills:
            raise UsageError(f"--mode {mode} prefills the assistant turn, which a chat API cannot; "
                             "use --mode user-turn or --api completions")
        donor = transfer.load_donor(args.donor)
        task_file = args.tasks or donor.summary.get("task_set")
        if not task_file:
            raise UsageError("the donor run does not say its task set; pass --tasks")
        tasks = load_tasks(task_file)
    except (UsageError, transfer.TransferError, SchemaError, OSError) as e:
        return _error(str(e))
    server = kind != "jax"
    args.batch_size = args.batch_size or (1 if server else 16)
    args.concurrency = (args.concurrency or 16) if server else 1
    args.no_thinking = not donor.settings.enable_thinking
    try:
        engine, tokenizer, model = open_engine(kind, args)
    except (UsageError, OSError, ValueError, KeyError) as e:
        return _error(str(e))
    except RuntimeError as e:
        return _error(str(e), 1)
    if not args.name:
        model["name"] = f"{model['name']} + {donor.summary['model'].get('name')} ({mode})"
    cache = Path(args.out) / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    try:
        with engine, Fleet(workers=args.workers, isolation=args.isolation, cache_path=cache / "runs.jsonl") as fleet:
            transfer.run_transfer(engine, tokenizer, tasks, donor, mode, fleet, out_dir=args.out, model=model,
                                  control=args.control, samples=args.samples, batch_size=args.batch_size,
                                  concurrency=args.concurrency, progress=not args.no_progress,
                                  chat=kind == "openai" and args.api == "chat")
    except transfer.TransferError as e:
        return _error(str(e))
    except EvalError as e:
        return _error(str(e), 1)
    except KeyboardInterrupt:
        print(f"interrupted: the samples done are kept in {args.out}/predictions.jsonl; "
              "rerun the same command to continue", file=sys.stderr)
        return 130
    print((Path(args.out) / "report.md").read_text(encoding="utf-8"))
    print(f"wrote {args.out}/predictions.jsonl, scores.jsonl, summary.json, report.md, transfer.json")
    return 0
