"""Select training data for the supervised baselines from a scored pool (paper, C.2).

  precisecoder select sft   --pool DIR --rank-by precision|f1 --top 2 --out FILE
  precisecoder select dpo   --pool DIR --out FILE
  precisecoder select recap --pool DIR --tasks T --out FILE [--ratio 3:1:1] [--max N] [--prompt refine]

Ties keep the lower `sample` index first; a DPO pair whose two scores are equal is
skipped (docs/baselines.md has every rule). The counts go to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from jaxrl.prompts import REFINE_PROMPTS
from jaxrl.selection import (RANK_KEYS, SelectionError, mix_recap, parse_ratio, read_pool, recap_candidates,
                             recap_example, select_dpo, select_sft, teacher_messages)
from reward.schema import SchemaError, load_tasks, write_jsonl


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="kind", required=True, metavar="{sft,dpo,recap}")
    sft = sub.add_parser("sft", help="rejection-sampling SFT targets: the top passing samples per task")
    sft.add_argument("--rank-by", choices=RANK_KEYS, default="precision",
                     help="rank a task's passing samples by this (descending; default: precision, the paper's 4B)")
    sft.add_argument("--top", type=int, default=2, help="samples kept per task (default: 2)")
    dpo = sub.add_parser("dpo", help="DPO pairs: rank by unit + F1/2, pair 1st vs 15th and 2nd vs 16th")
    recap = sub.add_parser("recap", help="RECAP refiner examples: trim, repair and keep at a ratio")
    recap.add_argument("--tasks", required=True, help="the pool's task JSONL (prompts, buggy code, solutions)")
    recap.add_argument("--ratio", type=parse_ratio_arg, default=(3, 1, 1),
                       help="trim:repair:keep mix (default: 3:1:1)")
    recap.add_argument("--seed", type=int, default=0, help="seed of the draw within each kind (default: 0)")
    recap.add_argument("--max", type=int, default=None, metavar="N",
                       help="at most N examples, still at --ratio (default: as many as the pool allows)")
    recap.add_argument("--prompt", choices=REFINE_PROMPTS, default="refine",
                       help="the examples' prompt: the paper's refine (default), or demo_refine for the demo's "
                            "policy (`precisecoder demo`)")
    recap.add_argument("--teacher-base-url", help="an OpenAI-compatible API root whose model writes a reasoning "
                                                  "trace for each example (the response's think block)")
    recap.add_argument("--teacher-model", help="the teacher's served model name (with --teacher-base-url)")
    recap.add_argument("--teacher-max-tokens", type=int, default=2048, help="tokens of one trace (default: 2048)")
    for p in (sft, dpo, recap):
        p.add_argument("--pool", required=True, help="pool directory (its pool.jsonl) or a pool JSONL file")
        p.add_argument("--out", required=True, help="write the selected rows here (JSONL)")


def parse_ratio_arg(text: str) -> tuple[int, int, int]:
    try:
        return parse_ratio(text)
    except SelectionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _recap_rows(args: argparse.Namespace, rows) -> list[dict]:
    try:
        tasks = load_tasks(Path(args.tasks).expanduser())
    except (OSError, SchemaError) as e:
        raise SelectionError(f"--tasks: {e}") from None
    candidates = recap_candidates(rows, tasks)
    available = Counter(c.kind for c in candidates)
    mixed = mix_recap(candidates, args.ratio, args.seed, args.max)
    print("available: " + ", ".join(f"{k} {available[k]}" for k in ("trim", "repair", "keep")), file=sys.stderr)
    known = {t.task_id: t for t in tasks}
    traces = _teacher_traces(args, [(c, known[c.task_id]) for c in mixed]) if args.teacher_base_url else None
    return [recap_example(c, known[c.task_id], traces[i] if traces else None, args.prompt)
            for i, c in enumerate(mixed)]


def _teacher_traces(args: argparse.Namespace, items) -> list[str]:
    """One trace per example from the teacher's chat completions (its reasoning, else its answer)."""
    from jaxrl.rollout import SamplingParams
    from jaxrl.rollout.openai_engine import OpenAIEngine

    engine = OpenAIEngine(args.teacher_base_url, args.teacher_model)
    params = SamplingParams(temperature=0.0, max_tokens=args.teacher_max_tokens, thinking_budget=None)
    try:
        groups = engine.chat([teacher_messages(c, task) for c, task in items], params)
    except (ValueError, RuntimeError, OSError) as e:
        raise SelectionError(f"the teacher failed: {e}") from None
    traces = [(group[0].thinking or group[0].answer).strip() for group in groups]
    if not all(traces):
        raise SelectionError(f"the teacher gave {traces.count('')} empty traces")
    return traces


def main(args: argparse.Namespace) -> int:
    try:
        if args.kind == "sft" and args.top < 1:
            raise SelectionError(f"--top must be >= 1, got {args.top}")
        if args.kind == "recap" and bool(args.teacher_base_url) != bool(args.teacher_model):
            raise SelectionError("--teacher-base-url and --teacher-model go together")
        rows = read_pool(args.pool)
        if args.kind == "sft":
            out = select_sft(rows, args.rank_by, args.top)
        elif args.kind == "dpo":
            out = select_dpo(rows)
        else:
            out = _recap_rows(args, rows)
        Path(args.out).expanduser().parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(Path(args.out).expanduser(), out)
    except (SelectionError, OSError) as e:
        print(f"precisecoder select: {e}", file=sys.stderr)
        return 2
    tasks = len({r["task_id"] for r in out})
    print(f"{len(out)} {args.kind} rows from {tasks} of {len({r.task_id for r in rows})} tasks -> {args.out}",
          file=sys.stderr)
    return 0
