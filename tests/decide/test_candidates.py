"""The seeds' worked examples, table-driven: three candidates (003) and five systems (000 §2)."""

from __future__ import annotations

from typing import Any

import pytest

from foundry.decide import decide
from foundry.traits import traits_from_kwargs

PAYMENT = {"est": "40ms", "bound": "io", "concurrency": 300, "rate": "300/s", "latency": "50ms"}

# (name, traits as an author writes them, delivery, execution, execution decided by)
CASES: list[tuple[str, dict[str, Any], str, str, str]] = [
    # seed 003: the three candidates
    ("40-line CSV import", {"est": "30ms", "items": 40, "bound": "io"}, "direct", "sequential", "size"),
    ("payments handler, four upstreams", PAYMENT, "direct", "async", "count"),
    (
        "payments handler: RSA signing phase",
        {**PAYMENT, "est": "35ms", "bound": "cpu"},
        "direct",
        "bounded_pool",
        "count",
    ),
    (
        "ffmpeg transcode, 90 s",
        {"durable": True, "est": "90s", "bound": "cpu", "isolate": True, "retries": 3},
        "queue",
        "processes",
        "isolation",
    ),
    # seed 000 §2: the five systems
    (
        "deploy-config background task",
        {"background": True, "durable": True, "retries": 3, "est": "20s", "bound": "io", "rate": "10/h"},
        "queue",
        "sequential",
        "count",
    ),
    (
        "signaling events, several consumers",
        {
            "durable": True,
            "ordered": True,
            "key": "session_id",
            "consumers": 3,
            "replay": True,
            "est": "2ms",
            "rate": "2000/s",
            "bound": "io",
        },
        "stream",
        "sequential",
        "ordering",
    ),
    (
        "signature processing, idempotent, latency-bound",
        {
            "idempotent": True,
            "latency": "20ms",
            "est": "15ms",
            "bound": "cpu",
            "concurrency": 16,
            "rate": "500/s",
        },
        "pool",
        "bounded_pool",
        "count",
    ),
    (
        "multi-step provisioning with compensation",
        {"multi_step": True, "compensate": True, "durable": True, "est": "10m"},
        "workflow",
        "sequential",
        "fallback",
    ),
    ("file save with the user present", {"est": "5ms", "latency": "200ms"}, "direct", "sequential", "size"),
]


@pytest.mark.parametrize(
    ("name", "raw", "delivery", "execution", "decided_by"), CASES, ids=[c[0] for c in CASES]
)
def test_seed_examples_decide_as_the_seeds_say(
    name: str, raw: dict[str, Any], delivery: str, execution: str, decided_by: str
) -> None:
    # Given the traits the seed describes, when decided,
    decision = decide(traits_from_kwargs(name, raw))
    # then both axes match the seed, with the deciding question named and no anti-pattern.
    assert (decision.delivery, decision.execution) == (delivery, execution)
    assert decision.decided_by == decided_by
    assert decision.warnings == ()
    decided = [a for a in decision.questions if a.decided]
    assert {a.axis for a in decided} == {"delivery", "execution"}
    assert len(decided) == 2


def test_the_examples_module_declares_the_same_decisions() -> None:
    from foundry.examples.seeds import app

    plan = {name: (main.model, {p: d.model for p, d in phases.items()}) for name, main, phases in app.plan()}
    assert plan == {
        "import_csv": ("direct/sequential", {}),
        "handle_payment": ("direct/async", {"sign": "direct/bounded_pool"}),
        "transcode": ("queue/processes", {}),
        "deploy_config": ("queue/sequential", {}),
        "signaling": ("stream/sequential", {}),
        "sign_document": ("pool/bounded_pool", {}),
        "provision": ("workflow/sequential", {}),
        "save_file": ("direct/sequential", {}),
    }


def test_the_signing_phase_is_decided_on_its_own() -> None:
    from foundry.examples.seeds import handle_payment

    sign = handle_payment.phases["sign"]
    assert sign.phase == "sign"
    assert handle_payment.decision.execution == "async"
    assert sign.execution == "bounded_pool"
    assert "foundry_pool_busy" in sign.watch
    assert "foundry_loop_lag_seconds" in handle_payment.decision.watch
