"""Train a supervised baseline on selected rows: `precisecoder supervised --config C --rows FILE`.

The model, mesh, optimizer and run directory come from config C, as for `precisecoder
train`; the objective from its `supervised` section (the named configs `rs_sft`, `dpo`
and `recap_refiner` hold the paper's settings), each flag here replacing one of its keys;
the rows from `precisecoder select` (sft or recap rows for `sft`, dpo rows for `dpo`).
The run directory opens with `generate --checkpoint` and `eval --checkpoint` (docs/baselines.md).
"""

from __future__ import annotations

import argparse
import json
import sys

# flags that replace the key of the same name in the config's `supervised` section
FLAGS = ("objective", "rows", "tasks", "epochs", "batch_size", "beta", "steps", "seed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True,
                        help="a named config (rs_sft, dpo, recap_refiner, their *_tiny variants, ...) or a YAML path")
    parser.add_argument("--objective", choices=("sft", "dpo"),
                        help="sft: NLL on the response tokens; dpo: the sigmoid loss against the base "
                             "(default: the config's supervised.objective)")
    parser.add_argument("--rows", help="rows from `precisecoder select` (JSONL)")
    parser.add_argument("--tasks", help="the task JSONL the rows' task_ids come from (not needed for recap rows)")
    parser.add_argument("--epochs", type=int, help="passes over the rows (default: the config's, else 1)")
    parser.add_argument("--batch-size", type=int, help="rows (DPO: pairs) per step (default: the config's, else 8)")
    parser.add_argument("--beta", type=float, help="DPO's beta (default: the config's, else 0.1)")
    parser.add_argument("--steps", type=int, help="stop after this step (default: all epochs)")
    parser.add_argument("--seed", type=int, help="seed of the data order (default: the config's, else 0)")
    parser.add_argument("--out", help="run.out: the run directory")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key (dotted), e.g. --set optimizer.learning_rate=5e-6")


def main(args: argparse.Namespace) -> int:
    from jaxrl.config import ConfigError, config_from_args
    from jaxrl.supervised import SupervisedError, train_supervised
    from jaxrl.trainer import TrainError

    flags = [f"supervised.{flag}={json.dumps(getattr(args, flag))}" for flag in FLAGS
             if getattr(args, flag) is not None]
    try:
        cfg = config_from_args(args.config, [*args.overrides, *flags], None, args.out)
        if cfg.supervised is None:
            raise ConfigError("the config has no supervised section: give --objective sft|dpo "
                              "or use rs_sft, dpo or recap_refiner")
    except (ConfigError, ValueError) as e:
        print(f"precisecoder supervised: {e}", file=sys.stderr)
        return 2
    try:
        history = train_supervised(cfg, cfg.supervised, resume=args.resume)
    except (SupervisedError, TrainError) as e:
        print(f"precisecoder supervised: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from jaxrl.loop import interrupted_message

        line, code = interrupted_message("supervised", e, cfg.run.out)
        print(line, file=sys.stderr)
        return code
    print(json.dumps(history[-1], sort_keys=True))
    return 0
