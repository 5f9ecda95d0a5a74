"""The paper's supervised baselines in the demo (`demo --with rs_sft,dpo,recap`), from the demo's base.

Per seed, after the base is trained and evaluated (`jaxrl.demo.run`), `run_baselines`:

1. samples a pool of `pool_samples` completions per RL training task from the base
   (`jaxrl.pool.build_pool`: the demo tokenizer and prompt, T = 1, top-p 1), scored by the fleet;
2. selects each baseline's rows as the paper does (`jaxrl.selection`): the top two passing
   samples by precision (rs_sft); pairs 1st vs (n − 1)th and 2nd vs nth by unit + F1/2
   (dpo); trimmed / repaired / unchanged examples at 3:1:1 under the demo's refine prompt
   (`demo_refine`: the `demo` prompt and the candidate) (recap);
3. trains each from the base with the project's supervised trainer
   (`jaxrl.supervised.train_supervised`) on the demo tokenizer and policy;
4. evaluates each like the RL methods; the refiner answers the refine prompt with the
   base's answer under the same decoding as its candidate.

The paper's learning rates (5e-6, 5e-7) are for a pretrained 4B model; a policy trained
from scratch in minutes needs the demo's own (`BaselineConfig`, our choice), kept in the
paper's ratio (DPO's a tenth of SFT's). Epochs and β are the paper's, and so is the refiner's
mix; its prompt is the demo's: the paper's refine prompt is about 690 demo tokens of
instructions a policy trained from scratch cannot read (as for the `demo` prompt), which made
the refiner's 2,496 steps on a strong base's pool (6,655 examples) take about an hour here.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxrl.prompts import REFINE_PROMPTS

BASELINES = ("rs_sft", "dpo", "recap")


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
    """The demo's supervised baselines.

    Attributes:
        pool_samples: samples per training task in the pool (the paper's 16).
        batch_size: rows per step (DPO: pairs).
        sft_epochs, sft_lr: rejection-sampling SFT (the paper's 2 epochs).
        dpo_epochs, dpo_beta, dpo_lr: DPO (the paper's 1 epoch, β = 0.1).
        recap_epochs, recap_lr: the refiner (the paper's 6 epochs).
        recap_ratio: trimmed : repaired : unchanged examples (the paper's 3:1:1).
        recap_per_task: at most this many refiner examples per training task on average (the
            mix keeps its ratio); None (the paper's): as many as the pool allows.
        recap_prompt: the refiner's prompt (`jaxrl.prompts.REFINE_PROMPTS`).
    """

    pool_samples: int = 16
    batch_size: int = 16
    sft_epochs: int = 2
    sft_lr: float = 3e-4
    dpo_epochs: int = 1
    dpo_beta: float = 0.1
    dpo_lr: float = 3e-5
    recap_epochs: int = 6
    recap_lr: float = 3e-4
    recap_ratio: tuple[int, int, int] = (3, 1, 1)
    recap_per_task: int | None = None
    recap_prompt: str = "demo_refine"

    def __post_init__(self):
        if self.pool_samples < 3 or self.batch_size < 1:
            raise ValueError("baseline pool_samples must be >= 3 (DPO pairs 1st vs (n - 1)th) and batch_size >= 1")
        if self.recap_per_task is not None and self.recap_per_task < 1:
            raise ValueError(f"baseline recap_per_task must be >= 1 or None, got {self.recap_per_task}")
        if self.recap_prompt not in REFINE_PROMPTS:
            raise ValueError(f"baseline recap_prompt must be one of {', '.join(REFINE_PROMPTS)}, "
                             f"got {self.recap_prompt!r}")


Log = Callable[[str], None]


def select_rows(pool_dir: Path, tasks: Sequence[Any], bc: BaselineConfig, seed: int
                ) -> dict[str, list[dict[str, Any]]]:
    """Each baseline's training rows from the pool, as `precisecoder select` makes them
    (`select recap --max {recap_per_task × tasks} --prompt {recap_prompt}`)."""
    from jaxrl import selection as S

    rows = S.read_pool(pool_dir)
    by_id = {t.task_id: t for t in tasks}
    most = None if bc.recap_per_task is None else bc.recap_per_task * len(tasks)
    mixed = S.mix_recap(S.recap_candidates(rows, tasks), bc.recap_ratio, seed, most)
    return {"rs_sft": S.select_sft(rows, "precision", 2), "dpo": S.select_dpo(rows),
            "recap": [S.recap_example(c, by_id[c.task_id], prompt=bc.recap_prompt) for c in mixed]}


def train_baseline(name: str, rows: list[dict[str, Any]], run_cfg: Any, bc: BaselineConfig, seed: int,
                   out: Path) -> Path | None:
    """Train one baseline from the base on `rows` (reusing a finished run); None when too few rows."""
    from jaxrl.config import SupervisedConfig
    from jaxrl.demo.tokenizer import load_demo_tokenizer
    from jaxrl.supervised import train_supervised
    from reward.schema import write_jsonl

    objective, epochs, lr = {"rs_sft": ("sft", bc.sft_epochs, bc.sft_lr), "dpo": ("dpo", bc.dpo_epochs, bc.dpo_lr),
                             "recap": ("sft", bc.recap_epochs, bc.recap_lr)}[name]
    batch = min(bc.batch_size, len(rows))
    if batch == 0:
        return None
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "rows.jsonl", rows)
    sup = SupervisedConfig(objective, str(out / "rows.jsonl"), tasks=run_cfg.data.train, epochs=epochs,
                           batch_size=batch, beta=bc.dpo_beta, seed=seed)
    cfg = dataclasses.replace(run_cfg, name=f"seed {seed} {name}", supervised=sup,
                              optimizer=dataclasses.replace(run_cfg.optimizer, learning_rate=lr),
                              run=dataclasses.replace(run_cfg.run, out=str(out / "run")))
    total = epochs * (len(rows) // batch)
    if not (out / "run" / "checkpoints" / str(total)).is_dir():
        resumed = (out / "run" / "checkpoints").is_dir() and any((out / "run" / "checkpoints").iterdir())
        train_supervised(cfg, sup, resume=resumed, tokenizer=load_demo_tokenizer())
    return out / "run"


def base_candidates(eval_dir: Path, tasks: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """decoding -> task_id -> the base's first answer (its eval's predictions.jsonl): the refiner's candidates."""
    from jaxrl.demo.run import DECODINGS
    from reward.score_cli import load_predictions_for

    by_id = {t.task_id: t for t in tasks}
    out: dict[str, dict[str, Any]] = {}
    for decoding in DECODINGS:
        first = out.setdefault(decoding, {})
        for pred in load_predictions_for(str(eval_dir / decoding / "predictions.jsonl"), by_id):
            first.setdefault(pred.task_id, pred)
    return out


def run_baselines(cfg: Any, seed: int, splits: Any, base_dir: Path, base_eval: Path, out: Path, fleet: Any,
                  run_cfg: Any, evaluate: Callable[..., dict[str, Any]], progress: bool, log: Log
                  ) -> dict[str, dict[str, Any]]:
    """Pool, selection, training and evaluation of `cfg.baselines` for one seed.

    Args:
        base_eval: the base's evaluation directory (its answers are the refiner's candidates).
        run_cfg: the trainer `Config` of the seed's RL runs (model = the base, the demo
            prompt, the mesh); each baseline replaces its objective, rate and run directory.
        evaluate: `jaxrl.demo.run.evaluate_policy`.

    Returns:
        name -> {"evals": its evaluation per decoding, "timing": seconds per stage,
        "rows": its training rows' count}; a baseline without rows has no "evals".
    """
    import models
    from jaxrl.demo import prompt
    from jaxrl.demo.tokenizer import load_demo_tokenizer
    from jaxrl.pool import PoolSettings, build_pool
    from jaxrl.rollout import make_engine
    from jaxrl.saved_run import load_policy

    bc = cfg.baseline
    train_tasks = [s.task for s in splits.train]
    held_out = [s.task for s in splits.test + splits.clean]
    t = time.perf_counter()
    settings = PoolSettings(n=bc.pool_samples, prompt=prompt.PROMPT, max_tokens=cfg.max_tokens, thinking_budget=None,
                            seed=seed)
    with make_engine("jax", model=models.from_pretrained(base_dir), tokenizer=load_demo_tokenizer()) as engine:
        counts = build_pool(engine, load_demo_tokenizer(), train_tasks, settings, fleet, out / "pool",
                            model={"name": "demo base", "checkpoint": str(base_dir)}, batch_size=64,
                            progress=progress)
    pool_s = time.perf_counter() - t
    log(f"[seed {seed}] pool: {json.dumps(counts)} in {pool_s:.0f} s")
    selected = select_rows(out / "pool", train_tasks, bc, seed)
    results: dict[str, dict[str, Any]] = {}
    for name in cfg.baselines:
        rows = selected[name]
        t = time.perf_counter()
        run_dir = train_baseline(name, rows, run_cfg, bc, seed, out / name)
        timing = {"pool_s": pool_s, "train_s": time.perf_counter() - t}
        if run_dir is None:
            log(f"[seed {seed}] {name}: no training rows from the pool; not trained")
            results[name] = {"rows": 0, "timing": timing}
            continue
        log(f"[seed {seed}] {name}: {len(rows)} rows, trained in {timing['train_s']:.0f} s")
        t = time.perf_counter()
        policy, _, _ = load_policy(run_dir)
        if name == "recap":
            evals = evaluate(policy, cfg, seed, held_out, fleet, out.parent / "eval" / name, progress,
                             prompt_name=bc.recap_prompt, candidates=base_candidates(base_eval, held_out))
        else:
            evals = evaluate(policy, cfg, seed, held_out, fleet, out.parent / "eval" / name, progress)
        timing["eval_s"] = time.perf_counter() - t
        results[name] = {"rows": len(rows), "evals": evals, "timing": timing}
    return results


def empty_row(seed: int) -> dict[str, Any]:
    """The results row of a baseline that had nothing to train on: every column missing."""
    return {"seed": seed, "pass": None, "precision": None, "recall": None, "lines": None, "lines_pass": None,
            "noop": None, "damage": None}


def summarize(results: Mapping[str, Mapping[str, Any]], seed: int, row_of: Callable, coupling: Callable
              ) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    """(rows, couplings, timing) of the baselines in the shapes `jaxrl.demo.run.run_rl_seed` reports."""
    from jaxrl.demo.run import DECODINGS, MAIN

    rows, couplings, timing = {}, {}, {}
    for name, r in results.items():
        evals = r.get("evals")
        rows[name] = ({k: row_of(e.summary, seed, e.scores) for k, e in evals.items()} if evals
                      else {d: empty_row(seed) for d in DECODINGS})
        couplings[name] = coupling(evals[MAIN].scores) if evals else \
            {"overedit_share": None, "pass_overedit": None, "pass_tight": None}
        timing |= {f"{name}_{k}": v for k, v in r["timing"].items()}
        timing[f"{name}_rows"] = r["rows"]
    return rows, couplings, timing
