"""Declaring work: human units parse, and every bad declaration names unit, field, value, fix."""

from __future__ import annotations

import pytest

from foundry import DeclarationError, Foundry, FoundryError
from foundry.errors import UnknownTraitError
from foundry.traits import Traits, parse_duration, parse_rate, parse_size, traits_from_kwargs


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("35ms", 0.035),
        ("90s", 90.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("250us", 0.00025),
        (3, 3.0),
        ("1.5s", 1.5),
        (" 10 ms ", 0.01),
        ("1d", 86400.0),
    ],
)
def test_durations_parse(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "per_second"),
    [
        ("300/s", 300.0),
        ("50/day", 50 / 86400),
        ("10/min", 10 / 60),
        ("3600/h", 1.0),
        (7, 7.0),
        ("2/second", 2.0),
        ("5/days", 5 / 86400),
    ],
)
def test_rates_parse(text: str | int, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize(
    ("text", "size"), [("10MB", 10_000_000), ("64KiB", 65536), (12, 12), ("1gib", 2**30)]
)
def test_sizes_parse(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["-3s", "fast", "3 parsecs", "nan", True, [1], "inf"])
def test_bad_durations_name_the_field_and_fix(bad: object) -> None:
    with pytest.raises(DeclarationError) as info:
        traits_from_kwargs("transcode", {"est": bad})
    err = info.value
    assert err.unit == "transcode"
    assert err.field == "est"
    assert "transcode" in str(err)
    assert "est=" in str(err)
    assert "Fix:" in str(err)


@pytest.mark.parametrize("bad", ["300/fortnight", "-1/s", "lots", "300"])
def test_bad_rates(bad: str) -> None:
    with pytest.raises(DeclarationError, match=r"rate="):
        traits_from_kwargs("ingest", {"rate": bad})


def test_unknown_trait_suggests_the_closest() -> None:
    with pytest.raises(UnknownTraitError, match=r"did you mean 'isolate'"):
        traits_from_kwargs("transcode", {"isolated": True})


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("retry", "retries"),  # edit distance alone says retry_on: the same word, not the same letters
        ("retries_on", "retry_on"),
        ("isolated", "isolate"),
        ("Durable", "durable"),
        ("durabel", "durable"),
        ("timout", "timeout"),
        ("concurency", "concurrency"),
        ("max-pending", "max_pending"),
        ("idempotant", "idempotent"),
        ("stage", "stages"),
    ],
)
def test_a_misspelt_trait_gets_the_trait_meant(given: str, meant: str) -> None:
    with pytest.raises(UnknownTraitError) as info:
        traits_from_kwargs("transcode", {given: 3})
    assert f"did you mean {meant!r}?" in str(info.value)


@pytest.mark.parametrize(
    ("given", "meant"),
    [
        ("queue/thread", "queue/threads"),  # a whole model, corrected part by part
        ("qeue/threads", "queue/threads"),
        ("direct/process", "direct/processes"),
        ("thread", "threads"),
        ("pools", "pool"),
        ("sequental", "sequential"),
    ],
)
def test_a_misspelt_model_gets_a_model_that_would_be_accepted(given: str, meant: str) -> None:
    with pytest.raises(DeclarationError) as info:
        traits_from_kwargs("transcode", {"model": given})
    assert f"did you mean {meant!r}?" in str(info.value)
    traits_from_kwargs("transcode", {"model": meant})  # and the suggestion is accepted


@pytest.mark.parametrize("given", ["queue/threads/async", "nothing-like-it"])
def test_a_model_close_to_none_suggests_nothing(given: str) -> None:
    with pytest.raises(DeclarationError) as info:
        traits_from_kwargs("transcode", {"model": given})
    assert "did you mean" not in str(info.value)
    assert "delivery/execution" in str(info.value)


def test_closest_never_suggests_the_word_itself_or_a_stranger() -> None:
    from foundry._suggest import closest, closest_path

    assert closest("queue", ["queue", "stream"]) is None
    assert closest("broker_pool_size", ["home", "queue", "pool"]) is None
    assert closest("", ["queue"]) is None
    assert closest("idem", ["idempotent", "isolate"]) == "idempotent"  # the one name it begins
    assert closest("con", ["concurrency", "consumers"]) is None  # two: not a guess worth making
    assert closest_path("queue/threads", [["queue"], ["threads"]]) is None  # nothing to correct
    assert closest_path("queue", [["queue"], ["threads"]]) is None


