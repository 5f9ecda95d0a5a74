"""The policy update: one jitted, sharded `(state, batch) -> (state, metrics)`.

The same function runs on one CPU, fake CPU devices, a GPU node and a TPU pod:
parameter and optimizer-state shardings come from `jax.eval_shape` plus the
logical-axis rules of `models.sharding` (parameters over fsdp/tensor), the batch
is split over data and fsdp, and the state buffers are donated.

Inside the step:
  1. loss weights of the chosen aggregation, computed once on the whole batch;
  2. micro-batches (strided rows, so every device keeps its share) scanned with
     gradient accumulation; per micro-batch the model yields final hidden states
     and token log-probs come chunk by chunk (`losses.chunked_logprobs`);
  3. global-norm clipping and AdamW with warmup then a constant or cosine schedule.

Because the weights are normalized over the whole batch, the accumulated gradient
equals the full-batch gradient for every aggregation mode and micro-batch count.

The model is any NNX module with `model(tokens, segment_ids=..., return_hidden=True)`
returning final-normed hidden states `[B, T, D]` and `model.lm_head_weight()`
returning `[V, D]` (`models.qwen3.Qwen3`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl import losses
from jaxrl.config import LossConfig, OptimizerConfig
from models import moe
from models import sharding as msh


@dataclasses.dataclass(frozen=True)
class TrainStepConfig:
    """One policy update: the loss, the optimizer and the number of micro-batches.

    Attributes:
        logp_from: no loss-mask token lies before this position (the batch layout puts
            every completion after a common prompt length), so log-probs are computed
            from there on only: prompt positions skip the vocabulary projection.
    """

    loss: LossConfig = LossConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    micro_batches: int = 1
    logp_from: int = 0

    def __post_init__(self):
        if self.micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {self.micro_batches}")
        if self.logp_from < 0:
            raise ValueError(f"logp_from must be >= 0, got {self.logp_from}")


@flax.struct.dataclass
class Batch:
    """One update's rollouts, B rows of T tokens (prompt, completion, padding).

    Attributes:
        tokens_BxT: token ids.
        loss_mask_BxT: 1 on completion tokens, 0 on prompt and padding.
        old_logp_BxT: sampler log-probs, aligned with the tokens (`losses` conventions).
        advantages_BxS: one advantage per sequence; S = 1 unless rows are packed.
        ref_logp_BxT: reference-policy log-probs (for the KL term), or None.
        segment_ids_BxT: packed rows: sequence s of a row has id s + 1, padding 0; or None.
    """

    tokens_BxT: jax.Array
    loss_mask_BxT: jax.Array
    old_logp_BxT: jax.Array
    advantages_BxS: jax.Array
    ref_logp_BxT: jax.Array | None = None
    segment_ids_BxT: jax.Array | None = None


@flax.struct.dataclass
class TrainState:
    """What the step updates: the step counter, parameters and optimizer state."""

    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState


def make_schedule(cfg: OptimizerConfig) -> Callable[[jax.Array], jax.Array]:
    """lr(s) = lr · min(1, (s + 1)/W) · d(s); d = 1, or a cosine from 1 to min_lr_ratio after W."""

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = jnp.minimum(1.0, (step + 1.0) / max(cfg.warmup_steps, 1))
        if cfg.schedule == "constant":
            return cfg.learning_rate * warm
        span = cfg.total_steps - cfg.warmup_steps
        progress = jnp.clip((step - cfg.warmup_steps) / span, 0.0, 1.0)
        cosine = 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return cfg.learning_rate * warm * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)

    return schedule


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on the schedule."""
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm),
        optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
    )


def _sequence_index(batch: Batch) -> jax.Array:
    if batch.segment_ids_BxT is None:
        return jnp.zeros(batch.tokens_BxT.shape, jnp.int32)
    return jnp.maximum(batch.segment_ids_BxT.astype(jnp.int32) - 1, 0)


def token_advantages(batch: Batch) -> jax.Array:
    """Each token's advantage: that of the sequence it belongs to."""
    return jnp.take_along_axis(batch.advantages_BxS, _sequence_index(batch), axis=1)


