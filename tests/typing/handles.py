"""Checked by mypy in ``test_typing.py`` (never run): what a type checker infers for
declared units, their handles and their results. Each ``reveal_type`` line carries the
type mypy must reveal; each ``# error:`` line the error code mypy must report there."""

from __future__ import annotations

import datetime as dt
from typing import Any, reveal_type

from foundry import Foundry

app = Foundry("typing")


@app.work
def resize(path: str, width: int) -> bytes:
    return b""


@app.work(durable=True, retries=3)
def stamp(at: dt.datetime) -> dt.date:
    return at.date()


@app.work(durable=True)
async def fetch(url: str) -> dict[str, int]:
    return {}


@app.work(partitionable=True)
def parse(block: str) -> int:
    return len(block)


async def main() -> None:
    reveal_type(resize.submit("a.png", 10))  # foundry.handle.Handle[bytes]
    reveal_type(resize.submit("a.png", 10).result())  # bytes
    reveal_type(stamp.submit(dt.datetime.now()).result(timeout=5))  # datetime.date
    reveal_type(stamp.options(key="k").submit(dt.datetime.now()).result())  # datetime.date
    reveal_type(await fetch.submit("https://example.org"))  # dict[str, int]
    fetched = await fetch.asubmit("https://example.org")
    reveal_type(fetched)  # foundry.handle.Handle[dict[str, int]]
    reveal_type(await stamp.submit(dt.datetime.now()).aresult())  # datetime.date
    reveal_type(resize.submit_many(["a", "b"]))  # list[foundry.handle.Handle[bytes]]
    reveal_type(parse.submit(["a", "b"]).result())  # Any
    resize.submit("a.png", "wide")  # error: arg-type
    resize.submit("a.png")  # error: call-arg
    stamp.submit("2024-01-01")  # error: arg-type
    width: str = resize.submit("a.png", 10).result()  # error: assignment
    untyped: Any = resize.submit(path="a.png", width=1).result()
    assert untyped is not None
    assert width
