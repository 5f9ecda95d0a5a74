"""Check, without the hardware, that a preset's training and sampling fit its chips.

    precisecoder plan PRESET [--set key=value ...] [--json] [--step-time SECONDS]

TPU presets: the real train step (`jaxrl.train_step.jit_train_step`) and the
sampler's prefill and decode steps (`models.decode.Decoder`) are compiled ahead of
time for the preset's TPU topology with the libtpu of `jax[tpu]` (no TPU needed),
and XLA's memory analysis gives the bytes per chip. GPU presets cannot be compiled
here (no CUDA backend): their bytes are estimated from `jax.eval_shape` shapes and
the sharding rules, plus an analytic count of the activations, and the report says so.

Memory per chip is checked in the two phases of an RL step:
  train:   parameters + optimizer state + batch (XLA arguments) + temporaries
           (activations kept for the backward pass and scratch) + non-aliased outputs;
  rollout: optimizer state (still resident) + the larger of prefill and decode
           (parameters, the KV cache at the rollout batch, temporaries).
The preset fits when both are within the chip's HBM; the exit code is 1 when not
(2 for a bad preset or argument).

A row is `hardware.prompt_tokens + rollout.max_tokens` tokens; with `rollout.agent` set it is
an episode of `rollout.agent.max_context` tokens (the update's row length, `jaxrl.agent.train`),
so the batch, the activations and the KV cache are sized by it, and every episode is its own
prompt at the rollout (no fan-out to G rows), the longest `max_context - max_tokens` tokens
(the last turn's context).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import threading
import time
from typing import Any

from reward.cli_args import seconds

GIB = 2**30
HEARTBEAT_S = 60.0  # seconds between "still compiling" lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jaxrl.config import config_names

    parser.add_argument("preset", help="a preset name (tpu_configs/NAME.yaml) or a YAML path")
    parser.epilog = f"presets and named configs: {', '.join(config_names())}"
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable), e.g. --set run.micro_batches=4")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--step-time", type=seconds, default=None, metavar="SECONDS",
                        help="a train-step time to turn into MFU (default: print the time 40%% MFU means)")


@dataclasses.dataclass
class Phase:
    """Per-chip bytes of one compiled (or estimated) computation."""

    arguments: int
    temporaries: int
    outputs_not_aliased: int

    @property
    def total(self) -> int:
        return self.arguments + self.temporaries + self.outputs_not_aliased


def _tpu_env() -> None:
    # libtpu looks for a TPU on import and warns loudly when there is none.
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # Compiling needs no chip: let several plans (or tests) load libtpu at once.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def tpu_devices(topology: str) -> list[Any]:
    """The devices of a TPU slice, for compilation only; a clear error when libtpu is missing."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        raise PlanError("compiling for a TPU topology needs libtpu: pip install -e '.[tpu]' "
                        "(or pip install 'jax[tpu]')") from None
    from jax.experimental import topologies

    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
    except Exception as e:  # libtpu's own error types
        raise PlanError(f"hardware.topology {topology!r}: {str(e).splitlines()[0]}") from None


class PlanError(Exception):
    """A preset that cannot be planned (bad value, missing package); the message says why."""


class OutOfMemory(Exception):
    """XLA refused to compile: the computation needs more than the chip's HBM."""

    def __init__(self, needed: int, message: str):
        super().__init__(message)
        self.needed = needed


def _compile(lowered):
    """`lowered.compile()`, turning XLA's out-of-HBM refusal into `OutOfMemory` with the bytes it asked for."""
    import re

    import jax

    try:
        return lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text:
            raise
        m = re.search(r"required for [^(]*\(([\d.]+)([KMGT])\)", text)
        needed = int(float(m.group(1)) * 1024 ** "KMGT".index(m.group(2)) * 1024) if m else 0
        raise OutOfMemory(needed, text.split("\n")[0]) from None