def policy_loss(
    params: nnx.State,
    graphdef: nnx.GraphDef,
    rest: nnx.State,
    batch: Batch,
    weights_BxT: jax.Array,
    token_weights_BxT: jax.Array,
    cfg: LossConfig,
    logp_from: int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The weighted PPO loss (plus KL) of one micro-batch, and its weighted metric sums.

    L = Σ_{b,t} w_{bt} · (ℓ^clip_{bt} + β · KL_{bt}). `weights_BxT` come from the whole
    batch, so micro-batch losses and metrics add up to the full-batch ones;
    `token_weights_BxT` (token-mean) weigh the metrics entropy, clip fraction and the mean
    sampler-trainer log-prob gap; metrics named `*_max` are maxima, not sums. Log-probs
    before position `logp_from` (where the mask must be 0) are not computed and read 0.
    """
    model = nnx.merge(graphdef, params, rest)
    routing = None
    if cfg.router_aux_coef > 0:  # an MoE policy: also its routing (experts, router logits)
        hidden_BxTxD, routing = model(batch.tokens_BxT, segment_ids=batch.segment_ids_BxT, return_hidden=True,
                                      return_routing=True)
    else:
        hidden_BxTxD = model(batch.tokens_BxT, segment_ids=batch.segment_ids_BxT, return_hidden=True)
    hidden_BxTxD = msh.constrain(hidden_BxTxD, ("batch", "seq", "act_embed"))
    start = max(logp_from - 1, 0)  # the position that predicts token `logp_from`
    logp_BxT, entropy_BxT = losses.chunked_logprobs(
        hidden_BxTxD[:, start:], model.lm_head_weight(), batch.tokens_BxT[:, start:], cfg.logp_chunk,
        cfg.temperature)
    logp_BxT, entropy_BxT = (jnp.pad(x, ((0, 0), (start, 0))) for x in (logp_BxT, entropy_BxT))
    mask_BxT = batch.loss_mask_BxT > 0
    frozen_logp_BxT = jax.lax.stop_gradient(logp_BxT)
    # Outside the mask the stored log-probs are arbitrary; keep exp() finite there.
    old_logp_BxT = jnp.where(mask_BxT, batch.old_logp_BxT, frozen_logp_BxT)
    pg_BxT, clipped_BxT = losses.ppo_clip_loss(
        logp_BxT, old_logp_BxT, token_advantages(batch), cfg.clip_low, cfg.clip_high, cfg.dual_clip)
    pg_loss = (weights_BxT * pg_BxT).sum()
    metrics = {
        "pg_loss": pg_loss,
        "entropy": (token_weights_BxT * entropy_BxT).sum(),
        "clip_frac": (token_weights_BxT * clipped_BxT).sum(),
        "ppo_kl": (token_weights_BxT * losses.kl_penalty(frozen_logp_BxT, old_logp_BxT, "k3")).sum(),
        # How far the sampler's log-probs are from the trainer's (same weights: exactly 0).
        "logp_gap_mean": (token_weights_BxT * jnp.abs(frozen_logp_BxT - old_logp_BxT)).sum(),
        "logp_gap_max": jnp.abs(frozen_logp_BxT - old_logp_BxT).max(),
    }
    loss = pg_loss
    if cfg.kl_coef > 0:
        ref_logp_BxT = jnp.where(mask_BxT, batch.ref_logp_BxT, frozen_logp_BxT)
        kl = (weights_BxT * losses.kl_penalty(logp_BxT, ref_logp_BxT, cfg.kl_estimator)).sum()
        metrics["kl"] = kl
        loss = loss + cfg.kl_coef * kl
    if routing is not None:
        experts, router_logits = routing
        aux = moe.load_balancing_loss(router_logits, experts, router_logits.shape[-1], mask_BxT[:, :, None])
        # Computed per micro-batch, weighted by its share of the batch's completion tokens.
        share = token_weights_BxT.sum()
        metrics["router_aux"] = share * aux
        loss = loss + cfg.router_aux_coef * share * aux
    metrics["loss"] = loss
    return loss, metrics


def _split_micro(x: jax.Array, m: int) -> jax.Array:
    """[B, ...] -> [M, B/M, ...] taking rows m, m + M, m + 2M, ... into micro-batch m."""
    b = x.shape[0]
    if b % m:
        raise ValueError(f"batch of {b} rows does not split into {m} micro-batches")
    return x.reshape(b // m, m, *x.shape[1:]).swapaxes(0, 1)


def accumulated_gradients(loss_fn: Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]], params: Any,
                          batch: Any, micro_batches: int) -> tuple[Any, dict[str, jax.Array]]:
    """Gradients and metrics of `loss_fn(params, batch)` accumulated over `micro_batches` strided row slices.

    `loss_fn` must be additive over rows (its caller normalizes by the whole batch), so the sum over
    micro-batches is the full batch's loss; metrics are summed too, except those named `*_max` (maxima).
    Every leaf of `batch` has rows on axis 0; gradients accumulate in float32.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro_batches == 1:
        (_, metrics), grads = grad_fn(params, batch)
        return grads, metrics
    micro = jax.tree.map(lambda x: _split_micro(x, micro_batches), batch)

    def accumulate(grads, mb):
        mb = jax.tree.map(lambda x: msh.constrain(x, ("batch",) + (None,) * (x.ndim - 1)), mb)
        (_, metrics), g = grad_fn(params, mb)
        return jax.tree.map(lambda acc, x: acc + x.astype(jnp.float32), grads, g), metrics

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    grads, metrics = jax.lax.scan(accumulate, zeros, micro)
    return grads, {k: v.max(0) if k.endswith("_max") else v.sum(0) for k, v in metrics.items()}


def apply_gradients(state: TrainState, grads: Any, tx: optax.GradientTransformation) -> TrainState:
    """The optimizer's update of `state` on `grads`, one step on."""
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state)


