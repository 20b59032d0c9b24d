"""Seed 000's five systems in one app, each on its own model, each run for real: config
deploys on the queue (retried), signaling on the stream (three groups), signatures on the
work pool (a worker dies; the idempotent request is retried), provisioning as a workflow
(compensated), a file save as a direct call.

    foundry plan foundry.examples.five_systems     # five delivery models
    python examples/five_systems.py                # about 5 s

The code is foundry/examples/five_systems.py.
"""

from foundry.examples.five_systems import main

if __name__ == "__main__":
    raise SystemExit(main())
