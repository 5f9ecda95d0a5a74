"""The supervised trainer: SFT and DPO steps on a random one-layer Qwen3, resume, the reference
log-probs stored with the pairs, and a run directory that `load_policy` opens."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

from jaxrl.config import Config, from_dict
from jaxrl.supervised import SupervisedConfig, SupervisedError, batch_indices, train_supervised
from jaxrl.saved_run import load_policy
from reward.schema import load_tasks, write_tasks

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "reward" / "examples" / "tasks.jsonl"
ARCH = dict(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)


def config(out, gt_debug=None, **optimizer):
    """The run's config; with `gt_debug` (a file of clean tasks), validation on 2 example tasks and it."""
    data = {"train": str(EXAMPLES), **({"val": str(EXAMPLES), "gt_debug": str(gt_debug)} if gt_debug else {})}
    return from_dict(Config, {
        "name": "sup", "data": data, "reward": {"workers": 2},
        "validation": {"val_tasks": 2, "max_tokens": 12, "thinking_budget": 6,
                       "gt_debug_thinking_budget": 6},
        "model": {"family": "qwen3", "architecture": ARCH, "dtype": "float32", "remat": False},
        "optimizer": {"learning_rate": 1e-2, "warmup_steps": 1, **optimizer},
        "mesh": {"data": 2, "fsdp": -1, "tensor": 1}, "loss": {"logp_chunk": 64},
        "run": {"out": str(out), "save_every": 1, "eval_every": 0, "tensorboard": False}})


def fenced(code):
    return f"<think>\nok\n</think>\n\n```python\n{code}```"


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    tasks = load_tasks(EXAMPLES)
    d = tmp_path_factory.mktemp("rows")
    (d / "sft.jsonl").write_text("".join(json.dumps({"task_id": t.task_id, "sample": 0, "text": fenced(t.solution)})
                                         + "\n" for t in tasks))
    (d / "dpo.jsonl").write_text("".join(json.dumps({"task_id": t.task_id, "chosen_sample": 0, "rejected_sample": 1,
                                                     "chosen": fenced(t.solution), "rejected": fenced(t.buggy_code)})
                                         + "\n" for t in tasks))
    return d


def metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def test_batches_are_a_function_of_the_step():
    seen = np.concatenate([batch_indices(10, 3, 7, s) for s in range(3)])
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 9  # one epoch: 3 of 3-row batches, 1 row skipped
    assert (batch_indices(10, 3, 7, 4) == batch_indices(10, 3, 7, 4)).all()
    assert not (batch_indices(10, 3, 7, 0) == batch_indices(10, 3, 7, 3)).all()  # epoch 1 reshuffles


@pytest.mark.slow  # 2 to 6 min: three runs compile the step, and two policies load
def test_sft_trains_resumes_exactly_and_loads_as_a_policy(rows, tmp_path):
    sup = SupervisedConfig("sft", str(rows / "sft.jsonl"), tasks=str(EXAMPLES), epochs=2, batch_size=2)
    whole = train_supervised(config(tmp_path / "whole"), sup)
    assert len(whole) == 4 and all(np.isfinite(r["sft/loss"]) for r in whole)
    assert whole[-1]["sft/loss"] < whole[0]["sft/loss"]
    assert [r["epoch"] for r in whole] == [0, 0, 1, 1]
    # Two steps, stop, resume: the same metrics as the uninterrupted run.
    part = tmp_path / "part"
    train_supervised(config(part), dataclasses.replace(sup, steps=2))
    train_supervised(config(part), sup, resume=True)
    assert metrics(part) == metrics(tmp_path / "whole")
    model, cfg, step = load_policy(tmp_path / "whole")
    assert step == 4 and cfg.name == "sup"
    other, _, _ = load_policy(part)
    a, b = (jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (model, other))
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))
    with pytest.raises(SupervisedError, match="already holds a run"):
        train_supervised(config(part), sup)


