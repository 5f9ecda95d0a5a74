"""Line diffs, edits and blocks (docs/reward.md, "Lines, edits and blocks").

Programs are split into lines as Python splits them (`\\r\\n`, `\\r` and `\\n`
all end a line) and compared on their non-blank lines, trailing whitespace
stripped except where it is program text (a line end inside a string literal,
or after a line-continuation backslash), each keeping its 1-based line number
in its own program. A line weighs as many edits as a reader sees statements on
it (`line_weights`), so packing code onto one line does not hide its size; a
block's size is the sum of its edits' weights. Every non-equal
opcode of `difflib.SequenceMatcher` becomes line edits; a `replace` opcode
pairs lines into `modify` edits by the optimal monotone pairing (exact
`Fraction` sums of `SequenceMatcher.ratio`, ties to the lexicographically
smallest pairing). An opcode's edits form one `Block`, split wherever a blank
line of C lies between the positions of two consecutive edits.

Choices the spec leaves open: `apply` writes a modified or inserted line with
P's own text (indentation and trailing whitespace as written in P) and keeps
every other C line byte for byte; an insert after C line p goes right after
line p, before any blank lines that follow it; two edits that modify or delete
the same C line are a `ValueError` (the scorer never builds such a set,
because blocks whose spans overlap always align).
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import difflib
import functools
import io
import tokenize
from collections import Counter
from collections.abc import Iterable, Sequence
from fractions import Fraction

MODIFY, DELETE, INSERT = "modify", "delete", "insert"


@dataclasses.dataclass(frozen=True)
class Edit:
    """One line edit of C.

    Attributes:
        kind: "modify", "delete" or "insert".
        line: the C line modified or deleted, or the C line an insert follows (0 = top).
        old: the stripped C text (modify, delete), else None.
        new: the stripped P text (modify, insert), else None.
        raw: the new text as written in P (modify, insert), else None.
        weight: the statements a reader sees it change (`line_weights`): the new line's for an insert,
            the old line's for a delete, the larger of the two for a modify.
    """

    kind: str
    line: int
    old: str | None = None
    new: str | None = None
    raw: str | None = None
    weight: int = 1

    @property
    def position(self) -> float:
        """Position in C: the line itself, or an insert's anchor + 0.5."""
        return self.line + 0.5 if self.kind == INSERT else float(self.line)

    @property
    def signature(self) -> tuple[str, str | None, str | None]:
        """What the edit does, wherever it stands."""
        return self.kind, self.old, self.new


@dataclasses.dataclass(frozen=True)
class Block:
    """The edits of one non-equal opcode, in position order."""

    edits: tuple[Edit, ...]

    def __len__(self) -> int:
        return len(self.edits)

    @property
    def size(self) -> int:
        """|δ|: the sum of its edits' weights."""
        return sum(e.weight for e in self.edits)

    @property
    def span(self) -> tuple[float, float]:
        """Closed interval of the C lines it modifies or deletes; [p+0.5, p+0.5] if it only inserts after p."""
        lines = [e.line for e in self.edits if e.kind != INSERT]
        if lines:
            return float(min(lines)), float(max(lines))
        return self.edits[0].position, self.edits[0].position

    @property
    def signature(self) -> tuple[tuple[str, str | None, str | None], ...]:
        return tuple(e.signature for e in self.edits)


def normalize_newlines(text: str) -> str:
    """`\\r\\n` and lone `\\r` as `\\n`: the line ends Python's tokenizer sees (it reads a `\\r` inside a
    string literal as `\\n` too, so the program means the same)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


_PY_SPACE = " \t\f"  # the whitespace Python ignores at a line's end; any other character there is program text


def split_lines(program: str) -> list[str]:
    """All lines of a program (line ends normalized; a final newline gives a last empty line).

    Trailing spaces, tabs and form feeds are stripped, except on a line whose end lies inside a string
    literal or that ends with a line-continuation backslash: there they change what the program means.
    """
    return list(_lines(program)[0])


def nonblank_lines(program: str) -> list[tuple[int, str]]:
    """(1-based line number, text as `split_lines` gives it) of every non-blank line.

    A line is blank when nothing but whitespace is left of it, its end is not inside a string literal
    and the line before does not end with a backslash (a line continued by an empty one is an error).
    """
    texts, blank, _ = _lines(program)
    return [(n, text) for n, text in enumerate(texts, start=1) if n not in blank]


def line_weights(program: str) -> dict[int, int]:
    """Non-blank line number -> its weight: the statements starting on it (`;`-separated simple
    statements, a compound header and the body on its line), plus the size of the code of every
    `exec`, `eval` or `compile` of a string literal called there; at least 1."""
    return dict(_lines(program)[2])


def program_size(program: str) -> int:
    """The sum of the weights of a program's non-blank lines (the edits it takes to write it anew)."""
    return sum(w for _, w in _lines(program)[2])


