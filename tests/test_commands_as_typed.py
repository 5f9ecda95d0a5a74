"""Commands as a user types them: relative paths from another working directory, Ctrl-C, reruns that
resume, outputs of the wrong kind, and outputs that must not lose what was computed."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from jaxrl.cli import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "reward" / "examples"
BIN = Path(sys.executable).parent
ARCH = dict(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)


def _env():
    return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def test_the_readme_main_command_as_written_at_smoke_size(tmp_path):
    """The README's main command, flags and relative --out as written, plus --smoke, from another directory."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = re.search(r"```bash\n(scripts/setup\.sh && \.venv/bin/precisecoder demo[^\n]*)\n```", readme).group(1)
    demo = command.split(" && ", 1)[1].split()
    assert demo[:2] == [".venv/bin/precisecoder", "demo"] and "--out" in demo
    out = demo[demo.index("--out") + 1]
    assert not os.path.isabs(out)
    proc = subprocess.run([str(BIN / "precisecoder"), *demo[1:], "--smoke", "--no-progress"], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    for name in ("report.md", "results.json", "curves.png"):
        assert (tmp_path / out / name).is_file()
    assert (tmp_path / out / "seed0" / "rl" / "precisecoder" / "checkpoints" / "2").is_dir()
    assert not list((tmp_path / out).rglob("*.orbax-checkpoint-tmp*"))


def test_a_relative_checkpoint_directory_saves_and_restores(tmp_path, monkeypatch):
    """Orbax refuses relative paths in its save thread; the Checkpointer makes them absolute."""
    import jax
    import jax.numpy as jnp

    from jaxrl import train_step as ts
    from jaxrl.checkpoint import Checkpointer

    monkeypatch.chdir(tmp_path)
    state = ts.TrainState(step=jnp.asarray(3, jnp.int32), params={"w": jnp.arange(4.0)}, opt_state=())
    ckpt = Checkpointer("runs/r/checkpoints")
    ckpt.save(state, jax.random.key(0))
    ckpt.wait()
    assert (tmp_path / "runs" / "r" / "checkpoints" / "3").is_dir()
    restored, _, _ = ckpt.restore(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                               state))
    assert restored.params["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    ckpt.close()


@pytest.mark.slow  # 150 to 180 s at load 20 to 24: three JAX compiles (update, generate, eval) at the Qwen3 vocabulary
def test_relative_paths_through_train_generate_and_eval(tmp_path, monkeypatch):
    """Relative paths everywhere, in the config file too: train saves, generate and eval read its checkpoint.

    The trainer's rollouts come from the scripted test engine (no sampling compile; the paths, the
    update, the Orbax save and the restores are the real ones).
    """
    import engines  # noqa: F401  (registers test-scripted)

    monkeypatch.chdir(tmp_path)
    shutil.copy(EXAMPLES / "tasks.jsonl", "tasks.jsonl")
    cfg = {"name": "rel", "model": {"family": "qwen3", "architecture": ARCH, "dtype": "float32", "remat": False},
           "data": {"train": "tasks.jsonl", "val": "tasks.jsonl", "gt_debug": "tasks.jsonl", "tasks_per_step": 2},
           "rollout": {"group_size": 2, "max_tokens": 16, "thinking_budget": 8, "engine": "test-scripted",
                       "options": {"tasks": "tasks.jsonl"}}, "reward": {"workers": 1},
           "mesh": {"data": 1, "fsdp": -1, "tensor": 1},
           "validation": {"val_tasks": 0, "gt_debug_tasks": 0},
           "run": {"steps": 1, "eval_every": 0, "save_every": 1, "out": "runs/from_config", "progress": False,
                   "tensorboard": False}}
    Path("c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", "c.yaml", "--out", "runs/x"]) == 0
    assert (tmp_path / "runs" / "x" / "checkpoints" / "1").is_dir()
    assert not (tmp_path / "runs" / "from_config").exists()
    Path("p.jsonl").write_text(json.dumps({"id": "a", "input_ids": [151644, 872, 198, 9707]}) + "\n")
    assert main(["generate", "--checkpoint", "runs/x", "--prompts", "p.jsonl", "--out", "g.jsonl",
                 "--max-tokens", "4", "--no-progress"]) == 0
    assert [r["id"] for r in _lines("g.jsonl")] == ["a"]
    assert main(["eval", "--checkpoint", "runs/x/checkpoints/1", "--tasks", "tasks.jsonl", "--out", "ev",
                 "--limit", "1", "--samples", "1", "--max-tokens", "8", "--thinking-budget", "4",
                 "--clean-thinking-budget", "4", "--workers", "1", "--no-progress"]) == 0
    assert len(_lines("ev/predictions.jsonl")) == 1 and (tmp_path / "ev" / "summary.json").is_file()


