"""`precisecoder eval --model` end to end: the jax engine on a tiny random Qwen3.5 with the real tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from eval_fakes import TASKS
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from jaxrl import cli
from reward.schema import write_tasks

TINY = dict(vocab_size=248320, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"], num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
            linear_num_value_heads=4, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen3_5")
    torch.manual_seed(0)
    Qwen3_5ForCausalLM(Qwen3_5TextConfig(**TINY)).save_pretrained(path)
    return path


def common(model_dir, tmp_path) -> list[str]:
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, TASKS)
    return ["eval", "--tasks", str(tasks), "--model", str(model_dir), "--dtype", "float32", "--temperature", "0",
            "--thinking-budget", "4", "--max-tokens", "10", "--clean-thinking-budget", "6", "--samples", "2",
            "--workers", "2", "--no-progress"]


def test_eval_with_the_jax_engine(model_dir, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    assert cli.main([*common(model_dir, tmp_path), "--out", str(tmp_path / "a")]) == 0
    preds = [json.loads(x) for x in (tmp_path / "a" / "predictions.jsonl").read_text().splitlines()]
    assert [(p["task_id"], p["sample"]) for p in preds] == [(t.task_id, k) for t in TASKS for k in range(2)]
    for p in preds:
        clean = p["task_id"].endswith("#clean")
        assert p["think_opened"] is True  # Qwen3.5's template opens <think> with thinking on
        assert p["completion_tokens"] <= (12 if clean else 10)
        if p["budget_hit"]:  # the engine closed the think block after the budget
            assert "</think>" in p["response"] and p["thinking"] is not None
    assert any(p["budget_hit"] for p in preds)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["model"]["engine"] == "jax" and summary["model"]["name"] == model_dir.name
    assert summary["settings"]["clean_max_tokens"] == 12 and summary["samples"] == 10

    assert cli.main(["score", "--tasks", str(tasks), "--predictions", str(tmp_path / "a" / "predictions.jsonl"),
                     "--out", str(tmp_path / "scored.jsonl"), "--workers", "2", "--no-progress"]) == 0
    assert (tmp_path / "scored.jsonl").read_text() == (tmp_path / "a" / "scores.jsonl").read_text()


@pytest.mark.slow
def test_greedy_eval_does_not_depend_on_batching(model_dir, tmp_path):
    args = common(model_dir, tmp_path)
    assert cli.main([*args, "--out", str(tmp_path / "a")]) == 0
    assert cli.main([*args, "--out", str(tmp_path / "b"), "--batch-size", "2"]) == 0
    assert (tmp_path / "b" / "predictions.jsonl").read_text() == (tmp_path / "a" / "predictions.jsonl").read_text()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A run directory as `precisecoder train` leaves it: config.yaml and an Orbax checkpoint at step 7."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl import train_step as ts
    from jaxrl.checkpoint import Checkpointer
    from jaxrl.config import load_config, to_yaml
    from jaxrl.saved_run import build_model
    from models import sharding as msh

    run = tmp_path_factory.mktemp("run")
    cfg = load_config("tiny")
    (run / "config.yaml").write_text(to_yaml(cfg))
    rules = msh.rules_from_mapping(cfg.mesh.rules)
    mesh = msh.make_mesh(1, -1, 1)
    model = build_model(cfg, mesh, rules)
    state, graphdef, rest = ts.init_train_state(model, ts.make_optimizer(cfg.optimizer), mesh, rules)
    moved = jax.tree.map(lambda x: x + 0.01, state.params)  # not the initialisation
    state = ts.TrainState(step=jnp.asarray(7, jnp.int32), params=moved, opt_state=state.opt_state)
    ckpt = Checkpointer(run / "checkpoints", async_save=False)
    ckpt.save(state, jax.random.key(0))
    ckpt.close()
    return run, nnx.merge(graphdef, moved, rest)


def test_open_checkpoint_restores_the_saved_policy(trained_run):
    import jax
    import numpy as np
    from flax import nnx

    from jaxrl.eval.sources import SourceError, open_checkpoint
    from jaxrl.errors import TrainError
    from jaxrl.saved_run import locate_run

    run, saved = trained_run
    assert locate_run(run) == (run, run / "checkpoints", None)
    assert locate_run(run / "checkpoints") == (run, run / "checkpoints", None)
    assert locate_run(run / "best" / "7") == (run, run / "best", 7)
    engine, tokenizer, model = open_checkpoint(str(run / "checkpoints" / "7"))
    assert model["name"] == "tiny@7" and model["step"] == 7 and tokenizer.family == "qwen3"
    for a, b in zip(jax.tree.leaves(engine.state), jax.tree.leaves(nnx.split(saved)[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    engine.close()
    with pytest.raises(TrainError, match="no config.yaml"):
        locate_run(run.parent / "nowhere")
    with pytest.raises(SourceError, match="no config.yaml"):
        open_checkpoint(str(run.parent / "nowhere"))
    with pytest.raises(SourceError, match="checkpoint"):
        open_checkpoint(str(run / "checkpoints" / "8"))


@pytest.mark.slow
def test_eval_from_a_checkpoint(trained_run, tmp_path):
    run, _ = trained_run
    tasks = tmp_path / "tasks.jsonl"
    write_tasks(tasks, TASKS)
    assert cli.main(["eval", "--tasks", str(tasks), "--checkpoint", str(run), "--temperature", "0",
                     "--thinking-budget", "4", "--max-tokens", "8", "--clean-thinking-budget", "4",
                     "--workers", "2", "--no-progress", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["model"]["name"] == "tiny@7" and summary["samples"] == len(TASKS)


def test_eval_from_a_relative_checkpoint_path(trained_run, tmp_path, monkeypatch):
    """`eval --checkpoint runs/x/checkpoints/7 --tasks t.jsonl --out ev` as a user types it, from the working directory."""
    run, _ = trained_run
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "x").symlink_to(run)
    write_tasks(tmp_path / "t.jsonl", TASKS[:1])
    monkeypatch.chdir(tmp_path)
    assert cli.main(["eval", "--tasks", "t.jsonl", "--checkpoint", "runs/x/checkpoints/7", "--temperature", "0",
                     "--thinking-budget", "2", "--max-tokens", "4", "--clean-thinking-budget", "2",
                     "--workers", "1", "--no-progress", "--out", "ev"]) == 0
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["model"]["step"] == 7 and summary["samples"] == 1
