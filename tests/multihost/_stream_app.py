"""The stream consumer the multi-host stream test runs on each worker host
(``foundry streams consume tests.multihost._stream_app``): stream ``MH_STREAM`` on
``MH_STREAM_URL``, group ``g``; every delivery is recorded in ``MH_RUNS``."""

from __future__ import annotations

import os
import time

from foundry import Foundry
from foundry.deliver.stream import StreamEvent
from tests.multihost._app import BATCH, PARTITIONS, WORK_SECONDS, record

app = Foundry("multihost-stream", stream=os.environ["MH_STREAM_URL"], home=os.environ["MH_HOME"])
stream = app.stream(os.environ["MH_STREAM"], key="k", partitions=PARTITIONS)


@stream.consumer(group="g", batch=BATCH, ack_deadline="3s", session="3s")
def handle(event: StreamEvent) -> None:
    record(f"ev{event['n']}")
    time.sleep(WORK_SECONDS)