@pytest.mark.slow  # 1 to 3 min
def test_dpo_first_loss_is_log_two_and_reference_is_stored(rows, tmp_path):
    # One batch of all four pairs, twice: the second step sees the pairs the first one trained on.
    sup = SupervisedConfig("dpo", str(rows / "dpo.jsonl"), tasks=str(EXAMPLES), epochs=2, batch_size=4, beta=0.1)
    write_tasks(tmp_path / "gt.jsonl", [t for t in load_tasks(EXAMPLES) if t.is_clean])
    history = train_supervised(config(tmp_path / "dpo", gt_debug=tmp_path / "gt.jsonl"), sup)
    assert len(history) == 2
    # Validated at the end through the evaluation code (a random model's outputs are invalid).
    assert history[1]["val/pass"] == 0.0 and history[1]["val/invalid_share"] == 1.0
    assert "gt_debug/noop" in history[1] and "val/pass" not in history[0]
    # At step 1 the policy is the reference: z = 0, loss log 2, margin 0.
    assert history[0]["dpo/loss"] == pytest.approx(np.log(2.0), abs=1e-5)
    assert abs(history[0]["dpo/margin"]) < 1e-3
    pairs = [json.loads(line) for line in (tmp_path / "dpo" / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == 4 and all(p["ref_chosen_logp"] < 0 and p["ref_rejected_logp"] < 0 for p in pairs)
    assert history[1]["dpo/margin"] > 0 and history[1]["dpo/loss"] < history[0]["dpo/loss"]


@pytest.mark.slow  # two runs compile the step: minutes (with the tiny-config tests 20 min at load 25 to 56)
def test_dpo_resumes_exactly_with_the_stored_reference(rows, tmp_path):
    """The trainer is shared (SFT, the refiner's SFT on recap rows, DPO): what DPO adds to a resume is
    the reference log-probs, read back from pairs.jsonl instead of recomputed with the trained policy."""
    sup = SupervisedConfig("dpo", str(rows / "dpo.jsonl"), tasks=str(EXAMPLES), epochs=2, batch_size=2, beta=0.1)
    train_supervised(config(tmp_path / "whole"), sup)
    part = tmp_path / "part"
    train_supervised(config(part), dataclasses.replace(sup, steps=1))
    stored = (part / "pairs.jsonl").read_text()
    train_supervised(config(part), sup, resume=True)
    assert (part / "pairs.jsonl").read_text() == stored == (tmp_path / "whole" / "pairs.jsonl").read_text()
    assert metrics(part) == metrics(tmp_path / "whole") and len(metrics(part)) == 4


def test_bad_rows_are_one_line_errors(rows, tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"task_id": "nope", "text": "x"}) + "\n")
    with pytest.raises(SupervisedError, match="bad.jsonl:1: task 'nope' is not in the tasks file"):
        train_supervised(config(tmp_path / "a"), SupervisedConfig("sft", str(tmp_path / "bad.jsonl"),
                                                                  tasks=str(EXAMPLES), batch_size=1))
    with pytest.raises(SupervisedError, match="missing chosen and rejected"):
        train_supervised(config(tmp_path / "b"), SupervisedConfig("dpo", str(rows / "sft.jsonl"),
                                                                  tasks=str(EXAMPLES), batch_size=1))
    with pytest.raises(SupervisedError, match="fewer than one batch"):
        train_supervised(config(tmp_path / "c"), SupervisedConfig("sft", str(rows / "sft.jsonl"),
                                                                  tasks=str(EXAMPLES), batch_size=5))


def _env():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO))
    return env


def _write_config(path, out):
    path.write_text(yaml.safe_dump({
        "name": "sup", "data": {"train": str(EXAMPLES)},
        "model": {"family": "qwen3", "architecture": ARCH, "dtype": "float32", "remat": False},
        "optimizer": {"learning_rate": 1e-2, "warmup_steps": 1}, "loss": {"logp_chunk": 64},
        "run": {"out": str(out), "save_every": 1, "tensorboard": False}}))
    return path


