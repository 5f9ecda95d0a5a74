"""The demo pipeline: one SFT base → N RL seeds of each method from it → evaluation → report.

The paper's protocol (docs/demo.md, "Protocol"): `prepare_base` makes the domain's
task sets, trains the base policy by SFT, keeps the candidate of lowest loss on an
SFT validation split and saves it as an HF checkpoint; then `run_rl_seed`, for each
RL seed, runs every method with the project's trainer (`jaxrl.trainer.train`: the
`jax` engine, the reward pipeline, the algorithm's advantages, the jitted train
step, Orbax checkpoints) from that same base with the same seed and number of
steps. Each policy is evaluated with `jaxrl.eval.evaluate` on the held-out buggy
and clean sets under `DECODINGS` (the main table at the paper's T = 0.6). Every
run and evaluation shares ONE sandbox fleet, whose verdict cache is seeded with
what the domain knows (each solution passes, each buggy program fails), and the
JAX persistent compilation cache under `out/jax_cache`. `--bases K` repeats all of
it on K − 1 further bases, for a robustness table. `run_demo` writes the report
(`jaxrl.demo.report`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jaxrl.demo import domain, prompt
from jaxrl.demo import thinking as demo_thinking
from jaxrl.demo import report as rep
from jaxrl.demo.baselines import BASELINES, BaselineConfig
from jaxrl.demo.sft import SFTConfig

METHODS = ("grpo", "precisecoder")
OPTIONAL_METHODS = ("grpo_f1sum", "ea_grpo")
# name: temperature. The main table is the paper's evaluation temperature (App. B.6: "one sample per
# task at temperature 0.6"); T = 1 and greedy are reported beside it.
DECODINGS = {"t0.6": 0.6, "t1": 1.0, "greedy": 0.0}
MAIN = "t0.6"
LABELS = {"t0.6": "T = 0.6 sampling", "t1": "T = 1 sampling", "greedy": "Greedy decoding"}
CURVE_KEYS = (("rollout/pass", "pass rate (training rollouts)"),
              ("rollout/edited_lines", "edited lines (valid rollouts)"),
              ("rollout/precision", "precision"), ("rollout/noop", "no-op rate"))


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Everything one demo run depends on.

    Attributes:
        seeds: RL seeds 0 .. seeds − 1 of every method, all from the same SFT base.
        bases: SFT bases 0 .. bases − 1 (each its own tasks and SFT seed); base 0 is the main
            table, the others a robustness table.
        methods: RL algorithms (names of `jaxrl.algorithms.algorithm_names()`), each from the same base.
        baselines: supervised baselines from the same base (`jaxrl.demo.baselines.BASELINES`), off by default.
        baseline: their settings.
        domain: the generator's sizes and probabilities.
        sft_tasks, train_tasks, test_tasks, clean_tasks, sft_val_tasks: task counts of the five
            disjoint sets (the SFT validation pairs choose the base; `SFTConfig.select_every`).
        hidden, layers, heads: the policy's shape (`jaxrl.demo.policy`).
        sft: the SFT run.
        rl_steps: RL steps per method.
        tasks_per_step, group_size: N tasks × G rollouts per RL step (the paper's G = 6, 96 rollouts).
        learning_rate: RL learning rate (constant, AdamW).
        kl_coef: weight of the KL term to the base policy (0 turns it off).
        max_tokens: completion budget; an answer takes about 60 tokens (73 at most).
        thinking: the thinking variant (`jaxrl.demo.thinking`): SFT targets think first, and
            rollouts and evaluations get a thinking budget on top of `max_tokens`.
        agent: the agent variant (`jaxrl.demo.agent`): SFT also on agent transcripts, PreciseCoder
            also trained with `rollout.agent`, and every policy evaluated inside the tool loop.
    """

    seeds: int = 1
    bases: int = 1
    methods: tuple[str, ...] = METHODS
    baselines: tuple[str, ...] = ()
    baseline: BaselineConfig = BaselineConfig()
    domain: domain.DomainConfig = domain.DomainConfig()
    sft_tasks: int = 4000
    train_tasks: int = 1000
    test_tasks: int = 200
    clean_tasks: int = 100
    sft_val_tasks: int = 200
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    sft: SFTConfig = SFTConfig()
    rl_steps: int = 90
    tasks_per_step: int = 16
    group_size: int = 6
    learning_rate: float = 3e-4
    kl_coef: float = 0.0
    max_tokens: int = 80
    thinking: bool = False
    agent: bool = False

    def __post_init__(self):
        known = METHODS + OPTIONAL_METHODS
        bad = [m for m in self.methods if m not in known]
        if bad or not self.methods:
            raise ValueError(f"methods must be among {', '.join(known)}, got {list(self.methods)}")
        if any(b not in BASELINES for b in self.baselines):
            raise ValueError(f"baselines must be among {', '.join(BASELINES)}, got {list(self.baselines)}")
        if self.thinking and self.baselines:
            raise ValueError("--thinking and the supervised baselines (--with rs_sft,dpo,recap) do not run together yet")
        if self.agent and self.thinking:
            raise ValueError("--agent and --thinking do not run together: the thinking variant's traces reason about "
                             "a single-turn answer, and the agent transcripts have no traces to learn per turn")
        if self.agent and self.baselines:
            raise ValueError("--agent and the supervised baselines (--with rs_sft,dpo,recap) do not run together: "
                             "the baselines use the plain demo vocabulary, the agent base another")
        if self.seeds < 1 or self.bases < 1 or self.rl_steps < 1:
            raise ValueError("seeds, bases and rl_steps must be >= 1")
        if min(self.sft_tasks, self.train_tasks, self.test_tasks, self.clean_tasks, self.sft_val_tasks) < 1:
            raise ValueError("every task set needs at least one task")
        if self.group_size < 2 or self.tasks_per_step < 1:
            raise ValueError("group_size must be >= 2 and tasks_per_step >= 1")


Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def tokenizer_of(cfg: DemoConfig) -> Any:
    """The run's tokenizer: the plain demo vocabulary, the thinking variant's or the agent variant's."""
    if cfg.agent:
        from jaxrl.demo.agent import agent_tokenizer

        return agent_tokenizer()
    return demo_thinking.tokenizer(cfg.thinking)


