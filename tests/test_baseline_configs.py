"""The named baseline configs: the paper's settings, and each tiny variant training 2 steps through
`precisecoder supervised --config NAME`; the reward ablations' terms against a re-derivation."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from advantage_batch import G, batch_scores, batch_tasks
from jaxrl import algorithms as AL
from jaxrl.config import load_config
from jaxrl.prompts import messages
from reward.schema import load_tasks

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "reward" / "examples" / "tasks.jsonl"


@pytest.mark.parametrize("name, objective, epochs, lr, beta", [
    ("rs_sft", "sft", 2, 5e-6, None), ("dpo", "dpo", 1, 5e-7, 0.1), ("recap_refiner", "sft", 6, 5e-6, None)])
def test_named_configs_hold_the_papers_settings(name, objective, epochs, lr, beta):
    for variant in (name, f"{name}_tiny"):
        cfg = load_config(variant)
        sup = cfg.supervised
        assert (sup.objective, sup.epochs, cfg.optimizer.learning_rate) == (objective, epochs, lr), variant
        if beta is not None:
            assert sup.beta == beta
    assert load_config(name).model.family == "qwen3_5" and load_config(f"{name}_tiny").model.family == "qwen3"


def test_lambda_sweep_configs():
    for suffix, lam in (("1_6", 1 / 6), ("1_3", 1 / 3), ("1_2", 1 / 2), ("5_6", 5 / 6)):
        cfg = load_config(f"precisecoder_lam{suffix}")
        assert cfg.algorithm.name == "precisecoder" and math.isclose(cfg.reward.lam, lam, rel_tol=1e-12)
        assert AL.parts("precisecoder", None, None, cfg.reward.lam)[1] == pytest.approx((1 - lam, lam))


def test_ablation_terms_and_advantages_against_a_rederivation():
    """Table 3's rewards on hand-made score rows (unit, precision, recall, f1), re-derived from the
    fields, and their GDPO advantages against a NumPy float64 computation."""
    task, template = batch_tasks()[0], batch_scores()[0]
    rng = np.random.default_rng(0)
    fields = [(int(u), *(None if none else float(v) for v in rng.uniform(0, 1, 3))) for u, none in
              zip(rng.integers(0, 2, 4 * G), rng.uniform(0, 1, 4 * G) < 0.2)]
    scores = [dataclasses.replace(template, unit=u, precision=p, recall=r, f1=f) for u, p, r, f in fields]
    derive = {
        "unit_plus_precision": lambda u, p, r, f: (u, p or 0.0),
        "precision_only": lambda u, p, r, f: (p or 0.0,),
        "recall_only": lambda u, p, r, f: (r or 0.0,),
        "unit_x_precision": lambda u, p, r, f: (u * (p or 0.0),),
        "f1_only": lambda u, p, r, f: (f or 0.0,),
    }
    lam = 1 / 3
    for name, fn in derive.items():
        algorithm = AL.resolve(name, None, None, None, {}, lam)
        got = np.asarray([algorithm.term_values(s, task) for s in scores])
        want = np.asarray([fn(*row) for row in fields], dtype=np.float64)
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert AL.get_algorithm(name).estimator == "gdpo"
        # GDPO: each term standardized within its group (population std + 1e-6), weighted sum, batch z-score
        r_NxGxK = want.reshape(-1, G, want.shape[1])
        per = (r_NxGxK - r_NxGxK.mean(1, keepdims=True)) / (r_NxGxK.std(1, keepdims=True) + 1e-6)
        summed = per @ np.asarray(algorithm.weights)
        expected = (summed - summed.mean()) / (summed.std() + 1e-6)
        adv = np.asarray(algorithm.advantages(r_NxGxK.astype(np.float32), np.ones((r_NxGxK.shape[0], G), np.int32)))
        np.testing.assert_allclose(adv, expected, atol=2e-5, err_msg=name)
    assert AL.parts("unit_plus_precision", None, None, 0.25)[1] == (0.75, 0.25)


def fenced(code):
    return f"```python\n{code}```"


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    tasks = load_tasks(EXAMPLES)
    d = tmp_path_factory.mktemp("rows")
    lines = {
        "rs_sft": [{"task_id": t.task_id, "sample": 0, "text": fenced(t.solution)} for t in tasks],
        "dpo": [{"task_id": t.task_id, "chosen_sample": 0, "rejected_sample": 1, "chosen": fenced(t.solution),
                 "rejected": fenced(t.buggy_code)} for t in tasks],
        "recap_refiner": [{"task_id": t.task_id, "messages": messages("refine", t.prompt, t.buggy_code, t.buggy_code),
                           "response": fenced(t.solution)} for t in tasks],
    }
    for name, rs in lines.items():
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    return d


@pytest.mark.slow  # each run compiles a step of the tiny Qwen3 (vocabulary 151,936): with the DPO resume test 20 min at load 25 to 56
@pytest.mark.parametrize("name", ["rs_sft", "dpo", "recap_refiner"])
def test_each_tiny_config_trains_two_steps(name, rows, tmp_path, capsys):
    from jaxrl.cli import main

    out = tmp_path / name
    argv = ["supervised", "--config", f"{name}_tiny", "--rows", str(rows / f"{name}.jsonl"), "--tasks", str(EXAMPLES),
            "--steps", "2", "--out", str(out), "--set", f"data.train={EXAMPLES}", "--set", "data.build=null",
            "--set", "validation.val_tasks=0", "--set", "validation.gt_debug_tasks=0",
            "--set", "mesh.data=2", "--set", "loss.logp_chunk=64"]
    assert main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    objective = "dpo" if name == "dpo" else "sft"
    assert [r["step"] for r in records] == [1, 2]
    assert all(math.isfinite(r[f"{objective}/loss"]) for r in records)
    # the tiny config's warm-up of 2 steps up to the paper's rate
    peak = 5e-7 if name == "dpo" else 5e-6
    assert [r["learning_rate"] for r in records] == pytest.approx([peak / 2, peak])
    if name == "dpo":
        assert records[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-4)  # the policy is the reference
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["supervised"]["objective"] == objective and saved["supervised"]["rows"] == str(rows / f"{name}.jsonl")
    assert (out / "checkpoints" / "2").is_dir()


def test_eval_refiner_usage(tmp_path, capsys):
    """`eval --refiner RUN` is `--checkpoint RUN --prompt refine`: what clashes is one line, exit 2."""
    from jaxrl.cli import main
    from jaxrl.eval.cli import candidates_file

    common = ["eval", "--tasks", str(EXAMPLES), "--out", str(tmp_path / "out"), "--refiner", str(tmp_path / "run")]
    for extra, message in [([], "--refiner needs --candidates"),
                           (["--candidates", str(tmp_path), "--prompt", "abstain"],
                            "--prompt unless it is refine or demo_refine"),
                           (["--candidates", str(tmp_path), "--model", str(tmp_path)], "drop --model, --checkpoint"),
                           (["--candidates", str(tmp_path)], "predictions.jsonl")]:
        assert main([*common, *extra]) == 2, extra
        assert message in capsys.readouterr().err.strip().splitlines()[-1], extra
    import argparse

    from jaxrl.eval.cli import refiner_source

    for prompt, want in ((None, "refine"), ("demo_refine", "demo_refine")):  # the demo's refiner keeps its prompt
        args = argparse.Namespace(refiner="run", model=None, checkpoint=None, engine=None, prompt=prompt, agent=False,
                                  candidates="c.jsonl")
        refiner_source(args)
        assert (args.checkpoint, args.prompt) == ("run", want)
    (tmp_path / "c.jsonl").write_text("")
    assert candidates_file(str(tmp_path)) == tmp_path / "predictions.jsonl"
    assert candidates_file(str(tmp_path / "c.jsonl")) == tmp_path / "c.jsonl"