def _phase(lowered, name: str, timings: dict[str, float]) -> Phase:
    """Per-chip bytes of a lowered computation; over HBM, the bytes XLA asked for (as temporaries).

    The compile's seconds go to `timings[name]`; it is announced on stderr, and again every
    minute it runs (a TPU train step takes 5 to 20 minutes on a CPU).
    """
    start = time.perf_counter()
    stop = threading.Event()

    def heartbeat():
        while not stop.wait(HEARTBEAT_S):
            print(f"plan: still compiling {name} ({(time.perf_counter() - start) / 60:.0f} min)",
                  file=sys.stderr, flush=True)

    print(f"plan: compiling {name} ...", file=sys.stderr, flush=True)
    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        compiled = _compile(lowered)
    except OutOfMemory as e:
        return Phase(0, e.needed, 0)
    finally:
        stop.set()
        beat.join()
        timings[name] = time.perf_counter() - start
        print(f"plan: {name} compiled in {timings[name]:.0f} s", file=sys.stderr, flush=True)
    m = compiled.memory_analysis()
    return Phase(int(m.argument_size_in_bytes), int(m.temp_size_in_bytes),
                 int(m.output_size_in_bytes - m.alias_size_in_bytes))


def _sharded_bytes(tree) -> int:
    """Bytes per device of abstract arrays carrying shardings (the most loaded device)."""
    import jax
    import numpy as np

    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


def _with_shardings(tree, shardings):
    import jax

    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _mlp_flops(arch, layer: int) -> float:
    """Forward FLOPs per token of layer `layer`'s feed-forward: only the experts a token is routed to count."""
    d = arch.hidden_size
    if not hasattr(arch, "num_experts"):
        return 2 * 3 * d * arch.intermediate_size
    if hasattr(arch, "is_sparse") and not arch.is_sparse(layer):
        return 2 * 3 * d * arch.intermediate_size
    routed = 2 * d * arch.num_experts + arch.num_experts_per_tok * 2 * 3 * d * arch.moe_intermediate_size
    shared = getattr(arch, "shared_expert_intermediate_size", 0)
    return routed + (2 * 3 * d * shared + 2 * d if shared else 0)


def active_params(arch, total: int) -> int:
    """Parameters a token uses: `total` less the routed experts it is not sent to (equal to `total` when dense)."""
    if not hasattr(arch, "num_experts"):
        return total
    layers = range(arch.num_hidden_layers)
    sparse = sum(arch.is_sparse(i) for i in layers) if hasattr(arch, "is_sparse") else len(layers)
    idle = arch.num_experts - arch.num_experts_per_tok
    return total - sparse * idle * 3 * arch.hidden_size * arch.moe_intermediate_size


def model_flops_per_token(arch, seq: int) -> float:
    """Forward FLOPs per token of the matmuls (2 per multiply-add), causal attention over `seq`.

    Mixtures of experts count the router and the k routed experts (and a shared
    expert), not every expert: FLOPs and MFU use active parameters.
    """
    d, v = arch.hidden_size, arch.vocab_size
    h, n, k = arch.head_dim, arch.num_attention_heads, arch.num_key_value_heads
    gate = 2 if getattr(arch, "layer_types", None) else 1  # Qwen3.5's q_proj also emits the output gate
    attention = 2 * d * (n * h * gate + 2 * k * h) + 2 * n * h * d + 2 * 2 * n * h * seq / 2
    types = getattr(arch, "layer_types", None) or ("full_attention",) * arch.num_hidden_layers
    total = 0.0
    for i, t in enumerate(types):
        mlp = _mlp_flops(arch, i)
        if t == "full_attention":
            total += attention + mlp
        else:  # Gated DeltaNet: projections, plus ~3 Dk×Dv state products per token and head
            hv, dk, dv = arch.linear_num_value_heads, arch.linear_key_head_dim, arch.linear_value_head_dim
            proj = 2 * d * (arch.conv_dim + 2 * hv * dv + 2 * hv) + 2 * hv * dv * d
            total += proj + 2 * 3 * hv * dk * dv + mlp
    return total + 2 * d * v


def _architecture(cfg):
    from models.checkpoint import load_config as load_hf

    if cfg.model.architecture is None:
        return load_hf(cfg.model.checkpoint)
    default = "qwen3" if cfg.model.family == "qwen3" else "qwen3_5_text"
    return load_hf({"model_type": default, **cfg.model.architecture})


def _model_ctor(cfg, arch):
    import jax.numpy as jnp
    from flax import nnx

    from models.checkpoint import model_class

    cls = model_class(arch)
    m = cfg.model
    return lambda: cls(arch, dtype=jnp.dtype(m.dtype), param_dtype=jnp.dtype(m.param_dtype), rngs=nnx.Rngs(0),
                       remat=m.remat, attention_impl=m.attention)


