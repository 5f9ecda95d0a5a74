"""Preemption-safe training as a user meets it: `train` and `supervised` stopped by SIGTERM (a pod's
preemption notice) and SIGINT (Ctrl-C) from a real launcher save their last completed step, exit
143 / 130 with one line, and `--resume` continues to the metrics an uninterrupted run writes.

The RL run's rollouts come from the scripted test engine (registered by a two-line launcher: a
subprocess cannot import tests/engines.py otherwise); the update, the checkpoints, the signals and
the CLI are the real ones.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "reward" / "examples" / "tasks.jsonl"
ARCH = dict(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)
LAUNCHER = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import engines; from jaxrl.cli import main; "
            "sys.exit(main(sys.argv[1:]))")


def _env():
    return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu",
                PYTHONPATH=str(REPO))


def _metrics(out):
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _interrupt_after(command, out, lines, signum, cwd):
    """Start `command`, send `signum` once metrics.jsonl holds `lines` lines; (exit code, stderr)."""
    proc = subprocess.Popen(command, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    metrics, deadline = Path(cwd) / out / "metrics.jsonl", time.monotonic() + 1500
    while proc.poll() is None and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= lines):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signum)
    code = proc.wait(timeout=300)  # the run's grace period is 60 s: far less than this
    return code, proc.stderr.read()


@pytest.mark.slow  # 2 to 4 min: three runs of the command
def test_sigterm_during_train_saves_and_resume_gives_the_uninterrupted_metrics(tmp_path):
    (tmp_path / "tasks.jsonl").write_text(EXAMPLES.read_text())
    cfg = {"name": "pre", "model": {"family": "qwen3", "architecture": ARCH, "dtype": "float32", "remat": False},
           "data": {"train": "tasks.jsonl", "tasks_per_step": 2},
           "rollout": {"group_size": 2, "max_tokens": 16, "thinking_budget": 8, "engine": "test-scripted",
                       "options": {"tasks": "tasks.jsonl"}}, "reward": {"workers": 1},
           "mesh": {"data": 1, "fsdp": -1, "tensor": 1}, "validation": {"val_tasks": 0, "gt_debug_tasks": 0},
           "run": {"steps": 5, "eval_every": 0, "save_every": 0, "progress": False, "tensorboard": False}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    train = [sys.executable, "-c", LAUNCHER, str(REPO / "tests"), "train", "--config", "c.yaml"]
    subprocess.run([*train, "--out", "whole"], cwd=tmp_path, env=_env(), check=True, capture_output=True,
                   timeout=1500)

    code, err = _interrupt_after([*train, "--out", "cut"], "cut", 2, signal.SIGTERM, tmp_path)
    assert code == 143, err
    assert err.strip().splitlines()[-1] == "precisecoder train: interrupted by SIGTERM; continue with --resume --out " \
        + str(tmp_path / "cut")
    saved = sorted(int(p.name) for p in (tmp_path / "cut" / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and 2 <= saved[-1] < 5  # save_every 0: only the interruption saved
    subprocess.run([*train, "--out", "cut", "--resume"], cwd=tmp_path, env=_env(), check=True, capture_output=True,
                   timeout=1500)
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "whole")


@pytest.mark.slow  # 2 to 4 min: three runs of the command
def test_ctrl_c_during_supervised_saves_and_resume_gives_the_uninterrupted_metrics(tmp_path):
    rows = tmp_path / "sft.jsonl"
    rows.write_text("".join(json.dumps({"task_id": json.loads(line)["task_id"], "sample": 0,
                                        "text": "<think>\nok\n</think>\n\n```python\nx = 1\n```"}) + "\n"
                            for line in EXAMPLES.read_text().splitlines() if line.strip()))
    cfg = {"name": "sup", "data": {"train": str(EXAMPLES)},
           "model": {"family": "qwen3", "architecture": ARCH, "dtype": "float32", "remat": False},
           "optimizer": {"learning_rate": 1e-2, "warmup_steps": 1}, "loss": {"logp_chunk": 64},
           "run": {"save_every": 0, "tensorboard": False, "progress": False}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    command = [sys.executable, "-m", "jaxrl.cli", "supervised", "--config", "c.yaml", "--objective", "sft",
               "--rows", "sft.jsonl", "--tasks", str(EXAMPLES), "--epochs", "4", "--batch-size", "2"]
    subprocess.run([*command, "--out", "whole"], cwd=tmp_path, env=_env(), check=True, capture_output=True,
                   timeout=1500)
    code, err = _interrupt_after([*command, "--out", "cut"], "cut", 3, signal.SIGINT, tmp_path)
    assert code == 130, err
    assert "interrupted by SIGINT; continue with --resume" in err.strip().splitlines()[-1]
    subprocess.run([*command, "--out", "cut", "--resume"], cwd=tmp_path, env=_env(), check=True, capture_output=True,
                   timeout=1500)
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "whole")
