"""`precisecoder eval --benchmark NAME --data PATH`: an out-of-distribution benchmark, sampled or from predictions.

  precisecoder eval --benchmark NAME --data PATH --out DIR (--model PATH | --checkpoint DIR
                    | --engine sglang --url URL | --engine openai --base-url URL --served-model NAME) [options]
  precisecoder eval --benchmark NAME --data PATH --predictions FILE --out DIR [--name NAME]
  precisecoder eval --benchmark NAME --data PATH --reference --out DIR

The sampling flags of `eval` apply (temperature, budgets, samples, seed, batches, concurrency);
the debugging-only ones (--tasks, --prompt, --candidates, --refiner, --agent) do not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxrl.eval import benchmarks
from jaxrl.eval.cli import UsageError, _cache_path, engine_kind, open_engine_or_exit, settings_of
from jaxrl.eval.evaluate import RUN, EvalError
from jaxrl.eval.ood import SAMPLING, evaluate_benchmark, score_predictions_file
from jaxrl.eval.protocol import EvalSettings
from reward.cli_args import output_dir_error
from reward.fleet import Fleet
from reward.schema import Prediction, SchemaError
from reward.score_cli import load_predictions_for


def check_flags(args: argparse.Namespace) -> None:
    """UsageError for a combination the benchmark mode does not take."""
    if not (args.benchmark and args.data and args.out):
        raise UsageError("--benchmark NAME, --data PATH and --out DIR go together")
    debugging = [flag for flag, given in (("--tasks", args.tasks), ("--prompt", args.prompt),
                                          ("--candidates", args.candidates), ("--refiner", args.refiner),
                                          ("--agent", args.agent)) if given]
    if debugging:
        raise UsageError(f"{', '.join(debugging)}: for debugging task sets, not --benchmark (which has its own prompt)")
    sources = [flag for flag, given in (("--model", args.model), ("--checkpoint", args.checkpoint),
                                        ("--engine", args.engine)) if given]
    if args.predictions and args.reference:
        raise UsageError("give --predictions FILE or --reference, not both")
    if (args.predictions or args.reference) and sources:
        raise UsageError(f"--predictions and --reference grade answers already made: drop {', '.join(sources)}")
    problem = output_dir_error(args.out)
    if problem:
        raise UsageError(f"--out {problem}")


def load_tasks(args: argparse.Namespace) -> list[benchmarks.BenchTask]:
    """The benchmark's problems (the first --limit), or UsageError saying why not."""
    if args.benchmark == "bigcodebench" and not benchmarks.unittest_supported():
        raise UsageError("bigcodebench needs the sandbox's `unittest` tests kind, which this checkout's "
                         "reward/schema.py does not have yet")
    try:
        tasks = benchmarks.load_benchmark(args.benchmark, args.data)[:args.limit]
    except benchmarks.BenchmarkError as e:
        raise UsageError(str(e)) from None
    if not tasks:
        raise UsageError(f"{args.data} holds no problems")
    return tasks


def run_clash(out: Path, run: dict) -> str | None:
    """Why `out` holds another run than `run` (every key but the model's, checked before a model loads)."""
    try:
        previous = json.loads((out / RUN).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{out / RUN} is unreadable ({e}); use another --out directory"
    now = json.loads(json.dumps(run))
    changed = sorted(k for k in now if previous.get(k) != now[k])
    return f"{out} holds a run with other {', '.join(changed)}; use another --out directory or delete it" \
        if changed else None


def run_benchmark(args: argparse.Namespace) -> int:
    try:
        check_flags(args)
        tasks = load_tasks(args)
        if args.predictions or args.reference:
            return grade_predictions(args, tasks)
        args.prompt = EvalSettings.prompt
        settings = settings_of(args)
        kind = engine_kind(args)
        chat = kind == "openai" and args.api == "chat"
        sampling = {k: v for k, v in settings.to_json().items() if k in SAMPLING}
        clash = run_clash(Path(args.out), {"benchmark": args.benchmark, "settings": sampling, "chat": chat,
                                           "tasks": [t.task_id for t in tasks]})
        if clash:
            raise UsageError(clash)
    except (UsageError, SchemaError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    opened = open_engine_or_exit(kind, args)
    if isinstance(opened, int):
        return opened
    engine, tokenizer, model = opened
    try:
        with engine, Fleet(workers=args.workers, isolation=args.isolation, libraries=args.sandbox_env,
                           cache_path=_cache_path(args.out)) as fleet:
            summary = evaluate_benchmark(engine, tokenizer, args.benchmark, tasks, settings, fleet, model=model,
                                         data=args.data, out_dir=args.out, batch_size=args.batch_size,
                                         concurrency=args.concurrency, progress=not args.no_progress, chat=chat)
    except EvalError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: the samples done are kept in {args.out}/predictions.jsonl; "
              "rerun the same command to continue", file=sys.stderr)
        return 130
    return _done(args.out, summary)


def grade_predictions(args: argparse.Namespace, tasks: list[benchmarks.BenchTask]) -> int:
    """`--predictions FILE` (several answers per problem allowed) or `--reference`: grade those answers."""
    if args.reference:
        predictions = [Prediction(t.task_id, code=t.reference) for t in tasks]
        model = {"name": args.name or "reference", "predictions": "reference"}
    else:
        by_id = {t.task_id: t for t in tasks}
        predictions = load_predictions_for(args.predictions, by_id, skip_unknown=args.limit is not None)
        model = {"name": args.name or Path(args.predictions).stem, "predictions": args.predictions}
    with Fleet(workers=args.workers, isolation=args.isolation, libraries=args.sandbox_env,
               cache_path=_cache_path(args.out)) as fleet:
        summary = score_predictions_file(args.benchmark, tasks, predictions, fleet, model=model, data=args.data,
                                         out_dir=args.out, progress=not args.no_progress)
    return _done(args.out, summary)


def _done(out: str, summary: dict) -> int:
    print((Path(out) / "report.md").read_text(encoding="utf-8"))
    print(f"wrote {out}/results.jsonl, summary.json, report.md ({summary['samples']} answers graded)")
    return 0

