"""HF safetensors checkpoints ↔ our models, for any registered family.

A *family* is a module (listed in `FAMILIES` by HF model_type) exposing:

- `Config` with `from_hf(dict)`, `to_hf() -> dict` and a `model_type`;
- `Model(cfg, *, dtype, param_dtype, rngs)`, an nnx.Module;
- `hf_rules(cfg) -> list[Rule]`: HF tensor names ↔ our parameters;
- `hf_ignore(cfg) -> tuple[str, ...]`: regexes of HF tensors to read past.

Loading never materializes the model on one device: safetensors files are
memory-mapped, and each device's shard of each parameter is read (only the
rows it needs when the layout allows) by `jax.make_array_from_callback`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from models import sharding

# HF model_type -> family module. Add one line per family.
FAMILIES: dict[str, str] = {
    "qwen3": "models.qwen3",
    "qwen3_5": "models.qwen3_5", "qwen3_5_text": "models.qwen3_5",
    "qwen3_moe": "models.qwen3_moe",
    "qwen3_5_moe_text": "models.qwen3_5_moe",
}

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"

_ST_DTYPES: dict[str, Any] = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class Rule:
    """One HF tensor (or one per layer) ↔ one of our parameters.

    Attributes:
      hf: the HF name; with `layers`, a template with `{i}` for the HF layer number.
      ours: our parameter path, dot-separated (`layers.mlp.up_proj.kernel`).
      layers: HF layer numbers this rule covers (None: not per layer).
      index: HF layer number → index into our parameter's leading (stacked)
        axes; default `(i,)`. Qwen3.5 maps layer i to `(i // 4, i % 4)`.
      transpose: HF stores the matrix transposed (torch Linear `[out, in]`).
      split: how our per-layer dims group into the HF dims (after transpose):
        `(1, 2)` means our `[D, N, H]` is HF's `[D, N*H]`. Default: one each.
      experts: with `layers`, also one HF tensor per expert `{j}` in
        `range(experts)` (MoE checkpoints store each expert separately); the
        expert number is our next leading index after the layer's.
    """

    hf: str
    ours: str
    layers: Sequence[int] | None = None
    index: Callable[[int], tuple[int, ...]] | None = None
    transpose: bool = False
    split: tuple[int, ...] | None = None
    experts: int | None = None

    def entries(self) -> Iterable[tuple[str, tuple[int, ...]]]:
        """`(hf_name, our_leading_index)` for every tensor this rule covers."""
        if self.layers is None:
            yield self.hf, ()
            return
        for i in self.layers:
            at = self.index(i) if self.index else (i,)
            if self.experts is None:
                yield self.hf.format(i=i), at
            else:
                for j in range(self.experts):
                    yield self.hf.format(i=i, j=j), (*at, j)

    def hf_shape(self, ours: Sequence[int]) -> tuple[int, ...]:
        """The HF tensor shape for our per-layer shape."""
        groups = self.split or (1,) * len(ours)
        if sum(groups) != len(ours):
            raise ValueError(f"{self.ours}: split {groups} does not cover shape {tuple(ours)}")
        dims, d = [], 0
        for g in groups:
            dims.append(math.prod(ours[d:d + g]))
            d += g
        return tuple(dims[::-1] if self.transpose else dims)

    def to_hf(self, x: np.ndarray) -> np.ndarray:
        """Our per-layer array → the HF tensor."""
        t = self.hf_shape(x.shape)
        y = x.reshape(t[::-1] if self.transpose else t)
        return np.ascontiguousarray(y.T if self.transpose else y)

    def read(self, src: np.ndarray, ours: Sequence[int], want: Sequence[slice]) -> np.ndarray:
        """The block `want` of our per-layer array (shape `ours`) from HF tensor `src`.

        Reads only the needed rows of `src` when the block is contiguous in HF's layout.
        """
        groups = self.split or (1,) * len(ours)
        expect = self.hf_shape(ours)
        if tuple(src.shape) != expect:
            raise ValueError(f"{self.ours}: HF tensor has shape {tuple(src.shape)}, expected {expect}")
        want = [slice(*s.indices(n)[:2]) for s, n in zip(want, ours)]
        hf_sl, shape, post, d = [], [], [], 0
        for g in groups:
            sizes, sl = ours[d:d + g], want[d:d + g]
            d += g
            inner = math.prod(sizes[1:])
            if all(s.start == 0 and s.stop == n for s, n in zip(sl[1:], sizes[1:])):
                hf_sl.append(slice(sl[0].start * inner, sl[0].stop * inner))
                shape += [sl[0].stop - sl[0].start, *sizes[1:]]
                post += [slice(None)] * g
            else:
                hf_sl.append(slice(None))
                shape += list(sizes)
                post += sl
        block = np.asarray(src[tuple(hf_sl[::-1] if self.transpose else hf_sl)])
        if self.transpose:
            block = block.T
        return block.reshape(shape)[tuple(post)]


# ---------------------------------------------------------------------------
# safetensors, memory-mapped


class SafetensorsDir:
    """Read-only view of the tensors in one `.safetensors` file or an HF directory of them."""

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        if path.is_file():
            files = [path]
        elif (path / INDEX_NAME).exists():
            index = json.loads((path / INDEX_NAME).read_text())
            files = sorted({path / f for f in index["weight_map"].values()})
        else:
            files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no safetensors in {path}")
        self._where: dict[str, tuple[Path, dict]] = {}
        self._mmaps: dict[Path, np.memmap] = {}
        for f in files:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
            header.pop("__metadata__", None)
            for name, info in header.items():
                self._where[name] = (f, {**info, "base": 8 + n})

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __getitem__(self, name: str) -> np.ndarray:
        """A lazily read (memory-mapped) array; slice it to read only part."""
        f, info = self._where[name]
        if f not in self._mmaps:
            self._mmaps[f] = np.memmap(f, dtype=np.uint8, mode="r")
        start, end = info["data_offsets"]
        raw = self._mmaps[f][info["base"] + start: info["base"] + end]
        return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def write_safetensors(path: str | os.PathLike, tensors: Sequence[tuple[str, tuple[int, ...], np.dtype,
                                                                         Callable[[], np.ndarray]]]) -> None:
    """Write one safetensors file, producing each tensor only when it is written.

    `tensors` lists `(name, shape, dtype, produce)`; the header goes first,
    then each `produce()` result, so at most one tensor is in memory at a time.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, dtype, _ in tensors:
        size = math.prod(shape) * np.dtype(dtype).itemsize
        header[name] = {"dtype": _ST_NAMES[np.dtype(dtype)], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as fh:
        fh.write(len(blob).to_bytes(8, "little"))
        fh.write(blob)
        for name, shape, dtype, produce in tensors:
            arr = np.ascontiguousarray(produce(), dtype=dtype)
            if arr.shape != tuple(shape):
                raise ValueError(f"{name}: produced shape {arr.shape}, declared {tuple(shape)}")
            fh.write(arr.tobytes())


# ---------------------------------------------------------------------------
# families and configs


def family(model_type: str) -> ModuleType:
    """The family module for an HF model_type."""
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r}; known: {sorted(FAMILIES)}")
    return importlib.import_module(FAMILIES[model_type])


