"""Chain-of-thought transfer (the paper's §3.1–3.2, Tables 4 and 8, appendix D.4).

The receiver gets exactly the chat prompt the donor answered (the donor run's prompt,
rendered with the receiver's chat template), and the donor's think block (its first
sample's `thinking` in predictions.jsonl) is spliced in one of three ways:

- `at-once`: the assistant turn is prefilled with `<think>\\n{trace}\\n</think>\\n\\n`,
  so the receiver writes the repair at once;
- `continue:N` ("trace + N"): prefilled with `<think>\\n{trace}\\n`, left open; the
  receiver thinks up to N more tokens (the engine's thinking budget closes the block
  with `\\n</think>\\n\\n`), then answers;
- `user-turn`: where an API cannot prefill an assistant turn, the trace is appended
  to the user message (after `USER_TURN_HEADER`) and the receiver reasons on its own,
  under the donor run's thinking budget.

The answer room is the donor run's (max_tokens − thinking_budget); the other
sampling settings (temperature, top-p, seed, λ, ε) are the donor run's too. A
donor sample without a think block gives an empty trace (counted in the summary).
The paper gives no wording for the user-turn splice; `USER_TURN_HEADER` is this
project's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jaxrl import prompts
from jaxrl.eval.evaluate import PredictionLog, Request, sample_all, summarize, write_outputs
from jaxrl.eval.protocol import EvalSettings, task_messages
from jaxrl.rollout.text import CLOSE_THINK_TEXT
from jaxrl.studies import figures
from reward.sandbox import Limits
from reward.schema import Prediction, Task
from reward.score import score_predictions

USER_TURN_HEADER = "Reasoning about this code, for reference:"
TRANSFER = "transfer.json"


class TransferError(ValueError):
    """A donor run or mode that cannot be used (one error line, exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Mode:
    """How the donor's trace reaches the receiver: `at-once`, `continue` (with `extra` tokens) or `user-turn`."""

    kind: str
    extra: int | None = None

    def __str__(self) -> str:
        return f"continue:{self.extra}" if self.kind == "continue" else self.kind

    @property
    def prefills(self) -> bool:
        """Whether the mode prefills the assistant turn (needs an engine that takes token ids)."""
        return self.kind != "user-turn"


def parse_mode(text: str) -> Mode:
    """`at-once`, `continue:N` (N ≥ 1 more thinking tokens) or `user-turn`."""
    if text in ("at-once", "user-turn"):
        return Mode(text)
    head, _, n = text.partition(":")
    if head == "continue" and n.isdigit() and int(n) >= 1:
        return Mode("continue", int(n))
    raise TransferError(f"--mode must be at-once, continue:N (N >= 1) or user-turn, got {text!r}")


@dataclasses.dataclass(frozen=True)
class Donor:
    """A donor eval run: its directory, summary, settings and the trace of each task (its first sample)."""

    path: Path
    summary: dict[str, Any]
    settings: EvalSettings
    traces: dict[str, str | None]


def load_donor(directory: str | Path) -> Donor:
    """The donor run written by `precisecoder eval`: summary.json and predictions.jsonl."""
    path = Path(directory)
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
        settings = EvalSettings.from_json(summary["settings"])
        lines = (path / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
        traces: dict[str, str | None] = {}
        for line in lines:
            if line.strip():
                record = json.loads(line)
                traces.setdefault(record["task_id"], record.get("thinking"))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise TransferError(f"--donor {path}: not a finished eval run ({type(e).__name__}: {e})") from None
    if settings.prompt in prompts.REFINE_PROMPTS:
        raise TransferError(f"--donor {path}: a refine run; transfer takes minimal or abstain donors")
    return Donor(path, summary, settings, traces)


def receiver_settings(donor: EvalSettings, mode: Mode, samples: int = 1) -> EvalSettings:
    """The donor's protocol with the budgets of `mode`: the donor's answer room after the spliced thinking."""
    room = donor.max_tokens - donor.thinking_budget if donor.thinking_budget is not None else donor.max_tokens
    if mode.kind == "at-once":
        budgets = dict(thinking_budget=None, clean_thinking_budget=None, max_tokens=room)
    elif mode.kind == "continue":
        budgets = dict(thinking_budget=mode.extra, clean_thinking_budget=mode.extra, max_tokens=mode.extra + room)
    else:
        budgets = {}
    return dataclasses.replace(donor, samples=samples, **budgets)


def user_turn(messages: Sequence[Mapping[str, str]], trace: str) -> list[dict[str, str]]:
    """The messages with the trace appended to the (last) user message."""
    out = [dict(m) for m in messages]
    last = max(i for i, m in enumerate(out) if m["role"] == "user")
    out[last]["content"] = f"{out[last]['content']}\n\n{USER_TURN_HEADER}\n\n{trace}"
    return out


def prefill(trace: str, mode: Mode) -> str | None:
    """The text the assistant turn starts with, inside the opened think block (None for user-turn)."""
    if mode.kind == "at-once":
        return trace + CLOSE_THINK_TEXT
    if mode.kind == "continue":
        return trace + "\n"
    return None


def transfer_requests(tasks: Sequence[Task], donor: Donor, mode: Mode, tokenizer: Any) -> list[Request]:
    """One request per task: the donor's prompt in the receiver's template, the donor's trace spliced in."""
    requests = []
    for task in tasks:
        trace = donor.traces.get(task.task_id) or ""
        messages = task_messages(task, donor.settings.prompt)
        if mode.kind == "user-turn":
            messages = user_turn(messages, trace)
        text = tokenizer.render_chat(messages, enable_thinking=donor.settings.enable_thinking,
                                     prefill=prefill(trace, mode))
        opened = mode.kind == "continue" or (mode.kind == "user-turn" and text.endswith("<think>\n"))
        requests.append(Request(task, messages, tokenizer.encode(text), opened))
    return requests


def run_transfer(engine: Any, tokenizer: Any, tasks: Sequence[Task], donor: Donor, mode: Mode, fleet: Any, *,
                 out_dir: str | Path, model: Mapping[str, Any], control: bool = False, samples: int = 1,
                 batch_size: int = 16, concurrency: int = 1, progress: bool = False, chat: bool = False
                 ) -> dict[str, Any]:
    """Sample the receiver on the spliced prompts, score, and write the eval outputs plus transfer.json;
    returns the summary (its `transfer` key says the donor, the mode and the control flag)."""
    if chat and mode.prefills:
        raise TransferError(f"--mode {mode} prefills the assistant turn; a chat API cannot: use --mode user-turn "
                            "or --api completions")
    missing = [t.task_id for t in tasks if t.task_id not in donor.traces]
    if missing:
        raise TransferError(f"the donor has no sample of {len(missing)} tasks (first: {missing[0]})")
    settings = receiver_settings(donor.settings, mode, samples)
    info = {"donor": str(donor.path.resolve()), "donor_name": donor.summary.get("model", {}).get("name"), "mode": str(mode),
            "control": control, "without_trace": sum(not donor.traces[t.task_id] for t in tasks)}
    requests = transfer_requests(tasks, donor, mode, tokenizer)
    run = {"settings": settings.to_json(), "model": dict(model), "chat": chat, "transfer": info,
           "tasks": [t.task_id for t in tasks]}
    log = PredictionLog(out_dir, run, settings.samples)
    try:
        by_task = sample_all(engine, requests, settings, log=log, batch_size=batch_size, concurrency=concurrency,
                             retries=0, progress=progress, chat=chat)
    finally:
        log.close()
    samples_ = [s for t in tasks for s in by_task[t.task_id]]
    log.finish(samples_)
    by_id = {t.task_id: t for t in tasks}
    items = [(by_id[s.task_id], Prediction(s.task_id, response=s.response, think_opened=s.think_opened))
             for s in samples_]
    scores = score_predictions(items, lambda jobs: fleet.run(jobs, progress="scoring" if progress else False),
                               lam=settings.lam, epsilon=settings.epsilon, limits=Limits(timeout_s=settings.timeout_s),
                               window_batch=1)  # many predictions a round
    summary = summarize(tasks, samples_, scores, settings, model, task_set=donor.summary.get("task_set"))
    summary["transfer"] = info
    write_outputs(Path(out_dir), scores, summary)
    (Path(out_dir) / TRANSFER).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return summary


COLUMNS = ("pass", "precision", "recall", "f1", "lines")


def _values(summary: Mapping[str, Any]) -> dict[str, float | None]:
    return {c: summary["buggy"][c]["value"] for c in COLUMNS}


def _cell(column: str, value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    text = f"{value:.2f}" if column == "lines" else f"{100 * value:.1f}"
    return f"+{text}" if signed and value > 0 else text


def compare_table(alone: Mapping[str, Any], runs: Sequence[Mapping[str, Any]],
                  donor_summaries: Mapping[str, Mapping[str, Any]], base: Mapping[str, Any] | None = None) -> str:
    """Tables 4/8 as Markdown: the receiver alone, with each donor and the deltas; with the donor's untrained
    base, the share of the donor's own training gain (donor − base) each transfer recovers.

    `runs` are transfer summaries (their `transfer` key), `donor_summaries` the donors' summaries by path.
    A control run (the base's own thinking) is measured against the gain of the first non-control donor.
    """
    head = "| receiver | donor | mode | pass % | precision % | recall % | F1 % | lines |"
    rows = [head, "|" + "---|" * 8,
            f"| {alone['model']['name']} | – | alone | " + " | ".join(_cell(c, v) for c, v in _values(alone).items())
            + " |"]
    a = _values(alone)
    deltas = []
    for run in runs:
        t, v = run["transfer"], _values(run)
        donor = f"{t['donor_name']}{' (control)' if t['control'] else ''}"
        rows.append(f"| {run['model']['name']} | {donor} | {t['mode']} | "
                    + " | ".join(_cell(c, x) for c, x in v.items()) + " |")
        d = {c: None if v[c] is None or a[c] is None else v[c] - a[c] for c in COLUMNS}
        deltas.append((donor, t["mode"], d, t))
    rows += ["", "| donor | mode | Δ pass | Δ precision | Δ recall | Δ F1 | Δ lines |", "|" + "---|" * 7]
    rows += [f"| {donor} | {mode} | " + " | ".join(_cell(c, x, signed=True) for c, x in d.items()) + " |"
             for donor, mode, d, _ in deltas]
    if base is not None:
        b = _values(base)
        trained = next((donor_summaries[t["donor"]] for *_, t in deltas if not t["control"]), None)
        rows += ["", "Share of the donor's own training gain (donor − its base) recovered:", "",
                 "| donor | mode | pass | precision | recall | F1 | lines |", "|" + "---|" * 7]
        for donor, mode, d, t in deltas:
            gain_from = donor_summaries[t["donor"]] if not t["control"] else trained
            g = _values(gain_from) if gain_from is not None else {c: None for c in COLUMNS}
            cells = []
            for c in COLUMNS:
                gap = None if g[c] is None or b[c] is None else g[c] - b[c]
                cells.append("–" if d[c] is None or not gap else f"{100 * d[c] / gap:.0f}%")
            rows.append(f"| {donor} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def thinking_curve(alone: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], path: str | Path) -> bool:
    """Fig 13's layout: precision and pass of each non-control donor's at-once (0 more tokens) and continue:N
    runs against N, the receiver alone as dashed lines; False (nothing drawn) when no run prefills."""
    curves: dict[str, list[tuple[int, float, float]]] = {}
    for run in runs:
        t = run["transfer"]
        if t["control"] or t["mode"] == "user-turn":
            continue
        extra = 0 if t["mode"] == "at-once" else parse_mode(t["mode"]).extra
        v = _values(run)
        curves.setdefault(t["donor_name"], []).append((extra, v["precision"], v["pass"]))
    if not curves:
        return False
    fig, ax = figures.new_figure(5, 4)
    for donor, points in curves.items():
        points.sort()
        xs = [p[0] for p in points]
        ax.plot(xs, [100 * p[1] for p in points], "o-", label=f"precision, {donor}'s trace")
        ax.plot(xs, [100 * p[2] for p in points], "s--", label=f"pass, {donor}'s trace")
    a = _values(alone)
    ax.axhline(100 * a["precision"], color="gray", ls=":", label="precision, alone")
    ax.axhline(100 * a["pass"], color="black", ls=":", label="pass, alone")
    figures.save(fig, ax, path, "thinking tokens the receiver adds (0: answers at once)", "%")
    return True
