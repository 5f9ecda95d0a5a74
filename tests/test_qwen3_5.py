"""Qwen3.5 hybrid model against transformers' PyTorch Qwen3.5 on tiny random checkpoints."""

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3_5Config as HFWrapperConfig
from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

from models import checkpoint, decode, sharding
from models.qwen3_5 import FULL, LINEAR, Qwen3_5, Qwen3_5Config

VOCAB = 96
TINY = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=8, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=4, eos_token_id=None,
)


def _randomize_norms(model: torch.nn.Module) -> None:
    """Move every norm weight and dt_bias off its init so centering and gating mistakes show."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "dt_bias" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


def _hf_text_model(**overrides) -> Qwen3_5ForCausalLM:
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**(TINY | overrides))).eval()
    _randomize_norms(model)
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5_text")
    hf = _hf_text_model()
    hf.save_pretrained(path)
    return path, hf


@pytest.fixture(scope="module")
def ours(hf_dir):
    return checkpoint.from_pretrained(hf_dir[0])


def _ids(seed: int, shape: tuple[int, int]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, shape)


def _hf_logits(hf, ids, **kw) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids), **{k: torch.from_numpy(v) for k, v in kw.items()}).logits.float().numpy()


_forward = nnx.jit(lambda m, ids, **kw: m(ids, **kw))


def test_config_reads_text_and_multimodal_json():
    text = json.loads(Qwen3_5TextConfig(**TINY).to_json_string())
    cfg = Qwen3_5Config.from_hf(text)
    assert cfg.groups == (2, ((LINEAR, 3), (FULL, 1)))
    assert (cfg.partial_rotary_factor, cfg.conv_dim, cfg.model_type) == (0.25, 2 * 16 + 32, "qwen3_5_text")
    wrapper = HFWrapperConfig(text_config=text, tie_word_embeddings=True).to_dict()
    wcfg = Qwen3_5Config.from_hf(wrapper)
    assert (wcfg.model_type, wcfg.tie_word_embeddings, wcfg.layer_types) == ("qwen3_5", True, cfg.layer_types)
    assert dataclasses.replace(Qwen3_5Config.from_hf(wcfg.to_hf()), hf_json=wcfg.hf_json) == wcfg
    odd = Qwen3_5Config.from_hf(text | {"layer_types": [LINEAR, FULL, FULL, LINEAR] * 2})
    assert odd.groups == (2, ((LINEAR, 1), (FULL, 2), (LINEAR, 1)))


def test_config_reads_a_released_style_multimodal_config():
    """The shape of a released Qwen3.5-9B config.json: mrope fields, MTP and vision keys alongside."""
    text = {
        "model_type": "qwen3_5_text", "attention_bias": False, "attn_output_gate": True, "eos_token_id": 248044,
        "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 12288, "layer_types": [LINEAR, LINEAR, LINEAR, FULL] * 8,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "num_attention_heads": 16,
        "num_key_value_heads": 4, "num_hidden_layers": 32, "rms_norm_eps": 1e-6, "vocab_size": 248320,
        "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                            "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    }
    hf = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": text,
          "vision_config": {"depth": 27}, "tie_word_embeddings": False}
    cfg = Qwen3_5Config.from_hf(hf)
    assert cfg.groups == (8, ((LINEAR, 3), (FULL, 1)))
    assert (cfg.rope_theta, cfg.partial_rotary_factor, cfg.conv_dim, cfg.eos_token_id) == (1e7, 0.25, 8192, 248044)
    model = nnx.eval_shape(lambda: Qwen3_5(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    assert model.layers.runs[0].linear_attn.conv1d.weight.shape == (8, 3, 8192, 1, 4)
    assert model.layers.runs[1].self_attn.q_proj.kernel.shape == (8, 1, 4096, 16, 512)
    written = cfg.to_hf()
    assert written["text_config"]["rope_parameters"]["mrope_section"] == [11, 11, 10]
    with pytest.raises(NotImplementedError):
        Qwen3_5Config.from_hf(text | {"attn_output_gate": False})


def test_logits_match_transformers_fp32(hf_dir, ours):
    ids = _ids(0, (2, 70))
    got = np.asarray(_forward(ours, jnp.asarray(ids), attention_mask=jnp.ones((2, 70), jnp.int32)))
    ref = _hf_logits(hf_dir[1], ids)
    assert got.shape == (2, 70, VOCAB)
    assert np.abs(got - ref).max() <= 1e-4


def test_left_padding_matches_transformers(hf_dir, ours):
    ids = _ids(1, (2, 70))
    mask = np.ones((2, 70), np.int64)
    mask[1, :9] = 0
    positions = np.maximum(mask.cumsum(1) - 1, 0)
    ref = _hf_logits(hf_dir[1], ids, attention_mask=mask, position_ids=positions)
    got = np.asarray(_forward(ours, jnp.asarray(ids), attention_mask=jnp.asarray(mask, jnp.int32)))
    real = mask.astype(bool)
    assert np.abs(got[real] - ref[real]).max() <= 1e-4


def test_packed_segments_equal_separate_sequences(ours):
    """Row 0 packs three sequences and padding; rows 1-3 hold each sequence alone (then padding)."""
    lengths = (25, 30, 9)
    ids = np.zeros((4, 70), np.int64)
    seg = np.zeros((4, 70), np.int64)
    ids[0] = _ids(2, (1, 70))[0]
    seg[0, :64] = np.repeat([1, 2, 3], lengths)
    starts = np.cumsum((0,) + lengths)
    for row, (lo, hi) in enumerate(zip(starts[:-1], starts[1:]), start=1):
        ids[row, : hi - lo], seg[row, : hi - lo] = ids[0, lo:hi], 1
    out = np.asarray(_forward(ours, jnp.asarray(ids), segment_ids=jnp.asarray(seg)))
    for row, (lo, hi) in enumerate(zip(starts[:-1], starts[1:]), start=1):
        assert np.abs(out[0, lo:hi] - out[row, : hi - lo]).max() <= 1e-5


def test_save_then_load_in_transformers_and_ours(tmp_path, ours):
    checkpoint.save_pretrained(ours, tmp_path)
    hf = Qwen3_5ForCausalLM.from_pretrained(tmp_path).eval()
    ids = _ids(3, (2, 21))
    ref = _hf_logits(hf, ids)
    assert np.abs(np.asarray(_forward(ours, jnp.asarray(ids))) - ref).max() <= 1e-4
    again = checkpoint.from_pretrained(tmp_path)
    for a, b in zip(jax.tree.leaves(nnx.state(ours)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(a, b)


def test_multimodal_checkpoint_text_part(tmp_path):
    torch.manual_seed(0)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4)
    cfg = HFWrapperConfig(text_config=TINY | {"num_hidden_layers": 4}, vision_config=vision)
    hf = Qwen3_5ForConditionalGeneration(cfg).eval()
    _randomize_norms(hf)
    hf.save_pretrained(tmp_path)
    ours = checkpoint.from_pretrained(tmp_path)
    assert ours.config.model_type == "qwen3_5"
    ids = _ids(4, (1, 19))
    assert np.abs(np.asarray(ours(jnp.asarray(ids))) - _hf_logits(hf, ids)).max() <= 1e-4
    out = tmp_path / "ours"
    checkpoint.save_pretrained(ours, out)
    written = checkpoint.SafetensorsDir(out).keys()
    assert "model.language_model.layers.0.linear_attn.A_log" in written and "lm_head.weight" in written
    assert json.loads((out / "config.json").read_text())["vision_config"]["depth"] == 1


def test_bf16_within_stated_bound(hf_dir):
    """bf16 logits stay within 1e-2 of the fp32 reference and within twice transformers' own bf16 error."""
    model = checkpoint.from_pretrained(hf_dir[0], dtype=jnp.bfloat16)
    ids = _ids(5, (2, 70))
    got = np.asarray(_forward(model, jnp.asarray(ids)), np.float32)
    ref = _hf_logits(hf_dir[1], ids)
    hf_bf16_error = np.abs(_hf_logits(_hf_text_model().to(torch.bfloat16), ids) - ref).max()
    error = np.abs(got - ref).max()
    assert error <= 1e-2 and error <= 2 * hf_bf16_error


