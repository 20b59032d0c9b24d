"""Render decisions for people and scripts: terminal text (rich), a Markdown decision
record a team can commit, and JSON.

``render_text(name, decision, phases)`` is what ``unit.explain()`` and
``app.explain(unit)`` return; ``explain_renderables`` is the same content as rich
renderables for a colour terminal; ``plan_table`` is the one-line-per-phase table of
``foundry plan``; ``render_markdown`` and ``plan_json`` are its other two formats.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from foundry.decide import Decision, Load

__all__ = [
    "PlanRow",
    "PlanTable",
    "decision_dict",
    "explain_renderables",
    "first_failure",
    "load_dict",
    "phase_rows",
    "phase_summary",
    "plan_json",
    "plan_table",
    "render_markdown",
    "render_text",
    "why_text",
]

# (app name, unit name, main decision, phase decisions) — what `foundry plan` shows.
PlanRow = tuple[str, str, Decision, Mapping[str, Decision]]


def first_failure(d: Decision) -> str:
    """The first way this model fails: execution's, unless sequential (which does not fail)."""
    bill = d.delivery_bill if d.execution == "sequential" else d.execution_bill
    return bill.fails.split(";")[0].strip()


def phase_rows(main: Decision, phases: Mapping[str, Decision]) -> list[Decision]:
    return [main, *phases.values()]


def load_dict(load: Load) -> dict[str, Any]:
    """The load arithmetic as JSON: every number, the lines, and ``saturated``."""
    out = asdict(load)
    out["lines"] = list(load.lines)
    out["saturated"] = load.saturated
    return out


def why_text(d: Decision) -> str:
    """Why this decision: both deciding answers, then what each model buys."""
    return (
        f"Execution decided by {d.decided_by}: {d.deciding_answer}. Delivery decided by "
        f"{d.delivery_decided_by}: {d.delivery_answer}. {d.delivery}: {d.delivery_bill.why}. "
        f"{d.execution}: {d.execution_bill.why}."
    )


def phase_summary(d: Decision) -> dict[str, Any]:
    """The deciding facts of one phase, the same for ``advise --json``, ``plan --json`` and
    ``explain --json``: ``name, delivery, execution, decided_by, why, costs, fails, watch,
    warnings`` (the documented shape) plus the deciding answers, the notes, how order is
    kept and the load arithmetic."""
    db, eb = d.delivery_bill, d.execution_bill
    return {
        "name": d.phase,
        "delivery": d.delivery,
        "execution": d.execution,
        "decided_by": d.decided_by,
        "why": why_text(d),
        "costs": f"{d.delivery}: {db.costs}. {d.execution}: {eb.costs}.",
        "fails": f"{d.delivery}: {db.fails}. {d.execution}: {eb.fails}.",
        "watch": list(d.watch),
        "warnings": [
            {"code": w.code, "title": w.title, "message": w.message, "fix": w.fix} for w in d.warnings
        ],
        "model": d.model,
        "delivery_decided_by": d.delivery_decided_by,
        "answer": d.deciding_answer,
        "delivery_answer": d.delivery_answer,
        "notes": list(d.notes),
        "order": d.order,
        "load": load_dict(d.load),
    }


def decision_dict(d: Decision) -> dict[str, Any]:
    """A JSON-ready dict of every field of the decision, with :func:`phase_summary`'s keys
    (``model``, ``why``, the load arithmetic ...) on top."""
    out = asdict(d)
    out.update(phase_summary(d))
    return out


# -- terminal ---------------------------------------------------------------------


def _decided_line(axis: str, model: str, qid: str, d: Decision) -> Text:
    answer = next((a.answer for a in d.questions if a.axis == axis and a.id == qid), "")
    line = Text(f"{axis:<10}", style="bold")
    line.append(model, style="bold cyan")
    line.append(f"  decided by {qid}", style="green")
    if answer:
        line.append(f": {answer}", style="dim")
    return line


