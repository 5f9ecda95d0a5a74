"""The supervised trainer of the baselines: SFT (rejection sampling, the RECAP refiner) and DPO.

`train_supervised(cfg, sup)` reads top to bottom like the RL loop: rows, mesh, model and
train state, (DPO) the reference log-probs, the jitted sharded step, checkpoints, loop.
It shares the RL trainer's parts: the model built from `cfg.model` on the mesh of
`cfg.mesh` with its logical-axis rules, `train_step`'s optimizer, train state and state
shardings, the `Checkpointer`, the metrics writer, and validation through the evaluation
code path (`jaxrl.validate`, every `run.eval_every` steps and at the end, on
`data.val` and `data.gt_debug` with the configured engine and the fleet). Its run directory holds `config.yaml`
(the base `Config`, so `load_policy`, `generate --checkpoint` and `eval --checkpoint`
open it), `supervised.yaml`, `checkpoints/`, `metrics.jsonl` and, for DPO, `pairs.jsonl`.

Rows (`precisecoder select` output):
- `sft`: {task_id, text} (a pool sample; the prompt is the task's, rendered as the pool
  rendered it) or {messages, response} (`select recap`); the loss is on the response
  tokens only, the stop token included.
- `dpo`: {task_id, chosen, rejected}. The reference log-probs (the base policy's,
  log π_ref(y | x) summed over the response) are computed once before the first step
  and stored with the pairs in `pairs.jsonl`; a resumed run reads them back.

Batches: step s takes rows `perm_e[i·B:(i+1)·B]` of epoch e = s // (N // B), with
`perm_e` a permutation seeded by (seed, e), so the data order is a function of the
step and a resumed run continues exactly (the remainder N mod B of an epoch is skipped).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
import yaml
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl import metrics as M
from jaxrl import tasks as T
from jaxrl import train_step as ts
from jaxrl.batching import pad_length
from jaxrl.checkpoint import Checkpointer, abstract_with_shardings
from jaxrl.config import Config, SupervisedConfig, to_yaml
from jaxrl.losses import chunked_logprobs
from jaxrl.sft_losses import dpo_loss, sequence_logprobs, sft_loss
from models import sharding as msh
from reward.extract import prompt_opens_think
from reward.sandbox import library_env
from reward.schema import SchemaError, load_tasks, read_jsonl, write_jsonl

SUPERVISED, PAIRS = "supervised.yaml", "pairs.jsonl"
CLOSE_THINK = "\n</think>\n\n"


class SupervisedError(RuntimeError):
    """A run that cannot start or continue; the message says why."""


# ---------------------------------------------------------------------------- rows


def _prompt(row: dict[str, Any], tasks: dict[str, Any], tokenizer: Any, prompt: str, where: str
            ) -> tuple[list[int], bool]:
    """(prompt token ids, whether the prompt opened the think block) of one row."""
    if "messages" in row:
        text = tokenizer.render_chat(row["messages"], enable_thinking=True)
        return list(tokenizer.encode(text)), prompt_opens_think(text)
    task = tasks.get(row.get("task_id"))
    if task is None:
        raise SupervisedError(f"{where}: task {row.get('task_id')!r} is not in the tasks file (give --tasks)")
    rendered = T.render(task, tokenizer, prompt)
    return list(rendered.prompt_ids), rendered.think_opened


def _response(text: str, think_opened: bool, tokenizer: Any) -> list[int]:
    """The response's tokens after its prompt, ending in the stop token.

    A prompt that opened the think block continues inside it: a response that opens its
    own loses that opening, one without any gets an empty think block closed first.
    """
    if think_opened:
        text = text[len("<think>\n"):] if text.startswith("<think>\n") else \
            text if "</think>" in text else CLOSE_THINK.lstrip("\n") + text
    return list(tokenizer.encode(text)) + [tokenizer.stop_ids[0]]


def read_rows(sup: SupervisedConfig, tokenizer: Any, prompt: str) -> list[dict[str, Any]]:
    """The rows of `sup.rows`, each with its prompt and response token ids."""
    tasks = {}
    if sup.tasks is not None:
        try:
            tasks = {t.task_id: t for t in load_tasks(Path(sup.tasks).expanduser())}
        except (OSError, SchemaError) as e:
            raise SupervisedError(f"tasks: {e}") from None
    keys = ("chosen", "rejected") if sup.objective == "dpo" else ("response",)
    out = []
    try:
        for number, row in read_jsonl(Path(sup.rows).expanduser()):
            where = f"{sup.rows}:{number}"
            if not isinstance(row, dict):
                raise SupervisedError(f"{where}: a row must be a JSON object")
            texts = {k: row.get(k, row.get("text") if k == "response" else None) for k in keys}
            missing = [k for k, v in texts.items() if not isinstance(v, str)]
            if missing:
                raise SupervisedError(f"{where}: missing {' and '.join(missing)} (a `select {sup.objective}` row?)")
            prompt_ids, opened = _prompt(row, tasks, tokenizer, prompt, where)
            out.append({**row, "prompt_ids": prompt_ids,
                        **{f"{k}_ids": _response(v, opened, tokenizer) for k, v in texts.items()}})
    except (OSError, SchemaError) as e:
        raise SupervisedError(f"rows: {e}") from None
    if len(out) < sup.batch_size:
        raise SupervisedError(f"{sup.rows}: {len(out)} rows, fewer than one batch of {sup.batch_size}")
    return out


def encode(prompt_ids: list[int], response_ids: list[int], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """One right-padded row of `length` tokens and its response mask."""
    ids = prompt_ids + response_ids
    tokens = np.full(length, pad_id, np.int32)
    tokens[:len(ids)] = ids
    mask = np.zeros(length, np.float32)
    mask[len(prompt_ids):len(ids)] = 1.0
    return tokens, mask


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """The rows of step `step` (0-based): a slice of epoch e's seeded permutation."""
    per_epoch = n // batch_size
    epoch, i = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[i * batch_size:(i + 1) * batch_size]