def make_data(cfg: DemoConfig, seed: int, out: Path) -> domain.Splits:
    """The base's task sets, those RL and evaluation read written as task JSONL under `out` (train, test, clean)."""
    from reward.schema import write_tasks

    splits = domain.make_splits(seed, cfg.sft_tasks, cfg.train_tasks, cfg.test_tasks, cfg.clean_tasks, cfg.domain,
                                cfg.sft_val_tasks)
    out.mkdir(parents=True, exist_ok=True)
    for name, samples in (("train", splits.train), ("test", splits.test), ("clean", splits.clean)):
        write_tasks(out / f"{name}.jsonl", domain.iter_tasks(samples))
    return splits


def train_base(cfg: DemoConfig, seed: int, splits: domain.Splits, out: Path, progress: bool) -> dict[str, Any]:
    """SFT from a random initialisation; the base is saved as an HF checkpoint in `out`.

    The saved base is the candidate of lowest loss on the SFT validation pairs
    (`jaxrl.demo.sft.train_sft_best`), a criterion fixed before any run.

    Returns:
        the SFT record: losses, seconds, the share of targets that over-edit, the selection.
    """
    import models
    from jaxrl.demo import sft
    from jaxrl.demo.policy import new_policy, policy_config
    from tqdm import tqdm

    tok = tokenizer_of(cfg)
    pairs, shares = sft.sft_pairs(splits.sft, cfg.sft.rewrite_share, seed, cfg.sft.miss_share, cfg.thinking)
    tokens, mask = sft.encode_pairs(tok, pairs)
    val_tokens, val_mask = sft.encode_pairs(tok, sft.sft_pairs(splits.sft_val, cfg.sft.rewrite_share, seed + 1,
                                                                cfg.sft.miss_share, cfg.thinking)[0])
    agent_record = {}
    if cfg.agent:  # every SFT (and validation) task also as an agent transcript of its own target
        from jaxrl.demo import agent

        def transcripts(samples, s):
            segments, kinds = agent.sft_transcripts(samples, cfg.sft.rewrite_share, s, cfg.sft.miss_share, tok)
            return agent.encode_transcripts(segments, tok.pad_id), kinds

        rows, kinds = transcripts(splits.sft, seed)
        tokens, mask = agent.stack_rows((tokens, mask), rows, tok.pad_id)
        val_tokens, val_mask = agent.stack_rows((val_tokens, val_mask), transcripts(splits.sft_val, seed + 1)[0],
                                                tok.pad_id)
        agent_record = {"agent_target_shares": kinds, "agent_transcripts": len(rows[0])}
    model = new_policy(policy_config(tok, cfg.hidden, cfg.layers, cfg.heads), seed)
    bar = tqdm(total=cfg.sft.steps, desc=f"seed {seed} SFT", unit="step", disable=not progress, dynamic_ncols=True)

    def on_step(i: int, loss: float) -> None:
        bar.update(1)
        if i % 10 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")

    start = time.perf_counter()
    losses, selection = sft.train_sft_best(model, tokens, mask, val_tokens, val_mask, cfg.sft, seed, on_step)
    seconds = time.perf_counter() - start
    bar.close()
    models.save_pretrained(model, out)
    tok.save_pretrained(out)
    record = {"losses": losses, "seconds": seconds, "target_shares": shares, "pairs": len(pairs),
              "selection": selection, **agent_record}
    (out / "sft.json").write_text(json.dumps(record) + "\n")
    return record


