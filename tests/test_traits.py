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
    ("raw", "field"),
    [
        ({"ordered": True, "model": "parallel"}, "model"),
        ({"ordered": True, "model": "queue/parallel"}, "model"),
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


def test_override_is_split_into_axes() -> None:
    assert Traits(model="queue/processes").override == ("queue", "processes")
    assert Traits(model="queue").override == ("queue", None)
    assert Traits(model="threads").override == (None, "threads")
    assert Traits(est=30.0).is_long
    assert not Traits(est=0.03).is_long