def load_config(src: str | os.PathLike | dict) -> Any:
    """The family config for an HF config.json (a directory, the file, or its parsed dict)."""
    if not isinstance(src, dict):
        p = Path(src)
        src = json.loads((p / CONFIG_NAME if p.is_dir() else p).read_text())
    if "model_type" not in src:
        raise KeyError("config.json lacks 'model_type'")
    return family(src["model_type"]).Config.from_hf(src)


def model_class(cfg: Any) -> type:
    """The model class for a family config."""
    return family(cfg.model_type).Model


def _flat_params(state: nnx.State) -> dict[str, Any]:
    return {".".join(map(str, path)): v for path, v in nnx.to_flat_state(state)}


def _rule_table(cfg: Any, params: dict[str, Any]) -> dict[str, Rule]:
    rules = family(cfg.model_type).hf_rules(cfg)
    table: dict[str, Rule] = {}
    for r in rules:
        if r.ours in table:
            raise ValueError(f"two rules for {r.ours}")
        if r.ours not in params:
            raise KeyError(f"rule for unknown parameter {r.ours}")
        table[r.ours] = r
    missing = sorted(set(params) - set(table))
    if missing:
        raise KeyError(f"no checkpoint rule for parameters {missing}")
    return table


# ---------------------------------------------------------------------------
# loading