def rl_config(cfg: DemoConfig, seed: int, method: str, base: Path, data: Path, out: Path, progress: bool,
              agent: bool = False):
    """The trainer's `Config` of one method's run (the demo prompt, no thinking, no validation); with
    `agent`, its rollouts are episodes of the tool loop (`jaxrl.demo.agent.rollout_agent`)."""
    from jaxrl.config import Config, from_dict

    rollout = {"engine": "jax", "group_size": cfg.group_size, "temperature": 1.0, "top_p": 1.0,
               **demo_thinking.budgets(cfg.max_tokens, cfg.thinking)}
    if agent:
        from jaxrl.demo import agent as demo_agent

        rollout |= {"max_tokens": demo_agent.TURN_TOKENS, "agent": demo_agent.rollout_agent()}
    return from_dict(Config, {
        "name": f"seed {seed} {method}",
        "model": {"family": "qwen3", "checkpoint": str(base), "dtype": "float32", "param_dtype": "float32",
                  "remat": False},
        "data": {"train": str(data / "train.jsonl"), "tasks_per_step": cfg.tasks_per_step, "prompt": prompt.PROMPT,
                 "seed": seed, "prompt_multiple": 8},
        "rollout": rollout,
        "algorithm": {"name": method},
        "loss": {"kl_coef": cfg.kl_coef, "logp_chunk": 256},
        "optimizer": {"learning_rate": cfg.learning_rate, "weight_decay": 0.0},
        "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
        "validation": {"val_tasks": 0, "gt_debug_tasks": 0},
        "run": {"steps": cfg.rl_steps, "eval_every": 0, "save_every": 0, "keep_last": 1, "best_metric": None,
                "out": str(out), "seed": seed, "progress": progress, "tensorboard": False},
    })


def fleet_workers() -> int:
    """The demo's sandbox workers: twice the cores, at most 4. A fleet run waits on hand-offs between
    processes, so as many workers as cores leave part of each core idle (docs/sandbox.md, "Throughput");
    more than 4 would only take cores from the trainer on a larger machine."""
    return min(4, 2 * (os.cpu_count() or 1))


def evaluate_policy(model: Any, cfg: DemoConfig, seed: int, tasks: Sequence[Any], fleet: Any, out: Path,
                    progress: bool, samples: int = 1,
                    decodings: dict[str, float] = DECODINGS, prompt_name: str = prompt.PROMPT,
                    candidates: dict[str, Any] | None = None) -> dict[str, Any]:
    """`jaxrl.eval.evaluate` of one policy on held-out tasks: each decoding's (name: temperature) result.

    `candidates` (decoding -> task_id -> prediction) are the fixes a `refine` prompt shows.
    """
    from jaxrl.eval.evaluate import evaluate
    from jaxrl.eval.protocol import EvalSettings
    from jaxrl.rollout import make_engine

    tok = tokenizer_of(cfg)
    budgets = demo_thinking.budgets(cfg.max_tokens, cfg.thinking)
    results = {}
    with make_engine("jax", model=model, tokenizer=tok) as engine:
        for name, temperature in decodings.items():
            settings = EvalSettings(prompt=prompt_name, samples=samples if temperature else 1,
                                    temperature=temperature, clean_thinking_budget=budgets["thinking_budget"],
                                    enable_thinking=cfg.thinking, seed=seed, **budgets)
            result = evaluate(engine, tok, tasks, settings, fleet, model={"name": out.name},
                              task_set="demo held-out", out_dir=out / name, batch_size=len(tasks),
                              progress=progress, candidates=candidates and candidates[name])
            results[name] = result
    return results


