"""Typed units for the payload tests (module level: annotations resolve by name, and a
worker in another process imports them): dataclasses, a pydantic model, an enum, the
built-in types that are not JSON, and a workflow whose steps return them."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

import msgspec
import pydantic

from foundry import Foundry


class Tier(enum.Enum):
    FREE = "free"
    PRO = "pro"


@dataclass(frozen=True)
class Line:
    sku: str
    price: Decimal
    qty: int = 1


@dataclass
class Order:
    id: uuid.UUID
    placed: dt.datetime  # aware
    lines: list[Line]
    tier: Tier = Tier.FREE
    tags: frozenset[str] = field(default_factory=frozenset)


class Customer(pydantic.BaseModel):
    name: str
    since: dt.date
    seen: dt.datetime  # naive
    balance: Decimal


class Parcel(msgspec.Struct):
    weight: Decimal
    label: uuid.UUID
    sent: dt.datetime
    notes: list[str] = []


@dataclass
class Receipt:
    order: uuid.UUID
    total: Decimal
    due: dt.date
    customer: Customer
    window: tuple[dt.time, dt.timedelta]


def invoice(
    order: Order,
    customer: Customer,
    due: dt.date,
    *,
    opens: dt.time = dt.time(9),
    grace: dt.timedelta = dt.timedelta(days=1),
    note: bytes | None = None,
) -> Receipt:
    """Checks the types it was given (a worker that passed JSON data would fail here)."""
    assert isinstance(order, Order), order
    assert isinstance(order.placed, dt.datetime), order
    assert all(isinstance(line, Line) and isinstance(line.price, Decimal) for line in order.lines)
    assert isinstance(order.tier, Tier)
    assert isinstance(order.tags, frozenset)
    assert isinstance(customer, Customer)
    assert isinstance(customer.seen, dt.datetime)
    assert isinstance(due, dt.date)
    assert isinstance(grace, dt.timedelta)
    assert isinstance(opens, dt.time)
    assert note is None or isinstance(note, bytes)
    total = sum((line.price * line.qty for line in order.lines), Decimal("0"))
    return Receipt(order.id, total, due, customer, (opens, grace))


def stamps(
    at: dt.datetime, ids: list[uuid.UUID], amounts: dict[str, Decimal], kind: Literal["a", "b"]
) -> tuple[dt.datetime, set[uuid.UUID], dict[str, Decimal], str]:
    return (at, set(ids), amounts, kind)


def ship(parcel: Parcel, copies: list[Parcel]) -> list[Parcel]:
    assert isinstance(parcel, Parcel), parcel
    return [parcel, *copies]


def either(value: dt.datetime | str | None) -> dt.datetime | str | None:
    return value


def untyped(value: Any) -> Any:
    return value


def liar(value: dt.datetime) -> dt.datetime:
    """Returns what it does not declare."""
    return 42  # type: ignore[return-value]


def make_units(app: Foundry, **traits: Any) -> None:
    """Declare the typed units on ``app`` (queue units: ``durable=True``)."""
    app.work(durable=True, **traits)(invoice)
    app.work(durable=True, **traits)(stamps)
    app.work(durable=True, **traits)(ship)
    app.work(durable=True, **traits)(either)
    app.work(durable=True, **traits)(untyped)
    app.work(durable=True, **traits)(liar)


# -- a workflow whose steps return typed values -------------------------------------------


def price(order: Order) -> Decimal:
    return sum((line.price * line.qty for line in order.lines), Decimal("0"))


def schedule(order: Order) -> dt.datetime:
    return order.placed + dt.timedelta(hours=2)


def customer_of(name: str) -> Customer:
    return Customer(
        name=name, since=dt.date(2020, 2, 29), seen=dt.datetime(2024, 1, 2, 3, 4, 5), balance=Decimal("-1.5")
    )


SEEN: list[tuple[type, type, type, type]] = []  # what each run of checkout saw its steps return
CRASH: list[str] = []  # a run id here: that run's last step dies once (a process dying mid-run)


class Crash(BaseException):
    """Stands in for a process dying mid-step: nothing of ours catches it."""


def confirm(run: str) -> uuid.UUID:
    if run in CRASH:
        CRASH.remove(run)
        raise Crash("the process died here")
    return uuid.UUID(int=7)


def checkout(wf: Any, order: Order, run: str) -> Receipt:
    total = wf.step(price, order)
    ship = wf.step(schedule, order)
    customer = wf.step(customer_of, "ada")
    confirmation = wf.step(confirm, run)
    SEEN.append((type(total), type(ship), type(customer), type(confirmation)))
    return Receipt(order.id, total, ship.date(), customer, (ship.time(), dt.timedelta(0)))


app = Foundry("typed-tests")  # for `foundry worker tests.deliver.typed_app:app` (queue from FOUNDRY_QUEUE)
make_units(app)
