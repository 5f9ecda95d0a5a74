"""`precisecoder pool`: rows scored by the real scorer on the real fleet, resume, refusals, and the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from engines import ScriptedEngine

from jaxrl import cli
from jaxrl.pool import POOL, PoolError, PoolSettings, build_pool
from jaxrl.selection import read_pool, select_dpo, select_sft
from jaxrl.tasks import render
from models.tokenizer import load_tokenizer
from reward.fleet import Fleet
from reward.schema import Prediction, load_tasks
from reward.score import score_predictions

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "reward" / "examples" / "tasks.jsonl"
FIELDS = {"task_id", "sample", "text", "token_ids", "unit", "precision", "recall", "f1", "edited_lines", "valid",
          "think_opened", "finish_reason", "status"}
SETTINGS = PoolSettings(n=4, max_tokens=2048, thinking_budget=None)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("qwen3")


@pytest.fixture(scope="module")
def fleet():
    with Fleet(workers=2) as f:
        yield f


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(EXAMPLES)


class CountingEngine(ScriptedEngine):
    """The scripted engine (even samples: the reference fix; odd: the buggy code) that counts prompts
    and can fail on a given call."""

    def __init__(self, tokenizer, tasks, fail_on_call=None):
        super().__init__(tokenizer, {render(t, tokenizer, "minimal").prompt_ids: t for t in tasks})
        self.prompts, self.calls, self.fail_on_call = 0, 0, fail_on_call

    def generate(self, prompts, params):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise ConnectionError("the server went away")
        self.prompts += len(prompts)
        return super().generate(prompts, params)


def rows(directory):
    return [json.loads(line) for line in (Path(directory) / POOL).read_text().splitlines()]


def test_rows_are_the_scorers_scores_of_each_sample(tok, fleet, tasks, tmp_path):
    counts = build_pool(CountingEngine(tok, tasks), tok, tasks, SETTINGS, fleet, tmp_path, batch_size=3)
    got = rows(tmp_path)
    assert [(r["task_id"], r["sample"]) for r in got] == [(t.task_id, k) for t in tasks for k in range(4)]
    assert all(set(r) == FIELDS for r in got)
    by_id = {t.task_id: t for t in tasks}
    want = score_predictions([(by_id[r["task_id"]], Prediction(r["task_id"], response=r["text"], think_opened=False))
                              for r in got], fleet.run)
    for r, s in zip(got, want):
        assert (r["unit"], r["precision"], r["recall"], r["f1"], r["edited_lines"], r["valid"]) == \
               (s.unit, s.precision, s.recall, s.f1, s.edited_lines, s.valid)
        assert tok.decode(r["token_ids"]).startswith(r["text"]) and not r["text"].endswith("<|im_end|>")
    # The scripted engine answers the reference fix on even samples and the buggy code on odd ones;
    # the last example is a clean task, where the "buggy" code passes too and precision is undefined.
    buggy = [r for r in got if r["task_id"] != "example/clamp#clean"]
    assert [r["unit"] for r in buggy] == [1, 0] * 6
    assert [r["precision"] for r in buggy if r["sample"] % 2 == 0] == [1.0] * 6
    clean = [r for r in got if r["task_id"] == "example/clamp#clean"]
    assert [(r["unit"], r["precision"], r["edited_lines"]) for r in clean] == [(1, None, 0)] * 4
    assert counts == {"tasks": 4, "samples": 16, "passing": 10, "tasks_with_a_pass": 4, "valid": 16}
    # The pool is what selection reads.
    pool = read_pool(tmp_path)
    assert [(r["task_id"], r["sample"]) for r in select_sft(pool, "precision")] == \
           [(t.task_id, k) for t in tasks for k in (0, 2)][:6] + [("example/clamp#clean", 0), ("example/clamp#clean", 1)]
    # Buggy tasks rank 0, 2 (1.5) over 1, 3 (0): pairs (0, 1) and (2, 3); the clean task ties and gives none.
    assert [(p["task_id"][8:], p["chosen_sample"], p["rejected_sample"]) for p in select_dpo(pool)] == \
           [(name, *pair) for name in ("add#b0", "triangle#b0", "max_run#b0") for pair in ((0, 1), (2, 3))]


def test_resume_after_a_failed_engine_samples_only_the_rest(tok, fleet, tasks, tmp_path):
    with pytest.raises(PoolError, match=r"the 2 tasks done are kept .*rerun the same command"):
        build_pool(CountingEngine(tok, tasks, fail_on_call=2), tok, tasks, SETTINGS, fleet, tmp_path, batch_size=2)
    assert len(rows(tmp_path)) == 8
    # A kill mid-write leaves a torn line and a task with fewer rows than n: both are redone.
    with open(tmp_path / POOL, "a") as f:
        f.write(json.dumps({**rows(tmp_path)[0], "task_id": tasks[2].task_id}) + "\n" + '{"task_id": "x", "sam')
    engine = CountingEngine(tok, tasks)
    build_pool(engine, tok, tasks, SETTINGS, fleet, tmp_path, batch_size=2)
    assert engine.prompts == 2
    fresh = tmp_path / "fresh"
    build_pool(CountingEngine(tok, tasks), tok, tasks, SETTINGS, fleet, fresh, batch_size=2)
    assert rows(tmp_path) == rows(fresh)


def test_a_directory_with_other_settings_is_refused(tok, fleet, tasks, tmp_path):
    build_pool(CountingEngine(tok, tasks), tok, tasks[:1], SETTINGS, fleet, tmp_path)
    with pytest.raises(PoolError, match="holds a pool with other settings"):
        build_pool(CountingEngine(tok, tasks), tok, tasks[:1], PoolSettings(n=2), fleet, tmp_path)
    with pytest.raises(PoolError, match="holds a pool with other tasks"):
        build_pool(CountingEngine(tok, tasks), tok, tasks, SETTINGS, fleet, tmp_path)


ARCH = dict(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)


def _config(path, **rollout):
    cfg = {"name": "pool-test", "model": {"family": "qwen3", "architecture": ARCH, "dtype": "float32", "remat": False},
           "data": {"train": str(EXAMPLES)}, "reward": {"workers": 2},
           "rollout": {"max_tokens": 12, "thinking_budget": 6, **rollout}, "run": {"out": str(path.parent / "run")}}
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_the_command_with_a_config_and_its_engine(tmp_path, capsys, monkeypatch):
    config = _config(tmp_path / "c.yaml", engine="test-scripted", options={"tasks": str(EXAMPLES)})
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["pool", "--config", "c.yaml", "--n", "2", "--out", "pool", "--limit", "3", "--no-progress"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out.strip().splitlines()[-1]) == {"tasks": 3, "samples": 6, "passing": 3,
                                                            "tasks_with_a_pass": 3, "valid": 6}
    assert len(rows(tmp_path / "pool")) == 6
    assert config.exists()


@pytest.mark.slow  # about a minute: compiles the embedded sampler
def test_the_command_samples_with_the_jax_engine(tmp_path, capsys):
    """The real embedded sampler on a random one-layer Qwen3: rows of its tokens, scored (invalid: noise)."""
    config = _config(tmp_path / "c.yaml")
    rc = cli.main(["pool", "--config", str(config), "--n", "2", "--out", str(tmp_path / "pool"), "--limit", "2",
                   "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0, err
    got = rows(tmp_path / "pool")
    assert [(r["task_id"], r["sample"]) for r in got] == [(t, k) for t in ("example/add#b0", "example/triangle#b0")
                                                          for k in range(2)]
    assert all(0 < len(r["token_ids"]) <= 12 and r["valid"] is False and r["unit"] == 0 for r in got)


@pytest.mark.parametrize("argv, message", [
    (["pool", "--config", "{missing}", "--out", "{out}"], "config error"),
    (["pool", "--config", "{config}", "--n", "0", "--out", "{out}"], "must be >= 1"),
    (["pool", "--config", "{config}", "--set", "data.train={missing}", "--out", "{out}"], "no such file"),
])
def test_usage_errors_exit_2(tmp_path, capsys, argv, message):
    fill = {"config": _config(tmp_path / "c.yaml"), "missing": tmp_path / "missing.yaml", "out": tmp_path / "pool"}
    try:
        rc = cli.main([a.format(**fill) for a in argv])
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_engine_lookup_of_the_trainers_set_up_works_in_a_fresh_process():
    """`make_engine_for` (pool, supervised validation) read the registry without importing the built-in
    engine first: `KeyError: 'jax'` in a fresh process, which no in-process test saw once another test
    had registered it. This runs the lookup where nothing is registered yet."""
    code = ("import types; import jaxrl.run as r; from jaxrl.rollout.engine import ENGINES; assert not ENGINES; "
            "r.make_engine = lambda name, **kwargs: sorted(kwargs); "
            "cfg = types.SimpleNamespace(rollout=types.SimpleNamespace(engine='jax', options={})); "
            "print(r.make_engine_for(cfg, 'model', 'tokenizer', 'mesh', ()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parents[1], env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "['mesh', 'model', 'rules', 'tokenizer']"