def test_ordered_work_may_be_parallel_because_the_join_restores_order() -> None:
    # parallel's map yields results in input order, so ordered=True does not contradict it
    app = Foundry()
    unit = app.work(ordered=True, model="parallel", name="ordered_parallel")(lambda xs: xs)
    assert unit.decision.execution == "parallel"
    assert "order-lost-by-parallel-model" not in [w.code for w in unit.decision.warnings]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"releases_gil": "yes"}, "releases_gil"),
        ({"adaptive": "yes"}, "adaptive"),
        ({"adaptive": True, "model": "processes"}, "adaptive"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"bound": "gpu"}, "bound"),
        ({"overflow": "drop"}, "overflow"),
        ({"model": "kafka"}, "model"),
        ({"timeout": "1s", "est": "90s"}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"latency": "0ms"}, "latency"),
        ({"retries": -1}, "retries"),
        ({"durable": "yes"}, "durable"),
        ({"shares": [1, 2]}, "shares"),
        ({"compensate": True, "multi_step": False}, "compensate"),
        ({"isolate": True, "partitionable": True, "model": "parallel"}, "model"),
    ],
)
def test_contradictions_raise_at_declaration(raw: dict[str, object], field: str) -> None:
    app = Foundry()
    with pytest.raises(DeclarationError) as info:
        app.work(**raw)(lambda: None)
    assert info.value.field == field
    assert isinstance(info.value, FoundryError)
    assert isinstance(info.value, ValueError)


def test_non_callable_is_rejected() -> None:
    app = Foundry()
    with pytest.raises(DeclarationError, match=r"is not callable"):
        app.work(est="1s")(42)  # type: ignore[arg-type]


def test_duplicate_names_are_rejected() -> None:
    app = Foundry()

    @app.work
    def job() -> None: ...

    with pytest.raises(DeclarationError, match=r"already declared"):
        app.work(name="job")(lambda: None)


def test_phases_inherit_the_units_traits_and_get_their_own_decision() -> None:
    app = Foundry()

    @app.work(bound="io", concurrency=300, latency="50ms", phases={"sign": {"est": "35ms", "bound": "cpu"}})
    async def handle_payment(req: dict[str, object]) -> None: ...

    sign = handle_payment.phases["sign"]
    assert sign.phase == "sign"
    assert handle_payment.decision.phase == "main"
    assert handle_payment.decision.execution != sign.execution


def test_bad_phase_is_rejected_with_the_phase_named() -> None:
    app = Foundry()
    with pytest.raises(DeclarationError, match=r"pay\.sign"):
        app.work(name="pay", phases={"sign": {"est": "-1ms"}})(lambda: None)
    with pytest.raises(DeclarationError, match=r"phases"):
        app.work(phases={"sign": 3})(lambda: None)  # type: ignore[dict-item]


def test_phases_inherit_adaptive_and_may_declare_it_alone() -> None:
    app = Foundry()

    @app.work(bound="io", concurrency=300, adaptive=True, phases={"sign": {}, "log": {"adaptive": False}})
    async def unit_wide(req: object) -> None: ...

    @app.work(bound="io", concurrency=300, phases={"sign": {"adaptive": True}})
    async def one_phase(req: object) -> None: ...

    # A phase declared onto a pool needs no moving, whatever it inherited.
    @app.work(bound="io", adaptive=True, phases={"sign": {"model": "processes"}})
    async def already_off(req: object) -> None: ...

    assert unit_wide.phase_traits["sign"].adaptive
    assert not unit_wide.phase_traits["log"].adaptive
    assert one_phase.phase_traits["sign"].adaptive
    assert not one_phase.traits.adaptive
    assert already_off.phases["sign"].execution == "processes"
    # adaptive is about where the work runs, not what the engine decides
    assert unit_wide.decision.model == one_phase.decision.model == "direct/async"


def test_override_is_split_into_axes() -> None:
    assert Traits(model="queue/processes").override == ("queue", "processes")
    assert Traits(model="queue").override == ("queue", None)
    assert Traits(model="threads").override == (None, "threads")
    assert Traits(est=30.0).is_long
    assert not Traits(est=0.03).is_long
