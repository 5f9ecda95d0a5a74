"""`precisecoder plan`: presets parse, compile for their TPU slice (libtpu, no TPU) and fit; too big fails."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from jaxrl import plan as plan_mod
from jaxrl.cli import main as cli_main
from jaxrl.config import config_names, load_config

PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "tpu_configs").glob("*.yaml"))
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="needs libtpu: pip install -e '.[tpu]'")

TINY = """
name: tiny-plan
model:
  family: qwen3_5
  architecture:
    vocab_size: 512
    hidden_size: 128
    intermediate_size: 256
    num_hidden_layers: 4
    num_attention_heads: 4
    num_key_value_heads: 2
    head_dim: 128
    rope_parameters: {{rope_theta: 10000000.0, partial_rotary_factor: 0.25}}
    linear_num_key_heads: 2
    linear_num_value_heads: 4
    linear_key_head_dim: 32
    linear_value_head_dim: 32
  dtype: bfloat16
  param_dtype: float32
  attention: {attention}
data:
  train: tasks/train.jsonl
  tasks_per_step: 4
rollout:
  engine: {engine}
  max_tokens: 256
  thinking_budget: 128
  options: {{max_rows: 8}}
run:
  micro_batches: 2
mesh:
  fsdp: -1
hardware:
  platform: {platform}
  accelerator: test chip
  topology: {topology}
  chips: 4
  hbm_gib: 16
  peak_tflops: 459
  prompt_tokens: 128
