"""RL algorithms, each one object: its reward terms, their weights and its advantage estimator.

A reward term is a pure function of one score row (and its task) to a float,
registered by name (`register_term`; `verified=False` for a term that reads only
what the unit run settles: unit, edited lines, no-op, the task); an `Algorithm` names its terms, gives
their weights as a function of λ (`reward.lam`) and names its estimator, a
registered one of `jaxrl.advantages` or a plug-in `module:function` imported
from `sys.path` (the working directory included):

    algorithm:
      estimator: my_estimators:rank_advantages
      terms: [unit, f1]
      weights: [0.6667, 0.3333]
      options: {temperature: 0.5}

An estimator is `f(rewards_NxGxK, lengths_NxG, **options) -> advantages_NxG` in
pure JAX; one that declares a `weights_K` parameter also receives the weights.
This module imports no JAX: loading a config stays light, and the estimator
function is only resolved (`resolve`) by the trainer's checks before a run starts.

Adding an algorithm is one `register_algorithm(Algorithm(...))` call.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reward.schema import Task
from reward.score import UNIT_ONLY, Score, baseline_terms

Term = Callable[[Score, Task], float]

_TERMS: dict[str, Term] = {}
_UNIT_ONLY_TERMS: set[str] = set()  # terms that need no verification run (`register_term(verified=False)`)
_ALGORITHMS: dict[str, "Algorithm"] = {}


class AlgorithmError(ValueError):
    """An algorithm that cannot be assembled; the message names the config key."""


def register_term(name: str, verified: bool = True) -> Callable[[Term], Term]:
    """Register `fn(score, task) -> float` as the reward term `name`.

    `verified=False` declares that the term reads only what a prediction's unit run settles
    (`unit`, `valid`, `edited_lines`, `noop`, `damage`, `faults`, the task), never precision,
    recall, F1 or the reward: an algorithm all of whose terms are such lets the trainer make the
    verification runs while the update runs (`reward.defer_verification`). The default is safe.
    """

    def decorate(fn: Term) -> Term:
        if name in _TERMS:
            raise ValueError(f"reward term {name!r} is already registered")
        _TERMS[name] = fn
        if not verified:
            _UNIT_ONLY_TERMS.add(name)
        return fn

    return decorate


def term_names() -> list[str]:
    """Names of the registered reward terms."""
    return sorted(_TERMS)


def get_term(name: str) -> Term:
    """The term registered as `name`."""
    if name not in _TERMS:
        raise AlgorithmError(f"unknown reward term {name!r}; registered: {', '.join(term_names())}")
    return _TERMS[name]


@register_term("unit", verified=False)
def _unit(score: Score, task: Task) -> float:
    """1 when every test passes, else 0."""
    return float(score.unit)


@register_term("f1")
def _f1(score: Score, task: Task) -> float:
    """Edit F1; 0 on clean tasks and invalid answers (`Score.vector`)."""
    return score.vector[1]


@register_term("precision")
def _precision(score: Score, task: Task) -> float:
    """Edit precision; 0 where it does not apply."""
    return score.precision or 0.0


@register_term("recall")
def _recall(score: Score, task: Task) -> float:
    """Edit recall; 0 where it does not apply."""
    return score.recall or 0.0


@register_term("unit_precision")
def _unit_precision(score: Score, task: Task) -> float:
    """unit × precision: edit precision earned only when the tests pass (Table 3's product reward)."""
    return float(score.unit) * (score.precision or 0.0)


@register_term("gated_recall")
def _gated_recall(score: Score, task: Task) -> float:
    """Recall counted only when the tests pass (a fix that touches the fault but fails earns nothing)."""
    return float(score.unit) * (score.recall or 0.0)


@register_term("edited_lines", verified=False)
def _edited_lines(score: Score, task: Task) -> float:
    """ℓ ≥ 0, an invalid answer's being C's non-blank lines (`reward.score.baseline_terms`)."""
    return baseline_terms(score, task.buggy_code)[1]


@register_term("lines", verified=False)
def _lines(score: Score, task: Task) -> float:
    """−ℓ: fewer edited lines is more reward."""
    return -_edited_lines(score, task)


@register_term("noop", verified=False)
def _noop(score: Score, task: Task) -> float:
    """1 when the answer changes nothing."""
    return float(score.noop)


@register_term("is_clean", verified=False)
def _is_clean(score: Score, task: Task) -> float:
    """1 on a clean task (no fault), constant within a group."""
    return float(task.is_clean)


def lam_weights(lam: float) -> tuple[float, ...]:
    """[1 − λ, λ]: PreciseCoder's weights of [unit, f1]."""
    return 1.0 - lam, lam


def unit_weights(k: int) -> Callable[[float], tuple[float, ...]]:
    """Weight 1 on the first of `k` terms, 0 on the others (estimators that read the terms themselves)."""
    return lambda lam: (1.0,) + (0.0,) * (k - 1)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One RL algorithm.

    Attributes:
        name: its `algorithm.name`.
        terms: registered reward terms, the K axis of `rewards_NxGxK`.
        weights: λ -> one weight per term.
        estimator: a registered estimator name (`jaxrl.advantages`) or `module:function`.
        summary: one line for the docs and error messages.
    """

    name: str
    terms: tuple[str, ...]
    weights: Callable[[float], tuple[float, ...]]
    estimator: str
    summary: str = ""


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    """Make `algorithm` selectable as `algorithm.name`."""
    if algorithm.name in _ALGORITHMS:
        raise ValueError(f"algorithm {algorithm.name!r} is already registered")
    for t in algorithm.terms:
        get_term(t)
    _ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def algorithm_names() -> list[str]:
    """Names of the registered algorithms, in registration order."""
    return list(_ALGORITHMS)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as `name`."""
    if name not in _ALGORITHMS:
        raise AlgorithmError(f"algorithm.name: unknown algorithm {name!r}; choose from {', '.join(_ALGORITHMS)}")
    return _ALGORITHMS[name]


for _alg in (
    Algorithm("precisecoder", ("unit", "f1"), lam_weights, "gdpo", "GDPO over [unit, f1], weights [1 − λ, λ]"),
    Algorithm("grpo", ("unit",), unit_weights(1), "grpo", "GRPO on unit"),
    Algorithm("drgrpo", ("unit",), unit_weights(1), "drgrpo", "Dr.GRPO on unit"),
    Algorithm("rloo", ("unit",), unit_weights(1), "rloo", "RLOO on unit"),
    Algorithm("ea_grpo", ("unit", "edited_lines"), unit_weights(2), "ea_grpo",
              "GRPO on unit with EA-GRPO's edit-size penalty"),
    Algorithm("grpo_f1sum", ("unit", "f1"), lam_weights, "grpo", "GRPO on r_λ = (1 − λ)·unit + λ·f1"),
    Algorithm("grpo_clean_rows", ("unit", "edited_lines", "is_clean"), unit_weights(3), "grpo_clean_rows",
              "GRPO on unit, plus fewer edited lines on clean rows"),
    # The reward ablations of the paper's Table 3: PreciseCoder's estimator, other terms.
    Algorithm("unit_plus_precision", ("unit", "precision"), lam_weights, "gdpo",
              "GDPO over [unit, precision], weights [1 − λ, λ] (precision added to unit)"),
    Algorithm("precision_only", ("precision",), unit_weights(1), "gdpo", "GDPO on precision alone"),
    Algorithm("recall_only", ("recall",), unit_weights(1), "gdpo", "GDPO on recall alone"),
    Algorithm("unit_x_precision", ("unit_precision",), unit_weights(1), "gdpo", "GDPO on unit × precision"),
    Algorithm("f1_only", ("f1",), unit_weights(1), "gdpo", "GDPO on F1 alone"),
):
    register_algorithm(_alg)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A run's algorithm with every part settled: what the trainer calls.

    Attributes:
        terms: reward term names (K).
        weights: one weight per term.
        estimator: the estimator function.
        options: its keyword options (`weights_K` is added by `advantages` where it is taken).
    """

    terms: tuple[str, ...]
    weights: tuple[float, ...]
    estimator: Callable[..., Any]
    options: Mapping[str, Any]

    @property
    def verified(self) -> bool:
        """Whether some term reads what only the verification runs settle (precision, recall, F1)."""
        return any(t not in _UNIT_ONLY_TERMS for t in self.terms)

    def term_values(self, score: Score, task: Task) -> tuple[float, ...]:
        """One rollout's reward terms."""
        if score.status == UNIT_ONLY and self.verified:
            raise ValueError(f"the terms {list(self.terms)} need the verification runs; "
                             "this score has only the unit run")
        return tuple(get_term(t)(score, task) for t in self.terms)

    def advantages(self, rewards_NxGxK: Any, lengths_NxG: Any) -> Any:
        """The estimator on `[N, G, K]` rewards: `[N, G]` advantages (jittable)."""
        import jax.numpy as jnp  # noqa: PLC0415

        from jaxrl.advantages import call_estimator  # noqa: PLC0415
        return call_estimator(self.estimator, jnp.asarray(rewards_NxGxK, jnp.float32), lengths_NxG,
                              jnp.asarray(self.weights, jnp.float32), self.options)


def load_function(spec: str) -> Callable[..., Any]:
    """`module:function` imported from `sys.path`, the working directory first."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AlgorithmError(f"algorithm.estimator: {spec!r} is neither a registered estimator nor module:function")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise AlgorithmError(f"algorithm.estimator: cannot import module {module_name!r} ({e})") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing: one line, not a traceback
        raise AlgorithmError(f"algorithm.estimator: importing module {module_name!r} failed "
                             f"({type(e).__name__}: {e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AlgorithmError(f"algorithm.estimator: module {module_name!r} has no function {attr!r}")
    return fn


def parts(name: str, terms: Sequence[str] | None, weights: Sequence[float] | None, lam: float
          ) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The terms and weights of a config's algorithm (no estimator import): checked, with the key named."""
    algorithm = get_algorithm(name)
    if terms is None:
        terms = algorithm.terms
        weights = algorithm.weights(lam) if weights is None else weights
    elif weights is None:
        raise AlgorithmError("algorithm.weights: give one weight per term of algorithm.terms")
    for t in terms:
        if t not in _TERMS:
            raise AlgorithmError(f"algorithm.terms: unknown reward term {t!r}; registered: {', '.join(term_names())}")
    if not terms:
        raise AlgorithmError("algorithm.terms: name at least one reward term")
    if len(weights) != len(terms):
        raise AlgorithmError(f"algorithm.weights: {len(weights)} weights for the {len(terms)} terms {list(terms)}")
    return tuple(terms), tuple(float(w) for w in weights)


def resolve(name: str, estimator: str | None, terms: Sequence[str] | None, weights: Sequence[float] | None,
            options: Mapping[str, Any], lam: float) -> Resolved:
    """The algorithm of a config: `name`'s parts, each overridden where the config gives it.

    Raises `AlgorithmError` naming the key: an unknown algorithm, term, estimator, module or
    function; weights of the wrong length; an option the estimator does not accept.
    """
    from jaxrl import advantages  # noqa: PLC0415  (JAX: only once a run is being checked)

    terms, weights = parts(name, terms, weights, lam)
    spec = estimator or get_algorithm(name).estimator
    if ":" in spec:
        fn = load_function(spec)
    elif spec in advantages.estimator_names():
        fn = advantages.get_estimator(spec)
    else:
        raise AlgorithmError(f"algorithm.estimator: unknown estimator {spec!r}; registered: "
                             f"{', '.join(advantages.estimator_names())}, or give module:function")
    try:
        advantages.check_options(fn, options, f"algorithm.options of {spec}")
    except ValueError as e:
        raise AlgorithmError(str(e)) from None
    return Resolved(terms, weights, fn, dict(options))
