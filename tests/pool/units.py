"""The pool units every engine is tested with, declared the same way by the test client
and by the app that ``foundry pool serve`` serves (``tests.pool.served``), so names,
codecs and traits always match."""

from __future__ import annotations

from foundry import Foundry
from foundry.units import WorkUnit
from tests.pool import broken, work

SERVED = ("square", "fail", "once", "keep", "slow", "nap", "hold", "drain")


def declare(app: Foundry) -> dict[str, WorkUnit]:
    """The conformance units on ``app``."""
    pool = app.work
    return {
        "square": pool(model="pool", idempotent=True, workers=2, name="square")(work.square),
        "fail": pool(model="pool", workers=1, name="fail")(work.fail),
        "once": pool(model="pool", workers=2, deadline="20s", name="once")(work.run_and_record),
        "keep": pool(model="pool", idempotent=True, retries=8, workers=2, deadline="20s", name="keep")(
            work.run_and_record
        ),
        "slow": pool(model="pool", workers=1, name="slow")(work.run_and_record),
        "nap": pool(model="pool", workers=1, timeout="0.3s", name="nap")(work.nap),
        "hold": pool(model="pool", workers=1, max_pending=2, name="hold")(work.nap),
        "drain": pool(model="pool", workers=2, deadline="20s", name="drain")(work.run_and_record),
    }


def declare_unserved(app: Foundry) -> WorkUnit:
    """A unit no worker can serve: its module does not import in a worker (embedded), or
    nobody serves it (served, NATS)."""
    return app.work(model="pool", workers=1, name="nobody")(broken.never)