@functools.lru_cache(maxsize=1 << 12)
def _lines(program: str) -> tuple[tuple[str, ...], frozenset[int], tuple[tuple[int, int], ...]]:
    """(texts of all lines, numbers of the blank ones, (number, weight) of the others)."""
    program = normalize_newlines(program)
    in_string = _rows_ending_in_string(program)
    texts: list[str] = []
    blank: set[int] = set()
    continued = False  # the line before ends with a backslash: Python joins this one to it, even if empty
    for n, line in enumerate(program.split("\n"), start=1):
        stripped = line.rstrip(_PY_SPACE)
        texts.append(line if n in in_string or stripped.endswith("\\") else stripped)
        if n not in in_string and not continued and not stripped.strip(_PY_SPACE):
            blank.add(n)
        continued = stripped.endswith("\\")
    nonblank = [(n, text) for n, text in enumerate(texts, start=1) if n not in blank]
    counts = _statement_counts(program, nonblank)
    return tuple(texts), frozenset(blank), tuple((n, max(1, counts[n])) for n, _ in nonblank)


def _rows_ending_in_string(program: str) -> set[int]:
    """The lines whose end lies inside a string literal: all lines of a multi-line string but its last.

    A program that does not tokenize keeps the rows found before the error.
    """
    rows: set[int] = set()
    if '"""' not in program and "'''" not in program and "\\\n" not in program:
        return rows  # only a triple quote or a backslash-newline lets a string span lines
    fstring_starts: list[int] = []  # Python >= 3.12 tokenizes an f-string in parts
    try:
        for tok in tokenize.generate_tokens(io.StringIO(program).readline):
            if tok.type == tokenize.STRING:
                rows.update(range(tok.start[0], tok.end[0]))
            elif tok.type == getattr(tokenize, "FSTRING_START", None):
                fstring_starts.append(tok.start[0])
            elif tok.type == getattr(tokenize, "FSTRING_END", None) and fstring_starts:
                rows.update(range(fstring_starts.pop(), tok.end[0]))
    except (tokenize.TokenError, SyntaxError):
        pass
    return rows


_PARSE_ERRORS = (SyntaxError, ValueError, RecursionError, MemoryError)
_LINE_CONTEXTS = ("", "async def _():\n ", "if 1: pass\n", "try: pass\n")  # what a lone line may need before it
_CODE_RUNNERS = frozenset({"exec", "eval", "compile"})


def _statement_counts(program: str, nonblank: Sequence[tuple[int, str]]) -> Counter[int]:
    """Line number -> statements starting on it plus the size of the literal code run there.

    The program is parsed whole. When it does not parse, each non-blank line is parsed alone, in the
    first of `_LINE_CONTEXTS` that accepts it (so `return a; b` counts 2); a line that parses in none
    counts 0, which weighs 1.
    """
    try:
        return _counts_in(ast.parse(program))
    except _PARSE_ERRORS:
        pass
    counts: Counter[int] = Counter()
    for n, text in nonblank:
        for context in _LINE_CONTEXTS:
            try:
                tree = ast.parse(context + text.strip(_PY_SPACE))
            except _PARSE_ERRORS:
                continue
            counts[n] = _counts_in(tree)[context.count("\n") + 1]
            break
    return counts


def _counts_in(tree: ast.AST) -> Counter[int]:
    """Line number -> statements starting on it, plus `program_size` of the literal code of every
    `exec`/`eval`/`compile` call starting on it."""
    counts: Counter[int] = Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            counts[node.lineno] += 1
        elif (code := _literal_code(node)) is not None:
            counts[node.lineno] += program_size(code)
    return counts


