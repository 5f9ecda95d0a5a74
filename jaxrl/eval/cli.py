"""Evaluate a model under the paper's protocol, or put several evaluations side by side.

  precisecoder eval --tasks T.jsonl (--model PATH | --checkpoint DIR | --engine sglang --url URL
                    | --engine openai --base-url URL --served-model NAME) --out DIR [options]
  precisecoder eval --refiner RUN --candidates EVAL_DIR --tasks T.jsonl --out DIR [options]
  precisecoder eval --benchmark NAME --data PATH (a model source as above | --predictions FILE) --out DIR
  precisecoder eval compare DIR... [--out DIR]
  precisecoder eval compare --group NAME=DIR[,DIR...]... [--sweep NAME=X]... [--out DIR]

`eval` renders every task with the chosen prompt (the paper's wording), samples,
extracts the program, scores it with the PreciseCoder scorer and writes
DIR/predictions.jsonl (full response and thinking; `precisecoder score` reads it
as is), DIR/scores.jsonl, DIR/summary.json and DIR/report.md. Rerunning the same
command after an interruption continues from DIR/predictions.jsonl. With `--agent`
each task is the five-turn tool loop of docs/agent.md and DIR/episodes.jsonl holds its turns.

`eval --benchmark NAME --data PATH` runs an out-of-distribution benchmark (HumanEval+, MBPP+,
CRUXEval-O/I, BigCodeBench; `jaxrl.eval.benchmarks`) under its standard prompt, one sample per
problem by default, grades every answer in the sandbox and writes DIR/predictions.jsonl,
DIR/results.jsonl, DIR/summary.json (pass@1 with its interval) and DIR/report.md; with
`--predictions FILE` it grades answers made elsewhere instead.

`eval compare` reads the summary.json of each run directory and writes
compare.md (a row per run: buggy and clean columns with 95% intervals, then
per task kind), precision_vs_pass.png and noop_vs_damage.png. With
`--group NAME=DIR,DIR...` per method it writes a row per method instead (mean ±
std over its runs, best and second marked, `jaxrl.eval.groups`), and with
`--sweep NAME=X` per swept method lambda_sweep.png.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from jaxrl import prompts
from jaxrl.eval.benchmarks import BENCHMARKS
from jaxrl.eval.evaluate import RUN, EvalError, evaluate
from jaxrl.eval.protocol import EvalSettings
from reward.cli_args import SANDBOX_ENV_HELP, output_dir_error, positive_int, sandbox_env, token_budget, user_path
from reward.fleet import Fleet
from reward.schema import SchemaError, load_tasks
from reward.score_cli import load_predictions_for

ENGINES = ("jax", "sglang", "openai")
UNSET = object()  # a thinking-budget flag not given (its default depends on --no-thinking)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = EvalSettings()
    actions = parser.add_subparsers(dest="action", metavar="[compare]")
    compare = actions.add_parser("compare", help="put several eval runs side by side (Markdown table and PNGs)",
                                 description="Put several eval runs side by side: compare.md (the paper's Table 2 "
                                             "layout), precision_vs_pass.png (Figure 12) and noop_vs_damage.png "
                                             "(Figure 14).")
    compare.add_argument("runs", type=user_path, nargs="*", metavar="DIR",
                         help="run directories written by `precisecoder eval`")
    compare.add_argument("--group", action="append", default=[], metavar="NAME=DIR[,DIR...]",
                         help="one method's runs (its seeds): a row of mean ± std with the best and second marked; "
                              "repeat per method (instead of DIR...)")
    compare.add_argument("--sweep", action="append", default=[], metavar="NAME=X",
                         help="the x (λ, e.g. 1/6) of group NAME on lambda_sweep.png (two groups at least)")
    compare.add_argument("--out", type=user_path, default="compare",
                         help="write compare.md and the PNGs here (default: ./compare)")

    what = parser.add_argument_group("what to evaluate")
    what.add_argument("--tasks", type=user_path, help="task JSONL file")
    what.add_argument("--out", type=user_path, help="run directory for predictions, scores, summary and report")
    what.add_argument("--benchmark", choices=BENCHMARKS,
                      help="an out-of-distribution benchmark (instead of --tasks; docs/eval.md): graded pass@1")
    what.add_argument("--data", type=user_path, metavar="PATH",
                      help="the benchmark's own file (.jsonl or .jsonl.gz, as its project publishes it)")
    what.add_argument("--predictions", type=user_path, metavar="FILE",
                      help="with --benchmark: grade these answers ({task_id, response | code}; for CRUXEval the "
                           "code is the answer's expression) instead of sampling a model")
    what.add_argument("--reference", action="store_true",
                      help="with --benchmark: grade the benchmark's own reference answers (its canonical solutions, "
                           "CRUXEval's true values): the ceiling this sandbox and library environment allow")
    what.add_argument("--model", type=user_path, metavar="PATH",
                      help="HF safetensors directory, sampled with the jax engine")
    what.add_argument("--checkpoint", type=user_path, metavar="DIR",
                      help="a `precisecoder train` run or checkpoint directory")
    what.add_argument("--refiner", type=user_path, metavar="DIR",
                      help="a refiner run (`precisecoder supervised --config recap_refiner`): --checkpoint DIR "
                           "under --prompt refine, refining the answers of --candidates")
    what.add_argument("--engine", choices=ENGINES, help="jax (default with --model/--checkpoint), sglang or openai")
    what.add_argument("--url", action="append", default=[], help="SGLang server URL (repeat for several)")
    what.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://host:8000/v1")
    what.add_argument("--served-model", "--model-name", dest="model_name",
                      help="the served model's name (openai); also the default --name")
    what.add_argument("--api", choices=("chat", "completions"), default="chat",
                      help="openai: chat completions (the server's chat template; no thinking budget), or raw "
                           "completions of our rendered prompt as token ids (the budget enforced; Qwen models)")
    what.add_argument("--name", help="the model's name in reports and plots (default: from the source)")
    what.add_argument("--tokenizer", choices=("qwen3", "qwen3_5"),
                      help="chat template and vocabulary for sglang/openai (default: from the model's config, "
                           "else qwen3_5)")
    what.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16",
                      help="compute dtype of --model (a checkpoint keeps its run's dtypes)")

    protocol = parser.add_argument_group("protocol (defaults follow the paper)")
    protocol.add_argument("--prompt", choices=prompts.PROMPTS,
                          help=f"the prompt (default {defaults.prompt}; refine with --refiner; demo for the "
                               "runs of `precisecoder demo`, with --no-thinking --max-tokens 80; demo_refine for "
                               "its refiner, with --refiner)")
    protocol.add_argument("--candidates", type=user_path, metavar="C.jsonl|EVAL_DIR",
                          help="candidate fixes for --prompt refine or demo_refine ({task_id, response | code}; the first "
                               "per task; "
                               "those of tasks not in --tasks are ignored), "
                               "or an eval run directory (its predictions.jsonl: the base's one-shot answers)")
    protocol.add_argument("--samples", type=positive_int, default=defaults.samples, help="samples per task (K)")
    protocol.add_argument("--temperature", type=float, default=defaults.temperature,
                          help=f"sampling temperature (default {defaults.temperature}: the paper's evaluation "
                               "temperature, appendix B.6; training samples at 1.0)")
    protocol.add_argument("--top-p", type=float, default=defaults.top_p)
    protocol.add_argument("--top-k", type=int, default=defaults.top_k)
    protocol.add_argument("--thinking-budget", type=token_budget, default=UNSET,
                          help="thinking tokens on buggy tasks ('none': no budget; default 4096, none with "
                               "--no-thinking)")
    protocol.add_argument("--max-tokens", type=positive_int, default=defaults.max_tokens,
                          help="completion tokens in total on buggy tasks (default 6144)")
    protocol.add_argument("--clean-thinking-budget", type=token_budget, default=UNSET,
                          help="thinking tokens on clean (GT Debug) tasks (default 16384, none with --no-thinking; "
                               "the answer room max-tokens − thinking-budget is kept)")
    protocol.add_argument("--no-thinking", action="store_true", help="render prompts with thinking off")
    protocol.add_argument("--seed", type=int, default=defaults.seed)
    protocol.add_argument("--lambda", dest="lam", metavar="LAMBDA", type=float, default=defaults.lam,
                          help="weight λ of f1 in the reward (default 1/3)")
    protocol.add_argument("--epsilon", type=int, default=defaults.epsilon, help="ε of the credit cap (default 1)")
    protocol.add_argument("--timeout", type=float, default=defaults.timeout_s,
                          help="seconds per test run for tasks without timeout_s (default 5)")
    agent = parser.add_argument_group("five-turn agent (docs/agent.md)")
    agent.add_argument("--agent", action="store_true",
                       help="run each task as a tool loop (view / str_replace_editor / submit) and score the final "
                            "file; the thinking and token budgets apply per turn; writes DIR/episodes.jsonl too")
    agent.add_argument("--turns", type=positive_int, default=None, help="the agent's turn budget (default 5)")
    agent.add_argument("--agent-tests", action="store_true",
                       help="offer the agent a run_tests tool (pass/fail counts of the task's tests; off in the paper)")

    run = parser.add_argument_group("execution")
    run.add_argument("--batch-size", type=positive_int, default=None,
                     help="prompts per engine call; a finished call is saved at once (default: 16 for jax, "
                          "1 for servers)")
    run.add_argument("--concurrency", type=positive_int, default=None,
                     help="requests in flight to sglang/openai (default 16); the jax engine runs one call at a time")
    run.add_argument("--retries", type=int, default=3,
                     help="extra attempts of a failed request of sglang/openai, with backoff (default 3)")
    run.add_argument("--request-timeout", type=float, default=600.0,
                     help="seconds per HTTP request of sglang/openai (default 600)")
    run.add_argument("--limit", type=positive_int, help="evaluate only the first N tasks of --tasks (a quick try)")
    run.add_argument("--workers", type=int, default=None, help="sandbox workers (default: CPU count)")
    run.add_argument("--isolation", choices=("auto", "bwrap", "rlimits"), default="auto", help="sandbox isolation")
    run.add_argument("--sandbox-env", type=sandbox_env, metavar="PATH", help=SANDBOX_ENV_HELP)
    run.add_argument("--no-progress", action="store_true", help="hide progress bars")


class UsageError(ValueError):
    """A bad combination of arguments (exit code 2)."""


def settings_of(args: argparse.Namespace) -> EvalSettings:
    """The protocol's settings from the flags; with --no-thinking, the thinking budgets not given are none."""
    defaults = EvalSettings()

    def budget(given: Any, default: int | None) -> int | None:
        if given is not UNSET:
            return given
        return None if args.no_thinking else default

    try:
        return EvalSettings(prompt=args.prompt, samples=args.samples, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, thinking_budget=budget(args.thinking_budget, defaults.thinking_budget),
                            max_tokens=args.max_tokens,
                            clean_thinking_budget=budget(args.clean_thinking_budget, defaults.clean_thinking_budget),
                            enable_thinking=not args.no_thinking,
                            seed=args.seed, lam=args.lam, epsilon=args.epsilon, timeout_s=args.timeout)
    except ValueError as e:
        raise UsageError(str(e)) from None


