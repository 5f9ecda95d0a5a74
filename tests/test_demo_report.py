"""The demo report: results.json in the issue's format, mean ± std, the target check, the table."""

import json

from jaxrl.demo import report as rep


def _row(seed, p, prec, lines, noop=50.0):
    return {"seed": seed, "pass": p, "precision": prec, "recall": p, "lines": lines, "noop": noop, "damage": 10.0}

def test_row_of_turns_an_eval_summary_into_percentages():
    summary = {"buggy": {"pass": {"value": 0.5}, "precision": {"value": 0.25}, "recall": {"value": 0.75},
                         "lines": {"value": 2.5}},
               "clean": {"noop": {"value": 0.4}, "damage": {"value": 0.1}}}
    assert rep.row_of(summary, 3) == {"seed": 3, "pass": 50.0, "precision": 25.0, "recall": 75.0, "lines": 2.5,
                                      "lines_pass": None, "noop": 40.0, "damage": 10.0}

def test_mean_std_is_population_and_skips_nulls():
    assert rep.mean_std([1.0, 3.0, None]) == (2.0, 1.0)
    assert rep.mean_std([None]) == (None, None)

def test_target_check_by_hand():
    methods = {"grpo": [_row(0, 80.0, 40.0, 3.0), _row(1, 82.0, 42.0, 3.2)],
               "precisecoder": [_row(0, 78.0, 70.0, 1.2), _row(1, 79.0, 72.0, 1.6)]}
    checks = rep.target_check(methods)
    assert [met for _, met, _ in checks] == [True, True, True]
    methods["precisecoder"][0]["pass"] = 60.0
    assert [met for _, met, _ in rep.target_check(methods)] == [True, True, False]
    assert rep.target_check({"grpo": methods["grpo"]}) == []

def test_results_json_has_the_issue_format(tmp_path):
    methods = {"base": [_row(0, 50.0, 30.0, 2.0)], "grpo": [_row(0, 80.0, 40.0, 3.0)],
               "precisecoder": [_row(0, 78.0, 70.0, 1.2)]}
    rep.write_results(tmp_path / "results.json", methods, {"seconds": 1.0})
    obj = json.loads((tmp_path / "results.json").read_text())
    assert set(obj["methods"]) == {"base", "grpo", "precisecoder"}
    for rows in obj["methods"].values():
        assert set(rows[0]) == {"seed", "pass", "precision", "recall", "lines", "noop", "damage"}

def test_table_and_report_markdown():
    methods = {"base": [_row(0, 50.0, 30.0, 2.0), _row(1, 52.0, 32.0, 2.2)]}
    table = rep.summary_table(methods)
    assert "| SFT base | 51.0 ± 1.0 | 31.0 ± 1.0 | 51.0 ± 1.0 | 2.10 ± 0.10 | – | 50.0 ± 0.0 | 10.0 ± 0.0 |" in table
    md = rep.report_markdown(methods, methods, 2, 120.0, (1.5, 1.0, 1.0), "precisecoder demo --seeds 2", 200.0)
    assert "`precisecoder demo --seeds 2`" in md and "Greedy decoding" in md and "Not checked" in md

def test_curves_png(tmp_path):
    curves = {"grpo": [{"seed": 0, "step": s, "rollout/pass": 0.5 + s / 10} for s in range(1, 4)],
              "precisecoder": [{"seed": 0, "step": s, "rollout/pass": 0.4 + s / 10} for s in range(1, 4)]}
    rep.plot_curves(tmp_path / "c.png", curves, (("rollout/pass", "pass"), ("rollout/edited_lines", "lines")))
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_coupling_by_hand():
    from types import SimpleNamespace as S

    scores = [S(valid=True, damage=None, edited_lines=3, unit=1), S(valid=True, damage=None, edited_lines=2, unit=1),
              S(valid=True, damage=None, edited_lines=1, unit=1), S(valid=True, damage=None, edited_lines=1, unit=0),
              S(valid=False, damage=None, edited_lines=None, unit=0), S(valid=True, damage=0, edited_lines=4, unit=1)]
    assert rep.coupling(scores) == {"pass_overedit": 100.0, "pass_tight": 50.0, "overedit_share": 50.0}


def test_within_task_coupling_compares_answers_to_the_same_task():
    from types import SimpleNamespace as S

    def s(task, lines, unit):
        return S(task_id=task, valid=True, damage=None, edited_lines=lines, unit=unit)

    # Task a: over-edits pass 2/2, tight 1/2. Task b: over 0/1, tight 1/1. Task c has one kind only.
    scores = [s("a", 3, 1), s("a", 2, 1), s("a", 1, 1), s("a", 0, 0), s("b", 2, 0), s("b", 1, 1),
              s("c", 1, 1), s("c", 1, 1)]
    assert rep.within_task_coupling(scores) == {"tasks": 2, "pass_overedit": 50.0, "pass_tight": 75.0,
                                                "overedit_better": 1, "tight_better": 1}
    assert rep.within_task_coupling([s("c", 1, 1)])["tasks"] == 0