def test_gradients_with_remat_match_transformers(hf_dir):
    """The training path (chunked rule, scanned groups, remat) differentiates like torch autograd."""
    hf = hf_dir[1]
    model = checkpoint.from_pretrained(hf_dir[0], remat=True)
    ids = _ids(9, (1, 40))
    probe = np.random.default_rng(9).standard_normal((1, 40, VOCAB)).astype(np.float32)

    def loss(m):
        return jnp.sum(m(jnp.asarray(ids)) * probe)

    grads = nnx.grad(loss)(model)
    hf.zero_grad()
    (hf(torch.from_numpy(ids)).logits * torch.from_numpy(probe)).sum().backward()
    run = grads.layers.runs[0].linear_attn
    pairs = {
        "model.layers.5.linear_attn.A_log": run.A_log[...][1, 1],
        "model.layers.1.linear_attn.conv1d.weight": run.conv1d.weight[...][0, 1],
        "model.layers.7.self_attn.q_norm.weight": grads.layers.runs[1].self_attn.q_norm.weight[...][1, 0],
        "model.embed_tokens.weight": grads.embed_tokens.embedding[...],
    }
    for name, ours_grad in pairs.items():
        ref = hf.get_parameter(name).grad.numpy()
        assert np.abs(np.asarray(ours_grad) - ref).max() <= 1e-4 * np.abs(ref).max(), name
    hf.zero_grad()