def test_config_paths_are_taken_from_the_working_directory(tmp_path, monkeypatch):
    from jaxrl.train_cli import resolve_paths
    from jaxrl.config import config_from_args

    monkeypatch.chdir(tmp_path)
    cfg = resolve_paths(config_from_args("tiny", ["data.train=t.jsonl", "run.out=~/r"], None, None))
    assert cfg.run.out == os.path.expanduser("~/r") and cfg.data.train == str(tmp_path / "t.jsonl")
    assert cfg.data.val is None and os.path.isabs(cfg.data.build.cache_dir)


# ------------------------------------------------------------------ wrong kinds of argument


@pytest.mark.parametrize("argv, message", [
    (["eval", "--tasks", "T", "--out", "a_file", "--model", "m"], "a_file: exists and is not a directory"),
    (["generate", "--model", "m", "--prompts", "p.jsonl", "--out", "a_dir"], "a_dir: is a directory"),
    (["generate", "--model", "m", "--prompts", "p.jsonl", "--out", "p.jsonl"], "--out is also --prompts"),
    (["eval", "compare", "a_dir", "--out", "a_file"], "a_file: exists and is not a directory"),
    (["train", "--config", "tiny", "--out", "a_file"], "run.out /"),
    (["check", "--tasks", "empty.jsonl"], "holds no tasks"),
    (["check", "--tasks", "tasks.jsonl", "--out", "tasks.jsonl"], "is also --tasks"),
    (["score", "--tasks", "tasks.jsonl", "--predictions", "p.jsonl", "--out", "p.jsonl"], "is also --predictions"),
    (["score", "--tasks", "tasks.jsonl", "--predictions", "p.jsonl", "--out", "s.jsonl", "--summary-json",
      "s.jsonl"], "is also --out"),
])
def test_an_argument_of_the_wrong_kind_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    Path("a_file").write_text("x")
    Path("a_dir").mkdir()
    Path("empty.jsonl").write_text("")
    shutil.copy(EXAMPLES / "tasks.jsonl", "tasks.jsonl")
    shutil.copy(EXAMPLES / "predictions.jsonl", "p.jsonl")
    before = Path("p.jsonl").read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert Path("p.jsonl").read_bytes() == before


@pytest.mark.parametrize("argv, message", [
    (["plan", "tiny", "--step-time", "-1"], "--step-time: must be a finite number of seconds"),
    (["generate", "--model", "m", "--prompts", "p", "--out", "o", "--thinking-budget", "abc"],
     "--thinking-budget: must be an integer >= 0 or none, got 'abc'"),
    (["eval", "--tasks", "t", "--out", "o", "--model", "m", "--samples", "0"], "--samples: must be >= 1, got 0"),
])
def test_a_bad_value_names_the_option_not_a_function(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_eval_into_a_run_with_other_settings_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("ev").mkdir()
    Path("ev/run.json").write_text(json.dumps({"settings": {"samples": 9}, "chat": False, "tasks": []}))
    assert main(["eval", "--tasks", str(EXAMPLES / "tasks.jsonl"), "--out", "ev", "--model", "no_such_model"]) == 2
    assert "holds a run with other settings, tasks" in capsys.readouterr().err


def test_help_lists_presets_and_named_configs(capsys):
    for command in ("plan", "train"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = capsys.readouterr().out
        assert "tiny" in out and "qwen3_5-9b-v5e-32" in out


def test_no_tpu_means_jax_is_pinned_to_the_cpu(monkeypatch):
    from jaxrl.cli import quiet_platforms

    env = {}
    quiet_platforms(env)
    assert env == {"JAX_PLATFORMS": "cpu"}  # this machine has no TPU and no GPU plugin
    env = {"JAX_PLATFORMS": "tpu"}
    quiet_platforms(env)
    assert env == {"JAX_PLATFORMS": "tpu"}


# ------------------------------------------------------------------ outputs that lose nothing


def _surrogate_case(tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"task_id": "s", "base_id": "s", "prompt": "p", "buggy_code": "def f(x):\n    return x\n",
                                 "solution": "def f(x):\n    return x + 1\n",
                                 "tests": {"kind": "assert", "code": "assert f(1) == 2\n"}}) + "\n")
    preds = tmp_path / "p.jsonl"
    preds.write_text(json.dumps({"task_id": "s", "code": 'def f(x):\n    raise ValueError("\\udc80")\n'}) + "\n")
    return tasks, preds


