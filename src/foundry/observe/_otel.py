"""The OpenTelemetry side of ``foundry.observe.tracing``: imported only when tracing is on.

:class:`Tracer` is what the durable runtimes call: a *send* span where work is handed to
a store (its context is what the job, journal row or event carries), a *wait* span for
the time a job sat in its queue, a *process* span for a run, child of the carried
context and current while the work runs (so a span the work makes, a job it submits or
a workflow it starts is in the same trace), and plain child spans (workflow steps).

The carried context is W3C Trace Context (``traceparent``/``tracestate``), propagated
with OpenTelemetry's W3C propagator whatever global propagators the application set
(what is stored is ``foundry.tracecontext``'s field). Tracing never fails the work: a
context that does not parse starts a new trace, and the SDK's own errors are its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from foundry.tracecontext import pack, parse_trace, unpack

__all__ = ["Tracer", "provider_is_set"]

_W3C = TraceContextTextMapPropagator()
_KINDS = {"producer": SpanKind.PRODUCER, "consumer": SpanKind.CONSUMER, "internal": SpanKind.INTERNAL}
Attributes = Mapping[str, Any]


def provider_is_set() -> bool:
    """Whether the application set a real ``TracerProvider`` (not the API's placeholder)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _field(ctx: otel_context.Context | None = None) -> str | None:
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=ctx)
    return pack(carrier.get("traceparent"), carrier.get("tracestate"))


def _parent(trace_field: str | None) -> otel_context.Context:
    """The context a run continues: the carried one, or an empty one (a new trace)."""
    checked = parse_trace(trace_field)
    if checked is None:
        return otel_context.Context()
    parent, state = unpack(checked)
    carrier = {"traceparent": parent} if state is None else {"traceparent": parent, "tracestate": state}
    return _W3C.extract(carrier, context=otel_context.Context())


class Tracer:
    """Foundry's spans, on ``provider`` or the application's global ``TracerProvider``
    (the API's proxy tracer follows a global provider set after this tracer was made)."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        from foundry import __version__

        # made once: asking a provider for a tracer costs more than a span's bookkeeping
        self._otel = trace.get_tracer("foundry", __version__, tracer_provider=provider)

    def _tracer(self) -> trace.Tracer:
        return self._otel

    def current(self) -> str | None:
        """The trace field of the caller's current context (``None``: not in a trace)."""
        return _field()

    @contextmanager
    def send(self, name: str, attributes: Attributes) -> Iterator[tuple[Span, str | None]]:
        """A producer span around a hand-off, current inside it; yields the span and the
        trace field the messages carry (``None`` when there is no provider to make spans)."""
        with self._span(name, otel_context.get_current(), "producer", attributes) as span:
            yield span, _field(trace.set_span_in_context(span))

    def waited(self, name: str, trace_field: str | None, since: float, attributes: Attributes) -> None:
        """A finished span from ``since`` (unix seconds) to now, child of the carried context:
        the time a job waited for a worker."""
        now = time.time_ns()
        start = min(now, max(0, int(since * 1e9)))
        span = self._tracer().start_span(
            name,
            context=_parent(trace_field),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start,
        )
        span.end(end_time=now)

    @contextmanager
    def process(
        self, name: str, trace_field: str | None, attributes: Attributes, kind: str = "consumer"
    ) -> Iterator[Span]:
        """A span for one run, child of the carried context, current while the run lasts."""
        with self._span(name, _parent(trace_field), kind, attributes) as span:
            yield span

    @contextmanager
    def child(self, name: str, attributes: Attributes) -> Iterator[Span]:
        """An internal span, child of the current one (a workflow step)."""
        with self._span(name, otel_context.get_current(), "internal", attributes) as span:
            yield span

    @staticmethod
    def failed(span: Span, error: BaseException) -> None:
        """Mark ``span`` failed with ``error`` (an outcome that ended in it, not raised through it)."""
        if not isinstance(span, NonRecordingSpan):
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))

    @contextmanager
    def _span(
        self, name: str, parent: otel_context.Context, kind: str, attributes: Attributes
    ) -> Iterator[Span]:
        span = self._tracer().start_span(name, context=parent, kind=_KINDS[kind], attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            yield span
        except Exception as exc:
            self.failed(span, exc)
            raise
        finally:
            otel_context.detach(token)
            span.end()
