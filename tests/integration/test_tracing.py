"""OpenTelemetry tracing (``skiplock.tracing``, docs/tracing.md) with the SDK: the producer's spans in an in-memory
exporter, a worker process's spans exported to a file and read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from skiplock import AsyncQueue, Queue, Settings, tracing
from support.pg import wait_for
from support.workers import WorkerProcess

QUEUE = "traced"


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An SDK tracer provider for skiplock in this process (the global one is left alone: other tests stay
    untraced), its finished spans in memory."""
    exporter = InMemorySpanExporter()
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(p)
    try:
        yield p, exporter
    finally:
        tracing.set_tracer_provider(None)


def traceparent(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def stored_contexts(dsn: str, schema: str) -> dict[int, Any]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute(f'SELECT id, trace_context FROM "{schema}".jobs ORDER BY id').fetchall())


def only(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


@pytest.mark.parametrize(
    ("target", "task"),
    [({"handler": "support.tracing_worker:flaky"}, None), ({"app": "support.tracing_worker:app"}, "orders.place")],
    ids=["sync-handler", "async-app-task"],
)
def test_a_request_that_enqueues_continues_into_both_attempts_of_its_job_in_a_worker_process(
    target: dict[str, str],
    task: str | None,
    provider: tuple[TracerProvider, InMemorySpanExporter],
    settings: Settings,
    pg_dsn: str,
    schema: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fastapi import FastAPI
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from starlette.testclient import TestClient

    sdk, exporter = provider
    app = FastAPI()
    with Queue(settings=settings, max_size=2) as q:

        @app.post("/orders/{order}")
        def place_order(order: int) -> dict[str, int]:
            return {"job": q.enqueue(QUEUE, {"order": order}, max_attempts=3, task=task).id}

        FastAPIInstrumentor.instrument_app(app, tracer_provider=sdk)
        client = sdk.get_tracer("tests.client").start_span("client call")  # the caller of the web app
        headers: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(headers, context=trace.set_span_in_context(client))
        with TestClient(app) as http:
            answer = http.post("/orders/42", headers=headers)
        client.end()
        assert answer.status_code == 200, answer.text
        job_id = answer.json()["job"]

        spans_file = tmp_path / "worker-spans.jsonl"
        monkeypatch.setenv("TRACE_SPANS_FILE", str(spans_file))
        options = dict(target)
        handler = options.pop("handler", None)
        worker = WorkerProcess(pg_dsn, schema, QUEUE, handler, **options, backoff_base_seconds=0.2, backoff_jitter=0)
        try:
            wait_for(lambda: (q.get(job_id) or {}).get("status") == "done", timeout=60, what="the job done")
        finally:
            worker.stop()
        assert "Traceback" not in worker.output(), worker.output()[-3000:]

    local = exporter.get_finished_spans()
    trace_id = client.get_span_context().trace_id
    request = only(local, "POST /orders/{order}")
    send = only(local, f"send {QUEUE}")
    assert request.context.trace_id == trace_id and request.parent.span_id == client.get_span_context().span_id
    assert send.kind == trace.SpanKind.PRODUCER and send.parent.span_id == request.context.span_id
    assert send.context.trace_id == trace_id
    named = {"skiplock.task": task} if task else {}
    assert dict(send.attributes) == {
        "messaging.system": "skiplock",
        "messaging.destination.name": QUEUE,
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.message.id": str(job_id),
    } | named
    assert stored_contexts(pg_dsn, schema)[job_id] == {"traceparent": traceparent(send)}, "in the row, not the payload"

    remote = [json.loads(line) for line in spans_file.read_text().splitlines()]
    attempts = sorted(
        (s for s in remote if s["name"] == f"process {QUEUE}"), key=lambda s: s["attributes"]["skiplock.job.attempt"]
    )
    send_id = f"0x{send.context.span_id:016x}"
    assert [a["attributes"]["skiplock.job.attempt"] for a in attempts] == [1, 2], "one span per attempt"
    for a in attempts:
        assert a["context"]["trace_id"] == f"0x{trace_id:032x}", "the request's trace"
        assert a["kind"] == "SpanKind.CONSUMER" and a["parent_id"] == send_id, "a child of the enqueue's span"
        assert [link["context"]["span_id"] for link in a["links"]] == [send_id], "and linked to it"
        assert a["attributes"]["messaging.system"] == "skiplock"
        assert a["attributes"]["messaging.destination.name"] == QUEUE
        assert a["attributes"]["messaging.message.id"] == str(job_id)
        assert a["attributes"].get("skiplock.task") == task, "the job's task, when it has one"
    first, second = attempts
    assert first["attributes"]["skiplock.job.outcome"] == "retried"
    assert first["status"]["status_code"] == "ERROR" and first["attributes"]["error.type"] == "RuntimeError"
    assert [e["name"] for e in first["events"]] == ["exception"]
    assert "first attempt of job" in first["events"][0]["attributes"]["exception.message"]
    assert second["attributes"]["skiplock.job.outcome"] == "done" and second["status"]["status_code"] == "UNSET"
    assert second["events"] == []
    handler_spans = [s for s in remote if s["name"] == "handler work"]
    assert sorted(s["parent_id"] for s in handler_spans) == sorted(a["context"]["span_id"] for a in attempts), (
        "the handler's own spans are children of its attempt's span"
    )


def test_every_enqueue_path_stores_its_span_in_the_callers_transaction_too(
    provider: tuple[TracerProvider, InMemorySpanExporter], queue: Queue, pg_dsn: str, schema: str
) -> None:
    sdk, exporter = provider
    with psycopg.connect(pg_dsn) as conn:  # the caller's transaction
        with sdk.get_tracer("tests").start_as_current_span("caller") as caller:
            one = queue.enqueue(QUEUE, {"a": 1}, conn=conn).id
            unique = queue.enqueue(QUEUE, {"a": 2}, unique_key="u1", conn=conn).id
            copied = queue.enqueue_many(QUEUE, [{"b": 1}, {"b": 2}], conn=conn)
            copied_options = queue.enqueue_many(QUEUE, [{"b": 3}], priority=5, delay=60, conn=conn)
            keyed = queue.enqueue_many(QUEUE, [{"c": 1}], idempotency_keys=["k1"], conn=conn)
            unique_many = queue.enqueue_many(QUEUE, [{"c": 2}], unique_keys=["u2"], conn=conn)
            by_name = queue.enqueue(QUEUE, {"e": 1}, task="app.tasks.e", conn=conn).id  # registry defaults
            by_name_many = queue.enqueue_many(QUEUE, [{"e": 2}], task="app.tasks.e", conn=conn)
        assert stored_contexts(pg_dsn, schema) == {}, "nothing visible before the caller commits"
    sends = [s for s in exporter.get_finished_spans() if s.name == f"send {QUEUE}"]
    assert len(sends) == 8 and all(s.parent.span_id == caller.get_span_context().span_id for s in sends)
    by_job = {one: sends[0], unique: sends[1]}
    by_job |= {i: sends[2] for i in copied} | {i: sends[3] for i in copied_options}
    by_job |= {i: sends[4] for i in keyed} | {i: sends[5] for i in unique_many}
    by_job |= {by_name: sends[6]} | {i: sends[7] for i in by_name_many}
    stored = stored_contexts(pg_dsn, schema)
    assert stored == {i: {"traceparent": traceparent(s)} for i, s in by_job.items()}
    assert sends[2].attributes["messaging.batch.message_count"] == 2
    assert sends[2].attributes["messaging.operation.name"] == "enqueue_many"

    tracing.set_tracer_provider(None)  # the global provider: none configured in this process
    plain = queue.enqueue(QUEUE, {"d": 1}).id
    plain_many = queue.enqueue_many(QUEUE, [{"d": 2}])
    assert all(stored_contexts(pg_dsn, schema)[i] is None for i in [plain, *plain_many])
    assert tracing.sending(QUEUE, {}) is tracing.sending(QUEUE, {"task": "t"}), "one shared no-op, nothing allocated"
    assert len(exporter.get_finished_spans()) == 9, "no span without a provider"


async def test_the_async_queue_traces_its_enqueues_and_an_error_is_recorded_on_the_span(
    provider: tuple[TracerProvider, InMemorySpanExporter], aqueue: AsyncQueue, pg_dsn: str, schema: str
) -> None:
    _, exporter = provider
    one = (await aqueue.enqueue(QUEUE, {"a": 1}, task="app.tasks.one")).id
    many = await aqueue.enqueue_many(QUEUE, [{"a": 2}])
    with pytest.raises(Exception, match="queue"):
        await aqueue.enqueue("", {"a": 3})  # refused: the span records why
    sends = [s for s in exporter.get_finished_spans() if s.name.startswith("send")]
    assert [s.attributes.get("skiplock.task") for s in sends] == ["app.tasks.one", None, None]
    stored = stored_contexts(pg_dsn, schema)
    assert stored[one] == {"traceparent": traceparent(sends[0])}
    assert stored[many[0]] == {"traceparent": traceparent(sends[1])}
    assert sends[2].status.status_code == trace.StatusCode.ERROR
    assert [e.name for e in sends[2].events] == ["exception"]


def test_without_the_otel_extra_tracing_is_off_and_costs_nothing() -> None:
    """With ``opentelemetry`` not importable (the extra not installed), the entry points are the no-ops."""
    import subprocess
    import sys

    script = """
import sys
sys.modules["opentelemetry"] = None  # as if not installed: its import raises ImportError
from skiplock import Job, tracing
job = Job(id=1, queue="q", payload={}, attempts=1, max_attempts=5)
assert tracing.trace is None and tracing.tracer() is None
with tracing.sending("q", {}) as sent:
    assert sent.carrier is None
    sent.jobs(1)
for _ in range(2 * tracing.RECHECK_JOBS):  # past a look for a provider
    span = tracing.start(job)
    assert span is None
    tracing.end(span, job, "done", None)
print("off")
"""
    out = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "off"), out.stderr
