"""HF safetensors I/O: table-driven loading onto shardings, saving that transformers loads."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx
from hf_qwen3 import VARIANTS, hf_logits, make_hf
from safetensors import safe_open
from transformers import Qwen3ForCausalLM

import models
from models.checkpoint import Rule, SafetensorsDir, write_safetensors
from models.qwen3 import Qwen3, Qwen3Config


@pytest.fixture(scope="module", params=["tied", "untied"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, make_hf(path, **VARIANTS[request.param])


def _params(model):
    return {k: np.asarray(v[...]) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_round_trip_is_identical_and_transformers_loads_it(tiny, tmp_path):
    path, hf = tiny
    ours = models.from_pretrained(path)
    models.save_pretrained(ours, tmp_path / "rt")
    again = models.from_pretrained(tmp_path / "rt")
    a, b = _params(ours), _params(again)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=str(k))
    # the HF tensors themselves round-trip bit for bit
    src, out = SafetensorsDir(path), SafetensorsDir(tmp_path / "rt")
    assert sorted(src.keys()) == sorted(out.keys())
    for k in src.keys():
        np.testing.assert_array_equal(np.asarray(src[k]), np.asarray(out[k]), err_msg=k)
    reloaded = Qwen3ForCausalLM.from_pretrained(tmp_path / "rt").eval()
    ids = np.random.RandomState(0).randint(0, 128, (2, 9))
    np.testing.assert_array_equal(hf_logits(reloaded, ids), hf_logits(hf, ids))
    cfg = json.loads((tmp_path / "rt" / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["dtype"] == "float32"


def test_sharded_bf16_checkpoint_with_index(tmp_path):
    cfg = Qwen3Config(128, 64, 96, 2, 4, 2, 24, 1e4, tie_word_embeddings=False)
    model = Qwen3(cfg, rngs=nnx.Rngs(1))
    models.save_pretrained(model, tmp_path / "m", dtype=jnp.bfloat16, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2
    with safe_open(str(tmp_path / "m" / files[0]), "pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.bfloat16
    ours = models.from_pretrained(tmp_path / "m", dtype=jnp.bfloat16)
    for k, v in _params(model).items():
        np.testing.assert_array_equal(_params(ours)[k], v.astype(ml_dtypes.bfloat16), err_msg=str(k))
    hf = Qwen3ForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    ids = np.random.RandomState(0).randint(0, 128, (1, 7))
    mine = np.asarray(models.from_pretrained(tmp_path / "m")(jnp.asarray(ids)))
    np.testing.assert_allclose(mine, hf_logits(hf, ids), atol=1e-4, rtol=0)


def test_loads_straight_onto_mesh_shards(tiny):
    path, _ = tiny
    mesh = models.make_mesh(2, 2, 2)
    sharded = models.from_pretrained(path, mesh=mesh)
    single = models.from_pretrained(path)
    k = sharded.layers.mlp.gate_proj.kernel[...]
    assert k.shape == (2, 64, 96)
    assert k.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    assert {s.data.shape for s in k.addressable_shards} == {(2, 32, 48)}
    a, b = _params(sharded), _params(single)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=str(key))


def test_saving_a_sharded_model_gathers_every_parameter(tiny, tmp_path):
    path, _ = tiny
    sharded = models.from_pretrained(path, mesh=models.make_mesh(2, 2, 2))
    models.save_pretrained(sharded, tmp_path / "s")
    src, out = SafetensorsDir(path), SafetensorsDir(tmp_path / "s")
    assert sorted(src.keys()) == sorted(out.keys())
    for k in src.keys():
        np.testing.assert_array_equal(np.asarray(src[k]), np.asarray(out[k]), err_msg=k)


@pytest.mark.parametrize("split,transpose,shape", [
    ((1, 2), True, (6, 4, 3)),   # q_proj: ours [D, N, H] ← HF [N*H, D]
    ((2, 1), True, (4, 3, 6)),   # o_proj: ours [N, H, D] ← HF [D, N*H]
    ((2,), False, (4, 3)),       # bias: ours [N, H] ← HF [N*H]
    (None, False, (5, 7)),
])
def test_rule_reads_any_block(split, transpose, shape):
    rule = Rule("w", "w", transpose=transpose, split=split)
    ours = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    hf = rule.to_hf(ours)
    assert hf.shape == rule.hf_shape(shape)
    rng = np.random.RandomState(0)
    for _ in range(20):
        want = []
        for n in shape:
            a = rng.randint(0, n)
            want.append(slice(a, rng.randint(a + 1, n + 1)))
        np.testing.assert_array_equal(rule.read(hf, shape, want), ours[tuple(want)])
    np.testing.assert_array_equal(rule.read(hf, shape, [slice(None)] * len(shape)), ours)


def test_safetensors_writer_matches_the_reference_reader(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones((3,), ml_dtypes.bfloat16),
              "c": np.array([1, 2], np.int64)}
    write_safetensors(tmp_path / "x.safetensors", [(k, v.shape, v.dtype, lambda v=v: v) for k, v in arrays.items()])
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        assert f.get_tensor("b").dtype == torch.bfloat16
        np.testing.assert_array_equal(f.get_tensor("a").numpy(), arrays["a"])
        np.testing.assert_array_equal(f.get_tensor("c").numpy(), arrays["c"])
    back = SafetensorsDir(tmp_path / "x.safetensors")
    for k, v in arrays.items():
        np.testing.assert_array_equal(np.asarray(back[k]), v)


def test_unknown_and_missing_tensors_are_errors(tiny, tmp_path):
    path, hf = tiny
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    cfg = (path / "config.json").read_text()

    def write(tensors, name):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(cfg)
        write_safetensors(d / "model.safetensors", [(k, v.shape, v.dtype, lambda v=v: v) for k, v in tensors.items()])
        return d

    extra = write({**sd, "model.layers.0.mystery.weight": np.zeros(3, np.float32)}, "extra")
    with pytest.raises(ValueError, match="mystery"):
        models.from_pretrained(extra)
    missing = write({k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"}, "missing")
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        models.from_pretrained(missing)
