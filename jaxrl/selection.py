"""Training data for the supervised baselines, selected from a scored sample pool (paper, C.2).

Pure functions over pool rows (`DIR/pool.jsonl`, written by `precisecoder pool`):

- `select_sft`: rejection-sampling SFT targets, the top passing samples of each task;
- `select_dpo`: DPO (chosen, rejected) pairs from each task's ranking by unit + F1/2;
- `recap_candidates` and `mix_recap`: the RECAP refiner's (candidate fix → minimal fix) examples.

Tie-breaks (docs/baselines.md): samples with equal ranking scores keep the lower `sample`
index first; a DPO pair whose two scores are equal is skipped. Tasks come out in the order
they first appear in the pool. A missing or null score (`precision`, `recall`, `f1`) counts
0 when ranking; a row without `unit` or `valid` counts as failing (unit 0, not valid).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from jaxrl.prompts import messages
from reward.extract import extract_program
from reward.schema import SchemaError, Task, read_jsonl

RANK_KEYS = ("precision", "f1")
RECAP_KINDS = ("trim", "repair", "keep")


class SelectionError(ValueError):
    """A pool or argument that selection cannot use; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class PoolRow:
    """One scored sample of the pool (the fields selection reads)."""

    task_id: str
    sample: int
    text: str
    unit: int = 0
    valid: bool = False
    precision: float | None = None
    recall: float | None = None
    f1: float | None = None
    edited_lines: int | None = None
    think_opened: bool = False

    @property
    def passing(self) -> bool:
        """Valid and passes its tests: what rejection sampling keeps."""
        return self.valid and self.unit == 1


def _number(obj: dict[str, Any], field: str, where: str) -> float | None:
    value = obj.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SelectionError(f"{where}: {field} must be a finite number or null, got {value!r}")
    return float(value)


def row_from_json(obj: Any, where: str) -> PoolRow:
    """A pool row from its JSON object; `where` (file:line) prefixes the error of a bad one."""
    if not isinstance(obj, dict):
        raise SelectionError(f"{where}: a pool row must be a JSON object")
    for field, kind in (("task_id", str), ("sample", int), ("text", str)):
        value = obj.get(field)
        if value is None:
            raise SelectionError(f"{where}: missing {field}")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise SelectionError(f"{where}: {field} must be a {kind.__name__}, got {value!r}")
    unit = _number(obj, "unit", where)
    if unit not in (None, 0.0, 1.0):
        raise SelectionError(f"{where}: unit must be 0 or 1, got {obj['unit']!r}")
    valid = obj.get("valid")
    if valid is not None and not isinstance(valid, bool):
        raise SelectionError(f"{where}: valid must be true or false, got {valid!r}")
    edited = _number(obj, "edited_lines", where)
    return PoolRow(task_id=obj["task_id"], sample=obj["sample"], text=obj["text"], unit=int(unit or 0),
                   valid=bool(valid), precision=_number(obj, "precision", where), recall=_number(obj, "recall", where),
                   f1=_number(obj, "f1", where), edited_lines=None if edited is None else int(edited),
                   think_opened=bool(obj.get("think_opened", False)))


def pool_file(pool: str | os.PathLike) -> Path:
    """`DIR/pool.jsonl` for a pool directory, or the file itself when given one."""
    path = Path(pool).expanduser()
    return path / "pool.jsonl" if path.is_dir() else path


def read_pool(pool: str | os.PathLike) -> list[PoolRow]:
    """The rows of a pool, validated; a repeated (task_id, sample) is an error (two pools concatenated)."""
    path = pool_file(pool)
    if not path.is_file():
        raise SelectionError(f"no pool at {path} (run `precisecoder pool` first)")
    rows: list[PoolRow] = []
    seen: set[tuple[str, int]] = set()
    try:
        for number, obj in read_jsonl(path):
            where = f"{path}:{number}"
            row = row_from_json(obj, where)
            if (row.task_id, row.sample) in seen:
                raise SelectionError(f"{where}: task {row.task_id!r} sample {row.sample} appears twice")
            seen.add((row.task_id, row.sample))
            rows.append(row)
    except SchemaError as e:
        raise SelectionError(str(e)) from None
    return rows


