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

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import yaml
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from jaxrl import hosts
from jaxrl import metrics as M
from jaxrl import tasks as T
from jaxrl import train_step as ts
from jaxrl.batching import pad_length
from jaxrl.config import Config, SupervisedConfig, to_yaml
from jaxrl.loop import Loop, interruptible, run_loop
from jaxrl.run import open_checkpoints, open_engine, open_mesh, open_recorder, open_state, open_verifier, \
    write_run_files
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
    """loss(params, rows) -> (loss, metrics) of the objective, additive over rows: each row carries the
    whole batch's normalizer (`num_tokens` for SFT, `num_pairs` for DPO), so micro-batches add up to
    the full batch. A DPO row is a pair: its chosen and rejected sequences run in one forward pass."""

    def loss(params, rows):
        model = nnx.merge(graphdef, params, rest)
        if objective == "sft":
            logp_BxT = _logprobs(model, rows["tokens"], chunk)
            value = sft_loss(logp_BxT, rows["mask"], rows["num_tokens"][0])
            return value, {"loss": value, "tokens": rows["mask"].sum()}
        tokens = jnp.concatenate([rows["chosen"], rows["rejected"]])
        mask = jnp.concatenate([rows["chosen_mask"], rows["rejected_mask"]])
        seq_B = sequence_logprobs(_logprobs(model, tokens, chunk), mask)
        half = seq_B.shape[0] // 2
        value, metrics = dpo_loss(seq_B[:half], seq_B[half:], rows["ref_chosen"], rows["ref_rejected"], beta,
                                  rows["num_pairs"][0])
        return value, {"loss": value, **metrics}

    return loss


def _row_sharding(mesh: jax.sharding.Mesh, rules: tuple, shape: tuple[int, ...]) -> NamedSharding:
    names = ("batch",) + (None,) * (len(shape) - 1)
    return NamedSharding(mesh, msh.logical_to_spec(names, rules, shape, mesh))


# ---------------------------------------------------------------------------- the run


def _run_record(cfg: Config, sup: SupervisedConfig) -> dict[str, Any]:
    base = yaml.safe_load(to_yaml(cfg))
    base.pop("supervised")  # compared as the objective, where a larger steps is allowed
    return {"objective": dataclasses.asdict(sup), "config": base}


