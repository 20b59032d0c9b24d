"""The app of the PostgreSQL-restart workflow fault test (worker processes run it; the
test enqueues from it).

Each ``pipeline`` workflow runs four steps: ``fetch``, ``pack`` and ``ship`` are plain
steps that append one line (``workflow step pid time``) to the effects log
``FW_FAULT_LOG`` with ``O_APPEND`` — a file, so it survives the database restart and
counts every execution; ``charge`` is a transactional step that inserts a row into
``effects`` in the journal's own schema, committed with its record or not at all. Each
step sleeps a little, so that a restart lands inside steps and between them; two
workflows wait inside ``charge`` until the test has restarted the server (``_hold``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from foundry import Foundry
from foundry.deliver.workflow import WorkflowContext
from tests.faults._workflow_app import _log

app = Foundry("workflow-pg-restart")
STEP_SECONDS = 0.03
HELD = frozenset({40, 41})


def fetch(wid: str) -> str:
    _log(f"{wid} fetch")
    time.sleep(STEP_SECONDS)
    return f"items-{wid}"


def _hold(wid: str, n: int) -> None:
    """Workflows in ``HELD`` wait inside ``charge`` — its transaction open — while the
    file ``FW_HOLD_FILE`` exists (60 s at most), so the test can restart the server under
    them: their insert then meets a connection the server dropped."""
    hold = os.environ.get("FW_HOLD_FILE")
    if n not in HELD or hold is None or not os.path.exists(hold):
        return
    _log(f"{wid} held")
    deadline = time.monotonic() + 60
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.01)


def charge(tx: Any, wid: str, n: int) -> int:
    _hold(wid, n)
    tx.execute("INSERT INTO effects (wf, what) VALUES (?, ?)", (wid, "charge"))
    time.sleep(STEP_SECONDS)  # a restart here: the commit meets it, with the insert uncommitted
    return n


def pack(wid: str) -> str:
    _log(f"{wid} pack")
    time.sleep(STEP_SECONDS)
    return f"box-{wid}"


def ship(wid: str) -> str:
    _log(f"{wid} ship")
    time.sleep(STEP_SECONDS)
    return f"parcel-{wid}"


PLAIN_STEPS = ("fetch", "pack", "ship")


@app.workflow()
def pipeline(wf: WorkflowContext, n: int) -> dict[str, Any]:
    items = wf.step(fetch, wf.id)
    amount = wf.step(charge, wf.id, n, transactional=True)
    box = wf.step(pack, wf.id)
    parcel = wf.step(ship, wf.id)
    return {"n": amount, "items": items, "box": box, "parcel": parcel}
