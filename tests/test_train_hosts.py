"""`precisecoder train` on several hosts with the `jax` engine: 2 processes x 4 CPU devices equal 1 x 8,
and hosts given different task files both stop at start with exit 2 and the same message."""

import subprocess
import sys
from pathlib import Path

import pytest
from test_train_e2e import EXAMPLES, REPO, RUNNER, env, free_port, records, write_config

PREFIXES = ("update/", "reward/", "rollout/", "advantage/", "val/", "gt_debug/")


def launch(log, *args, devices, cwd=REPO, xla_flags=""):
    """`precisecoder train ARGS` writing stdout and stderr to `log`.out / `log`.err: a host whose pipe
    nobody reads would block on a write while the other waits for it at the shutdown barrier."""
    e = env(devices)
    if xla_flags:
        e["XLA_FLAGS"] += f" {xla_flags}"
    return subprocess.Popen([sys.executable, str(RUNNER), *map(str, args)], env=e, cwd=cwd,
                            stdout=open(f"{log}.out", "w"), stderr=open(f"{log}.err", "w"), text=True)


def wait(proc, log):
    proc.wait(timeout=1800)
    return proc.returncode, Path(f"{log}.err").read_text()


# Three `precisecoder train` processes, each compiling the sampler and the update: 94 s of CPU,
# 48 to 57 s on 2 idle cores (7 min at load average 30 to 40). In the default run, as issue #22 asks.
def test_jax_engine_on_two_hosts_equals_one_host(tmp_path):
    """A random policy earns no reward, so this shows sampling, validation and the update's inputs
    (log-probs, entropy) agreeing; updates from non-zero advantages on two hosts are
    test_train_e2e's two-process test (scripted engine)."""
    # Without the one task whose prompt passes 128 tokens, training and validation share a prompt bucket
    # and so the engine's programs: each process compiles one prefill and one decode segment, not two.
    short = tmp_path / "short.jsonl"
    short.write_text("".join(line for line in EXAMPLES.read_text().splitlines(keepends=True)
                             if '"example/max_run#' not in line))
    # 1 val task + 3 GT Debug tasks (add, triangle, clamp#clean): 3 buggy and 1 clean tasks, neither count
    # divides over 2 hosts, so host 1 pads its block of each kind. No best checkpoint or TensorBoard files:
    # the test reads metrics.jsonl only.
    sections = dict(rollout={"engine": "jax", "max_tokens": 8, "thinking_budget": 4},
                    data={"tasks_per_step": 4, "train": str(short), "val": str(short), "gt_debug": str(short)},
                    run={"steps": 2, "eval_every": 0, "save_every": 0, "best_metric": None, "tensorboard": False},
                    validation={"val_tasks": 1, "gt_debug_tasks": 3, "max_tokens": 8, "thinking_budget": 4,
                                "gt_debug_thinking_budget": 4})
    # The same XLA flags for all three; LLVM's cheapest code generation compiles faster, and the
    # runs it compares are compiled alike.
    fast = "--xla_backend_optimization_level=0"
    one = tmp_path / "one"
    logs = [tmp_path / name for name in ("one", "host0", "host1")]
    single = launch(logs[0], "--config", write_config(tmp_path / "one.yaml", one, **sections), devices=8,
                    xla_flags=fast)
    two = tmp_path / "two"
    cfg = write_config(tmp_path / "two.yaml", two, **sections)
    port = free_port()
    procs = [launch(logs[1 + i], "--config", cfg, "--coordinator", f"127.0.0.1:{port}", "--num-processes", 2,
                    "--process-id", i, devices=4, xla_flags=fast) for i in range(2)]
    for p, log in zip((single, *procs), logs):
        rc, err = wait(p, log)
        assert rc == 0, err[-3000:]
    a, b = records(one), records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    compared = 0
    for ra, rb in zip(a, b):
        assert {k for k in ra if k.startswith(PREFIXES)} == {k for k in rb if k.startswith(PREFIXES)}
        for k, v in ra.items():
            if k.startswith(PREFIXES):
                assert (rb[k] is None) if v is None else rb[k] == pytest.approx(v, rel=1e-5, abs=1e-9), k
                compared += 1
    assert compared > 40 and a[1]["val/pass"] is not None and a[1]["gt_debug/noop"] is not None
    assert a[0]["update/entropy"] > 0 and a[0]["rollout/response_tokens"] > 0


def test_hosts_with_different_task_files_both_exit_2_naming_the_file(tmp_path):
    # one config with a relative data.train, run from two directories holding different tasks.jsonl
    lines = EXAMPLES.read_text().splitlines(keepends=True)
    for name, text in (("a", "".join(lines)), ("b", "".join(lines[:-1]))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tasks.jsonl").write_text(text)
    cfg = write_config(tmp_path / "cfg.yaml", tmp_path / "run", data={"train": "tasks.jsonl"})
    port = free_port()
    procs = [launch(tmp_path / f"host{i}", "--config", cfg, "--coordinator", f"127.0.0.1:{port}", "--num-processes",
                    2, "--process-id", i, devices=2, cwd=tmp_path / name) for i, name in enumerate("ab")]
    errors = []
    for i, p in enumerate(procs):
        rc, err = wait(p, tmp_path / f"host{i}")
        assert rc == 2, err[-3000:]
        errors.append([line for line in err.splitlines() if line.startswith("precisecoder train:")])
    for lines_of_host in errors:
        assert len(lines_of_host) == 1, lines_of_host
        assert lines_of_host[0].startswith("precisecoder train: hosts disagree: host 1's task file data.train "
                                           "is sha256:"), lines_of_host[0]
    assert errors[0] == errors[1]
    assert not (tmp_path / "run").exists()  # stopped before writing anything


def test_the_digest_names_the_first_item_a_host_differs_in(monkeypatch):
    """`hosts.check_same` with the gather simulated: host 1 runs another seed."""
    import dataclasses

    import jax

    from jaxrl import hosts
    from jaxrl.config import load_config
    from jaxrl.host_digest import run_items

    cfg = load_config("tiny")
    mine = run_items(cfg)
    other = run_items(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, seed=cfg.run.seed + 1)))
    assert list(mine)[:2] == ["package version", "package sources"] and list(mine) == list(other)
    assert [k for k in mine if mine[k] != other[k]] == ["config run.seed"]
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(hosts, "gather_json", lambda obj: [mine, obj])
    hosts.check_same(mine)
    with pytest.raises(hosts.HostsDisagree, match=rf"^hosts disagree: host 1's config run.seed is {cfg.run.seed + 1}, "
                                                   rf"host 0's is {cfg.run.seed}$"):
        hosts.check_same(other)