def _decision_renderables(name: str, d: Decision) -> list[RenderableType]:
    title = Text(f"{name}", style="bold")
    if d.phase != "main":
        title.append(f" · phase {d.phase}", style="bold magenta")
    title.append(f"  {d.model}", style="bold cyan")
    if d.overridden:
        title.append("  (model= override)", style="yellow")
    out: list[RenderableType] = [
        title,
        _decided_line("delivery", d.delivery, d.delivery_decided_by, d),
        _decided_line("execution", d.execution, d.decided_by, d),
    ]

    out.append(Text("Load (Little's law: in flight = arrivals × time per unit):", style="bold"))
    out.extend(Text(f"  {line}") for line in d.load.lines)
    if d.order:
        out.append(Text.assemble(("Order kept: ", "bold"), d.order))
    questions = Table(title="Questions asked, in order", title_justify="left", box=box.SIMPLE_HEAD)
    questions.add_column("axis", style="dim", overflow="fold")
    questions.add_column("question", overflow="fold")
    questions.add_column("answer", overflow="fold")
    questions.add_column("", justify="center", overflow="fold")
    for a in d.questions:
        questions.add_row(
            a.axis, a.question, a.answer, Text("decided", style="bold green") if a.decided else ""
        )
    out.append(questions)

    bill = Table(title="The bill", title_justify="left", box=box.SIMPLE_HEAD)
    bill.add_column("", style="bold", overflow="fold")
    bill.add_column(f"delivery: {d.delivery}", overflow="fold")
    bill.add_column(f"execution: {d.execution}", overflow="fold")
    for field in ("choose_when", "why", "costs", "fails", "guarantees"):
        label = field.replace("_", " ")
        bill.add_row(label, getattr(d.delivery_bill, field), getattr(d.execution_bill, field))
    out.append(bill)

    out.append(Text.assemble(("Watch: ", "bold"), ", ".join(d.watch)))
    out.append(Text.assemble(("Consider first: ", "bold"), d.simpler))
    if d.warnings:
        for w in d.warnings:
            out.append(
                Text.assemble(
                    ("⚠ ", "bold yellow"), (w.title, "bold yellow"), f" [{w.code}]: {w.message}. Fix: {w.fix}"
                )
            )
    else:
        out.append(Text("No anti-pattern warnings.", style="green"))
    for note in d.notes:
        out.append(Text.assemble(("Note: ", "bold"), note))
    rejected = Table(title="Rejected", title_justify="left", show_header=False, box=None)
    rejected.add_column(style="bold", overflow="fold")
    rejected.add_column(overflow="fold")
    for r in d.rejected:
        rejected.add_row(r.model, r.reason)
    out.append(rejected)
    return out


def explain_renderables(name: str, decision: Decision, phases: Mapping[str, Decision]) -> Group:
    parts: list[RenderableType] = []
    for i, d in enumerate(phase_rows(decision, phases)):
        if i:
            parts.append(Text(""))
        parts.extend(_decision_renderables(name, d))
    return Group(*parts)


