"""OpenTelemetry tracing of a job's life: a producer span for each enqueue, a consumer span for each attempt.

Optional: it needs the ``opentelemetry-api`` package (``pip install 'skiplock[otel]'``) and a tracer provider, the
global one (``opentelemetry.trace.set_tracer_provider``, or ``opentelemetry-instrument``) or one given to
:func:`set_tracer_provider`. Without them every entry point returns at once (``docs/tracing.md``).

- **Enqueue** (:func:`sending`): a ``send <queue>`` span (kind PRODUCER) in the caller's context (the web request
  that enqueued, say); its W3C trace context (``traceparent``, ``tracestate``) is written to the job's row
  (``trace_context``), not into the payload.
- **Execution** (:func:`start` / :func:`end`): a ``process <queue>`` span (kind CONSUMER) for each attempt, a child
  of the enqueue's span with a link to it as well (the messaging conventions' link, and the parent a single message
  may have), so the request, the enqueue and every attempt are one trace. The span is the current one while the
  handler runs: spans the handler starts are its children. An attempt that raised records the exception.

The worker checks for a tracer provider once every :data:`RECHECK_JOBS` jobs it claims while none is set (a
countdown a claim, :func:`claimed`): a job then costs the read of one attribute (``state.tracer``) before its
handler. :func:`start` called for every job keeps a countdown of its own (``bench/tracing_cost.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from skiplock.errors import NonRetryableError

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from skiplock.job import Job

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _W3C = TraceContextTextMapPropagator()  # traceparent and tracestate only (no baggage in the row)
    _NO_SDK = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
except ImportError:  # the extra is not installed: tracing stays off
    trace = None  # type: ignore[assignment]

SYSTEM = "skiplock"
RECHECK_SECONDS = 1.0
"""Seconds between two looks for a tracer provider by producers while none is set."""
RECHECK_JOBS = 256
"""Jobs a worker runs between two looks for a tracer provider while none is set (a provider set after the worker
started is found within that many jobs)."""


class _State:
    """One instance (attributes of an instance: writing a class attribute would invalidate the type's caches on
    every job)."""

    __slots__ = ("countdown", "next_look", "provider", "tracer")

    def __init__(self) -> None:
        self.tracer: Tracer | None = None
        self.provider: TracerProvider | None = None  # set_tracer_provider's, else the global one
        self.countdown = 1  # the worker's first job looks
        self.next_look = 0.0  # the producer's next look (time.monotonic())


_state = _State()
state = _state
"""What a worker's hot path reads before each job: ``state.tracer`` is None while jobs are not traced (then no call)."""


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace with ``provider`` rather than the global tracer provider (``None``: the global one again), as
    OpenTelemetry's instrumentations take ``tracer_provider=``."""
    _state.provider = provider
    _state.tracer = None
    _state.countdown = 1
    _state.next_look = 0.0


def _resolve() -> Tracer | None:
    if trace is None:
        return None
    provider = _state.provider if _state.provider is not None else trace.get_tracer_provider()
    if isinstance(provider, _NO_SDK):
        return None  # no SDK configured (yet)
    try:
        version: str | None = metadata.version("skiplock")
    except metadata.PackageNotFoundError:
        version = None
    _state.tracer = provider.get_tracer("skiplock", version)
    return _state.tracer


def tracer() -> Tracer | None:
    """The tracer, or None while no tracer provider is configured: looked for at most every
    :data:`RECHECK_SECONDS` (asking OpenTelemetry reads the environment: bench/HISTORY.md, "Behind the code")."""
    t = _state.tracer
    if t is not None:
        return t
    now = time.monotonic()
    if now < _state.next_look:
        return None
    _state.next_look = now + RECHECK_SECONDS
    return _resolve()


# ---------------------------------------------------------------------------------------------- enqueue
@dataclass
class Sent:
    """What the enqueue statements write (:attr:`carrier`, None when not traced) and the span to tell the ids."""

    carrier: dict[str, str] | None = None
    span: Span | None = field(default=None, repr=False)

    def jobs(self, ids: list[int] | int) -> None:
        """The id(s) the enqueue wrote (``messaging.message.id`` of one job, the count of a batch)."""
        if self.span is None:
            return
        if isinstance(ids, int):
            self.span.set_attribute("messaging.message.id", str(ids))
        else:
            self.span.set_attribute("messaging.batch.message_count", len(ids))


_NOT_TRACED: AbstractContextManager[Sent] = nullcontext(Sent())


def sending(queue: str, options: Mapping[str, Any], batch: bool = False) -> AbstractContextManager[Sent]:
    """Around one enqueue (of one job, or of a batch): a producer span, current while the statement runs, whose
    context the statement stores with the job(s). Not traced: a shared no-op context (nothing allocated)."""
    t = tracer()
    if t is None:
        return _NOT_TRACED
    return _sending(t, queue, options.get("task"), batch)


@contextmanager
def _sending(t: Tracer, queue: str, task: str | None, batch: bool) -> Iterator[Sent]:
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue_many" if batch else "enqueue",
    }
    if task is not None:
        attributes["skiplock.task"] = task
    with t.start_as_current_span(f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes) as span:
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        yield Sent(carrier, span)


# ---------------------------------------------------------------------------------------------- execution
@dataclass(slots=True)
class Running:
    span: Span
    token: Token[Context]  # the context attached while the handler runs


def start(job: Job) -> Running | None:
    """Before a job's handler runs, on the thread (or task) that runs it: its span, made current. None when no
    tracer provider is configured: a countdown, then a look for one every :data:`RECHECK_JOBS` jobs."""
    t = _state.tracer
    if t is None:
        _state.countdown -= 1
        if _state.countdown > 0:
            return None
        _state.countdown = RECHECK_JOBS
        t = _resolve()
        if t is None:
            return None
    return _start(t, job)


def claimed(jobs: int) -> None:
    """A worker claimed ``jobs`` jobs: while no tracer is set, they are counted down, and a tracer provider is looked
    for once every :data:`RECHECK_JOBS` of them (its executors call :func:`start` only while ``state.tracer`` is
    set)."""
    if _state.tracer is None:
        _state.countdown -= jobs
        if _state.countdown <= 0:
            _state.countdown = RECHECK_JOBS
            _resolve()


def _start(t: Tracer, job: Job) -> Running:
    parent = None
    links = []
    stored = job.trace_context
    if stored:
        parent = _W3C.extract(stored)
        creation = trace.get_current_span(parent).get_span_context()
        if creation.is_valid:
            links.append(trace.Link(creation))
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": job.queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": str(job.id),
        "skiplock.job.attempt": job.attempts,
        "skiplock.job.max_attempts": job.max_attempts,
    }
    if job.task is not None:
        attributes["skiplock.task"] = job.task
    span = t.start_span(
        f"process {job.queue}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes, links=links
    )
    return Running(span, otel_context.attach(trace.set_span_in_context(span)))


def end(running: Running | None, job: Job, outcome: str | None, error: BaseException | None) -> None:
    """After the handler returned or raised (its outcome known), on the same thread or task as :func:`start`."""
    if running is None:
        return
    span = running.span
    try:
        if outcome == "failed" and not isinstance(error, NonRetryableError) and job.attempts < job.max_attempts:
            outcome = "retried"  # as the completer will write it (Failure.final)
        span.set_attribute("skiplock.job.outcome", outcome or "unknown")
        if error is not None and outcome != "snoozed":
            span.record_exception(error)
            span.set_attribute("error.type", type(error).__qualname__)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
    finally:
        otel_context.detach(running.token)
        span.end()
