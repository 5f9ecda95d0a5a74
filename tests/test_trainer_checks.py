"""`precisecoder train` refuses a bad config with exit 2 and one line before it writes anything,
and keeps its parts' imports one-way."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import engines  # noqa: F401  (registers test-scripted)
from jaxrl.cli import main
from jaxrl.config import to_yaml
from jaxrl.errors import TrainError
from jaxrl.run import read_train_tasks
from test_trainer_loop import EXAMPLES, TOKENIZER, config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cfg_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(to_yaml(config(tmp_path / "unused")))
    (tmp_path / "empty_module.py").write_text('"""No estimator here."""\n')
    (tmp_path / "odd_estimators.py").write_text(
        "def per_task(rewards_NxGxK, lengths_NxG):\n    return rewards_NxGxK.sum(axis=(1, 2))\n\n"
        "def broken(rewards_NxGxK, lengths_NxG):\n    return rewards_NxGxK @ lengths_NxG\n")
    (tmp_path / "bad_syntax.py").write_text("def f(:\n")
    return path


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.estimator=no_such_module:f"], "algorithm.estimator: cannot import module 'no_such_module'"),
    (["algorithm.estimator=empty_module:rank"], "algorithm.estimator: module 'empty_module' has no function 'rank'"),
    (["algorithm.estimator=nosuch"], "algorithm.estimator: unknown estimator 'nosuch'"),
    (["algorithm.estimator=bad_syntax:f"], "algorithm.estimator: importing module 'bad_syntax' failed (SyntaxError"),
    (["algorithm.estimator=odd_estimators:per_task"], "returns (4,) for rewards [4, 2, 2], not one advantage per"),
    (["algorithm.estimator=odd_estimators:broken"], "odd_estimators:broken: tracing it on rewards [4, 2, 2] failed"),
    (["algorithm.options.temperature=2"], "algorithm.options of gdpo: 'temperature' is not accepted"),
    (["algorithm.terms=[unit, nope]", "algorithm.weights=[1, 0]"], "algorithm.terms: unknown reward term 'nope'"),
    (["algorithm.weights=[1.0]"], "algorithm.weights: 1 weights for the 2 terms"),
    (["algorithm.terms=[unit]"], "algorithm.weights: give one weight per term"),
    (["algorithm.name=nope"], "algorithm.name: unknown algorithm 'nope'"),
    (["rollout.engine=openai"], "rollout.engine: openai cannot train"),
    (["rollout.engine=nosuch"], "rollout.engine: unknown engine 'nosuch'"),
    (["mesh.data=3"], "mesh: 8 devices do not split"),
    (["run.micro_batches=3"], "run.micro_batches=3 does not divide the 8 rollouts"),
    (["data.train=missing.jsonl"], "data.train: no such file /"),  # paths are resolved where they enter
    (["model.checkpoint=.", "model.architecture=null"], "model.checkpoint: no config.json in /"),
    (["rollout.options={tasks: [1"], "is not valid YAML"),
    (["run.stepz=3"], "unknown key run.stepz"),
])
def test_a_bad_config_exits_2_before_writing_anything(tmp_path, cfg_file, monkeypatch, capsys, overrides, message):
    monkeypatch.chdir(tmp_path)
    for name in ("empty_module", "odd_estimators", "bad_syntax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    out = tmp_path / "run"
    args = ["train", "--config", str(cfg_file), "--out", str(out)]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_resume_without_a_checkpoint_exits_2_and_leaves_the_directory_as_it_was(tmp_path, cfg_file, capsys):
    out = tmp_path / "run"
    for existing in (False, True):
        if existing:  # a run that died before its first checkpoint: config.yaml alone
            out.mkdir()
            (out / "config.yaml").write_text("kept\n")
        assert main(["train", "--config", str(cfg_file), "--out", str(out), "--resume"]) == 2
        assert f"no checkpoint in {out}; drop --resume to start a new run" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == ["config.yaml"] if existing else not out.exists()
    assert (out / "config.yaml").read_text() == "kept\n"


def test_loading_a_config_imports_no_jax_and_evaluation_does_not_import_the_trainer():
    """Every shipped config loads without JAX; evaluation, the rollout engines, the pure math (advantages,
    losses, the step) and the reward never import the loop (`jaxrl.trainer`, `jaxrl.run`)."""
    code = ("import sys; from jaxrl import config as C; [C.load_config(n) for n in C.config_names()]; "
            "a = 'jax' in sys.modules or 'flax' in sys.modules; "
            "import jaxrl.eval.sources, jaxrl.saved_run, jaxrl.step, jaxrl.algorithms, jaxrl.advantages; "
            "import jaxrl.losses, jaxrl.train_step, jaxrl.rollout.jax_engine, jaxrl.rollout.sglang_engine; "
            "import jaxrl.rollout.openai_engine, reward.score, reward.fleet; "
            "print(a, 'jaxrl.trainer' in sys.modules, 'jaxrl.run' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False", "False"]
