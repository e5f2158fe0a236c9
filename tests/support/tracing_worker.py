"""A worker's handlers with OpenTelemetry's SDK: imported by a ``skiplock worker`` process (``SKIPLOCK_HANDLER=
support.tracing_worker:flaky``, or ``SKIPLOCK_APP=support.tracing_worker:app`` for a named task), it sets the global
tracer provider, which exports every finished span as one JSON line to ``$TRACE_SPANS_FILE`` for the test to read
back."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from skiplock import App, Job

_out = open(os.environ["TRACE_SPANS_FILE"], "a", buffering=1)  # noqa: SIM115 (open for the process's life)
_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(ConsoleSpanExporter(out=_out, formatter=lambda span: span.to_json(indent=None) + "\n"))
)
trace.set_tracer_provider(_provider)
_handler_tracer = trace.get_tracer("tests.handler")


def flaky(job: Job) -> None:
    """Fails its first attempt, then succeeds; a span of its own shows it runs inside the job's span."""
    with _handler_tracer.start_as_current_span("handler work"):
        if job.attempts < 2:
            raise RuntimeError(f"first attempt of job {job.id} fails")


async def aflaky(job: Job) -> None:
    """The async twin of :func:`flaky` (runs on the worker's runner tasks)."""
    with _handler_tracer.start_as_current_span("handler work"):
        if job.attempts < 2:
            raise RuntimeError(f"first attempt of job {job.id} fails")


app = App("traced")


@app.task(name="orders.place", queue="traced")
async def place(job: Job) -> None:
    """A named task (its span carries ``skiplock.task``) running :func:`aflaky`."""
    await aflaky(job)