# ---------------------------------------------------------------------------- the step


def _logprobs(model: nnx.Module, tokens_BxT: jax.Array, chunk: int) -> jax.Array:
    hidden_BxTxD = msh.constrain(model(tokens_BxT, return_hidden=True), ("batch", "seq", "act_embed"))
    return chunked_logprobs(hidden_BxTxD, model.lm_head_weight(), tokens_BxT, chunk)[0]


def make_loss(objective: str, graphdef: nnx.GraphDef, rest: nnx.State, beta: float, chunk: int
              ) -> Callable[[nnx.State, dict[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]:
    """loss(params, batch) -> (loss, metrics) of the objective on one batch (DPO: chosen rows, then rejected)."""

    def loss(params, batch):
        logp_BxT = _logprobs(nnx.merge(graphdef, params, rest), batch["tokens"], chunk)
        if objective == "sft":
            value = sft_loss(logp_BxT, batch["mask"])
            return value, {"loss": value, "tokens": batch["mask"].sum()}
        seq_B = sequence_logprobs(logp_BxT, batch["mask"])
        half = seq_B.shape[0] // 2
        value, metrics = dpo_loss(seq_B[:half], seq_B[half:], batch["ref_chosen"], batch["ref_rejected"], beta)
        return value, {"loss": value, **metrics}

    return loss


def make_step(loss_fn: Callable, tx: optax.GradientTransformation) -> Callable:
    """step(state, batch) -> (state, metrics): one optimizer update on the loss's gradient."""

    def step(state: ts.TrainState, batch):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return ts.TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return step


def _row_sharding(mesh: jax.sharding.Mesh, rules: tuple, shape: tuple[int, ...]) -> NamedSharding:
    names = ("batch",) + (None,) * (len(shape) - 1)
    return NamedSharding(mesh, msh.logical_to_spec(names, rules, shape, mesh))


# ---------------------------------------------------------------------------- the run


def _write_or_check(out: Path, cfg: Config, sup: SupervisedConfig, resume: bool) -> None:
    saved = out / SUPERVISED
    base = yaml.safe_load(to_yaml(cfg))
    base.pop("supervised")  # compared as the objective, where a larger steps is allowed
    record = {"objective": dataclasses.asdict(sup), "config": base}
    if resume and saved.is_file():
        previous = yaml.safe_load(saved.read_text())
        changed = [k for k in sorted(set(previous["objective"]) | set(record["objective"]))
                   if k != "steps" and previous["objective"].get(k) != record["objective"].get(k)]
        if changed or previous["config"] != record["config"]:
            raise SupervisedError(f"--resume with other settings than {saved}: "
                                  f"{', '.join(changed) or 'the base config'}")
    elif not resume and (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        raise SupervisedError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(to_yaml(cfg))
    saved.write_text(yaml.safe_dump(record, sort_keys=True))


def train_supervised(cfg: Config, sup: SupervisedConfig, *, resume: bool = False,
                     tokenizer: Any = None) -> list[dict[str, float]]:
    """Train (or resume) the policy of `cfg.model` on `sup`'s rows; returns this call's step metrics.

    The run's config.yaml is `cfg` with `sup` as its `supervised` section. `tokenizer` replaces the Qwen tokenizer of `cfg.model.family`.
    """
    from jaxrl.saved_run import build_model
    from models.tokenizer import load_tokenizer

    if sup.rows is None:
        raise SupervisedError("no rows: give --rows (supervised.rows), the output of `precisecoder select`")
    cfg = dataclasses.replace(cfg, supervised=sup)
    out = Path(cfg.run.out).expanduser()
    _write_or_check(out, cfg, sup, resume)
    tokenizer = load_tokenizer(cfg.model.family) if tokenizer is None else tokenizer

    # ---- rows
    rows = read_rows(sup, tokenizer, cfg.data.prompt)
    keys = ("chosen", "rejected") if sup.objective == "dpo" else ("response",)
    length = pad_length(max(len(r["prompt_ids"]) + len(r[f"{k}_ids"]) for r in rows for k in keys))
    encoded = {k: [encode(r["prompt_ids"], r[f"{k}_ids"], length, tokenizer.pad_id) for r in rows] for k in keys}
    tokens = {k: np.stack([e[0] for e in v]) for k, v in encoded.items()}
    masks = {k: np.stack([e[1] for e in v]) for k, v in encoded.items()}
    per_epoch = len(rows) // sup.batch_size
    total = sup.steps if sup.steps is not None else sup.epochs * per_epoch

    # ---- mesh, model, train state
    rules = msh.rules_from_mapping(cfg.mesh.rules)
    try:
        mesh = msh.make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, expert=cfg.mesh.expert)
    except ValueError as e:
        raise SupervisedError(f"mesh: {e}") from None
    tx = ts.make_optimizer(cfg.optimizer)
    state, graphdef, rest = ts.init_train_state(build_model(cfg, mesh, rules), tx, mesh, rules)
    state_shardings = ts.state_shardings(jax.eval_shape(lambda s: s, state), mesh, rules)
    chunk = min(cfg.loss.logp_chunk, length)

    # ---- reference log-probs (DPO), once, with the pairs
    ref = None
    if sup.objective == "dpo":
        ref = _reference(out / PAIRS, rows, tokens, masks, state.params, graphdef, rest, mesh, rules, chunk, resume)

    # ---- the jitted, sharded step
    def batch_at(step: int) -> dict[str, jax.Array]:
        idx = batch_indices(len(rows), sup.batch_size, sup.seed, step)
        if sup.objective == "sft":
            host = {"tokens": tokens["response"][idx], "mask": masks["response"][idx]}
        else:
            host = {"tokens": np.concatenate([tokens["chosen"][idx], tokens["rejected"][idx]]),
                    "mask": np.concatenate([masks["chosen"][idx], masks["rejected"][idx]]),
                    "ref_chosen": ref[idx, 0], "ref_rejected": ref[idx, 1]}
        return {k: jax.device_put(v, _row_sharding(mesh, rules, v.shape)) for k, v in host.items()}

    example = batch_at(0)
    batch_shardings = {k: v.sharding for k, v in example.items()}
    loss_fn = make_loss(sup.objective, graphdef, rest, sup.beta, chunk)
    replicated = NamedSharding(mesh, PartitionSpec())
    step_fn = jax.jit(make_step(loss_fn, tx), in_shardings=(state_shardings, batch_shardings),
                      out_shardings=(state_shardings, replicated), donate_argnums=(0,))

    # ---- checkpoints (resume)
    ckpt = Checkpointer(out / "checkpoints", max_to_keep=cfg.run.keep_last)
    rng = jax.random.key(cfg.run.seed)
    start = 0
    if resume and ckpt.latest_step() is not None:
        state, rng, _ = ckpt.restore(abstract_with_shardings(jax.eval_shape(lambda s: s, state), state_shardings))
        start = int(state.step)
    if start >= total:
        ckpt.close()
        raise SupervisedError(f"the run is already at step {start} >= {total}; raise steps to extend it")
    writer = M.MetricsWriter(out, cfg.run.tensorboard, start if resume else None)
    val_tasks = _validation_tasks(cfg)
    checker = None

    # ---- loop
    history = []
    try:
        for step in range(start, total):
            with msh.use_mesh(mesh, rules):
                state, metrics = step_fn(state, batch_at(step))
            record = {f"{sup.objective}/{k}": float(v) for k, v in jax.device_get(metrics).items()}
            record["epoch"] = step // per_epoch
            record["learning_rate"] = float(ts.make_schedule(cfg.optimizer)(step))
            done = step + 1
            if val_tasks and ((cfg.run.eval_every and done % cfg.run.eval_every == 0) or done == total):
                checker = checker or _Validator(cfg, tokenizer, mesh, rules)
                record |= checker(nnx.merge(graphdef, state.params, rest), val_tasks, cfg.run.seed + done, done)
            if (cfg.run.save_every and done % cfg.run.save_every == 0) or done == total:
                ckpt.save(state, rng, {"objective": sup.objective})
            writer.write(done, record)
            history.append(record)
    finally:
        ckpt.close()
        writer.close()
        if checker is not None:
            checker.close()
    return history


def _validation_tasks(cfg: Config) -> list:
    """The val tasks (first `validation.val_tasks`) and GT Debug tasks (first `validation.gt_debug_tasks`)."""
    if cfg.data.build is None:
        build = None
    else:
        build = T.ensure_built(cfg.data.build, cfg.reward.workers, cfg.reward.isolation,
                               libraries=library_env(cfg.reward.sandbox_env, cfg.reward.preload))
    paths = T.task_paths(cfg.data, build)
    return (T.read_tasks(paths["val"], "val", cfg.validation.val_tasks)
            + T.read_tasks(paths["gt_debug"], "gt_debug", cfg.validation.gt_debug_tasks))


class _Validator:
    """The configured engine, the fleet and the reward pipeline, made at the first validation."""

    def __init__(self, cfg: Config, tokenizer: Any, mesh, rules):
        from jaxrl import rewards as R
        from reward.fleet import Fleet
        from reward.sandbox import Limits

        self.cfg, self.tokenizer, self.mesh, self.rules = cfg, tokenizer, mesh, rules
        self.fleet = Fleet(workers=cfg.reward.workers, isolation=cfg.reward.isolation,
                           libraries=library_env(cfg.reward.sandbox_env, cfg.reward.preload))
        self.scorer = R.RewardPipeline(self.fleet, cfg.reward.lam, cfg.reward.epsilon,
                                       Limits(timeout_s=cfg.reward.timeout_s), cfg.reward.threads,
                                       cfg.reward.window_batch)
        self.engine = None

    def __call__(self, model: nnx.Module, tasks: list, seed: int, step: int) -> dict[str, float]:
        from jaxrl.run import make_engine_for
        from jaxrl.validate import validate

        if self.engine is None:
            self.engine = make_engine_for(self.cfg, model, self.tokenizer, self.mesh, self.rules)
        else:
            self.engine.update_weights(model, step=step)
        return validate(self.engine, self.tokenizer, self.scorer, tasks, self.cfg, seed)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.scorer.close()
        self.fleet.close()


def _reference(path: Path, rows, tokens, masks, params, graphdef, rest, mesh, rules, chunk: int,
               resume: bool) -> np.ndarray:
    """[pairs, 2] reference log-probs (chosen, rejected): read from `path` on resume, else
    computed with the base parameters and written there with the pairs."""
    if resume and path.is_file():
        stored = [obj for _, obj in read_jsonl(path)]
        if len(stored) != len(rows):
            raise SupervisedError(f"{path} holds {len(stored)} pairs, the rows {len(rows)}")
        return np.asarray([[s["ref_chosen_logp"], s["ref_rejected_logp"]] for s in stored], np.float32)

    @jax.jit
    def seq_logp(p, tok, mask):
        return sequence_logprobs(_logprobs(nnx.merge(graphdef, p, rest), tok, chunk), mask)

    out = np.zeros((len(rows), 2), np.float32)
    width = 8
    with msh.use_mesh(mesh, rules):
        for j, key in enumerate(("chosen", "rejected")):
            for i in range(0, len(rows), width):
                tok, mask = tokens[key][i:i + width], masks[key][i:i + width]
                pad = width - len(tok)
                tok, mask = np.pad(tok, ((0, pad), (0, 0))), np.pad(mask, ((0, pad), (0, 0)))
                out[i:i + width - pad, j] = np.asarray(seq_logp(params, tok, mask))[:width - pad]
    keep = ("task_id", "chosen_sample", "rejected_sample", "chosen", "rejected")
    write_jsonl(path, ({**{k: r[k] for k in keep if k in r}, "ref_chosen_logp": float(out[i, 0]),
                        "ref_rejected_logp": float(out[i, 1])} for i, r in enumerate(rows)))
    return out
