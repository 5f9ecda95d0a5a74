"""`precisecoder eval --agent`: every task as a five-turn tool loop, the final file scored as usual.

The run directory holds what a single-turn eval writes (predictions.jsonl,
scores.jsonl, summary.json, report.md) plus episodes.jsonl: one line per
episode with each turn's model text, parsed call, observation and the file
after it. A prediction is the episode's final file (`code`), so
`precisecoder score --predictions DIR/predictions.jsonl` gives the same scores.
The summary adds `agent`: the turn budget, whether `run_tests` was on, and the
agent columns (`jaxrl.agent.episode.agent_columns`).

Episodes are appended to episodes.jsonl as each batch finishes; rerunning the
same command keeps the tasks whose K episodes are all there and runs the rest.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from jaxrl import prompts
from jaxrl.agent.env import DEFAULT_TURNS
from jaxrl.agent.episode import Episode, agent_columns
from jaxrl.agent.rollout import run_episodes
from jaxrl.agent.run_tests import runner_for
from jaxrl.eval.evaluate import (PREDICTIONS, REPORT, EvalError, EvalResult, Sample, _generate, claim_run_dir,
                                 summarize, write_outputs)
from jaxrl.eval.protocol import EvalSettings
from jaxrl.rollout.engine import Engine
from reward.sandbox import Limits
from reward.schema import Prediction, Task, write_jsonl
from reward.score import Score, score_predictions

EPISODES = "episodes.jsonl"


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """The agent protocol beyond `EvalSettings` (whose budgets apply to each turn).

    Attributes:
        turns: the turn budget of an episode.
        run_tests: offer the `run_tests` tool (the paper's runs had it off).
        prompt: the agent prompt (`jaxrl.prompts.AGENT_PROMPTS`; `demo_agent` for the demo's policy).
    """

    turns: int = DEFAULT_TURNS
    run_tests: bool = False
    prompt: str = "agent"

    def __post_init__(self):
        if self.turns < 1:
            raise ValueError(f"the turn budget must be >= 1, got {self.turns}")
        if self.prompt not in prompts.AGENT_PROMPTS:
            raise ValueError(f"unknown agent prompt {self.prompt!r}; choose from {', '.join(prompts.AGENT_PROMPTS)}")


@dataclasses.dataclass(frozen=True)
class AgentEvalResult(EvalResult):
    """An agent evaluation's result: also its episodes, in the order of `samples`."""

    episodes: list[Episode]


def sample_of(episode: Episode) -> Sample:
    """The episode as a prediction record: its final file in a python block, its turns' generation counts."""
    fence = "```"
    return Sample(episode.task_id, episode.sample, f"{fence}python\n{episode.file}{fence}", False, None,
                  f"{fence}python\n{episode.file}{fence}", episode.turns[-1].finish_reason,
                  sum(t.completion_tokens for t in episode.turns), any(t.budget_hit for t in episode.turns))


def prediction_record(episode: Episode) -> dict[str, Any]:
    """A line of the agent's predictions.jsonl: the final file as `code`, with the episode's counts."""
    return {"task_id": episode.task_id, "sample": episode.sample, "code": episode.file, "ended_by": episode.ended_by,
            "turns_used": len(episode.turns), "failed_edits": episode.failed_edits,
            "no_valid_call": episode.no_valid_call}


class EpisodeLog:
    """episodes.jsonl as a resumable log (the run's settings in run.json, as `PredictionLog` keeps them)."""

    def __init__(self, out_dir: str | os.PathLike, run: dict[str, Any], samples: int):
        self.dir = Path(out_dir)
        claim_run_dir(self.dir, run)
        found: dict[str, dict[int, Episode]] = {}
        path = self.dir / EPISODES
        if path.exists():
            for line in path.read_text(encoding="utf-8").split("\n"):
                try:
                    e = Episode.from_json(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue  # a line torn by a kill: its task runs again
                found.setdefault(e.task_id, {})[e.sample] = e
        self.done = {tid: [group[k] for k in range(samples)] for tid, group in found.items()
                     if all(k in group for k in range(samples))}
        write_jsonl(path, (e.to_json() for group in self.done.values() for e in group))
        self._file = open(path, "a", encoding="utf-8")

    def append(self, episodes: Sequence[Episode]) -> None:
        """Write episodes and flush them to disk before returning."""
        self._file.write("".join(json.dumps(e.to_json(), ensure_ascii=False) + "\n" for e in episodes))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def evaluate_agent(engine: Engine, tokenizer: Any, tasks: Sequence[Task], settings: EvalSettings, fleet: Any,
                   agent: AgentSettings = AgentSettings(), *, model: Mapping[str, Any] | None = None,
                   task_set: str | None = None, out_dir: str | os.PathLike | None = None, batch_size: int = 16,
                   retries: int = 2, backoff_s: float = 1.0, progress: bool = False,
                   chat: bool = False, max_context: int | None = None,
                   scorer: Callable[[Sequence[tuple[Task, Prediction]]], list[Score]] | None = None
                   ) -> AgentEvalResult:
    """Evaluate an engine's model as the five-turn agent on `tasks`; see `jaxrl.eval.evaluate.evaluate`
    for the shared arguments (`scorer` among them). `batch_size` episodes run together, one engine
    call per turn; `max_context` ends a token episode before a turn that might not fit it (as in
    training, `jaxrl.agent.rollout.run_episodes`).

    Raises:
        EvalError: a run directory holding other settings, or an engine that keeps failing
            (the episodes done are kept in out_dir).
    """
    model = dict(model or {})
    log = None
    if out_dir is not None:
        run = {"settings": settings.to_json(), "agent": dataclasses.asdict(agent), "model": model, "chat": chat,
               "tasks": [t.task_id for t in tasks]}
        log = EpisodeLog(out_dir, run, settings.samples)
    done: dict[str, list[Episode]] = dict(log.done) if log else {}
    limits = Limits(timeout_s=settings.timeout_s)
    runner = (lambda task: runner_for(task, fleet.run, limits)) if agent.run_tests else None
    bar = tqdm(total=len(tasks), initial=len(done), desc="episodes", unit="task", disable=not progress)
    try:
        for clean in (False, True):
            todo = [t for t in tasks if t.is_clean == clean and t.task_id not in done]
            for i in range(0, len(todo), batch_size):
                chunk = todo[i:i + batch_size]
                try:
                    rollouts = run_episodes(
                        lambda reqs, params: _generate(engine, reqs, params, retries, backoff_s, chat), tokenizer,
                        [(t, k) for t in chunk for k in range(settings.samples)], settings.params(clean),
                        turns=agent.turns, enable_thinking=settings.enable_thinking, chat=chat, test_runner=runner,
                        max_context=max_context, prompt=agent.prompt)
                except Exception as e:
                    kept = f"; the {len(done)} tasks done are kept in {log.dir / EPISODES}, " \
                           "rerun the same command to continue" if log else ""
                    raise EvalError(f"sampling failed after {retries + 1} attempts: "
                                    f"{type(e).__name__}: {e}{kept}") from e
                episodes = [r.episode for r in rollouts]
                if log:
                    log.append(episodes)
                for t in chunk:
                    done[t.task_id] = [e for e in episodes if e.task_id == t.task_id]
                bar.update(len(chunk))
    finally:
        bar.close()
        if log:
            log.close()
    episodes = [e for t in tasks for e in done[t.task_id]]
    by_id = {t.task_id: t for t in tasks}
    items = [(by_id[e.task_id], Prediction(e.task_id, code=e.file)) for e in episodes]
    if scorer is not None:
        scores = scorer(items)
    else:
        scores = score_predictions(items, lambda jobs: fleet.run(jobs, progress="scoring" if progress else False),
                                   lam=settings.lam, epsilon=settings.epsilon, limits=limits,
                                   window_batch=1)  # many predictions a round
    summary = summarize(tasks, [sample_of(e) for e in episodes], scores, settings, model, task_set=task_set)
    summary["settings"]["prompt"] = "agent"
    summary["agent"] = {**dataclasses.asdict(agent), **agent_columns(episodes)}
    if out_dir is not None:
        out = Path(out_dir)
        write_jsonl(out / EPISODES, (e.to_json() for e in episodes))
        write_jsonl(out / PREDICTIONS, (prediction_record(e) for e in episodes))
        write_outputs(out, scores, summary)
        with open(out / REPORT, "a", encoding="utf-8") as f:
            f.write(agent_markdown(summary["agent"]))
    return AgentEvalResult([sample_of(e) for e in episodes], scores, summary, episodes)


def agent_markdown(agent: Mapping[str, Any]) -> str:
    """The report's agent section: the turn budget and the agent columns."""
    def pct(x):
        return "–" if x is None else f"{100 * x:.1f}"

    def num(x):
        return "–" if x is None else f"{x:.2f}"

    return "\n".join([
        "", "## Agent", "",
        f"{agent['turns']}-turn tool loop (view / str_replace_editor / submit"
        f"{' / run_tests' if agent['run_tests'] else ''}), {agent['episodes']} episodes.", "",
        "| turns used | ended by submit % | failed edits / episode | no valid call % |",
        "|---|---|---|---|",
        f"| {num(agent['turns_used'])} | {pct(agent['submitted'])} | {num(agent['failed_edits'])} "
        f"| {pct(agent['no_valid_call'])} |", ""])