def known_verdicts(tasks: Sequence[Any], limits: Any, passed: Any, failed: Any) -> list[tuple[Any, Any]]:
    """(job, verdict) of what the domain guarantees: each task's solution passes, each buggy program fails.

    The jobs are the scorer's (`reward.score.canonical_job` under the task's limits), so a
    rollout whose program is exactly one of them is answered from the fleet's cache.
    `passed` and `failed` are the verdicts to store (real runs of one task, whose
    duration stands in for all: the scorer sizes its window timeouts by it).
    tests/test_demo_domain.py checks the guarantee on the fleet.
    """
    from reward.score import canonical_job, limits_for

    out = []
    for task in tasks:
        out.append((canonical_job(task.solution, task.tests, limits_for(task, limits)), passed))
        if task.buggy_code != task.solution:
            out.append((canonical_job(task.buggy_code, task.tests, limits_for(task, limits)), failed))
    return out


def seed_fleet(fleet: Any, tasks: Sequence[Any], timeout_s: float) -> int:
    """Seed the fleet's verdict cache with `known_verdicts` of `tasks`; returns how many were added.

    One buggy task's solution and buggy program are run for real first; their verdicts
    (with the program's own output cleared) are stored for every task.
    """
    from reward.sandbox import Limits
    from reward.score import canonical_job, limits_for

    limits = Limits(timeout_s=timeout_s)
    probe = next((t for t in tasks if t.buggy_code != t.solution), None)
    if probe is None:
        return 0
    lim = limits_for(probe, limits)
    passed, failed = fleet.run([canonical_job(probe.solution, probe.tests, lim),
                                canonical_job(probe.buggy_code, probe.tests, lim)])
    if not passed.passed or failed.passed or failed.status != "fail":
        raise RuntimeError(f"demo task {probe.task_id}: its solution must pass and its buggy code fail "
                           f"(got {passed.status}, {failed.status})")
    clear = {"stdout": "", "stderr": "", "cached": False}
    return fleet.seed(known_verdicts(tasks, limits, dataclasses.replace(passed, **clear),
                                     dataclasses.replace(failed, **clear)))


def home_of(out: Path, base: int) -> Path:
    """The directory of base `base`: `out` itself for base 0 (the main table), `out/base{b}` otherwise."""
    return out if base == 0 else out / f"base{base}"


def prepare_base(cfg: DemoConfig, base: int, home: Path, fleet: Any, progress: bool = True,
                 log: Log = _stderr) -> dict[str, Any]:
    """Base `base`: its task sets (seed `base`), the selected SFT base, its seeded verdicts and its evaluation.

    A saved base and finished evaluations in `home` are reused.

    Returns:
        `{"splits", "held_out", "sft", "rows": {decoding: row}, "coupling", "timing", "seeded"}`.
    """
    import models

    timing: dict[str, float] = {}
    start = time.perf_counter()
    data = home / "data"
    splits = make_data(cfg, base, data)
    held_out = [s.task for s in splits.test + splits.clean]
    timing["data_s"] = time.perf_counter() - start
    t = time.perf_counter()
    from jaxrl.config import RewardConfig

    seeded = seed_fleet(fleet, [s.task for s in splits.train] + held_out, RewardConfig().timeout_s)
    timing["seed_fleet_s"] = time.perf_counter() - t

    base_dir = home / "base"
    if (base_dir / "sft.json").is_file():
        sft_record = json.loads((base_dir / "sft.json").read_text())
        log(f"[base {base}] SFT base: reusing {base_dir}")
    else:
        log(f"[base {base}] SFT base: {len(splits.sft)} pairs, {cfg.sft.rewrite_share:.0%} rewrite targets, "
            f"{cfg.sft.miss_share:.0%} of the others missing the bug; the candidate of lowest loss on "
            f"{len(splits.sft_val)} validation pairs is kept")
        sft_record = train_base(cfg, base, splits, base_dir, progress)
    timing["sft_s"] = sft_record["seconds"]
    chosen = sft_record["selection"]
    log(f"[base {base}] SFT loss {sft_record['losses'][0]:.3f} -> {sft_record['losses'][-1]:.3f} "
        f"in {sft_record['seconds']:.0f} s; kept step {chosen['step']} (validation loss {chosen['val_loss']:.4f})")

    t = time.perf_counter()
    evals = evaluate_policy(models.from_pretrained(base_dir), cfg, 0, held_out, fleet, home / "eval" / "base",
                            progress, demo_thinking.EVAL_SAMPLES if cfg.thinking else 1)
    rows = {k: rep.row_of(r.summary, 0, r.scores) for k, r in evals.items()}
    timing["eval_base_s"] = time.perf_counter() - t
    log(f"[base {base}] base: {_brief(rows)}")
    agent_row = None
    if cfg.agent:
        t = time.perf_counter()
        agent_row = _in_agent(models.from_pretrained(base_dir), 0, held_out, fleet, home / "eval" / "base", progress)
        timing["eval_base_agent_s"] = time.perf_counter() - t
        log(f"[base {base}] base inside the agent: {_brief_agent(agent_row)}")
    return {"splits": splits, "held_out": held_out, "sft": {k: v for k, v in sft_record.items() if k != "losses"},
            "rows": rows, "coupling": rep.coupling(evals[MAIN].scores), "timing": timing, "seeded": seeded,
            "agent_row": agent_row}


