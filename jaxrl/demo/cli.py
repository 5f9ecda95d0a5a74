"""precisecoder demo: SFT a tiny Qwen3 on a micro debugging domain, then GRPO vs PreciseCoder from that base.

Writes DIR/report.md (pass, precision, recall, lines, no-op, damage for the base and
each method, mean ± std over RL seeds of one base, T = 0.6 sampling as the main table,
T = 1 and greedy beside it, PreciseCoder − GRPO per seed), DIR/results.json and
DIR/curves.png. See docs/demo.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from reward.cli_args import user_path
from jaxrl.demo.baselines import BASELINES
from jaxrl.demo.run import METHODS, OPTIONAL_METHODS, DemoConfig, check_resume

# RL and SFT steps of `--smoke` unless given.
SMOKE_STEPS, SMOKE_SFT_STEPS = 2, 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DemoConfig()
    parser.add_argument("--out", type=user_path, default="runs/demo", help="output directory (default: runs/demo)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="RL seeds 0..N-1 of every method, all from one SFT base (default: 1)")
    parser.add_argument("--bases", type=int, default=1,
                        help="SFT bases: K-1 further bases, each with its own tasks and --seeds RL seeds, "
                             "for a robustness table (default: 1)")
    parser.add_argument("--steps", type=int,
                        help=f"RL steps per method (default: {d.rl_steps}; {SMOKE_STEPS} with --smoke)")
    parser.add_argument("--sft-steps", type=int,
                        help=f"SFT steps of the base (default: {d.sft.steps}; {SMOKE_SFT_STEPS} with --smoke)")
    parser.add_argument("--with", dest="extra", action="append", default=[], metavar="METHOD[,METHOD...]",
                        help="also train these (repeatable, comma-separated): the RL methods grpo_f1sum (GRPO on "
                             "r_λ) and ea_grpo; the supervised baselines rs_sft, dpo and recap (from the same base)")
    parser.add_argument("--kl", type=float, default=d.kl_coef,
                        help=f"weight of the KL term to the base policy (default: {d.kl_coef})")
    parser.add_argument("--lr", type=float, default=d.learning_rate, help=f"RL learning rate (default: {d.learning_rate})")
    parser.add_argument("--thinking", action="store_true",
                        help="the thinking variant: SFT targets think before the code and rollouts and evaluations "
                             "have a thinking budget, so the eval runs hold traces for `transfer` and `analyze`")
    parser.add_argument("--agent", action="store_true",
                        help="the agent variant: the base also learns agent transcripts, PreciseCoder is also "
                             "trained with rollout.agent, and every policy is evaluated inside the five-turn tool loop")
    parser.add_argument("--smoke", "--small", dest="smoke", action="store_true",
                        help="a smoke run in under a minute: few tasks, a 1-layer model, "
                             f"{SMOKE_SFT_STEPS} SFT and {SMOKE_STEPS} RL steps (checks the pipeline, learns nothing)")
    parser.add_argument("--resume", action="store_true",
                        help="continue in a non-empty --out with the same options (more --seeds or --with "
                             "are fine; others are refused): finished parts are reused")
    parser.add_argument("--cpu-devices", type=int, default=1,
                        help="split the CPU into N JAX devices and every batch over them (default: 1). On 2 "
                             "cores, 2 made an SFT step 0.66 to 0.87x as long (scripts/bench_demo_sft.py); sums "
                             "then run in another order, so bases and results differ from a 1-device run's")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def split_host(env: dict[str, str], devices: int) -> None:
    """Ask XLA for `devices` CPU devices (in `env["XLA_FLAGS"]`), unless it already sets a count.

    Takes effect only before JAX first touches a device; SFT and RL then split
    their batches over the devices.
    """
    flags = env.get("XLA_FLAGS", "")
    if devices > 1 and "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()


def steps_of(args: argparse.Namespace) -> tuple[int, int]:
    """(RL steps, SFT steps): as given, else the smoke run's or the default's."""
    d = DemoConfig()
    rl = args.steps if args.steps is not None else SMOKE_STEPS if args.smoke else d.rl_steps
    sft = args.sft_steps if args.sft_steps is not None else SMOKE_SFT_STEPS if args.smoke else d.sft.steps
    return rl, sft


def config_of(args: argparse.Namespace) -> DemoConfig:
    """The DemoConfig of the command line (ValueError on a bad combination)."""
    import dataclasses

    from jaxrl.demo.sft import SFTConfig

    d = DemoConfig()
    rl_steps, sft_steps = steps_of(args)
    sft = dataclasses.replace(d.sft, steps=sft_steps, warmup_steps=min(d.sft.warmup_steps, sft_steps - 1))
    extra = tuple(dict.fromkeys(name for value in args.extra for name in value.split(",") if name))
    unknown = [name for name in extra if name not in OPTIONAL_METHODS + BASELINES]
    if unknown:
        raise ValueError(f"--with {unknown[0]}: choose from {', '.join(OPTIONAL_METHODS + BASELINES)}")
    cfg = dict(seeds=args.seeds, bases=args.bases, methods=METHODS + tuple(n for n in extra if n in OPTIONAL_METHODS),
               baselines=tuple(n for n in extra if n in BASELINES), rl_steps=rl_steps,
               sft=sft, kl_coef=args.kl, learning_rate=args.lr, thinking=args.thinking, agent=args.agent)
    if args.smoke:
        cfg.update(sft_tasks=64, train_tasks=16, test_tasks=8, clean_tasks=4, sft_val_tasks=8, hidden=32, layers=1, heads=2,
                   tasks_per_step=2, group_size=2,
                   sft=SFTConfig(steps=sft_steps, batch_size=8, warmup_steps=1))
    return DemoConfig(**cfg)


def main(args: argparse.Namespace) -> int:
    rl_steps, sft_steps = steps_of(args)
    if args.seeds < 1 or args.bases < 1 or rl_steps < 1 or sft_steps < 2:
        print("precisecoder demo: --seeds, --bases and --steps must be >= 1 and --sft-steps >= 2", file=sys.stderr)
        return 2
    if args.cpu_devices < 1:
        print("precisecoder demo: --cpu-devices must be >= 1", file=sys.stderr)
        return 2
    if args.kl < 0 or args.lr <= 0:
        print("precisecoder demo: --kl must be >= 0 and --lr > 0", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.resume:
        print(f"precisecoder demo: {out} is not empty; choose another --out or pass --resume", file=sys.stderr)
        return 2
    try:
        cfg = config_of(args)
        check_resume(cfg, out)
    except ValueError as e:
        print(f"precisecoder demo: {e}", file=sys.stderr)
        return 2
    from jaxrl.demo.run import run_demo

    command = "precisecoder demo " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 \
        else "precisecoder demo"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    split_host(os.environ, args.cpu_devices)
    import jax

    # JAX read JAX_PLATFORMS when the demo modules imported it; without this it would also
    # probe for a TPU (libtpu is installed for `plan`) and print pages of warnings.
    jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])
    try:
        result = run_demo(cfg, out, progress=not args.no_progress, command=command.strip())
    except KeyboardInterrupt:
        print(f"precisecoder demo: interrupted; the same command with --resume continues in {out}", file=sys.stderr)
        return 130
    print((out / "report.md").read_text(encoding="utf-8"))
    print(f"wrote {out / 'report.md'}, {out / 'results.json'}, {out / 'curves.png'} "
          f"in {result['seconds'] / 60:.1f} min")
    return 0
