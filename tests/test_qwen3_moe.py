"""Qwen3-MoE against transformers' PyTorch Qwen3-MoE on tiny random checkpoints (float32 unless said)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from hf_qwen3 import hf_logits
from hf_qwen3_moe import VARIANTS, make_hf
from transformers import Qwen3MoeForCausalLM

import models
from models import checkpoint, decode
from models.qwen3_moe import Qwen3MoeConfig

FP32_TOL = 1e-4

_forward = nnx.jit(lambda m, ids, **kw: m(ids, **kw))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, make_hf(path, **VARIANTS[request.param]), models.from_pretrained(path)


def _ids(b=2, t=13, seed=0):
    return np.random.RandomState(seed).randint(1, 128, (b, t)).astype(np.int32)


def test_config_reads_transformers_layout_and_round_trips(tiny):
    path, hf, ours = tiny
    cfg = ours.config
    assert isinstance(cfg, Qwen3MoeConfig)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 40)
    assert cfg.norm_topk_prob == hf.config.norm_topk_prob
    assert Qwen3MoeConfig.from_hf(json.loads(json.dumps(cfg.to_hf()))) == cfg
    kinds = [type(layer.mlp).__name__ for layer in hf.model.layers]
    assert [cfg.is_sparse(i) for i in range(cfg.num_hidden_layers)] == [k == "Qwen3MoeSparseMoeBlock" for k in kinds]


def test_mixed_layers_are_scanned_in_runs():
    cfg = Qwen3MoeConfig.from_hf({**Qwen3MoeConfig(128, 64, 96, 4, 4, 2, 24, 1e4).to_hf(),
                                  "decoder_sparse_step": 2, "mlp_only_layers": [0], "num_experts": 8})
    assert cfg.run_bounds == ((0, 1, False), (1, 2, True), (2, 3, False), (3, 4, True))
    dense = Qwen3MoeConfig(128, 64, 96, 4, 4, 2, 24, 1e4, num_experts=8, num_experts_per_tok=2)
    assert dense.run_bounds == ((0, 4, True),)


def test_fp32_logits_match_transformers(tiny):
    _, hf, ours = tiny
    ids = _ids()
    out = np.asarray(_forward(ours, jnp.asarray(ids)))
    assert out.shape == (2, 13, 128)
    np.testing.assert_allclose(out, hf_logits(hf, ids), atol=FP32_TOL, rtol=0)


@pytest.mark.slow  # about 8 s per variant
def test_left_padding_matches_transformers(tiny):
    _, hf, ours = tiny
    ids = _ids(3, 9, seed=3)
    mask = np.ones_like(ids)
    mask[0, :4] = 0
    ids = ids * mask
    out = np.asarray(_forward(ours, jnp.asarray(ids), attention_mask=jnp.asarray(mask)))
    ref = hf_logits(hf, ids, attention_mask=mask, position_ids=np.maximum(np.cumsum(mask, 1) - 1, 0))
    keep = mask.astype(bool)
    np.testing.assert_allclose(out[keep], ref[keep], atol=FP32_TOL, rtol=0)


@pytest.mark.slow  # 30-50 s per variant (compiles prefill, step and generate on both sides)
def test_cached_decoding_matches_transformers_and_greedy_equals_generate(tiny):
    """Prefill, a 3-token chunk and single steps through the cache give transformers' logits."""
    _, hf, ours = tiny
    prompt, mask = _ids(2, 7, seed=4), np.ones((2, 7), np.int32)
    mask[1, :2] = 0
    follow = _ids(2, 5, seed=5)
    dec = decode.Decoder(ours)
    cache = dec.init_cache(2, 20)
    logits, cache = dec.prefill(dec.state, cache, jnp.asarray(prompt), jnp.asarray(mask))
    chunk, cache = _forward(ours, jnp.asarray(follow[:, :3]), cache=cache)
    got = [np.asarray(logits)[:, None], np.asarray(chunk)]
    for t in range(3, 5):
        logits, cache = dec.step(dec.state, cache, jnp.asarray(follow[:, t]))
        got.append(np.asarray(logits)[:, None])
    full_ids = np.concatenate([prompt, follow], 1)
    full_mask = np.pad(mask, ((0, 0), (0, 5)), constant_values=1)
    ref = hf_logits(hf, full_ids, attention_mask=full_mask,
                    position_ids=np.maximum(np.cumsum(full_mask, 1) - 1, 0))[:, 6:]
    np.testing.assert_allclose(np.concatenate(got, 1), ref, atol=FP32_TOL, rtol=0)

    with torch.no_grad():
        want = hf.generate(torch.from_numpy(prompt).long(), attention_mask=torch.from_numpy(mask).long(),
                           max_new_tokens=8, min_new_tokens=8, do_sample=False).numpy()[:, 7:]
    out = dec.generate(jnp.asarray(prompt), jnp.asarray(mask), max_new_tokens=8)
    np.testing.assert_array_equal(np.asarray(out["tokens"]), want)


