"""The paper's analyses of thinking and of rewards, over eval runs and score tables.

  precisecoder analyze thinking RUN_DIR... --tasks T.jsonl --out DIR [--tokenizer qwen3|qwen3_5|none]
  precisecoder analyze rewards --scores S.jsonl [--group-size G] [--runs DIR...] [--json]

`thinking` measures the think blocks of each run's predictions.jsonl (length, the
lexicon rates, MATTR, repetition, quoting the buggy lines) against the outcomes in
its scores.jsonl, and writes DIR/tables.md, DIR/measures.csv and PNG figures.
`rewards` gives Fig 2's correlations between the reward terms, A.2's constant-term
and group-composition shares and the advantage mass of collapsed groups per
estimator, and with --runs Fig 3's no-op vs precision across runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


OLS_DEFAULT = ("words", "mattr", "repetition", "quotes_bug", "hedging", "certainty", "bug_assertion",
               "self_correction", "hypothesis", "verification", "minimality")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="thinking|rewards")
    thinking = actions.add_parser("thinking", help="lexical analysis of the think blocks of eval runs",
                                  description="Lexical analysis of the think blocks of eval runs: tables.md, "
                                              "measures.csv, lexicon_rates.png, length_vs_f1.png.")
    thinking.add_argument("runs", nargs="+", metavar="RUN_DIR", help="directories written by `precisecoder eval`")
    thinking.add_argument("--tasks", required=True, help="the task JSONL the runs were evaluated on")
    thinking.add_argument("--out", required=True, help="write tables.md, measures.csv and the PNGs here")
    thinking.add_argument("--tokenizer", choices=("qwen3", "qwen3_5", "none"), default="qwen3_5",
                          help="count thinking tokens with this vocabulary ('none': leave the column empty)")
    thinking.add_argument("--top", type=int, default=15, help="bigrams listed each way per contrast (default 15)")
    thinking.add_argument("--ols", default=",".join(OLS_DEFAULT), metavar="MEASURE,...",
                          help=f"the measures F1 is regressed on (default: {','.join(OLS_DEFAULT)})")
    rewards = actions.add_parser("rewards", help="Fig 2, A.2 and Fig 3 over a score table",
                                 description="Reward analyses of a score table with several samples per task.")
    rewards.add_argument("--scores", required=True, help="scores.jsonl (`precisecoder score` or `eval`)")
    rewards.add_argument("--group-size", type=int, default=None,
                         help="samples of a task per group, in file order (default: all samples of a task)")
    rewards.add_argument("--runs", nargs="*", default=[], metavar="DIR",
                         help="eval runs for Fig 3 (no-op on clean tasks vs precision on buggy ones)")
    rewards.add_argument("--lambda", dest="lam", type=float, default=1 / 3, help="λ of the estimators' weights")
    rewards.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _clean_json(obj: Any) -> Any:
    """NaN (undefined) as null, so the output is strict JSON."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_json(v) for v in obj]
    return obj


def run_thinking(args: argparse.Namespace) -> int:
    from jaxrl.studies import lexical, thinking, thinking_report  # noqa: PLC0415
    from reward.schema import SchemaError, load_tasks  # noqa: PLC0415

    try:
        tasks = {t.task_id: t for t in load_tasks(args.tasks)}
        runs = [thinking.load_run(d) for d in args.runs]
        lexicons = lexical.load_lexicons()
        count = None
        if args.tokenizer != "none":
            from models.tokenizer import load_tokenizer  # noqa: PLC0415

            tok = load_tokenizer(args.tokenizer)
            count = lambda text: len(tok.encode(text))  # noqa: E731
        rows = thinking.measure_runs(runs, tasks, lexicons, count)
    except (SchemaError, OSError, thinking.AnalysisError) as e:
        return _error(str(e))
    if not rows:
        return _error("no run has a sample with a think block")
    if args.top < 0:
        return _error(f"--top must be >= 0, got {args.top}")
    measures = [*thinking.SHAPE, *lexicons]
    regressors = [m for m in args.ols.split(",") if m]
    unknown = sorted(set(regressors) - set(measures))
    if unknown or not regressors:
        return _error(f"--ols: unknown measures {', '.join(unknown)}; choose from {', '.join(measures)}"
                      if unknown else "--ols names no measure")
    means = thinking.run_means(rows, [*measures, "budget_hit", *thinking.OUTCOMES])
    buggy = [r for r in rows if not r["clean"]]
    correlations = thinking.correlations(buggy, measures, ("unit", "precision", "f1", "edited_lines"))
    fit, dropped, fit_error = None, [], None
    try:
        fit, dropped = thinking.regression(buggy, regressors)
    except (ValueError, thinking.AnalysisError) as e:
        fit_error = str(e)
    contrasts = [thinking.contrast(runs[0], other, args.top) for other in runs[1:]]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    thinking_report.write_measures_csv(rows, out / "measures.csv")
    table = thinking_report.tables_markdown(means, [*measures, "budget_hit", *thinking.OUTCOMES], correlations, fit,
                                            dropped, fit_error, contrasts)
    (out / "tables.md").write_text(table, encoding="utf-8")
    thinking_report.plot_rates(means, list(lexicons), out / "lexicon_rates.png")
    thinking_report.plot_length_vs_f1(rows, out / "length_vs_f1.png")
    print(table)
    print(f"wrote {out}/tables.md, measures.csv, lexicon_rates.png, length_vs_f1.png ({len(rows)} traces)")
    return 0


