"""`precisecoder analyze thinking` end to end on two hand-made eval runs: measures.csv, tables.md, the PNGs."""

from __future__ import annotations

import csv
import json

import pytest
from eval_fakes import TASKS

from jaxrl import cli
from jaxrl.studies import thinking
from reward.schema import write_tasks

# Run "base" hedges and rewrites; run "tuned" quotes the buggy line and keeps the edit minimal.
THOUGHTS = {
    "base": ["Maybe the bug is somewhere. Perhaps I should rewrite it from scratch.",
             "Maybe it is the loop. I think I will rewrite the function.",
             "Perhaps the sign is wrong. Maybe rewrite everything."],
    "tuned": ["The line return a - b is wrong. Only change that line.",
              "The line a = x - 1 is wrong and return c + 4 too. Minimal edit.",
              "The loop for x in xs[1:]: skips one. Only fix the bug."],
}
OUTCOMES = {"base": [(1, 0.2, 1.0, 0.4), (0, 0.0, 0.0, 0.0), (1, 0.25, 1.0, 0.4)],
            "tuned": [(1, 1.0, 1.0, 1.0), (1, 0.5, 1.0, 2 / 3), (0, 0.5, 0.5, 0.5)]}


def make_run(root, name):
    d = root / name
    d.mkdir()
    buggy = [t for t in TASKS if not t.is_clean]
    preds, scores = [], []
    for t, thought, (unit, p, r, f1) in zip(buggy, THOUGHTS[name], OUTCOMES[name]):
        preds.append({"task_id": t.task_id, "sample": 0, "thinking": thought, "budget_hit": False})
        scores.append({"task_id": t.task_id, "unit": unit, "precision": p, "recall": r, "f1": f1,
                       "edited_lines": 1})
    preds.append({"task_id": "clamp#clean", "sample": 0, "thinking": None, "budget_hit": False})  # no trace: no row
    scores.append({"task_id": "clamp#clean", "unit": 1, "precision": None, "recall": None, "f1": None,
                   "edited_lines": 0})
    (d / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    (d / "scores.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scores))
    (d / "summary.json").write_text(json.dumps({"model": {"name": name}}))
    return d


def test_bug_lines_come_from_meta_or_the_diff():
    add, f = TASKS[0], TASKS[1]
    assert thinking.bug_lines(add) == [2]
    assert thinking.bug_lines(f) == [2, 5]
    assert thinking.bug_lines(add.__class__(**{**add.__dict__, "meta": {"bug_lines": [[1, 2], [3.5, 3.5]]}})) == [1, 2]


def test_analyze_thinking_writes_measures_tables_and_figures(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, TASKS)
    runs = [make_run(tmp_path, "base"), make_run(tmp_path, "tuned")]
    out = tmp_path / "analysis"
    assert cli.main(["analyze", "thinking", *map(str, runs), "--tasks", str(tasks), "--out", str(out),
                     "--tokenizer", "none"]) == 0
    rows = list(csv.DictReader((out / "measures.csv").open()))
    assert [(r["run"], r["task_id"]) for r in rows] == [(n, t.task_id) for n in ("base", "tuned") for t in TASKS[:3]]
    first = rows[0]  # "Maybe the bug is somewhere. Perhaps I should rewrite it from scratch.": 12 words
    assert float(first["words"]) == 12 and first["tokens"] == ""
    assert float(first["hedging"]) == pytest.approx(2000 / 12, abs=1e-6)  # maybe, perhaps
    assert float(first["rewriting"]) == pytest.approx(2000 / 12, abs=1e-6)  # rewrite, from scratch
    assert float(first["quotes_bug"]) == 0.0
    tuned_add, tuned_f, tuned_g = rows[3], rows[4], rows[5]
    assert float(tuned_add["quotes_bug"]) == 1.0 and float(tuned_add["quotes_all_bugs"]) == 1.0
    assert float(tuned_f["quotes_bug"]) == 1.0 and float(tuned_f["quotes_all_bugs"]) == 1.0  # lines 2 and 5
    assert float(tuned_g["quotes_bug"]) == 1.0 and float(tuned_g["quotes_all_bugs"]) == 0.0  # line 3, not line 4
    table = (out / "tables.md").read_text()
    assert "## tuned against base" in table and "Spearman" in table and "OLS of F1" in table
    assert (out / "lexicon_rates.png").stat().st_size > 1000 and (out / "length_vs_f1.png").stat().st_size > 1000
    assert "wrote" in capsys.readouterr().out


def test_contrast_between_two_runs(tmp_path):
    base, tuned = thinking.load_run(make_run(tmp_path, "base")), thinking.load_run(make_run(tmp_path, "tuned"))
    c = thinking.contrast(base, tuned, top=6)
    assert c.paired_tasks == 3 and 0 < c.js_bits < 1 and 0 < c.tfidf_cosine < 1
    assert all(z > 0 for _, z in c.top_a + c.top_b)
    assert c.top_b[0][0] == "the line"  # twice in tuned, never in base: the largest z
    assert "i think" in [bigram for bigram, _ in c.top_a] and "the line" not in [b for b, _ in c.top_a]


def test_a_run_without_scores_is_one_error_line(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, TASKS)
    d = make_run(tmp_path, "base")
    (d / "scores.jsonl").unlink()
    assert cli.main(["analyze", "thinking", str(d), "--tasks", str(tasks), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    d = make_run(tmp_path, "tuned")
    assert cli.main(["analyze", "thinking", str(d), "--tasks", str(tasks), "--out", str(tmp_path / "o"),
                     "--tokenizer", "none", "--ols", "words,nonsense"]) == 2
    assert capsys.readouterr().err.startswith("error: --ols: unknown measures nonsense; choose from tokens, words")
    assert not (tmp_path / "o").exists()


def test_regression_standardizes_adds_run_effects_and_clusters_by_task():
    sm = pytest.importorskip("statsmodels.api")
    import numpy as np

    rng = np.random.default_rng(1)
    rows = [{"run": ("base", "tuned")[i % 2], "task_id": f"t{i // 4}", "words": float(rng.integers(5, 80)),
             "hedging": float(rng.exponential(20)), "flat": 1.0, "f1": float(rng.uniform())} for i in range(48)]
    fit, dropped = thinking.regression(rows, ["words", "hedging", "flat"])
    assert dropped == ["flat"] and fit.names == ("const", "words", "hedging", "model[tuned]")
    z = lambda k: (np.array([r[k] for r in rows]) - np.mean([r[k] for r in rows])) / np.std([r[k] for r in rows])  # noqa: E731
    x = np.column_stack([np.ones(48), z("words"), z("hedging"), [r["run"] == "tuned" for r in rows]])
    groups = np.array([int(r["task_id"][1:]) for r in rows])
    ref = sm.OLS([r["f1"] for r in rows], x.astype(float)).fit(cov_type="cluster", cov_kwds={"groups": groups})
    np.testing.assert_allclose(fit.coef, ref.params, atol=1e-6)
    np.testing.assert_allclose(fit.se, ref.bse, atol=1e-6)


def test_regression_refuses_a_constant_outcome():
    rows = [{"run": "r", "task_id": f"t{i}", "words": float(i), "f1": 0.0} for i in range(5)]
    with pytest.raises(thinking.AnalysisError, match="f1 is 0 on every trace"):
        thinking.regression(rows, ["words"])
