"""The demo pipeline: SFT base → RL with each method from that base → evaluation → report.

Per seed, `run_seed` makes the domain's task sets, trains the base policy by
SFT and saves it as an HF checkpoint, then for every method runs the project's
trainer (`jaxrl.trainer.train`: the `jax` engine, the sandboxed fleet through
Grain, the algorithm's advantages, the jitted train step, Orbax checkpoints)
from that same base with the same seed and number of steps. The final policy is
restored from the trainer's last checkpoint and evaluated, like the base, with
`jaxrl.eval.evaluate` on the held-out buggy and clean sets, under T = 1
sampling and greedy decoding. `run_demo` loops over seeds and writes the
report (`jaxrl.demo.report`).
"""

from __future__ import annotations

import dataclasses
import json
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
DECODINGS = {"sampled": 1.0, "greedy": 0.0}
CURVE_KEYS = (("rollout/pass", "pass rate (training rollouts)"),
              ("rollout/edited_lines", "edited lines (valid rollouts)"),
              ("rollout/precision", "precision"), ("rollout/noop", "no-op rate"))


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Everything one demo run depends on.

    Attributes:
        seeds: seeds 0 .. seeds − 1, each with its own tasks, base policy and RL runs.
        methods: RL algorithms (names of `jaxrl.algorithms.algorithm_names()`), each from the same base.
        baselines: supervised baselines from the same base (`jaxrl.demo.baselines.BASELINES`), off by default.
        baseline: their settings.
        domain: the generator's sizes and probabilities.
        sft_tasks, train_tasks, test_tasks, clean_tasks: task counts of the four disjoint sets.
        hidden, layers, heads: the policy's shape (`jaxrl.demo.policy`).
        sft: the SFT run.
        rl_steps: RL steps per method.
        tasks_per_step, group_size: N tasks × G rollouts per RL step.
        learning_rate: RL learning rate (constant, AdamW).
        kl_coef: weight of the KL term to the base policy (0 turns it off).
        max_tokens: completion budget; an answer takes about 60 tokens (73 at most).
        thinking: the thinking variant (`jaxrl.demo.thinking`): SFT targets think first, and
            rollouts and evaluations get a thinking budget on top of `max_tokens`.
    """

    seeds: int = 1
    methods: tuple[str, ...] = METHODS
    baselines: tuple[str, ...] = ()
    baseline: BaselineConfig = BaselineConfig()
    domain: domain.DomainConfig = domain.DomainConfig()
    sft_tasks: int = 4000
    train_tasks: int = 1000
    test_tasks: int = 200
    clean_tasks: int = 100
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    sft: SFTConfig = SFTConfig()
    rl_steps: int = 45
    tasks_per_step: int = 12
    group_size: int = 8
    learning_rate: float = 3e-4
    kl_coef: float = 0.0
    max_tokens: int = 80
    thinking: bool = False

    def __post_init__(self):
        known = METHODS + OPTIONAL_METHODS
        bad = [m for m in self.methods if m not in known]
        if bad or not self.methods:
            raise ValueError(f"methods must be among {', '.join(known)}, got {list(self.methods)}")
        if any(b not in BASELINES for b in self.baselines):
            raise ValueError(f"baselines must be among {', '.join(BASELINES)}, got {list(self.baselines)}")
        if self.thinking and self.baselines:
            raise ValueError("--thinking and the supervised baselines (--with rs_sft,dpo,recap) do not run together yet")
        if self.seeds < 1 or self.rl_steps < 1:
            raise ValueError("seeds and rl_steps must be >= 1")
        if min(self.sft_tasks, self.train_tasks, self.test_tasks, self.clean_tasks) < 1:
            raise ValueError("every task set needs at least one task")
        if self.group_size < 2 or self.tasks_per_step < 1:
            raise ValueError("group_size must be >= 2 and tasks_per_step >= 1")


Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def make_data(cfg: DemoConfig, seed: int, out: Path) -> domain.Splits:
    """The seed's four task sets, written as task JSONL under `out` (train, test, clean)."""
    from reward.schema import write_tasks

    splits = domain.make_splits(seed, cfg.sft_tasks, cfg.train_tasks, cfg.test_tasks, cfg.clean_tasks, cfg.domain)
    out.mkdir(parents=True, exist_ok=True)
    for name, samples in (("train", splits.train), ("test", splits.test), ("clean", splits.clean)):
        write_tasks(out / f"{name}.jsonl", domain.iter_tasks(samples))
    return splits


