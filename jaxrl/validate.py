"""Validation during training: the val split (pass, precision, recall, lines) and GT Debug (no-op, damage).

One function, `validate`, samples with the engine the trainer holds (its
weights are the current policy's), scores on the trainer's reward pipeline and
aggregates with `reward.score.aggregate`, the same summary `precisecoder score`
prints. On several hosts each host takes an equal slice of the tasks (the last
slice padded with repeats, which are dropped) and the scores are gathered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax

from jaxrl import hosts
from jaxrl.config import ValidationConfig
from jaxrl.rewards import RewardPipeline, prediction_of, thinking_response
from jaxrl.rollout import Engine, SamplingParams
from jaxrl.tasks import render
from models.tokenizer import FAMILIES
from reward.schema import Task
from reward.score import Score, aggregate


def _host_slice(tasks: Sequence[Task]) -> tuple[list[Task], int]:
    """This host's tasks (padded to an equal count) and how many of them are real."""
    per_host = -(-len(tasks) // jax.process_count())
    lo = jax.process_index() * per_host
    mine = list(tasks[lo:lo + per_host])
    real = len(mine)
    return mine + [tasks[0]] * (per_host - real), real


def sample_and_score(engine: Engine, tokenizer: Any, rewards: RewardPipeline, tasks: Sequence[Task],
                     params: SamplingParams, prompt: str) -> list[Score]:
    """Every host's scores of `params.n` completions per task, gathered in task order."""
    mine, real = _host_slice(tasks)
    opened = FAMILIES[tokenizer.family].opens_thinking
    groups = engine.generate([render(t, tokenizer, prompt).prompt_ids for t in mine], params)
    pairs = [(t, prediction_of(t, thinking_response(c.text, opened))) for t, g in zip(mine[:real], groups) for c in g]
    scores = rewards.score(pairs)
    gathered = hosts.gather_json([s.to_json() for s in scores])
    return [Score(**{**d, "components": ()}) for host_scores in gathered for d in host_scores]


def _pct(x: float | None) -> float:
    return math.nan if x is None else float(x)


def validate(engine: Engine, tokenizer: Any, rewards: RewardPipeline, val: Sequence[Task],
             gt_debug: Sequence[Task], cfg: ValidationConfig, prompt: str, lam: float, seed: int) -> dict[str, float]:
    """`val/{pass,precision,recall,f1,lines}` and `gt_debug/{noop,damage}` of the current policy."""
    out: dict[str, float] = {}
    if val:
        params = SamplingParams(n=cfg.samples, temperature=cfg.temperature, top_p=cfg.top_p,
                                max_tokens=cfg.max_tokens, thinking_budget=cfg.thinking_budget, seed=seed)
        b = aggregate(val, sample_and_score(engine, tokenizer, rewards, val, params, prompt), lam)["buggy"]
        out |= {"val/pass": _pct(b["pass"]), "val/precision": _pct(b["precision"]), "val/recall": _pct(b["recall"]),
                "val/f1": _pct(b["f1"]), "val/lines": _pct(b["lines"])}
    if gt_debug:
        params = SamplingParams(n=cfg.samples, temperature=cfg.temperature, top_p=cfg.top_p,
                                max_tokens=cfg.gt_debug_max_tokens, thinking_budget=cfg.gt_debug_thinking_budget,
                                seed=seed + 1)
        c = aggregate(gt_debug, sample_and_score(engine, tokenizer, rewards, gt_debug, params, prompt), lam)["clean"]
        out |= {"gt_debug/noop": _pct(c["noop"]), "gt_debug/damage": _pct(c["damage"])}
    return out
