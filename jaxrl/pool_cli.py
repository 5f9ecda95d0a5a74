"""Sample and score a pool for the supervised baselines: `precisecoder pool --config C --n 16 --out DIR`.

Samples n completions per training task of config C from its model (`model.checkpoint`,
or its random initialisation) with its rollout engine and sampling settings, scores them
with the fleet, and writes DIR/pool.jsonl, one row per sample (docs/baselines.md). An
interrupted run resumes: rerun the same command. Then `precisecoder select` picks the
SFT targets, DPO pairs or RECAP examples.
"""

from __future__ import annotations

import argparse
import json
import sys


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="a named config (see jaxrl/configs) or a YAML path")
    parser.add_argument("--n", type=_positive, default=16, help="samples per task (default: 16, the paper's)")
    parser.add_argument("--out", required=True, help="the pool directory (DIR/pool.jsonl)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (dotted), e.g. --set model.checkpoint=PATH; repeatable")
    parser.add_argument("--limit", type=_positive, help="only the first N training tasks")
    parser.add_argument("--seed", type=int, help="sampling seed (default: the config's run.seed)")
    parser.add_argument("--batch-size", type=_positive, default=8, help="tasks per engine call (default: 8)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def main(args: argparse.Namespace) -> int:
    from jaxrl.config import ConfigError
    from jaxrl.config import config_from_args

    try:
        cfg = config_from_args(args.config, args.overrides, None, None)
    except ConfigError as e:
        print(f"precisecoder pool: config error: {e}", file=sys.stderr)
        return 2
    import contextlib

    from jaxrl import tasks as T
    from jaxrl.errors import TrainError
    from jaxrl.pool import PoolError, build_pool, settings_of
    from jaxrl.run import open_engine, open_mesh, open_verifier
    from jaxrl.saved_run import build_model
    from models.tokenizer import load_tokenizer
    from reward.sandbox import library_env
    from reward.schema import SchemaError

    try:
        settings = settings_of(cfg, args.n, args.seed)
        build = None
        if cfg.data.build is not None:
            build = T.ensure_built(cfg.data.build, cfg.reward.workers, cfg.reward.isolation,
                                   libraries=library_env(cfg.reward.sandbox_env, cfg.reward.preload),
                                   progress=not args.no_progress)
        tasks = T.read_tasks(T.task_paths(cfg.data, build)["train"], "train", args.limit)
        if not tasks:
            raise PoolError("the config has no training tasks (data.train)")
        tokenizer = load_tokenizer(cfg.model.family)
        source = {"config": cfg.name, "checkpoint": cfg.model.checkpoint, "engine": cfg.rollout.engine}
        with contextlib.ExitStack() as stack:  # the same set-up as a training run's (`jaxrl.run`)
            mesh, rules = open_mesh(cfg)
            engine = open_engine(stack, cfg, build_model(cfg, mesh, rules), tokenizer, mesh, rules)
            fleet, _ = open_verifier(stack, cfg)
            counts = build_pool(engine, tokenizer, tasks, settings, fleet, args.out, model=source,
                                batch_size=args.batch_size, progress=not args.no_progress)
    except (PoolError, TrainError, T.DataError, SchemaError, ValueError) as e:
        print(f"precisecoder pool: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"precisecoder pool: interrupted; rerun the same command to continue in {args.out}", file=sys.stderr)
        return 130
    print(json.dumps(counts))
    return 0