def engine_kind(args: argparse.Namespace) -> str:
    """The engine the arguments ask for, or UsageError naming what is missing or clashing."""
    sources = [flag for flag, value in (("--model", args.model), ("--checkpoint", args.checkpoint)) if value]
    if len(sources) > 1:
        raise UsageError("give one of --model and --checkpoint")
    engine = args.engine or ("jax" if sources else None)
    if engine is None:
        raise UsageError("say what to evaluate: --model PATH, --checkpoint DIR, --engine sglang --url URL "
                         "or --engine openai --base-url URL --served-model NAME")
    if engine == "jax" and not sources:
        raise UsageError("the jax engine needs --model PATH or --checkpoint DIR")
    if engine == "sglang" and not args.url:
        raise UsageError("--engine sglang needs --url URL")
    if engine == "openai" and not (args.base_url and args.model_name):
        raise UsageError("--engine openai needs --base-url URL and --served-model NAME")
    if engine != "sglang" and args.url:
        raise UsageError("--url is for --engine sglang")
    if engine != "openai" and (args.base_url or args.model_name):
        raise UsageError("--base-url and --served-model are for --engine openai")
    return engine


def open_engine(kind: str, args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """(engine, tokenizer, model description) for the arguments."""
    from jaxrl.eval import sources  # noqa: PLC0415  (imports JAX; compare and --help stay light)

    return sources.open_source(kind, args)


def open_engine_or_exit(kind: str, args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]] | int:
    """`open_engine` with the engine kind's batch and concurrency defaults; on failure the error line is
    printed and the exit code comes back instead (2 for bad arguments, 1 for a server that does not answer)."""
    server = kind != "jax"
    args.batch_size = args.batch_size or (1 if server else 16)
    args.concurrency = (args.concurrency or 16) if server else 1
    try:
        return open_engine(kind, args)
    except (UsageError, OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # servers that do not answer
        print(f"error: {e}", file=sys.stderr)
        return 1


def read_summary(run: str) -> dict[str, Any]:
    """The summary.json of an eval run directory, or UsageError naming it."""
    path = Path(run) / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: {e}") from None
    debugging = {"model", "settings", "buggy", "clean", "kinds", "invalid", "samples"}
    benchmark = {"benchmark", "model", "pass@1", "tasks", "samples"}
    if not isinstance(summary, dict) or not (debugging <= summary.keys() or benchmark <= summary.keys()):
        raise UsageError(f"{path} is not an eval summary")
    return summary


def run_compare(args: argparse.Namespace) -> int:
    from jaxrl.eval.report import compare_markdown  # noqa: PLC0415

    try:
        problem = output_dir_error(args.out)
        if problem:
            raise UsageError(f"--out {problem}")
        if bool(args.runs) == bool(args.group):
            raise UsageError("give run directories or --group NAME=DIR[,DIR...], not both (nor neither)")
        if args.group:
            return compare_groups(args)
        if args.sweep:
            raise UsageError("--sweep is for --group")
        summaries = [read_summary(run) for run in args.runs]
        benchmark_runs = sum("benchmark" in s for s in summaries)
        if benchmark_runs:
            if benchmark_runs < len(summaries):
                raise UsageError("give benchmark runs (eval --benchmark) or debugging runs, not both")
            return compare_benchmarks(summaries, Path(args.out))
    except (UsageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from jaxrl.eval import plots  # noqa: PLC0415  (matplotlib only for compare)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = compare_markdown(summaries)
    (out / "compare.md").write_text(table, encoding="utf-8")
    print(table)
    figures = (("precision_vs_pass.png", plots.precision_vs_pass), ("noop_vs_damage.png", plots.noop_vs_damage))
    for name, draw in figures:
        if draw(summaries, out / name):
            print(f"wrote {out / name}")
        else:
            print(f"skipped {name}: no run has the tasks it needs")
    return 0


def compare_benchmarks(summaries: list[dict[str, Any]], out: Path) -> int:
    """compare.md in the paper's Table 6 shape: a row per model, a column per benchmark."""
    from jaxrl.eval.report import benchmark_table  # noqa: PLC0415

    table = benchmark_table(summaries)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(table, encoding="utf-8")
    print(table)
    return 0


def compare_groups(args: argparse.Namespace) -> int:
    """compare.md of grouped runs (mean ± std, marks) and, with --sweep, lambda_sweep.png."""
    from jaxrl.eval import groups as G  # noqa: PLC0415

    named = [G.parse_group(g) for g in args.group]
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise UsageError(f"--group names repeat: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    sweep = dict(G.parse_sweep(s) for s in args.sweep)
    unknown = sorted(set(sweep) - set(names))
    if unknown:
        raise UsageError(f"--sweep names no group: {', '.join(unknown)}")
    if len(sweep) == 1:
        raise UsageError("--sweep needs two groups at least")
    runs = [(name, [read_summary(d) for d in dirs]) for name, dirs in named]
    if any("benchmark" in s for _, summaries in runs for s in summaries):
        raise UsageError("--group is for debugging runs; give benchmark runs as DIR ... (Table 6)")
    stats = G.group_stats(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = G.grouped_markdown(stats)
    (out / "compare.md").write_text(table, encoding="utf-8")
    print(table)
    if sweep:
        from jaxrl.eval import plots  # noqa: PLC0415  (matplotlib only for compare)

        if plots.lambda_sweep(G.sweep_points(stats, sweep), out / "lambda_sweep.png"):
            print(f"wrote {out / 'lambda_sweep.png'}")
        else:
            print("skipped lambda_sweep.png: fewer than two swept groups have buggy tasks")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.action == "compare":
        return run_compare(args)
    if args.benchmark or args.data or args.predictions or args.reference:
        from jaxrl.eval.bench_cli import run_benchmark  # noqa: PLC0415

        return run_benchmark(args)
    try:
        refiner_source(args)
        if not args.tasks or not args.out:
            raise UsageError("--tasks and --out are required")
        if (args.prompt in prompts.REFINE_PROMPTS) != (args.candidates is not None):
            raise UsageError("--prompt refine (or demo_refine) needs --candidates, and only they take them")
        if args.retries < 0:
            raise UsageError(f"--retries must be >= 0, got {args.retries}")
        if not args.agent and (args.turns is not None or args.agent_tests):
            raise UsageError("--turns and --agent-tests are for --agent")
        if args.agent and (args.prompt != "minimal" or args.candidates):
            raise UsageError("--agent has its own prompt; drop --prompt and --candidates")
        problem = output_dir_error(args.out)
        if problem:
            raise UsageError(f"--out {problem}")
        settings = settings_of(args)
        kind = engine_kind(args)
        tasks = load_tasks(args.tasks)[:args.limit]
        if not tasks:
            raise UsageError(f"{args.tasks} holds no tasks")
        clash = other_run(Path(args.out), settings, tasks, chat=kind == "openai" and args.api == "chat",
                          agent=dataclasses.asdict(agent_settings(args)) if args.agent else None)
        if clash:
            raise UsageError(clash)
        candidates = None
        if args.candidates:
            by_id = {t.task_id: t for t in tasks}
            candidates = {}
            for pred in load_predictions_for(candidates_file(args.candidates), by_id, skip_unknown=True):
                candidates.setdefault(pred.task_id, pred)
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
            chat = kind == "openai" and args.api == "chat"
            if args.agent:
                from jaxrl.agent.evaluate import evaluate_agent  # noqa: PLC0415

                result = evaluate_agent(engine, tokenizer, tasks, settings, fleet,
                                        agent_settings(args),
                                        model=model, task_set=args.tasks, out_dir=args.out,
                                        batch_size=args.batch_size * args.concurrency, retries=0,
                                        progress=not args.no_progress, chat=chat)
            else:
                result = evaluate(engine, tokenizer, tasks, settings, fleet, model=model, task_set=args.tasks,
                                  candidates=candidates, out_dir=args.out, batch_size=args.batch_size,
                                  concurrency=args.concurrency, retries=0, progress=not args.no_progress, chat=chat)
    except EvalError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        kept = "episodes.jsonl" if args.agent else "predictions.jsonl"
        print(f"interrupted: the samples done are kept in {args.out}/{kept}; "
              "rerun the same command to continue", file=sys.stderr)
        return 130
    print((Path(args.out) / "report.md").read_text(encoding="utf-8"))
    print(f"wrote {args.out}/predictions.jsonl, {'episodes.jsonl, ' if args.agent else ''}scores.jsonl, "
          "summary.json, report.md "
          f"({len(result.samples)} samples, {result.summary['unverifiable']['count']} unverifiable)")
    return 0


def refiner_source(args: argparse.Namespace) -> None:
    """`--refiner DIR` is `--checkpoint DIR --prompt refine` (or `demo_refine`, the demo refiner's, when
    given); the default prompt is filled in otherwise."""
    if args.refiner is not None:
        if args.model or args.checkpoint or args.engine not in (None, "jax"):
            raise UsageError("--refiner is the model: drop --model, --checkpoint and --engine")
        if args.prompt not in (None, *prompts.REFINE_PROMPTS) or args.agent:
            raise UsageError("--refiner answers under a refine prompt: drop --agent, and --prompt unless it is "
                             "refine or demo_refine")
        if args.candidates is None:
            raise UsageError("--refiner needs --candidates EVAL_DIR (the base's eval run) or C.jsonl")
        args.checkpoint, args.prompt = args.refiner, args.prompt or "refine"
    args.prompt = args.prompt or EvalSettings.prompt


def candidates_file(path: str) -> Path:
    """The candidates' JSONL: the file given, or an eval run directory's predictions.jsonl."""
    p = Path(path)
    return p / "predictions.jsonl" if p.is_dir() else p


def agent_settings(args: argparse.Namespace):
    """The agent's settings of an `eval --agent` command."""
    from jaxrl.agent.evaluate import AgentSettings  # noqa: PLC0415

    return AgentSettings(args.turns or AgentSettings.turns, args.agent_tests)


def other_run(out: Path, settings: EvalSettings, tasks: list, chat: bool, agent: dict | None = None) -> str | None:
    """Why `out` cannot be resumed with these settings and tasks (checked before a model loads), or None."""
    try:
        previous = json.loads((out / RUN).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"{out / RUN} is unreadable ({e}); use another --out directory"
    now = json.loads(json.dumps({"settings": settings.to_json(), "chat": chat, "tasks": [t.task_id for t in tasks],
                                 "agent": agent}))
    changed = sorted(k for k in now if previous.get(k) != now[k])
    if changed:
        return f"{out} holds a run with other {', '.join(changed)}; use another --out directory or delete it"
    return None


def _cache_path(out: str) -> Path:
    """The run's persistent test-verdict cache, so a rerun re-scores in seconds."""
    path = Path(out) / ".cache"
    path.mkdir(parents=True, exist_ok=True)
    return path / "runs.jsonl"
