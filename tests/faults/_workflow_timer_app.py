"""The app the durable-timer and fan-out fault tests run in worker processes.

Every step appends ``<workflow> <what> <pid> <time>`` to the log named by
``FW_FAULT_LOG``, so the test can count, after SIGKILLing a worker, which process ran
what, and how often.
"""

from __future__ import annotations

import os
import time

from foundry import Foundry
from foundry.deliver.workflow import WorkflowContext

app = Foundry("workflow-timer-faults")


def _log(line: str) -> None:
    fd = os.open(os.environ["FW_FAULT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {os.getpid()} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def reserve(order: str) -> str:
    _log(f"{order} reserve")
    return f"seat-{order}"


def release(seat: str) -> None:
    _log(f"{seat.removeprefix('seat-')} release")


def hang(order: str) -> None:
    _log(f"{order} hang")
    time.sleep(60)  # far past every timer: only a timer ends it


def branch(order: str, i: int) -> int:
    _log(f"{order} start-{i}")
    time.sleep(0.05 + 0.05 * i)  # branches finish one after another
    _log(f"{order} done-{i}")
    return i * i


@app.workflow(timeout="1s")
def deadline_order(wf: WorkflowContext, order: str) -> None:
    wf.step(reserve, order, undo=release)
    wf.step(hang, order)


@app.workflow()
def step_timer_order(wf: WorkflowContext, order: str) -> None:
    wf.step(reserve, order, undo=release)
    wf.step(hang, order, timeout="1s")


@app.workflow()
def fan_out(wf: WorkflowContext, order: str) -> list[int]:
    return list(wf.gather(*(wf.branch(branch, order, i, name=f"branch-{i}") for i in range(10))))
