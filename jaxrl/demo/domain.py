"""The micro debugging domain of `precisecoder demo`: straight-line functions with one bug.

A program is a function of two or three integer arguments that computes a few
assignments `v = x op y` (op in + and *, or + - * with `ops=OPS`; operands earlier
names or digits 1-9) and returns the last one. Each line carries its specification
as a comment, in words and in a canonical operand order (`y = 2 * x  # x times 2`);
the code shows each line of two different operands swapped with probability
`swap_p`, so an equivalent rewrite of a correct line is always at hand: writing a
line as its comment words it changes the line without changing the program. (With
`comments=False` the words form a separate description in the task prompt.)

One line carries the injected bug (a wrong operator, a wrong name or a wrong
digit) under its correct comment, kept only when the assert tests see it. Two
ways to pass follow:

- the minimal fix: copy the code and rewrite the one line that disagrees
  with its comment (this needs the bug to be found);
- the rewrite: write every line as its comment words it (no search needed,
  but every swapped correct line becomes an over-edit).

SFT targets mix the two (`sft_target`), which gives a base policy that often
passes and often over-edits, as the paper observes of real base models.
Whether over-edits then pass more or less often than tight answers is
measured, not assumed (docs/demo.md, "Over-editing and passing").
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator, Sequence

from reward.schema import AssertTests, Task

OPS = ("+", "-", "*")
OP_WORDS = {"+": "plus", "-": "minus", "*": "times"}
COMMUTATIVE = frozenset("+*")
ARGS = ("a", "b", "c")
NAMES = ("x", "y", "z", "u", "v", "w", "p", "q", "r", "s", "t", "m", "n", "k")
DIGITS = tuple(str(d) for d in range(1, 10))
# The task prompt when each line's description is its comment.
COMMENTED_PROMPT = "f does what its comments say"


@dataclasses.dataclass(frozen=True)
class Line:
    """`target = left op right`, operands in the description's order; `swapped` shows them reversed in code."""

    target: str
    op: str
    left: str
    right: str
    swapped: bool = False

    def code(self, canonical: bool = False, comment: str | None = None) -> str:
        """The source line (indented); `canonical` writes the description's operand order.

        `comment`, if given, follows the code as `  # comment`.
        """
        left, right = (self.right, self.left) if self.swapped and not canonical else (self.left, self.right)
        text = f"    {self.target} = {left} {self.op} {right}"
        return text if comment is None else f"{text}  # {comment}"

    def words(self) -> str:
        """The right-hand side in words, in the description's operand order: `5 plus x`."""
        return f"{self.left} {OP_WORDS[self.op]} {self.right}"

    def describe(self) -> str:
        return f"{self.target} is {self.words()}"


@dataclasses.dataclass(frozen=True)
class Program:
    """A straight-line function `f(args)` of assignment lines returning the last target."""

    args: tuple[str, ...]
    lines: tuple[Line, ...]

    def header(self) -> str:
        return f"def f({', '.join(self.args)}):"

    def code(self, canonical: frozenset[int] = frozenset(), comments: Sequence[str] | None = None) -> str:
        """The source; lines whose index is in `canonical` use the description's operand order.

        `comments`, one per assignment line, are written after each line's code.
        """
        notes = comments if comments is not None else [None] * len(self.lines)
        body = [line.code(i in canonical, note) for i, (line, note) in enumerate(zip(self.lines, notes))]
        return "\n".join([self.header(), *body, f"    return {self.lines[-1].target}"]) + "\n"

    def comments(self) -> list[str]:
        """Each assignment line's right-hand side in words, the comment it carries in the code."""
        return [line.words() for line in self.lines]

    def describe(self) -> str:
        """The line-by-line description shown as the task prompt."""
        return "\n".join([*(line.describe() for line in self.lines), f"return {self.lines[-1].target}"])

    def evaluate(self, values: Sequence[int]) -> int:
        """f(*values), computed without exec."""
        env = dict(zip(self.args, values))

        def val(x: str) -> int:
            return int(x) if x.isdigit() else env[x]

        for line in self.lines:
            a, b = val(line.left), val(line.right)
            env[line.target] = a + b if line.op == "+" else a - b if line.op == "-" else a * b
        return env[self.lines[-1].target]


