"""RL on a mixture-of-experts policy: the `jax` engine samples from a tiny Qwen3-MoE, the trainer's
recomputed log-probs agree with the sampler's, and a resumed run records the same steps."""

import shutil
from pathlib import Path

import pytest

from jaxrl.config import load_config
from jaxrl.demo.tokenizer import load_demo_tokenizer
from jaxrl.metrics import read_metrics
from jaxrl.trainer import train

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = str(REPO / "reward" / "examples" / "tasks.jsonl")
TOKENIZER = load_demo_tokenizer()


def config(out, steps=3):
    arch = dict(model_type="qwen3_moe", vocab_size=TOKENIZER.vocab_size, hidden_size=32, intermediate_size=64,
                moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                rope_theta=10000.0, tie_word_embeddings=True)
    return load_config(data={
        "name": "moe-loop",
        "model": {"family": "qwen3", "architecture": arch, "dtype": "float32", "remat": False},
        "data": {"train": EXAMPLES, "tasks_per_step": 4, "prompt": "demo", "prompt_multiple": 8},
        "rollout": {"engine": "jax", "group_size": 2, "max_tokens": 24, "thinking_budget": 8,
                    "options": {"segment": 8}},
        "reward": {"workers": 2},
        "optimizer": {"learning_rate": 1e-3},
        "validation": {"val_tasks": 0, "gt_debug_tasks": 0},
        "run": {"steps": steps, "save_every": 1, "out": str(out), "progress": False, "tensorboard": False,
                "best_metric": None},
    })


def records(out):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "share/"))}
            for r in read_metrics(Path(out) / "metrics.jsonl")]


@pytest.mark.slow  # about 60 s on 2 shared cores (three real rollouts and updates, then a resumed step)
def test_moe_policy_trains_3_steps_with_sampler_logprobs_and_resumes_exactly(tmp_path):
    train(config(tmp_path / "full"), tokenizer=TOKENIZER)
    full = records(tmp_path / "full")
    assert [r["step"] for r in full] == [1, 2, 3]
    gap = next(k for k in full[0] if k.endswith("logp_gap_max"))
    seen = [(r["rollout/response_tokens"], r[gap]) for r in full]
    assert all(tokens > 0 and g <= 1e-4 for tokens, g in seen), seen
    # (a random policy fails every task, so advantages and gradients are zero here; the update path
    # with nonzero gradients is covered on 8 devices in test_moe.py)

    shutil.copytree(tmp_path / "full", tmp_path / "moved")
    shutil.rmtree(tmp_path / "moved" / "checkpoints" / "3")
    train(config(tmp_path / "moved"), resume=True, tokenizer=TOKENIZER)
    assert records(tmp_path / "moved") == full


def test_tiny_moe_preset_builds_a_qwen3_moe_policy():
    """`precisecoder train --config tiny_moe` resolves to a Qwen3-MoE with every layer sparse."""
    from flax import nnx

    from models.checkpoint import load_config as hf_config
    from models.checkpoint import model_class
    from models.qwen3_moe import Qwen3Moe

    m = load_config("tiny_moe").model
    hf = hf_config({"model_type": m.family, **m.architecture})
    model = nnx.eval_shape(lambda: model_class(hf)(hf, rngs=nnx.Rngs(0)))
    assert isinstance(model, Qwen3Moe) and model.config.run_bounds == ((0, 2, True),)
    assert model.runs[0].mlp.experts.gate_proj.shape == (2, 8, 64, 32)
