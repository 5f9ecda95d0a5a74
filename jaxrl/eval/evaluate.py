"""One evaluation: render every task with the paper's prompt, sample, extract, score, summarize.

`evaluate` is the one code path behind `precisecoder eval` and the trainer's
validation, so the numbers during training and after it are the same numbers.
It asks an `Engine` for completions (never learning which engine it is), scores
them with the PreciseCoder scorer on a verification fleet, and returns an
`EvalResult`; with `out_dir` it also keeps `predictions.jsonl` up to date as
batches finish, so an interrupted run continues where it stopped.

Generation goes in batches of prompts that share their sampling parameters
(buggy and clean tasks differ in thinking budget); up to `concurrency` batches
are in flight at once (HTTP engines; the embedded engine wants 1), and a failed
batch is retried with backoff. Batches are cut from the whole task list and each
draws its seed from the run's seed and its first task, so on resume a batch
keeps its seed and only its tasks not yet sampled are sent.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from jaxrl import prompts
from jaxrl.eval import stats
from jaxrl.eval.protocol import (EvalSettings, candidate_program, invalid_reason, response_text, split_by_kind,
                                 task_messages)
from jaxrl.eval.report import report_markdown
from jaxrl.rollout.engine import Completion, Engine, SamplingParams
from reward.sandbox import Limits
from reward.schema import Prediction, Task, write_jsonl
from reward.score import Score, aggregate, score_predictions

PREDICTIONS, SCORES, SUMMARY, REPORT, RUN = "predictions.jsonl", "scores.jsonl", "summary.json", "report.md", "run.json"


class EvalError(RuntimeError):
    """An evaluation that cannot go on; the message says why and what was kept."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One completion of one task: a line of predictions.jsonl.

    Attributes:
        task_id: the task.
        sample: its index among the task's K samples.
        response: the full response the scorer reads (`precisecoder score` takes this file as is).
        think_opened: the prompt opened the think block, so `response` starts inside it.
        thinking: the think block's text, None when there was none.
        answer: the text after the think block.
        finish_reason: "stop" or "length".
        completion_tokens: tokens the engine returned.
        budget_hit: the thinking budget closed the think block.
    """

    task_id: str
    sample: int
    response: str
    think_opened: bool
    thinking: str | None
    answer: str
    finish_reason: str
    completion_tokens: int
    budget_hit: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Sample:
        return cls(**{f.name: obj[f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """An evaluation's samples (task order, then sample index), their scores and the summary."""

    samples: list[Sample]
    scores: list[Score]
    summary: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Request:
    """One task's prompt: its messages, token ids, and whether the prompt opened the think block."""

    task: Task
    messages: list[dict[str, str]]
    prompt_ids: list[int]
    think_opened: bool


def build_requests(tasks: Sequence[Task], settings: EvalSettings, tokenizer: Any,
                   candidates: Mapping[str, Prediction] | None = None, chat: bool = False) -> tuple[list[Request], int]:
    """The requests of all tasks, and how many refine candidates had no program (buggy code shown instead).

    With `chat` the server renders the messages itself, so no prompt opens a think block.
    """
    if settings.prompt in prompts.REFINE_PROMPTS:
        if candidates is None:
            raise EvalError(f"the {settings.prompt} prompt needs candidates (one per task)")
        missing = [t.task_id for t in tasks if t.task_id not in candidates]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise EvalError(f"{len(missing)} tasks have no candidate: {shown}")
    requests, replaced = [], 0
    for task in tasks:
        candidate = None
        if settings.prompt in prompts.REFINE_PROMPTS:
            candidate, real = candidate_program(candidates[task.task_id], task)
            replaced += not real
        messages = task_messages(task, settings.prompt, candidate)
        text = tokenizer.render_chat(messages, enable_thinking=settings.enable_thinking)
        think_opened = not chat and settings.enable_thinking and text.endswith("<think>\n")
        requests.append(Request(task, messages, tokenizer.encode(text), think_opened))
    return requests, replaced


def batch_seed(seed: int, first_task_id: str) -> int:
    """A batch's sampling seed: a hash of the run's seed and its first task (31 bits)."""
    digest = hashlib.sha256(f"{seed}\0{first_task_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def batches(requests: Sequence[Request], settings: EvalSettings,
            size: int) -> list[tuple[list[Request], SamplingParams]]:
    """Requests cut into batches of at most `size` that share sampling parameters (buggy first, then clean)."""
    out = []
    for clean in (False, True):
        group = [r for r in requests if r.task.is_clean == clean]
        for i in range(0, len(group), size):
            chunk = group[i:i + size]
            out.append((chunk, settings.params(clean, seed=batch_seed(settings.seed, chunk[0].task.task_id))))
    return out