def _in_agent(model: Any, seed: int, tasks: Sequence[Any], fleet: Any, eval_dir: Path, progress: bool
              ) -> dict[str, Any]:
    """A policy's row inside the agent (`jaxrl.demo.agent`) at the main decoding, in `eval_dir/agent`."""
    from jaxrl.demo import agent

    result = agent.evaluate_in_agent(model, seed, tasks, fleet, eval_dir / "agent", progress, DECODINGS[MAIN])
    return agent.agent_row(result, seed)


def _brief_agent(row: dict[str, Any]) -> str:
    def f(x, spec):
        return "–" if x is None else format(x, spec)

    return (f"pass {f(row['pass'], '.1f')}%, precision {f(row['precision'], '.1f')}%, lines {f(row['lines'], '.2f')}, "
            f"turns {f(row['turns_used'], '.2f')}, submitted {f(row['submitted'], '.1f')}%, "
            f"no valid call {f(row['no_valid_call'], '.1f')}% ({LABELS[MAIN]})")


def run_rl_seed(cfg: DemoConfig, base: int, seed: int, home: Path, splits: Any, fleet: Any,
                progress: bool = True, log: Log = _stderr) -> dict[str, Any]:
    """RL seed `seed` of every method (and `cfg.baselines`) from base `base` (in `home`, with its task
    sets `splits`), each run then evaluated.

    Finished RL runs are reused, an unfinished one resumes from its last checkpoint,
    evaluations resume from their predictions.

    Returns:
        `{"rows": {method: {decoding: row}}, "curves": {method: [...]}, "timing": {...},
        "coupling": {method: rep.coupling(...)}, "agent_rows": {policy: row inside the agent}}`
        (`agent_rows` empty unless `cfg.agent`; it also holds PreciseCoder trained with `rollout.agent`).
    """
    from jaxrl.metrics import read_metrics
    from jaxrl.preflight import has_checkpoint
    from jaxrl.saved_run import load_policy
    from jaxrl.trainer import train

    out = home / f"seed{seed}"
    held_out = [s.task for s in splits.test + splits.clean]
    samples = demo_thinking.EVAL_SAMPLES if cfg.thinking else 1
    rows: dict[str, dict[str, Any]] = {}
    curves: dict[str, list[dict[str, float]]] = {}
    couplings: dict[str, Any] = {}
    timing: dict[str, float] = {}
    agent_rows: dict[str, dict[str, Any]] = {}
    from jaxrl.demo.agent import AGENT_METHOD

    runs = [(m, m, False) for m in cfg.methods] + ([(AGENT_METHOD, "precisecoder", True)] if cfg.agent else [])
    for name, method, agentic in runs:
        t = time.perf_counter()
        run_dir = out / "rl" / name
        run_cfg = rl_config(cfg, seed, method, home / "base", home / "data", run_dir, progress, agentic)
        if _finished(run_dir, cfg.rl_steps):
            log(f"[base {base} seed {seed}] RL {name}: reusing the finished run in {run_dir}")
        else:
            log(f"[base {base} seed {seed}] RL {name}: {cfg.rl_steps} steps × {cfg.tasks_per_step} tasks × "
                f"G = {cfg.group_size}{' episodes' if agentic else ''}")
            train(run_cfg, resume=has_checkpoint(run_dir), tokenizer=tokenizer_of(cfg), fleet=fleet)
        timing[f"rl_{name}_s"] = time.perf_counter() - t
        curves[name] = [{"seed": seed, **r} for r in read_metrics(run_dir / "metrics.jsonl")]
        t = time.perf_counter()
        policy, _, step = load_policy(run_dir)  # on the trainer's mesh: fsdp over every device
        if not agentic:
            evals = evaluate_policy(policy, cfg, seed, held_out, fleet, out / "eval" / name, progress, samples)
            rows[name] = {k: rep.row_of(r.summary, seed, r.scores) for k, r in evals.items()}
            couplings[name] = rep.coupling(evals[MAIN].scores)
            log(f"[base {base} seed {seed}] {name} (step {step}): {_brief(rows[name])}")
        if cfg.agent:
            agent_rows[name] = _in_agent(policy, seed, held_out, fleet, out / "eval" / name, progress)
            log(f"[base {base} seed {seed}] {name} (step {step}) inside the agent: {_brief_agent(agent_rows[name])}")
        timing[f"eval_{name}_s"] = time.perf_counter() - t
    if cfg.baselines:
        from jaxrl.demo import baselines

        done = baselines.run_baselines(cfg, seed, splits, home / "base", home / "eval" / "base", out / "baselines",
                                       fleet, rl_config(cfg, seed, "grpo", home / "base", home / "data", out, progress),
                                       evaluate_policy, progress, log)
        more = baselines.summarize(done, seed, rep.row_of, rep.coupling)
        rows, couplings, timing = rows | more[0], couplings | more[1], timing | more[2]
        for name in cfg.baselines:
            log(f"[base {base} seed {seed}] {name}: {_brief(rows[name])}")
    return {"rows": rows, "curves": curves, "timing": timing, "coupling": couplings, "agent_rows": agent_rows}


