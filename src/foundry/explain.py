"""Render decisions for people (terminal text) — PLACEHOLDER, issue 2 fills it in."""

from __future__ import annotations

from collections.abc import Mapping

from foundry.decide import Decision

__all__ = ["render_text"]


def render_text(name: str, decision: Decision, phases: Mapping[str, Decision]) -> str:
    lines = [f"{name}: {decision.model} (decided by {decision.decided_by})"]
    lines += [f"  phase {p}: {d.model}" for p, d in phases.items()]
    return "\n".join(lines)
