"""Qwen3.5-MoE text model against transformers' PyTorch Qwen3.5-MoE on tiny random checkpoints (float32)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from models import checkpoint, decode
from models.qwen3_5_moe import Qwen3_5MoeConfig

VOCAB = 96
TINY = dict(
    vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40,
    eos_token_id=None,
)
VARIANTS = {
    "period4": {},  # three DeltaNet layers then attention, untied
    "period2_tied": dict(full_attention_interval=2, num_experts_per_tok=3, tie_word_embeddings=True),
}

_forward = nnx.jit(lambda m, ids, **kw: m(ids, **kw))


def _hf_model(**overrides) -> Qwen3_5MoeForCausalLM:
    torch.manual_seed(0)
    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**(TINY | overrides))).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "dt_bias" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight") or "shared_expert_gate" in name:
                p.normal_(0.0, 0.5, generator=gen)
            elif "experts" in name:
                p.normal_(0.0, 0.1, generator=gen)
    return model


# the second configuration's prefill parity runs with the slow tests (about 15 s more here)
@pytest.fixture(scope="module", params=["period4", pytest.param("period2_tied", marks=pytest.mark.slow)])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = _hf_model(**VARIANTS[request.param])
    hf.save_pretrained(path)
    return path, hf, checkpoint.from_pretrained(path)


def _ids(seed: int, shape: tuple[int, int]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, shape)


def _hf_logits(hf, ids, **kw) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids), **{k: torch.from_numpy(v) for k, v in kw.items()}).logits.float().numpy()


def test_config_round_trips(tiny):
    _, hf, ours = tiny
    cfg = ours.config
    assert isinstance(cfg, Qwen3_5MoeConfig)
    assert (cfg.num_experts, cfg.num_experts_per_tok) == (8, hf.config.num_experts_per_tok)
    assert Qwen3_5MoeConfig.from_hf(json.loads(json.dumps(cfg.to_hf()))) == cfg


def test_logits_match_transformers_fp32(tiny):
    _, hf, ours = tiny
    ids = _ids(0, (2, 20))
    got = np.asarray(_forward(ours, jnp.asarray(ids)))
    assert got.shape == (2, 20, VOCAB)
    assert np.abs(got - _hf_logits(hf, ids)).max() <= 1e-4


@pytest.mark.slow  # about 30 s per variant (compiles prefill, step and generate on both sides)
def test_cached_decoding_matches_transformers_and_greedy_equals_generate(tiny):
    _, hf, ours = tiny
    prompt, mask = _ids(6, (2, 11)), np.ones((2, 11), np.int64)
    mask[1, :3] = 0
    dec = decode.Decoder(ours)
    cache = dec.init_cache(2, 24)
    logits, cache = dec.prefill(dec.state, cache, jnp.asarray(prompt), jnp.asarray(mask))
    follow = _ids(7, (2, 5))
    chunk, cache = _forward(ours, jnp.asarray(follow[:, :3]), cache=cache)
    got = [np.asarray(logits)[:, None], np.asarray(chunk)]
    for t in range(3, 5):
        logits, cache = dec.step(dec.state, cache, jnp.asarray(follow[:, t]))
        got.append(np.asarray(logits)[:, None])
    full_ids, full_mask = np.concatenate([prompt, follow], 1), np.pad(mask, ((0, 0), (0, 5)), constant_values=1)
    ref = _hf_logits(hf, full_ids, attention_mask=full_mask,
                     position_ids=np.maximum(full_mask.cumsum(1) - 1, 0))[:, 10:]
    real = full_mask[:, 10:].astype(bool)
    assert np.abs(np.concatenate(got, 1) - ref)[real].max() <= 1e-4

    with torch.no_grad():
        want = hf.generate(torch.from_numpy(prompt), attention_mask=torch.from_numpy(mask), max_new_tokens=8,
                           min_new_tokens=8, do_sample=False).numpy()[:, 11:]
    out = dec.generate(jnp.asarray(prompt), jnp.asarray(mask), max_new_tokens=8)
    np.testing.assert_array_equal(np.asarray(out["tokens"]), want)


@pytest.mark.slow  # about 10 s per variant
def test_save_sharded_bf16_then_load_in_transformers_and_ours(tmp_path, tiny):
    _, hf, ours = tiny
    checkpoint.save_pretrained(ours, tmp_path / "f32")
    ids = _ids(3, (2, 13))
    again = Qwen3_5MoeForCausalLM.from_pretrained(tmp_path / "f32").eval()
    assert np.abs(_hf_logits(again, ids) - _hf_logits(hf, ids)).max() <= 1e-6
    reloaded = checkpoint.from_pretrained(tmp_path / "f32")
    for a, b in zip(jax.tree.leaves(nnx.state(ours)), jax.tree.leaves(nnx.state(reloaded))):
        np.testing.assert_array_equal(a, b)
    checkpoint.save_pretrained(ours, tmp_path / "bf16", dtype=jnp.bfloat16, max_shard_bytes=100_000)
    assert len(list((tmp_path / "bf16").glob("model-*-of-*.safetensors"))) > 1
    ours16 = checkpoint.from_pretrained(tmp_path / "bf16", dtype=jnp.bfloat16)
    hf16 = Qwen3_5MoeForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16).eval()
    ref = _hf_logits(hf, ids)
    got = np.asarray(_forward(ours16, jnp.asarray(ids)).astype(jnp.float32))
    assert np.abs(got - ref).max() <= 2 * np.abs(_hf_logits(hf16, ids) - ref).max() + 1e-2
