"""The work of bench/pool.py and its peers' servers (run as ``python -m bench_pool_work``).

``spin_fn`` is ~200 µs of CPU. ``raw-nats URL SUBJECT``: a plain nats-py queue-group
subscriber that spins and responds. ``grpc PORT``: a grpcio server (generic handler, a
thread pool of 2) that spins and responds; prints its port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from foundry import Foundry

SPIN = 0.0002

app = Foundry("benchpool", pool=os.environ.get("FOUNDRY_POOL", "nats://127.0.0.1:4222"))


def spin_fn(x: str) -> str:
    end = time.perf_counter() + SPIN
    while time.perf_counter() < end:
        pass
    return x


spin = app.work(model="pool", idempotent=True, workers=2, name="spin")(spin_fn)


def raw_nats(url: str, subject: str) -> None:
    import nats

    async def main() -> None:
        nc = await nats.connect(url)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

        async def handle(msg: Any) -> None:
            await msg.respond(spin_fn(msg.data.decode()).encode())

        await nc.subscribe(subject, queue="raw", cb=handle)
        await stop.wait()
        await nc.drain()

    asyncio.run(main())


def grpc_server(port: int) -> None:
    import grpc

    def handle(request: bytes, context: Any) -> bytes:
        return spin_fn(request.decode()).encode()

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "bench.Pool", {"Spin": grpc.unary_unary_rpc_method_handler(handle)}
    )
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(bound, flush=True)
    signal.sigwait({signal.SIGTERM}) if hasattr(signal, "sigwait") else server.wait_for_termination()
    server.stop(1)


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}) if sys.argv[1] == "grpc" else None
    if sys.argv[1] == "raw-nats":
        raw_nats(sys.argv[2], sys.argv[3])
    else:
        grpc_server(int(sys.argv[2]))