def plan(cfg, *, step_time: float | None = None) -> dict[str, Any]:
    """The plan of a loaded `Config` as a dict (what `--json` prints)."""
    hw = cfg.hardware
    if hw is None:
        raise PlanError("the preset has no hardware section: plan needs the target chips "
                        "(hardware.platform, topology, chips, hbm_gib)")
    if hw.platform == "tpu":
        _tpu_env()
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxrl import train_step as ts
    from models import sharding as msh
    from models.decode import Decoder

    arch = _architecture(cfg)
    ctor = _model_ctor(cfg, arch)
    rules = msh.rules_from_mapping(dict(cfg.mesh.rules))
    rows = cfg.data.tasks_per_step * cfg.rollout.group_size
    seq, prompt_tokens = row_tokens(cfg)
    micro = cfg.run.micro_batches
    if rows % micro:
        raise PlanError(f"run.micro_batches={micro} does not divide the {rows} rows of a step "
                        f"(data.tasks_per_step × rollout.group_size)")
    rollout_rows = int(cfg.rollout.options.get("max_rows", rows))

    compiled_here = hw.platform == "tpu"
    if compiled_here:
        devices = tpu_devices(hw.topology)
        if len(devices) != hw.chips:
            raise PlanError(f"hardware.topology {hw.topology} has {len(devices)} chips, hardware.chips says {hw.chips}")
    sizes = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.expert, cfg.mesh.tensor)  # msh.MESH_AXES order
    known = math.prod(s for s in sizes if s != -1)
    sizes = tuple(hw.chips // known if s == -1 else s for s in sizes)
    if math.prod(sizes) != hw.chips:
        raise PlanError(f"mesh data×fsdp×expert×tensor = {sizes} does not cover hardware.chips = {hw.chips}")
    batch_shards = math.prod(s for name, s in zip(msh.MESH_AXES, sizes) if name in dict(rules)["batch"])
    for what, n in (("rows per micro-batch", rows // micro), ("rollout.options.max_rows", rollout_rows)):
        if n % batch_shards:
            raise PlanError(f"{what} = {n} is not a multiple of the {batch_shards} batch shards of the mesh")
    prompts = rollout_rows if cfg.rollout.agent else -(-rollout_rows // cfg.rollout.group_size)
    prefill_rows = -(-prompts // batch_shards) * batch_shards  # padded to the batch shards, as the sampler does

    abstract_model = nnx.eval_shape(ctor)
    graphdef, params, rest = nnx.split(abstract_model, nnx.Param, ...)
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    n_active = active_params(arch, n_params)
    step_cfg = ts.TrainStepConfig(loss=cfg.loss, optimizer=cfg.optimizer, micro_batches=micro)
    tx = ts.make_optimizer(cfg.optimizer)
    abstract_state = jax.eval_shape(lambda p: ts.TrainState(jnp.zeros((), jnp.int32), p, tx.init(p)), params)
    f32 = jax.ShapeDtypeStruct((rows, seq), jnp.float32)
    abstract_batch = ts.Batch(jax.ShapeDtypeStruct((rows, seq), jnp.int32), f32, f32,
                              jax.ShapeDtypeStruct((rows, 1), jnp.float32))
    flops_per_token = model_flops_per_token(arch, seq)
    train_flops = 3.0 * rows * seq * flops_per_token
    peak = hw.chips * hw.peak_tflops * 1e12
    timings: dict[str, float] = {}

    if compiled_here:
        mesh = msh.make_mesh(**dict(zip(msh.MESH_AXES, sizes)), devices=devices)
        state_sh = ts.state_shardings(abstract_state, mesh, rules)
        step = ts.jit_train_step(graphdef, rest, tx, step_cfg, mesh, abstract_state, abstract_batch, rules)
        train = _phase(step.lower(abstract_state, abstract_batch), "train_step", timings)
        param_bytes = _sharded_bytes(_with_shardings(abstract_state.params, state_sh.params))
        opt_bytes = _sharded_bytes(_with_shardings(abstract_state.opt_state, state_sh.opt_state))

        decoder = Decoder(abstract_model)
        dstate = _with_shardings(decoder.state, msh.state_shardings(decoder.state, mesh, rules))
        with msh.use_mesh(mesh, rules):
            cache_fn = jax.jit(abstract_model.init_cache, static_argnums=(0, 1))
            cache_shapes = jax.eval_shape(lambda: abstract_model.init_cache(rollout_rows, seq))
            cache_sh = cache_fn.lower(rollout_rows, seq).compile().output_shardings
            cache = _with_shardings(cache_shapes, cache_sh)
            row_sh = NamedSharding(mesh, msh.logical_to_spec(("batch", None), rules, (rollout_rows, 1), mesh))
            ids = jax.ShapeDtypeStruct((rollout_rows,), jnp.int32,
                                       sharding=NamedSharding(mesh, PartitionSpec(row_sh.spec[0])))
            # Each prompt is prefilled once and its cache fanned out to its G rows (an episode's: to 1).
            prompt = jax.ShapeDtypeStruct((prefill_rows, prompt_tokens), jnp.int32, sharding=row_sh)
            prefill_cache = _with_shardings(jax.eval_shape(lambda: abstract_model.init_cache(prefill_rows, seq)),
                                            cache_fn.lower(prefill_rows, seq).compile().output_shardings)
            prefill = _phase(decoder.prefill.lower(dstate, prefill_cache, prompt, prompt), "prefill", timings)
            decode = _phase(decoder.step.lower(dstate, cache, ids), "decode_step", timings)
        cache_bytes = _sharded_bytes(cache)
        method = f"compiled ahead of time for {hw.topology} ({len(devices)} x {devices[0].device_kind})"
    else:
        train, prefill, decode, param_bytes, opt_bytes, cache_bytes = _estimate(
            cfg, arch, abstract_model, rows, seq, prompt_tokens, micro, rollout_rows, prefill_rows, sizes, rules)
        method = ("estimated from jax.eval_shape shapes, the sharding rules and an analytic activation count "
                  "(no CUDA backend here to compile for)")
        if cfg.rollout.engine == "sglang" and hw.rollout_gpus:
            method += f"; rollout figures are per SGLang GPU ({hw.rollout_gpus} GPUs)"

    rollout_phase = max(prefill.total, decode.total) + (opt_bytes if compiled_here or not hw.rollout_gpus else 0)
    hbm = int(hw.hbm_gib * GIB)
    phases = {"train": train.total, "rollout": rollout_phase}
    fits = all(v <= hbm for v in phases.values())
    out: dict[str, Any] = {
        "preset": cfg.name,
        "method": method,
        "hardware": {"accelerator": hw.accelerator, "topology": hw.topology, "chips": hw.chips, "hosts": hw.hosts,
                     "hbm_bytes": hbm},
        "mesh": dict(zip(msh.MESH_AXES, sizes)),
        "model": {"family": cfg.model.family, "params": n_params, "active_params": n_active, "dtype": cfg.model.dtype,
                  "param_dtype": cfg.model.param_dtype, "attention": cfg.model.attention, "remat": cfg.model.remat},
        "batch": {"rows": rows, "seq": seq, "micro_batches": micro, "rollout_rows": rollout_rows,
                  "prefill_rows": prefill_rows, "prompt_tokens": prompt_tokens,
                  "agent": dataclasses.asdict(cfg.rollout.agent) if cfg.rollout.agent else None},
        "per_chip": {
            "params": param_bytes, "opt_state": opt_bytes,
            "train_arguments": train.arguments, "train_temporaries": train.temporaries,
            "train_outputs_not_aliased": train.outputs_not_aliased, "train_total": train.total,
            "kv_cache": cache_bytes, "prefill_total": prefill.total, "prefill_temporaries": prefill.temporaries,
            "decode_total": decode.total, "decode_temporaries": decode.temporaries, "rollout_total": rollout_phase,
        },
        "compile_seconds": timings,
        "train_step_flops": train_flops,
        "rollout_tokens": cfg.rollout.max_tokens,
        "fits": fits,
    }
    if step_time is not None:
        out["mfu"] = {"step_time_s": step_time, "mfu": train_flops / (step_time * peak)}
    else:
        out["mfu"] = {"step_time_s_at_40pct": train_flops / (0.4 * peak)}
    if not fits:
        out["does_not_fit"] = _explain(out, hbm)
    return out


def row_tokens(cfg) -> tuple[int, int]:
    """(tokens of a row, tokens of the longest prompt the sampler prefills) of a config's step."""
    agent = cfg.rollout.agent
    if agent is None:
        return cfg.hardware.prompt_tokens + cfg.rollout.max_tokens, cfg.hardware.prompt_tokens
    return agent.max_context, agent.max_context - cfg.rollout.max_tokens


def _estimate(cfg, arch, abstract_model, rows, seq, prompt_tokens, micro, rollout_rows, prefill_rows, sizes,
              rules):
    """Per-chip bytes without compiling: exact parameter, optimizer and cache shards; analytic activations."""
    import jax
    import numpy as np
    from flax import nnx

    from models import sharding as msh

    mesh = jax.sharding.AbstractMesh(sizes, msh.MESH_AXES)
    param_bytes = msh.bytes_per_device(nnx.state(abstract_model, nnx.Param), mesh, rules)
    opt_bytes = 2 * param_bytes  # Adam's two moments, stored like the parameters
    batch_shards = math.prod(s for name, s in zip(msh.MESH_AXES, sizes) if name in dict(rules)["batch"])
    r = rows // micro // batch_shards  # rows per chip per micro-batch
    act = 2 if cfg.model.dtype == "bfloat16" else 4
    d, layers = arch.hidden_size, arch.num_hidden_layers
    saved = layers * r * seq * d * act if cfg.model.remat else layers * r * seq * (8 * d + 3 * arch.intermediate_size) * act
    widest = max(arch.intermediate_size, arch.num_attention_heads * arch.head_dim * 2)
    layer_work = r * seq * (6 * d + 4 * widest) * act  # one layer recomputed in the backward pass
    if hasattr(arch, "num_experts"):  # the sorted (token, expert) rows and their expert activations
        layer_work += r * seq * arch.num_experts_per_tok * (2 * d + 3 * arch.moe_intermediate_size) * act
    if cfg.model.attention == "xla":
        layer_work += 2 * r * arch.num_attention_heads * seq * seq * 4  # float32 scores and probabilities
    logits = 2 * r * cfg.loss.logp_chunk * arch.vocab_size * 4
    grads = param_bytes * 4 // max(1, np.dtype(cfg.model.param_dtype).itemsize)  # float32 accumulation
    batch_bytes = 4 * rows * seq * 4 // batch_shards
    train = Phase(param_bytes + opt_bytes + batch_bytes, saved + layer_work + logits + grads, 0)
    cache_shapes = jax.eval_shape(lambda: abstract_model.init_cache(rollout_rows, seq))
    cache_bytes = sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(cache_shapes))
    hw = cfg.hardware
    if cfg.rollout.engine == "sglang" and hw.rollout_gpus:
        # SGLang GPUs: bfloat16 weights split over a server's tensor-parallel GPUs, the rows spread over servers.
        tp = hw.rollout_tensor_parallel
        rollout_param_bytes = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract_model, nnx.Param)))
        rollout_param_bytes = rollout_param_bytes * 2 // tp
        batch_shards = hw.rollout_gpus  # rows over servers, heads over a server's GPUs
    else:
        rollout_param_bytes = param_bytes
    cache_bytes //= batch_shards
    rollout_rows_chip = -(-rollout_rows // batch_shards)
    prompts_chip = -(-prefill_rows // batch_shards)
    # prefill writes into the cache, so it attends with the plain path: float32 [P, S] scores
    prefill_tmp = prompts_chip * prompt_tokens * (6 * d + 4 * widest) * act
    prefill_tmp += 2 * prompts_chip * arch.num_attention_heads * prompt_tokens * seq * 4
    prefill = Phase(rollout_param_bytes + cache_bytes * prefill_rows // rollout_rows, prefill_tmp, 0)
    decode = Phase(rollout_param_bytes + cache_bytes, rollout_rows_chip * arch.vocab_size * 4 * 2, 0)
    return train, prefill, decode, param_bytes, opt_bytes, cache_bytes


def _explain(out: dict[str, Any], hbm: int) -> str:
    """One line naming each phase over HBM and its largest parts."""
    pc = out["per_chip"]
    lines = []
    if pc["train_total"] > hbm:
        parts = {"parameters": pc["params"], "optimizer state": pc["opt_state"],
                 "activations and temporaries": pc["train_temporaries"]}
        big = max(parts, key=parts.get)
        lines.append(f"the train step needs {_gib(pc['train_total'])} per chip > {_gib(hbm)} HBM "
                     f"(largest: {big} {_gib(parts[big])}; at {out['batch']['rows'] // out['batch']['micro_batches']} "
                     f"rows x {out['batch']['seq']} tokens per micro-batch)")
    if pc["rollout_total"] > hbm:
        parts = {"KV cache": pc["kv_cache"], "parameters": pc["params"], "optimizer state": pc["opt_state"],
                 "prefill temporaries": pc["prefill_temporaries"], "decode temporaries": pc["decode_temporaries"]}
        big = max(parts, key=parts.get)
        lines.append(f"the rollout needs {_gib(pc['rollout_total'])} per chip > {_gib(hbm)} HBM "
                     f"(largest: {big} {_gib(parts[big])}; at {out['batch']['rollout_rows']} rows x "
                     f"{out['batch']['seq']} slots)")
    return "; ".join(lines)


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _print_table(out: dict[str, Any]) -> None:
    pc, hw, b, m = out["per_chip"], out["hardware"], out["batch"], out["model"]
    hbm = hw["hbm_bytes"]
    rows = [
        ("preset", out["preset"]),
        ("target", f"{hw['chips']} x {hw['accelerator']} ({hw['topology'] or 'GPU node'}), {hw['hosts']} host(s), "
                   f"mesh {out['mesh']}"),
        ("method", out["method"]),
        ("model", f"{m['family']} {m['params'] / 1e9:.2f}B params ({m['active_params'] / 1e9:.2f}B active), "
                  f"compute {m['dtype']}, params {m['param_dtype']}, "
                  f"attention {m['attention']}, remat {m['remat']}"),
        ("rows", f"agent episodes of rollout.agent.max_context = {b['seq']} tokens ({b['agent']['turns']} turns of "
                 f"{out['rollout_tokens']}), not prompt + completion" if b["agent"] else
                 f"hardware.prompt_tokens + rollout.max_tokens = {b['prompt_tokens']} + {out['rollout_tokens']} "
                 "tokens"),
        ("train batch", f"{b['rows']} rows x {b['seq']} tokens, {b['micro_batches']} micro-batch(es)"),
        ("rollout batch", f"{b['rollout_rows']} rows x {b['seq']} slots (prefill: {b['prefill_rows']} prompts of "
                          f"{b['prompt_tokens']} tokens, "
                          f"{'one per episode' if b['agent'] else 'fanned out to G rows'})"),
        ("per chip: parameters", _gib(pc["params"])),
        ("per chip: optimizer state", _gib(pc["opt_state"])),
        ("per chip: train arguments (params, opt, batch)", _gib(pc["train_arguments"])),
        ("per chip: train activations + temporaries", _gib(pc["train_temporaries"])),
        ("per chip: train total", f"{_gib(pc['train_total'])} of {_gib(hbm)} "
                                  f"({100 * pc['train_total'] / hbm:.0f}%)"),
        ("per chip: KV cache + DeltaNet state", _gib(pc["kv_cache"])),
        ("per chip: prefill total (temporaries)", f"{_gib(pc['prefill_total'])} ({_gib(pc['prefill_temporaries'])})"),
        ("per chip: decode step total (temporaries)", f"{_gib(pc['decode_total'])} "
                                                      f"({_gib(pc['decode_temporaries'])})"),
        ("per chip: rollout total (+ optimizer state)", f"{_gib(pc['rollout_total'])} of {_gib(hbm)} "
                                                        f"({100 * pc['rollout_total'] / hbm:.0f}%)"),
        ("train step FLOPs (model, 3x forward)", f"{out['train_step_flops']:.3e}"),
    ]
    mfu = out["mfu"]
    if "mfu" in mfu:
        rows.append(("MFU at the given step time", f"{100 * mfu['mfu']:.1f}% at {mfu['step_time_s']:.1f} s"))
    else:
        rows.append(("step time at 40% MFU", f"{mfu['step_time_s_at_40pct']:.1f} s"))
    for k, v in out["compile_seconds"].items():
        rows.append((f"compile {k} (this CPU)", f"{v:.1f} s"))
    rows.append(("fits", "yes" if out["fits"] else f"NO: {out['does_not_fit']}"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(args: argparse.Namespace) -> int:
    from jaxrl.config import ConfigError, load_config

    try:
        cfg = load_config(args.preset, overrides=args.overrides)
        out = plan(cfg, step_time=args.step_time)
    except (ConfigError, PlanError) as e:
        print(f"precisecoder plan: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
    else:
        _print_table(out)
    if not out["fits"]:
        print(f"precisecoder plan: {out['preset']} does not fit: {out['does_not_fit']}", file=sys.stderr)
        return 1
    return 0
