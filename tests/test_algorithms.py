"""Algorithms as one object each: golden advantages, plug-in estimators, the checks that name the key."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from advantage_batch import CASES, G, LAM, batch_lengths, batch_scores, batch_tasks
from jaxrl import algorithms as AL

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