def train_base(cfg: DemoConfig, seed: int, splits: domain.Splits, out: Path, progress: bool) -> dict[str, Any]:
    """SFT from a random initialisation; the base is saved as an HF checkpoint in `out`.

    Returns:
        the SFT record: losses, seconds, the share of targets that over-edit.
    """
    import models
    from jaxrl.demo import sft
    from jaxrl.demo.policy import new_policy, policy_config
    from tqdm import tqdm

    tok = demo_thinking.tokenizer(cfg.thinking)
    pairs, shares = sft.sft_pairs(splits.sft, cfg.sft.rewrite_share, seed, cfg.sft.miss_share, cfg.thinking)
    tokens, mask = sft.encode_pairs(tok, pairs)
    model = new_policy(policy_config(tok, cfg.hidden, cfg.layers, cfg.heads), seed)
    bar = tqdm(total=cfg.sft.steps, desc=f"seed {seed} SFT", unit="step", disable=not progress, dynamic_ncols=True)

    def on_step(i: int, loss: float) -> None:
        bar.update(1)
        if i % 10 == 0:
            bar.set_postfix(loss=f"{loss:.3f}")

    start = time.perf_counter()
    losses = sft.train_sft(model, tokens, mask, cfg.sft, seed, on_step)
    seconds = time.perf_counter() - start
    bar.close()
    models.save_pretrained(model, out)
    tok.save_pretrained(out)
    record = {"losses": losses, "seconds": seconds, "target_shares": shares, "pairs": len(pairs)}
    (out / "sft.json").write_text(json.dumps(record) + "\n")
    return record


def rl_config(cfg: DemoConfig, seed: int, method: str, base: Path, data: Path, out: Path, progress: bool):
    """The trainer's `Config` of one method's run (the demo prompt, no thinking, no validation)."""
    from jaxrl.config import Config, from_dict

    return from_dict(Config, {
        "name": f"seed {seed} {method}",
        "model": {"family": "qwen3", "checkpoint": str(base), "dtype": "float32", "param_dtype": "float32",
                  "remat": False},
        "data": {"train": str(data / "train.jsonl"), "tasks_per_step": cfg.tasks_per_step, "prompt": prompt.PROMPT,
                 "seed": seed, "prompt_multiple": 8},
        "rollout": {"engine": "jax", "group_size": cfg.group_size, "temperature": 1.0, "top_p": 1.0,
                    **demo_thinking.budgets(cfg.max_tokens, cfg.thinking)},
        "algorithm": {"name": method},
        "loss": {"kl_coef": cfg.kl_coef, "logp_chunk": 256},
        "optimizer": {"learning_rate": cfg.learning_rate, "weight_decay": 0.0},
        "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
        "validation": {"val_tasks": 0, "gt_debug_tasks": 0},
        "run": {"steps": cfg.rl_steps, "eval_every": 0, "save_every": 0, "keep_last": 1, "best_metric": None,
                "out": str(out), "seed": seed, "progress": progress, "tensorboard": False},
    })


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

    tok = demo_thinking.tokenizer(cfg.thinking)
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


