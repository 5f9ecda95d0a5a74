"""Advantage estimators: pure, jittable array -> array functions and a registry.

Rewards arrive as a tensor `rewards_NxGxK`: N prompts, G rollouts per prompt (a
group), K reward terms (PreciseCoder: `[unit, f1]` with weights `[1 - λ, λ]`).
Every estimator returns one advantage per rollout, `adv_NxG`.

Statistics are population statistics (ddof = 0) unless an estimator's `ddof`
says otherwise; `eps` is added to the standard deviation, so a term that is
constant within its group contributes exactly 0.

An estimator is `f(rewards_NxGxK, lengths_NxG, **options) -> adv_NxG`: the reward
tensor, the number of completion tokens of every rollout (for token-weighted
statistics) and the keyword options of the config; one that declares `weights_K`
also receives the term weights. Register one with a decorated function:

    @register_estimator("my_estimator")
    def my_estimator(rewards_NxGxK, lengths_NxG, weights_K, scale: float = 1.0):
        return scale * drgrpo(rewards_NxGxK @ weights_K)

and select it with `AdvantageConfig(name="my_estimator", options={"scale": 2.0})`;
a training run reaches it (or a plug-in `module:function`, no registration needed)
through `algorithm.estimator` (`jaxrl.algorithms`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

Estimator = Callable[..., jax.Array]

# EA-GRPO's accuracy gate α and penalty weight β (docs/reward.md, "Baseline rewards").
EA_ALPHA, EA_BETA = 0.8, 0.05

_ESTIMATORS: dict[str, Estimator] = {}
_POSITIONAL = ("rewards_NxGxK", "lengths_NxG")


def _group_std(rewards_NxGx: jax.Array, ddof: int) -> jax.Array:
    g = rewards_NxGx.shape[1]
    if g <= ddof:
        raise ValueError(f"a group of {g} has no std with ddof={ddof}")
    return rewards_NxGx.std(axis=1, keepdims=True, ddof=ddof)


def _shift(rewards_NxGx: jax.Array) -> jax.Array:
    """Rewards minus each group's first one: the same statistics after centring, but a constant
    group becomes exact zeros, so its advantage is exactly 0 (a float32 mean of G equal values
    can be off by an ulp, which the std + ε division would blow up to ~0.1)."""
    return rewards_NxGx - rewards_NxGx[:, :1]


def grpo(rewards_NxG: jax.Array, eps: float = 1e-6, ddof: int = 0) -> jax.Array:
    """GRPO: rewards standardized within each group.

    A_i = (r_i − mean_j r_j) / (std_j r_j + ε); population std (ddof = 0) by default,
    ddof = 1 gives the unbiased std of verl and TRL.
    """
    shifted_NxG = _shift(rewards_NxG)
    mean_Nx1 = shifted_NxG.mean(axis=1, keepdims=True)
    return (shifted_NxG - mean_Nx1) / (_group_std(shifted_NxG, ddof) + eps)


def drgrpo(rewards_NxG: jax.Array) -> jax.Array:
    """Dr.GRPO: rewards centred within each group, no division by the std.

    A_i = r_i − mean_j r_j.
    """
    return rewards_NxG - rewards_NxG.mean(axis=1, keepdims=True)


def rloo(rewards_NxG: jax.Array) -> jax.Array:
    """REINFORCE leave-one-out: each reward minus the mean of the other G − 1.

    A_i = r_i − (Σ_{j≠i} r_j) / (G − 1) = G / (G − 1) · (r_i − mean_j r_j).
    A group of size 1 has no other rollout to compare with: its advantage is 0.
    """
    g = rewards_NxG.shape[1]
    if g == 1:
        return jnp.zeros_like(rewards_NxG)
    return g / (g - 1) * drgrpo(rewards_NxG)


def _batch_standardize(
    x_NxG: jax.Array, eps: float, lengths_NxG: jax.Array | None
) -> jax.Array:
    """(x − μ) / (σ + ε) over all N·G values, optionally weighted by token counts."""
    x_NxG = x_NxG - x_NxG.reshape(-1)[0]  # a constant batch standardizes to exact zeros
    if lengths_NxG is None:
        return (x_NxG - x_NxG.mean()) / (x_NxG.std() + eps)
    w_NxG = lengths_NxG.astype(x_NxG.dtype)
    total = jnp.maximum(w_NxG.sum(), 1.0)
    mean = (w_NxG * x_NxG).sum() / total
    var = (w_NxG * jnp.square(x_NxG - mean)).sum() / total
    return (x_NxG - mean) / (jnp.sqrt(var) + eps)


def gdpo(
    rewards_NxGxK: jax.Array,
    weights_K: jax.Array,
    eps: float = 1e-6,
    lengths_NxG: jax.Array | None = None,
    ddof: int = 0,
) -> jax.Array:
    """GDPO: group-decoupled normalization of each reward term, then batch standardization.

    Â^k_i = (r^k_i − mean_j r^k_j) / (std_j r^k_j + ε)    within each group, per term k
    S_i   = Σ_k w_k · Â^k_i
    A_i   = (S_i − μ_B) / (σ_B + ε)                         over all N·G rollouts

    With `lengths_NxG` (completion tokens per rollout), μ_B and σ_B are token-weighted
    (every token of a rollout carries its advantage; verl's `masked_whiten` variant,
    here with population variance and σ + ε like the rest of this module). `ddof`
    applies to the group std (the batch statistics stay population ones).
    """
    shifted_NxGxK = _shift(rewards_NxGxK)
    mean_Nx1xK = shifted_NxGxK.mean(axis=1, keepdims=True)
    per_term_NxGxK = (shifted_NxGxK - mean_Nx1xK) / (_group_std(shifted_NxGxK, ddof) + eps)
    summed_NxG = per_term_NxGxK @ jnp.asarray(weights_K, rewards_NxGxK.dtype)
    return _batch_standardize(summed_NxG, eps, lengths_NxG)


def ea_grpo_rewards(
    unit_NxG: jax.Array,
    edited_lines_NxG: jax.Array,
    alpha: float = EA_ALPHA,
    beta: float = EA_BETA,
) -> jax.Array:
    """EA-GRPO reward: an edit-size penalty on passing rollouts, gated on group accuracy.

    T = 1[mean_j u_j ≥ α];  μ_c, σ_c = mean and population std of D over passing rollouts;
    P_i = sigmoid((D_i − μ_c) / σ_c), or 1/2 when σ_c = 0;
    R_i = u_i · (1 − T · β · P_i).
    Edited lines of failing or invalid rollouts are ignored (any value, NaN included).
    Follow with `grpo`.
    """
    unit_NxG = unit_NxG.astype(jnp.float32)
    passing_NxG = unit_NxG > 0
    gate_Nx1 = (unit_NxG.mean(axis=1, keepdims=True) >= alpha).astype(jnp.float32)
    lines_NxG = jnp.where(passing_NxG, edited_lines_NxG.astype(jnp.float32), 0.0)
    n_pass_Nx1 = jnp.maximum(passing_NxG.sum(axis=1, keepdims=True), 1)
    mu_Nx1 = lines_NxG.sum(axis=1, keepdims=True) / n_pass_Nx1
    dev_NxG = jnp.where(passing_NxG, lines_NxG - mu_Nx1, 0.0)
    sigma_Nx1 = jnp.sqrt(jnp.square(dev_NxG).sum(axis=1, keepdims=True) / n_pass_Nx1)
    safe_sigma_Nx1 = jnp.where(sigma_Nx1 > 0, sigma_Nx1, 1.0)
    penalty_NxG = jnp.where(sigma_Nx1 > 0, jax.nn.sigmoid(dev_NxG / safe_sigma_Nx1), 0.5)
    return unit_NxG * (1.0 - gate_Nx1 * beta * penalty_NxG)


def grpo_clean_rows(
    unit_NxG: jax.Array,
    edited_lines_NxG: jax.Array,
    clean_N: jax.Array,
    eps: float = 1e-6,
) -> jax.Array:
    """GRPO + clean rows: buggy rows use `unit` alone; clean rows also reward small edits.

    A_i = z(u)_i on a buggy row, A_i = z(u)_i + z(−ℓ)_i on a clean row, where
    z(x)_i = (x_i − mean_j x_j) / (std_j x_j + ε) within the group.
    `edited_lines_NxG` holds ℓ itself (≥ 0, as `reward.score.baseline_terms` gives
    it, an invalid rollout counting as the length of C): this function alone
    owns the minus sign, so on a clean row fewer edited lines means more advantage.
    """
    unit_adv_NxG = grpo(unit_NxG.astype(jnp.float32), eps)
    lines_adv_NxG = grpo(-edited_lines_NxG.astype(jnp.float32), eps)
    return unit_adv_NxG + jnp.where(clean_N[:, None], lines_adv_NxG, 0.0)


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Register `fn(rewards_NxGxK, lengths_NxG, **options) -> adv_NxG` as `name`."""

    def decorate(fn: Estimator) -> Estimator:
        if name in _ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        params = list(inspect.signature(fn).parameters)
        if tuple(params[:2]) != _POSITIONAL:
            raise TypeError(f"estimator {name!r} must take {_POSITIONAL} first, got {params[:2]}")
        _ESTIMATORS[name] = fn
        return fn

    return decorate


