"""Line diffs, edits and blocks (docs/reward.md, "Lines, edits and blocks").

Programs are compared on their non-blank lines (trailing whitespace stripped),
each keeping its 1-based line number in its own program. Every non-equal
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

import bisect
import dataclasses
import difflib
import functools
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
    """

    kind: str
    line: int
    old: str | None = None
    new: str | None = None
    raw: str | None = None

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
    def span(self) -> tuple[float, float]:
        """Closed interval of the C lines it modifies or deletes; [p+0.5, p+0.5] if it only inserts after p."""
        lines = [e.line for e in self.edits if e.kind != INSERT]
        if lines:
            return float(min(lines)), float(max(lines))
        return self.edits[0].position, self.edits[0].position

    @property
    def signature(self) -> tuple[tuple[str, str | None, str | None], ...]:
        return tuple(e.signature for e in self.edits)


def split_lines(program: str) -> list[str]:
    """All lines of a program, trailing whitespace stripped (`str.split("\\n")`, so a final newline gives a last empty line)."""
    return [line.rstrip() for line in program.split("\n")]


def nonblank_lines(program: str) -> list[tuple[int, str]]:
    """(1-based line number, stripped text) of every non-blank line."""
    return [(n, text) for n, text in enumerate(split_lines(program), start=1) if text]


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
    blank = [n for n, text in enumerate(split_lines(c), start=1) if not text]
    p_raw = p.split("\n")
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
                edits.append(Edit(MODIFY, n, text, new, p_raw[m - 1]))
            else:
                edits.append(Edit(DELETE, n, text))
        anchor = before
        for a, (m, new) in enumerate(added):
            if a in partner_of_a:
                anchor = removed[partner_of_a[a]][0]
            else:
                edits.append(Edit(INSERT, anchor, None, new, p_raw[m - 1]))
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

    Groups are given in precedence order: where inserts of several groups meet
    at one place, the earlier group's come first (the scorer passes reference
    edits before predicted ones).
    """
    lines = c.split("\n")
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
