"""The RECAP refiner end to end on the demo domain, with the demo tokenizer and policy: a pool scored
by the fleet, `select recap`'s mix (capped), the supervised trainer, and the demo's refine prompt over the
base's answers from its eval directory (`jaxrl.demo.baselines`, as `demo --with recap` runs them)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import models
from jaxrl import rewards as R
from jaxrl.demo import baselines as B
from jaxrl.demo import run
from jaxrl.demo.policy import new_policy, policy_config
from jaxrl.demo.prompt import answer
from jaxrl.demo.tokenizer import load_demo_tokenizer
from jaxrl.eval.evaluate import build_requests
from jaxrl.eval.protocol import EvalSettings
from reward.fleet import Fleet
from reward.schema import task_to_json, write_jsonl
from reward.score import score_predictions


def test_demo_with_parses_baselines_and_refuses_unknown_names():
    import argparse

    from jaxrl.demo.cli import add_arguments, config_of

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_of(parser.parse_args(["--smoke", "--with", "rs_sft,dpo", "--with", "recap,ea_grpo"]))
    assert cfg.baselines == ("rs_sft", "dpo", "recap") and cfg.methods == ("grpo", "precisecoder", "ea_grpo")
    assert config_of(parser.parse_args(["--smoke"])).baselines == ()
    with pytest.raises(ValueError, match="--with sft: choose from"):
        config_of(parser.parse_args(["--smoke", "--with", "sft"]))


def test_a_run_whose_refiner_had_the_papers_prompt_is_not_resumed_under_the_demos(tmp_path):
    """A run saved with `recap` before `recap_prompt` existed trained its refiner under `refine`: resuming it
    with today's default prompt is refused; a run without the refiner (or any older run) still resumes."""
    from jaxrl.demo.run import DemoConfig, _plain, check_resume

    old = _plain(DemoConfig(baselines=("rs_sft", "recap")))
    del old["baseline"]["recap_prompt"], old["baseline"]["recap_per_task"]
    (tmp_path / "demo_config.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="baseline.recap_prompt: refine there, demo_refine now"):
        check_resume(DemoConfig(baselines=("rs_sft", "recap")), tmp_path)
    check_resume(DemoConfig(baselines=("rs_sft", "recap"), baseline=B.BaselineConfig(recap_prompt="refine")),
                 tmp_path)
    old["baselines"] = ["rs_sft"]
    (tmp_path / "demo_config.json").write_text(json.dumps(old))
    check_resume(DemoConfig(baselines=("rs_sft", "recap")), tmp_path)  # adding the refiner now trains it anew


@pytest.mark.slow  # 8 min at load 28 on 2 cores: a pool scored on the fleet, a short refiner run, two evaluations
def test_refiner_path_end_to_end_on_the_demo_domain(tmp_path):
    cfg = run.DemoConfig(sft_tasks=4, train_tasks=8, test_tasks=4, clean_tasks=2, hidden=32, layers=1, heads=2,
                         baselines=("recap",), baseline=B.BaselineConfig(batch_size=4, recap_epochs=2, recap_per_task=1))
    demo = tmp_path / "runs" / "demo"  # a `demo --with recap --out runs/demo` layout, as docs/demo.md uses it
    splits = run.make_data(cfg, 0, demo / "data")
    tok = load_demo_tokenizer()
    base_dir = demo / "base"
    base = new_policy(policy_config(tok, cfg.hidden, cfg.layers, cfg.heads), 0)
    models.save_pretrained(base, base_dir)
    tok.save_pretrained(base_dir)

    # a pool of three answers per training task, scored on the fleet: the fix, the rewrite, no change
    train = [s.task for s in splits.train]
    texts = [[answer(s.task.solution), answer(s.rewrite()), answer(s.task.buggy_code)] for s in splits.train]
    items = [(t, R.prediction_of(t, text, False)) for t, group in zip(train, texts) for text in group]
    with Fleet(workers=2) as fleet:
        scores = score_predictions(items, fleet.run)
        pool = [{"task_id": t.task_id, "sample": i % 3, "text": p.response, "unit": s.unit, "valid": s.valid,
                 "precision": s.precision, "recall": s.recall, "f1": s.f1, "edited_lines": s.edited_lines}
                for i, ((t, p), s) in enumerate(zip(items, scores))]
        pool_dir = demo / "seed0" / "baselines" / "pool"
        pool_dir.mkdir(parents=True)
        write_jsonl(pool_dir / "pool.jsonl", pool)
        kinds = {"keep": 0, "trim": 0, "repair": 0}
        for row in pool:
            if row["valid"]:
                passing = row["unit"] == 1
                kinds["keep" if passing and row["precision"] == 1 else "trim" if passing else "repair"] += 1
        k = min(kinds["trim"] // 3, kinds["repair"], kinds["keep"])
        assert k >= 2, kinds
        k = min(k, len(train) // 5)  # at most one example a training task (recap_per_task), still at 3:1:1
        rows = B.select_rows(pool_dir, train, cfg.baseline, 0)["recap"]
        assert sorted(r["kind"] for r in rows) == sorted(["trim"] * 3 * k + ["repair"] * k + ["keep"] * k)
        by_id = {t.task_id: t for t in train}
        for r in rows:  # the demo's refine prompt: no system turn, the task's sentence, the code and the candidate
            assert [m["role"] for m in r["messages"]] == ["user"]
            assert r["messages"][0]["content"].startswith(by_id[r["task_id"]].prompt + "\n```python\n")
            assert r["messages"][0]["content"].count("```python") == 2

        # the refiner trains from the base with the supervised trainer on the demo tokenizer
        run_cfg = run.rl_config(cfg, 0, "grpo", base_dir, demo / "data", demo / "seed0" / "rl", False)
        run_dir = B.train_baseline("recap", rows, run_cfg, cfg.baseline, 0, demo / "seed0" / "baselines" / "recap")
        assert run_dir == demo / "seed0" / "baselines" / "recap" / "run"
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert len(records) == 2 * (len(rows) // 4) and all(math.isfinite(r["sft/loss"]) for r in records)

        # the base's one-shot answers as an eval directory, then the refiner over them
        held_out = [s.task for s in splits.test + splits.clean]
        answers = {s.task.task_id: answer(s.rewrite()) for s in splits.test + splits.clean}
        for decoding in run.DECODINGS:
            (demo / "eval" / "base" / decoding).mkdir(parents=True)
            write_jsonl(demo / "eval" / "base" / decoding / "predictions.jsonl",
                        [{"task_id": tid, "response": text} for tid, text in answers.items()])
        candidates = B.base_candidates(demo / "eval" / "base", held_out)
        settings = EvalSettings(prompt="demo_refine", thinking_budget=None, enable_thinking=False)
        requests, replaced = build_requests(held_out, settings, tok, candidates[run.MAIN])
        assert replaced == 0
        for request, task in zip(requests, held_out):
            program = answers[task.task_id].removeprefix("```python\n").removesuffix("\n```")
            assert program in request.messages[-1]["content"]
        from jaxrl.saved_run import load_policy

        policy, _, _ = load_policy(run_dir)
        evals = run.evaluate_policy(policy, cfg, 0, held_out, fleet, demo / "seed0" / "eval" / "recap", False,
                                    prompt_name="demo_refine", candidates=candidates)
        test_only = run.evaluate_policy(policy, cfg, 0, [s.task for s in splits.test], fleet, tmp_path / "test_only",
                                        False, decodings={run.MAIN: run.DECODINGS[run.MAIN]},
                                        prompt_name="demo_refine",
                                        candidates=candidates)[run.MAIN]
    for decoding, result in evals.items():
        assert result.summary["settings"]["prompt"] == "demo_refine"
        assert result.summary["refine_candidates_replaced"] == 0
        assert result.summary["tasks"] == len(held_out)

    # the same refiner through the command line exactly as docs/demo.md writes it (from the directory
    # holding runs/): the answers and scores of the same evaluation in Python
    command = ("precisecoder eval --refiner runs/demo/seed0/baselines/recap/run --candidates runs/demo/eval/base/t0.6 "
               "--prompt demo_refine --tasks runs/demo/data/test.jsonl --no-thinking --max-tokens 80 "
               "--out runs/demo/eval-cli/recap").split()
    assert cfg.max_tokens == 80
    done = subprocess.run([str(Path(sys.executable).parent / command[0]), *command[1:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr

    def responses(d):
        return [(r["task_id"], r["response"]) for r in map(json.loads, (d / "predictions.jsonl").open())]

    cli = demo / "eval-cli" / "recap"
    assert [tid for tid, _ in responses(cli)] == [s.task.task_id for s in splits.test]
    assert responses(cli) == responses(tmp_path / "test_only" / run.MAIN)
    summary = json.loads((cli / "summary.json").read_text())
    assert summary["settings"]["prompt"] == "demo_refine" and summary["refine_candidates_replaced"] == 0
    assert summary["buggy"] == test_only.summary["buggy"]


# 1.3 min at load 3 on 2 cores (beside a demo run): the smoke demo with a pool of 16 × 16 samples, then resumed
@pytest.mark.slow
def test_smoke_demo_with_the_baselines_reports_each_of_them(tmp_path):
    """`demo --smoke --with rs_sft,dpo,recap` end to end through `run_demo`: the pool, the selection, a
    row of every baseline in results.json and report.md (a smoke base passes nothing, so a baseline
    without rows shows "–"), and a resumed run that gives the same pool and results."""
    from jaxrl import cli

    out = tmp_path / "demo"
    argv = ["demo", "--smoke", "--steps", "1", "--with", "rs_sft,dpo,recap", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    pool = [json.loads(line) for line in (out / "seed0" / "baselines" / "pool" / "pool.jsonl").open()]
    assert len(pool) == 16 * 16 and {r["sample"] for r in pool} == set(range(16))
    results = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    for name, label in (("rs_sft", "Rejection-sampling SFT"), ("dpo", "DPO"), ("recap", "RECAP")):
        rows = results["methods"][name]
        assert [r["seed"] for r in rows] == [0], name
        trained = results["timing"]["seeds"][0][f"{name}_rows"] > 0
        assert (rows[0]["pass"] is not None) == trained, name
        assert (out / "seed0" / "eval" / name).is_dir() == trained, name
        assert f"| {label}" in report, name
    recap = out / "seed0" / "baselines" / "recap" / "rows.jsonl"
    for row in map(json.loads, recap.open()) if recap.is_file() else ():
        assert [m["role"] for m in row["messages"]] == ["user"]  # demo_refine: no system turn
    before = (out / "seed0" / "baselines" / "pool" / "pool.jsonl").read_text()
    assert cli.main([*argv, "--resume"]) == 0
    assert (out / "seed0" / "baselines" / "pool" / "pool.jsonl").read_text() == before
    assert json.loads((out / "results.json").read_text())["methods"] == results["methods"]
