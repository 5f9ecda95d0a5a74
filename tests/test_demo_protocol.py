"""The demo's protocol: paired differences with a t interval, lines over passing answers, the base chosen
on SFT validation loss, and the verdict cache shared by everything (seeded with the domain's known verdicts)."""

import dataclasses
import math
import types

import numpy as np
import pytest
from scipy import stats

from jaxrl.demo import domain, prompt, sft
from jaxrl.demo import report as rep
from jaxrl.demo.policy import new_policy, policy_config
from jaxrl.demo.run import known_verdicts, seed_fleet
from jaxrl.demo.tokenizer import DemoTokenizer
from reward.fleet import Fleet
from reward.sandbox import Limits
from reward.schema import Prediction
from reward.score import canonical_job, limits_for, score_predictions


def test_t_interval_matches_scipy_and_the_table_value():
    diffs = [12.0, 4.5, 9.0]
    mean, low, high = rep.t_interval(diffs)
    ci = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert math.isclose(low, ci.low, rel_tol=1e-9) and math.isclose(high, ci.high, rel_tol=1e-9)
    sd = np.std(diffs, ddof=1)  # by hand: t_{0.975, 2} = 4.302653
    assert math.isclose(mean, 8.5) and math.isclose(high - mean, 4.302653 * sd / math.sqrt(3), rel_tol=1e-6)
    with pytest.raises(ValueError):
        rep.t_interval([1.0])


def test_paired_differences_pair_rows_by_seed_and_match_scipy_paired_t():
    grpo = [{"seed": s, "lines": l, "precision": p} for s, l, p in ((0, 3.1, 35.0), (1, 3.0, 36.0), (2, 3.2, 30.0))]
    pc = [{"seed": s, "lines": l, "precision": p} for s, l, p in ((2, 2.8, 34.0), (0, 2.2, 51.0), (1, 2.5, 42.0))]
    d = rep.paired_differences(pc, grpo, ("lines", "precision"))
    assert d["precision"]["per_seed"] == [4.0, 16.0, 6.0]
    ci = stats.ttest_rel([51.0, 42.0, 34.0], [35.0, 36.0, 30.0]).confidence_interval(0.95)
    assert math.isclose(d["precision"]["low"], ci.low) and math.isclose(d["precision"]["high"], ci.high)
    assert math.isclose(d["lines"]["mean"], np.mean([2.2 - 3.1, 2.5 - 3.0, 2.8 - 3.2]))
    one = rep.paired_differences(pc[:1], grpo, ("lines",))["lines"]
    assert one["low"] is None and math.isclose(one["mean"], 2.8 - 3.2)
    assert "| precision % | +4.0, +16.0, +6.0 | +8.7 |" in rep.paired_table(d)


def test_lines_over_passing_answers_only():
    S = lambda **k: types.SimpleNamespace(**k)  # noqa: E731
    scores = [S(valid=True, damage=None, edited_lines=1, unit=1), S(valid=True, damage=None, edited_lines=4, unit=1),
              S(valid=True, damage=None, edited_lines=0, unit=0), S(valid=False, damage=None, edited_lines=None, unit=0),
              S(valid=True, damage=0, edited_lines=3, unit=1)]
    assert rep.lines_passing(scores) == 2.5
    assert rep.lines_passing(scores[2:4]) is None


def test_the_sft_validation_split_is_disjoint_and_leaves_the_other_sets_as_they_were():
    without = domain.make_splits(2, 30, 20, 10, 5)
    with_val = domain.make_splits(2, 30, 20, 10, 5, sft_val=12)
    for part in ("sft", "train", "test", "clean"):
        assert [s.task for s in getattr(with_val, part)] == [s.task for s in getattr(without, part)]
    assert without.sft_val == [] and len(with_val.sft_val) == 12
    others = {s.task.solution for part in (with_val.sft, with_val.train, with_val.test, with_val.clean) for s in part}
    assert not others & {s.task.solution for s in with_val.sft_val}


def test_candidate_steps_are_fixed_by_the_config():
    assert sft.candidate_steps(sft.SFTConfig()) == [700, 800, 900, 1000, 1100, 1200, 1300]
    assert sft.candidate_steps(sft.SFTConfig(steps=4, warmup_steps=1)) == [4]
    assert sft.candidate_steps(sft.SFTConfig(steps=250, select_every=100, warmup_steps=1)) == [200, 250]


# 52 s at load 12 (nice 15) on 2 cores, most of it compiling the SFT step
@pytest.mark.slow
def test_the_kept_base_is_the_candidate_of_lowest_validation_loss():
    tok = DemoTokenizer()
    train, val = domain.generate(0, 16, "sel-train"), domain.generate(0, 8, "sel-val")
    tokens, mask = sft.encode_pairs(tok, sft.sft_pairs(train, 0.5, 0)[0])
    vt, vm = sft.encode_pairs(tok, sft.sft_pairs(val, 0.5, 1)[0])
    # the rate rises to 5 over the run (a warm-up of 7 of 8 steps): the late steps diverge, so the
    # candidate kept is not the last one, and the model must hold that earlier candidate
    cfg = sft.SFTConfig(steps=8, batch_size=4, warmup_steps=7, learning_rate=5.0, select_every=1)
    model = new_policy(policy_config(tok, 16, 1, 2), 0)
    losses, chosen = sft.train_sft_best(model, tokens, mask, vt, vm, cfg, 0)
    assert len(losses) == 8 and sorted(chosen["val_losses"]) == [4, 5, 6, 7, 8]
    assert chosen["step"] < 8
    assert chosen["val_loss"] == min(chosen["val_losses"].values())
    assert chosen["val_losses"][chosen["step"]] == chosen["val_loss"]
    import jax.numpy as jnp
    held = float(sft.nll(model, jnp.asarray(vt), jnp.asarray(vm)))
    assert math.isclose(held, chosen["val_loss"], rel_tol=1e-4)