"""


def _tiny(tmp_path, platform="tpu", attention="splash", engine="jax"):
    path = tmp_path / "tiny.yaml"
    topology = '"v5p:2x2x1"' if platform == "tpu" else "null"
    path.write_text(TINY.format(platform=platform, topology=topology, attention=attention, engine=engine))
    return str(path)


def _run(capsys, *argv):
    rc = cli_main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_there_are_presets_for_every_model_and_machine():
    assert len(PRESETS) >= 7
    for model in ("qwen3_5-4b", "qwen3_5-9b", "qwen3_6-27b"):
        for machine in ("v5e", "v5p", "h200x8"):
            assert any(p.startswith(model) and machine in p for p in PRESETS), (model, machine)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_parses_in_the_trainer_schema(name):
    cfg = load_config(name)
    assert name in config_names()
    assert (cfg.rollout.group_size, cfg.rollout.temperature, cfg.rollout.thinking_budget) == (6, 1.0, 4096)
    assert cfg.rollout.max_tokens == 6144 and abs(cfg.reward.lam - 1 / 3) < 1e-12
    assert cfg.run.eval_every == cfg.run.save_every == 25
    vocab = 151936 if cfg.model.family == "qwen3" else 248320  # Qwen3(-MoE) or Qwen3.5/3.6 vocabulary
    assert cfg.hardware is not None and cfg.model.architecture["vocab_size"] == vocab
    rows = cfg.data.tasks_per_step * cfg.rollout.group_size
    assert rows % cfg.run.micro_batches == 0


@needs_libtpu
@pytest.mark.slow  # compiling three programs for 4 TPU chips: 2 CPU-minutes here
def test_tiny_preset_compiles_for_a_tpu_slice_and_fits(tmp_path, capsys):
    rc, out, err = _run(capsys, _tiny(tmp_path), "--json", "--step-time", "2.0")
    assert rc == 0, err
    report = json.loads(out)
    assert report["fits"] is True and report["method"].startswith("compiled ahead of time for v5p:2x2x1")
    pc = report["per_chip"]
    assert pc["params"] > 0 and 0 <= pc["opt_state"] - 2 * pc["params"] < 1024  # Adam: two float32 moments + counters
    assert pc["train_temporaries"] > 0 and pc["kv_cache"] > 0 and pc["decode_total"] >= pc["kv_cache"]
    assert set(report["compile_seconds"]) == {"train_step", "prefill", "decode_step"}
    assert 0 < report["mfu"]["mfu"] < 1


@needs_libtpu
@pytest.mark.slow
def test_fused_attention_lowers_memory_against_xla(tmp_path, capsys):
    """The plan shows memory with each attention kernel: splash holds no [T, T] scores."""
    path = _tiny(tmp_path)
    temps = {}
    for attention in ("xla", "splash"):
        rc, out, err = _run(capsys, path, "--json", "--set", f"model.attention={attention}",
                            "--set", "rollout.max_tokens=1920", "--set", "rollout.thinking_budget=1024")
        assert rc == 0, err
        temps[attention] = json.loads(out)["per_chip"]["train_temporaries"]
    assert temps["splash"] < temps["xla"]


def test_a_gpu_preset_made_too_big_fails_naming_what_does_not_fit(tmp_path, capsys):
    path = _tiny(tmp_path, platform="gpu", attention="cudnn", engine="sglang")
    rc, out, err = _run(capsys, path, "--set", "data.tasks_per_step=4096", "--set", "run.micro_batches=1")
    assert rc == 1
    assert "does not fit: the train step needs" in err and "largest: activations and temporaries" in err
    assert "24576 rows x 384 tokens per micro-batch" in err


@needs_libtpu
@pytest.mark.slow
def test_a_preset_made_too_big_fails_naming_what_does_not_fit(tmp_path, capsys):
    rc, out, err = _run(capsys, _tiny(tmp_path), "--set", "hardware.hbm_gib=0.05", "--set", "model.attention=xla")
    assert rc == 1
    assert "does not fit" in err and "the train step needs" in err and "GiB per chip > 0.05 GiB HBM" in err
    assert "largest:" in err and "NO:" in out


def test_gpu_presets_are_estimated_and_say_so(tmp_path, capsys):
    rc, out, err = _run(capsys, _tiny(tmp_path, platform="gpu", attention="cudnn", engine="sglang"), "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["method"].startswith("estimated from jax.eval_shape")
    assert report["per_chip"]["params"] > 0 and report["compile_seconds"] == {}


def test_an_agentic_config_is_sized_by_its_episodes_max_context(tmp_path, capsys):
    """The same preset with `rollout.agent`: rows of max_context tokens, not prompt + completion, in the
    batch, the activations and the KV cache; each episode its own prefilled prompt."""
    path = _tiny(tmp_path, platform="gpu", attention="cudnn")
    reports, tables = [], []
    for extra in ([], ["--set", "rollout.agent.turns=3", "--set", "rollout.agent.max_context=2048"],
                  ["--set", "hardware.prompt_tokens=1792"]):
        rc, out, err = _run(capsys, path, "--json", *extra)
        assert rc == 0, err
        reports.append(json.loads(out))
        rc, out, err = _run(capsys, path, *extra)
        assert rc == 0, err
        tables.append(out)
    single, agent, long_prompts = reports
    assert (single["batch"]["seq"], agent["batch"]["seq"]) == (128 + 256, 2048)
    assert (single["batch"]["prompt_tokens"], agent["batch"]["prompt_tokens"]) == (128, 2048 - 256)
    assert (single["batch"]["prefill_rows"], agent["batch"]["prefill_rows"]) == (4, 8)  # 8 rows: 2 prompts x G=6
    assert single["batch"]["agent"] is None and agent["batch"]["agent"]["max_context"] == 2048
    # Per slot, the one full-attention layer of four keeps K and V (2 heads of 128, bfloat16) and the cache
    # an int32 segment id, for 8 rows over 4 chips; the DeltaNet state does not grow with the row.
    per_slot = (2 * 2 * 128 * 2 + 4) * 8 // 4
    assert agent["per_chip"]["kv_cache"] - single["per_chip"]["kv_cache"] == (2048 - 384) * per_slot
    # The train phase and the cache are a single-turn config's whose prompt and completion make 2048 tokens.
    for key in ("train_arguments", "train_temporaries", "train_total", "kv_cache"):
        assert agent["per_chip"][key] == long_prompts["per_chip"][key] > single["per_chip"][key], key
    assert agent["train_step_flops"] == long_prompts["train_step_flops"] > 5 * single["train_step_flops"]
    assert "hardware.prompt_tokens + rollout.max_tokens = 128 + 256 tokens" in tables[0]
    assert "agent episodes of rollout.agent.max_context = 2048 tokens (3 turns of 256)" in tables[1]
    assert "prefill: 8 prompts of 1792 tokens, one per episode" in tables[1]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    rc, _, err = _run(capsys, "no-such-preset")
    assert rc == 2 and "no config 'no-such-preset'" in err and "Traceback" not in err
    rc, _, err = _run(capsys, _tiny(tmp_path), "--set", "run.micro_batches=5")
    assert rc == 2 and "run.micro_batches=5 does not divide the 24 rows" in err


def test_missing_libtpu_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)
    with pytest.raises(plan_mod.PlanError, match=r"pip install -e '\.\[tpu\]'"):
        plan_mod.tpu_devices("v5p:2x2x1")


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize("name", [p for p in PRESETS if "h200" not in p])
def test_every_tpu_preset_compiles_and_fits(name, capsys):
    rc, out, err = _run(capsys, name, "--json")
    assert rc == 0, err
    assert json.loads(out)["fits"] is True


@pytest.mark.parametrize("name", [p for p in PRESETS if "h200" in p])
def test_every_gpu_preset_fits_by_estimate(name, capsys):
    rc, out, err = _run(capsys, name, "--json")
    assert rc == 0, err
    assert json.loads(out)["fits"] is True
