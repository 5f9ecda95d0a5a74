"""The demo domain: every task's solution passes, its buggy code fails, rewrites pass, all through the fleet."""

import random

import pytest

from jaxrl.demo import domain
from reward.diff import diff
from reward.fleet import Fleet
from reward.sandbox import Job
from reward.schema import Prediction, task_from_json, task_to_json
from reward.score import score_predictions


@pytest.fixture(scope="module")
def splits():
    return domain.make_splits(seed=3, sft=40, train=40, test=30, clean=15)


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2) as f:
        yield f


def test_generated_tasks_pass_fail_and_rewrites_pass_in_the_sandbox(splits, fleet):
    buggy = splits.sft + splits.train + splits.test
    jobs = ([Job(s.task.solution, s.task.tests) for s in buggy + splits.clean]
            + [Job(s.task.buggy_code, s.task.tests) for s in buggy]
            + [Job(s.rewrite(), s.task.tests) for s in buggy])
    results = fleet.run(jobs)
    n, m = len(buggy) + len(splits.clean), len(buggy)
    assert all(r.passed for r in results[:n]), [r.stderr for r in results[:n] if not r.passed][:1]
    assert not any(r.passed for r in results[n:n + m])
    assert all(r.passed for r in results[n + m:])


def test_one_fault_on_one_line_and_clean_tasks_are_clean(splits):
    for s in splits.test:
        blocks = diff(s.task.buggy_code, s.task.solution)
        assert len(blocks) == 1 and len(blocks[0]) == 1
        assert blocks[0].edits[0].kind == "modify" and blocks[0].edits[0].line == s.task.meta["bug_line"]
        assert not s.task.is_clean
    assert all(s.task.is_clean for s in splits.clean)


def test_splits_are_disjoint_and_deterministic(splits):
    programs = [{s.task.solution for s in part} for part in (splits.sft, splits.train, splits.test, splits.clean)]
    assert sum(map(len, programs)) == len(set().union(*programs))
    again = domain.make_splits(seed=3, sft=40, train=40, test=30, clean=15)
    assert [s.task for s in again.test] == [s.task for s in splits.test]
    other = domain.make_splits(seed=4, sft=40, train=40, test=30, clean=15)
    assert [s.task for s in other.test] != [s.task for s in splits.test]


def test_tasks_round_trip_the_schema(splits):
    for s in splits.test[:5] + splits.clean[:5]:
        assert task_from_json(task_to_json(s.task)) == s.task


def test_the_rewrite_over_edits_exactly_the_swapped_correct_lines(splits):
    for s in splits.test:
        swapped = {i for i, line in enumerate(s.program.lines) if line.swapped and i != s.bug_index}
        blocks = diff(s.task.buggy_code, s.rewrite())
        edited = sum(len(b) for b in blocks)
        assert edited == len(swapped) + 1


def test_description_matches_the_correct_program():
    rng = random.Random(0)
    for _ in range(50):
        program = domain.random_program(rng, domain.DomainConfig())
        for line, text in zip(program.lines, program.describe().split("\n")):
            assert text == f"{line.target} is {line.left} {domain.OP_WORDS[line.op]} {line.right}"
        namespace: dict = {}
        exec(program.code(), namespace)
        for x in [(1, 2, 3)[:len(program.args)], (-4, 7, 0)[:len(program.args)]]:
            assert namespace["f"](*x) == program.evaluate(x)


def test_scorer_sees_minimal_fix_as_precise_and_rewrite_as_over_editing(splits, fleet):
    items = []
    for s in splits.test[:10]:
        items.append((s.task, Prediction(s.task.task_id, code=s.task.solution)))
        items.append((s.task, Prediction(s.task.task_id, code=s.rewrite())))
    scores = score_predictions(items, fleet.run)
    for (task, pred), score in zip(items, scores):
        assert score.unit == 1
        if pred.code == task.solution:
            assert score.precision == 1.0 and score.edited_lines == 1
        else:
            assert score.precision == pytest.approx(1 / score.edited_lines)


def test_each_line_carries_the_correct_programs_words_as_its_comment(splits):
    for s in splits.test:
        code_lines = s.task.buggy_code.splitlines()[1:-1]
        assert [line.split("  # ")[1] for line in code_lines] == s.program.comments()
        assert s.task.prompt == domain.COMMENTED_PROMPT
        bug = code_lines[s.bug_index].split("  # ")[0]
        assert bug != s.program.lines[s.bug_index].code() and bug != s.program.lines[s.bug_index].code(True)


def test_without_comments_the_prompt_describes_every_line():
    cfg = domain.DomainConfig(comments=False)
    for s in domain.generate(0, 10, "plain", cfg):
        assert "#" not in s.task.buggy_code and s.task.prompt == s.program.describe()
        assert s.rewrite() != s.task.buggy_code


def test_without_minus_every_line_of_two_operands_is_swapped():
    cfg = domain.DomainConfig(ops=("+", "*"))
    samples = domain.generate(1, 30, "no-minus", cfg)
    for s in samples:
        assert all(line.op in "+*" and line.swapped == (line.left != line.right) for line in s.program.lines)
    edited = sum(sum(len(b) for b in diff(s.task.buggy_code, s.rewrite())) for s in samples)
    assert edited / len(samples) > 3


def test_ops_must_be_known_and_include_a_commutative_operator():
    for bad in [(), ("-",), ("+", "/")]:
        with pytest.raises(ValueError, match="ops"):
            domain.DomainConfig(ops=bad)
