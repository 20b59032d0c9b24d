"""The app the workflow fault test runs in worker processes (and enqueues from the test).

Each workflow reserves (a plain, at-least-once step that appends a line to the effects
log), charges (a transactional step that inserts a row into ``effects`` in the journal's
own database, exactly once), and ships (plain; fails for good for every tenth order, so
the order is compensated: the charge is refunded transactionally, the reservation
released). Steps sleep a little so that kills land inside them.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from foundry import Foundry
from foundry.deliver.workflow import WorkflowContext

app = Foundry("workflow-faults")


def _log(line: str) -> None:
    path = os.environ["FW_FAULT_LOG"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {os.getpid()} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def _pause() -> None:
    time.sleep(random.uniform(0.002, 0.02))


class ShipError(RuntimeError):
    pass


def reserve(order: str) -> str:
    _log(f"{order} reserve")
    _pause()
    return f"seat-{order}"


def release(seat: str) -> None:
    _log(f"{seat.removeprefix('seat-')} release")
    _pause()


def charge(tx: Any, order: str, amount: int) -> dict[str, Any]:
    tx.execute("INSERT INTO effects (wf, what) VALUES (?, ?)", (order, "charge"))
    _pause()  # a kill here rolls the insert back together with the step's record
    return {"order": order, "amount": amount}


def refund(tx: Any, charged: dict[str, Any]) -> None:
    tx.execute("INSERT INTO effects (wf, what) VALUES (?, ?)", (charged["order"], "refund"))


def ship(order: str, n: int) -> str:
    _log(f"{order} ship")
    _pause()
    if n % 10 == 0:
        raise ShipError(f"order {order}: carrier refused the parcel")
    return f"parcel-{order}"


@app.workflow()
def order(wf: WorkflowContext, n: int) -> dict[str, Any]:
    seat = wf.step(reserve, wf.id, undo=release)
    charged = wf.step(charge, wf.id, n, transactional=True, undo=refund)
    parcel = wf.step(ship, wf.id, n, retries=1, backoff=0.01, retry_on=(OSError,))
    return {"seat": seat, "charged": charged, "parcel": parcel}
