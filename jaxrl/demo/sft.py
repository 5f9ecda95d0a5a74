"""Supervised fine-tuning of the demo base policy: cross-entropy on completion tokens.

Pairs are (prompt, target program) from `domain.sft_target`: the minimal fix,
or with probability `rewrite_share` the over-editing rewrite, so the base
policy both passes often and over-edits often; a share `miss_share` of the
minimal attempts miss the bug (answer the buggy code unchanged), meant to
make tight answers less reliable than rewrites (docs/demo.md measures
whether they are). The loss is the mean negative
log-likelihood of the completion tokens (the answer block and <|im_end|>),
computed with the same chunked log-probs as the RL train step.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl import losses
from jaxrl.demo import domain, prompt
from jaxrl.demo import thinking as demo_thinking
from jaxrl.demo.tokenizer import DemoTokenizer
from jaxrl.loop import Loop, run_loop
from jaxrl.train_step import OptimizerConfig, TrainState, make_optimizer, make_update
from models import sharding as msh


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """The SFT run.

    Attributes:
        steps: optimizer steps.
        batch_size: sequences per step.
        learning_rate: peak rate of the warm-up + cosine schedule.
        warmup_steps: linear warm-up steps.
        rewrite_share: share of targets that are the over-editing rewrite.
        miss_share: share of the other (minimal) targets that miss the bug: the buggy code unchanged.
        select_every: with a validation set, the candidate bases are the parameters after every
            `select_every`-th step of the second half of the run and after the last step; the one
            of lowest validation loss is kept (`train_sft_best`).
    """

    steps: int = 1300
    batch_size: int = 32
    learning_rate: float = 5e-3
    warmup_steps: int = 30
    rewrite_share: float = 0.7
    miss_share: float = 0.15
    select_every: int = 100

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1 or self.learning_rate <= 0 or self.select_every < 1:
            raise ValueError("steps, batch_size, learning_rate and select_every must be positive")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError("need 0 <= warmup_steps < steps")
        if not (0 <= self.rewrite_share <= 1 and 0 <= self.miss_share <= 1):
            raise ValueError("rewrite_share and miss_share must be in [0, 1]")


def encode_pairs(tokenizer: DemoTokenizer, pairs: Sequence[tuple[list[dict[str, str]], str]]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded token ids `[N, T]` of prompt + answer + <|im_end|>, and the mask of the answer part."""
    rows, masks = [], []
    for messages, completion in pairs:
        p = tokenizer.encode(tokenizer.render_chat(messages))
        c = tokenizer.encode(completion) + [tokenizer.eos_id]
        rows.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    t = max(map(len, rows))
    tokens = np.full((len(rows), t), tokenizer.pad_id, np.int32)
    mask = np.zeros((len(rows), t), np.float32)
    for i, (row, m) in enumerate(zip(rows, masks)):
        tokens[i, :len(row)], mask[i, :len(m)] = row, m
    return tokens, mask


def sft_pairs(samples: Sequence[domain.Sample], rewrite_share: float, seed: int, miss_share: float = 0.0,
              thinking: bool = False) -> tuple[list[tuple[list[dict[str, str]], str]], dict[str, float]]:
    """The (messages, answer) pairs of `samples`, and the shares of targets by kind.

    Shares: "overedit" (rewrites that differ from the minimal fix), "rewrite", "fix", "miss".
    With `thinking`, each answer follows a think block about its kind (`jaxrl.demo.thinking`),
    drawn from its own random stream, so the targets are those of the variant without.
    """
    rng = random.Random(f"sft-targets:{seed}")
    think_rng = random.Random(f"sft-thinking:{seed}")
    pairs, counts = [], {"overedit": 0, "rewrite": 0, "fix": 0, "miss": 0}
    for s in samples:
        target, kind = domain.sft_target(rng, s, rewrite_share, miss_share)
        counts[kind] += 1
        counts["overedit"] += kind == "rewrite" and target != s.task.solution
        answer = prompt.answer(target)
        pairs.append((prompt.task_messages(s.task),
                      demo_thinking.completion(think_rng, s, kind, answer) if thinking else answer))
    return pairs, {k: v / max(len(samples), 1) for k, v in counts.items()}