def by_task(rows: Iterable[PoolRow]) -> dict[str, list[PoolRow]]:
    """Rows grouped by task, tasks in order of first appearance, each task's rows by `sample`."""
    groups: dict[str, list[PoolRow]] = {}
    for row in rows:
        groups.setdefault(row.task_id, []).append(row)
    return {task: sorted(group, key=lambda r: r.sample) for task, group in groups.items()}


def ranked(rows: Sequence[PoolRow], score: Callable[[PoolRow], float]) -> list[PoolRow]:
    """Rows by `score(row)` descending; equal scores keep the lower sample index first."""
    return sorted(rows, key=lambda r: (-score(r), r.sample))


def dpo_score(row: PoolRow) -> float:
    """The DPO ranking score, unit + F1/2 (a missing F1 counts 0)."""
    return row.unit + (row.f1 or 0.0) / 2


def select_sft(rows: Sequence[PoolRow], rank_by: str = "precision", top: int = 2) -> list[dict[str, Any]]:
    """Rejection-sampling SFT targets: per task, the `top` passing samples ranked by `rank_by`.

    Failing or invalid samples are dropped; a task with no passing sample gives nothing,
    one with fewer than `top` gives all it has.
    """
    if rank_by not in RANK_KEYS:
        raise SelectionError(f"rank_by must be one of {', '.join(RANK_KEYS)}, got {rank_by!r}")
    if top < 1:
        raise SelectionError(f"top must be >= 1, got {top}")
    out = []
    for task_id, group in by_task(rows).items():
        passing = [r for r in group if r.passing]
        for row in ranked(passing, lambda r: getattr(r, rank_by) or 0.0)[:top]:
            out.append({"task_id": task_id, "sample": row.sample, "text": row.text})
    return out


def select_dpo(rows: Sequence[PoolRow]) -> list[dict[str, Any]]:
    """DPO pairs: per task, rank its n samples by unit + F1/2 and pair 1st vs (n−1)th, 2nd vs nth.

    With the paper's n = 16 these are 1st vs 15th and 2nd vs 16th. A pair is skipped when its
    two samples are the same one (n < 3) or their scores are equal (no preference to learn).
    """
    out = []
    for task_id, group in by_task(rows).items():
        order = ranked(group, dpo_score)
        n = len(order)
        for hi, lo in ((0, n - 2), (1, n - 1)):
            if lo <= hi:
                continue
            chosen, rejected = order[hi], order[lo]
            if dpo_score(chosen) == dpo_score(rejected):
                continue
            out.append({"task_id": task_id, "chosen_sample": chosen.sample, "rejected_sample": rejected.sample,
                        "chosen": chosen.text, "rejected": rejected.text})
    return out


@dataclasses.dataclass(frozen=True)
class RecapCandidate:
    """One refiner example before mixing: a candidate fix, its kind and its target program."""

    task_id: str
    kind: str
    candidate_sample: int
    candidate: str
    target: str
    target_source: str


def _minimal(row: PoolRow) -> bool:
    """A passing sample every edited line of which is verified as needed (precision 1; no edit on a clean task)."""
    if row.precision is None:
        return row.edited_lines == 0
    return row.precision == 1.0


def recap_candidates(rows: Sequence[PoolRow], tasks: Sequence[Task]) -> list[RecapCandidate]:
    """The refiner's candidate examples of each task, as C.2 describes.

    A sample with a program is one of: `keep` (passing and already minimal: target itself),
    `trim` (passing but over-edited) or `repair` (failing). The target of `trim` and `repair`
    is the task's most precise passing sample when it is minimal (fewer edited lines first,
    then the lower sample), else the ground-truth solution. Samples without a program
    (invalid) and tasks missing from `tasks` are skipped.
    """
    known = {t.task_id: t for t in tasks}
    out = []
    for task_id, group in by_task(rows).items():
        task = known.get(task_id)
        if task is None:
            continue
        programs = {r.sample: extract_program(r.text, think_opened=r.think_opened) for r in group}
        minimal = [r for r in group if r.passing and _minimal(r) and programs[r.sample] is not None]
        best = min(minimal, key=lambda r: (r.edited_lines or 0, r.sample), default=None)
        target, source = (programs[best.sample], f"sample:{best.sample}") if best else (task.solution, "solution")
        for row in group:
            program = programs[row.sample]
            if program is None:
                continue
            if row.passing and _minimal(row):
                out.append(RecapCandidate(task_id, "keep", row.sample, program, program, "candidate"))
            else:
                kind = "trim" if row.passing else "repair"
                out.append(RecapCandidate(task_id, kind, row.sample, program, target, source))
    return out


