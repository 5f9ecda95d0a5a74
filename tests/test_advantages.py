"""Advantage estimators against NumPy re-derivations, hand-computed values and GDPO's ordering bound."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl import advantages as A

EPS = 1e-6


def np_grpo(r):
    r = np.asarray(r, np.float64)
    return (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + EPS)


def np_rloo(r):
    r = np.asarray(r, np.float64)
    n, g = r.shape
    out = np.zeros_like(r)
    for i in range(n):
        for j in range(g):
            others = [r[i, k] for k in range(g) if k != j]
            out[i, j] = r[i, j] - np.mean(others) if others else 0.0
    return out


def np_gdpo(r, w, lengths=None):
    r = np.asarray(r, np.float64)
    s = sum(w[k] * np_grpo(r[..., k]) for k in range(r.shape[-1]))
    if lengths is None:
        return (s - s.mean()) / (s.std() + EPS)
    lw = np.asarray(lengths, np.float64)
    mu = (lw * s).sum() / lw.sum()
    sd = np.sqrt((lw * (s - mu) ** 2).sum() / lw.sum())
    return (s - mu) / (sd + EPS)


def np_ea_grpo(u, d, alpha=0.8, beta=0.05):
    u = np.asarray(u, np.float64)
    out = np.zeros_like(u)
    for i in range(u.shape[0]):
        gate = float(u[i].mean() >= alpha)
        passing = [j for j in range(u.shape[1]) if u[i, j] > 0]
        if not passing:
            continue
        dp = np.array([d[i][j] for j in passing], np.float64)
        mu, sd = dp.mean(), dp.std()
        for j in passing:
            p = 0.5 if sd == 0 else 1.0 / (1.0 + math.exp(-(d[i][j] - mu) / sd))
            out[i, j] = 1.0 - gate * beta * p
    return out


def _random_rewards(seed, shape):
    rng = np.random.default_rng(seed)
    return rng.normal(size=shape).astype(np.float32)


DEGENERATE = {
    "all_equal": np.full((3, 4), 0.7, np.float32),
    "one_group": np.array([[0.0, 1.0, 1.0, 0.0, 1.0]], np.float32),
    "g1": np.array([[1.0], [0.0], [0.3]], np.float32),
    "binary": np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32),
}


@pytest.mark.parametrize("rewards", [_random_rewards(0, (5, 6)), *DEGENERATE.values()],
                         ids=["random", *DEGENERATE])
def test_single_term_estimators_match_numpy(rewards):
    np.testing.assert_allclose(A.grpo(jnp.asarray(rewards)), np_grpo(rewards), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(A.drgrpo(jnp.asarray(rewards)),
                               rewards - rewards.mean(1, keepdims=True), atol=1e-6)
    np.testing.assert_allclose(A.rloo(jnp.asarray(rewards)), np_rloo(rewards), rtol=1e-5, atol=1e-6)


def test_grpo_hand_values():
    # Group [1, 0, 0, 0]: mean 1/4, population std sqrt(3)/4.
    adv = A.grpo(jnp.array([[1.0, 0.0, 0.0, 0.0]]))
    s = math.sqrt(3) / 4
    np.testing.assert_allclose(adv[0], [0.75 / (s + EPS)] + [-0.25 / (s + EPS)] * 3, rtol=1e-6)
    # RLOO of [3, 1, 2]: 3 − 1.5, 1 − 2.5, 2 − 2.
    np.testing.assert_allclose(A.rloo(jnp.array([[3.0, 1.0, 2.0]]))[0], [1.5, -1.5, 0.0])


def test_ddof_option():
    r = _random_rewards(10, (3, 5))
    want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + EPS)
    np.testing.assert_allclose(A.grpo(jnp.asarray(r), ddof=1), want, rtol=1e-5, atol=1e-5)
    r3 = _random_rewards(11, (3, 5, 2))
    s = sum(w * (r3[..., k] - r3[..., k].mean(1, keepdims=True)) / (r3[..., k].std(1, ddof=1, keepdims=True) + EPS)
            for k, w in enumerate((0.6, 0.4)))
    np.testing.assert_allclose(A.gdpo(jnp.asarray(r3), jnp.array([0.6, 0.4]), ddof=1),
                               (s - s.mean()) / (s.std() + EPS), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="ddof"):
        A.grpo(jnp.ones((2, 1)), ddof=1)


def test_constant_group_and_g1_give_zero():
    for fn in (A.grpo, A.drgrpo, A.rloo):
        assert np.all(np.asarray(fn(jnp.asarray(DEGENERATE["all_equal"]))) == 0.0)
        assert np.all(np.asarray(fn(jnp.asarray(DEGENERATE["g1"]))) == 0.0)


@pytest.mark.parametrize("shape", [(4, 6, 2), (1, 5, 3), (3, 1, 2), (2, 4, 1)])
def test_gdpo_matches_numpy(shape):
    r = _random_rewards(1, shape)
    w = np.linspace(1.0, 0.25, shape[-1])
    got = A.gdpo(jnp.asarray(r), jnp.asarray(w, jnp.float32))
    want = np_gdpo(r, w)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gdpo_token_weighted_matches_numpy():
    r = _random_rewards(2, (3, 4, 2))
    lengths = np.random.default_rng(3).integers(1, 50, size=(3, 4))
    w = np.array([2 / 3, 1 / 3])
    got = A.gdpo(jnp.asarray(r), jnp.asarray(w, jnp.float32), lengths_NxG=jnp.asarray(lengths))
    np.testing.assert_allclose(got, np_gdpo(r, w, lengths), rtol=1e-4, atol=1e-5)
    # Token-weighted mean of the advantages is zero, the unweighted one in general is not.
    got = np.asarray(got, np.float64)
    assert abs((got * lengths).sum() / lengths.sum()) < 1e-5
    assert abs(got.mean()) > 1e-3


def test_gdpo_hand_values():
    # Two groups of two, terms [unit, f1], weights [2/3, 1/3].
    # Group 1: unit [1, 0] -> [1, -1]; f1 [1, 0] -> [1, -1]; sum [1, -1].
    # Group 2: unit [1, 1] -> [0, 0]; f1 [0.5, 0.1] -> [1, -1] / 3 each weighted: [1/3, -1/3].
    # Batch values [1, -1, 1/3, -1/3]: mean 0, population std sqrt((1 + 1 + 1/9 + 1/9) / 4) = sqrt(5/9).
    r = jnp.array([[[1.0, 1.0], [0.0, 0.0]], [[1.0, 0.5], [1.0, 0.1]]])
    got = A.gdpo(r, jnp.array([2 / 3, 1 / 3]))  # ε = 1e-6 moves these by < 1e-5
    s = math.sqrt(5 / 9)
    np.testing.assert_allclose(got, np.array([[1, -1], [1 / 3, -1 / 3]]) / s, rtol=1e-5)


def test_gdpo_constant_term_contributes_zero():
    r = _random_rewards(4, (3, 5, 2))
    r_const = r.copy()
    r_const[..., 1] = 0.42  # constant f1 in every group
    only_unit = A.gdpo(jnp.asarray(r[..., :1]), jnp.array([1.0]))
    both = A.gdpo(jnp.asarray(r_const), jnp.array([0.6, 0.4]))
    np.testing.assert_allclose(both, only_unit, rtol=1e-4, atol=1e-5)


def test_gdpo_one_term_equals_grpo_then_batch_standardization():
    r = _random_rewards(5, (4, 6))
    g = np.asarray(A.grpo(jnp.asarray(r)), np.float64)
    want = (g - g.mean()) / (g.std() + EPS)
    got = A.gdpo(jnp.asarray(r)[..., None], jnp.array([1.0]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_ea_grpo_hand_values():
    # Group 1: all pass (gate on), D = [1, 3]: μ 2, σ 1 -> P = [σ(−1), σ(1)].
    # Group 2: 1 of 2 passes (mean 0.5 < α): gate off, the passing one keeps 1.
    # Group 3: all pass with equal D: P = 1/2.
    u = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    d = jnp.array([[1.0, 3.0], [5.0, jnp.nan], [2.0, 2.0]])
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want = [[1 - 0.05 * sig(-1), 1 - 0.05 * sig(1)], [1.0, 0.0], [1 - 0.025, 1 - 0.025]]
    np.testing.assert_allclose(A.ea_grpo_rewards(u, d), want, rtol=1e-6)


def test_ea_grpo_matches_numpy_random():
    rng = np.random.default_rng(6)
    u = (rng.random((20, 6)) < 0.85).astype(np.float32)
    d = rng.integers(0, 12, size=(20, 6)).astype(np.float32)
    np.testing.assert_allclose(A.ea_grpo_rewards(jnp.asarray(u), jnp.asarray(d)),
                               np_ea_grpo(u, d), rtol=1e-5, atol=1e-6)


def _lambda_bound(g):
    return 2.0 / (2.0 + math.sqrt(2.0 * g))


@settings(max_examples=60, deadline=None)
@given(
    g=st.integers(2, 10),
    n=st.integers(1, 4),
    frac=st.floats(0.0, 0.999),
    data=st.data(),
)
def test_gdpo_ordering_property(g, n, frac, data):
    """For λ < 2/(2+√(2G)) every passing rollout beats every failing one of its group."""
    lam = frac * _lambda_bound(g)
    unit = np.array(data.draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=g, max_size=g),
                                       min_size=n, max_size=n)), np.float32)
    f1 = np.array(data.draw(st.lists(st.lists(st.floats(0.0, 1.0), min_size=g, max_size=g),
                                     min_size=n, max_size=n)), np.float32)
    adv = np.asarray(A.gdpo(jnp.stack([jnp.asarray(unit), jnp.asarray(f1)], -1),
                            jnp.array([1.0 - lam, lam])))
    for i in range(n):
        passing, failing = adv[i][unit[i] == 1], adv[i][unit[i] == 0]
        if passing.size and failing.size:
            assert passing.min() > failing.max()


def test_gdpo_ordering_bound_is_tight():
    """Above the bound a failing rollout with top F1 can beat a passing one with F1 0."""
    g = 6
    unit = np.array([[1, 1, 1, 0, 0, 0]], np.float32)
    f1 = np.array([[0.0, 0.5, 0.5, 0.5, 0.5, 1.0]], np.float32)
    r = jnp.stack([jnp.asarray(unit), jnp.asarray(f1)], -1)
    for lam, ordered in ((_lambda_bound(g) * 0.99, True), (_lambda_bound(g) * 1.01, False)):
        adv = np.asarray(A.gdpo(r, jnp.array([1.0 - lam, lam])))[0]
        assert (adv[0] > adv[5]) == ordered


def test_estimators_are_jittable():
    r = jnp.asarray(_random_rewards(7, (3, 4, 2)))
    w = jnp.array([0.7, 0.3])
    np.testing.assert_allclose(jax.jit(A.gdpo)(r, w), A.gdpo(r, w), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(jax.jit(A.ea_grpo_rewards)(r[..., 0] > 0, r[..., 1]),
                               A.ea_grpo_rewards(r[..., 0] > 0, r[..., 1]), rtol=1e-6)


def test_registry_and_config():
    r = jnp.asarray(_random_rewards(8, (3, 4, 2)))
    cfg = A.AdvantageConfig()
    np.testing.assert_allclose(A.compute_advantages(cfg, r), np_gdpo(np.asarray(r), [2 / 3, 1 / 3]),
                               rtol=1e-4, atol=1e-5)
    cfg = A.AdvantageConfig(name="grpo", weights=(0.5, 0.5))
    np.testing.assert_allclose(A.compute_advantages(cfg, r), np_grpo(np.asarray(r).mean(-1)),
                               rtol=1e-4, atol=1e-5)
    lengths = jnp.arange(1, 13).reshape(3, 4)
    cfg = A.AdvantageConfig(options={"token_weighted": True})
    np.testing.assert_allclose(A.compute_advantages(cfg, r, lengths),
                               np_gdpo(np.asarray(r), [2 / 3, 1 / 3], np.asarray(lengths)),
                               rtol=1e-4, atol=1e-5)
    u, d = np.array([[1.0, 1.0, 1.0, 1.0]]), np.array([[1.0, 2.0, 3.0, 9.0]])
    cfg = A.AdvantageConfig(name="ea_grpo", options={"beta": 0.1})
    got = A.compute_advantages(cfg, jnp.stack([jnp.asarray(u), jnp.asarray(d)], -1))
    np.testing.assert_allclose(got, np_grpo(np_ea_grpo(u, d, beta=0.1)), rtol=1e-4, atol=1e-5)

    with pytest.raises(KeyError):
        A.AdvantageConfig(name="nope")
    with pytest.raises(ValueError, match="not accepted"):
        A.AdvantageConfig(name="drgrpo", options={"eps": 1e-3})
    with pytest.raises(ValueError, match="terms"):
        A.compute_advantages(A.AdvantageConfig(weights=(1.0,)), r)


def test_register_new_estimator():
    @A.register_estimator("test_scaled_drgrpo")
    def scaled(rewards_NxGxK, lengths_NxG, weights_K, scale: float = 1.0):
        return scale * A.drgrpo(rewards_NxGxK @ weights_K)

    r = jnp.asarray(_random_rewards(9, (2, 3, 1)))
    cfg = A.AdvantageConfig(name="test_scaled_drgrpo", weights=(1.0,), options={"scale": 3.0})
    np.testing.assert_allclose(A.compute_advantages(cfg, r), 3.0 * A.drgrpo(r[..., 0]), rtol=1e-6)
    assert "test_scaled_drgrpo" in A.estimator_names()
    with pytest.raises(ValueError, match="already registered"):
        A.register_estimator("test_scaled_drgrpo")(scaled)
    with pytest.raises(TypeError):
        A.register_estimator("test_bad")(lambda rewards, weights: rewards)


def test_grpo_clean_rows_hand_values():
    """unit [1, 1, 0], ℓ [1, 3, 5]: z(u) = [1, 1, −2]/√2 (std √(2/9)); z(−ℓ) = [1, 0, −1]·√(3/2) (std √(8/3))."""
    unit = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    lines = jnp.array([[1.0, 3.0, 5.0], [1.0, 3.0, 5.0]])
    adv = A.grpo_clean_rows(unit, lines, jnp.array([True, False]), eps=0.0)
    z_unit = np.array([1.0, 1.0, -2.0]) / math.sqrt(2)
    z_lines = np.array([1.0, 0.0, -1.0]) * math.sqrt(1.5)
    np.testing.assert_allclose(adv[0], z_unit + z_lines, rtol=1e-6)
    np.testing.assert_allclose(adv[1], z_unit, rtol=1e-6)


def test_grpo_clean_rows_registered_matches_numpy():
    rng = np.random.default_rng(3)
    unit = rng.integers(0, 2, (5, 6)).astype(np.float32)
    lines = rng.integers(0, 9, (5, 6)).astype(np.float32)
    clean = np.array([1, 0, 1, 0, 0], np.float32)
    rewards = np.stack([unit, lines, np.repeat(clean[:, None], 6, axis=1)], axis=-1)
    adv = A.get_estimator("grpo_clean_rows")(jnp.asarray(rewards), None)

    def z(x):
        return (x - x.mean(1, keepdims=True)) / (x.std(1, keepdims=True) + 1e-6)

    expected = z(unit) + clean[:, None] * z(-lines)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("g", [4, 8, 16])
def test_constant_groups_give_exact_zero_in_float32(g):
    """0.7 repeated G times has a float32 mean off by an ulp for some G; the advantage must still be 0."""
    const = jnp.full((2, g), 0.7, jnp.float32)
    assert np.all(np.asarray(A.grpo(const)) == 0.0)
    assert np.all(np.asarray(A.gdpo(jnp.stack([const, const * 0 + 0.9], -1), jnp.array([2 / 3, 1 / 3]))) == 0.0)
    passing = jnp.ones((1, g))
    same_size = jnp.full((1, g), 3.0)
    assert np.all(np.asarray(A.grpo(A.ea_grpo_rewards(passing, same_size))) == 0.0)


def test_ea_grpo_golden():
    """The hand-derived EA-GRPO rewards (formerly of reward.score's copy, now the only implementation)."""
    # mean u = 5/6 ≥ 0.8: gated. Passing D = 1,2,3,2,2: μ = 2, σ = sqrt(2/5) = 0.632456;
    # sigmoid(±1/σ = ±1.581139) = 0.170634 / 0.829366. A failing rollout's D is ignored (NaN here).
    got = A.ea_grpo_rewards(jnp.array([[1, 1, 1, 1, 1, 0]]), jnp.array([[1, 2, 3, 2, 2, jnp.nan]]))
    want = [1 - 0.05 * 0.170634, 0.975, 1 - 0.05 * 0.829366, 0.975, 0.975, 0.0]
    np.testing.assert_allclose(got[0], want, atol=1e-6)
    got = A.ea_grpo_rewards(jnp.array([[1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]]),
                            jnp.array([[5, 1, 1, 0, 2, 2], [2, 2, 2, 2, 0, 0], [0, 1, 0, 0, 0, 0]]))
    np.testing.assert_allclose(got, [[1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [0] * 6], atol=1e-7)
    np.testing.assert_allclose(A.ea_grpo_rewards(jnp.ones((1, 4)), jnp.full((1, 4), 2.0)), [[0.975] * 4])
    assert (A.EA_ALPHA, A.EA_BETA) == (0.8, 0.05)


def test_clean_rows_end_to_end_from_scores_to_advantages():
    """Scores from the real scorer -> `baseline_terms` -> `grpo_clean_rows`: on a clean row the no-op wins.

    The clean task's rollouts: the program kept (ℓ = 0), harmless rewrites of 2 and 6 lines (all pass),
    a program that breaks the tests, and an answer without code (invalid: ℓ = C's 5 non-blank lines).
    Smaller ℓ must mean a larger advantage among passing rollouts, and the no-op the largest of all
    (with the sign applied twice, as before, the 6-line rewrite got the largest).
    """
    from reward.fleet import Fleet
    from reward.schema import AssertTests, Prediction, Task
    from reward.score import baseline_terms, score_predictions

    code = "def add(a, b):\n    s = a + b\n    return s\n\ndef neg(a):\n    return -a\n"
    clean = Task("add#clean", "add", "add", code, code, AssertTests("assert add(2, 3) == 5\nassert neg(1) == -1\n"))
    buggy = Task("add#1", "add", "add", code.replace("a + b", "a - b"), code, clean.tests)
    two = code.replace("s = a + b\n    return s", "t = a + b\n    return t")
    six = two.replace("def neg(a):\n    return -a", "def neg(x):\n    y = -x\n    z = y\n    return z")
    rollouts = {clean: [code, two, six, code.replace("-a", "a"), None],
                buggy: [code, buggy.buggy_code, two, None, six]}
    items = [(task, Prediction(task.task_id, response="no code") if program is None
              else Prediction(task.task_id, code=program)) for task, programs in rollouts.items() for program in programs]
    with Fleet(workers=1) as fleet:
        scores = score_predictions(items, fleet.run)
    terms = [baseline_terms(score, task.buggy_code) for (task, _), score in zip(items, scores)]
    assert terms[:5] == [(1.0, 0.0), (1.0, 2.0), (1.0, 6.0), (0.0, 1.0), (0.0, 5.0)]
    rewards = np.array([[[u, ell, float(task.is_clean)] for u, ell in terms[i:i + 5]]
                        for i, task in zip((0, 5), rollouts)], np.float32)
    adv = np.asarray(A.compute_advantages(A.AdvantageConfig(name="grpo_clean_rows", weights=(1.0, 1.0, 1.0)),
                                          jnp.asarray(rewards)))
    assert np.argmax(adv[0]) == 0
    assert adv[0, 0] > adv[0, 1] > adv[0, 2]
    assert np.argmin(adv[0]) == 4  # failing and editing the most (an invalid answer counts as rewriting C)
    # The buggy row is scored on unit alone: the three passing rollouts tie, whatever their ℓ.
    np.testing.assert_allclose(adv[1, [0, 2, 4]], adv[1, 0], rtol=1e-6)
    assert adv[1, 0] > adv[1, 1]
