"""``foundry.typed`` on its own: what each annotation checks at dump and accepts at load,
and that a record never chooses what is built (the engines' round trips are in
``tests/deliver/test_typed_payloads.py`` and ``tests/workflows/test_typed_steps.py``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sys
import uuid
from decimal import Decimal
from typing import Any

import msgspec
import pydantic
import pytest

from foundry.errors import RecordError, SubmitError
from foundry.serialize import get_codec
from foundry.typed import payloads_for
from tests.deliver.typed_app import Customer, Line, Tier


def through_json(data: Any) -> Any:
    return json.loads(json.dumps(data))


class Box(msgspec.Struct):
    at: dt.datetime


class Note(pydantic.BaseModel):
    text: str


def mixed(
    when: dt.datetime | dt.date | None,
    model: Customer | Line,
    box: Box,
    tier: Tier,
    raw: Any,
    later: Undefined,  # type: ignore[name-defined]  # noqa: F821  (never resolves: Any)
    *more: Decimal,
    **named: uuid.UUID,
) -> Note:
    return Note(text="x")


PAYLOADS = payloads_for("mixed", mixed)
CUSTOMER = Customer(name="n", since=dt.date(2000, 1, 1), seen=dt.datetime(2000, 1, 1), balance=Decimal(1))


def round_trip(*args: Any, **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    data = through_json(PAYLOADS.dump_call(args, kwargs))
    return PAYLOADS.load_call(data[0], data[1], what="the test's arguments")


def test_unions_pick_their_branch_by_the_records_tag_and_class() -> None:
    box = Box(dt.datetime(2024, 1, 1, tzinfo=dt.UTC))
    for when in (dt.datetime(2024, 5, 6, 7, 8), dt.date(2024, 5, 6), None):
        for model in (CUSTOMER, Line("s", Decimal("9.99"))):
            args, kwargs = round_trip(
                when, model, box, Tier.PRO, {"k": [1]}, "free", Decimal("1E+2"), u=uuid.UUID(int=5)
            )
            assert args == [when, model, box, Tier.PRO, {"k": [1]}, "free", Decimal("1E+2")]
            assert type(args[0]) is type(when)
            assert type(args[1]) is type(model)
            assert kwargs == {"u": uuid.UUID(int=5)}


def test_any_and_unresolved_annotations_carry_json_unchanged() -> None:
    tagged = {"$type": "model", "class": "os.system", "value": {}}
    args, _ = round_trip(None, CUSTOMER, Box(dt.datetime(2024, 1, 1)), Tier.FREE, tagged, tagged)
    assert args[4] == tagged  # Any: a dict, nothing built
    assert args[5] == tagged  # an annotation that does not resolve is Any
    data = PAYLOADS.dump_call([None, CUSTOMER, Box(dt.datetime.now()), Tier.FREE, object(), 1], {})
    with pytest.raises(SubmitError, match=r"not JSON-compatible"):  # Any is the codec's to refuse
        get_codec("json").encode(data)


def test_submit_side_errors_name_the_position() -> None:
    box = Box(dt.datetime(2024, 1, 1))
    with pytest.raises(
        SubmitError,
        match=r"parameter tier is declared Tier, and was given str 'pro'.*Fix: pass a member of Tier",
    ):
        PAYLOADS.dump_call([None, CUSTOMER, box, "pro", 1, 1], {})
    with pytest.raises(
        SubmitError, match=r"parameter \*more\[1\] is declared Decimal, and was given float 1\.5"
    ):
        PAYLOADS.dump_call([None, CUSTOMER, box, Tier.FREE, 1, 1, Decimal(1), 1.5], {})
    with pytest.raises(SubmitError, match=r"parameter u is declared UUID, and was given str"):
        PAYLOADS.dump_call([None, CUSTOMER, box, Tier.FREE, 1, 1], {"u": "not-a-uuid"})
    with pytest.raises(
        SubmitError, match=r"parameter when is declared datetime \| date \| None, and was given str"
    ):
        PAYLOADS.dump_call(["2024-01-01", CUSTOMER, box, Tier.FREE, 1, 1], {})
    with pytest.raises(
        SubmitError, match=r"unit 'mixed': the result .* is declared Note, and the unit returned dict"
    ):
        PAYLOADS.dump_result({"text": "x"}, what="the result of job 1")


def _load(args: list[Any]) -> None:
    PAYLOADS.load_call(args, {}, what="job 1's arguments")


BOX = {"$type": "model", "class": f"{__name__}.Box", "value": {"at": "2024-01-01T00:00:00"}}
LINE = {
    "$type": "model",
    "class": "tests.deliver.typed_app.Line",
    "value": {"sku": "s", "price": {"$type": "decimal", "value": "1"}},
}


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (
            [{"$type": "time", "value": "01:00"}, LINE, BOX, "free", 1, 1],
            "the record's $type is 'time' (class None), and the unit declares datetime | date | None",
        ),
        (
            [None, {**LINE, "class": "tests.deliver.typed_app.Order"}, BOX, "free", 1, 1],
            "class 'tests.deliver.typed_app.Order'",
        ),
        (
            [None, LINE, {**BOX, "value": {"at": "yesterday"}}, "free", 1, 1],
            "parameter box: it is not a valid Box (ValidationError",
        ),
        ([None, LINE, BOX, "gold", 1, 1], "parameter tier: 'gold' is not a value of Tier"),
        ([None, LINE, BOX, "free", 1, 1, {"$type": "decimal", "value": "1" * 5000}], "is not a Decimal"),
        (
            [None, LINE, BOX, "free", 1, 1, {"$type": "decimal", "value": 1}],
            "a decimal record holds int 1, not a str",
        ),
        (
            [None, LINE, BOX, "free", 1, 1, {"$type": "decimal", "value": "1", "extra": 1}],
            "a decimal record has keys",
        ),
        (
            [
                None,
                {"$type": "model", "class": "tests.deliver.typed_app.Line", "value": ["s"]},
                BOX,
                "free",
                1,
                1,
            ],
            "value is list",
        ),
    ],
)
def test_hostile_records_are_refused_with_the_reason(args: list[Any], reason: str) -> None:
    with pytest.raises(RecordError) as refused:
        _load(args)
    assert "unit 'mixed': refused job 1's arguments" in str(refused.value)
    assert reason in str(refused.value), str(refused.value)


def test_a_pydantic_result_from_another_class_is_refused_and_nothing_is_imported() -> None:
    forged = {"$type": "model", "class": "forged_result_module.Note", "value": {"text": "x"}}
    with pytest.raises(
        RecordError, match=r"its return value: the record holds a model of class 'forged_result_module.Note'"
    ):
        PAYLOADS.load_result(forged, what="the result of job 1")
    assert "forged_result_module" not in sys.modules
    note = PAYLOADS.load_result(through_json(PAYLOADS.dump_result(Note(text="hi"))), what="r")
    assert note == Note(text="hi")
    assert type(note) is Note


def test_a_unit_without_annotations_is_left_alone() -> None:
    def plain(a, b=2):  # type: ignore[no-untyped-def]
        return a

    untyped = payloads_for("plain", plain)
    value = object()
    assert untyped.dump_call([value], {"b": value}) == ([value], {"b": value})  # not checked, not bound
    assert untyped.load_result({"$type": "uuid", "value": "x"}, what="r") == {"$type": "uuid", "value": "x"}


@dataclasses.dataclass
class Node:
    name: str
    children: list[Node] = dataclasses.field(default_factory=list)
    size: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.size = 1 + sum(c.size for c in self.children)


def tree(node: Node) -> Node:
    return node


def test_a_recursive_dataclass_round_trips_and_a_cycle_is_refused_at_submit() -> None:
    types = payloads_for("tree", tree)
    root = Node("root", [Node("a"), Node("b", [Node("c")])])
    data = through_json(types.dump_call([root], {}))
    (back,), _ = types.load_call(data[0], data[1], what="args")
    assert back == root
    assert back.size == 4  # computed by the class again, not read from the record
    assert "size" not in json.dumps(data)
    root.children.append(root)  # a cycle
    with pytest.raises(
        SubmitError, match=r"unit 'tree': the arguments are nested too deep \(or hold a cycle\)"
    ):
        types.dump_call([root], {})
    deep: dict[str, Any] = {"name": "x", "children": []}
    record = {"$type": "model", "class": f"{__name__}.Node", "value": deep}
    for _ in range(5000):  # deeper than the interpreter recurses
        deep["children"] = [
            {"$type": "model", "class": f"{__name__}.Node", "value": {"name": "y", "children": []}}
        ]
        deep = deep["children"][0]["value"]
    with pytest.raises(RecordError, match=r"refused args: the arguments: they are nested too deep"):
        types.load_call([record], {}, what="args")
