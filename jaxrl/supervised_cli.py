"""Train a supervised baseline on selected rows: `precisecoder supervised --config C --objective sft|dpo --rows FILE`.

The model, mesh, optimizer (learning rate: the paper's 5e-6 for SFT, 5e-7 for DPO) and
run directory come from config C, as for `precisecoder train`; the rows from
`precisecoder select` (sft or recap rows for `sft`, dpo rows for `dpo`). The run
directory opens with `generate --checkpoint` and `eval --checkpoint` (docs/baselines.md).
"""

from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="a named config (see jaxrl/configs) or a YAML path")
    parser.add_argument("--objective", choices=("sft", "dpo"), required=True,
                        help="sft: NLL on the response tokens; dpo: the sigmoid loss against the base")
    parser.add_argument("--rows", required=True, help="rows from `precisecoder select` (JSONL)")
    parser.add_argument("--tasks", help="the task JSONL the rows' task_ids come from (not needed for recap rows)")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the rows (default: 1)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows (DPO: pairs) per step (default: 8)")
    parser.add_argument("--beta", type=float, default=0.1, help="DPO's beta (default: 0.1)")
    parser.add_argument("--steps", type=int, help="stop after this step (default: all epochs)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data order (default: 0)")
    parser.add_argument("--out", help="run.out: the run directory")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (dotted), e.g. --set optimizer.learning_rate=5e-6")


def main(args: argparse.Namespace) -> int:
    from jaxrl.config import ConfigError, config_from_args
    from jaxrl.supervised import SupervisedConfig, SupervisedError, train_supervised
    from jaxrl.trainer import TrainError

    try:
        cfg = config_from_args(args.config, args.overrides, None, args.out)
        sup = SupervisedConfig(args.objective, args.rows, args.tasks, args.epochs, args.batch_size, args.beta,
                               args.steps, args.seed)
    except (ConfigError, ValueError) as e:
        print(f"precisecoder supervised: {e}", file=sys.stderr)
        return 2
    try:
        history = train_supervised(cfg, sup, resume=args.resume)
    except (SupervisedError, TrainError) as e:
        print(f"precisecoder supervised: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"precisecoder supervised: interrupted; continue with --resume --out {cfg.run.out}", file=sys.stderr)
        return 130
    print(json.dumps(history[-1], sort_keys=True))
    return 0
