"""The `precisecoder` console command: a thin dispatcher over subcommands.

Each subcommand lives in the package that owns its logic and exposes
`add_arguments(parser)` and `main(args) -> int`. Only the chosen subcommand's
module is imported, so `precisecoder --help` stays instant and `check` never
imports JAX.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import os
import signal
import sys

# name -> (module, one-line help). Add a line here to add a subcommand.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("reward.check_cli", "verify a task set, or run predictions against their tests"),
    "eval": ("jaxrl.eval.cli", "evaluate a model under the paper's protocol; `eval compare` tables and plots"),
    "demo": ("jaxrl.demo.cli", "SFT a tiny Qwen3, then GRPO vs PreciseCoder on a micro domain: the paper's result on a CPU"),
    "data": ("reward.data.cli", "build verified debugging task sets (PDB-style bug synthesis)"),
    "score": ("reward.score_cli", "score predictions with the PreciseCoder reward"),
    "generate": ("jaxrl.generate_cli", "sample completions for JSONL prompts with the jax, sglang or openai engine"),
    "train": ("jaxrl.train_cli", "train a policy with RL (GDPO and the baselines) from a config"),
    "pool": ("jaxrl.pool_cli", "sample n completions per training task and score them: the baselines' pool"),
    "select": ("jaxrl.select_cli", "select SFT targets, DPO pairs or RECAP refiner examples from a scored pool"),
    "supervised": ("jaxrl.supervised_cli", "train a supervised baseline (SFT, DPO, the RECAP refiner) on selected rows"),
    "serve": ("jaxrl.serve_cli", "serve a model with sglang-jax, weight updates included, for the sglang engine"),
    "plan": ("jaxrl.plan", "check a preset fits its TPU slice or GPU node (compiles ahead of time, no TPU needed)"),
    "transfer": ("jaxrl.studies.transfer_cli", "chain-of-thought transfer: a receiver answers with a donor's thinking"),
    "analyze": ("jaxrl.studies.cli", "the paper's analyses: `analyze thinking` (lexical) and `analyze rewards`"),
}


def _top_parser() -> argparse.ArgumentParser:
    lines = "\n".join(f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items())
    return argparse.ArgumentParser(
        prog="precisecoder",
        description="PreciseCoder-JAX: RL post-training of code models for precise bug fixes.",
        epilog=f"subcommands:\n{lines}\n\nRun `precisecoder COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def quiet_platforms(env: dict[str, str]) -> None:
    """Pin JAX to the CPU (`JAX_PLATFORMS=cpu`) on a machine with no TPU and no GPU plugin, unless it is set.

    libtpu (installed for `plan`) otherwise probes for a TPU at JAX's start and prints
    pages of warnings, an `E0000 ... INVALID_ARGUMENT` line among them, before falling back.
    """
    tpu = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    gpu = importlib.util.find_spec("jax_plugins") is not None
    if "JAX_PLATFORMS" not in env and not tpu and not gpu:
        env["JAX_PLATFORMS"] = "cpu"


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]) and run the chosen subcommand."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv:
        top.print_help(sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    if argv[0] not in COMMANDS:
        top.error(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
    name, rest = argv[0], argv[1:]
    if name != "plan":  # plan compiles for TPUs through libtpu
        quiet_platforms(os.environ)
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"precisecoder {name}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.main(args) or 0)
    except KeyboardInterrupt:
        print(f"precisecoder {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of stdout closed it (`precisecoder score ... | head -1`): stop quietly, as Unix tools do.

    Later writes (Python's own flush at exit included) go to /dev/null, so no traceback follows;
    the status is the shell's for a command ended by SIGPIPE.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
