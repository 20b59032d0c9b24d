"""The no-op task of ``bench/queues.py``, declared for every system it measures.

Worker processes import this module (``PYTHONPATH=bench/queue_peers``; ``bench/`` itself
is never on a worker's path, so no benchmark script can shadow a library module).
``QBENCH_SYSTEM`` says which system to declare it for, ``QBENCH_BROKER`` where the
broker or store is, ``QBENCH_QUEUE`` the queue name, and
``QBENCH_LAT`` the file the task appends one fixed-width line to when it runs:
``<submit→start seconds> <finish unix time>``. Appending with ``O_APPEND`` is atomic for
these short writes, so threads and processes share the file.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

SYSTEM = os.environ.get("QBENCH_SYSTEM", "")
BROKER = os.environ.get("QBENCH_BROKER", "")
QUEUE = os.environ.get("QBENCH_QUEUE", "qbench")
LAT = os.environ.get("QBENCH_LAT", "")
LINE = 31  # bytes per line written by record()

_fd = os.open(LAT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if LAT else -1


def record(submitted: float) -> None:
    """What every system's task does: note when it started, relative to its submission."""
    now = time.time()
    os.write(_fd, b"%012.6f %017.6f\n" % (min(max(now - submitted, 0.0), 99999.0), now))


app: Any = None
huey: Any = None

if SYSTEM.startswith("celery"):
    from celery import Celery

    app = Celery("qbench", broker=BROKER)
    app.conf.update(
        task_ignore_result=True,
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name="noop")
    def noop(submitted: float) -> None:
        record(submitted)

elif SYSTEM.startswith("dramatiq"):
    import dramatiq

    if BROKER.startswith("redis"):
        from dramatiq.brokers.redis import RedisBroker

        dramatiq.set_broker(RedisBroker(url=BROKER, namespace=QUEUE))
    else:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        dramatiq.set_broker(RabbitmqBroker(url=BROKER))

    @dramatiq.actor(max_retries=0, queue_name=QUEUE)
    def noop(submitted: float) -> None:
        record(submitted)

elif SYSTEM.startswith("huey"):
    if BROKER.startswith("redis"):
        from huey import RedisHuey

        huey = RedisHuey(QUEUE, url=BROKER)
    else:
        from huey import SqliteHuey

        huey = SqliteHuey(QUEUE, filename=BROKER)

    @huey.task()
    def noop(submitted: float) -> None:
        record(submitted)

elif SYSTEM.startswith("foundry"):
    from foundry import Foundry

    app = Foundry("qbench", queue=BROKER)

    @app.work(durable=True, queue=QUEUE)
    def noop(submitted: float) -> None:
        record(submitted)

else:  # rq, raw clients: a plain function

    def noop(submitted: float) -> None:
        record(submitted)


def raw_redis_consumer() -> None:
    """The ceiling on Redis: BRPOP one message at a time."""
    import redis

    r = redis.Redis.from_url(BROKER)
    while True:
        got = r.brpop([QUEUE], timeout=5)
        if got is not None:
            record(float(got[1]))


def raw_amqp_consumer() -> None:
    """The ceiling on RabbitMQ: aio-pika, basic.consume, one ack per message."""
    import asyncio

    import aio_pika

    async def main() -> None:
        conn = await aio_pika.connect(BROKER)
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=int(os.environ.get("QBENCH_PREFETCH", "100")))
        queue = await channel.declare_queue(QUEUE, durable=True)
        async with queue.iterator() as messages:
            async for message in messages:
                record(float(message.body))
                await message.ack()

    asyncio.run(main())


if __name__ == "__main__":
    {"raw-redis": raw_redis_consumer, "raw-amqp": raw_amqp_consumer}[sys.argv[1]]()