def parse_ratio(text: str) -> tuple[int, int, int]:
    """`3:1:1` → (trim, repair, keep) shares; each a non-negative integer, not all 0."""
    parts = text.split(":")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise SelectionError(f"ratio must be three non-negative integers TRIM:REPAIR:KEEP, got {text!r}")
    ratio = tuple(int(p) for p in parts)
    if not any(ratio):
        raise SelectionError(f"ratio {text!r} keeps nothing")
    return ratio  # type: ignore[return-value]


def mix_recap(candidates: Sequence[RecapCandidate], ratio: tuple[int, int, int] = (3, 1, 1),
              seed: int = 0, max_examples: int | None = None) -> list[RecapCandidate]:
    """The largest mix at exactly `ratio` (trim:repair:keep) the candidates allow, of at most
    `max_examples` examples when given.

    With k = min over kinds of ⌊available / share⌋ (kinds with share 0 are left out), and at
    most ⌊max_examples / sum(ratio)⌋, each kind gives share · k examples, drawn by a shuffle
    seeded with `seed`; the result keeps the pool's order. A kind with no candidates and a
    share above 0 makes the mix empty.
    """
    if max_examples is not None and max_examples < 0:
        raise SelectionError(f"the most examples (--max) must be >= 0, got {max_examples}")
    kinds = {kind: [c for c in candidates if c.kind == kind] for kind in RECAP_KINDS}
    k = min(len(kinds[kind]) // share for kind, share in zip(RECAP_KINDS, ratio) if share)
    if max_examples is not None:
        k = min(k, max_examples // sum(ratio))
    rng = random.Random(seed)
    chosen: set[tuple[str, int]] = set()
    for kind, share in zip(RECAP_KINDS, ratio):
        pool = list(kinds[kind])
        rng.shuffle(pool)
        chosen.update((c.task_id, c.candidate_sample) for c in pool[:share * k])
    return [c for c in candidates if (c.task_id, c.candidate_sample) in chosen]


def recap_example(candidate: RecapCandidate, task: Task, trace: str | None = None,
                  prompt: str = "refine") -> dict[str, Any]:
    """One refiner training row: the messages of `prompt` (the paper's `refine`, or the demo's
    `demo_refine`) and the target response.

    The response is the target program in a ```python block, after a think block holding
    `trace` when a teacher gave one.
    """
    answer = f"```python\n{candidate.target.rstrip()}\n```"
    response = f"<think>\n{trace.strip()}\n</think>\n\n{answer}" if trace else answer
    return {"task_id": candidate.task_id, "kind": candidate.kind, "candidate_sample": candidate.candidate_sample,
            "target_source": candidate.target_source,
            "messages": messages(prompt, task.prompt, task.buggy_code, candidate.candidate),
            "response": response}


TEACHER_NOTE = ("The correct minimal fix is:\n\n```python\n{target}\n```\n\n"
                "Think it through as you would before answering: which of the candidate's changes are needed, "
                "which are not, and what is still wrong. Write only that reasoning, no code.")


def teacher_messages(candidate: RecapCandidate, task: Task) -> list[dict[str, str]]:
    """What a teacher model is asked for a reasoning trace: the refine prompt, then the target it must reach."""
    shown = messages("refine", task.prompt, task.buggy_code, candidate.candidate)
    note = TEACHER_NOTE.format(target=candidate.target.rstrip())
    return shown[:-1] + [{"role": "user", "content": f"{shown[-1]['content']}\n\n{note}"}]
