"""Benchmark the jitted train step of a small Qwen3 on the local devices.

Prints tokens/s, the split of one step (forward log-probs and loss, backward,
optimizer update, the rest), compile time, the step's FLOPs from XLA's cost
analysis next to an analytic model-FLOPs count, and model FLOPs utilization
where the device's peak is known (GPU, TPU). With --json the last line is
{"tokens_per_s": .., "flops_per_step": .., "mfu": ..}.

XLA's cost analysis counts the body of a while loop once, whatever its trip
count, and the step has three loops (micro-batches, decoder layers, log-prob
chunks). `flops_per_step` is therefore XLA's count for the same step lowered
with one micro-batch, one chunk and no layer rematerialization (model FLOPs, as
in PaLM's MFU), plus (layers − 1) times XLA's count for one decoder layer's
forward and backward. The raw figure of the step as run is printed too.

    python scripts/bench_train_step.py --json
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python scripts/bench_train_step.py --mesh 2,2,2

With --topology (needs libtpu, the `tpu` extra) the step is only compiled ahead
of time for that TPU slice, on this machine, and XLA's per-device memory is printed.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxrl import losses
from jaxrl import train_step as ts
from models import sharding as msh
from models.layers import AttnMask, rope_cos_sin
from models.qwen3 import Qwen3, Qwen3Block, Qwen3Config

# Dense bf16 peak FLOP/s per device, by `device_kind` prefix.
PEAK_FLOPS = {
    "NVIDIA H200": 989e12,
    "NVIDIA H100": 989e12,
    "NVIDIA A100": 312e12,
    "TPU v6 lite": 918e12,
    "TPU v5 lite": 197e12,
    "TPU v5": 459e12,
    "TPU v4": 275e12,
}


def peak_flops(device: jax.Device) -> float | None:
    """The device's dense bf16 peak, or None when unknown (CPUs)."""
    for prefix, flops in sorted(PEAK_FLOPS.items(), key=lambda kv: -len(kv[0])):
        if device.device_kind.startswith(prefix):
            return flops
    return None


def model_flops(cfg: Qwen3Config, batch: int, seq: int) -> float:
    """Training FLOPs (forward + backward = 3 × forward) of the matmuls, causal attention halved."""
    d, f, n_l = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    per_token = n_l * (2 * d * (2 * q + 2 * kv) + 2 * 3 * d * f) + 2 * d * cfg.vocab_size
    attention = n_l * 2 * 2 * q * seq / 2
    return 3.0 * batch * seq * (per_token + attention)


def xla_flops(lowered: jax.stages.Lowered) -> float:
    """FLOPs of a lowered computation by XLA's cost analysis (loop bodies counted once)."""
    cost = lowered.compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"])


def layer_flops(cfg: Qwen3Config, batch: int, seq: int, dtype, param_dtype) -> float:
    """XLA's FLOPs for one decoder layer's forward and backward (inputs and parameters)."""
    graphdef, params = nnx.split(Qwen3Block(cfg, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0)))
    positions = jnp.broadcast_to(jnp.arange(seq), (batch, seq))
    rope = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
    mask = AttnMask.full(jnp.ones((batch, seq), jnp.int32))

    def loss(p, x):
        return nnx.merge(graphdef, p)(x, rope, mask)[0].astype(jnp.float32).sum()

    x = jax.ShapeDtypeStruct((batch, seq, cfg.hidden_size), dtype)
    return xla_flops(jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x))