def _literal_code(node: ast.AST) -> str | None:
    """The source of `exec`, `eval` or `compile` (by name or attribute) called on a str or bytes
    literal, else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    source = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "source"), None)
    if name not in _CODE_RUNNERS or not isinstance(source, ast.Constant):
        return None
    if isinstance(source.value, bytes):
        return source.value.decode("utf-8", "replace")
    return source.value if isinstance(source.value, str) else None


@functools.lru_cache(maxsize=1 << 16)
def ratio(a: str, b: str) -> Fraction:
    """`difflib.SequenceMatcher(None, a, b).ratio()` as an exact fraction (memoized: a group's rollouts
    pair the same lines again and again)."""
    total = len(a) + len(b)
    if not total:
        return Fraction(1)
    matches = sum(m.size for m in difflib.SequenceMatcher(None, a, b).get_matching_blocks())
    return Fraction(2 * matches, total)


def pair_lines(removed: Sequence[str], added: Sequence[str]) -> list[tuple[int, int]]:
    """The monotone pairing of min(|R|, |A|) lines maximizing Σ ratio.

    Ties go to the pairing whose sorted (index in R, index in A) list is
    lexicographically smallest: at every step the earliest partner that keeps
    the optimum is taken.

    Returns:
        (index in removed, index in added) pairs in increasing order.
    """
    swapped = len(removed) > len(added)
    short, long_ = (added, removed) if swapped else (removed, added)
    k, slack = len(short), len(long_) - len(short)
    # best[i][d]: the best sum pairing short[i:] with long_[i + d:]; take[i][d]: pair short[i] with long_[i + d].
    best = [[Fraction(0)] * (slack + 1) for _ in range(k + 1)]
    take = [[False] * (slack + 1) for _ in range(k)]
    for i in range(k - 1, -1, -1):
        for d in range(slack, -1, -1):
            a, b = (long_[i + d], short[i]) if swapped else (short[i], long_[i + d])
            taken = ratio(a, b) + best[i + 1][d]
            if d == slack or taken >= best[i][d + 1]:
                best[i][d], take[i][d] = taken, True
            else:
                best[i][d] = best[i][d + 1]
    pairs, d = [], 0
    for i in range(k):
        while not take[i][d]:
            d += 1
        pairs.append((i + d, i) if swapped else (i, i + d))
    return pairs


def diff(c: str, p: str) -> list[Block]:
    """The blocks of diff(C, P), in C order."""
    return list(_diff(c, p))


@functools.lru_cache(maxsize=1 << 12)
def _diff(c: str, p: str) -> tuple[Block, ...]:
    """`diff`, memoized: every score of a task diffs its reference fix, and a group often repeats a program."""
    c_lines, p_lines = nonblank_lines(c), nonblank_lines(p)
    blank = sorted(_lines(c)[1])
    c_weight, p_weight = line_weights(c), line_weights(p)
    p_raw = normalize_newlines(p).split("\n")
    matcher = difflib.SequenceMatcher(None, [t for _, t in c_lines], [t for _, t in p_lines], autojunk=False)
    blocks = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        before = c_lines[i1 - 1][0] if i1 > 0 else 0
        removed, added = c_lines[i1:i2], p_lines[j1:j2]
        pairs = pair_lines([t for _, t in removed], [t for _, t in added])
        partner_of_r = dict(pairs)
        partner_of_a = {a: r for r, a in pairs}
        edits: list[Edit] = []
        for r, (n, text) in enumerate(removed):
            if r in partner_of_r:
                m, new = added[partner_of_r[r]]
                edits.append(Edit(MODIFY, n, text, new, p_raw[m - 1], max(c_weight[n], p_weight[m])))
            else:
                edits.append(Edit(DELETE, n, text, weight=c_weight[n]))
        anchor = before
        for a, (m, new) in enumerate(added):
            if a in partner_of_a:
                anchor = removed[partner_of_a[a]][0]
            else:
                edits.append(Edit(INSERT, anchor, None, new, p_raw[m - 1], p_weight[m]))
        edits.sort(key=lambda e: e.position)  # stable: inserts at one place keep their order
        blocks.extend(Block(part) for part in split_at_blank_lines(edits, blank))
    return tuple(blocks)


def split_at_blank_lines(edits: Sequence[Edit], blank: Sequence[int]) -> list[tuple[Edit, ...]]:
    """Cut edits (in position order) wherever a blank C line (sorted numbers) lies between two consecutive ones."""
    parts: list[list[Edit]] = []
    for edit in edits:
        if not parts or _blank_between(blank, parts[-1][-1].position, edit.position):
            parts.append([])
        parts[-1].append(edit)
    return [tuple(part) for part in parts]


def _blank_between(blank: Sequence[int], a: float, b: float) -> bool:
    """Whether some blank line number (sorted) lies strictly between positions a and b."""
    k = bisect.bisect_right(blank, a)
    return k < len(blank) and blank[k] < b


def edits_of(blocks: Iterable[Block]) -> list[Edit]:
    """All edits of some blocks, in position order (blocks given in C order)."""
    return [e for block in blocks for e in block.edits]


def apply(c: str, *edit_groups: Iterable[Edit]) -> str:
    """Build a program from C's lines (blank ones included) and the edits.

    C's line ends are normalized first, as `diff` numbers its lines. Groups
    are given in precedence order: where inserts of several groups meet at one
    place, the earlier group's come first (the scorer passes reference edits
    before predicted ones).
    """
    lines = normalize_newlines(c).split("\n")
    replaced: dict[int, str | None] = {}
    inserted: dict[int, list[str]] = {}
    for group in edit_groups:
        for e in group:
            if e.kind == INSERT:
                inserted.setdefault(e.line, []).append(e.raw)
                continue
            if e.line in replaced:
                raise ValueError(f"two edits change C line {e.line}")
            replaced[e.line] = e.raw if e.kind == MODIFY else None
    out = list(inserted.get(0, []))
    for n, line in enumerate(lines, start=1):
        if n not in replaced:
            out.append(line)
        elif replaced[n] is not None:
            out.append(replaced[n])
        out.extend(inserted.get(n, []))
    return "\n".join(out)