def from_pretrained(path: str | os.PathLike, dtype=jnp.float32, *, param_dtype=None, mesh: Mesh | None = None,
                    rules: Sequence = sharding.RULES, **model_kwargs) -> nnx.Module:
    """Load an HF safetensors directory (single file or sharded with an index).

    Args:
      path: directory holding config.json and the safetensors.
      dtype: compute dtype; also the parameter dtype unless `param_dtype` is given.
      mesh: place parameters on this mesh by the logical `rules`
        (default: one device).
      model_kwargs: passed to the family's model constructor (e.g. `remat=True`).
    """
    cfg = load_config(path)
    fam = family(cfg.model_type)
    param_dtype = param_dtype or dtype
    abstract = nnx.eval_shape(lambda: fam.Model(cfg, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0),
                                                **model_kwargs))
    graphdef, abs_state = nnx.split(abstract)
    if mesh is None:
        mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    shardings = _flat_params(sharding.state_shardings(abs_state, mesh, rules))
    params = _flat_params(abs_state)
    table = _rule_table(cfg, params)
    src = SafetensorsDir(path)

    used: set[str] = set()
    values: dict[str, jax.Array] = {}
    for name, var in params.items():
        rule = table[name]
        entries = list(rule.entries())
        for hf, _ in entries:
            if hf not in src:
                raise KeyError(f"checkpoint lacks {hf} (for {name})")
            used.add(hf)
        lead = len(entries[0][1])
        shape, np_dtype = tuple(var.shape), np.dtype(var.dtype)

        def read(index: tuple[slice, ...], rule=rule, entries=entries, lead=lead, shape=shape, np_dtype=np_dtype):
            index = tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))
            out_shape = tuple(s.stop - s.start for s in index)
            out = np.empty(out_shape, np_dtype)
            filled = 0
            for hf, at in entries:
                if all(s.start <= a < s.stop for a, s in zip(at, index[:lead])):
                    pos = tuple(a - s.start for a, s in zip(at, index[:lead]))
                    out[pos] = rule.read(src[hf], shape[lead:], index[lead:]).astype(np_dtype)
                    filled += 1
            if filled != math.prod(out_shape[:lead]):
                raise ValueError(f"{rule.ours}: checkpoint covers {filled} of {math.prod(out_shape[:lead])} layers")
            return out

        values[name] = jax.make_array_from_callback(shape, shardings[name].get_value(), read)

    ignore = [re.compile(p) for p in fam.hf_ignore(cfg)]
    unknown = [k for k in src.keys() if k not in used and not any(p.fullmatch(k) for p in ignore)]
    if unknown:
        raise ValueError(f"checkpoint tensors with no rule: {sorted(unknown)[:20]} ({len(unknown)} in all)")

    for path_, var in nnx.to_flat_state(abs_state):
        var.set_value(values[".".join(map(str, path_))])
    return nnx.merge(graphdef, abs_state)


# ---------------------------------------------------------------------------
# saving


def _to_host(x: jax.Array) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def save_pretrained(model: nnx.Module, path: str | os.PathLike, *, dtype=None,
                    max_shard_bytes: int = 5 * 1024 ** 3) -> None:
    """Write config.json and safetensors (sharded with an index past `max_shard_bytes`).

    The directory loads with transformers' `from_pretrained` (and so serves
    from SGLang or vLLM) and with ours. `dtype` (default: the parameters')
    sets the stored dtype. Parameters are gathered to the host one at a time;
    on several hosts every process must call this, and process 0 writes.
    """
    cfg = model.config
    params = _flat_params(nnx.state(model, nnx.Param))
    table = _rule_table(cfg, params)
    tensors = []
    cache: dict[str, np.ndarray] = {}

    def produce(name: str, at: tuple[int, ...], rule: Rule) -> Callable[[], np.ndarray]:
        def f():
            if name not in cache:
                cache.clear()
                cache[name] = _to_host(params[name][...])
            return rule.to_hf(cache[name][at])
        return f

    for name, rule in table.items():
        var = params[name]
        out_dtype = np.dtype(dtype or var.dtype)
        for hf, at in rule.entries():
            shape = rule.hf_shape(tuple(var.shape)[len(at):])
            tensors.append((hf, shape, out_dtype, produce(name, at, rule)))

    path = Path(path)
    if jax.process_index() != 0:
        for _, _, _, f in tensors:  # take part in any cross-host gathers
            f()
        return
    path.mkdir(parents=True, exist_ok=True)
    files: list[list] = [[]]
    size = 0
    for t in tensors:
        n = math.prod(t[1]) * t[2].itemsize
        if files[-1] and size + n > max_shard_bytes:
            files.append([])
            size = 0
        files[-1].append(t)
        size += n
    if len(files) == 1:
        write_safetensors(path / "model.safetensors", files[0])
    else:
        weight_map, total = {}, 0
        for k, group in enumerate(files):
            fname = f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
            write_safetensors(path / fname, group)
            for t in group:
                weight_map[t[0]] = fname
                total += math.prod(t[1]) * t[2].itemsize
        (path / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                  indent=2))
    stored = np.dtype(dtype or next(iter(params.values())).dtype)
    hf_cfg = {**cfg.to_hf(), "dtype": "bfloat16" if stored == ml_dtypes.bfloat16 else stored.name}
    (path / CONFIG_NAME).write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")
