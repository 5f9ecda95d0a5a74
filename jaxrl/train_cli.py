"""Train a policy with RL: `precisecoder train --config NAME|PATH [--steps N] [--out DIR] [--resume] [--set k=v ...]`.

Runs the loop of docs/trainer.md (sample, score, advantages, update, push weights;
validate and checkpoint every k steps). Named configs: `jaxrl/configs/*.yaml`
(e.g. `tiny`, which trains on this CPU in minutes). On a pod, run the same command
on every host with `--distributed` (Cloud TPU and SLURM: JAX detects the hosts), or
with `--coordinator`, `--num-processes`, `--process-id` where it cannot.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import TYPE_CHECKING

from reward.cli_args import SANDBOX_ENV_HELP, output_dir_error, sandbox_env_path, user_path

if TYPE_CHECKING:
    from jaxrl.config import Config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from jaxrl.config import config_names

    parser.epilog = f"named configs: {', '.join(config_names())}"
    parser.add_argument("--config", required=True, help="a named config (see jaxrl/configs) or a YAML path")
    parser.add_argument("--steps", type=int, help="run.steps: train up to this step")
    parser.add_argument("--out", type=user_path, help="run.out: the run directory")
    parser.add_argument("--sandbox-env", type=sandbox_env_path, metavar="PATH",
                        help="reward.sandbox_env: " + SANDBOX_ENV_HELP)
    parser.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint in --out")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (dotted), e.g. --set rollout.group_size=4; repeatable")
    parser.add_argument("--distributed", action="store_true",
                        help="multi-host: join the other hosts with jax.distributed.initialize(), "
                             "which detects them on Cloud TPU pods and under SLURM")
    parser.add_argument("--coordinator", help="multi-host: the coordinator's HOST:PORT")
    parser.add_argument("--num-processes", type=int, help="multi-host: number of processes")
    parser.add_argument("--process-id", type=int, help="multi-host: this process's index")


def _absolute(path: str | None) -> str | None:
    return None if path is None else os.path.abspath(os.path.expanduser(path))


def resolve_paths(cfg: Config) -> Config:
    """`cfg` with every path in it absolute: relative ones are taken from the working directory, `~` expanded.

    A config file's paths (`run.out`, `data.train`, ...) mean what they would typed on the
    command line beside `--set`; Orbax and the sandbox workers then never see a relative path.
    """
    data, env = cfg.data, cfg.reward.sandbox_env
    build = data.build and dataclasses.replace(data.build, cache_dir=_absolute(data.build.cache_dir))
    data = dataclasses.replace(data, train=_absolute(data.train), val=_absolute(data.val),
                               gt_debug=_absolute(data.gt_debug), build=build)
    reward = dataclasses.replace(cfg.reward, sandbox_env=env if env in (None, "none") else _absolute(env))
    return dataclasses.replace(cfg, data=data, reward=reward,
                               run=dataclasses.replace(cfg.run, out=_absolute(cfg.run.out)),
                               model=dataclasses.replace(cfg.model, checkpoint=_absolute(cfg.model.checkpoint)))


def main(args: argparse.Namespace) -> int:
    from jaxrl.config import ConfigError

    try:
        from jaxrl.config import config_from_args
        overrides = args.overrides + ([f"reward.sandbox_env={args.sandbox_env}"] if args.sandbox_env else [])
        cfg = resolve_paths(config_from_args(args.config, overrides, args.steps, args.out))
    except ConfigError as e:
        print(f"precisecoder train: config error: {e}", file=sys.stderr)
        return 2
    problem = output_dir_error(cfg.run.out)
    if problem:
        print(f"precisecoder train: run.out {problem}", file=sys.stderr)
        return 2
    from reward.sandbox import library_env

    try:
        library_env(cfg.reward.sandbox_env, cfg.reward.preload)
    except ValueError as e:
        print(f"precisecoder train: reward.sandbox_env: {e}", file=sys.stderr)
        return 2
    from jaxrl import hosts
    from jaxrl.tasks import DataError
    from jaxrl.trainer import TrainError, train
    from reward.schema import SchemaError

    hosts.initialize(args.coordinator, args.num_processes, args.process_id, auto=args.distributed)
    try:
        last = train(cfg, resume=args.resume)
    except (TrainError, DataError, SchemaError) as e:
        print(f"precisecoder train: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from jaxrl.loop import interrupted_message

        line, code = interrupted_message("train", e, cfg.run.out)
        print(line, file=sys.stderr)
        return code
    if hosts.is_primary():
        shown = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                 for k, v in last.items() if not k.startswith("share/")}
        print(json.dumps(shown, sort_keys=True))
    return 0
