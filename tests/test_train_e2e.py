"""`precisecoder train` end to end in subprocesses: CLI errors, exact resume after SIGKILL
(mid-step and mid-save), and two processes × 4 devices agreeing with one process × 8."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "tests" / "train_runner.py"
EXAMPLES = REPO / "reward" / "examples" / "tasks.jsonl"

# A one-layer random Qwen3 on the real Qwen3 vocabulary; the example tasks have short prompts.
ARCH = dict(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)


def write_config(path, out, **sections):
    cfg = {
        "name": "e2e",
        "model": {"family": "qwen3", "architecture": ARCH, "dtype": "float32", "remat": False},
        "data": {"train": str(EXAMPLES), "val": str(EXAMPLES), "gt_debug": str(EXAMPLES), "tasks_per_step": 2},
        "rollout": {"group_size": 2, "max_tokens": 16, "thinking_budget": 8},
        "reward": {"workers": 2},
        "optimizer": {"learning_rate": 1e-3},
        "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
        "validation": {"val_tasks": 2, "gt_debug_tasks": 4, "max_tokens": 16, "thinking_budget": 8,
                       "gt_debug_thinking_budget": 8},
        "run": {"steps": 4, "eval_every": 2, "save_every": 2, "out": str(out), "progress": False},
    }
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    Path(path).write_text(yaml.safe_dump(cfg))
    return path


def env(devices=1):
    e = dict(os.environ)
    e["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    e["JAX_PLATFORMS"] = "cpu"
    e["PYTHONPATH"] = str(REPO)
    return e


def train(*args, devices=1, **kw):
    return subprocess.Popen([sys.executable, str(RUNNER), *map(str, args)], env=env(devices), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def finish(proc, timeout=1800):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


def records(out):
    """metrics.jsonl without wall-clock keys."""
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "share/"))} for r in rows]


def wait_for(predicate, proc, timeout=1800):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


@pytest.mark.slow  # 30-40 s: six `precisecoder train` processes, each importing JAX
def test_cli_errors_are_one_line_with_exit_2(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", tmp_path / "run")
    for args, message in [
        (["--config", "nope"], "no config 'nope'"),
        (["--config", cfg, "--set", "run.stepz=3"], "unknown key run.stepz"),
        (["--config", cfg, "--set", "rollout.group_size=two"], "rollout.group_size: expected an integer"),
        (["--config", cfg, "--set", f"data.train={tmp_path / 'missing.jsonl'}"], "data.train: no such file"),
        (["--config", cfg, "--set", "rollout.engine=nosuch"], "unknown engine 'nosuch'"),
        (["--config", cfg, "--set", "rollout.engine=test-broken", "--out", tmp_path / "broken"],
         "step 1: the rollout engine failed (ConnectionError"),
    ]:
        proc = train(*args)
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 2, (args, err[-2000:])
        assert message in err and "Traceback" not in err, err[-2000:]


@pytest.mark.slow
def test_sigkill_mid_step_and_mid_save_then_resume_gives_the_same_metrics(tmp_path):
    full = tmp_path / "full"
    finish(train("--config", write_config(tmp_path / "a.yaml", full)))
    want = records(full)
    assert [r["step"] for r in want] == [1, 2, 3, 4]
    assert "val/pass" in want[1] and "gt_debug/noop" in want[3] and (full / "curves.png").is_file()

    # killed in the middle of step 3 (step 2 is saved, step 3 has not written its metrics)
    mid = tmp_path / "mid"
    proc = train("--config", write_config(tmp_path / "b.yaml", mid))
    assert wait_for(lambda: len(records_or_empty(mid)) >= 2, proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finish(train("--config", tmp_path / "b.yaml", "--resume"))
    assert records(mid) == want

    # killed while a checkpoint is being written: the previous one stays usable
    save = tmp_path / "save"
    proc = train("--config", write_config(tmp_path / "c.yaml", save, run={"save_every": 1}))
    ckpts = save / "checkpoints"
    assert wait_for(lambda: ckpts.is_dir() and any(".orbax-checkpoint-tmp" in p.name and not p.name.startswith("1.")
                                                  for p in ckpts.iterdir()), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finish(train("--config", tmp_path / "c.yaml", "--resume"))
    assert records(save) == want

    # a finished run is extended with --steps
    finish(train("--config", tmp_path / "a.yaml", "--resume", "--steps", 5))
    assert [r["step"] for r in records(full)] == [1, 2, 3, 4, 5] and records(full)[:4] == want


def records_or_empty(out):
    try:
        return records(out)
    except (FileNotFoundError, json.JSONDecodeError):
        return []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_of_four_devices_equal_one_of_eight(tmp_path):
    # 3 val tasks: one host pads its share of them (jaxrl.validate.host_share), the metrics must not see it
    sections = dict(rollout={"engine": "test-scripted", "options": {"tasks": str(EXAMPLES)}},
                    data={"tasks_per_step": 4}, run={"steps": 2, "eval_every": 0, "save_every": 0},
                    validation={"val_tasks": 3})
    one = tmp_path / "one"
    finish(train("--config", write_config(tmp_path / "one.yaml", one, **sections), devices=8))
    two = tmp_path / "two"
    cfg = write_config(tmp_path / "two.yaml", two, **sections)
    port = free_port()
    procs = [train("--config", cfg, "--coordinator", f"127.0.0.1:{port}", "--num-processes", 2,
                   "--process-id", i, devices=4) for i in range(2)]
    for p in procs:
        finish(p)
    a, b = records(one), records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    for ra, rb in zip(a, b):
        for k, v in ra.items():
            if k.startswith(("update/", "reward/", "rollout/", "advantage/", "val/", "gt_debug/")):
                assert (rb[k] is None) if v is None else rb[k] == pytest.approx(v, rel=1e-6, abs=1e-9), k
    assert a[0]["reward/unit"] > 0 and a[1]["update/grad_norm"] > 0 and a[1]["val/pass"] is not None
