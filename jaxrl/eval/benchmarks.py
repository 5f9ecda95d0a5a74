"""Out-of-distribution benchmarks as task sets: readers of the public files and their graders.

Each benchmark is read from a path the user supplies (docs/eval.md gives the downloads) into
`BenchTask`s: the prompt's user message, how an answer becomes a program, and the tests that
program runs against in the sandbox (`reward.fleet.Fleet`), where the verdict is decided.

- `humaneval+` / `mbpp+` (EvalPlus): the program is the answer's code; the tests call its entry
  point on every base and plus input and compare each answer with the canonical solution's
  output on the same input, exactly or within `atol` (1e-6 for float outputs when the file gives
  0, as EvalPlus does). The canonical solution runs in the judge, on a deep copy of each input,
  in the same sandbox run: the sandbox hands back at most 2 KiB of a run's output, so expected
  outputs cannot be computed once and kept without changing `reward/`. One run per problem
  computes all of its expected outputs and checks all of its inputs. `humaneval` / `mbpp` are
  the base inputs only.
- `cruxeval-o` / `cruxeval-i`: the answer is a Python expression (the output, or the call's
  arguments), evaluated in the program's process after the benchmark's code (whose names it may
  use, as in CRUXEval's own grading); the judge runs the benchmark's `f` itself and
  asserts `f(input) == output` on plain data, as CRUXEval grades by execution.
- `bigcodebench`: the instruct prompt; the program is the answer's code and the tests are the
  task's `unittest.TestCase` class (`{"kind": "unittest"}` tests, docs/sandbox.md).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import gzip
import json
import os
import re
import warnings
from collections.abc import Sequence
from typing import Any

from jaxrl import prompts
from reward.extract import answer_text, extract_program
from reward.sandbox import Job, Limits
from reward.sandbox_codec import MAX_BYTES, MAX_INT_BITS, MAX_ITEMS
from reward.schema import AssertTests, Prediction, Tests, tests_from_json

BENCHMARKS = ("humaneval+", "humaneval", "mbpp+", "mbpp", "cruxeval-o", "cruxeval-i", "bigcodebench")
# Answer kinds: a program, CRUXEval-O's output expression, CRUXEval-I's argument list.
CODE, OUTPUT, INPUT = "code", "output", "input"
# Seconds of one sandbox run: EvalPlus problems check up to ~1,000 inputs through the proxy in one run.
TIMEOUT_S = {"humaneval+": 120.0, "humaneval": 20.0, "mbpp+": 120.0, "mbpp": 20.0, "cruxeval-o": 10.0,
             "cruxeval-i": 10.0, "bigcodebench": 60.0}
MEMORY_MB = 4096  # one run holds the reference's and the answer's outputs of the largest EvalPlus inputs
FLOAT_ATOL = 1e-6  # EvalPlus's tolerance for float outputs when a problem gives atol 0


class BenchmarkError(ValueError):
    """A benchmark file that cannot be read as the benchmark named; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class BenchTask:
    """One benchmark problem.

    Attributes:
        task_id: the benchmark's id (`HumanEval/0`, `Mbpp/2`, `sample_0`, `BigCodeBench/13`).
        messages: the chat messages of the benchmark's standard prompt (`jaxrl.prompts`).
        kind: what an answer is: `code`, or CRUXEval's `output` / `input` expression.
        entry_point: the function the tests call (CRUXEval's `f`, run by the judge itself).
        tests: what the answer's program runs against (built by `tests_from_json`).
        reference: an answer that passes: the canonical program, or CRUXEval's true expression.
        timeout_s: seconds of the one sandbox run that grades an answer.
        source: CRUXEval's code, which an answer's program starts with ("" for the others).
        sanitize: a program taken from a response keeps only its imports, definitions and
            assignments (`sanitized`; EvalPlus's benchmarks).
    """

    task_id: str
    messages: list[dict[str, str]]
    kind: str
    entry_point: str
    tests: Tests
    reference: str
    timeout_s: float
    source: str = ""
    sanitize: bool = False

    @property
    def is_clean(self) -> bool:
        """Never: a benchmark problem samples with the buggy tasks' budgets (`evaluate.batches`)."""
        return False