def render_text(name: str, decision: Decision, phases: Mapping[str, Decision]) -> str:
    """The whole bill for one unit and its phases, as plain text (no colour codes)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=110, color_system=None, force_terminal=False, highlight=False)
    console.print(explain_renderables(name, decision, phases))
    return buffer.getvalue().rstrip() + "\n"


class PlanTable:
    """The plan as rich renders it: one line per unit and phase in a table where the
    table fits the width without breaking a word, else one block per unit and phase
    (its name, model and deciding questions on one line, how it fails first below),
    which fits any width. Nothing is cut off either way: cells wrap between words, a
    word longer than its column folds, and no column is dropped."""

    def __init__(self, rows: Sequence[PlanRow], title: str) -> None:
        self.rows = list(rows)
        self.title = title
        self.several_apps = len({app for app, _, _, _ in self.rows}) > 1
        self.warned = any(d.warnings for _, _, main, phases in self.rows for d in phase_rows(main, phases))

    def _lines(self) -> list[tuple[str, str, Decision]]:
        return [(app, unit, d) for app, unit, main, phases in self.rows for d in phase_rows(main, phases)]

    def table(self) -> Table:
        table = Table(title=self.title, title_justify="left", box=box.SIMPLE_HEAD)
        if self.several_apps:
            table.add_column("app", overflow="fold")
        table.add_column("unit", style="bold", overflow="fold")
        table.add_column("phase", overflow="fold")
        table.add_column("delivery", style="cyan", overflow="fold")
        table.add_column("execution", style="cyan", overflow="fold")
        table.add_column("decided by", overflow="fold")
        table.add_column("first failure mode", ratio=3, overflow="fold")
        if self.warned:
            table.add_column("warnings", style="yellow", ratio=1, overflow="fold")
        for app, unit, d in self._lines():
            cells = [app] if self.several_apps else []
            cells += [
                unit,
                d.phase,
                d.delivery,
                d.execution,
                f"{d.delivery_decided_by} / {d.decided_by}",
                first_failure(d),
            ]
            if self.warned:
                cells.append(", ".join(w.code for w in d.warnings))
            table.add_row(*cells)
        return table

    def blocks(self) -> Group:
        parts: list[RenderableType] = [Text(self.title, style="italic"), Text("")]
        for app, unit, d in self._lines():
            line = Text()
            if self.several_apps:
                line.append(f"{app} ")
            line.append(unit, style="bold")
            if d.phase != "main":
                line.append(f" · phase {d.phase}")
            line.append("  ")
            line.append(d.model, style="cyan")
            line.append(f"  decided by {d.delivery_decided_by} / {d.decided_by}")
            parts.append(line)
            parts.append(Padding(Text(f"fails first: {first_failure(d)}", style="dim"), (0, 0, 0, 4)))
            if d.warnings:
                warned = "warnings: " + ", ".join(w.code for w in d.warnings)
                parts.append(Padding(Text(warned, style="yellow"), (0, 0, 0, 4)))
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table()
        needs = Measurement.get(console, options.update_width(1 << 16), table).minimum  # unclamped
        if needs <= options.max_width:
            yield table
        else:
            yield self.blocks()


def plan_table(rows: Sequence[PlanRow], *, title: str = "Plan") -> PlanTable:
    """One line per unit and phase (``foundry plan``); the app column only when there are
    several apps. Renders as a table, or as blocks where a table would not fit."""
    return PlanTable(rows, title)


# -- Markdown decision record -------------------------------------------------------


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_decision(unit: str, d: Decision) -> list[str]:
    heading = f"### `{unit}`" + (f" · phase `{d.phase}`" if d.phase != "main" else "")
    lines = [
        heading,
        "",
        f"**Decision:** `{d.model}`" + (" (explicit `model=` override)" if d.overridden else ""),
        f"— delivery decided by *{d.delivery_decided_by}*, execution decided by *{d.decided_by}*.",
        "",
        "**Load:**",
        *(f"- {_md(line)}" for line in d.load.lines),
        *(["", f"**Order kept:** {_md(d.order)}"] if d.order else []),
        "",
        "| # | axis | question | answer | decided |",
        "|---|---|---|---|---|",
    ]
    for i, a in enumerate(d.questions, 1):
        lines.append(
            f"| {i} | {a.axis} | {_md(a.question)} | {_md(a.answer)} | {'**yes**' if a.decided else ''} |"
        )
    lines += ["", f"| | delivery: `{d.delivery}` | execution: `{d.execution}` |", "|---|---|---|"]
    for field in ("choose_when", "why", "costs", "fails", "guarantees"):
        lines.append(
            f"| {field.replace('_', ' ')} | {_md(getattr(d.delivery_bill, field))} "
            f"| {_md(getattr(d.execution_bill, field))} |"
        )
    lines += ["", "**Watch:** " + ", ".join(f"`{m}`" for m in d.watch), ""]
    lines += [f"**Consider first:** {d.simpler}", ""]
    if d.warnings:
        lines.append("**Warnings:**")
        lines += [f"- ⚠ **{w.title}** (`{w.code}`): {w.message}. *Fix:* {w.fix}" for w in d.warnings]
        lines.append("")
    if d.notes:
        lines.append("**Notes:**")
        lines += [f"- {n}" for n in d.notes]
        lines.append("")
    lines.append("**Rejected:**")
    lines += [f"- `{r.model}`: {r.reason}" for r in d.rejected]
    lines.append("")
    return lines


def render_markdown(rows: Sequence[PlanRow], *, source: str) -> str:
    """A decision record for every unit and phase in ``rows`` (deterministic: no dates)."""
    lines = [
        f"# Execution decisions: `{source}`",
        "",
        f"Generated by `foundry plan {source} --markdown DECISIONS.md`. Each unit of work is",
        "decided on two axes: *delivery* (how work reaches a worker, what survives a crash) for",
        "the unit, and *execution* (how it runs inside the worker) for each phase. Each decision",
        "lists the questions asked in order, the one that decided, the bill, what to watch, and",
        "what was rejected. Re-run after changing a unit's traits; review the diff like code.",
        "",
        "## Summary",
        "",
        "| app | unit | phase | model | decided by | first failure mode | warnings |",
        "|---|---|---|---|---|---|---|",
    ]
    for app, unit, main, phases in rows:
        for d in phase_rows(main, phases):
            warnings = ", ".join(f"`{w.code}`" for w in d.warnings)
            lines.append(
                f"| {app} | `{unit}` | {d.phase} | `{d.model}` | {d.delivery_decided_by} / "
                f"{d.decided_by} | {_md(first_failure(d))} | {warnings} |"
            )
    lines += ["", "## Decisions", ""]
    for _app, unit, main, phases in rows:
        for d in phase_rows(main, phases):
            lines += _markdown_decision(unit, d)
    return "\n".join(lines).rstrip() + "\n"


def plan_json(rows: Sequence[PlanRow]) -> dict[str, Any]:
    return {
        "units": [
            {
                "app": app,
                "name": unit,
                "phases": [decision_dict(d) for d in phase_rows(main, phases)],
            }
            for app, unit, main, phases in rows
        ]
    }
