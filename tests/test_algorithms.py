"""Algorithms as one object each: golden advantages, plug-in estimators, the checks that name the key."""

import json
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from advantage_batch import CASES, G, LAM, batch_lengths, batch_scores, batch_tasks
from jaxrl import algorithms as AL
from reward.score import analyze, unit_only_score

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "advantages_golden.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['algorithm']}{c['options'] or ''}")
def test_every_algorithm_gives_the_golden_advantages(case):
    tasks, scores = batch_tasks(), batch_scores()
    name, options = case["algorithm"], case["options"]
    algorithm = AL.resolve(name, None, None, None, options, LAM)
    terms = np.asarray([algorithm.term_values(s, tasks[i // G]) for i, s in enumerate(scores)], np.float32)
    np.testing.assert_array_equal(terms, np.asarray(case["terms"], np.float32))
    lengths = jnp.asarray(batch_lengths() if case["token_lengths"] else np.ones((len(tasks), G), np.int32))
    adv = jax.jit(algorithm.advantages)(terms.reshape(-1, G, terms.shape[1]), lengths)
    np.testing.assert_allclose(np.asarray(adv), np.asarray(case["advantages"]), rtol=1e-6, atol=1e-6)


def test_the_golden_file_covers_every_case():
    assert [(c["algorithm"], c["options"]) for c in GOLDEN["cases"]] == [(n, o) for n, o, _ in CASES]
    assert GOLDEN["lam"] == LAM and GOLDEN["group_size"] == G


def _python_blocks(page):
    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_python_of_the_docs_runs_and_registers_what_it_says():
    """docs/gdpo.md's estimator and docs/estimators.md's estimator, term and algorithm (the page's
    plug-in module itself trains in tests/test_trainer_loop.py)."""
    scope = {}
    exec(_python_blocks("gdpo.md")[0], scope)  # noqa: S102 - the documented snippet, as a user runs it
    assert scope["adv_NxG"].shape == (1, 2) and float(scope["adv_NxG"][0, 0]) > 0
    exec(_python_blocks("estimators.md")[1], {})  # noqa: S102
    algorithm = AL.resolve("centred_short", None, None, None, {}, LAM)
    assert algorithm.terms == ("unit", "short") and algorithm.weights == (1.0, 0.1)
    scores, tasks = batch_scores(), batch_tasks()
    terms = np.asarray([algorithm.term_values(s, tasks[i // G]) for i, s in enumerate(scores)], np.float32)
    adv = np.asarray(algorithm.advantages(terms.reshape(-1, G, 2), jnp.ones((len(tasks), G), jnp.int32)))
    np.testing.assert_allclose(adv.sum(axis=1), 0.0, atol=1e-5)  # centred within every group


def test_plug_in_estimator_checks_name_the_key(tmp_path, monkeypatch):
    (tmp_path / "plug_checks.py").write_text(
        "def loose(rewards_NxGxK, lengths_NxG, **options):\n    return rewards_NxGxK[..., 0]\n\n"
        "def strict(rewards_NxGxK, lengths_NxG, *, scale):\n    return scale * rewards_NxGxK[..., 0]\n\n"
        "def one_arg(rewards_NxGxK):\n    return rewards_NxGxK[..., 0]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "plug_checks", raising=False)
    assert AL.resolve("grpo", "plug_checks:loose", None, None, {"anything": 1}, LAM).options == {"anything": 1}
    with pytest.raises(AL.AlgorithmError, match="algorithm.options of plug_checks:strict: cannot be called"):
        AL.resolve("grpo", "plug_checks:strict", None, None, {}, LAM)  # the required option is missing
    with pytest.raises(AL.AlgorithmError, match="plug_checks:one_arg: cannot be called"):
        AL.resolve("grpo", "plug_checks:one_arg", None, None, {}, LAM)
    with pytest.raises(AL.AlgorithmError, match="neither a registered estimator nor module:function"):
        AL.resolve("grpo", "plug_checks:", None, None, {}, LAM)


def test_which_algorithms_need_the_verification_runs():
    """Unit-only algorithms let the trainer defer the verification runs; a term registered without saying
    counts as needing them, and a unit-only score is refused where a term needs them."""
    unit_only = {n for n in AL.algorithm_names() if not AL.resolve(n, None, None, None, {}, LAM).verified}
    assert unit_only == {"grpo", "drgrpo", "rloo", "ea_grpo", "grpo_clean_rows"}
    AL.register_term("test_unsaid_term")(lambda score, task: 0.0)
    AL.register_term("test_unit_only_term", verified=False)(lambda score, task: float(score.unit))
    assert AL.resolve("grpo", None, ("unit", "test_unsaid_term"), (1.0, 0.0), {}, LAM).verified
    assert not AL.resolve("grpo", None, ("unit", "test_unit_only_term"), (1.0, 0.0), {}, LAM).verified
    task = batch_tasks()[0]
    analysis = analyze(task.buggy_code, task.solution, task.solution, 1)
    score = unit_only_score(task, True, 1, analysis, 1)
    assert AL.resolve("ea_grpo", None, None, None, {}, LAM).term_values(score, task) == (1.0, 1.0)
    with pytest.raises(ValueError, match="need the verification runs"):
        AL.resolve("precisecoder", None, None, None, {}, LAM).term_values(score, task)