def load_benchmark(name: str, path: str | os.PathLike) -> list[BenchTask]:
    """The problems of benchmark `name` from the file at `path` (`.jsonl` or `.jsonl.gz`), in file order."""
    if name not in BENCHMARKS:
        raise BenchmarkError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    records = read_records(path)
    build = {"humaneval+": evalplus_task, "humaneval": evalplus_task, "mbpp+": evalplus_task, "mbpp": evalplus_task,
             "cruxeval-o": cruxeval_task, "cruxeval-i": cruxeval_task, "bigcodebench": bigcodebench_task}[name]
    tasks = []
    for lineno, record in records:
        try:
            tasks.append(build(name, record))
        except (KeyError, TypeError, ValueError, SyntaxError) as e:
            raise BenchmarkError(f"{path}:{lineno}: not a {name} record ({type(e).__name__}: {e})") from None
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise BenchmarkError(f"{path}: task ids repeat")
    return tasks


def read_records(path: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of each non-blank line of a JSONL file, gzipped when its name ends in .gz."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise BenchmarkError(f"{path}: {e}") from None
    out = []
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise BenchmarkError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
    return out


def evalplus_task(name: str, record: dict[str, Any]) -> BenchTask:
    """A HumanEval+ or MBPP+ problem; `humaneval` / `mbpp` keep the base inputs only."""
    inputs = _inputs(record["base_input"]) + (_inputs(record["plus_input"]) if name.endswith("+") else [])
    canonical, entry = record["canonical_solution"], record["entry_point"]
    # HumanEval's canonical solution is the body under the prompt's signature; MBPP's a whole program.
    reference = canonical if _defines(canonical, entry) else record["prompt"] + canonical
    atol = float(record.get("atol") or 0)
    tests = evalplus_tests(reference, entry, inputs, atol, argument_shapes(record.get("assertion", ""), entry, inputs))
    problem = record["prompt"].strip()
    return BenchTask(record["task_id"], prompts.benchmark_messages("evalplus", problem=problem), CODE, entry, tests,
                     reference, TIMEOUT_S[name], sanitize=True)


def _inputs(value: Any) -> list[Any]:
    """A list of argument lists (MBPP+ writes an empty `{}` where a problem has no plus inputs)."""
    if not value:
        return []
    if not isinstance(value, list) or not all(isinstance(args, list) for args in value):
        raise ValueError("inputs must be a list of argument lists")
    return value


def _parse(source: str) -> ast.Module:
    """A benchmark's program parsed, quietly (MBPP's solutions hold regexes with invalid string escapes)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(source)


def _defines(source: str, name: str) -> bool:
    """Whether `source` is a program that defines function `name` at its top level."""
    try:
        tree = _parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body)


# The judge's side of an EvalPlus check. The reference runs in its own namespace so that its names
# never shadow the program's, and every call gets a fresh deep copy of the input.
_EVALPLUS_CHECK = '''\
import copy as _copy
import json as _json

import ast as _ast

_candidate = {entry}
_reference_names = {{"__name__": "reference"}}
exec({reference!r}, _reference_names)
_reference = _reference_names[{entry!r}]
_ATOL = {atol!r}


def _is_floats(x):
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(v, float) for v in x)


_RULE = {rule!r}
_SHAPES = {shapes!r}


def _tuples(value, deep):
    if not isinstance(value, list):
        return value
    return tuple(_tuples(v, deep) if deep else v for v in value)


def _shaped(args):
    """The input as the problem's own assertion passes it: tuples and numbers written as text rebuilt."""
    args = list(args)
    for i, shape in enumerate(_SHAPES[:len(args)]):
        if shape == "number" and isinstance(args[i], str):
            args[i] = _ast.literal_eval(args[i])
        elif shape in ("tuple", "deep_tuple"):
            args[i] = _tuples(args[i], shape == "deep_tuple")
    return args


def _close(out, expected, args):
    if _RULE == "root":  # any root is an answer: the reference's poly must vanish there
        return isinstance(out, (int, float)) and abs(_reference_names["poly"](*args, out)) <= (_ATOL or {float_atol!r})
    if _RULE == "none":  # a match object or None: only whether there is a match counts
        return (out is None) == (expected is None)
    if out == expected:
        return True
    if _RULE == "set":
        return isinstance(out, (list, tuple, set)) and type(out) is type(expected) and set(out) == set(expected)
    atol = _ATOL or ({float_atol!r} if _is_floats(expected) else 0)
    if not atol or type(out) is not type(expected):
        return False
    pairs = list(zip(out, expected)) if isinstance(expected, (list, tuple)) else [(out, expected)]
    if isinstance(expected, (list, tuple)) and len(out) != len(expected):
        return False
    return all(isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= atol + 1e-7 * abs(b)
               for a, b in pairs)


def _crosses(value):
    """Whether a value lies within the proxy's limits on one message (values, integer bits, bytes), with room."""
    count, size, stack = 0, 0, [value]
    while stack:
        v = stack.pop()
        count += 1
        if count > {max_items} * 9 // 10 or (isinstance(v, int) and v.bit_length() > {max_int_bits}):
            return False
        if isinstance(v, (str, bytes, bytearray)):
            size += len(v) if isinstance(v, str) and v.isascii() else 6 * len(v)  # escaped on the wire
            if size > {max_bytes} // 2:
                return False
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return True


for _i, _args in enumerate(_json.loads({inputs!r})):
    _args = _shaped(_args)
    _expected = _reference(*_copy.deepcopy(_args))
    if not (_crosses(_args) and _crosses(_expected)):
        continue  # an answer this large cannot cross the proxy: the input is not checked
    _out = _candidate(*_copy.deepcopy(_args))
    assert _close(_out, _expected, _args), f"input {{_i}}: got {{_out!r:.200}}, expected {{_expected!r:.200}}"
'''


def comparison_rule(entry_point: str) -> str:
    """How an answer is compared with the reference's output: `equal` (exactly, or within atol), or one
    of EvalPlus's exceptions: `root` (HumanEval/32: any root of the polynomial), `none` (MBPP's regex
    problems: a match or not), `set` (MBPP problems whose reference returns a set's iteration order,
    which string hashing makes differ between processes)."""
    if entry_point == "find_zero":
        return "root"
    if entry_point in ("check_str", "text_match_three", "text_starta_endb"):
        return "none"
    if entry_point in ("similar_elements", "find_dissimilar", "Diff", "find_char_long", "common_in_nested_lists"):
        return "set"
    return "equal"


def argument_shapes(assertion: str, entry_point: str, inputs: Sequence[Any]) -> list[str | None]:
    """Per argument, what the problem's own assertion passes where the JSON inputs cannot say it:
    `tuple` / `deep_tuple` (a tuple, of tuples), `number` (a number that the inputs write as text,
    as MBPP+ writes complex numbers: every text input in that place reads as a number), or None.
    MBPP+ stores its inputs as JSON, which has no tuples or complex numbers."""
    try:
        tree = _parse(assertion)
    except SyntaxError:
        return []
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == entry_point]
    if not calls:
        return []
    shapes: list[str | None] = []
    for arg in calls[0].args:
        try:
            value = ast.literal_eval(arg)
        except ValueError:
            shapes.append(None)
            continue
        if isinstance(value, tuple):
            shapes.append("deep_tuple" if any(isinstance(v, tuple) for v in value) else "tuple")
        elif isinstance(value, (int, float, complex)) and not isinstance(value, bool):
            place = len(shapes)
            texts = [args[place] for args in inputs if len(args) > place and isinstance(args[place], str)]
            shapes.append("number" if texts and all(_is_number(t) for t in texts) else None)
        else:
            shapes.append(None)
    return shapes


def _is_number(text: str) -> bool:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return isinstance(value, (int, float, complex)) and not isinstance(value, bool)


def evalplus_tests(reference: str, entry_point: str, inputs: Sequence[Any], atol: float,
                   shapes: Sequence[str | None] = ()) -> AssertTests:
    """Tests checking the program's `entry_point` against the reference on every input.

    They run in `proxy` mode, except for an entry point named like a built-in (MBPP's `sum`),
    which proxy mode never binds: that one runs `inprocess` (forgeable, docs/sandbox.md).
    """
    if not entry_point.isidentifier():
        raise ValueError(f"entry point {entry_point!r} is not a name")
    if not _defines(reference, entry_point):
        raise ValueError(f"the canonical solution does not define {entry_point}")
    code = _EVALPLUS_CHECK.format(entry=entry_point, reference=reference, atol=atol, float_atol=FLOAT_ATOL,
                                  inputs=json.dumps(inputs), max_items=MAX_ITEMS, max_int_bits=MAX_INT_BITS,
                                  max_bytes=MAX_BYTES, rule=comparison_rule(entry_point), shapes=list(shapes))
    return AssertTests(code, "inprocess" if hasattr(builtins, entry_point) else "proxy")


def cruxeval_task(name: str, record: dict[str, Any]) -> BenchTask:
    """A CRUXEval problem as output prediction (`cruxeval-o`) or input prediction (`cruxeval-i`)."""
    code, given_input, output = record["code"], record["input"], record["output"]
    for text in (code, f"f({given_input})", f"({output})"):
        ast.parse(text)
    if name == "cruxeval-o":
        messages = prompts.benchmark_messages("cruxeval_o", code=code, input=given_input)
        check = f"{code}\n\nassert f({given_input}) == ANSWER\n"
        return BenchTask(record["id"], messages, OUTPUT, "f", AssertTests(check), output, TIMEOUT_S[name], code)
    messages = prompts.benchmark_messages("cruxeval_i", code=code, output=output)
    check = f"{code}\n\nassert f(*ANSWER[0], **ANSWER[1]) == ({output})\n"
    return BenchTask(record["id"], messages, INPUT, "f", AssertTests(check), given_input, TIMEOUT_S[name], code)


def bigcodebench_task(name: str, record: dict[str, Any]) -> BenchTask:
    """A BigCodeBench problem under its instruct prompt, tested by its `TestCases` class."""
    tests = tests_from_json({"kind": "unittest", "code": record["test"]})
    messages = prompts.benchmark_messages("evalplus", problem=record["instruct_prompt"].strip())
    return BenchTask(record["task_id"], messages, CODE, record["entry_point"], tests,
                     record["complete_prompt"] + record["canonical_solution"], TIMEOUT_S[name])


def unittest_supported() -> bool:
    """Whether this checkout's sandbox runs `{"kind": "unittest"}` tests (BigCodeBench needs them)."""
    try:
        tests_from_json({"kind": "unittest", "code": ""})
    except ValueError:
        return False
    return True


_ANSWER_BLOCK = re.compile(r"\[ANSWER\](.*?)(?:\[/ANSWER\]|$)", re.DOTALL)


def cruxeval_answer(text: str, kind: str) -> str | None:
    """CRUXEval's answer in a response's text: the output expression or the argument list, None if none.

    The last `[ANSWER]` block (to the end of the text when it is not closed; the whole text when there
    is none) holds `assert f(ARGS) == OUTPUT`, from its last line that starts with `assert`. Parsed,
    the answer is OUTPUT or ARGS; unparsable, the text after the last `==`, or between `f(` and the
    last `)` before it, as CRUXEval's own reader splits it. An output block with no assertion is the
    expression itself.
    """
    blocks = _ANSWER_BLOCK.findall(text)
    body = (blocks[-1] if blocks else text).strip().strip("`").strip()
    if body.startswith("python\n"):
        body = body[len("python\n"):]
    lines = body.split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip().startswith("assert")]
    if not starts:
        return (body or None) if kind == OUTPUT else None
    assertion = "\n".join(lines[starts[-1]:]).strip()
    call = _assertion_parts(assertion)
    if call is not None:
        return call[1] if kind == INPUT else call[2]
    if "==" not in assertion:
        return None
    left, _, right = assertion.rpartition("==")
    if kind == OUTPUT:
        return right.strip() or None
    start, end = left.find("f("), left.rfind(")")
    return left[start + 2:end].strip() if 0 <= start < end else None


def _assertion_parts(assertion: str) -> tuple[str, str, str] | None:
    """(function, argument source, output source) of `assert f(ARGS) == OUTPUT`, None when it is not one."""
    try:
        node = ast.parse(assertion).body[0]
    except (SyntaxError, IndexError, ValueError):
        return None
    test = getattr(node, "test", None)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.left, ast.Call)):
        return None
    call = test.left
    segment = ast.get_source_segment(assertion, call)
    func = ast.get_source_segment(assertion, call.func)
    if segment is None or func is None:
        return None
    arguments = segment[len(func):].strip()[1:-1].strip()
    return func, arguments, ast.get_source_segment(assertion, test.comparators[0]) or ""


# What a sanitized program keeps at its top level: the definitions a test can call and what they use.
_KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def sanitized(program: str) -> str:
    """A generated program without its top-level statements other than imports, definitions and
    assignments (a demo under `if __name__ == "__main__":`, a call reading stdin, printed checks),
    as EvalPlus sanitizes generated code before testing it; unparsable code is kept as it is."""
    try:
        tree = _parse(program)
    except (SyntaxError, ValueError):
        return program
    lines = program.split("\n")
    kept = [node for node in tree.body if isinstance(node, _KEPT)]
    if len(kept) == len(tree.body):
        return program
    parts = []
    for node in kept:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        parts.append("\n".join(lines[first - 1:node.end_lineno]))
    return "\n\n".join(parts) + "\n"


def answer_of(task: BenchTask, prediction: Prediction) -> str | None:
    """The answer a prediction gives: its `code` as is, else the program (sanitized; EvalPlus's
    benchmarks only) or CRUXEval expression in its `response` after the thinking; None when none."""
    if prediction.code is not None:
        return prediction.code
    response = prediction.response or ""
    if task.kind == CODE:
        program = extract_program(response, bool(prediction.think_opened))
        return program if program is None or not task.sanitize else sanitized(program)
    text = answer_text(response, bool(prediction.think_opened))
    return None if text is None else cruxeval_answer(text, task.kind)


def program_of(task: BenchTask, answer: str) -> str:
    """The program an answer runs as: the code itself, or CRUXEval's code followed by the answer's
    expression bound to `ANSWER` (for `input`, the (positional, keyword) arguments of a call with that
    argument list): an expression may use the code's names, as it can in CRUXEval's own grading."""
    if task.kind == CODE:
        return answer
    if task.kind == OUTPUT:
        return f"{task.source}\n\nANSWER = (\n{answer}\n)\n"
    return f"{task.source}\n\nANSWER = (lambda *args, **kwargs: (args, kwargs))(\n{answer}\n)\n"


def job_of(task: BenchTask, answer: str) -> Job:
    """The sandbox run that grades one answer."""
    return Job(program_of(task, answer).rstrip(" \t\r\n"), task.tests,
               Limits(timeout_s=task.timeout_s, memory_mb=MEMORY_MB))