def _check_rerun(out: Path, record: dict[str, Any], resume: bool) -> None:
    """Refuse a resume with other settings, or a fresh run into a directory that holds one (nothing written)."""
    saved = out / SUPERVISED
    if resume and saved.is_file():
        previous = yaml.safe_load(saved.read_text())
        changed = [k for k in sorted(set(previous["objective"]) | set(record["objective"]))
                   if k != "steps" and previous["objective"].get(k) != record["objective"].get(k)]
        if changed or previous["config"] != record["config"]:
            raise SupervisedError(f"--resume with other settings than {saved}: "
                                  f"{', '.join(changed) or 'the base config'}")
    elif not resume and (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        raise SupervisedError(f"{out} already holds a run; pass --resume to continue it or choose another --out")


def train_supervised(cfg: Config, sup: SupervisedConfig, *, resume: bool = False,
                     tokenizer: Any = None) -> list[dict[str, float]]:
    """Train (or resume) the policy of `cfg.model` on `sup`'s rows; returns this call's step metrics.

    The run's config.yaml is `cfg` with `sup` as its `supervised` section. `tokenizer` replaces the
    Qwen tokenizer of `cfg.model.family`. The rows are read and checked before anything is written;
    the loop is `jaxrl.loop.run_loop` (SIGINT and SIGTERM save the last completed step).
    """
    from models.tokenizer import load_tokenizer

    if sup.rows is None:
        raise SupervisedError("no rows: give --rows (supervised.rows), the output of `precisecoder select`")
    if sup.batch_size % cfg.run.micro_batches:
        raise SupervisedError(f"batch_size {sup.batch_size} does not split into run.micro_batches="
                              f"{cfg.run.micro_batches}")
    cfg = dataclasses.replace(cfg, supervised=sup)
    out = Path(cfg.run.out).expanduser()
    record = _run_record(cfg, sup)
    _check_rerun(out, record, resume)
    tokenizer = load_tokenizer(cfg.model.family) if tokenizer is None else tokenizer

    # ---- rows (and the validation tasks): read and checked before anything is written
    rows = read_rows(sup, tokenizer, cfg.data.prompt)
    val_tasks = _validation_tasks(cfg)
    keys = ("chosen", "rejected") if sup.objective == "dpo" else ("response",)
    length = pad_length(max(len(r["prompt_ids"]) + len(r[f"{k}_ids"]) for r in rows for k in keys))
    encoded = {k: [encode(r["prompt_ids"], r[f"{k}_ids"], length, tokenizer.pad_id) for r in rows] for k in keys}
    tokens = {k: np.stack([e[0] for e in v]) for k, v in encoded.items()}
    masks = {k: np.stack([e[1] for e in v]) for k, v in encoded.items()}
    per_epoch = len(rows) // sup.batch_size
    total = sup.steps if sup.steps is not None else sup.epochs * per_epoch
    write_run_files(out, {"config.yaml": to_yaml(cfg), SUPERVISED: yaml.safe_dump(record, sort_keys=True)})

    with interruptible(cfg.run.exit_grace_s), contextlib.ExitStack() as stack:
        # ---- mesh, model, train state
        mesh, rules = open_mesh(cfg)
        state, graphdef, rest, tx, state_shardings = open_state(cfg, mesh, rules)
        chunk = min(cfg.loss.logp_chunk, length)

        # ---- reference log-probs (DPO), once, with the pairs
        ref = None
        if sup.objective == "dpo":
            ref = _reference(out / PAIRS, rows, tokens, masks, state.params, graphdef, rest, mesh, rules, chunk,
                             resume)

        # ---- the jitted, sharded, micro-batched step
        def rows_at(step: int) -> dict[str, jax.Array]:
            idx = batch_indices(len(rows), sup.batch_size, sup.seed, step)
            if sup.objective == "sft":
                mask = masks["response"][idx]
                host = {"tokens": tokens["response"][idx], "mask": mask,
                        "num_tokens": np.full(len(idx), max(mask.sum(), 1.0), np.float32)}
            else:
                host = {"chosen": tokens["chosen"][idx], "rejected": tokens["rejected"][idx],
                        "chosen_mask": masks["chosen"][idx], "rejected_mask": masks["rejected"][idx],
                        "ref_chosen": ref[idx, 0], "ref_rejected": ref[idx, 1],
                        "num_pairs": np.full(len(idx), len(idx), np.float32)}
            return {k: jax.device_put(v, _row_sharding(mesh, rules, v.shape)) for k, v in host.items()}

        loss_fn = make_loss(sup.objective, graphdef, rest, sup.beta, chunk)
        replicated = NamedSharding(mesh, PartitionSpec())
        step_fn = jax.jit(ts.make_update(loss_fn, tx, cfg.run.micro_batches),
                          in_shardings=(state_shardings, {k: v.sharding for k, v in rows_at(0).items()}),
                          out_shardings=(state_shardings, replicated), donate_argnums=(0,))

        # ---- checkpoints (resume), metrics, validation
        checkpoints, state, saved = open_checkpoints(stack, cfg, out, state, state_shardings, resume,
                                                     {"objective": sup.objective})
        start = int(state.step)
        if start >= total:
            raise SupervisedError(f"the run is already at step {start} >= {total}; raise steps to extend it")
        writer, progress = open_recorder(stack, cfg, out, start, total, f"{cfg.name} ({sup.objective})")
        validate = None
        if val_tasks:
            validate = _validator(stack, cfg, tokenizer, mesh, rules, graphdef, rest, val_tasks)

        def one_step(state: ts.TrainState, step: int, timer: M.StageTimer) -> tuple[ts.TrainState, dict]:
            with msh.use_mesh(mesh, rules):
                state, metrics = step_fn(state, rows_at(step))
            metrics = {f"{sup.objective}/{k}": float(v) for k, v in jax.device_get(metrics).items()}
            metrics["epoch"] = step // per_epoch
            metrics["learning_rate"] = float(ts.make_schedule(cfg.optimizer)(step))
            return state, metrics

        history: list[dict[str, float]] = []
        loop = Loop(total, start, cfg.run.eval_every, cfg.run.save_every, validate=validate,
                    checkpoints=checkpoints, writer=writer, progress=progress,
                    progress_keys=(f"{sup.objective}/loss",),
                    on_record=lambda done, metrics, validated: history.append(metrics),
                    pending=(saved or {}).get("pending"))
        run_loop(loop, state, one_step)
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


def _validator(stack: contextlib.ExitStack, cfg: Config, tokenizer: Any, mesh, rules, graphdef: nnx.GraphDef,
               rest: nnx.State, tasks: list) -> Callable[[ts.TrainState, int], dict[str, float]]:
    """validate(state, done): `jaxrl.validate` with the configured engine (made at the first call, weights
    pushed at the next ones) and a fleet of the run's own."""
    from jaxrl.validate import validate

    _, scorer = open_verifier(stack, cfg)
    engine = None

    def run(state: ts.TrainState, done: int) -> dict[str, float]:
        nonlocal engine
        model = nnx.merge(graphdef, state.params, rest)
        if engine is None:
            engine = open_engine(stack, cfg, model, tokenizer, mesh, rules)
        else:
            engine.update_weights(model, step=done)
        return validate(engine, tokenizer, scorer, tasks, cfg, cfg.run.seed + done)

    return run


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
    if hosts.is_primary():
        write_jsonl(path, ({**{k: r[k] for k in keep if k in r}, "ref_chosen_logp": float(out[i, 0]),
                            "ref_rejected_logp": float(out[i, 1])} for i, r in enumerate(rows)))
    return out
