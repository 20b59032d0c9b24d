"""An app for the dashboard tests: a few units on every delivery model the dashboard
shows. Its engines come from ``FOUNDRY_*`` (the tests point them at private files).

``old`` is the same app as it was before ``thumbnail`` was written: a worker running it
dead-letters ``thumbnail`` jobs ("unknown unit"), as a worker deployed too early does.
"""

from __future__ import annotations

import time

from foundry import Foundry

app = Foundry("shop")
old = Foundry("shop")


def _resize(image: str, width: int = 640) -> str:
    time.sleep(0.02)
    return f"{image}@{width}"


def _thumbnail(image: str) -> str:
    return f"thumb:{image}"


def _charge(order: str, amount: float) -> str:
    return f"charged {order} {amount}"


def _sign(body: str) -> str:
    return f"signed {body}"


for target in (app, old):
    target.work(name="resize", durable=True, est="20ms", bound="cpu", background=True, queue="images")(
        _resize
    )
    target.work(name="charge", est="40ms", bound="io", concurrency=300, latency="50ms")(_charge)
    target.work(name="sign", est="2ms", bound="cpu", rate="50/s")(_sign)  # small: it runs in the caller

thumbnail = app.work(name="thumbnail", durable=True, est="10ms", background=True, queue="images")(_thumbnail)


@app.workflow()
def checkout(wf: object, order: str) -> str:
    return order


signaling = app.stream("signaling", key="session_id")


@signaling.consumer(group="billing")
def bill(event: object) -> None:
    return None
