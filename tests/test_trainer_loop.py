"""The training loop in-process: a plug-in estimator trains, resume equals an uninterrupted run,
a failed save stops the run at once, and no sandbox process or thread outlives a failure.

Rollouts come from `engines.ScriptedEngine` (the reference fix or the buggy code, fixed
log-probs near a random policy's): it cannot show what sampling from the policy does
(the subprocess tests of test_train_e2e.py, `slow`, run the real `jax` engine), but it
gives every group a pass and a fail, so advantages and gradients are not zero, and it
costs no compilation. The model is a one-layer Qwen3 over the demo's small vocabulary.
"""

import dataclasses
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import jax
import pytest
from tqdm._monitor import TMonitor

import engines  # noqa: F401  (registers test-scripted, test-broken)
from jaxrl import checkpoint
from jaxrl.config import load_config
from jaxrl.demo.tokenizer import load_demo_tokenizer
from jaxrl.errors import TrainError
from jaxrl.metrics import read_metrics
from jaxrl.trainer import train

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = str(REPO / "reward" / "examples" / "tasks.jsonl")
DOCS = (REPO / "docs" / "estimators.md").read_text()
TOKENIZER = load_demo_tokenizer()


def config(out, **sections):
    arch = dict(vocab_size=TOKENIZER.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=16, rope_theta=10000.0,
                tie_word_embeddings=True)
    data = {
        "name": "loop",
        "model": {"family": "qwen3", "architecture": arch, "dtype": "float32", "remat": False},
        "data": {"train": EXAMPLES, "tasks_per_step": 4, "prompt": "demo", "prompt_multiple": 8},
        "rollout": {"engine": "test-scripted", "group_size": 2, "max_tokens": 48, "thinking_budget": 8,
                    "options": {"tasks": EXAMPLES, "prompt": "demo", "logprob": -5.6}},
        "reward": {"workers": 2},
        "optimizer": {"learning_rate": 1e-3},
        "validation": {"val_tasks": 0, "gt_debug_tasks": 0},
        "run": {"steps": 2, "save_every": 1, "out": str(out), "progress": False, "tensorboard": False,
                "best_metric": None},
    }
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v}
    return load_config(data=data)


def records(out):
    """metrics.jsonl without wall-clock keys."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "share/"))}
            for r in read_metrics(Path(out) / "metrics.jsonl")]


def docs_block(lang):
    return re.search(rf"```{lang}\n(.*?)```", DOCS, re.S).group(1)


@pytest.fixture(scope="module", autouse=True)
def compile_cache(tmp_path_factory):
    """A persistent XLA cache for this module: the runs after the first reuse its executables."""
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    old = {k: getattr(jax.config, k) for k in keys}
    for k, v in zip(keys, (str(tmp_path_factory.mktemp("xla")), 0, 0)):
        jax.config.update(k, v)
    yield
    for k, v in old.items():
        jax.config.update(k, v)


def test_docs_estimator_trains_from_the_working_directory_and_resume_equals_one_run(tmp_path, monkeypatch, capsys):
    """docs/estimators.md's module and algorithm section, 2 steps from a temporary working
    directory; a copy of the run resumed from its step-1 checkpoint records the same step 2."""
    import yaml

    work = tmp_path / "work"
    work.mkdir()
    (work / "my_estimators.py").write_text(docs_block("python"))
    monkeypatch.chdir(work)
    monkeypatch.delitem(sys.modules, "my_estimators", raising=False)
    algorithm = yaml.safe_load(docs_block("yaml"))["algorithm"]
    assert algorithm["estimator"] == "my_estimators:rank_advantages"

    last = train(config(tmp_path / "full", algorithm=algorithm), tokenizer=TOKENIZER)
    full = records(tmp_path / "full")
    assert [r["step"] for r in full] == [1, 2] and last["update/grad_norm"] > 0
    # Each buggy task's group has the fix and the buggy code; the clean task's two answers both pass.
    assert all(r["rollout/pass"] == 0.5 and (r["groups/mixed"], r["groups/all_pass"]) == (0.75, 0.25) for r in full)

    shutil.copytree(tmp_path / "full", tmp_path / "moved")
    shutil.rmtree(tmp_path / "moved" / "checkpoints" / "2")
    capsys.readouterr()
    train(config(tmp_path / "moved", algorithm=algorithm), resume=True, tokenizer=TOKENIZER)
    assert f"resuming {tmp_path / 'moved'} from step 1" in capsys.readouterr().err
    assert records(tmp_path / "moved") == full


def _descendants(pid=None):
    """Pids of the process's children, grandchildren, ... (Linux /proc)."""
    out, todo = set(), [pid or os.getpid()]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = {int(k) for k in (task / "children").read_text().split()}
            except OSError:  # the task ended meanwhile
                continue
            todo += kids - out
            out |= kids
    return out


def _baseline():
    return {t for t in threading.enumerate() if t.is_alive()}, _descendants()


