"""Fixtures of the tracing tests: an SDK ``TracerProvider`` per test with an in-memory
exporter (handed to the app as ``Foundry(tracing=provider)``, so no global state leaks
into other tests of the process), and a wait for spans that end after a result is read."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class Spans:
    """The finished spans of one provider."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def all(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def wait_for(self, *names: str, timeout: float = 30.0) -> dict[str, ReadableSpan]:
        """The spans named ``names`` (each exactly once), once all of them have ended."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.all()
            found = {s.name: s for s in spans if s.name in names}
            if len(found) == len(names):
                counts = {n: sum(1 for s in spans if s.name == n) for n in names}
                assert all(c == 1 for c in counts.values()), f"a span came more than once: {counts}"
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"spans {sorted(set(names) - set(found))} never ended; got {names_of(spans)}"
                )
            time.sleep(0.01)


def names_of(spans: Sequence[ReadableSpan]) -> list[str]:
    return [s.name for s in spans]


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


@pytest.fixture
def spans() -> Iterator[Spans]:
    found = Spans()
    try:
        yield found
    finally:
        found.provider.shutdown()