def make_update(loss_fn: Callable[[Any, Any], tuple[jax.Array, dict[str, jax.Array]]],
                tx: optax.GradientTransformation, micro_batches: int = 1
                ) -> Callable[[TrainState, Any], tuple[TrainState, dict[str, jax.Array]]]:
    """update(state, rows) -> (state, metrics): one optimizer step on `loss_fn`'s gradient accumulated over
    `micro_batches` (`accumulated_gradients`), with the gradient's global norm among the metrics.

    The supervised objectives (SFT, DPO) and the demo's SFT train with it; the RL update is
    `train_step`, the same steps around the policy loss.
    """

    def update(state: TrainState, rows: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        grads, metrics = accumulated_gradients(loss_fn, state.params, rows, micro_batches)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return apply_gradients(state, grads, tx), metrics

    return update


def train_step(
    state: TrainState,
    batch: Batch,
    *,
    graphdef: nnx.GraphDef,
    rest: nnx.State,
    tx: optax.GradientTransformation,
    cfg: TrainStepConfig,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One policy update with gradient accumulation over `cfg.micro_batches` (not jitted)."""
    if cfg.loss.kl_coef > 0 and batch.ref_logp_BxT is None:
        raise ValueError("kl_coef > 0 needs ref_logp_BxT in the batch")
    weights_BxT = losses.loss_weights(batch.loss_mask_BxT, cfg.loss.agg_mode, batch.segment_ids_BxT,
                                      cfg.loss.norm_constant)
    token_weights_BxT = losses.loss_weights(batch.loss_mask_BxT, "token-mean")
    m = cfg.micro_batches
    micro = jax.tree.map(lambda x: _split_micro(x, m), (batch, weights_BxT, token_weights_BxT))

    grad_fn = jax.value_and_grad(policy_loss, has_aux=True)

    def accumulate(grads, mb):
        mb_batch, mb_w, mb_tw = jax.tree.map(lambda x: msh.constrain(x, ("batch",) + (None,) * (x.ndim - 1)), mb)
        (_, metrics), g = grad_fn(state.params, graphdef, rest, mb_batch, mb_w, mb_tw, cfg.loss, cfg.logp_from)
        return jax.tree.map(lambda acc, x: acc + x.astype(jnp.float32), grads, g), metrics

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)  # fp32 accumulation
    grads, metrics = jax.lax.scan(accumulate, zeros, micro)
    metrics = {k: v.max(0) if k.endswith("_max") else v.sum(0) for k, v in metrics.items()}

    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics |= {
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": make_schedule(cfg.optimizer)(state.step),
        "tokens": batch.loss_mask_BxT.sum(),
    }
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def _leaf_sharding(mesh: Mesh, rules: Sequence) -> Callable[[Any], NamedSharding]:
    def one(x):
        names = ("batch",) + (None,) * (len(x.shape) - 1) if len(x.shape) else ()
        return NamedSharding(mesh, msh.logical_to_spec(names, rules, x.shape, mesh))

    return one


def batch_shardings(abstract_batch: Batch, mesh: Mesh, rules: Sequence = msh.RULES) -> Batch:
    """Rows of every batch array split over the mesh axes of the logical `batch` axis."""
    return jax.tree.map(_leaf_sharding(mesh, rules), abstract_batch)


def state_shardings(abstract_state: TrainState, mesh: Mesh, rules: Sequence = msh.RULES) -> TrainState:
    """Parameters and Adam moments by their logical axes; step and counters replicated."""
    return TrainState(
        step=NamedSharding(mesh, PartitionSpec()),
        params=msh.state_shardings(abstract_state.params, mesh, rules),
        opt_state=msh.state_shardings(abstract_state.opt_state, mesh, rules),
    )


def init_train_state(
    model: nnx.Module, tx: optax.GradientTransformation, mesh: Mesh, rules: Sequence = msh.RULES
) -> tuple[TrainState, nnx.GraphDef, nnx.State]:
    """Split `model` into (graphdef, params, rest) and build the sharded train state.

    Returns:
        (state, graphdef, rest): `rest` holds the model's non-parameter variables.
    """
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def build(p):
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p))

    abstract = jax.eval_shape(build, params)
    shardings = state_shardings(abstract, mesh, rules)
    params = jax.device_put(params, shardings.params)
    with msh.use_mesh(mesh, rules):
        state = jax.jit(build, out_shardings=shardings)(params)
    return state, graphdef, rest


@dataclasses.dataclass(frozen=True)
class ShardedStep:
    """The jitted step and its mesh; calling or lowering it activates the mesh and rules.

    Attributes:
        jitted: `jax.jit(step, in_shardings, out_shardings, donate_argnums=0)`.
        mesh: the device mesh.
        rules: logical-axis rules, so that activations are constrained while tracing.
    """

    jitted: Any
    mesh: Mesh
    rules: tuple

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        with msh.use_mesh(self.mesh, self.rules):
            return self.jitted(state, batch)

    def lower(self, state: Any, batch: Any) -> jax.stages.Lowered:
        """Lower ahead of time (for `.compile()`, cost and memory analysis)."""
        with msh.use_mesh(self.mesh, self.rules):
            return self.jitted.lower(state, batch)


def jit_train_step(
    graphdef: nnx.GraphDef,
    rest: nnx.State,
    tx: optax.GradientTransformation,
    cfg: TrainStepConfig,
    mesh: Mesh,
    abstract_state: TrainState,
    abstract_batch: Batch,
    rules: Sequence = msh.RULES,
    wrap: Callable[[Callable], Callable] = lambda f: f,
) -> ShardedStep:
    """The jitted, sharded step; the state argument is donated.

    `wrap` decorates the Python step before jit (tests pass `chex.assert_max_traces`).
    """
    s_shard = state_shardings(abstract_state, mesh, rules)
    b_shard = batch_shardings(abstract_batch, mesh, rules)
    replicated = NamedSharding(mesh, PartitionSpec())
    step = wrap(lambda state, batch: train_step(state, batch, graphdef=graphdef, rest=rest, tx=tx, cfg=cfg))
    jitted = jax.jit(step, in_shardings=(s_shard, b_shard), out_shardings=(s_shard, replicated),
                     donate_argnums=(0,))
    return ShardedStep(jitted, mesh, tuple(rules))
