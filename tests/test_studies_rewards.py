"""`precisecoder analyze rewards` on a hand-made score table: shares, correlations and advantage mass by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from jaxrl import cli
from jaxrl.studies import rewards_analysis as ra


def score(task: str, unit: int, f1: float, precision: float, recall: float, lines: int | None) -> dict:
    return {"task_id": task, "valid": lines is not None, "unit": unit, "precision": precision, "recall": recall,
            "f1": f1, "edited_lines": lines, "noop": lines == 0, "damage": None}


# Three groups of three: all pass (f1 varies), all fail (an invalid sample), mixed.
TABLE = [
    score("a", 1, 0.5, 1 / 3, 1.0, 2), score("a", 1, 0.8, 2 / 3, 1.0, 1), score("a", 1, 0.5, 1 / 3, 1.0, 2),
    score("b", 0, 0.0, 0.0, 0.0, None), score("b", 0, 0.0, 0.0, 0.0, 3), score("b", 0, 0.0, 0.0, 0.0, 3),
    score("c", 1, 1.0, 1.0, 1.0, 1), score("c", 0, 0.2, 0.25, 0.5, 4), score("c", 1, 1.0, 1.0, 1.0, 1),
]


def test_group_shares_by_hand():
    out = ra.analyze_scores(TABLE)
    assert out["groups"] == {"all_pass": 1 / 3, "all_fail": 1 / 3, "mixed": 1 / 3}
    shares = out["constant_share"]
    assert shares["unit"] == pytest.approx(2 / 3)  # a and b
    assert shares["f1"] == pytest.approx(1 / 3)  # b only
    assert shares["recall"] == pytest.approx(2 / 3)  # a (all 1) and b (all 0)
    assert shares["neg_lines"] == 0.0  # b: undefined, 3, 3 are two values
    assert out["passing_edited_lines"] == pytest.approx((2 + 1 + 2 + 1 + 1) / 5)
    assert ra.passing_edited_lines(np.array([[1, 0], [1, 1]]), np.array([[4, 9], [2, 0]])) == pytest.approx(2.0)
    assert math.isnan(ra.passing_edited_lines(np.zeros((1, 2)), np.ones((1, 2))))


def test_groups_of_a_size_cut_each_task_in_file_order():
    groups, left = ra.groups_of(TABLE, 2)
    assert [len(g) for g in groups] == [2, 2, 2] and left == 3
    assert ra.group_composition([[s["unit"] for s in g] for g in groups]) == {"all_pass": 1 / 3, "all_fail": 1 / 3,
                                                                              "mixed": 1 / 3}


def test_correlations_by_hand():
    out = ra.analyze_scores(TABLE)
    unit = [1, 1, 1, 0, 0, 0, 1, 0, 1]
    f1 = [0.5, 0.8, 0.5, 0, 0, 0, 1, 0.2, 1]
    mu, mf = sum(unit) / 9, sum(f1) / 9
    cov = sum((u - mu) * (f - mf) for u, f in zip(unit, f1))
    r = cov / math.sqrt(sum((u - mu) ** 2 for u in unit) * sum((f - mf) ** 2 for f in f1))
    assert out["correlations"]["unit~f1"] == pytest.approx(r, abs=1e-12)
    # −lines: the invalid sample is left out of its pairs (8 samples)
    lines = [2, 1, 2, 3, 3, 1, 4, 1]
    prec = [1 / 3, 2 / 3, 1 / 3, 0, 0, 1, 0.25, 1]
    assert out["correlations"]["neg_lines~precision"] == pytest.approx(np.corrcoef([-x for x in lines], prec)[0, 1])
    # within tasks (minus the task's mean): unit varies in c only, f1 in a and c
    u = [0, 0, 0, 0, 0, 0, 1 / 3, -2 / 3, 1 / 3]
    f = [-0.1, 0.2, -0.1, 0, 0, 0, 0.8 / 3, -1.6 / 3, 0.8 / 3]
    r = sum(a * b for a, b in zip(u, f)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in f))
    assert out["within_task_correlations"]["unit~f1"] == pytest.approx(r, abs=1e-12)
    assert r == pytest.approx(0.936329, abs=1e-6)


def test_advantage_mass_in_collapsed_groups():
    mass = ra.analyze_scores(TABLE)["advantage_mass_collapsed"]
    assert mass["grpo_unit"] == 0.0  # unit alone gives collapsed groups no advantage
    # GDPO: per term z-scores within groups (population std), weights 2/3 and 1/3, then batch-standardized.
    f1 = np.array([[0.5, 0.8, 0.5], [0, 0, 0], [1, 0.2, 1]])
    unit = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 1]], float)

    def z(x):
        sd = x.std(axis=1, keepdims=True)
        return (x - x.mean(axis=1, keepdims=True)) / (sd + 1e-6)

    s = 2 / 3 * z(unit) + 1 / 3 * z(f1)
    a = np.abs((s - s.mean()) / (s.std() + 1e-6))
    assert mass["gdpo"] == pytest.approx(a[0].sum() / a.sum(), abs=1e-5)
    assert mass["gdpo"] > 0 and set(mass) == {"grpo_unit", "grpo", "drgrpo", "rloo", "gdpo", "ea_grpo"}


def test_json_output_and_fig3(tmp_path, capsys):
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps(s) + "\n" for s in TABLE))
    runs = []
    for i, (precision, noop) in enumerate([(0.3, 0.1), (0.5, 0.2), (0.6, 0.4)]):
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"model": {"name": f"m{i}"}, "buggy": {"precision": {"value": precision}},
                                                    "clean": {"noop": {"value": noop}}}))
        runs.append(str(d))
    assert cli.main(["analyze", "rewards", "--scores", str(scores), "--json", "--runs", *runs]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["groups"]) == {"all_pass", "all_fail", "mixed"}
    assert set(out["constant_share"]) == {"unit", "f1", "precision", "recall", "neg_lines", "reward"}
    assert "unit~f1" in out["correlations"] and len(out["correlations"]) == 10
    assert out["noop_vs_precision"]["r"] == pytest.approx(np.corrcoef([0.1, 0.2, 0.4], [0.3, 0.5, 0.6])[0, 1])
    assert cli.main(["analyze", "rewards", "--scores", str(scores)]) == 0
    assert "Fig 2" in capsys.readouterr().out


def test_bad_input_is_one_error_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a"}\n')
    assert cli.main(["analyze", "rewards", "--scores", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {bad}:1: not a score record"
    assert cli.main(["analyze", "rewards", "--scores", str(tmp_path / "missing.jsonl")]) == 2
    assert cli.main(["analyze", "rewards", "--scores", str(bad), "--group-size", "0"]) == 2