def samples_of(request: Request, completions: Sequence[Completion]) -> list[Sample]:
    """The prediction records of one task's completions."""
    return [Sample(request.task.task_id, k, response_text(c), request.think_opened, c.thinking, c.answer,
                   c.finish_reason, len(c.token_ids), c.budget_hit) for k, c in enumerate(completions)]


class PredictionLog:
    """predictions.jsonl as a resumable log: complete tasks are kept, lines appended as batches finish.

    A run directory remembers its settings and tasks in run.json; resuming with
    different ones is refused rather than mixing two protocols in one file. A
    torn last line (a kill during a write) and tasks with fewer than K samples
    are dropped, and their tasks sampled again.
    """

    def __init__(self, out_dir: str | os.PathLike, run: dict[str, Any], samples: int):
        self.dir = Path(out_dir)
        claim_run_dir(self.dir, run)
        self.done: dict[str, list[Sample]] = {}
        path = self.dir / PREDICTIONS
        if path.exists():
            found: dict[str, list[Sample]] = {}
            for line in path.read_text(encoding="utf-8").split("\n"):
                try:
                    s = Sample.from_json(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue
                found.setdefault(s.task_id, []).append(s)
            self.done = {tid: sorted(group, key=lambda s: s.sample)[:samples]
                         for tid, group in found.items() if len({s.sample for s in group}) >= samples}
        self._write_all(s for group in self.done.values() for s in group)
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def _write_all(self, samples) -> None:
        tmp = self.dir / f"{PREDICTIONS}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(s.to_json(), ensure_ascii=False) + "\n")
        os.replace(tmp, self.dir / PREDICTIONS)

    def append(self, samples: Sequence[Sample]) -> None:
        """Write samples and flush them to disk before returning."""
        with self._lock:
            self._file.write("".join(json.dumps(s.to_json(), ensure_ascii=False) + "\n" for s in samples))
            self._file.flush()
            os.fsync(self._file.fileno())

    def finish(self, samples: Sequence[Sample]) -> None:
        """Rewrite the file in task order, once everything is sampled."""
        self.close()
        self._write_all(samples)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def claim_run_dir(out_dir: Path, run: dict[str, Any], name: str = RUN, kind: str = "run") -> None:
    """Create the run directory and its run.json (`name`), or check that the one there has the same settings."""
    out_dir.mkdir(parents=True, exist_ok=True)
    run_path = out_dir / name
    if run_path.exists():
        try:
            previous = json.loads(run_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise EvalError(f"{run_path} is unreadable ({e}); use another --out directory") from None
        changed = sorted(k for k in set(previous) | set(run) if previous.get(k) != run.get(k))
        if changed:
            raise EvalError(f"{out_dir} holds a {kind} with other {', '.join(changed)}; "
                            "use another --out directory or delete it")
    else:
        _write_json(run_path, run)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _generate(engine: Engine, batch: Sequence[Request], params: SamplingParams, retries: int,
              backoff_s: float, chat: bool) -> list[list[Completion]]:
    """One batch from the engine, retried with exponential backoff; the last error is raised."""
    for attempt in range(retries + 1):
        try:
            if chat:
                out = engine.chat([r.messages for r in batch], params)
            else:
                out = engine.generate([r.prompt_ids for r in batch], params)
            if len(out) != len(batch) or any(len(c) != params.n for c in out):
                raise EvalError(f"the engine returned {[len(c) for c in out]} completions for "
                                f"{len(batch)} prompts × {params.n}")
            return out
        except Exception:
            if attempt == retries:
                raise
            time.sleep(backoff_s * 2 ** attempt)
    raise AssertionError("unreachable")


def sample_all(engine: Engine, requests: Sequence[Request], settings: EvalSettings, *,
               log: PredictionLog | None = None, batch_size: int = 16, concurrency: int = 1,
               retries: int = 2, backoff_s: float = 1.0, progress: bool = False,
               chat: bool = False) -> dict[str, list[Sample]]:
    """task_id -> its K samples, for every request; batches already in `log` are not sampled again."""
    done: dict[str, list[Sample]] = dict(log.done) if log else {}
    work = [([r for r in batch if r.task.task_id not in done], params)
            for batch, params in batches(requests, settings, batch_size)]
    work = [(batch, params) for batch, params in work if batch]
    bar = tqdm(total=len(requests), initial=len(done), desc="sampling", unit="task",
               disable=not progress, smoothing=0.1)
    lock = threading.Lock()

    def run(batch: list[Request], params: SamplingParams) -> None:
        completions = _generate(engine, batch, params, retries, backoff_s, chat)
        got = {r.task.task_id: samples_of(r, c) for r, c in zip(batch, completions)}
        if log:
            log.append([s for group in got.values() for s in group])
        with lock:
            done.update(got)
            bar.update(len(batch))

    failure: BaseException | None = None
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = [pool.submit(run, batch, params) for batch, params in work]
        for future in concurrent.futures.as_completed(futures):
            failure = future.exception()
            if failure is not None:
                break
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # batches in flight still land in the log
        bar.close()
    if failure is not None:
        kept = f"; the {len(done)} tasks done are kept in {log.dir / PREDICTIONS}, " \
               "rerun the same command to continue" if log else ""
        raise EvalError(f"sampling failed after {retries + 1} attempts: "
                        f"{type(failure).__name__}: {failure}{kept}") from failure
    return done


def summarize(tasks: Sequence[Task], samples: Sequence[Sample], scores: Sequence[Score], settings: EvalSettings,
              model: Mapping[str, Any], *, task_set: str | None = None, candidates_replaced: int = 0,
              resamples: int = stats.RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """summary.json: the model, the settings, the paper's columns with intervals (overall and per
    task kind), the spec's aggregate, the invalid share with its reasons, and the unverifiable
    predictions (left out of every column) with theirs."""
    values = stats.per_task_values(tasks, scores, settings.lam)
    groups = split_by_kind(tasks)
    buggy = [t for t in tasks if not t.is_clean]
    clean = [t for t in tasks if t.is_clean]
    reasons: dict[str, int] = {}
    for s in samples:
        reason = invalid_reason(s.response, s.think_opened)
        if reason:
            reasons[reason] = reasons.get(reason, 0) + 1
    n = len(samples)
    spec = aggregate(tasks, scores, settings.lam)
    return {
        "model": dict(model),
        "settings": settings.to_json(),
        "task_set": task_set,
        "tasks": len(tasks),
        "samples": n,
        "buggy": stats.columns(buggy, values, clean=False, resamples=resamples, seed=seed),
        "clean": stats.columns(clean, values, clean=True, resamples=resamples, seed=seed),
        "kinds": {kind: stats.columns(group, values, clean=kind == "clean", resamples=resamples, seed=seed)
                  for kind, group in groups.items()},
        "invalid": {"count": sum(reasons.values()), "share": sum(reasons.values()) / n if n else None,
                    "reasons": dict(sorted(reasons.items()))},
        "unverifiable": {"count": spec["unverifiable"], "tasks": spec["unverifiable_tasks"],
                         "reasons": spec["unverifiable_reasons"]},
        "generation": {
            "finish_length": sum(s.finish_reason == "length" for s in samples) / n if n else None,
            "budget_hit": sum(s.budget_hit for s in samples) / n if n else None,
            "mean_completion_tokens": sum(s.completion_tokens for s in samples) / n if n else None,
        },
        "refine_candidates_replaced": candidates_replaced,
        "bootstrap": {"resamples": resamples, "level": stats.LEVEL, "seed": seed},
        "aggregate": spec,
    }


def metrics_of(summary: Mapping[str, Any]) -> dict[str, float]:
    """A summary's point values as flat metrics for logs: `pass`, `precision`, `recall`, `f1`,
    `lines`, `noop`, `damage`, `invalid_share`, `unverifiable` (a count), and `KIND/COLUMN` per
    task kind; columns a task set has no value for are left out."""
    out: dict[str, float] = {}
    for group in ("buggy", "clean"):
        for name, column in summary[group].items():
            if name != "tasks" and column["value"] is not None:
                out[name] = column["value"]
    for kind, columns in summary["kinds"].items():
        for name, column in columns.items():
            if name != "tasks" and column["value"] is not None:
                out[f"{kind}/{name}"] = column["value"]
    if summary["invalid"]["share"] is not None:
        out["invalid_share"] = summary["invalid"]["share"]
    out["unverifiable"] = float(summary["unverifiable"]["count"])
    return out


def evaluate(engine: Engine, tokenizer: Any, tasks: Sequence[Task], settings: EvalSettings, fleet: Any, *,
             model: Mapping[str, Any] | None = None, task_set: str | None = None,
             candidates: Mapping[str, Prediction] | None = None,
             out_dir: str | os.PathLike | None = None, batch_size: int = 16, concurrency: int = 1,
             retries: int = 2, backoff_s: float = 1.0, progress: bool = False, chat: bool = False,
             scorer: Callable[[Sequence[tuple[Task, Prediction]]], list[Score]] | None = None) -> EvalResult:
    """Evaluate an engine's model on `tasks` under the paper's protocol.

    Args:
        engine: where completions come from (`jaxrl.rollout.make_engine`).
        tokenizer: renders the chat prompt and encodes it (`models.tokenizer.QwenTokenizer`).
        tasks: the task set (buggy and/or clean tasks).
        settings: the protocol (prompt, samples, sampling, budgets, λ, ε).
        fleet: the verification fleet (`reward.fleet.Fleet`) the tests run on; unused with `scorer`.
        model: what is evaluated (name, engine, source), recorded in the summary.
        task_set: where the tasks came from (a file name), recorded in the summary.
        candidates: task_id -> candidate fix, for the refine prompt.
        out_dir: write predictions.jsonl (as batches finish; resumed from), scores.jsonl,
            summary.json and report.md here; None keeps everything in memory.
        batch_size: prompts per engine call.
        concurrency: engine calls in flight at once.
        retries: extra attempts of a failed engine call, with exponential backoff from `backoff_s`.
        progress: show progress bars (sampling with its ETA, then test runs).
        chat: send the messages (`engine.chat`, the openai engine's chat completions; the
            server applies its chat template and no thinking budget) instead of token ids.
        scorer: scores (task, prediction) pairs in order instead of `score_predictions` on
            `fleet` (a trainer's reward pipeline; it must apply `settings.lam`, `epsilon`
            and `timeout_s` and each prediction's `think_opened` the same way).

    Raises:
        EvalError: bad inputs, a run directory holding other settings, or an engine
            that keeps failing (the samples done are kept in out_dir).
    """
    if batch_size < 1 or concurrency < 1 or retries < 0:
        raise EvalError(f"batch_size and concurrency must be >= 1 and retries >= 0, "
                        f"got {batch_size}, {concurrency}, {retries}")
    model = dict(model or {})
    requests, replaced = build_requests(tasks, settings, tokenizer, candidates, chat)
    log = None
    if out_dir is not None:
        run = {"settings": settings.to_json(), "model": model, "chat": chat, "tasks": [t.task_id for t in tasks]}
        log = PredictionLog(out_dir, run, settings.samples)
    try:
        by_task = sample_all(engine, requests, settings, log=log, batch_size=batch_size, concurrency=concurrency,
                             retries=retries, backoff_s=backoff_s, progress=progress, chat=chat)
    finally:
        if log:
            log.close()
    samples = [s for t in tasks for s in by_task[t.task_id]]
    if log:
        log.finish(samples)
    by_id = {t.task_id: t for t in tasks}
    items = [(by_id[s.task_id], Prediction(s.task_id, response=s.response, think_opened=s.think_opened))
             for s in samples]
    if scorer is not None:
        scores = scorer(items)
    else:
        scores = score_predictions(items, lambda jobs: fleet.run(jobs, progress="scoring" if progress else False),
                                   lam=settings.lam, epsilon=settings.epsilon,
                                   limits=Limits(timeout_s=settings.timeout_s), window_batch=1)  # many predictions a round
    summary = summarize(tasks, samples, scores, settings, model, task_set=task_set, candidates_replaced=replaced)
    if out_dir is not None:
        write_outputs(Path(out_dir), scores, summary)
    return EvalResult(samples, scores, summary)


def write_outputs(out_dir: Path, scores: Sequence[Score], summary: dict[str, Any]) -> None:
    """scores.jsonl (one object per prediction, as `precisecoder score` writes), summary.json, report.md."""
    write_jsonl(out_dir / SCORES, (s.to_json() for s in scores))
    _write_json(out_dir / SUMMARY, summary)
    (out_dir / REPORT).write_text(report_markdown(summary), encoding="utf-8")
