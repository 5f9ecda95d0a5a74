"""Lexical measures and the studies' statistics on hand-made inputs, against hand-computed values and statsmodels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxrl.studies import lexical, stats

TRACE = "Maybe the bug is here. Wait, the bug is here.\n```python\nmaybe = 1\n```\nSee `maybe_not`."


def test_prose_words_drop_code_blocks_and_inline_code():
    assert lexical.words(TRACE) == ["maybe", "the", "bug", "is", "here", "wait", "the", "bug", "is", "here", "see"]
    assert lexical.words("Don’t stop\n```py\nunclosed code") == ["don't", "stop"]


def test_lexicon_rates_count_the_longest_phrase_once():
    words = lexical.words(TRACE)  # 11 words
    lex = lexical.load_lexicons()
    assert lexical.lexicon_rate(words, lex["hedging"]) == pytest.approx(1000 / 11, abs=1e-6)  # "maybe"
    # "the bug is" twice: the longer phrase wins over "the bug" and the scan jumps past it.
    assert lexical.lexicon_count(words, lex["bug_assertion"]) == 2
    assert lexical.lexicon_rate(words, lex["bug_assertion"]) == pytest.approx(2000 / 11, abs=1e-6)
    assert lexical.lexicon_count(["no", "wait", "wait"], lex["self_correction"]) == 2  # "no wait", then "wait"
    assert math.isnan(lexical.lexicon_rate([], lex["hedging"]))


def test_every_shipped_lexicon_has_its_header_and_phrases():
    lex = lexical.load_lexicons()
    assert len(lex) == 15
    assert {"hedging", "certainty", "bug_assertion", "self_correction", "hypothesis", "verification",
            "minimality"} <= set(lex)
    assert all(len(phrases) >= 10 for phrases in lex.values())


def test_mattr_and_repetition_by_hand():
    words = "maybe the bug is here wait the bug is here".split()
    # windows of 6: 6, 5, 5, 5, 5 types
    assert lexical.mattr(words, window=6) == pytest.approx(26 / 30, abs=1e-12)
    assert lexical.mattr(words, window=10) == pytest.approx(0.6, abs=1e-12)  # plain TTR
    assert lexical.mattr(words, window=50) == pytest.approx(0.6, abs=1e-12)
    # 7 four-grams, the last ("the bug is here") repeats the second
    assert lexical.repetition(words) == pytest.approx(1 / 7, abs=1e-12)
    assert lexical.repetition(["a", "b"]) == 0.0


def test_quotes_match_lines_with_whitespace_collapsed():
    program = "def f(x):\n    return x  -  1\n"
    assert lexical.quotes("the line return x - 1 is wrong", program, [2]) == {2: True}
    assert lexical.quotes("def f(x) looks fine", program, [1, 2]) == {1: False, 2: False}


def test_log_odds_z_by_hand():
    z = lexical.log_odds({"x": 3, "y": 1}, {"x": 1, "y": 3})
    # prior α = pooled counts: α_x = α_y = 4, α0 = 8; n_a = n_b = 4
    delta = math.log(7 / (4 + 8 - 3 - 4)) - math.log(5 / (4 + 8 - 1 - 4))
    assert z["x"] == pytest.approx(delta / math.sqrt(1 / 7 + 1 / 5), abs=1e-6)
    assert z["x"] == pytest.approx(1.1492715, abs=1e-6) and z["y"] == pytest.approx(-z["x"], abs=1e-12)


def test_jensen_shannon_and_tfidf_cosine_by_hand():
    # P = (1/2, 1/2), Q = (1, 0), M = (3/4, 1/4)
    js = 0.5 * (0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(0.5 / 0.25)) + 0.5 * math.log2(1 / 0.75)
    assert lexical.jensen_shannon({"a": 1, "b": 1}, {"a": 5}) == pytest.approx(js, abs=1e-6)
    assert js == pytest.approx(0.311278, abs=1e-6)
    assert lexical.jensen_shannon({"a": 2}, {"a": 7}) == 0.0
    v1, v2 = lexical.tfidf_vectors([["a", "b"], ["a", "c"]])
    idf = math.log(3 / 2) + 1  # b and c; a has idf ln(3/3) + 1 = 1
    assert lexical.cosine(v1, v2) == pytest.approx(1 / (1 + idf ** 2), abs=1e-6)


def test_spearman_by_hand_and_against_scipy():
    from scipy import stats as sps

    rho, p = stats.spearman([1, 2, 3, 4], [1, 3, 2, 4])
    assert rho == pytest.approx(1 - 6 * 2 / (4 * 15), abs=1e-12)
    x, y = [3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]  # ties on both sides
    ref = sps.spearmanr(x, y)
    got = stats.spearman(x, y)
    assert got[0] == pytest.approx(ref.statistic, abs=1e-12) and got[1] == pytest.approx(ref.pvalue, abs=1e-9)
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3])[0])


def test_ols_with_fixed_effects_and_clustered_errors_matches_statsmodels():
    sm = pytest.importorskip("statsmodels.api")
    rng = np.random.default_rng(0)
    n = 90
    tasks = [f"t{i % 15}" for i in range(n)]
    models = [("base", "grpo", "precise")[i % 3] for i in range(n)]
    a, b = rng.normal(size=n), rng.exponential(size=n)
    task_effect = {t: rng.normal() for t in set(tasks)}
    y = 0.3 + 0.2 * a - 0.1 * b + np.array([task_effect[t] for t in tasks]) + 0.1 * rng.normal(size=n)
    x, names = stats.design({"a": stats.standardize(a), "b": stats.standardize(b)}, models)
    assert names == ["const", "a", "b", "model[grpo]", "model[precise]"]
    fit = stats.ols_clustered(y, x, tasks, names)
    codes = np.unique(tasks, return_inverse=True)[1]
    ref = sm.OLS(y, x).fit(cov_type="cluster", cov_kwds={"groups": codes})
    np.testing.assert_allclose(fit.coef, ref.params, rtol=0, atol=1e-6)
    np.testing.assert_allclose(fit.se, ref.bse, rtol=0, atol=1e-6)
    np.testing.assert_allclose(fit.p, ref.pvalues, rtol=0, atol=1e-6)
    assert fit.r2 == pytest.approx(ref.rsquared, abs=1e-9) and fit.clusters == 15


def test_ols_refuses_a_rank_deficient_design():
    x, names = stats.design({"a": [1.0, 2.0, 3.0, 4.0], "twice": [2.0, 4.0, 6.0, 8.0]})
    with pytest.raises(ValueError, match="rank-deficient"):
        stats.ols_clustered([1, 2, 3, 5], x, ["p", "q", "p", "q"], names)
