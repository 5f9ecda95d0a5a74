"""`eval compare --group`: mean ± std over a method's runs, best and second marks, the λ sweep plot,
on hand-made eval run directories checked against values computed by hand."""

from __future__ import annotations

import json

import pytest

from jaxrl import cli


def summary(name, pass_, precision, lines, noop=None, damage=None):
    """A summary.json with the fields compare reads; recall and F1 follow precision."""
    col = lambda v: None if v is None else {"value": v, "ci": None}  # noqa: E731
    buggy = {"tasks": 10, "pass": col(pass_), "precision": col(precision), "recall": col(precision),
             "f1": col(precision), "lines": col(lines)}
    clean = {"tasks": 4 if noop is not None else 0, "noop": col(noop), "damage": col(damage)}
    return {"model": {"name": name}, "settings": {"prompt": "minimal"}, "buggy": buggy, "clean": clean,
            "kinds": {}, "invalid": {"count": 0, "share": 0.0, "reasons": {}}, "samples": 14}


def write_runs(root, runs):
    dirs = {}
    for key, s in runs.items():
        d = root / key
        d.mkdir()
        (d / "summary.json").write_text(json.dumps(s))
        dirs[key] = str(d)
    return dirs


@pytest.fixture
def dirs(tmp_path):
    return write_runs(tmp_path, {
        # method a: pass 0.5, 0.7 -> 60.0 ± 14.1; precision 0.4, 0.6 -> 50.0 ± 14.1; lines 2, 4 -> 3.00 ± 1.41
        "a0": summary("a", 0.5, 0.4, 2.0, noop=0.5, damage=0.25),
        "a1": summary("a", 0.7, 0.6, 4.0, noop=0.75, damage=0.0),
        # method b: pass 0.8, 0.8, 0.5 -> 70.0 ± 17.3; precision 0.3 -> 30.0 ± 0.0; lines 1.5 -> 1.50 ± 0.00
        "b0": summary("b", 0.8, 0.3, 1.5), "b1": summary("b", 0.8, 0.3, 1.5), "b2": summary("b", 0.5, 0.3, 1.5),
        # method c: one run, no std: pass 60.0 (ties a), precision 80.0, lines 5.00
        "c0": summary("c", 0.6, 0.8, 5.0, noop=1.0, damage=0.0),
    })


def rows(table):
    return {line.split(" | ")[0].lstrip("| "): [c.strip() for c in line.strip("| \n").split(" | ")]
            for line in table.splitlines() if line.startswith("| ") and not line.startswith("| method")}


def test_groups_give_mean_std_and_the_marks(dirs, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["eval", "compare", "--group", f"a={dirs['a0']},{dirs['a1']}",
            "--group", f"b={dirs['b0']},{dirs['b1']},{dirs['b2']}", "--group", f"c={dirs['c0']}", "--out", str(out)]
    assert cli.main(argv) == 0
    table = rows((out / "compare.md").read_text())
    # columns: method, runs, pass, precision, recall, F1, lines, no-op, damage
    assert table["a"] == ["a", "2", "<u>60.0 ± 14.1</u>", "<u>50.0 ± 14.1</u>", "<u>50.0 ± 14.1</u>",
                          "<u>50.0 ± 14.1</u>", "<u>3.00 ± 1.41</u>", "<u>62.5 ± 17.7</u>", "<u>12.5 ± 17.7</u>"]
    assert table["b"] == ["b", "3", "**70.0 ± 17.3**", "30.0 ± 0.0", "30.0 ± 0.0", "30.0 ± 0.0",
                          "**1.50 ± 0.00**", "–", "–"]
    # c ties a on pass (both second); fewer lines and less damage are better
    assert table["c"] == ["c", "1", "<u>60.0</u>", "**80.0**", "**80.0**", "**80.0**", "5.00", "**100.0**",
                          "**0.0**"]
    assert not (out / "lambda_sweep.png").exists()


def test_the_sweep_plot_and_bad_arguments(dirs, tmp_path, capsys):
    out = tmp_path / "sweep"
    groups = ["--group", f"λ=1/6={dirs['a0']},{dirs['a1']}", "--group", f"λ=1/2={dirs['b0']}"]
    assert cli.main(["eval", "compare", *groups, "--sweep", "λ=1/6=1/6", "--sweep", "λ=1/2=0.5",
                     "--out", str(out)]) == 0
    png = (out / "lambda_sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    capsys.readouterr()
    bad = [
        ([*groups, "--sweep", "λ=1/6=x"], "expected NAME=X"),
        ([*groups, "--sweep", "nope=0.5", "--sweep", "λ=1/6=1/6"], "--sweep names no group: nope"),
        ([*groups, "--sweep", "λ=1/6=1/6"], "two groups at least"),
        (["--group", f"a={dirs['a0']}", "--group", f"a={dirs['b0']}"], "names repeat: a"),
        (["--group", "a="], "expected NAME=DIR"),
        (["--group", f"a={tmp_path / 'missing'}"], "summary.json"),
        ([dirs["a0"], "--group", f"a={dirs['a0']}"], "not both"),
        ([dirs["a0"], "--sweep", "a=1"], "--sweep is for --group"),
    ]
    for extra, message in bad:
        assert cli.main(["eval", "compare", *extra, "--out", str(tmp_path / "bad")]) == 2, extra
        assert message in capsys.readouterr().err.strip().splitlines()[-1], extra
