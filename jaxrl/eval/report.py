"""Markdown for people: one run's report.md and the side-by-side table of `eval compare`.

Percentages have one decimal and lines two (docs/reward.md, "Aggregates over a task set"); every
value carries its bootstrap 95% interval in parentheses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxrl import prompts
from jaxrl.eval.protocol import KIND_NAMES, KINDS

BUGGY_HEADERS = (("pass", "pass %"), ("precision", "precision %"), ("recall", "recall %"), ("f1", "F1 %"),
                 ("lines", "lines"))
CLEAN_HEADERS = (("noop", "no-op %"), ("damage", "damage %"))


def cell(column: Mapping[str, Any] | None, name: str, interval: bool = True) -> str:
    """One value with its interval: `62.3 (55.0–70.1)` for a share, `1.25 (1.10–1.40)` for lines."""
    if column is None or column.get(name) is None or column[name]["value"] is None:
        return "–"
    scale, digits = (1, 2) if name == "lines" else (100, 1)
    value, ci = column[name]["value"], column[name]["ci"]
    text = f"{scale * value:.{digits}f}"
    if interval and ci is not None:
        text += f" ({scale * ci[0]:.{digits}f}–{scale * ci[1]:.{digits}f})"
    return text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def run_label(summary: Mapping[str, Any]) -> str:
    """A run's name in tables and plots: the model's name, and the prompt unless it is `minimal`."""
    name = summary["model"].get("name") or "model"
    prompt = summary["settings"]["prompt"]
    return name if prompt == "minimal" else f"{name} ({prompt})"


def report_markdown(summary: Mapping[str, Any]) -> str:
    """report.md of one run."""
    s, model, settings = summary, summary["model"], summary["settings"]
    out = [f"# Evaluation of {model.get('name') or 'the model'}", ""]
    described = ", ".join(f"{k} `{v}`" for k, v in model.items() if k != "name" and v is not None)
    if described:
        out += [f"Model: {described}.", ""]
    if s.get("task_set"):
        out += [f"Tasks: `{s['task_set']}`, {s['tasks']} tasks, {s['samples']} samples.", ""]
    kinds = s["kinds"]
    if s["buggy"]["tasks"]:
        out += [f"## Buggy tasks ({s['buggy']['tasks']})", ""]
        rows = [["all", str(s["buggy"]["tasks"])] + [cell(s["buggy"], k) for k, _ in BUGGY_HEADERS]]
        if sum(k in kinds for k in KINDS) > 1:
            rows += [[KIND_NAMES[k], str(kinds[k]["tasks"])] + [cell(kinds[k], c) for c, _ in BUGGY_HEADERS]
                     for k in KINDS if k in kinds]
        out += _table(["tasks", "n", *(h for _, h in BUGGY_HEADERS)], rows) + [""]
    if s["clean"]["tasks"]:
        out += [f"## Clean tasks (GT Debug, {s['clean']['tasks']})", ""]
        out += _table(["tasks", "n", *(h for _, h in CLEAN_HEADERS)],
                      [["clean", str(s["clean"]["tasks"])] + [cell(s["clean"], k) for k, _ in CLEAN_HEADERS]])
        out += [""]
    inv, gen = s["invalid"], s["generation"]
    out += ["## Responses", ""]
    if s["samples"]:
        reasons = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in inv["reasons"].items())
        out.append(f"- invalid (no program; scored as the spec says): {inv['count']} of {s['samples']} "
                   f"({100 * inv['share']:.1f} %){': ' + reasons if reasons else ''}")
        out.append(f"- thinking budget reached: {100 * gen['budget_hit']:.1f} %; "
                   f"stopped at max tokens: {100 * gen['finish_length']:.1f} %; "
                   f"mean completion tokens: {gen['mean_completion_tokens']:.1f}")
    unv = s.get("unverifiable") or {"count": 0, "tasks": 0, "reasons": {}}  # summaries written before the field
    reasons = "; ".join(f"{k} ({v})" for k, v in list(unv["reasons"].items())[:5])
    out.append(f"- unverifiable (the judge could not verify them; left out of every column): {unv['count']} "
               f"predictions, {unv['tasks']} tasks with no other{': ' + reasons if reasons else ''}")
    agg = s["aggregate"]
    out.append(f"- tasks without a prediction (counted invalid): {agg['missing']}; "
               f"mean reward: {100 * agg['reward']:.1f} %" if agg["reward"] is not None else
               f"- tasks without a prediction (counted invalid): {agg['missing']}")
    if settings["prompt"] in prompts.REFINE_PROMPTS:
        out.append(f"- refine candidates without a program (buggy code shown instead): "
                   f"{s['refine_candidates_replaced']}")
    out += ["", "## Settings", ""]
    boot = s["bootstrap"]
    out += [
        f"- prompt `{settings['prompt']}`, {settings['samples']} sample(s) per task, thinking "
        f"{'on' if settings['enable_thinking'] else 'off'}",
        f"- temperature {settings['temperature']}, top-p {settings['top_p']}, top-k {settings['top_k']}, "
        f"seed {settings['seed']}",
        f"- thinking budget {settings['thinking_budget']} of {settings['max_tokens']} tokens on buggy tasks, "
        f"{settings['clean_thinking_budget']} of {settings['clean_max_tokens']} on clean tasks",
        f"- λ = {settings['lam']:.4g}, ε = {settings['epsilon']}, test timeout {settings['timeout_s']} s",
        f"- intervals: percentile bootstrap over tasks, {boot['resamples']} resamples, "
        f"{100 * boot['level']:.0f} %, seed {boot['seed']}",
        "",
    ]
    return "\n".join(out)


def compare_markdown(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Runs side by side (the paper's Table 2 layout): a row per run, buggy then clean columns,
    then the same buggy columns per task kind where the runs have several kinds."""
    header = ["model", "prompt", *(h for _, h in BUGGY_HEADERS), *(h for _, h in CLEAN_HEADERS)]
    rows = [[s["model"].get("name") or "model", s["settings"]["prompt"],
             *(cell(s["buggy"] if s["buggy"]["tasks"] else None, k) for k, _ in BUGGY_HEADERS),
             *(cell(s["clean"] if s["clean"]["tasks"] else None, k) for k, _ in CLEAN_HEADERS)]
            for s in summaries]
    out = ["# Comparison", "", "All buggy tasks and GT Debug (clean) tasks; 95 % bootstrap intervals in parentheses.",
           ""] + _table(header, rows) + [""]
    kinds = [k for k in KINDS if any(k in s["kinds"] for s in summaries)]
    if len(kinds) > 1:
        for kind in kinds:
            out += [f"## {KIND_NAMES[kind]}", ""]
            out += _table(["model", "prompt", "n", *(h for _, h in BUGGY_HEADERS)],
                          [[s["model"].get("name") or "model", s["settings"]["prompt"],
                            str(s["kinds"][kind]["tasks"]) if kind in s["kinds"] else "0",
                            *(cell(s["kinds"].get(kind), k) for k, _ in BUGGY_HEADERS)] for s in summaries])
            out += [""]
    invalid = [[run_label(s), f"{100 * s['invalid']['share']:.1f}" if s["invalid"]["share"] is not None else "–",
                str(s["samples"])] for s in summaries]
    out += ["## Invalid responses", ""] + _table(["run", "invalid %", "samples"], invalid) + [""]
    return "\n".join(out)


def benchmark_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    """The paper's Table 6 shape: a row per model, a column per benchmark (in the order first given),
    pass@1 % with its bootstrap interval; a model without a run of a benchmark shows –.

    Raises ValueError when two runs give the same model and benchmark.
    """
    models = list(dict.fromkeys(s["model"].get("name") or "model" for s in summaries))
    names = list(dict.fromkeys(s["benchmark"] for s in summaries))
    cells: dict[tuple[str, str], str] = {}
    for s in summaries:
        key = (s["model"].get("name") or "model", s["benchmark"])
        if key in cells:
            raise ValueError(f"two runs of {key[1]} by {key[0]}: give each model one run per benchmark "
                             "(or name them apart with eval --name)")
        cells[key] = cell(s, "pass@1")
    sizes = {s["benchmark"]: s["tasks"] for s in summaries}
    header = ["model", *(f"{b} (n={sizes[b]})" for b in names)]
    rows = [[m, *(cells.get((m, b), "–") for b in names)] for m in models]
    return "\n".join(["# Out-of-distribution benchmarks", "",
                      "pass@1 % per benchmark (the paper's Table 6); 95 % bootstrap intervals over problems in "
                      "parentheses.", "", *_table(header, rows), ""])
