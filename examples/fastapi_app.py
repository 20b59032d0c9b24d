"""FastAPI and Foundry: the app lives as long as the service, and in development its
workers run in the same process.

    uvicorn examples.fastapi_app:api --reload        # development: workers in-process
    FOUNDRY_DEV_WORKERS=0 uvicorn examples.fastapi_app:api --workers 4
    foundry run examples/fastapi_app.py              # ... with the workers on their own

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"order_id": "o-1", "email": "ada@example.com"}'
    curl localhost:8000/jobs/<job id>

The state lives in the embedded default (``<project>/.foundry``); ``FOUNDRY_QUEUE`` moves
the queue to PostgreSQL, Redis or RabbitMQ. See docs/integrations.md.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

from foundry import Foundry, NotFoundError
from foundry.integrations.starlette import lifespan

app = Foundry("shop")


@app.work(durable=True, retries=3)
def send_receipt(order_id: str, email: str) -> str:
    """Background work nobody waits for: a durable queue job (retried, survives a crash)."""
    return f"receipt for {order_id} sent to {email}"


class Order(BaseModel):
    order_id: str
    email: str


api = FastAPI(lifespan=lifespan(app, workers=os.environ.get("FOUNDRY_DEV_WORKERS", "1") != "0"))


@api.post("/orders", status_code=202)
async def create_order(order: Order) -> dict[str, str]:
    handle = await send_receipt.asubmit(order.order_id, order.email)
    return {"job": handle.id}


@api.get("/jobs/{job_id}")
async def job(job_id: str, request: Request) -> dict[str, Any]:
    foundry: Foundry = request.state.foundry  # the lifespan's state
    try:
        handle = foundry.job(job_id)
    except NotFoundError as exc:
        raise HTTPException(status_code=404, detail=str(exc)) from None
    status = handle.status
    return {
        "job": job_id,
        "status": str(status),
        "result": handle.result(timeout=0) if status == "succeeded" else None,
    }


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(api, host="127.0.0.1", port=8000)