def nll(model: nnx.Module, tokens_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    """Mean −log π(token) over the masked (completion) tokens."""
    hidden_BxTxD = model(tokens_BxT, return_hidden=True)
    logp_BxT, _ = losses.chunked_logprobs(hidden_BxTxD, model.lm_head_weight(), tokens_BxT,
                                          chunk_size=tokens_BxT.shape[1])
    return -(logp_BxT * mask_BxT).sum() / jnp.maximum(mask_BxT.sum(), 1.0)


def data_mesh(batch_size: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """`models.sharding.make_mesh` with only the data axis larger than 1: the most of
    `devices` (default: all) that split `batch_size` evenly.

    `precisecoder demo --cpu-devices N` splits the CPU into N devices: on 2 cores, two
    halves of a batch run side by side faster than one batch over two threads.
    """
    devices = list(jax.devices() if devices is None else devices)
    n = max(k for k in range(1, len(devices) + 1) if batch_size % k == 0)
    return msh.make_mesh(data=n, fsdp=1, tensor=1, devices=devices[:n])


def candidate_steps(cfg: SFTConfig) -> list[int]:
    """The steps after which a base is a candidate: every `select_every`-th of the second half, and the last."""
    return sorted({k for k in range(cfg.select_every, cfg.steps, cfg.select_every) if 2 * k >= cfg.steps}
                  | {cfg.steps})


def train_sft(model: nnx.Module, tokens_NxT: np.ndarray, mask_NxT: np.ndarray, cfg: SFTConfig, seed: int,
              on_step: Callable[[int, float], None] | None = None,
              devices: Sequence[jax.Device] | None = None) -> list[float]:
    """Train `model` in place on the pairs; returns the loss of every step.

    Batches are drawn by a seeded permutation, epoch after epoch, and split over
    `data_mesh(batch_size, devices)` (parameters replicated): the split changes
    the speed, not the result.
    """
    return _train(model, tokens_NxT, mask_NxT, cfg, seed, on_step, devices, None)[0]


def train_sft_best(model: nnx.Module, tokens_NxT: np.ndarray, mask_NxT: np.ndarray, val_tokens_VxT: np.ndarray,
                   val_mask_VxT: np.ndarray, cfg: SFTConfig, seed: int,
                   on_step: Callable[[int, float], None] | None = None,
                   devices: Sequence[jax.Device] | None = None) -> tuple[list[float], dict[str, Any]]:
    """`train_sft`, then `model` holds the candidate (`candidate_steps`) of lowest validation loss.

    The criterion is fixed before any run and looks at the SFT validation pairs only,
    never at the held-out test sets. Returns the training losses and
    `{"step": chosen step, "val_loss": its loss, "val_losses": {step: loss}}`.
    """
    return _train(model, tokens_NxT, mask_NxT, cfg, seed, on_step, devices, (val_tokens_VxT, val_mask_VxT))


def _train(model: nnx.Module, tokens_NxT: np.ndarray, mask_NxT: np.ndarray, cfg: SFTConfig, seed: int,
           on_step: Callable[[int, float], None] | None, devices: Sequence[jax.Device] | None,
           val: tuple[np.ndarray, np.ndarray] | None) -> tuple[list[float], dict[str, Any]]:
    """The trainers' loop (`jaxrl.loop.run_loop`) and update (`train_step.make_update`) on the demo's
    pairs, with the policy kept in memory: no checkpoints, and the candidates' validation losses as its
    validation."""
    tx = make_optimizer(OptimizerConfig(
        learning_rate=cfg.learning_rate, warmup_steps=cfg.warmup_steps, schedule="cosine",
        total_steps=cfg.steps, min_lr_ratio=0.1, weight_decay=0.0))
    mesh = data_mesh(cfg.batch_size, devices)
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params, rest = jax.device_put((params, rest), replicated)
    state = TrainState(step=jax.device_put(jnp.zeros((), jnp.int32), replicated), params=params,
                       opt_state=jax.device_put(tx.init(params), replicated))

    def loss(p, rows):
        value = nll(nnx.merge(graphdef, p, rest), rows["tokens"], rows["mask"])
        return value, {"loss": value}

    update = jax.jit(make_update(loss, tx))
    val_loss = jax.jit(lambda p, tokens, mask: nll(nnx.merge(graphdef, p, rest), tokens, mask))
    candidates = set(candidate_steps(cfg)) if val is not None else set()
    val_batch = jax.device_put(val, replicated) if val is not None else None
    val_losses: dict[int, float] = {}
    best: list = []  # (step, parameters) of the candidate of lowest validation loss
    rng = np.random.default_rng(seed)
    n, order, pos, history = len(tokens_NxT), np.arange(0), 0, []

    def one_step(state: TrainState, i: int, timer: Any) -> tuple[TrainState, dict[str, float]]:
        nonlocal order, pos
        if pos + cfg.batch_size > len(order):
            order, pos = rng.permutation(n), 0
        idx = order[pos:pos + cfg.batch_size]
        pos += cfg.batch_size
        tokens, mask = jax.device_put((tokens_NxT[idx], mask_NxT[idx]), split)
        state, metrics = update(state, {"tokens": tokens, "mask": mask})
        history.append(float(metrics["loss"]))
        if on_step is not None:
            on_step(i, history[-1])
        return state, {"loss": history[-1]}

    def select(state: TrainState, done: int) -> dict[str, float]:
        if done not in candidates:
            return {}
        val_losses[done] = float(val_loss(state.params, *val_batch))
        if not best or val_losses[done] < val_losses[best[0]]:
            best[:] = [done, jax.tree.map(jnp.copy, state.params)]
        return {"val_loss": val_losses[done]}

    state, _ = run_loop(Loop(cfg.steps, eval_every=1, validate=select if candidates else None), state, one_step)
    nnx.update(model, best[1] if best else state.params)
    selection = {} if not best else {"step": best[0], "val_loss": val_losses[best[0]], "val_losses": val_losses}
    return history, selection