def estimator_names() -> list[str]:
    """Names of the registered estimators."""
    return sorted(_ESTIMATORS)


def get_estimator(name: str) -> Estimator:
    """The estimator registered as `name`."""
    if name not in _ESTIMATORS:
        raise KeyError(f"unknown advantage estimator {name!r}; registered: {estimator_names()}")
    return _ESTIMATORS[name]


def takes_weights(fn: Estimator) -> bool:
    """Whether `fn` declares `weights_K` (then it receives the term weights)."""
    return "weights_K" in inspect.signature(fn).parameters


def check_options(fn: Estimator, options: Mapping[str, Any], where: str = "options") -> None:
    """Raise `ValueError` naming the first option `fn` does not accept, or a signature it cannot be called with."""
    sig = inspect.signature(fn)
    params = sig.parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        accepted = set(params) - {"weights_K"} - set(list(params)[:2])
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ValueError(f"{where}: {unknown[0]!r} is not accepted; it takes {sorted(accepted) or 'no options'}")
    try:
        sig.bind(None, None, **options, **({"weights_K": None} if takes_weights(fn) else {}))
    except TypeError as e:
        raise ValueError(f"{where}: cannot be called as f(rewards_NxGxK, lengths_NxG, **options) ({e})") from None


def call_estimator(fn: Estimator, rewards_NxGxK: jax.Array, lengths_NxG: jax.Array, weights_K: jax.Array,
                   options: Mapping[str, Any]) -> jax.Array:
    """`fn(rewards, lengths, **options)`, with `weights_K=` where `fn` takes it."""
    extra = {"weights_K": weights_K} if takes_weights(fn) else {}
    return fn(rewards_NxGxK, lengths_NxG, **options, **extra)


