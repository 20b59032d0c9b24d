"""Typed payloads through the queue (``foundry.typed``): dataclasses, a pydantic model,
datetimes (aware and naive), dates, times, timedeltas, UUIDs, Decimals, bytes, enums and
containers of them go in at submit and come out of the worker — and the result back —
equal and of the declared types, on every engine; a wrong type is refused at submit;
a record the unit's annotations do not declare is refused when read (the store is
hostile input)."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import sys
import uuid
from collections.abc import Callable
from decimal import Decimal

import pytest

from foundry.backends.queue import JobStatus, NewJob, open_queue_backend
from foundry.errors import DeadLetteredError, RecordError, SubmitError
from tests.backends.queue.engines import ENGINES
from tests.deliver import typed_app
from tests.deliver._env import Env, python
from tests.deliver.typed_app import Customer, Line, Order, Parcel, Receipt, Tier

AWARE = dt.datetime(2024, 3, 31, 1, 59, 59, 999_999, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30)))
NAIVE = dt.datetime(2024, 2, 29, 23, 0, 1)


def an_order() -> Order:
    return Order(
        id=uuid.uuid4(),
        placed=AWARE,
        lines=[Line("apple", Decimal("0.10"), 3), Line("pear", Decimal("12345678901234567890.000001"))],
        tier=Tier.PRO,
        tags=frozenset({"gift", "rush"}),
    )


def a_customer() -> Customer:
    return Customer(name="Ada", since=dt.date(1815, 12, 10), seen=NAIVE, balance=Decimal("-0.01"))


def typed_env(make_env: Callable[[str], Env], engine: str) -> Env:
    env = make_env(engine)
    typed_app.make_units(env.app)
    env.worker()
    return env


@pytest.mark.parametrize("engine", ENGINES)
def test_typed_arguments_and_results_round_trip_on_every_engine(
    make_env: Callable[[str], Env], engine: str
) -> None:
    env = typed_env(make_env, engine)
    order, customer = an_order(), a_customer()
    # When typed values are submitted (the unit asserts, in the worker, the types it got)
    handle = env.unit("invoice").submit(
        order,
        customer,
        dt.date(2024, 4, 1),
        opens=dt.time(8, 30, 0, 5),
        grace=dt.timedelta(days=-1, seconds=5),
        note=b"\x00\xff",
    )
    receipt = handle.result(timeout=30)
    # Then the result is equal, and of the declared types all the way down
    assert receipt == Receipt(
        order.id,
        Decimal("12345678901234567890.300001"),
        dt.date(2024, 4, 1),
        customer,
        (dt.time(8, 30, 0, 5), dt.timedelta(days=-1, seconds=5)),
    )
    assert type(receipt) is Receipt
    assert type(receipt.customer) is Customer
    assert type(receipt.total) is Decimal
    assert type(receipt.due) is dt.date
    assert type(receipt.order) is uuid.UUID
    assert receipt.customer.seen == NAIVE
    assert receipt.customer.seen.tzinfo is None
    assert type(receipt.window) is tuple
    assert type(receipt.window[1]) is dt.timedelta
    # and so is what another process holding only the id reads (decoded by its declaration)
    again = env.app.job(handle.id).result(timeout=30)
    assert again == receipt
    assert type(again) is Receipt
    # Containers, unions and literals keep their types too
    ids = [uuid.uuid4(), uuid.uuid4()]
    at, got_ids, amounts, kind = (
        env.unit("stamps").submit(AWARE, ids, {"eur": Decimal("1.50")}, "b").result(30)
    )
    assert (at, got_ids, amounts, kind) == (AWARE, set(ids), {"eur": Decimal("1.50")}, "b")
    assert at.utcoffset() == AWARE.utcoffset()
    assert type(got_ids) is set
    assert type(amounts["eur"]) is Decimal
    assert env.unit("either").submit(NAIVE).result(30) == NAIVE
    assert env.unit("either").submit(NAIVE.isoformat()).result(30) == NAIVE.isoformat()  # a str stays a str
    assert env.unit("either").submit(None).result(30) is None
    # msgspec structs, inside a list too
    parcel = Parcel(Decimal("2.5"), uuid.uuid4(), AWARE, ["fragile"])
    shipped = env.unit("ship").submit(parcel, [parcel]).result(30)
    assert shipped == [parcel, parcel]
    assert all(type(p) is Parcel and type(p.sent) is dt.datetime for p in shipped)
    # An untyped parameter carries JSON data, exactly as before
    assert env.unit("untyped").submit({"$type": "datetime", "value": "x"}).result(30) == {
        "$type": "datetime",
        "value": "x",
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_a_worker_in_another_process_rebuilds_the_declared_types(
    make_env: Callable[[str], Env], engine: str
) -> None:
    # Given typed jobs submitted here, and a worker in another process that imports the units' module
    env = make_env(engine)
    typed_app.make_units(env.app)
    order, customer = an_order(), a_customer()
    receipt = env.unit("invoice").submit(order, customer, dt.date(2025, 1, 1))
    parcel = Parcel(Decimal("0.5"), uuid.uuid4(), NAIVE)
    shipped = env.unit("ship").submit(parcel, [])
    python("-m", "foundry.cli", "worker", "tests.deliver.typed_app:app", "--burst", "-q", queue=env.url)
    # Then (the unit asserts the types it was given there) the results come back typed here
    got = receipt.result(timeout=30)
    assert type(got) is Receipt
    assert got.total == Decimal("12345678901234567890.300001")
    assert got.customer == customer
    assert shipped.result(timeout=30) == [parcel]


def test_a_wrong_type_is_refused_at_submit_naming_unit_parameter_value_and_fix(env: Env) -> None:
    typed_app.make_units(env.app)
    invoice = env.unit("invoice")
    with pytest.raises(SubmitError) as wrong:
        invoice.submit(an_order(), a_customer(), "2024-04-01")
    message = str(wrong.value)
    assert "unit 'invoice'" in message
    assert "parameter due is declared date" in message
    assert "'2024-04-01'" in message
    assert "Fix: pass a value of type date" in message
    with pytest.raises(SubmitError, match=r"parameter due is declared date.*Fix: pass value\.date\(\)"):
        invoice.submit(an_order(), a_customer(), NAIVE)  # a datetime is not a date here
    with pytest.raises(SubmitError, match=r"parameter order is declared Order, and was given dict"):
        invoice.submit({"id": "x"}, a_customer(), dt.date.today())
    bad_line = an_order()
    bad_line.lines.append(Line("fig", 1.5))  # type: ignore[arg-type]
    with pytest.raises(SubmitError, match=r"parameter order\.lines\[2\]\.price .*expected Decimal"):
        invoice.submit(bad_line, a_customer(), dt.date.today())
    with pytest.raises(SubmitError, match=r"do not fit its parameters \(order, customer, due"):
        invoice.submit(an_order())  # type: ignore[call-arg]
    with pytest.raises(SubmitError, match=r"parameter kind is declared Literal\['a', 'b'\]"):
        env.unit("stamps").submit(AWARE, [], {}, "c")  # type: ignore[arg-type]
    backend = open_queue_backend(env.url)
    try:
        assert backend.stats("default").depth == 0  # nothing was enqueued
    finally:
        backend.close()


def _raw_job(unit: str, args: list[object]) -> NewJob:
    payload = json.dumps({"args": args, "kwargs": {}}).encode()
    return NewJob(id=uuid.uuid4().hex, queue="default", unit=unit, payload=payload)


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        # a tag the annotation does not declare: the record cannot choose the type
        (
            [
                {"$type": "datetime", "value": "2024-01-01T00:00:00"},
                {},
                {"$type": "date", "value": "2024-01-01"},
            ],
            "parameter order: the record's $type is 'datetime', and the unit declares Order there",
        ),
        # a model of another class: never imported, never built
        (
            [{"$type": "model", "class": "evil_payload_module.Boom", "value": {}}, {}, {}],
            "the record holds a model of class 'evil_payload_module.Boom', and the unit declares "
            "tests.deliver.typed_app.Order",
        ),
        # the declared class, with a field it does not have
        (
            [
                {
                    "$type": "model",
                    "class": "tests.deliver.typed_app.Order",
                    "value": {
                        "id": {"$type": "uuid", "value": str(uuid.UUID(int=1))},
                        "__class__": "os.system",
                    },
                },
                {},
                {},
            ],
            "Order has no field '__class__'",
        ),
        # plain JSON where a typed value is declared
        (["not an order", {}, {}], "the unit declares Order, the record holds str 'not an order'"),
        # the right tag with a value that is not one
        (
            [
                {
                    "$type": "model",
                    "class": "tests.deliver.typed_app.Order",
                    "value": {"id": {"$type": "uuid", "value": "zz"}},
                },
                {},
                {},
            ],
            "parameter order.id: 'zz' is not a UUID",
        ),
    ],
)
def test_hostile_argument_records_are_dead_lettered_with_the_reason(
    env: Env, args: list[object], reason: str
) -> None:
    typed_app.make_units(env.app)
    backend = open_queue_backend(env.url)
    try:
        done = backend.enqueue(_raw_job("invoice", args))
        env.worker()
        with pytest.raises(DeadLetteredError) as dead:
            env.app.job(done.id).result(timeout=30)
        assert "refused job" in str(dead.value), str(dead.value)
        assert reason in str(dead.value), str(dead.value)
        state = backend.get(done.id)
        assert state is not None
        assert state.status is JobStatus.DEAD
    finally:
        backend.close()
    assert "evil_payload_module" not in sys.modules


@pytest.mark.parametrize("engine", ENGINES)
def test_a_record_naming_a_class_the_unit_does_not_declare_is_dead_lettered_on_every_engine(
    make_env: Callable[[str], Env], engine: str
) -> None:
    env = make_env(engine)
    typed_app.make_units(env.app)
    forged = {"$type": "model", "class": "evil_engine_module.Boom", "value": {"cmd": "rm -rf /"}}
    backend = open_queue_backend(env.url)
    try:
        done = backend.enqueue(_raw_job("ship", [forged, []]))
        good = env.unit("ship").submit(Parcel(Decimal(1), uuid.UUID(int=3), NAIVE), [])
        env.worker()
        with pytest.raises(DeadLetteredError, match=r"refused job .*class 'evil_engine_module\.Boom'"):
            env.app.job(done.id).result(timeout=30)
        assert len(good.result(timeout=30)) == 1  # the hostile record touched no other job
    finally:
        backend.close()
    assert "evil_engine_module" not in sys.modules


def test_a_result_rewritten_in_the_store_is_refused_when_read(env: Env) -> None:
    # Given a typed job that succeeded
    typed_app.make_units(env.app)
    env.worker()
    handle = env.unit("either").submit(NAIVE)
    assert handle.result(timeout=30) == NAIVE
    # When someone with the store's credentials rewrites its result to a model of their choosing
    path = env.url.removeprefix("sqlite:///")
    forged = json.dumps({"$type": "model", "class": "subprocess.Popen", "value": {"args": ["true"]}}).encode()
    with sqlite3.connect(path) as conn:
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        table = next(
            t for t in tables if "result" in [c[1] for c in conn.execute(f'PRAGMA table_info("{t}")')]
        )
        assert (
            conn.execute(f'UPDATE "{table}" SET result = ? WHERE id = ?', (forged, handle.id)).rowcount == 1
        )
    # Then a reader refuses it with the reason, and builds nothing
    with pytest.raises(
        RecordError, match=r"its return value: the record's \$type is 'model' \(class 'subprocess.Popen'\)"
    ):
        env.app.job(handle.id).result(timeout=30)


def test_a_result_of_the_wrong_type_fails_the_job_clearly(env: Env) -> None:
    typed_app.make_units(env.app)
    env.worker()
    expected = r"unit 'liar': the result of job \w+ is declared datetime, and the unit returned int 42"
    with pytest.raises(SubmitError, match=expected):
        env.unit("liar").submit(NAIVE).result(timeout=30)
