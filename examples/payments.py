"""Seed 003's incident: an ASGI payments API (Starlette under uvicorn) calling four
upstreams on loopback and signing with RSA-4096, signing inline on the loop, on the model
Foundry chooses, and moved off the loop at run time — under load from a second process.

    python examples/payments.py                   # about 40 s: 3 variants × 6 s of load
    python examples/payments.py --variant inline --seconds 3 --json

The code is foundry/examples/payments.py.
"""

from foundry.examples.payments import main

if __name__ == "__main__":
    raise SystemExit(main())