def timed(fn, *args, repeats: int) -> float:
    """Median seconds of `fn(*args)` (outputs blocked on), after one warm-up call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def make_batch(cfg: Qwen3Config, batch: int, seq: int, prompt: int, seed: int = 0) -> ts.Batch:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32)
    mask = np.zeros((batch, seq), np.float32)
    mask[:, prompt:] = 1
    old = np.where(mask > 0, -np.log(cfg.vocab_size), 0.0).astype(np.float32)
    adv = rng.normal(size=(batch, 1)).astype(np.float32)
    return ts.Batch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(old), jnp.asarray(adv))


def compile_for_topology(args, cfg, make_model, step_cfg, tx, mesh_shape) -> None:
    """Compile the step ahead of time for a TPU slice and print XLA's per-device memory."""
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(platform="tpu", topology_name=args.topology).devices
    mesh = msh.make_mesh(*mesh_shape, devices=devices)
    graphdef, params, rest = nnx.split(nnx.eval_shape(make_model), nnx.Param, ...)
    abstract_state = jax.eval_shape(lambda p: ts.TrainState(jnp.zeros((), jnp.int32), p, tx.init(p)), params)
    f32 = lambda: jax.ShapeDtypeStruct((args.batch, args.seq), jnp.float32)  # noqa: E731
    abstract_batch = ts.Batch(jax.ShapeDtypeStruct((args.batch, args.seq), jnp.int32), f32(), f32(),
                              jax.ShapeDtypeStruct((args.batch, 1), jnp.float32))
    step = ts.jit_train_step(graphdef, rest, tx, step_cfg, mesh, abstract_state, abstract_batch)
    t = time.perf_counter()
    memory = step.lower(abstract_state, abstract_batch).compile().memory_analysis()
    gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    rows = [
        ("target", f"{args.topology}: {len(devices)} x {devices[0].device_kind}, mesh {dict(mesh.shape)}"),
        ("model", f"Qwen3 d={cfg.hidden_size} L={cfg.num_hidden_layers} V={cfg.vocab_size} {args.dtype} "
                  f"(params {args.param_dtype}), {sum(x.size for x in jax.tree.leaves(params)) / 1e9:.2f}B params"),
        ("batch", f"{args.batch} x {args.seq} tokens, {args.micro_batches} micro-batch(es)"),
        ("compile (on this CPU)", f"{time.perf_counter() - t:.1f} s"),
        ("per device: arguments", gib(memory.argument_size_in_bytes)),
        ("per device: temporaries", gib(memory.temp_size_in_bytes)),
        ("per device: outputs (aliased)", f"{gib(memory.output_size_in_bytes)} "
                                         f"({gib(memory.alias_size_in_bytes)})"),
        ("FLOPs/step (analytic matmuls, 3x forward)", f"{model_flops(cfg, args.batch, args.seq):.3e}"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens per row (no loss)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 3 x hidden)")
    p.add_argument("--head-dim", type=int, default=None, help="default hidden / heads")
    p.add_argument("--tie", action="store_true", help="tie the LM head to the embedding")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="compute dtype")
    p.add_argument("--param-dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--logp-chunk", type=int, default=128)
    p.add_argument("--mesh", default="1,-1,1", help="data,fsdp,tensor sizes (one may be -1)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--topology", default=None, help="e.g. v5p:4x4x4: only compile for this TPU slice")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    args = p.parse_args()

    cfg = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=args.intermediate or 3 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, head_dim=args.head_dim or args.hidden // args.heads,
                      rope_theta=1e6, tie_word_embeddings=args.tie)
    dtype, param_dtype = jnp.dtype(args.dtype), jnp.dtype(args.param_dtype)
    step_cfg = ts.TrainStepConfig(micro_batches=args.micro_batches, loss=ts.LossConfig(logp_chunk=args.logp_chunk))
    tx = ts.make_optimizer(step_cfg.optimizer)
    make_model = lambda **kw: Qwen3(cfg, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0), **kw)  # noqa: E731
    mesh_shape = tuple(int(s) for s in args.mesh.split(","))
    if args.topology:
        compile_for_topology(args, cfg, make_model, step_cfg, tx, mesh_shape)
        return

    # mesh, state and batch
    mesh = msh.make_mesh(*mesh_shape)
    state, graphdef, rest = ts.init_train_state(make_model(), tx, mesh)
    batch = jax.device_put(make_batch(cfg, args.batch, args.seq, args.prompt),
                           ts.batch_shardings(make_batch(cfg, args.batch, args.seq, args.prompt), mesh))
    abstract = lambda x: jax.eval_shape(lambda y: y, x)  # noqa: E731

    # the step: compile ahead, cost analysis
    step = ts.jit_train_step(graphdef, rest, tx, step_cfg, mesh, abstract(state), abstract(batch))
    t = time.perf_counter()
    compiled = step.lower(abstract(state), abstract(batch)).compile()
    compile_s = time.perf_counter() - t
    memory = compiled.memory_analysis()
    raw_flops = xla_flops(step.lower(abstract(state), abstract(batch)))
    # Model FLOPs (PaLM's MFU): counted on the same step without layer rematerialization.
    no_remat = nnx.eval_shape(lambda: make_model(remat=False))
    count_graphdef, _, count_rest = nnx.split(no_remat, nnx.Param, ...)
    one_loop_cfg = ts.TrainStepConfig(loss=ts.LossConfig(logp_chunk=args.seq), optimizer=step_cfg.optimizer)
    one_loop = ts.jit_train_step(count_graphdef, count_rest, tx, one_loop_cfg, mesh, abstract(state),
                                 abstract(batch))
    flops = (xla_flops(one_loop.lower(abstract(state), abstract(batch)))
              + (cfg.num_hidden_layers - 1) * layer_flops(cfg, args.batch, args.seq, dtype, param_dtype))

    # the pieces, each jitted on the same shardings
    w = losses.loss_weights(batch.loss_mask_BxT, step_cfg.loss.agg_mode)
    tw = losses.loss_weights(batch.loss_mask_BxT, "token-mean")

    def loss_only(params, b):
        return ts.policy_loss(params, graphdef, rest, b, w, tw, step_cfg.loss)[0]

    def grads(params, b):
        return jax.grad(lambda pp: ts.policy_loss(pp, graphdef, rest, b, w, tw, step_cfg.loss)[0])(params)

    def update(params, opt_state, g):
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    with msh.use_mesh(mesh):
        fwd_s = timed(jax.jit(loss_only), state.params, batch, repeats=args.repeats)
        grad_fn = jax.jit(grads)
        fwd_bwd_s = timed(grad_fn, state.params, batch, repeats=args.repeats)
        g = grad_fn(state.params, batch)
        opt_s = timed(jax.jit(update), state.params, state.opt_state, g, repeats=args.repeats)
    state, _ = step(state, batch)  # warm-up (donates the state)
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)
    step_s = float(np.median(times))

    tokens = args.batch * args.seq
    analytic = model_flops(cfg, args.batch, args.seq)
    peak = peak_flops(jax.devices()[0])
    n_dev = mesh.devices.size
    mfu = None if peak is None else flops / step_s / (peak * n_dev)
    n_params = sum(x.size for x in jax.tree.leaves(state.params))
    rows = [
        ("device", f"{jax.devices()[0].device_kind} x{n_dev}, mesh {dict(mesh.shape)}"),
        ("model", f"Qwen3 d={cfg.hidden_size} L={cfg.num_hidden_layers} V={cfg.vocab_size} {args.dtype} "
                  f"(params {args.param_dtype}), {n_params / 1e6:.2f}M params"),
        ("batch", f"{args.batch} x {args.seq} tokens, {args.micro_batches} micro-batch(es)"),
        ("compile", f"{compile_s:.2f} s"),
        ("step", f"{step_s * 1e3:.1f} ms"),
        ("  forward (log-probs + loss)", f"{fwd_s * 1e3:.1f} ms"),
        ("  backward", f"{(fwd_bwd_s - fwd_s) * 1e3:.1f} ms"),
        ("  optimizer update", f"{opt_s * 1e3:.1f} ms"),
        ("  rest (step - above)", f"{(step_s - fwd_bwd_s - opt_s) * 1e3:.1f} ms"),
        ("tokens/s", f"{tokens / step_s:,.0f}"),
        ("FLOPs/step (XLA, loops counted in full)", f"{flops:.3e}"),
        ("FLOPs/step (XLA raw, loop bodies once)", f"{raw_flops:.3e}"),
        ("FLOPs/step (analytic matmuls, 3x forward)", f"{analytic:.3e}"),
        ("temp memory per device (XLA)", f"{memory.temp_size_in_bytes / 2**20:.1f} MiB" if memory else "n/a"),
        ("MFU (XLA FLOPs / dense bf16 peak)", "n/a (peak unknown)" if mfu is None else f"{100 * mfu:.1f}%"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if args.json:
        print(json.dumps({"tokens_per_s": tokens / step_s, "flops_per_step": flops, "mfu": mfu,
                          "xla_raw_flops_per_step": raw_flops, "analytic_flops_per_step": analytic,
                          "step_ms": step_s * 1e3}))


if __name__ == "__main__":
    main()
