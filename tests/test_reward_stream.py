"""Streamed scoring (`reward.stream`): groups scored while the engine samples the others give the
same scores, advantages and metrics as scoring all of them after sampling, on the real fleet.

The engine here (`OutOfOrder`) reports each task's group in reverse task order before its call
returns, as an engine that finishes late prompts first would; its answers are of four kinds
(the fix, the buggy code, the fix with a line added beside it, the buggy code with one), so the
scorer runs unit tests, component verifications and window searches. That the `jax` engine
reports every prompt once, with the completions `generate` returns, as soon as its samples stop,
is tests/test_rollout_jax.py's.
"""

import functools
import threading

import pytest

import engines
from jaxrl import rewards as R
from jaxrl.errors import TrainError
from jaxrl.metrics import read_metrics
from jaxrl.rollout import register_engine
from jaxrl.trainer import train
from reward.fleet import Fleet
from reward.sandbox import Limits
from reward.schema import Prediction, load_tasks
from test_trainer_loop import EXAMPLES, TOKENIZER, compile_cache, config, records  # noqa: F401  (compile_cache: an XLA cache)


def with_line_beside_the_fix(code: str, task) -> str:
    """`code` with a comment line added right after the line the reference fix changes (a clean task's
    first line)."""
    fix, bug = task.solution.splitlines(), task.buggy_code.splitlines()
    k = next((i for i, (a, b) in enumerate(zip(fix, bug)) if a != b), 0)
    lines = code.splitlines()
    indent = lines[k][:len(lines[k]) - len(lines[k].lstrip())]
    return "\n".join(lines[:k + 1] + [indent + "# checked"] + lines[k + 1:]) + "\n"


class OutOfOrder(engines.ScriptedEngine):
    """Answer g of a task: the fix, the buggy code, each with a line added beside the fix, in turn;
    groups reported last task first."""

    def code(self, task, g):
        code = task.solution if g % 2 == 0 else task.buggy_code
        return with_line_beside_the_fix(code, task) if g % 4 >= 2 else code

    def generate_each(self, prompts, params, on_prompt):
        groups = self.generate(prompts, params)
        for i in reversed(range(len(groups))):
            on_prompt(i, groups[i])
        return groups


class FailsAfterTwo(OutOfOrder):
    """Reports two groups, then loses its server."""

    def generate_each(self, prompts, params, on_prompt):
        groups = self.generate(prompts, params)
        on_prompt(0, groups[0])
        on_prompt(1, groups[1])
        raise ConnectionError("server went away mid-batch")


register_engine("test-out-of-order")(functools.partial(engines._scripted_from_file, cls=OutOfOrder))
register_engine("test-fails-after-two")(functools.partial(engines._scripted_from_file, cls=FailsAfterTwo))


def run_config(out, engine, stream):
    return config(out, rollout={"engine": engine, "group_size": 4, "max_tokens": 120},
                  reward={"stream": stream}, run={"save_every": 0})


def test_covered_seconds_by_hand():
    assert R.covered_s([], 0.0, 5.0) == 0.0
    assert R.covered_s([(1.0, 2.0), (1.5, 3.0), (4.0, 9.0)], 0.0, 5.0) == 3.0  # overlaps once, clipped at 5
    assert R.covered_s([(-2.0, 1.0), (0.5, 0.7)], 0.0, 5.0) == 1.0  # before the start, inside another
    assert R.covered_s([(6.0, 7.0)], 0.0, 5.0) == 0.0


def test_streamed_groups_score_as_the_pipeline_does_in_any_order():
    tasks = load_tasks(EXAMPLES)
    engine = OutOfOrder(None, {})
    groups = [[(t, Prediction(t.task_id, code=engine.code(t, g))) for g in range(4)] for t in tasks]
    with Fleet(workers=2, cache=False) as fleet:
        pipeline = R.RewardPipeline(fleet, 1 / 3, 1, Limits())
        try:
            want = pipeline([pair for group in groups for pair in group])
            with R.StreamedScoring(pipeline, lambda i, _: groups[i]) as streamed:
                for i in (2, 0, 3, 1):
                    streamed(i, None)
                got = streamed.scores(len(groups))
                with pytest.raises(RuntimeError, match="reported prompt 1 twice"):
                    streamed(1, None)
            with R.StreamedScoring(pipeline, lambda i, _: groups[i]) as streamed:
                streamed(0, None)
                with pytest.raises(RuntimeError, match=r"never reported prompts \[1, 2\]"):
                    streamed.scores(3)
        finally:
            pipeline.close()
        with R.StreamedScoring(pipeline, lambda i, _: groups[i]) as streamed:  # a closed pipeline: no hang
            streamed(0, None)
            with pytest.raises(RuntimeError, match="the reward pipeline is closed"):
                streamed.scores(1)
    assert [s.to_json() for s in got] == [s.to_json() for s in want]
    assert {s.unit for s in got} == {0, 1} and any(c.essential == 1 and len(c.preds) for s in got
                                                  for c in s.components)  # a window search settled
    assert any(s.precision is not None and 0 < s.precision < 1 for s in got)