def _weighted(rewards_NxGxK: jax.Array, weights_K: jax.Array) -> jax.Array:
    return rewards_NxGxK @ weights_K


@register_estimator("grpo")
def _grpo(rewards_NxGxK, lengths_NxG, weights_K, eps: float = 1e-6, ddof: int = 0):
    """GRPO on the weighted sum of the reward terms."""
    return grpo(_weighted(rewards_NxGxK, weights_K), eps, ddof)


@register_estimator("drgrpo")
def _drgrpo(rewards_NxGxK, lengths_NxG, weights_K):
    """Dr.GRPO on the weighted sum of the reward terms."""
    return drgrpo(_weighted(rewards_NxGxK, weights_K))


@register_estimator("rloo")
def _rloo(rewards_NxGxK, lengths_NxG, weights_K):
    """RLOO on the weighted sum of the reward terms."""
    return rloo(_weighted(rewards_NxGxK, weights_K))


@register_estimator("gdpo")
def _gdpo(rewards_NxGxK, lengths_NxG, weights_K, eps: float = 1e-6, token_weighted: bool = False,
          ddof: int = 0):
    """GDPO over the K terms; `token_weighted` selects verl's token-weighted batch statistics."""
    return gdpo(rewards_NxGxK, weights_K, eps, lengths_NxG if token_weighted else None, ddof)


@register_estimator("ea_grpo")
def _ea_grpo(rewards_NxGxK, lengths_NxG, alpha: float = EA_ALPHA, beta: float = EA_BETA, eps: float = 1e-6):
    """EA-GRPO: terms are `[unit, edited_lines]` (`reward.score.baseline_terms`)."""
    rewards_NxG = ea_grpo_rewards(rewards_NxGxK[..., 0], rewards_NxGxK[..., 1], alpha, beta)
    return grpo(rewards_NxG, eps)


@register_estimator("grpo_clean_rows")
def _grpo_clean_rows(rewards_NxGxK, lengths_NxG, eps: float = 1e-6):
    """GRPO + clean rows: terms are `[unit, edited_lines, is_clean]`, ℓ ≥ 0 as `reward.score.baseline_terms`
    gives it (the flag constant per group)."""
    return grpo_clean_rows(rewards_NxGxK[..., 0], rewards_NxGxK[..., 1], rewards_NxGxK[:, 0, 2] > 0, eps)


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
    """Which estimator to run and with which term weights and options.

    Attributes:
        name: a registered estimator (`estimator_names()`).
        weights: one weight per reward term; default PreciseCoder's (1 − λ, λ), λ = 1/3.
        options: keyword options of the estimator (e.g. `eps`, `token_weighted`).
    """

    name: str = "gdpo"
    weights: tuple[float, ...] = (2.0 / 3.0, 1.0 / 3.0)
    options: Mapping[str, float | bool] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.weights:
            raise ValueError("AdvantageConfig.weights must name at least one term")
        check_options(get_estimator(self.name), self.options, f"options of estimator {self.name!r}")


def compute_advantages(
    config: AdvantageConfig,
    rewards_NxGxK: jax.Array,
    lengths_NxG: jax.Array | None = None,
) -> jax.Array:
    """Run the configured estimator: `[N, G, K]` rewards -> `[N, G]` advantages."""
    if rewards_NxGxK.shape[-1] != len(config.weights):
        raise ValueError(
            f"rewards have {rewards_NxGxK.shape[-1]} terms but {len(config.weights)} weights")
    rewards_NxGxK = jnp.asarray(rewards_NxGxK, jnp.float32)
    if lengths_NxG is None:
        lengths_NxG = jnp.ones(rewards_NxGxK.shape[:2], jnp.int32)
    weights_K = jnp.asarray(config.weights, jnp.float32)
    return call_estimator(get_estimator(config.name), rewards_NxGxK, lengths_NxG, weights_K, config.options)
