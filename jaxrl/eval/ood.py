"""One out-of-distribution evaluation: sample each benchmark problem, grade the answers, summarize pass@1.

The sampling is `evaluate.sample_all`'s (batches, concurrency, retries, a resumable
predictions.jsonl, a progress bar); the grading is one sandbox run per answer
(`benchmarks.job_of`) on a verification fleet. `score_predictions_file` grades answers made
elsewhere (`eval --benchmark NAME --predictions FILE`).

A problem's value is the share of its samples that pass (pass@1 with one sample, the paper's
protocol); a sample with no answer fails; an `unverifiable` run (the judge could not verify it,
docs/reward.md) is left out, as in the debugging summaries, and counted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl.eval import stats
from jaxrl.eval.benchmarks import BenchTask, answer_of, job_of
from jaxrl.eval.evaluate import REPORT, SUMMARY, PredictionLog, Request, _write_json, sample_all
from jaxrl.eval.protocol import EvalSettings
from reward.sandbox import RunResult
from reward.schema import Prediction, write_jsonl

RESULTS = "results.jsonl"
# The sampling settings a benchmark run records (the debugging-only ones, λ, ε and the clean budget, do not apply).
SAMPLING = ("samples", "temperature", "top_p", "top_k", "thinking_budget", "max_tokens", "enable_thinking", "seed")


def requests_of(tasks: Sequence[BenchTask], settings: EvalSettings, tokenizer: Any, chat: bool) -> list[Request]:
    """Each problem's prompt rendered through the model's chat template (with `chat`, the server renders it)."""
    out = []
    for task in tasks:
        text = tokenizer.render_chat(task.messages, enable_thinking=settings.enable_thinking)
        think_opened = not chat and settings.enable_thinking and text.endswith("<think>\n")
        out.append(Request(task, task.messages, tokenizer.encode(text), think_opened))
    return out


def grade(tasks: Sequence[BenchTask], predictions: Sequence[Prediction], fleet: Any,
          progress: bool = False) -> list[dict[str, Any]]:
    """One result row per prediction: `task_id`, `sample` (its index among the task's predictions),
    `answer` (None when none was found), `passed`, `status` (`no_answer`, or the sandbox run's) and
    `duration_s`."""
    by_id = {t.task_id: t for t in tasks}
    answers = [answer_of(by_id[p.task_id], p) for p in predictions]
    runs = [(i, job_of(by_id[p.task_id], a)) for i, (p, a) in enumerate(zip(predictions, answers)) if a is not None]
    verdicts = fleet.run([job for _, job in runs], progress="grading" if progress else False)
    results: dict[int, RunResult] = {i: result for (i, _), result in zip(runs, verdicts)}
    rows, seen = [], {}
    for i, (pred, answer) in enumerate(zip(predictions, answers)):
        result = results.get(i)
        seen[pred.task_id] = seen.get(pred.task_id, -1) + 1
        rows.append({"task_id": pred.task_id, "sample": seen[pred.task_id], "answer": answer,
                     "passed": bool(result and result.passed),
                     "status": result.status if result else "no_answer",
                     "duration_s": round(result.duration_s, 4) if result else None})
    return rows


def summarize(benchmark: str, tasks: Sequence[BenchTask], rows: Sequence[Mapping[str, Any]],
              model: Mapping[str, Any], settings: Mapping[str, Any] | None, data: str,
              resamples: int = stats.RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """summary.json of a benchmark run: pass@1 over problems with its bootstrap interval, and counts.

    A problem without a row counts as failed; unverifiable rows are left out (a problem with only
    those has no value and drops out of the mean).
    """
    by_task: dict[str, list[Mapping[str, Any]]] = {t.task_id: [] for t in tasks}
    for row in rows:
        by_task[row["task_id"]].append(row)
    values = []
    for task in tasks:
        kept = [r for r in by_task[task.task_id] if r["status"] != "unverifiable"]
        if by_task[task.task_id] and not kept:
            values.append(float("nan"))
        else:
            values.append(float(np.mean([r["passed"] for r in kept])) if kept else 0.0)
    v = np.asarray(values, np.float64)
    ci = stats.bootstrap_ci(v, resamples, stats.LEVEL, seed)
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    present = v[~np.isnan(v)]
    return {
        "benchmark": benchmark,
        "data": data,
        "model": dict(model),
        "settings": dict(settings) if settings is not None else None,
        "tasks": len(tasks),
        "samples": len(rows),
        "pass@1": {"value": float(present.mean()) if present.size else None, "ci": None if ci is None else list(ci)},
        "passed": sum(bool(r["passed"]) for r in rows),
        "missing": sum(not group for group in by_task.values()),
        "statuses": dict(sorted(statuses.items())),
        "bootstrap": {"resamples": resamples, "level": stats.LEVEL, "seed": seed},
    }


def report_markdown(summary: Mapping[str, Any]) -> str:
    """report.md of a benchmark run."""
    s = summary
    p = s["pass@1"]
    value = "–" if p["value"] is None else f"{100 * p['value']:.1f}"
    interval = "" if p["ci"] is None else f" ({100 * p['ci'][0]:.1f}–{100 * p['ci'][1]:.1f})"
    statuses = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in s["statuses"].items())
    lines = [f"# {s['benchmark']}: {s['model'].get('name') or 'the model'}", "",
             f"Data: `{s['data']}`, {s['tasks']} problems, {s['samples']} samples.", "",
             f"- pass@1: {value} %{interval}",
             f"- samples passed: {s['passed']} of {s['samples']}; by status: {statuses or 'none'}",
             f"- problems without a prediction (counted failed): {s['missing']}",
             f"- interval: percentile bootstrap over problems, {s['bootstrap']['resamples']} resamples, "
             f"{100 * s['bootstrap']['level']:.0f} %, seed {s['bootstrap']['seed']}"]
    if s["settings"]:
        st = s["settings"]
        lines.append(f"- sampling: {st['samples']} per problem, temperature {st['temperature']}, top-p {st['top_p']}, "
                     f"thinking {'on' if st['enable_thinking'] else 'off'}, thinking budget {st['thinking_budget']} "
                     f"of {st['max_tokens']} tokens, seed {st['seed']}")
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: Path, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> None:
    """results.jsonl (a row per prediction), summary.json, report.md."""
    write_jsonl(out_dir / RESULTS, rows)
    _write_json(out_dir / SUMMARY, summary)
    (out_dir / REPORT).write_text(report_markdown(summary), encoding="utf-8")


def evaluate_benchmark(engine: Any, tokenizer: Any, benchmark: str, tasks: Sequence[BenchTask],
                       settings: EvalSettings, fleet: Any, *, model: Mapping[str, Any], data: str,
                       out_dir: str | os.PathLike, batch_size: int = 16, concurrency: int = 1,
                       progress: bool = False, chat: bool = False) -> dict[str, Any]:
    """Sample every problem (resuming from out_dir/predictions.jsonl), grade, write the outputs; the summary."""
    sampling = {k: v for k, v in settings.to_json().items() if k in SAMPLING}
    requests = requests_of(tasks, settings, tokenizer, chat)
    run = {"benchmark": benchmark, "settings": sampling, "model": dict(model), "chat": chat,
           "tasks": [t.task_id for t in tasks]}
    log = PredictionLog(out_dir, run, settings.samples)
    try:
        by_task = sample_all(engine, requests, settings, log=log, batch_size=batch_size, concurrency=concurrency,
                             retries=0, progress=progress, chat=chat)
    finally:
        log.close()
    samples = [s for t in tasks for s in by_task[t.task_id]]
    log.finish(samples)
    predictions = [Prediction(s.task_id, response=s.response, think_opened=s.think_opened) for s in samples]
    rows = grade(tasks, predictions, fleet, progress)
    summary = summarize(benchmark, tasks, rows, model, sampling, data)
    write_outputs(Path(out_dir), rows, summary)
    return summary


def score_predictions_file(benchmark: str, tasks: Sequence[BenchTask], predictions: Sequence[Prediction], fleet: Any,
                           *, model: Mapping[str, Any], data: str, out_dir: str | os.PathLike,
                           progress: bool = False) -> dict[str, Any]:
    """Grade answers made elsewhere and write results.jsonl, summary.json and report.md; the summary."""
    rows = grade(tasks, predictions, fleet, progress)
    summary = summarize(benchmark, tasks, rows, model, None, data)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, rows, summary)
    return summary
