"""The app ``foundry pool serve`` serves in the tests: the conformance units
(``tests.pool.units``) and ``where`` (the network-namespace test). Its pool URL comes
from ``FOUNDRY_POOL`` (``local://`` or ``nats://…``)."""

from __future__ import annotations

import os

from foundry import Foundry
from tests.pool import units, work

app = Foundry("served", pool=os.environ.get("FOUNDRY_POOL", "nats://127.0.0.1:4222"))

units.declare(app)
where = app.work(
    model="pool", idempotent=True, retries=8, workers=2, timeout="1s", deadline="20s", name="where"
)(work.host_and_record)