def test_sharp_routers_with_ties_agree_with_transformers(tmp_path):
    """Sharp routers (probabilities that underflow to exactly 0) and exactly tied experts give transformers' logits.

    Ties are broken toward the lower expert index (`models.moe.route`); torch's
    CPU topk promises no order. The ties here are the ones whose resolution
    cannot change the output: a k-th choice of probability 0 (weight 0) and a
    tie between an expert and its exact duplicate (same router row and
    weights), so the outputs must agree whichever expert each side picks.
    """
    hf = make_hf(None, **VARIANTS["mixed"])
    with torch.no_grad():
        for layer in hf.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.mul_(60.0)
                layer.mlp.gate.weight[5] = layer.mlp.gate.weight[2]
                layer.mlp.experts.gate_up_proj[5] = layer.mlp.experts.gate_up_proj[2]
                layer.mlp.experts.down_proj[5] = layer.mlp.experts.down_proj[2]
    hf.save_pretrained(tmp_path)
    ours = models.from_pretrained(tmp_path)
    ids = _ids(4, 16, seed=6)
    with torch.no_grad():
        out = hf(torch.from_numpy(ids).long(), output_router_logits=True)
    zero_ties = dup_ties = 0
    for logits in out.router_logits:
        probs = torch.softmax(logits.float(), -1)
        top = probs.sort(-1, descending=True).values
        zero_ties += int(((top[:, 1] == top[:, 2]) & (top[:, 1] == 0)).sum())
        dup_ties += int(((probs[:, 2] == top[:, 0]) | (probs[:, 2] == top[:, 1])).sum())
    assert zero_ties >= 10 and dup_ties >= 5, (zero_ties, dup_ties)
    got = np.asarray(_forward(ours, jnp.asarray(ids)))
    np.testing.assert_allclose(got, out.logits.numpy(), atol=FP32_TOL, rtol=0)


@pytest.mark.slow  # about 10 s per variant
def test_save_sharded_bf16_then_load_in_transformers_and_ours(tmp_path, tiny):
    path, hf, ours = tiny
    checkpoint.save_pretrained(ours, tmp_path / "f32")
    ids = _ids(seed=7)
    again = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "f32").eval()
    np.testing.assert_allclose(hf_logits(again, ids), hf_logits(hf, ids), atol=1e-6, rtol=0)
    reloaded = models.from_pretrained(tmp_path / "f32")
    for a, b in zip(jax.tree.leaves(nnx.state(ours)), jax.tree.leaves(nnx.state(reloaded))):
        np.testing.assert_array_equal(a, b)

    checkpoint.save_pretrained(ours, tmp_path / "bf16", dtype=jnp.bfloat16, max_shard_bytes=200_000)
    assert len(list((tmp_path / "bf16").glob("model-*-of-*.safetensors"))) > 1
    hf16 = Qwen3MoeForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.bfloat16).eval()
    ours16 = models.from_pretrained(tmp_path / "bf16", dtype=jnp.bfloat16)
    assert ours16.runs[-1].mlp.experts.gate_proj[...].dtype == jnp.bfloat16
    ref = hf_logits(hf, ids)
    got = np.asarray(_forward(ours16, jnp.asarray(ids)).astype(jnp.float32))
    # bf16 routing may flip a near-tied choice: bound the error by transformers' own bf16 error
    assert np.abs(got - ref).max() <= 2 * np.abs(hf_logits(hf16, ids) - ref).max() + 1e-2