def _finished(run_dir: Path, steps: int) -> bool:
    """Whether the trainer's run in `run_dir` has its checkpoint of step `steps`."""
    ckpts = run_dir / "checkpoints"
    return ckpts.is_dir() and any(p.name == str(steps) for p in ckpts.iterdir())


def _brief(row: dict[str, dict[str, Any]]) -> str:
    r = row[MAIN]

    def f(x, spec):
        return "–" if x is None else format(x, spec)

    return (f"pass {f(r['pass'], '.1f')}%, precision {f(r['precision'], '.1f')}%, lines {f(r['lines'], '.2f')}, "
            f"no-op {f(r['noop'], '.1f')}% ({LABELS[MAIN]})")


# Settings that may change when a run is resumed: more seeds or methods only add work.
RESUMABLE = ("seeds", "bases", "methods", "baselines")


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resume(cfg: DemoConfig, out: Path) -> None:
    """Raise ValueError if `out` holds work made with other settings (`RESUMABLE` ones aside).

    The settings of a run are in `out/demo_config.json`, written when it starts; a setting it
    lacks (one added to `DemoConfig` since) counts as its default, except the refiner's prompt:
    a run with `recap` saved before it existed trained its refiner under the paper's `refine`.
    """
    path = out / "demo_config.json"
    if not path.is_file():
        return
    defaults = _flat(_plain(DemoConfig()))
    stored = json.loads(path.read_text())
    saved, now = {**defaults, **_flat(stored)}, _flat(_plain(cfg))
    if "recap" in stored.get("baselines", ()) and "recap_prompt" not in stored.get("baseline", {}):
        saved["baseline.recap_prompt"] = "refine"
    changed = sorted(k for k in saved.keys() | now.keys()
                     if k.split(".")[0] not in RESUMABLE and saved.get(k) != now.get(k))
    if changed:
        raise ValueError(f"{out} holds a run made with other settings ("
                         + ", ".join(f"{k}: {saved.get(k)} there, {now.get(k)} now" for k in changed)
                         + "); resume with the same options or choose another --out")