def run_seed(cfg: DemoConfig, seed: int, out: Path, fleet: Any, progress: bool = True,
             log: Log = _stderr) -> dict[str, Any]:
    """One seed: data, SFT base, its evaluation, and each method's RL run and evaluation.

    Work already in `out` is reused: a saved base, finished RL runs (an unfinished one
    resumes from its last checkpoint), evaluations (resumed from their predictions).

    Returns:
        `{"rows": {method: {decoding: results row}}, "curves": {method: [...]}, "timing": {...},
        "coupling": {method: rep.coupling(...)}, "sft": {...}}`.
    """
    import models
    from jaxrl.metrics import read_metrics
    from jaxrl.preflight import has_checkpoint
    from jaxrl.saved_run import load_policy
    from jaxrl.trainer import train

    timing: dict[str, float] = {}
    start = time.perf_counter()
    data = out / "data"
    splits = make_data(cfg, seed, data)
    held_out = [s.task for s in splits.test + splits.clean]
    timing["data_s"] = time.perf_counter() - start

    base_dir = out / "base"
    if (base_dir / "sft.json").is_file():
        sft_record = json.loads((base_dir / "sft.json").read_text())
        log(f"[seed {seed}] SFT base: reusing {base_dir}")
    else:
        log(f"[seed {seed}] SFT base: {len(splits.sft)} pairs, {cfg.sft.rewrite_share:.0%} rewrite targets, "
            f"{cfg.sft.miss_share:.0%} of the others missing the bug")
        sft_record = train_base(cfg, seed, splits, base_dir, progress)
    timing["sft_s"] = sft_record["seconds"]
    log(f"[seed {seed}] SFT loss {sft_record['losses'][0]:.3f} -> {sft_record['losses'][-1]:.3f} "
        f"in {sft_record['seconds']:.0f} s")

    rows: dict[str, dict[str, Any]] = {}
    curves: dict[str, list[dict[str, float]]] = {}
    t = time.perf_counter()
    base = models.from_pretrained(base_dir)
    samples = demo_thinking.EVAL_SAMPLES if cfg.thinking else 1
    evals = evaluate_policy(base, cfg, seed, held_out, fleet, out / "eval" / "base", progress, samples)
    rows["base"] = {k: rep.row_of(r.summary, seed) for k, r in evals.items()}
    couplings = {"base": rep.coupling(evals["sampled"].scores)}
    timing["eval_base_s"] = time.perf_counter() - t
    log(f"[seed {seed}] base: {_brief(rows['base'])}")

    for method in cfg.methods:
        t = time.perf_counter()
        run_dir = out / "rl" / method
        run_cfg = rl_config(cfg, seed, method, base_dir, data, run_dir, progress)
        if _finished(run_dir, cfg.rl_steps):
            log(f"[seed {seed}] RL {method}: reusing the finished run in {run_dir}")
        else:
            log(f"[seed {seed}] RL {method}: {cfg.rl_steps} steps × {cfg.tasks_per_step} tasks × "
                f"G = {cfg.group_size}")
            train(run_cfg, resume=has_checkpoint(run_dir), tokenizer=demo_thinking.tokenizer(cfg.thinking))
        timing[f"rl_{method}_s"] = time.perf_counter() - t
        curves[method] = [{"seed": seed, **r} for r in read_metrics(run_dir / "metrics.jsonl")]
        t = time.perf_counter()
        policy, _, step = load_policy(run_dir)  # on the trainer's mesh: fsdp over every device
        evals = evaluate_policy(policy, cfg, seed, held_out, fleet, out / "eval" / method, progress, samples)
        rows[method] = {k: rep.row_of(r.summary, seed) for k, r in evals.items()}
        couplings[method] = rep.coupling(evals["sampled"].scores)
        timing[f"eval_{method}_s"] = time.perf_counter() - t
        log(f"[seed {seed}] {method} (step {step}): {_brief(rows[method])}")
    if cfg.baselines:
        from jaxrl.demo import baselines

        done = baselines.run_baselines(cfg, seed, splits, base_dir, out / "baselines", fleet,
                                       rl_config(cfg, seed, "grpo", base_dir, data, out, progress),
                                       evaluate_policy, progress, log)
        more = baselines.summarize(done, seed, rep.row_of, rep.coupling)
        rows, couplings, timing = rows | more[0], couplings | more[1], timing | more[2]
        for name in cfg.baselines:
            log(f"[seed {seed}] {name}: {_brief(rows[name])}")
    timing["total_s"] = time.perf_counter() - start
    return {"rows": rows, "curves": curves, "timing": timing, "coupling": couplings,
            "sft": {k: v for k, v in sft_record.items() if k != "losses"}}