def test_a_lone_surrogate_in_a_reason_survives_check_out(tmp_path):
    tasks, preds = _surrogate_case(tmp_path)
    out = tmp_path / "r.jsonl"
    assert main(["check", "--tasks", str(tasks), "--predictions", str(preds), "--out", str(out), "--workers", "1",
                 "--no-progress"]) == 0
    assert _lines(out)[0]["reason"] == "ValueError: \udc80"


def test_an_out_that_is_a_link_is_written_through(tmp_path):
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("old\n")
    link = tmp_path / "r.jsonl"
    link.symlink_to(target)
    assert main(["check", "--tasks", str(EXAMPLES / "tasks.jsonl"), "--out", str(link), "--workers", "1",
                 "--no-progress"]) == 0
    assert link.is_symlink() and len(_lines(target)) == 7

    from reward.schema import write_jsonl

    write_jsonl(link, [{"a": 1}])
    assert link.is_symlink() and _lines(target) == [{"a": 1}]


@pytest.mark.skipif(not os.access("/dev/full", os.W_OK), reason="needs a writable /dev/full")
def test_score_on_a_full_disk_says_so_in_one_line_and_keeps_the_scores(tmp_path, capsys):
    """/dev/full fails every write with ENOSPC, as a full filesystem does."""
    out = tmp_path / "s.jsonl"
    out.symlink_to("/dev/full")
    assert main(["score", "--tasks", str(EXAMPLES / "tasks.jsonl"), "--predictions",
                 str(EXAMPLES / "predictions.jsonl"), "--out", str(out), "--workers", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("error:"))
    assert "No space left on device" in line and "Traceback" not in err
    fallback = Path(line.rsplit(" the others are in ", 1)[1])
    assert [r["task_id"] for r in _lines(fallback)] == [r["task_id"] for r in _lines(EXAMPLES / "predictions.jsonl")]
    fallback.unlink()


# ------------------------------------------------------------------ Ctrl-C keeps work; the same command resumes


def _slow_predictions(path, n, sleep_s):
    """`n` distinct correct answers to example/add#b0 that each take at least `sleep_s` per run."""
    code = "import time\ntime.sleep({s})\n# {i}\ndef add(a, b):\n    return a + b\n"
    path.write_text("".join(json.dumps({"task_id": "example/add#b0", "code": code.format(s=sleep_s, i=i)}) + "\n"
                            for i in range(n)))
    return path


RESTORE_SIGINT = ("import os, signal, sys\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n"
                  "os.execv(sys.argv[1], sys.argv[1:])")


def _interrupt_once_written(argv, out, at_least, cwd):
    """Start `precisecoder ARGV`, send SIGINT once `out` holds `at_least` lines, and return (rc, stderr)."""
    # SIGINT as a terminal delivers it: a test run started in the background of a script inherits
    # SIGINT ignored (POSIX shells ignore it in asynchronous commands), and Python keeps it so. A small
    # launcher restores it and execs the command (a preexec_fn would fork this multithreaded process).
    proc = subprocess.Popen([sys.executable, "-c", RESTORE_SIGINT, str(BIN / "precisecoder"), *argv], cwd=cwd,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text(encoding="utf-8").count("\n") >= at_least:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


@pytest.mark.parametrize("command, per_chunk, total", [("score", 16, 48), ("check", 32, 64)])
def test_ctrl_c_keeps_the_finished_results_and_the_same_command_resumes(tmp_path, command, per_chunk, total):
    """The runs sleep, so the command is still busy with the next chunk when SIGINT arrives."""
    _slow_predictions(tmp_path / "p.jsonl", total, 0.15)
    shutil.copy(EXAMPLES / "tasks.jsonl", tmp_path / "t.jsonl")
    argv = [command, "--tasks", "t.jsonl", "--predictions", "p.jsonl", "--out", "r.jsonl", "--workers", "1",
            "--no-progress"]
    out = tmp_path / "r.jsonl"
    rc, err = _interrupt_once_written(argv, out, per_chunk, tmp_path)
    assert rc == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"precisecoder {command}: interrupted")
    kept = _lines(out)
    assert per_chunk <= len(kept) < total
    proc = subprocess.run([str(BIN / "precisecoder"), *argv], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming after the {len(kept)} results" in proc.stderr
    rows = _lines(out)
    assert len(rows) == total and rows[:len(kept)] == kept and not (tmp_path / "r.jsonl.partial").exists()
    assert all(r["passed"] if command == "check" else r["unit"] == 1 for r in rows)


def test_a_resume_with_other_settings_is_refused(tmp_path, capsys):
    from reward.outfile import ResultsFile

    out = tmp_path / "r.jsonl"
    first = ResultsFile(str(out), {"lam": 0.5}, "score")
    first.resume(lambda rows: True)
    first.append([{"task_id": "a"}])
    first.close(finished=False)
    assert main(["score", "--tasks", str(EXAMPLES / "tasks.jsonl"), "--predictions",
                 str(EXAMPLES / "predictions.jsonl"), "--out", str(out), "--no-progress"]) == 2
    assert "holds an interrupted score run with other settings" in capsys.readouterr().err
    assert main(["score", "--tasks", str(EXAMPLES / "tasks.jsonl"), "--predictions",
                 str(EXAMPLES / "predictions.jsonl"), "--out", str(out), "--no-progress", "--overwrite",
                 "--workers", "1"]) == 0
    assert len(_lines(out)) == 4


def test_ctrl_c_in_data_build_is_one_line_and_keeps_the_verdicts(tmp_path):
    out = tmp_path / "d"
    cache = out / ".cache" / "runs.jsonl"
    rc, err = _interrupt_once_written(["data", "build", "--out", "d", "--workers", "1", "--no-progress"], cache, 1,
                                      tmp_path)
    assert rc == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("precisecoder data build: interrupted; the verdicts so far")
    assert cache.read_text(encoding="utf-8").count("\n") >= 1


def test_limit_tries_the_first_n_tasks(tmp_path):
    tasks, preds = str(EXAMPLES / "tasks.jsonl"), str(EXAMPLES / "predictions.jsonl")
    assert main(["check", "--tasks", tasks, "--out", str(tmp_path / "c.jsonl"), "--limit", "1", "--workers", "1",
                 "--no-progress"]) == 0
    assert [(r["task_id"], r["target"]) for r in _lines(tmp_path / "c.jsonl")] == [
        ("example/add#b0", "solution"), ("example/add#b0", "buggy")]
    assert main(["score", "--tasks", tasks, "--predictions", preds, "--out", str(tmp_path / "s.jsonl"), "--limit", "2",
                 "--workers", "1", "--no-progress"]) == 0
    assert [r["task_id"] for r in _lines(tmp_path / "s.jsonl")] == ["example/add#b0", "example/triangle#b0"]


def test_plan_says_what_compiles_while_it_compiles(monkeypatch):
    """A compile that lasts past the heartbeat gets a "still compiling" line (the fake compile
    returns only once that line is written, so no clock decides the verdict)."""
    import io
    import threading

    from jaxrl import plan

    beat = threading.Event()

    class Stderr(io.StringIO):
        def write(self, text):
            if "still compiling" in text:
                beat.set()
            return super().write(text)

    class Lowered:
        def compile(self):
            assert beat.wait(600)
            return self

        def memory_analysis(self):
            return type("M", (), dict(argument_size_in_bytes=1, temp_size_in_bytes=2, output_size_in_bytes=3,
                                      alias_size_in_bytes=0))()

    err = Stderr()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(plan, "HEARTBEAT_S", 0.01)
    timings = {}
    assert plan._phase(Lowered(), "train_step", timings).total == 6
    lines = err.getvalue().splitlines()
    assert lines[0] == "plan: compiling train_step ..." and lines[1].startswith("plan: still compiling train_step (")
    assert lines[-1].startswith("plan: train_step compiled in ") and "train_step" in timings


def test_a_config_error_of_train_comes_before_jax_is_imported(tmp_path):
    """A typo in a config is one line at once, without the seconds (and libtpu probing) of importing JAX."""
    (tmp_path / "bad.yaml").write_text("base: tiny\nrun: {stepz: 3}\n")
    probe = ("import sys; from jaxrl.cli import main; code = main(['train', '--config', 'bad.yaml']); "
             "print('jax imported' if 'jax' in sys.modules else 'jax not imported'); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown key run.stepz" in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "jax not imported"