# ---- the verdict cache ----------------------------------------------------------------

@pytest.fixture(scope="module")
def tasks():
    return [s.task for s in domain.generate(5, 6, "cache")]


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2) as f:
        yield f


def _score(fleet, pairs):
    return score_predictions(pairs, fleet.run, window_batch=4)


def test_the_same_task_and_program_scored_twice_runs_the_sandbox_once(tasks):
    with Fleet(workers=2) as fleet:
        pairs = [(t, Prediction(t.task_id, response=prompt.answer(t.buggy_code.replace("+", "*", 1))))
                 for t in tasks[:3]]
        first = _score(fleet, pairs)
        runs = fleet.stats.runs
        assert runs > 0
        again = _score(fleet, pairs)
        assert fleet.stats.runs == runs
        assert [s.unit for s in again] == [s.unit for s in first] and [s.f1 for s in again] == [s.f1 for s in first]


def test_a_cached_verdict_equals_a_fresh_one_on_a_sample_of_programs(tasks, fleet):
    samples = domain.generate(5, 6, "cache")
    programs = [(s.task, p) for s in samples for p in (s.task.solution, s.task.buggy_code, s.rewrite(),
                                                       s.task.solution.replace("+", "*", 1))]
    jobs = [canonical_job(p, t.tests, limits_for(t, Limits())) for t, p in programs]
    cached = fleet.run(jobs)
    cached = fleet.run(jobs)
    assert all(r.cached for r in cached)
    with Fleet(workers=2, cache=False) as fresh_fleet:
        fresh = fresh_fleet.run(jobs)
    assert [(r.passed, r.status) for r in cached] == [(r.passed, r.status) for r in fresh]
    assert {r.passed for r in fresh} == {True, False}


def test_seeded_verdicts_equal_fresh_ones_and_save_their_runs(tasks):
    with Fleet(workers=2) as fleet:
        added = seed_fleet(fleet, tasks, 5.0)
        assert added == 2 * len(tasks) - 2  # the probe task's two runs are real and cached
        assert fleet.stats.runs == 2
        jobs = [job for job, _ in known_verdicts(tasks, Limits(), None, None)]
        seeded = fleet.run(jobs)
        assert fleet.stats.runs == 2 and all(r.cached for r in seeded)
    with Fleet(workers=2, cache=False) as fresh_fleet:
        fresh = fresh_fleet.run(jobs)
    assert [(r.passed, r.status) for r in seeded] == [(r.passed, r.status) for r in fresh]
    assert [r.passed for r in seeded] == [True, False] * len(tasks)


def test_one_changed_character_never_hits_the_cache(tasks):
    changed = []
    for t in tasks:
        for i, ch in enumerate(t.solution):  # every digit and operator of the solution changed in turn
            swap = {"+": "*", "*": "+"}.get(ch) or (str(int(ch) % 9 + 1) if ch.isdigit() else None)
            if swap:
                changed.append(canonical_job(t.solution[:i] + swap + t.solution[i + 1:], t.tests,
                                             limits_for(t, Limits())))
    known = [j for j, _ in known_verdicts(tasks, Limits(), None, None)]
    # a change that gives back the buggy code is that program (a hit there says "fail", rightly)
    changed = [j for j in changed if j.key() not in {k.key() for k in known}]
    assert len({j.key() for j in changed}) == len(changed) > 20
    with Fleet(workers=2) as fleet:
        seed_fleet(fleet, tasks, 5.0)
        fleet.run(known)
        runs = fleet.stats.runs
        results = fleet.run(changed)
        assert fleet.stats.runs == runs + len(changed) and not any(r.cached for r in results)
    with Fleet(workers=2, cache=False) as fresh_fleet:
        fresh = fresh_fleet.run(changed)
    assert [(r.passed, r.status) for r in results] == [(r.passed, r.status) for r in fresh]
    assert sum(not r.passed for r in results) > len(results) // 2


def test_seeding_keeps_what_is_cached_and_refuses_timeouts(tasks):
    with Fleet(workers=1) as fleet:
        job = canonical_job(tasks[0].solution, tasks[0].tests, limits_for(tasks[0], Limits()))
        real = fleet.run([job])[0]
        timeout = dataclasses.replace(real, passed=False, status="timeout")
        assert fleet.seed([(job, dataclasses.replace(real, passed=False, status="fail"))]) == 0
        other = canonical_job(tasks[1].solution, tasks[1].tests, limits_for(tasks[1], Limits()))
        assert fleet.seed([(other, timeout)]) == 0
        assert fleet.run([job])[0].passed and fleet.stats.seeded == 0
    with Fleet(workers=1, cache=False) as uncached:
        assert uncached.seed([(job, real)]) == 0