def test_decoding_matches_full_forward_and_transformers_generate(hf_dir, ours):
    """Prefill, a multi-token continuation and steps give the full forward's logits;
    greedy tokens equal transformers' generate."""
    prompt, mask = _ids(6, (2, 11)), np.ones((2, 11), np.int64)
    mask[1, :3] = 0
    dec = decode.Decoder(ours)
    cache = dec.init_cache(2, 24)
    logits, cache = dec.prefill(dec.state, cache, jnp.asarray(prompt), jnp.asarray(mask))
    follow = _ids(7, (2, 6))
    chunk, cache = _forward(ours, jnp.asarray(follow[:, :3]), cache=cache)
    got = [np.asarray(logits)[:, None], np.asarray(chunk)]
    for t in range(3, 6):
        logits, cache = dec.step(dec.state, cache, jnp.asarray(follow[:, t]))
        got.append(np.asarray(logits)[:, None])
    full_ids, full_mask = np.concatenate([prompt, follow], 1), np.pad(mask, ((0, 0), (0, 6)), constant_values=1)
    full = np.asarray(_forward(ours, jnp.asarray(full_ids), attention_mask=jnp.asarray(full_mask)))
    assert np.abs(np.concatenate(got, 1) - full[:, 10:]).max() <= 1e-5

    with torch.no_grad():
        ref = hf_dir[1].generate(torch.from_numpy(prompt), attention_mask=torch.from_numpy(mask), max_new_tokens=12,
                                 min_new_tokens=12, do_sample=False).numpy()[:, 11:]
    out = dec.generate(jnp.asarray(prompt), jnp.asarray(mask), max_new_tokens=12)
    np.testing.assert_array_equal(np.asarray(out["tokens"]), ref)