def _leftovers(threads_before, children_before, wait_s=60.0):
    """Threads and child processes started since, once the closed ones had `wait_s` to end (tqdm's
    monitor thread is one per process, started by the first progress bar, by design)."""
    end = time.monotonic() + wait_s
    while True:
        threads = {t for t in threading.enumerate() if t.is_alive() and not isinstance(t, TMonitor)} - threads_before
        children = _descendants() - children_before
        if not (threads or children) or time.monotonic() > end:
            return threads, children
        time.sleep(0.1)


def test_a_failed_save_stops_the_run_at_once_with_one_line(tmp_path, monkeypatch):
    threads, children = _baseline()

    running = []

    def full_disk(self, state, *a, **kw):
        running.append(len(_descendants() - children))  # the step scored its rollouts: sandbox workers run
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.Checkpointer, "save", full_disk)
    with pytest.raises(TrainError, match=r"^step 1: saving the checkpoint failed \(OSError: .*No space left") as e:
        train(config(tmp_path / "save", run={"steps": 3}), tokenizer=TOKENIZER)
    assert "\n" not in str(e.value) and "--resume" in str(e.value)
    assert not (tmp_path / "save" / "metrics.jsonl").read_text()  # stopped at step 1, not at the end
    assert running and running[0] > 0
    assert _leftovers(threads, children) == (set(), set())


def test_no_thread_or_sandbox_process_outlives_a_failed_start(tmp_path):
    """An engine that cannot be built (after the checkpointers started their threads), and one
    that fails on the first step (after the reward pipeline's dispatcher started). The fleet
    starts its sandbox workers on its first job: the failed-save test shows those end too."""
    threads, children = _baseline()

    def no_engine(*a, **kw):
        raise ValueError("no such server")

    with pytest.raises(TrainError, match="rollout.engine 'test-scripted': no such server"):
        train(config(tmp_path / "engine"), engine_factory=no_engine, tokenizer=TOKENIZER)
    assert _leftovers(threads, children) == (set(), set())
    broken = config(tmp_path / "broken")
    broken = dataclasses.replace(broken, rollout=dataclasses.replace(broken.rollout, engine="test-broken", options={}))
    with pytest.raises(TrainError, match="step 1: the rollout engine failed"):
        train(broken, tokenizer=TOKENIZER)
    assert _leftovers(threads, children) == (set(), set())


@pytest.mark.slow  # two more training runs: 50-100 s of CPU (105 s wall with the failed-save test at load 29)
def test_a_plug_in_estimator_is_on_the_gradient_path(tmp_path, monkeypatch):
    """Zero advantages from a plug-in give a gradient of exactly 0 (no KL); the same function
    scaled by an option gives a non-zero one."""
    (tmp_path / "scaled_estimator.py").write_text(
        "import jax.numpy as jnp\n\n\n"
        "def scaled(rewards_NxGxK, lengths_NxG, scale: float = 0.0):\n"
        "    r_NxG = rewards_NxGxK[..., 0]\n"
        "    return scale * (r_NxG - r_NxG.mean(axis=1, keepdims=True))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "scaled_estimator", raising=False)
    norms = []
    for scale in (0.0, 2.0):
        algorithm = {"estimator": "scaled_estimator:scaled", "options": {"scale": scale}}
        last = train(config(tmp_path / f"scale{scale}", algorithm=algorithm, run={"steps": 1}), tokenizer=TOKENIZER)
        norms.append(last["update/grad_norm"])
    assert norms[0] == 0.0 and norms[1] > 0, norms


ENGINE_PROGRAMS = ("_begin", "_segment", "_compact")


@pytest.mark.slow  # a 3-step run with the jax engine: 33 s of CPU, 136 s wall at load 28
def test_the_jax_engine_compiles_its_programs_once_across_weight_pushes(tmp_path, monkeypatch):
    """A 3-step run with the `jax` engine on the 8-device mesh: its prefill and decode programs compile
    in step 1's rollout, once each, and the weights pushed after steps 1 and 2 reuse them (same shapes,
    dtypes and shardings). `jax_log_compiles` logs one line per compilation of a program."""
    import logging

    import jaxrl.step

    compiles, per_rollout = [], []

    class Compiles(logging.Handler):
        def emit(self, record):
            name = re.match(r"Compiling jit\((\w+)\)", record.getMessage())
            if name and name.group(1) in ENGINE_PROGRAMS:
                compiles.append(name.group(1))

    def sample(run, tasks, index, *streamed, _sample=jaxrl.step.sample):
        rollouts = _sample(run, tasks, index, *streamed)
        per_rollout.append(list(compiles))
        compiles.clear()
        return rollouts

    monkeypatch.setattr(jaxrl.step, "sample", sample)
    handler = Compiles()
    logging.getLogger("jax").addHandler(handler)
    try:
        with jax.log_compiles():
            train(config(tmp_path / "jax", rollout={"engine": "jax", "options": {"segment": 8}},
                         run={"steps": 3, "save_every": 0}), tokenizer=TOKENIZER)
    finally:
        logging.getLogger("jax").removeHandler(handler)
    assert jax.device_count() == 8
    assert len(per_rollout) == 3 and sorted(per_rollout[0]) == ["_begin", "_segment"], per_rollout
    assert per_rollout[1:] == [[], []], per_rollout
