"""Chains and groups of durable units (Celery's canvas), as workflows.

    etl = chain(app, fetch, parse, store)         # store(parse(fetch(url))); etl.start(url)
    thumbs = group(app, resize)                   # [resize(p) for p in paths], in parallel
    report = chord(app, resize, zip_all)          # zip_all([resize(p) for p in paths])

Each helper declares a workflow on ``app`` and returns it (a
:class:`~foundry.workflow_decl.WorkflowUnit`: ``start``, ``enqueue``, ``run``, ``handle``).
There is no second composition engine beside the journal: a chain is a workflow whose
steps are its links, a group a fan-out (``wf.map``) of them, so a chain inherits what a
workflow guarantees —

* **a crash mid-chain loses nothing**: a finished link's result is journaled and never
  asked for again; the link that was running is asked for again by the run that resumes;
* **a queue job is submitted once**: a link that is a durable (queue) unit is submitted
  with an idempotency key made of the workflow's id and the link's place, so the resumed
  run finds the job it already submitted (running, or done with its result stored)
  instead of submitting a second one; the job runs on the queue's workers, with the
  unit's own retries, timeout and execution model;
* a link that is not a queue unit (a plain function, a direct unit) runs as the step
  itself, at-least-once like every plain step;
* a link that fails for good fails the chain (its error is the chain's), a group's
  first failure stops the others (``wf.gather``), and ``timeout=`` bounds the whole chain.

The workflow's thread waits for a queue link's job (at most ``link_timeout``, 1 h by
default); it is one of the workflow worker's ``concurrency`` threads for that long.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from foundry.deliver.workflow import WorkflowContext
from foundry.errors import DeclarationError
from foundry.traits import parse_duration

if TYPE_CHECKING:
    from foundry.app import Foundry
    from foundry.workflow_decl import WorkflowUnit

__all__ = ["Link", "chain", "chord", "group"]

_LINK_TIMEOUT = "1h"


def _link_name(link: Any) -> str:
    name = (
        getattr(link, "name", None) or getattr(link, "__qualname__", None) or getattr(link, "__name__", None)
    )
    return str(name or type(link).__name__)


def _is_queue_unit(link: Any) -> bool:
    decision = getattr(link, "decision", None)
    return getattr(decision, "delivery", None) == "queue" and callable(getattr(link, "options", None))


def _await(handle: Any, wait: float) -> Any:
    return handle.result(wait)


class Link:
    """The code of one link's step: a queue unit submitted under ``key`` (once, however
    often a resumed run asks again) and its result awaited; anything else called here.
    Its errors are rebuilt with the link's own allow-list (``error_types``, module)."""

    def __init__(self, link: Any, key: str, wait: float) -> None:
        self.link = link
        self.key = key
        self.wait = wait
        self.error_types = getattr(link, "error_types", None)
        self.__module__ = str(getattr(link, "__module__", __name__))
        self.__qualname__ = _link_name(link)

    def __call__(self, *args: Any) -> Any:
        if _is_queue_unit(self.link):
            return _await(self.link.options(key=self.key).submit(*args), self.wait)
        return self.link(*args)


def _check(owner: str, links: tuple[Any, ...]) -> None:
    if not links:
        raise DeclarationError(owner, "links", links, "is empty", "give the units to run, in order")
    for link in links:
        if not callable(link):
            raise DeclarationError(
                owner, "links", link, "is not callable", "pass declared units or functions"
            )


def _declare(app: Foundry, name: str, fn: Callable[..., Any], timeout: str | float | None) -> WorkflowUnit:
    fn.__name__ = fn.__qualname__ = re.sub(r"\W", "_", name)
    traits = {} if timeout is None else {"timeout": timeout}
    unit: WorkflowUnit = app.workflow(name=name, **traits)(fn)
    return unit


def chain(
    app: Foundry,
    *links: Any,
    name: str | None = None,
    timeout: str | float | None = None,
    link_timeout: str | float = _LINK_TIMEOUT,
) -> WorkflowUnit:
    """A workflow that calls ``links[0](*args)``, then each next link with the result of
    the one before, and returns the last result (see the module docstring)."""
    owner = name or "chain " + " | ".join(_link_name(link) for link in links)
    _check(owner, links)
    wait = parse_duration(link_timeout, unit=owner, field_name="link_timeout")

    def run(wf: WorkflowContext, *args: Any) -> Any:
        value: Any = list(args)
        for i, link in enumerate(links):
            given = value if i == 0 else [value]
            value = wf.step(Link(link, f"{wf.id}/link-{i}", wait), *given, name=_link_name(link))
        return value

    return _declare(app, owner, run, timeout)


def group(
    app: Foundry,
    link: Any,
    *,
    name: str | None = None,
    concurrency: int | None = None,
    timeout: str | float | None = None,
    link_timeout: str | float = _LINK_TIMEOUT,
) -> WorkflowUnit:
    """A workflow that calls ``link(item)`` for each item of its one argument, in parallel
    (at most ``concurrency`` at once), and returns the results in order."""
    owner = name or f"group {_link_name(link)}"
    _check(owner, (link,))
    wait = parse_duration(link_timeout, unit=owner, field_name="link_timeout")

    def run(wf: WorkflowContext, items: list[Any]) -> list[Any]:
        return _fan_out(wf, link, items, wait, concurrency)

    return _declare(app, owner, run, timeout)


def chord(
    app: Foundry,
    link: Any,
    callback: Any,
    *,
    name: str | None = None,
    concurrency: int | None = None,
    timeout: str | float | None = None,
    link_timeout: str | float = _LINK_TIMEOUT,
) -> WorkflowUnit:
    """A :func:`group` of ``link`` over the items, then ``callback(results)``."""
    owner = name or f"chord {_link_name(link)} -> {_link_name(callback)}"
    _check(owner, (link, callback))
    wait = parse_duration(link_timeout, unit=owner, field_name="link_timeout")

    def run(wf: WorkflowContext, items: list[Any]) -> Any:
        results = _fan_out(wf, link, items, wait, concurrency)
        return wf.step(Link(callback, f"{wf.id}/callback", wait), results, name=_link_name(callback))

    return _declare(app, owner, run, timeout)


def _fan_out(
    wf: WorkflowContext, link: Any, items: list[Any], wait: float, concurrency: int | None
) -> list[Any]:
    branches = [
        wf.branch(Link(link, f"{wf.id}/item-{i}", wait), item, name=_link_name(link))
        for i, item in enumerate(items)
    ]
    return wf.gather(*branches, concurrency=concurrency, name=f"group {_link_name(link)}") if branches else []
