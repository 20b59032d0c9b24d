"""The seeds' examples as declared in foundry.examples.seeds: the decisions `foundry plan`
shows for them (the worked-cases table in docs/decisions.md has the same rows)."""

from __future__ import annotations

from foundry.decide import Host, decide
from foundry.profile import current_host

from .cases import CASES, HOST, decided

SEED_ROWS = [c for c in CASES if "(seed" in c.workload]


def test_the_seed_rows_decide_as_the_seeds_say() -> None:
    assert len(SEED_ROWS) == 9
    for case in SEED_ROWS:
        d = decided(case)
        assert d.model == case.model, case.workload
        decided_questions = [a for a in d.questions if a.decided]
        assert {a.axis for a in decided_questions} == {"delivery", "execution"}


def test_the_examples_module_declares_the_same_decisions() -> None:
    from foundry.examples.seeds import app

    computing = "bounded_pool" if current_host().gil is False else "processes"
    plan = {name: (main.model, {p: d.model for p, d in phases.items()}) for name, main, phases in app.plan()}
    assert plan == {
        "import_csv": ("direct/sequential", {}),
        "handle_payment": ("direct/async", {"sign": f"direct/{computing}"}),
        "transcode": ("queue/processes", {}),
        "deploy_config": ("queue/sequential", {}),
        "signaling": ("stream/sequential", {}),
        "sign_document": (f"pool/{computing}", {}),
        "provision": ("workflow/sequential", {}),
        "save_file": ("direct/sequential", {}),
    }


def test_the_examples_on_an_8_core_host_warn_only_where_the_seed_is_short_of_cores() -> None:
    from foundry.examples import seeds

    warned = {}
    for unit in (seeds.import_csv, seeds.handle_payment, seeds.transcode, seeds.deploy_config):
        warned[unit.name] = [w.code for w in decide(unit.traits, host=HOST).warnings]
    sign = decide(
        seeds.handle_payment.traits.merged(est=0.035, bound="cpu", model=None), phase="sign", host=HOST
    )
    assert warned == {"import_csv": [], "handle_payment": [], "transcode": [], "deploy_config": []}
    # 300/s × 35 ms is 10.5 cores of signing: the seed's own numbers do not fit 8 cores
    assert [w.code for w in sign.warnings] == ["saturation"]
    assert "10.5 cores of sign on 8" in sign.warnings[0].message
    on_16 = decide(
        seeds.handle_payment.traits.merged(est=0.035, bound="cpu", model=None),
        phase="sign",
        host=Host(cores=16, gil=True),
    )
    assert on_16.warnings == ()


def test_the_signing_phase_is_decided_on_its_own() -> None:
    from foundry.examples.seeds import handle_payment

    sign = handle_payment.phases["sign"]
    assert sign.phase == "sign"
    assert handle_payment.decision.execution == "async"
    assert sign.execution in ("processes", "bounded_pool")
    assert sign.load.computing
    assert sign.load.concurrency == min(300, sign.load.cores)
    assert "foundry_loop_lag_seconds" in handle_payment.decision.watch
    assert "foundry_child_exits_total" in sign.watch or sign.execution == "bounded_pool"


def test_long_examples_get_their_duration_advice() -> None:
    from foundry.examples.seeds import provision, transcode

    advice = [n for n in transcode.decision.notes if n.startswith("long-running")]
    assert advice
    assert "timeout=5m is declared" in advice[0]
    assert "kills the child" in advice[0]
    assert "retried job starts again from the top" in advice[0]
    assert any(n.startswith("long-running (10m)") for n in provision.decision.notes)