def test_one_window_a_round_gives_the_same_scores_with_fewer_runs():
    """`window_batch` 1 (the trainer's default) against twice the workers: the same score rows (their
    `runs` diagnostics aside), and no window after a component's first pass, so fewer test runs."""
    tasks = load_tasks(EXAMPLES)
    engine = OutOfOrder(None, {})
    pairs = [(t, Prediction(t.task_id, code=engine.code(t, g))) for t in tasks for g in range(4)]
    scores, runs = {}, {}
    for batch in (1, 4):
        with Fleet(workers=2, cache=False) as fleet:
            pipeline = R.RewardPipeline(fleet, 1 / 3, 1, Limits(), window_batch=batch)
            try:
                scores[batch] = [s.to_json() | {"runs": 0} for s in pipeline(pairs)]
            finally:
                pipeline.close()
            runs[batch] = fleet.stats.runs
    assert scores[1] == scores[4]
    assert runs[1] < runs[4], runs


def test_deferred_verification_scores_as_one_call_and_runs_nothing_twice():
    """The unit-only algorithms' path: groups streamed with the unit runs alone, then
    `DeferredVerification` over the same runs. It gives the one-call scores, and with the fleet's
    cache off, exactly the one-call path's test runs (no unit run made twice)."""
    tasks = load_tasks(EXAMPLES)
    engine = OutOfOrder(None, {})
    groups = [[(t, Prediction(t.task_id, code=engine.code(t, g))) for g in range(4)] for t in tasks]
    pairs = [pair for group in groups for pair in group]
    with Fleet(workers=2, cache=False) as fleet:
        pipeline = R.RewardPipeline(fleet, 1 / 3, 1, Limits())
        try:
            want = pipeline(pairs)
            one_call = fleet.stats.runs
            with R.StreamedScoring(pipeline, lambda i, _: groups[i], verify=False) as streamed:
                for i in reversed(range(len(groups))):
                    streamed(i, None)
                units = streamed.scores(len(groups))
            unit_runs = fleet.stats.runs - one_call
            got = R.DeferredVerification(pipeline, pairs, streamed.done()).result()
        finally:
            pipeline.close()
        deferred = fleet.stats.runs - one_call
    assert [s.to_json() for s in got] == [s.to_json() for s in want]
    assert [s.unit for s in units] == [s.unit for s in want] and {s.status for s in units} == {"unit_only"}
    assert 0 < unit_runs < deferred == one_call


@pytest.mark.slow  # two 2-step GRPO runs: about 45 s on 2 cores
def test_a_grpo_run_with_deferred_verification_equals_one_without(tmp_path):
    """GRPO's terms need only the unit runs: deferring the verification runs past the update changes no
    metric (precision and F1 of the rollouts included) and no update; the wait for them is `time/verify`."""
    for name, defer in (("deferred", True), ("at_once", False)):
        cfg = config(tmp_path / name, rollout={"engine": "test-out-of-order", "group_size": 4, "max_tokens": 120},
                     algorithm={"name": "grpo"}, reward={"defer_verification": defer}, run={"save_every": 0})
        train(cfg, tokenizer=TOKENIZER)
    deferred, at_once = records(tmp_path / "deferred"), records(tmp_path / "at_once")
    assert deferred == at_once
    assert 0 < deferred[0]["rollout/precision"] < 1 and deferred[0]["advantage/abs_mean"] > 0
    assert all("time/verify" in r for r in read_metrics(tmp_path / "deferred" / "metrics.jsonl"))
    assert not any("time/verify" in r for r in read_metrics(tmp_path / "at_once" / "metrics.jsonl"))


@pytest.mark.slow  # two 2-step training runs: 38 s of CPU, 44 to 49 s wall at load 6 to 9
def test_a_streamed_run_equals_an_unstreamed_one_on_the_real_fleet(tmp_path):
    """Every metric but the times, both steps: rewards, advantages, the update (its loss and the
    parameter norm after it). The streamed run also reports the scoring it overlapped."""
    train(run_config(tmp_path / "streamed", "test-out-of-order", True), tokenizer=TOKENIZER)
    train(run_config(tmp_path / "plain", "test-out-of-order", False), tokenizer=TOKENIZER)
    streamed, plain = records(tmp_path / "streamed"), records(tmp_path / "plain")
    assert streamed == plain
    assert len(streamed) == 2 and 0 < streamed[0]["rollout/pass"] < 1 and streamed[0]["advantage/abs_mean"] > 0
    assert 0 < streamed[0]["rollout/precision"] < 1
    times = read_metrics(tmp_path / "streamed" / "metrics.jsonl")
    assert all(r["time/reward_overlap"] >= 0 and r["time/reward"] >= 0 for r in times)
    assert not any("time/reward_overlap" in r for r in read_metrics(tmp_path / "plain" / "metrics.jsonl"))


def test_an_engine_failing_mid_stream_ends_the_run_and_its_scoring_threads(tmp_path):
    before = set(threading.enumerate())  # other tests' threads are not this run's
    with pytest.raises(TrainError, match="server went away mid-batch"):
        train(run_config(tmp_path / "fails", "test-fails-after-two", True), tokenizer=TOKENIZER)
    assert not [t.name for t in set(threading.enumerate()) - before
                if t.name.startswith(("reward-group", "reward-dispatcher"))]