@pytest.mark.slow  # about 20 s; Qwen3 sharding stays in the default run (test_model_sharding)
def test_sharded_forward_and_decoding_equal_single_device(hf_dir, ours):
    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    sharded = checkpoint.from_pretrained(hf_dir[0], mesh=mesh)
    kernel = sharded.layers.runs[0].linear_attn.in_proj_qkv.kernel[...]
    assert len(kernel.sharding.device_set) == 8
    ids = jnp.asarray(_ids(8, (4, 33)))
    with sharding.use_mesh(mesh):
        got = np.asarray(_forward(sharded, ids))
    assert np.abs(got - np.asarray(_forward(ours, ids))).max() <= 1e-5

    prompt, mask = ids[:, :9], jnp.ones((4, 9), jnp.int32).at[0, :2].set(0)
    want = decode.Decoder(ours).generate(prompt, mask, max_new_tokens=5)
    with sharding.use_mesh(mesh):
        dec = decode.Decoder(sharded)
        assert dec.init_cache(4, 14).layers[0].recurrent.sharding.spec[2] == ("data", "fsdp")
        got = dec.generate(prompt, mask, max_new_tokens=5)
    np.testing.assert_array_equal(np.asarray(got["tokens"]), np.asarray(want["tokens"]))
    assert np.abs(np.asarray(got["logprobs"]) - np.asarray(want["logprobs"])).max() <= 1e-5


def _compile_seconds(layers: int) -> tuple[float, float]:
    """Seconds to compile the forward and the gradient (remat) of a `layers`-deep model, B = 2, T = 256."""
    hc = Qwen3_5TextConfig(**TINY | {"num_hidden_layers": layers, "hidden_size": 64, "vocab_size": 256})
    cfg = Qwen3_5Config.from_hf(json.loads(hc.to_json_string()))
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3_5(cfg, rngs=nnx.Rngs(0), remat=True)))
    ids = jax.ShapeDtypeStruct((2, 256), jnp.int32)
    forward = lambda s, i: nnx.merge(graphdef, s)(i)
    seconds = []
    for fn in (forward, jax.grad(lambda s, i: jnp.mean(forward(s, i)))):
        start = time.perf_counter()
        jax.jit(fn).lower(state, ids).compile()
        seconds.append(time.perf_counter() - start)
    return seconds[0], seconds[1]


@pytest.mark.slow
def test_compile_time_does_not_grow_with_depth():
    shallow, deep = _compile_seconds(4), _compile_seconds(32)
    print(f"compile seconds (forward, grad): 4 layers {shallow[0]:.1f}, {shallow[1]:.1f}; "
          f"32 layers {deep[0]:.1f}, {deep[1]:.1f}")
    assert deep[0] < 2 * shallow[0] and deep[1] < 2 * shallow[1]


@pytest.mark.slow
def test_rl_train_step_on_a_2x2x2_mesh_equals_one_device():
    """The hybrid model inside jaxrl's sharded PPO step (packed rows, remat): same update on 1 and 8 devices."""
    from jaxrl import train_step as ts

    cfg = Qwen3_5Config.from_hf(json.loads(Qwen3_5TextConfig(**TINY | {"num_hidden_layers": 4}).to_json_string()))
    rng = np.random.default_rng(0)
    seg = np.repeat([[1] * 9 + [2] * 5 + [0] * 2], 8, axis=0)
    mask = ((seg > 0) & (np.arange(16) % 9 >= 3)).astype(np.float32)
    batch = ts.Batch(jnp.asarray(rng.integers(0, VOCAB, (8, 16)), jnp.int32), jnp.asarray(mask),
                     jnp.asarray(np.where(mask > 0, -np.log(VOCAB), 0.0), jnp.float32),
                     jnp.asarray(rng.standard_normal((8, 2)), jnp.float32), segment_ids_BxT=jnp.asarray(seg))
    step_cfg = ts.TrainStepConfig()
    updated = []
    for shape in [(1, 1, 1), (2, 2, 2)]:
        mesh = sharding.make_mesh(*shape, devices=jax.devices()[: int(np.prod(shape))])
        tx = ts.make_optimizer(step_cfg.optimizer)
        state, graphdef, rest = ts.init_train_state(Qwen3_5(cfg, rngs=nnx.Rngs(0), remat=True), tx, mesh)
        abstract = lambda x: jax.eval_shape(lambda y: y, x)  # noqa: E731
        step = ts.jit_train_step(graphdef, rest, tx, step_cfg, mesh, abstract(state), abstract(batch))
        new, metrics = step(state, batch)
        assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
        updated.append(jax.tree.leaves(jax.tree.map(np.asarray, new.params)))
    for a, b in zip(*updated):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