@pytest.mark.slow  # 3 to 8 min: two runs of the command in subprocesses
def test_sigkill_and_resume_give_the_uninterrupted_metrics(rows, tmp_path):
    command = [sys.executable, "-m", "jaxrl.cli", "supervised", "--objective", "sft", "--rows",
               str(rows / "sft.jsonl"), "--tasks", str(EXAMPLES), "--epochs", "3", "--batch-size", "2"]
    whole = _write_config(tmp_path / "whole.yaml", tmp_path / "whole")
    subprocess.run([*command, "--config", str(whole)], env=_env(), check=True, capture_output=True, timeout=1800)
    killed = _write_config(tmp_path / "killed.yaml", tmp_path / "killed")
    proc = subprocess.Popen([*command, "--config", str(killed)], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 1800
    while not (tmp_path / "killed" / "checkpoints" / "3").is_dir() and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = [json.loads(line)["step"] for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert done and done[-1] < 6
    subprocess.run([*command, "--config", str(killed), "--resume"], env=_env(), check=True, capture_output=True,
                   timeout=1800)
    assert metrics(tmp_path / "killed") == metrics(tmp_path / "whole")


@pytest.mark.parametrize("extra, message", [
    (["--objective", "sft", "--rows", "{missing}"], "rows:"),
    (["--objective", "dpo", "--rows", "{missing}", "--beta", "0"], "beta must be > 0"),
    (["--objective", "sft", "--rows", "{missing}", "--epochs", "0"], "must be >= 1"),
])
def test_command_usage_errors_exit_2(tmp_path, capsys, extra, message):
    from jaxrl.cli import main

    config = _write_config(tmp_path / "c.yaml", tmp_path / "run")
    argv = ["supervised", "--config", str(config), *[a.format(missing=tmp_path / "none.jsonl") for a in extra]]
    assert main(argv) == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def _tiny_update_inputs(objective):
    from jaxrl import train_step as ts
    from jaxrl.supervised import make_loss
    from models.qwen3 import Qwen3, Qwen3Config

    model = Qwen3(Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8, rope_theta=1e4),
                  rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, (4, 12)).astype(np.int32)
    mask = np.zeros((4, 12), np.float32)
    mask[:, 5:] = 1.0
    mask[1, 9:] = 0.0  # rows of different lengths: the normalizer is the whole batch's
    if objective == "sft":
        rows = {"tokens": tokens, "mask": mask, "num_tokens": np.full(4, mask.sum(), np.float32)}
    else:
        rows = {"chosen": tokens, "rejected": tokens[::-1].copy(), "chosen_mask": mask, "rejected_mask": mask[::-1],
                "ref_chosen": np.full(4, -30.0, np.float32), "ref_rejected": np.full(4, -29.0, np.float32),
                "num_pairs": np.full(4, 4.0, np.float32)}
    tx = ts.make_optimizer(ts.OptimizerConfig(learning_rate=1e-2, warmup_steps=1))
    state = ts.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
    return make_loss(objective, graphdef, rest, 0.1, 12), tx, state, rows


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_run_micro_batches_split_the_supervised_update_without_changing_it(objective):
    """`run.micro_batches` applies to SFT and DPO (the update the trainer jits: `train_step.make_update`
    around `supervised.make_loss`): two micro-batches give the full batch's loss, metrics and parameters."""
    from jaxrl import train_step as ts

    loss_fn, tx, state, rows = _tiny_update_inputs(objective)
    results = [jax.jit(ts.make_update(loss_fn, tx, m))(state, rows) for m in (1, 2, 4)]
    (full_state, full), others = results[0], results[1:]
    for new_state, metrics in others:
        for key in full:
            np.testing.assert_allclose(metrics[key], full[key], rtol=2e-5, atol=1e-6, err_msg=key)
        for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(full_state.params)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)  # Adam amplifies ~0 gradients


def test_a_batch_that_micro_batches_do_not_split_is_refused_before_anything_is_written(rows, tmp_path):
    cfg = config(tmp_path / "run")
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, micro_batches=3))
    with pytest.raises(SupervisedError, match="batch_size 2 does not split into run.micro_batches=3"):
        train_supervised(cfg, SupervisedConfig("sft", str(rows / "sft.jsonl"), tasks=str(EXAMPLES), batch_size=2))
    assert not (tmp_path / "run").exists()


def test_bad_rows_leave_no_run_directory(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"task_id": "nope", "text": "x"}) + "\n")
    with pytest.raises(SupervisedError):
        train_supervised(config(tmp_path / "run"), SupervisedConfig("sft", str(tmp_path / "bad.jsonl"),
                                                                    tasks=str(EXAMPLES), batch_size=1))
    assert not (tmp_path / "run").exists()


def test_only_the_primary_host_writes_the_run_files(rows, tmp_path, monkeypatch):
    """On a pod every host runs the trainer; config.yaml, supervised.yaml, metrics.jsonl and pairs.jsonl
    are the primary host's (Orbax coordinates the checkpoint itself)."""
    from jaxrl import hosts

    monkeypatch.setattr(hosts, "is_primary", lambda: False)
    sup = SupervisedConfig("dpo", str(rows / "dpo.jsonl"), tasks=str(EXAMPLES), steps=1, batch_size=2)
    train_supervised(config(tmp_path / "run"), sup)
    written = {p.name for p in (tmp_path / "run").iterdir()}
    assert "checkpoints" in written and not written & {"config.yaml", "supervised.yaml", "metrics.jsonl", "pairs.jsonl"}
