"""Task and prediction JSONL: validation errors name file, line and field; writers round-trip."""

from __future__ import annotations

import json
import re

import pytest

from reward.sandbox import Job
from reward.schema import (AssertTests, IOCase, IOTests, Prediction, SchemaError, Task, UnittestTests,
                           load_predictions, load_tasks, write_predictions, write_tasks)
from reward.schema import tests_from_json as parse_tests, tests_to_json as to_json

GOOD = {"task_id": "t1", "base_id": "b", "prompt": "p", "buggy_code": "x = 1\n", "solution": "x = 2\n",
        "tests": {"kind": "assert", "code": "assert x == 2"}}


def write_lines(path, *objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def test_round_trip(tmp_path):
    tasks = [Task("a", "A", "p", "x=1", "x=2", AssertTests("assert x == 2"), epsilon=0, timeout_s=2.5,
                  meta={"faults": 1, "ops": ["swap"]}),
             Task("b", "B", "p", "print(1)", "print(1)", IOTests((IOCase("", "1\n"), IOCase("in", "1"))))]
    write_tasks(tmp_path / "t.jsonl", tasks)
    loaded = load_tasks(tmp_path / "t.jsonl")
    assert loaded == tasks and loaded[0].meta == tasks[0].meta
    assert loaded[1].is_clean and not loaded[0].is_clean
    whitespace_only = Task("c", "C", "p", "x = 1\n\n\ny = 2   \n", "x = 1\ny = 2\n", AssertTests("pass"))
    assert whitespace_only.is_clean  # m = 0: the spec's diff ignores blank lines and trailing spaces
    preds = [Prediction("a", response="```python\nx=2\n```"), Prediction("b", code="print(1)"),
             Prediction("a", response="r", code="c")]
    write_predictions(tmp_path / "p.jsonl", preds)
    assert load_predictions(tmp_path / "p.jsonl") == preds


def test_unittest_tests_round_trip_and_always_run_inprocess(tmp_path):
    code = "import unittest\nclass TestCases(unittest.TestCase):\n    def test_x(self):\n        self.assertEqual(x, 2)\n"
    tests = UnittestTests(code)
    assert to_json(tests) == {"kind": "unittest", "code": code}
    assert parse_tests({"kind": "unittest", "code": code, "mode": "inprocess"}) == tests
    assert Job("x = 2", tests).mode == "inprocess" and Job("x = 2", AssertTests("")).mode == "proxy"
    task = Task("u", "U", "p", "x = 1\n", "x = 2\n", tests)
    write_tasks(tmp_path / "t.jsonl", [task])
    assert load_tasks(tmp_path / "t.jsonl") == [task] and not task.forgeable


@pytest.mark.parametrize("mutate, message", [
    (lambda o: o.pop("solution"), "missing field 'solution'"),
    (lambda o: o.update(prompt=3), "field 'prompt' must be a string"),
    (lambda o: o.update(tests={"kind": "unit"}), "field 'tests.kind'"),
    (lambda o: o.update(tests={"kind": "assert"}), "field 'tests.code'"),
    (lambda o: o.update(tests={"kind": "unittest"}), "field 'tests.code'"),
    (lambda o: o.update(tests={"kind": "unittest", "code": "", "mode": "proxy"}), "field 'tests.mode'"),
    (lambda o: o.update(tests={"kind": "io", "cases": []}), "field 'tests.cases'"),
    (lambda o: o.update(tests={"kind": "io", "cases": [{"stdin": ""}]}), "field 'tests.cases[0].stdout'"),
    (lambda o: o.update(epsilon=-1), "field 'epsilon'"),
    (lambda o: o.update(epsilon=True), "field 'epsilon'"),
    (lambda o: o.update(timeout_s=0), "field 'timeout_s'"),
    (lambda o: o.update(meta=[1]), "field 'meta'"),
])
def test_bad_task_names_file_line_and_field(tmp_path, mutate, message):
    bad = dict(GOOD, task_id="t2")
    mutate(bad)
    path = write_lines(tmp_path / "tasks.jsonl", GOOD, "", bad)
    with pytest.raises(SchemaError, match=re.escape(message)) as err:
        load_tasks(path)
    assert err.value.line == 3 and str(path) in str(err.value) and ":3:" in str(err.value)


def test_malformed_json_and_duplicates(tmp_path):
    with pytest.raises(SchemaError, match=r":2: malformed JSON"):
        load_tasks(write_lines(tmp_path / "a.jsonl", GOOD, '{"task_id": '))
    with pytest.raises(SchemaError, match=r":2: duplicate task_id 't1'"):
        load_tasks(write_lines(tmp_path / "b.jsonl", GOOD, GOOD))
    with pytest.raises(SchemaError, match=r":1: record must be a JSON object"):
        load_tasks(write_lines(tmp_path / "c.jsonl", "[1, 2]"))


def test_bad_predictions(tmp_path):
    with pytest.raises(SchemaError, match=r":1: a prediction needs a 'response' or a 'code'"):
        load_predictions(write_lines(tmp_path / "a.jsonl", {"task_id": "t"}))
    with pytest.raises(SchemaError, match=r":2: missing field 'task_id'"):
        load_predictions(write_lines(tmp_path / "b.jsonl", {"task_id": "t", "code": ""}, {"code": "x"}))
    with pytest.raises(SchemaError, match=r"field 'code' must be a string"):
        load_predictions(write_lines(tmp_path / "c.jsonl", {"task_id": "t", "code": 1}))


def test_a_task_asks_for_loopback_and_its_runs_get_it():
    from reward.sandbox import Limits, limits_for
    from reward.schema import task_from_json, task_to_json

    base = {"task_id": "t", "base_id": "b", "prompt": "p", "buggy_code": "x = 1\n", "solution": "x = 2\n",
            "tests": {"kind": "assert", "code": "assert x == 2\n"}}
    plain, networked = task_from_json(base), task_from_json({**base, "loopback": True})
    assert not limits_for(plain, Limits()).loopback and limits_for(networked, Limits()).loopback
    assert "loopback" not in task_to_json(plain) and task_from_json(task_to_json(networked)) == networked
    with pytest.raises(ValueError, match="'loopback' must be true or false"):
        task_from_json({**base, "loopback": "yes"})