def _finished(run_dir: Path, steps: int) -> bool:
    """Whether the trainer's run in `run_dir` has its checkpoint of step `steps`."""
    ckpts = run_dir / "checkpoints"
    return ckpts.is_dir() and any(p.name == str(steps) for p in ckpts.iterdir())


def _brief(row: dict[str, dict[str, Any]]) -> str:
    r = row["sampled"]

    def f(x, spec):
        return "–" if x is None else format(x, spec)

    return (f"pass {f(r['pass'], '.1f')}%, precision {f(r['precision'], '.1f')}%, lines {f(r['lines'], '.2f')}, "
            f"no-op {f(r['noop'], '.1f')}% (T = 1)")


# Settings that may change when a run is resumed: more seeds or methods only add work.
RESUMABLE = ("seeds", "methods", "baselines")


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def check_resume(cfg: DemoConfig, out: Path) -> None:
    """Raise ValueError if `out` holds work made with other settings (`RESUMABLE` ones aside).

    The settings of a run are in `out/demo_config.json`, written when it starts.
    """
    path = out / "demo_config.json"
    if not path.is_file():
        return
    saved, now = _flat(json.loads(path.read_text())), _flat(_plain(cfg))
    changed = sorted(k for k in saved.keys() | now.keys()
                     if k.split(".")[0] not in RESUMABLE and saved.get(k) != now.get(k))
    if changed:
        raise ValueError(f"{out} holds a run made with other settings ("
                         + ", ".join(f"{k}: {saved.get(k)} there, {now.get(k)} now" for k in changed)
                         + "); resume with the same options or choose another --out")


def run_demo(cfg: DemoConfig, out: str | Path, progress: bool = True, log: Log = _stderr,
             command: str = "precisecoder demo") -> dict[str, Any]:
    """All seeds, then results.json, report.md and curves.png in `out`; returns the results object.

    Raises ValueError (before any work) if `out` holds a run made with other settings.
    """
    import os

    import jax

    from reward.fleet import Fleet

    out = Path(out)
    check_resume(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_config.json").write_text(json.dumps(_plain(cfg), indent=1) + "\n")
    load = os.getloadavg()
    devices = jax.devices()
    split = "; batches are split over them" if len(devices) > 1 else ""
    log(f"JAX: {len(devices)} {devices[0].platform} device(s){split}")
    per_seed = []
    start = time.perf_counter()
    with Fleet(workers=min(2, os.cpu_count() or 1)) as fleet:
        for seed in range(cfg.seeds):
            per_seed.append(run_seed(cfg, seed, out / f"seed{seed}", fleet, progress, log))
    seconds = time.perf_counter() - start
    end_load = os.getloadavg()
    names = ("base", *cfg.methods, *cfg.baselines)
    methods = {m: [s["rows"][m]["sampled"] for s in per_seed] for m in names}
    greedy = {m: [s["rows"][m]["greedy"] for s in per_seed] for m in names}
    couplings = {m: [s["coupling"][m] for s in per_seed] for m in names}
    extra = {"greedy": greedy, "coupling": couplings, "sft": [s["sft"] for s in per_seed],
             "timing": [s["timing"] for s in per_seed], "seconds": seconds, "cpu_seconds": _cpu_seconds(),
             "load_average_at_start": load, "load_average_at_end": end_load, "jax_devices": len(devices),
             "config": _plain(cfg),
             "command": command}
    rep.write_results(out / "results.json", methods, extra)
    curves = {m: [r for s in per_seed for r in s["curves"].get(m, [])] for m in cfg.methods}
    rep.plot_curves(out / "curves.png", curves, CURVE_KEYS)
    (out / "report.md").write_text(rep.report_markdown(methods, greedy, cfg.seeds, seconds, load, command,
                                                       extra["cpu_seconds"], couplings), encoding="utf-8")
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