@dataclasses.dataclass(frozen=True)
class DomainConfig:
    """Sizes and probabilities of generated programs.

    Attributes:
        min_lines, max_lines: assignment lines per program.
        swap_p: chance that a `+` / `*` line shows its operands swapped in the code.
        digit_p: chance that an operand is a digit rather than a name.
        ops: the operators programs are written with (a bug may bring in any of `OPS`).
            Without `-` (the default) every line of two different operands has an equivalent
            swapped form, so the rewrite edits nearly every line; `OPS` adds `-` lines, which
            the rewrite leaves as they are.
        tests: assert cases per task.
        comments: describe each line in a comment on the line itself (the prompt is then
            `COMMENTED_PROMPT`) rather than in a separate description above the code.
    """

    min_lines: int = 3
    max_lines: int = 5
    swap_p: float = 1.0
    digit_p: float = 0.25
    ops: tuple[str, ...] = ("+", "*")
    tests: int = 4
    comments: bool = True

    def __post_init__(self):
        if not 1 <= self.min_lines <= self.max_lines <= len(NAMES):
            raise ValueError(f"need 1 <= min_lines <= max_lines <= {len(NAMES)}")
        if not (0 <= self.swap_p <= 1 and 0 <= self.digit_p < 1):
            raise ValueError("swap_p must be in [0, 1] and digit_p in [0, 1)")
        if not self.ops or not set(self.ops) <= set(OPS) or not set(self.ops) & COMMUTATIVE:
            raise ValueError(f"ops must be operators among {' '.join(OPS)}, including + or *, got {self.ops}")
        if self.tests < 1:
            raise ValueError("tests must be >= 1")


def random_program(rng: random.Random, cfg: DomainConfig) -> Program:
    """A program whose every line uses at least one name (so no line is a constant)."""
    args = ARGS[: rng.choice((2, 3))]
    names = rng.sample(NAMES, rng.randint(cfg.min_lines, cfg.max_lines))
    scope, lines = list(args), []
    for i, target in enumerate(names):
        # The newest name is used by the next line, so every line matters to the result.
        first = scope[-1] if i else rng.choice(scope)
        second = rng.choice(DIGITS) if rng.random() < cfg.digit_p else rng.choice(scope)
        left, right = (first, second) if rng.random() < 0.5 else (second, first)
        # x - x would zero the rest of the program
        op = rng.choice(cfg.ops if left != right else [o for o in cfg.ops if o in COMMUTATIVE])
        swapped = op in COMMUTATIVE and left != right and rng.random() < cfg.swap_p
        lines.append(Line(target, op, left, right, swapped))
        scope.append(target)
    return Program(args, tuple(lines))


def mutations(program: Program, index: int) -> list[Line]:
    """Every single-token change of line `index`: another operator, another name or another digit."""
    line = program.lines[index]
    scope = list(program.args) + [x.target for x in program.lines[:index]]
    out = []
    for op in OPS:
        if op == line.op:
            continue
        if line.swapped and op not in COMMUTATIVE:
            # Keep the operands where the code shows them: only the operator changes on screen.
            out.append(Line(line.target, op, line.right, line.left))
        else:
            out.append(dataclasses.replace(line, op=op))
    for side in ("left", "right"):
        old = getattr(line, side)
        pool = DIGITS if old.isdigit() else scope
        out += [dataclasses.replace(line, **{side: new}) for new in pool if new != old]
    return out


def _test_inputs(rng: random.Random, program: Program, n: int) -> list[tuple[int, ...]]:
    return [tuple(rng.randint(-4, 9) for _ in program.args) for _ in range(n)]


def assert_code(program: Program, inputs: Sequence[tuple[int, ...]]) -> str:
    """One `assert f(...) == value` per input, values from the correct program."""
    return "\n".join(f"assert f({', '.join(map(str, x))}) == {program.evaluate(x)}" for x in inputs) + "\n"


def inject_bug(rng: random.Random, program: Program, inputs: Sequence[tuple[int, ...]]) -> tuple[int, Line] | None:
    """A (line index, buggy line) that changes f on some test input, or None if no mutation does."""
    expected = [program.evaluate(x) for x in inputs]
    candidates = []
    for index in range(len(program.lines)):
        for bad in mutations(program, index):
            lines = list(program.lines)
            lines[index] = bad
            buggy = Program(program.args, tuple(lines))
            if [buggy.evaluate(x) for x in inputs] != expected:
                candidates.append((index, bad))
    return rng.choice(candidates) if candidates else None


