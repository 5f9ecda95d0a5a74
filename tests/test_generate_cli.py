"""`precisecoder generate` end to end on a tiny random Qwen3 with the real Qwen3 vocabulary."""

import json

import jax
import numpy as np
import optax
import pytest
import torch
import yaml
from fake_servers import FakeSGLang
from flax import nnx
from transformers import Qwen3Config, Qwen3ForCausalLM

import models
from jaxrl import train_step as ts
from jaxrl.checkpoint import Checkpointer
from jaxrl.cli import main
from jaxrl.rollout import SamplingParams
from jaxrl.rollout.jax_engine import JaxEngine
from models import sharding
from models.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli_model")
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151680, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"id": "a", "messages": [{"role": "user", "content": "Fix: def f(x): return x +"}]},
             {"id": 7, "input_ids": [151644, 872, 198, 9707]}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _run(*argv):
    return main(["generate", *map(str, argv), "--no-progress"])


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_generate_writes_one_line_per_sample(model_dir, prompts, tmp_path):
    out = tmp_path / "out.jsonl"
    args = ["--model", model_dir, "--prompts", prompts, "--out", out, "--n", 2, "--max-tokens", 6, "--seed", 3]
    assert _run(*args) == 0
    rows = _read(out)
    tok = load_tokenizer("qwen3")
    assert [(r["id"], r["sample"]) for r in rows] == [("a", 0), ("a", 1), (7, 0), (7, 1)]
    for r in rows:
        assert len(r["token_ids"]) == len(r["logprobs"]) <= 6 and r["finish_reason"] in ("stop", "length")
        assert r["text"] == tok.decode(r["token_ids"]) and all(lp <= 0 for lp in r["logprobs"])
    assert _run(*args) == 0 and _read(out) == rows  # same seed, same samples


@pytest.mark.parametrize("line,message", [
    ("{not json", "prompts.jsonl:2: not JSON"),
    ('{"id": 1}', "prompts.jsonl:2: give exactly one of `messages` and `input_ids`"),
    ('{"id": 1, "input_ids": [1, -2]}', "prompts.jsonl:2: `input_ids` must be a non-empty list"),
    ('{"id": 1, "input_ids": [999999]}', "prompts.jsonl:2: token id 999999 is outside the vocabulary"),
    ('{"id": 1, "messages": [{"role": "robot", "content": "x"}]}', "prompts.jsonl:2: Unsupported role: robot"),
])
def test_bad_prompt_lines_are_one_error_naming_the_line(model_dir, tmp_path, capsys, line, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": 0, "input_ids": [1, 2]}\n' + line + "\n")
    assert _run("--model", model_dir, "--prompts", path, "--out", tmp_path / "o.jsonl") == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra,message", [
    (["--temperature", "-1"], "temperature must be finite and >= 0"),
    (["--engine", "sglang"], "the sglang engine needs --url"),
    (["--engine", "openai", "--base-url", "http://127.0.0.1:9"], "needs --base-url and --served-model"),
])
def test_bad_arguments_exit_2(prompts, tmp_path, capsys, extra, message):
    assert _run("--prompts", prompts, "--out", tmp_path / "o.jsonl", *extra) == 2
    assert message in capsys.readouterr().err


def test_generate_from_a_trainer_checkpoint(model_dir, prompts, tmp_path, monkeypatch):
    """--checkpoint reads a run directory's config.yaml and its latest step's parameters alone
    (saved here with another optimizer than the config's: its state is not read); the paths are
    relative to the working directory, as a user types them."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"family": "qwen3", "checkpoint": str(model_dir)},
                                                     "data": {"train": "unused.jsonl"}}))
    model = models.from_pretrained(model_dir)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    trained = nnx.merge(graphdef, jax.tree.map(lambda x: x * 1.7, params), rest)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    state, _, _ = ts.init_train_state(trained, optax.adamw(1e-3), mesh)
    ckpt = Checkpointer(run / "checkpoints", async_save=False)
    ckpt.save(state, jax.random.key(0))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.jsonl"
    assert _run("--checkpoint", "run", "--prompts", prompts, "--out", "out.jsonl", "--temperature", 0,
                "--max-tokens", 5) == 0
    tok = load_tokenizer("qwen3")
    want = JaxEngine(trained, tok).generate([tok.encode(tok.render_chat(
        [{"role": "user", "content": "Fix: def f(x): return x +"}])), [151644, 872, 198, 9707]],
        SamplingParams(temperature=0.0, max_tokens=5))
    assert [r["token_ids"] for r in _read(out)] == [list(g[0].token_ids) for g in want]
    base = JaxEngine(model, tok).generate([[151644, 872, 198, 9707]], SamplingParams(temperature=0.0, max_tokens=5))
    assert np.asarray(base[0][0].token_ids).tolist() != _read(out)[1]["token_ids"]  # the trained weights, not the base
    step_dir = tmp_path / "step.jsonl"
    assert _run("--checkpoint", "run/checkpoints/0", "--prompts", prompts, "--out", "step.jsonl",
                "--temperature", 0, "--max-tokens", 5) == 0
    assert [r["token_ids"] for r in _read(step_dir)] == [r["token_ids"] for r in _read(out)]


def test_generate_with_the_sglang_engine(prompts, tmp_path):
    server = FakeSGLang(vocab=(300, 400), p_eos=0.0)
    try:
        out = tmp_path / "out.jsonl"
        assert _run("--engine", "sglang", "--url", server.url, "--tokenizer", "qwen3", "--prompts", prompts,
                    "--out", out, "--n", 3, "--max-tokens", 4) == 0
        rows = _read(out)
        assert len(rows) == 6 and all(len(r["token_ids"]) == 4 for r in rows)
    finally:
        server.close()


def test_ctrl_c_keeps_finished_prompts_and_the_same_command_skips_them(model_dir, prompts, tmp_path, monkeypatch,
                                                                        capsys):
    """Ctrl-C arrives (as KeyboardInterrupt) during the second batch; the rerun samples only what is missing."""
    real = JaxEngine.generate
    calls = []

    def interrupted_second(self, batch, params):
        calls.append(len(batch))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, batch, params)

    monkeypatch.setattr(JaxEngine, "generate", interrupted_second)
    out = tmp_path / "out.jsonl"
    argv = ("--model", model_dir, "--prompts", prompts, "--out", out, "--n", 2, "--max-tokens", 3, "--batch-size", 1)
    assert _run(*argv) == 130
    assert "interrupted; 1 of 2 prompts are in" in capsys.readouterr().err
    assert [(r["id"], r["sample"]) for r in _read(out)] == [("a", 0), ("a", 1)]
    with out.open("a") as f:
        f.write('{"id": 7, "sample": 0, "tok')  # a line torn by a kill
    calls.clear()
    monkeypatch.setattr(JaxEngine, "generate", lambda self, batch, params: calls.append(len(batch)) or real(
        self, batch, params))
    assert _run(*argv) == 0
    assert calls == [1] and "resuming: 1 of 2 prompts" in capsys.readouterr().err
    assert [(r["id"], r["sample"]) for r in _read(out)] == [("a", 0), ("a", 1), (7, 0), (7, 1)]
    assert _run(*argv, "--overwrite") == 0 and calls == [1, 1, 1]
