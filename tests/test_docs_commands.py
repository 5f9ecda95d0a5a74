"""Every `precisecoder` command that README.md and docs/*.md show is checked against the real CLI.

- Each flag a mention shows (`--out`, `[--seeds N]`, ...) must be an option of its subcommand.
- A complete command (no `[...]`, `|`, `...` or upper-case placeholder such as DIR) must parse,
  and the presets and named configs it names (`plan NAME`, `train --config NAME`) must exist
  (or be a file the same page has the user write: "`my_run.yaml`, next to it:").
- The commands of code blocks that are cheap on a CPU (`check`, `score`, `--help`) run as typed,
  from a temporary working directory holding a copy of `reward/examples/`; the others would train
  a model or compile for a pod (the README's main command runs at smoke size in
  tests/test_commands_as_typed.py). A command that needs a TPU, a GPU or network access says so
  with a shell comment `# needs: tpu` (or `gpu`, `network`) and is only parsed.
"""

import argparse
import importlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl.cli import COMMANDS
from jaxrl.config import ConfigError, resolve_path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = {"check", "score"}
SUBCOMMANDS = "|".join(COMMANDS)
NEEDS = re.compile(r"#\s*needs:\s*(tpu|gpu|network)\b")


class ParseError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting (subparsers inherit the class)."""

    def error(self, message):
        raise ParseError(message)


def mentions():
    """(where, text after `precisecoder`, in a code block, needs) for every mention in the docs."""
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        blocks = re.findall(r"^ *```[^\n]*\n(.*?)^ *```", text, re.S | re.M)
        prose = re.sub(r"^ *```[^\n]*\n.*?^ *```", "", text, flags=re.S | re.M)
        indented = "\n".join(line for line in prose.splitlines() if line.startswith("    "))
        for body in [*blocks, indented]:
            for line in body.replace("\\\n", " ").splitlines():
                m = re.search(rf"(?:^|\s)(?:\S*/)?precisecoder((?: (?:{SUBCOMMANDS}|-)\S*| *$).*)", line)
                if m and not line.lstrip().startswith("#"):
                    needs = NEEDS.search(line)
                    found.append((f"{path.name}: {line.strip()}", m.group(1).split(" #")[0].strip(), True,
                                  needs.group(1) if needs else None))
        for m in re.finditer(rf"`((?:\S*/)?precisecoder(?: (?:{SUBCOMMANDS}|-)[^`\n]*)?)`", prose):
            found.append((f"{path.name}: {m.group(1)}", m.group(1).split("precisecoder", 1)[1].strip(), False,
                          None))
    return found


def parser_for(name):
    module = importlib.import_module(COMMANDS[name][0])
    parser = Parser(prog=f"precisecoder {name}")
    module.add_arguments(parser)
    return parser


def options(parser):
    """Every option string of `parser` and of its subcommands."""
    out = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= options(sub)
    return out


def is_synopsis(tokens):
    """A usage line, or a command with placeholders (DIR, N, $WORKER) that only a reader fills in."""
    return any(re.search(r"[\[\]|$]|\.\.\.", t) or re.fullmatch(r"[A-Z][A-Z_]*", t) for t in tokens)


def split(rest):
    """Shell words of a mention; a quote closing a surrounding `--command='...'` is dropped."""
    try:
        return shlex.split(rest.replace("\\|", "|"))
    except ValueError:
        return shlex.split(rest.replace("\\|", "|").rstrip("'\""))


MENTIONS = mentions()


def test_the_docs_mention_commands():
    assert len(MENTIONS) > 50 and sum(block for _, _, block, _ in MENTIONS) > 10


@pytest.mark.parametrize("where, rest, block, needs", MENTIONS, ids=[m[0][:90] for m in MENTIONS])
def test_every_command_in_the_docs_parses(where, rest, block, needs):
    tokens = split(rest)
    if not tokens or tokens[0] in ("--help", "-h"):
        return
    name = tokens[0]
    assert name in COMMANDS, f"{where}: no subcommand {name!r}"
    parser = parser_for(name)
    known = options(parser)
    for token in tokens[1:]:
        flag = token.strip("[]").split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in known, f"{where}: precisecoder {name} has no option {flag}"
    if is_synopsis(tokens) or {"-h", "--help"} & set(tokens):
        return
    try:
        args = parser.parse_args(tokens[1:])
    except ParseError as e:
        if not block and re.search(r"required|expected one argument", str(e)):
            return  # a fragment in prose (`precisecoder score --out`)
        raise AssertionError(f"{where}: {e}") from None
    page = (REPO / where.split(":")[0]) if where.startswith("README") else REPO / "docs" / where.split(":")[0]
    for config in [getattr(args, "preset", None), getattr(args, "config", None)]:
        if config is not None and Path(config).suffix and f"`{config}`, next to it" in page.read_text():
            continue  # a file the page has the user write first (docs/estimators.md's my_run.yaml)
        if config is not None:
            try:
                resolve_path(config if not Path(config).suffix else REPO / config)
            except ConfigError as e:
                raise AssertionError(f"{where}: {e}") from None


RUNNABLE = [m for m in MENTIONS if m[2] and m[3] is None and m[1].split(" ")[0] in RUN
            and not is_synopsis(split(m[1]))]


@pytest.mark.parametrize("where, rest, block, needs", RUNNABLE, ids=[m[0][:90] for m in RUNNABLE])
def test_the_cheap_commands_of_code_blocks_run_as_typed(tmp_path, where, rest, block, needs):
    shutil.copytree(REPO / "reward" / "examples", tmp_path / "reward" / "examples")
    command = [str(Path(sys.executable).parent / "precisecoder"), *shlex.split(rest), "--no-progress"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, f"{where}: {proc.stderr[-2000:]}"


def test_every_subcommand_help_runs_as_typed():
    proc = subprocess.run([str(Path(sys.executable).parent / "precisecoder"), "--help"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and all(name in proc.stdout for name in COMMANDS)
