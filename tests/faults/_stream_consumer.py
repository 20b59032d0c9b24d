"""A consumer process for the stream fault tests (``foundry streams consume`` loads it).

Every call is recorded raw in ``calls`` (duplicates show there); the effect goes to
``effects`` in the same transaction as the record of the event id (Idempotency), so a
redelivered event is absorbed. Configured by FAULT_* environment variables.
"""

from __future__ import annotations

import os
import time

from foundry import Foundry
from foundry.deliver.stream import Idempotency, StreamEvent
from foundry.stream_decl import StreamDecl

app = Foundry("stream-fault", stream=os.environ["FAULT_URL"], home=os.environ["FAULT_HOME"])
stream: StreamDecl = app.stream(os.environ["FAULT_STREAM"], key="k", partitions=2)
idem = Idempotency(os.environ["FAULT_DB"])
with idem.transaction() as tx:
    tx.execute(
        "CREATE TABLE IF NOT EXISTS effects "
        "(seq INTEGER PRIMARY KEY AUTOINCREMENT, k TEXT, n INTEGER, pid INTEGER)"
    )
    tx.execute("CREATE TABLE IF NOT EXISTS calls (k TEXT, n INTEGER, pid INTEGER)")


@stream.consumer(group="g", batch=20, ack_deadline="1s", session="1s")
def handle(event: StreamEvent) -> None:
    with idem.transaction() as tx:
        tx.execute("INSERT INTO calls VALUES (?,?,?)", (event["k"], event["n"], os.getpid()))
    with idem.once(event) as tx:
        if tx is not None:
            tx.execute(
                "INSERT INTO effects (k, n, pid) VALUES (?,?,?)", (event["k"], event["n"], os.getpid())
            )
    time.sleep(0.003)
