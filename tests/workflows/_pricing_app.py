"""A workflow whose code changes between versions, for the replay tests (`foundry
workflows replay tests.workflows._pricing_app:app`). ``VERSION["v"]``: 1 the code the
runs were recorded with, 2 changed without a patch, 3 changed behind ``wf.patched``."""

from __future__ import annotations

from typing import Any

from foundry import Foundry
from foundry.deliver.workflow import WorkflowContext

app = Foundry("pricing")
VERSION = {"v": 1}


def price_v1(order: str) -> int:
    return 10


def price_v2(order: str) -> int:
    return 12


def charge(order: str, amount: int) -> dict[str, Any]:
    return {"order": order, "amount": amount}


@app.workflow()
def checkout(wf: WorkflowContext, order: str) -> dict[str, Any]:
    if VERSION["v"] == 1:
        price = wf.step(price_v1, order, name="price")
    elif VERSION["v"] == 2:
        price = wf.step(price_v2, order, name="price-v2")  # changed in place: old runs break
    elif wf.patched("new-pricing"):
        price = wf.step(price_v2, order, name="price-v2")
    else:
        price = wf.step(price_v1, order, name="price")  # kept for the runs recorded on v1
    wf.wait_for("confirm", timeout="1d", default=None)
    return dict(wf.step(charge, order, price, name="charge"))