@dataclasses.dataclass(frozen=True)
class Sample:
    """A generated task with what SFT needs: the correct program and the buggy line."""

    task: Task
    program: Program
    bug_index: int | None
    comments: bool = False

    def rewrite(self) -> str:
        """The over-editing target: every line written as described (no search for the bug)."""
        notes = self.program.comments() if self.comments else None
        return self.program.code(canonical=frozenset(range(len(self.program.lines))), comments=notes)


def make_sample(rng: random.Random, cfg: DomainConfig, task_id: str, clean: bool = False) -> Sample:
    """One task in the project's schema; `clean` gives a GT Debug task (buggy_code == solution)."""
    while True:
        program = random_program(rng, cfg)
        inputs = _test_inputs(rng, program, cfg.tests)
        if len({program.evaluate(x) for x in inputs}) < 2:
            continue  # a constant function (e.g. a factor that is always 0) tests nothing
        tests = AssertTests(assert_code(program, inputs))
        notes = program.comments() if cfg.comments else None
        text = COMMENTED_PROMPT if cfg.comments else program.describe()
        solution = program.code(comments=notes)
        if clean:
            task = Task(task_id, task_id, text, solution, solution, tests, meta={"source": "demo", "kind": "clean"})
            return Sample(task, program, None, cfg.comments)
        bug = inject_bug(rng, program, inputs)
        if bug is None:
            continue
        index, bad = bug
        lines = list(program.lines)
        lines[index] = bad
        buggy = Program(program.args, tuple(lines)).code(comments=notes)
        task = Task(task_id, task_id, text, buggy, solution, tests,
                    meta={"source": "demo", "kind": "single", "bug_line": index + 2})
        return Sample(task, program, index, cfg.comments)


def generate(seed: int, n: int, prefix: str, cfg: DomainConfig = DomainConfig(), clean: bool = False,
             exclude: frozenset[str] = frozenset()) -> list[Sample]:
    """`n` tasks with distinct programs, none of whose correct code is in `exclude`.

    Task ids are `{prefix}/{i}`; the same arguments always give the same tasks.
    """
    rng = random.Random(f"{prefix}:{seed}")
    seen, out = set(exclude), []
    while len(out) < n:
        sample = make_sample(rng, cfg, f"{prefix}/{len(out)}", clean)
        if sample.task.solution in seen:
            continue
        seen.add(sample.task.solution)
        out.append(sample)
    return out


@dataclasses.dataclass(frozen=True)
class Splits:
    """Disjoint task sets of one demo base: SFT, RL training, held-out buggy, held-out clean, SFT validation."""

    sft: list[Sample]
    train: list[Sample]
    test: list[Sample]
    clean: list[Sample]
    sft_val: list[Sample] = dataclasses.field(default_factory=list)


def make_splits(seed: int, sft: int, train: int, test: int, clean: int,
                cfg: DomainConfig = DomainConfig(), sft_val: int = 0) -> Splits:
    """Generate the sets with no correct program shared between any two.

    The SFT validation set is drawn last, so the other four are the same with or without it.
    """
    used: set[str] = set()

    def take(n: int, prefix: str, is_clean: bool = False) -> list[Sample]:
        samples = generate(seed, n, prefix, cfg, is_clean, frozenset(used))
        used.update(s.task.solution for s in samples)
        return samples

    held_test = take(test, "demo-test")
    held_clean = take(clean, "demo-clean", True)
    sft_set, train_set = take(sft, "demo-sft"), take(train, "demo-train")
    return Splits(sft_set, train_set, held_test, held_clean, take(sft_val, "demo-sftval") if sft_val else [])


def sft_target(rng: random.Random, sample: Sample, rewrite_share: float, miss_share: float = 0.0) -> tuple[str, str]:
    """The program an SFT pair teaches, and which kind it is.

    With chance `rewrite_share` the over-editing rewrite ("rewrite"); otherwise the
    minimal fix ("fix"), except that with chance `miss_share` a minimal attempt misses
    the bug and answers with the buggy code unchanged ("miss"), as a model that edits
    little but cannot always find the bug does.
    """
    if rng.random() < rewrite_share:
        return sample.rewrite(), "rewrite"
    if rng.random() < miss_share:
        return sample.task.buggy_code, "miss"
    return sample.task.solution, "fix"


def iter_tasks(samples: Sequence[Sample]) -> Iterator[Task]:
    return (s.task for s in samples)