def rewards_text(result: dict[str, Any]) -> str:
    """The reward analyses as short Markdown tables."""
    def num(x: Any) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"

    out = [f"{result['samples']} samples, {result['groups_count']} groups ({result['left_out']} samples left out "
           "of incomplete groups)", "", "Fig 2: Pearson r between the reward terms (buggy tasks)", "",
           "| pair | pooled | within task |", "|---|---|---|"]
    out += [f"| {k} | {num(v)} | {num(result['within_task_correlations'][k])} |"
            for k, v in result["correlations"].items()]
    out += ["", "A.2: share of groups where the term is constant", "", "| term | share |", "|---|---|"]
    out += [f"| {k} | {num(v)} |" for k, v in result["constant_share"].items()]
    g = result["groups"]
    out += ["", f"groups: all pass {num(g['all_pass'])}, all fail {num(g['all_fail'])}, mixed {num(g['mixed'])}"]
    if result["advantage_mass_collapsed"]:
        out += ["", "Share of the advantage mass Σ|A| in collapsed groups (unit constant)", "",
                "| estimator | share |", "|---|---|"]
        out += [f"| {k} | {num(v)} |" for k, v in result["advantage_mass_collapsed"].items()]
    out += ["", f"edited lines over passing samples: {num(result['passing_edited_lines'])}"]
    if "noop_vs_precision" in result:
        f3 = result["noop_vs_precision"]
        out += ["", "Fig 3: no-op rate (clean tasks) vs precision (buggy tasks) across runs", "",
                "| run | no-op | precision |", "|---|---|---|"]
        out += [f"| {p['run']} | {num(p['noop'])} | {num(p['precision'])} |" for p in f3["runs"]]
        out.append(f"\nr = {num(f3['r'])}")
    return "\n".join(out) + "\n"


def run_rewards(args: argparse.Namespace) -> int:
    from jaxrl.studies import rewards_analysis  # noqa: PLC0415

    if args.group_size is not None and args.group_size < 1:
        return _error(f"--group-size must be >= 1, got {args.group_size}")
    try:
        scores = [json.loads(line) for line in Path(args.scores).read_text(encoding="utf-8").splitlines()
                  if line.strip()]
        for i, s in enumerate(scores, 1):
            if not isinstance(s, dict) or not {"task_id", "unit", "f1", "precision", "recall", "edited_lines"} <= set(s):
                return _error(f"{args.scores}:{i}: not a score record")
        summaries = [json.loads((Path(d) / "summary.json").read_text(encoding="utf-8")) for d in args.runs]
    except (OSError, json.JSONDecodeError) as e:
        return _error(str(e))
    if not scores:
        return _error(f"{args.scores} holds no scores")
    result = rewards_analysis.analyze_scores(scores, args.group_size, args.lam)
    if args.runs:
        try:
            result["noop_vs_precision"] = rewards_analysis.noop_vs_precision(summaries)
        except (KeyError, TypeError, AttributeError):
            return _error("a --runs directory holds no eval summary.json")
    print(json.dumps(_clean_json(result)) if args.json else rewards_text(result))
    return 0


def main(args: argparse.Namespace) -> int:
    if args.action == "thinking":
        return run_thinking(args)
    if args.action == "rewards":
        return run_rewards(args)
    return _error("say what to analyze: `precisecoder analyze thinking ...` or `precisecoder analyze rewards ...`")