def use_compilation_cache(path: Path) -> None:
    """JAX's persistent compilation cache in `path`: every RL run, seed and evaluation of the demo
    (and a resumed run) compiles the same train step, prefill and decode shapes once."""
    import jax

    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def run_demo(cfg: DemoConfig, out: str | Path, progress: bool = True, log: Log = _stderr,
             command: str = "precisecoder demo") -> dict[str, Any]:
    """Every base and RL seed, then results.json, report.md and curves.png in `out`; returns the results object.

    Raises ValueError (before any work) if `out` holds a run made with other settings.
    """
    import jax

    from reward.fleet import Fleet

    out = Path(out)
    check_resume(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(_plain(cfg), indent=1) + "\n")
    use_compilation_cache(out / "jax_cache")
    load = os.getloadavg()
    devices = jax.devices()
    split = "; batches are split over them" if len(devices) > 1 else ""
    log(f"JAX: {len(devices)} {devices[0].platform} device(s){split}")
    bases, start = [], time.perf_counter()
    with Fleet(workers=fleet_workers()) as fleet:  # one fleet, one verdict cache, for everything
        for b in range(cfg.bases):
            home = home_of(out, b)
            prepared = prepare_base(cfg, b, home, fleet, progress, log)
            seeds = [run_rl_seed(cfg, b, s, home, prepared["splits"], fleet, progress, log)
                     for s in range(cfg.seeds)]
            bases.append((prepared, seeds))
        fleet_stats = dataclasses.asdict(fleet.stats)
    seconds = time.perf_counter() - start
    end_load = os.getloadavg()

    def table(prepared: dict[str, Any], seeds: list[dict[str, Any]], decoding: str) -> dict[str, list]:
        return {"base": [prepared["rows"][decoding]],
                **{m: [s["rows"][m][decoding] for s in seeds] for m in (*cfg.methods, *cfg.baselines)}}

    prepared, per_seed = bases[0]
    tables = {d: table(prepared, per_seed, d) for d in DECODINGS}
    couplings = {"base": [prepared["coupling"]], **{m: [s["coupling"][m] for s in per_seed] for m in (*cfg.methods, *cfg.baselines)}}
    methods = tables[MAIN]
    paired = rep.paired_differences(methods["precisecoder"], methods["grpo"]) \
        if "grpo" in methods and "precisecoder" in methods else {}
    further = [table(p, s, MAIN) for p, s in bases[1:]]
    extra = {"main_decoding": {"name": MAIN, "temperature": DECODINGS[MAIN]},
             **{d: t for d, t in tables.items() if d != MAIN}, "paired_differences": paired,
             "coupling": couplings, "sft": prepared["sft"], "bases": further,
             "timing": {"base": prepared["timing"], "seeds": [s["timing"] for s in per_seed],
                        "further_bases": [[p["timing"], *[s["timing"] for s in ss]] for p, ss in bases[1:]]},
             "fleet": fleet_stats, "seconds": seconds, "cpu_seconds": _cpu_seconds(),
             "load_average_at_start": load, "load_average_at_end": end_load, "jax_devices": len(devices),
             "config": _plain(cfg), "command": command}
    if cfg.agent:
        from jaxrl.demo import agent

        extra["agent"] = {**agent.rollout_agent(), "turn_tokens": agent.TURN_TOKENS, "decoding": MAIN,
                          "methods": {"base": [prepared["agent_row"]],
                                      **{m: [s["agent_rows"][m] for s in per_seed] for m in per_seed[0]["agent_rows"]}}}
    rep.write_results(out / "results.json", methods, extra)
    curves = {m: [r for s in per_seed for r in s["curves"].get(m, [])] for m in per_seed[0]["curves"]}
    rep.plot_curves(out / "curves.png", curves, CURVE_KEYS)
    beside = {LABELS[d]: tables[d] for d in DECODINGS if d not in (MAIN, "greedy")}
    (out / "report.md").write_text(rep.report_markdown(
        methods, tables["greedy"], cfg.seeds, seconds, load, command, extra["cpu_seconds"], couplings,
        main=LABELS[MAIN], beside=beside, bases=further,
        sections=[agent.agent_markdown(extra["agent"]["methods"], LABELS[MAIN])] if cfg.agent else ()),
        encoding="utf-8")
    return {"methods": methods, **extra}


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its reaped children (the sandbox workers).

    Unlike wall-clock time this does not grow with the machine's load, so it tells
    how long the run takes on an idle machine: about cpu_seconds / cores at best.
    """
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _plain(cfg: Any) -> Any:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))
