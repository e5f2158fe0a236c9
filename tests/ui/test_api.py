"""The JSON API against a real PostgreSQL: every endpoint, the actions and their audit rows, 401/403, bad input."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from starlette.testclient import TestClient

from skiplock import Queue
from skiplock.sql import queries_for
from skiplock.store import ui as store_ui
from ui.conftest import AUTH, TOKEN, add_failed, audit_rows, execute_in

POSTS = [
    "/api/jobs/{job}/retry",
    "/api/jobs/{job}/cancel",
    "/api/queues/default/pause",
    "/api/queues/default/resume",
    "/api/failures/{fp}/retry",
    "/api/failures/{fp}/retry-rest",
    "/api/failures/{fp}/cancel",
    "/api/jobs/retry",
    "/api/jobs/cancel",
]


def group_of(client: TestClient, job_id: int) -> str:
    fp = client.get(f"/api/jobs/{job_id}").json()["job"]["fingerprint"]
    assert re.fullmatch(r"[0-9a-f]{16}", fp)
    return str(fp)


def finish(queue: Queue, n: int, *, queue_name: str = "default") -> list[int]:
    """Run the due jobs the way a worker does (claim, then complete), n at most; returns their ids."""
    jobs = queue.claim(queue_name, limit=n, worker="w-test")
    done = queue.complete(jobs, worker="w-test")
    return sorted(done)


def test_every_read_endpoint_answers_with_the_rows(client: TestClient, queue: Queue, pg_dsn: str, schema: str) -> None:
    live = queue.enqueue("default", {"order": 1}).id
    failed = add_failed(pg_dsn, schema, ["RuntimeError: order 7 rejected"])[0]
    queues = client.get("/api/queues").json()["queues"]
    assert [(q["queue"], q["ready"], q["failed"], q["paused"]) for q in queues] == [("default", 1, 1, False)]
    assert "done_last_minute" in queues[0]
    jobs = client.get("/api/jobs").json()
    assert [j["id"] for j in jobs["jobs"]] == [failed, live] and jobs["next_before"] is None
    assert client.get("/api/jobs?status=failed").json()["jobs"][0]["id"] == failed
    job = client.get(f"/api/jobs/{failed}").json()["job"]
    assert job["payload"] == {"n": 1} and job["errors"][0]["error"] == "RuntimeError: order 7 rejected"
    groups = client.get("/api/failures").json()["groups"]
    assert [(g["jobs"], g["task"], g["normalised"]) for g in groups] == [
        (1, "send", "RuntimeError: order <n> rejected")
    ]
    group = client.get(f"/api/failures/{groups[0]['fingerprint']}").json()
    assert group["group"]["sample_id"] == failed and [j["id"] for j in group["jobs"]] == [failed]
    assert client.get("/api/schedules").json() == {"schedules": [], "next_after": None}
    empty_limits = {"limits": [], "next_after": None, "waiting": [], "next_waiting_after": None}
    assert client.get("/api/limits").json() == empty_limits
    assert client.get("/api/workers").json() == {"workers": [], "next_after": None}
    assert client.get("/api/audit").json() == {"entries": [], "next_before": None}
    for page in (
        "/queues",
        "/jobs",
        f"/jobs/{failed}",
        "/failures",
        f"/failures/{groups[0]['fingerprint']}",
        "/schedules",
        "/limits",
        "/workers",
        "/audit",
        "/login",
    ):
        r = client.get(page)
        assert r.status_code == 200 and "<!doctype html>" in r.text, page


@pytest.mark.parametrize(
    ("url", "status", "message"),
    [
        ("/api/jobs/abc", 400, "job id must be an integer"),
        ("/api/jobs/99999999", 404, "no job 99999999"),
        ("/api/jobs/0", 400, "out of range"),
        ("/api/jobs?limit=100000", 400, "limit must be between 1 and 500"),
        ("/api/jobs?limit=-1", 400, "limit must be between"),
        ("/api/jobs?before=x", 400, "before must be an integer"),
        ("/api/jobs?status=lost", 400, "status must be one of"),
        ("/api/jobs?since=yesterday", 400, "since must be an ISO 8601 time"),
        ("/api/jobs?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", 400, "since must be before until"),
        ("/api/jobs?colour=red", 400, "unknown filter 'colour'"),
        ("/api/jobs?q=" + "x" * 201, 400, "at most 200 characters"),
        ("/api/failures/nothex", 400, "16 hex digits"),
        ("/api/failures/0123456789abcdef", 404, "no failed job has the fingerprint"),
        ("/api/failures?after=garbage", 400, "after must be an integer"),
        ("/api/audit?limit=501", 400, "limit must be between"),
        ("/api/queues?limit=501", 400, "limit must be between"),
        ("/api/queues?colour=red", 400, "unknown parameter 'colour'"),
        ("/api/workers?after=busy", 400, "a workers page's cursor"),
        ("/api/limits?limit=0", 400, "limit must be between"),
        ("/jobs/abc", 400, "job id must be an integer"),
    ],
)
def test_bad_input_gets_a_clear_4xx(client: TestClient, url: str, status: int, message: str) -> None:
    r = client.get(url)
    assert r.status_code == status
    assert message in r.text


def test_without_a_token_every_action_answers_403_and_changes_nothing(
    readonly: TestClient, queue: Queue, pg_dsn: str, schema: str
) -> None:
    failed = add_failed(pg_dsn, schema, ["KeyError: 'a'"])[0]
    pending = queue.enqueue("default", {}).id
    fp = group_of(readonly, failed)
    for url in POSTS:
        r = readonly.post(url.format(job=failed, fp=fp), headers=AUTH, json={"queue": "default", "canary_id": 1})
        assert r.status_code == 403, url
        assert "read-only" in r.json()["error"]
    assert queue.statuses([failed, pending]) == {failed: "failed", pending: "pending"}
    assert queue.paused() == []
    assert audit_rows(pg_dsn, schema) == []


def test_with_a_token_actions_need_the_bearer(client: TestClient, pg_dsn: str, schema: str, queue: Queue) -> None:
    failed = add_failed(pg_dsn, schema, ["KeyError: 'a'"])[0]
    missing = client.post(f"/api/jobs/{failed}/retry")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    wrong = client.post(f"/api/jobs/{failed}/retry", headers={"Authorization": "Bearer not-the-token-at-all"})
    assert wrong.status_code == 401 and "does not match" in wrong.json()["error"]
    assert queue.statuses([failed]) == {failed: "failed"} and audit_rows(pg_dsn, schema) == []


@pytest.mark.parametrize(
    ("url", "body", "status", "message"),
    [
        ("/api/jobs/abc/retry", None, 400, "job id must be an integer"),
        ("/api/jobs/99999999/cancel", None, 404, "no job 99999999"),
        ("/api/jobs/{pending}/retry", None, 409, "only failed or cancelled jobs can be retried"),
        ("/api/jobs/{failed}/cancel", None, 409, "only waiting, pending or running jobs can be cancelled"),
        ("/api/jobs/cancel", {"queue": "default", "tsk": "send"}, 400, "unknown filter 'tsk'"),
        ("/api/jobs/retry", {"queue": "default", "group": "{fp}"}, 400, "unknown filter 'group'"),
        ("/api/jobs/retry", {"queue": "default", "since": "yesterday"}, 400, "since must be an ISO 8601 time"),
        ("/api/jobs/cancel", {"queue": "default", "status": "pending"}, 400, "leave status out"),
        ("/api/jobs/retry", {"queue": "x" * 201}, 400, "queue must be 1 to 200 characters"),
        ("/api/failures/{fp}/retry", {"canary": "ten"}, 400, "canary must be an integer"),
        ("/api/failures/{fp}/retry", {"canary": 1001}, 400, "canary must be between 1 and 1000"),
        ("/api/failures/nothex/cancel", None, 400, "16 hex digits"),
        ("/api/failures/0123456789abcdef/retry", None, 404, "no failed job has the fingerprint"),
        ("/api/failures/0123456789abcdef/cancel", None, 404, "no failed job has the fingerprint"),
        ("/api/failures/0123456789abcdef/retry", {"canary": 2}, 404, "no failed job has the fingerprint"),
        ("/api/failures/{fp}/retry-rest", {}, 400, "canary_id is required"),
        ("/api/queues/{long}/pause", None, 400, "queue"),
    ],
)
def test_a_malformed_or_refused_action_gets_a_clear_4xx_and_changes_nothing(
    client: TestClient, queue: Queue, pg_dsn: str, schema: str, url: str, body: object, status: int, message: str
) -> None:
    failed = add_failed(pg_dsn, schema, ["KeyError: 'a'"])[0]
    pending = queue.enqueue("default", {}, task="send").id
    fp = group_of(client, failed)
    values = {"failed": failed, "pending": pending, "fp": fp, "long": "q" * 300}
    if isinstance(body, dict):
        body = {k: v.format(**values) if isinstance(v, str) else v for k, v in body.items()}
    r = client.post(url.format(**values), headers=AUTH, json=body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert queue.statuses([failed, pending]) == {failed: "failed", pending: "pending"}
    assert queue.paused() == [] and audit_rows(pg_dsn, schema) == []


def test_retry_and_cancel_a_job_write_one_audit_row_each_and_a_second_click_repeats_nothing(
    client: TestClient, queue: Queue, pg_dsn: str, schema: str
) -> None:
    failed = add_failed(pg_dsn, schema, ["RuntimeError: boom"])[0]
    key = {"Idempotency-Key": "click-1"} | AUTH
    first = client.post(f"/api/jobs/{failed}/retry", headers=key).json()["action"]
    assert (first["actor"], first["action"], first["target"], first["job_count"], first["repeated"]) == (
        "ops",
        "retry",
        f"job {failed}",
        1,
        False,
    )
    again = client.post(f"/api/jobs/{failed}/retry", headers=key).json()["action"]
    assert again["repeated"] is True and again["id"] == first["id"]
    assert queue.statuses([failed]) == {failed: "pending"}
    # a retry of a job that is not failed: 409, nothing written
    refused = client.post(f"/api/jobs/{failed}/retry", headers=AUTH)
    assert refused.status_code == 409 and "only failed or cancelled jobs" in refused.json()["error"]
    cancelled = client.post(f"/api/jobs/{failed}/cancel", headers=AUTH).json()["action"]
    assert cancelled["action"] == "cancel" and cancelled["job_count"] == 1
    assert queue.statuses([failed]) == {failed: "cancelled"}
    refused = client.post(f"/api/jobs/{failed}/cancel", headers=AUTH)
    assert refused.status_code == 409 and "only waiting, pending or running jobs" in refused.json()["error"]
    assert client.post("/api/jobs/424242/cancel", headers=AUTH).status_code == 404
    assert client.post("/api/jobs/x1/cancel", headers=AUTH).status_code == 400
    rows = audit_rows(pg_dsn, schema)
    assert [(r["actor"], r["action"], r["job_count"]) for r in rows] == [("ops", "retry", 1), ("ops", "cancel", 1)]
    assert [e["action"] for e in client.get("/api/audit").json()["entries"]] == ["cancel", "retry"]


def test_jobs_waiting_for_their_parents_are_counted_and_listed(client: TestClient, queue: Queue) -> None:
    parent = queue.enqueue("flow", {"step": 1}).id
    children = [queue.enqueue("flow", {"step": 2}, after=[parent]).id for _ in range(2)]
    assert queue.statuses(children) == {c: "waiting" for c in children}
    (row,) = client.get("/api/queues").json()["queues"]
    assert (row["queue"], row["waiting"], row["ready"]) == ("flow", 2, 1)
    listed = client.get("/api/jobs?status=waiting").json()["jobs"]
    assert [j["id"] for j in listed] == sorted(children, reverse=True)
    page = client.get("/queues").text
    assert 'data-k="waiting"><a href="/jobs?queue=flow&amp;status=waiting">2</a>' in page
    assert "<option selected>waiting</option>" in client.get("/jobs?status=waiting").text
    assert f"/jobs/{children[0]}/cancel" in client.get(f"/jobs/{children[0]}").text
    stopped = client.post(f"/api/jobs/{children[0]}/cancel", headers=AUTH).json()["action"]
    assert stopped["job_count"] == 1 and queue.statuses(children) == {children[0]: "cancelled", children[1]: "waiting"}


def test_pause_and_resume_show_on_the_queues(client: TestClient, queue: Queue) -> None:
    queue.enqueue("mail", {})
    assert client.post("/api/queues/mail/pause", headers=AUTH).json()["action"]["action"] == "pause"
    assert queue.paused() == ["mail"]
    assert [q["paused"] for q in client.get("/api/queues").json()["queues"]] == [True]
    client.post("/api/queues/mail/resume", headers=AUTH)
    assert queue.paused() == []
    too_long = client.post("/api/queues/" + "q" * 129 + "/pause", headers=AUTH)
    assert too_long.status_code == 400


def test_failures_group_by_task_and_normalised_error(client: TestClient, pg_dsn: str, schema: str) -> None:
    add_failed(
        pg_dsn,
        schema,
        [
            "HTTPError: 503 from /orders/123 after 2.5 s",
            "HTTPError: 502 from /orders/98765 after 10 s",
            "KeyError: 'customer-1' for 3f2504e0-4f89-11d3-9a0c-0305e82c3301",
            'KeyError: "customer-2" for 6ba7b810-9dad-11d1-80b4-00c04fd430c8',
        ],
    )
    add_failed(pg_dsn, schema, ["HTTPError: 500 from /orders/1 after 1 s"], task="bill")
    groups = client.get("/api/failures").json()["groups"]
    assert sorted((g["task"], g["jobs"], g["normalised"]) for g in groups) == [
        ("bill", 1, "HTTPError: <n> from /orders/<n> after <n> s"),
        ("send", 2, "HTTPError: <n> from /orders/<n> after <n> s"),
        ("send", 2, "KeyError: <str> for <uuid>"),
    ]
    assert [g["task"] for g in client.get("/api/failures?task=bill").json()["groups"]] == ["bill"]
    page = client.get("/api/failures?limit=1").json()
    assert len(page["groups"]) == 1 and page["next_after"]
    rest = client.get(f"/api/failures?limit=5&after={page['next_after']}").json()["groups"]
    assert {g["fingerprint"] for g in rest} | {page["groups"][0]["fingerprint"]} == {g["fingerprint"] for g in groups}


def test_a_canary_goes_first_and_the_rest_only_after_it_succeeded(
    client: TestClient, queue: Queue, pg_dsn: str, schema: str
) -> None:
    ids = add_failed(pg_dsn, schema, [f"RuntimeError: order {n} rejected" for n in range(6)])
    fp = group_of(client, ids[0])
    canary = client.post(f"/api/failures/{fp}/retry", headers=AUTH, json={"canary": 2}).json()["action"]
    assert canary["action"] == "retry_group_canary" and canary["detail"]["canary"] == ids[:2]
    rest_url = f"/api/failures/{fp}/retry-rest"
    waiting = client.post(rest_url, headers=AUTH, json={"canary_id": canary["id"]})
    assert waiting.status_code == 409 and "has not finished" in waiting.json()["error"]
    assert finish(queue, 10) == ids[:2]
    shown = client.get(f"/api/failures/{fp}?canary={canary['id']}").json()["canary"]
    assert shown["counts"] == {"done": 2, "failed": 0, "cancelled": 0, "gone": 0, "running": 0}
    rest = client.post(rest_url, headers=AUTH | {"Idempotency-Key": "rest-1"}, json={"canary_id": canary["id"]})
    assert rest.status_code == 200 and rest.json()["action"]["job_count"] == 4
    assert set(queue.statuses(ids).values()) == {"done", "pending"}
    again = client.post(rest_url, headers=AUTH | {"Idempotency-Key": "rest-1"}, json={"canary_id": canary["id"]})
    assert again.json()["action"]["repeated"] is True and again.json()["action"]["job_count"] == 4
    stale = client.post(rest_url, headers=AUTH, json={"canary_id": canary["id"]})
    assert stale.status_code == 410 and "used already" in stale.json()["error"]
    assert client.post(rest_url, headers=AUTH, json={"canary_id": 987654}).status_code == 404
    assert client.post(rest_url, headers=AUTH, json={"canary_id": "x"}).status_code == 400


def test_a_failed_canary_stops_the_rest(client: TestClient, queue: Queue, pg_dsn: str, schema: str) -> None:
    ids = add_failed(pg_dsn, schema, [f"RuntimeError: order {n} rejected" for n in range(3)])
    fp = group_of(client, ids[0])
    canary = client.post(f"/api/failures/{fp}/retry", headers=AUTH, json={"canary": 1}).json()["action"]
    queue.cancel(ids=ids[:1])
    refused = client.post(f"/api/failures/{fp}/retry-rest", headers=AUTH, json={"canary_id": canary["id"]})
    assert refused.status_code == 409 and "did not succeed" in refused.json()["error"]
    assert queue.statuses(ids[1:]) == {i: "failed" for i in ids[1:]}
    execute_in(pg_dsn, schema, "DELETE FROM {}.jobs WHERE id = %s", [ids[0]])  # the canary's job purged: stale
    gone = client.post(f"/api/failures/{fp}/retry-rest", headers=AUTH, json={"canary_id": canary["id"]})
    assert gone.status_code == 410 and "stale" in gone.json()["error"]
    bad = client.post(f"/api/failures/{fp}/retry", headers=AUTH, json={"canary": 5000})
    assert bad.status_code == 400


def test_a_bulk_action_runs_in_batches_and_a_repeat_does_not_double_it(
    client: TestClient, queue: Queue, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_ui, "BATCH", 4)
    ids = add_failed(pg_dsn, schema, [f"ValueError: bad amount {n}" for n in range(10)])
    other = add_failed(pg_dsn, schema, ["KeyError: 'x'"])
    fp = group_of(client, ids[0])
    headers = AUTH | {"Idempotency-Key": "bulk-1"}
    done = client.post(f"/api/failures/{fp}/retry", headers=headers).json()["action"]
    assert (done["action"], done["job_count"], done["detail"]["finished"], done["detail"]["after"]) == (
        "retry_group",
        10,
        True,
        ids[-1],
    )
    assert set(queue.statuses(ids).values()) == {"pending"} and queue.statuses(other) == {other[0]: "failed"}
    execute_in(  # they fail again: a repeated click must not retry them
        pg_dsn,
        schema,
        "UPDATE {}.jobs SET status = 'failed', last_error = 'ValueError: bad amount 1' WHERE id = ANY(%s)",
        [ids],
    )
    again = client.post(f"/api/failures/{fp}/retry", headers=headers).json()["action"]
    assert again["repeated"] is True and again["job_count"] == 10
    assert set(queue.statuses(ids).values()) == {"failed"}
    cancel = client.post(f"/api/failures/{fp}/cancel", headers=AUTH).json()["action"]
    assert cancel["job_count"] == 10 and set(queue.statuses(ids).values()) == {"cancelled"}
    assert [r["action"] for r in audit_rows(pg_dsn, schema)] == ["retry_group", "cancel_group"]


def test_bulk_actions_by_filter(client: TestClient, queue: Queue, pg_dsn: str, schema: str) -> None:
    failed = add_failed(pg_dsn, schema, ["TimeoutError: took 30 s", "KeyError: 'a'"], queue="mail")
    pending = [queue.enqueue("mail", {}).id, queue.enqueue("other", {}).id]
    assert client.post("/api/jobs/retry", headers=AUTH, json={}).status_code == 400
    assert client.post("/api/jobs/retry", headers=AUTH, json={"status": "done", "queue": "m"}).status_code == 400
    assert client.post("/api/jobs/retry", headers=AUTH, content=b"[1]").status_code == 400
    assert client.post("/api/jobs/retry", headers=AUTH, content=b"{nope").status_code == 400
    retried = client.post("/api/jobs/retry", headers=AUTH, json={"queue": "mail", "q": "timeout"}).json()["action"]
    assert retried["job_count"] == 1 and queue.statuses(failed) == {failed[0]: "pending", failed[1]: "failed"}
    cancelled = client.post("/api/jobs/cancel", headers=AUTH, json={"queue": "other"}).json()["action"]
    assert cancelled["job_count"] == 1 and queue.statuses(pending) == {pending[0]: "pending", pending[1]: "cancelled"}


def test_a_bulk_action_by_filter_walks_bounded_windows_of_every_status_it_changes(
    client: TestClient, queue: Queue, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_ui, "BULK_SCAN", 3)  # windows of 3 candidates, batches of 2 matches: many batches
    monkeypatch.setattr(store_ui, "BATCH", 2)
    monkeypatch.setattr(store_ui, "BULK_SECONDS", 0.0)  # one batch a request: each answer is a 202 until the end

    def bulk(verb: str, body: dict[str, str]) -> dict[str, Any]:
        for _ in range(50):
            r = client.post(f"/api/jobs/{verb}", headers=AUTH | {"Idempotency-Key": verb}, json=body)
            if r.status_code == 200:
                return dict(r.json()["action"])
            assert r.status_code == 202, r.text
        raise AssertionError("the bulk action never finished")

    errors = [f"TimeoutError: call {n}" if n % 3 else f"KeyError: 'k{n}'" for n in range(12)]
    failed = add_failed(pg_dsn, schema, errors, queue="mail")
    timeouts = [i for i, e in zip(failed, errors, strict=True) if e.startswith("TimeoutError")]
    elsewhere = add_failed(pg_dsn, schema, ["TimeoutError: call 99"], queue="other")
    cancelled = add_failed(pg_dsn, schema, ["TimeoutError: call 7"], queue="mail")
    execute_in(pg_dsn, schema, "UPDATE {}.jobs SET status = 'cancelled' WHERE id = %s", cancelled)
    retried = bulk("retry", {"queue": "mail", "q": "timeout"})
    assert retried["detail"]["finished"] is True and retried["job_count"] == len(timeouts) + 1
    assert set(queue.statuses(timeouts + cancelled).values()) == {"pending"}
    assert set(queue.statuses([i for i in failed if i not in timeouts] + elsewhere).values()) == {"failed"}

    running = [j.id for j in queue.claim("mail", limit=3, worker="w-test")]  # three run, the rest stay pending
    live = timeouts + cancelled + [queue.enqueue("mail", {"n": n}).id for n in range(4)]
    other = queue.enqueue("other", {}).id
    live += [queue.enqueue("mail", {"n": n}, after=[other]).id for n in range(3)]  # waiting for a job of "other"
    stopped = bulk("cancel", {"queue": "mail"})
    assert stopped["detail"]["finished"] is True and stopped["job_count"] == len(live)
    assert len(running) == 3 and set(running) <= set(live)
    assert set(queue.statuses(live).values()) == {"cancelled"} and queue.statuses([other]) == {other: "pending"}


def test_a_bulk_batch_reads_its_statuses_through_their_own_indexes_not_the_done_jobs(
    queue: Queue, pg_dsn: str, schema: str
) -> None:
    """The plan of one batch on a table of mostly done jobs: every job it reads comes through a partial index of
    a status it changes; none through the primary key or a sequential scan (which walk the done jobs)."""
    s = sql.Identifier(schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (queue, task, payload, status) SELECT 'mail', 'send', '{{}}', 'done' "
                "FROM generate_series(1, 20000)"
            ).format(s)
        )
        add_failed(pg_dsn, schema, ["TimeoutError: call 1"], queue="mail")
        queue.enqueue("mail", {})
        conn.execute(sql.SQL("ANALYZE {}.jobs").format(s))
        statement = queries_for(schema).ui_filter_batch
        params = store_ui.JobFilter(queue="mail", text="timeout").params()
        for retry in (True, False):
            args = params | {"retry": retry, "after": 0, "upto": 2**62, "scan": 10_000, "limit": 500}
            plan = conn.execute("EXPLAIN (FORMAT JSON) " + statement, args).fetchone()[0]  # type: ignore[index]
            scans = list(_scans(plan[0]["Plan"]))
            assert scans and all(
                node["Node Type"] != "Seq Scan" and node.get("Index Name") != "jobs_pkey" for node in scans
            ), scans


def _scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if node.get("Relation Name") == "jobs":
        yield {k: node.get(k) for k in ("Node Type", "Index Name")}
    for child in node.get("Plans", []):
        yield from _scans(child)


def test_job_pages_are_keyset_paginated_and_a_sparse_filter_reads_a_bounded_window(
    client: TestClient, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = list(queue.enqueue_many("default", [{"n": n} for n in range(12)]))
    seen: list[int] = []
    url = "/api/jobs?limit=5"
    while url:
        page = client.get(url).json()
        seen += [j["id"] for j in page["jobs"]]
        url = f"/api/jobs?limit=5&before={page['next_before']}" if page["next_before"] else ""
    assert seen == sorted(ids, reverse=True)
    monkeypatch.setattr(store_ui, "SCAN", 4)  # a window of 4 rows: a filter matching nothing gives short pages
    page = client.get("/api/jobs?status=failed&queue=default&task=none").json()
    assert page["jobs"] == [] and page["next_before"] is None  # no failed job at all: the failed window is empty
    page = client.get("/api/jobs?task=none").json()
    assert page["jobs"] == [] and page["next_before"] == sorted(ids)[-4]
    assert client.get("/api/jobs").json()["table_rows_estimate"] >= 0


def test_hide_payloads_shows_only_sizes(make_client: Callable[..., TestClient], pg_dsn: str, schema: str) -> None:
    hidden = make_client(hide_payloads=True)
    failed = add_failed(pg_dsn, schema, ["ValueError: secret@example.com is invalid"])[0]
    job = hidden.get(f"/api/jobs/{failed}").json()["job"]
    assert job["payload"] is None and job["payload_hidden"] and job["payload_bytes"] > 0
    assert job["last_error"] is None and job["last_error_bytes"] == len("ValueError: secret@example.com is invalid")
    assert "error" not in job["errors"][0] and job["errors"][0]["error_bytes"] > 0
    assert "secret@example.com" not in hidden.get(f"/jobs/{failed}").text
    assert "secret@example.com" not in hidden.get("/jobs").text
    assert "secret@example.com" not in hidden.get("/api/failures").text
    for url in ("/api/jobs?q=secret@example.com", "/jobs?q=secret"):  # a search would tell what the errors hold
        r = hidden.get(url)
        assert r.status_code == 400 and "off with --hide-payloads" in r.text
    assert 'name="q"' not in hidden.get("/jobs").text
    acting = make_client(hide_payloads=True, token=TOKEN)
    r = acting.post("/api/jobs/retry", headers=AUTH, json={"queue": "default", "q": "secret"})
    assert r.status_code == 400 and audit_rows(pg_dsn, schema) == []
    assert [j["id"] for j in acting.get("/api/jobs?status=failed").json()["jobs"]] == [failed]


def test_a_trusted_proxy_header_is_honoured_only_when_configured(
    make_client: Callable[..., TestClient], pg_dsn: str, schema: str
) -> None:
    failed = add_failed(pg_dsn, schema, ["RuntimeError: a", "RuntimeError: b"])
    proxied = make_client(trusted_user_header="X-Forwarded-User")
    assert proxied.post(f"/api/jobs/{failed[0]}/retry").status_code == 403
    ok = proxied.post(f"/api/jobs/{failed[0]}/retry", headers={"X-Forwarded-User": "alice@example.com"})
    assert ok.json()["action"]["actor"] == "alice@example.com"
    tokened = make_client(token="another-token-0123456789")
    refused = tokened.post(f"/api/jobs/{failed[1]}/retry", headers={"X-Forwarded-User": "mallory"})
    assert refused.status_code == 401
    assert [r["actor"] for r in audit_rows(pg_dsn, schema)] == ["alice@example.com"]


def test_forms_need_a_login_and_their_csrf_token(client: TestClient, queue: Queue, pg_dsn: str, schema: str) -> None:
    failed = add_failed(pg_dsn, schema, ["RuntimeError: x"])[0]
    page = client.get(f"/jobs/{failed}").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)[1]  # type: ignore[index]
    no_login = client.post(f"/jobs/{failed}/retry", data={"csrf": csrf, "action_key": "k1"})
    assert no_login.status_code == 403 and "log in" in no_login.text
    wrong = client.post("/login", data={"csrf": csrf, "token": "wrong-token-000000000"})
    assert wrong.status_code == 401 and "wrong token" in wrong.text
    no_csrf = client.post("/login", data={"token": "test-token-0123456789"})
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
    logged = client.post("/login", data={"csrf": csrf, "token": "test-token-0123456789", "next": "/jobs"})
    assert logged.status_code == 303 and logged.headers["location"] == "/jobs"
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get(f"/jobs/{failed}").text)[1]  # type: ignore[index]
    forged = client.post(f"/jobs/{failed}/retry", data={"csrf": "forged", "action_key": "k2"})
    assert forged.status_code == 403 and queue.statuses([failed]) == {failed: "failed"}
    done = client.post(f"/jobs/{failed}/retry", data={"csrf": csrf, "action_key": "k3", "next": "//evil.example"})
    assert done.status_code == 303 and done.headers["location"] == f"/jobs/{failed}"
    assert queue.statuses([failed]) == {failed: "pending"}
    assert "retry job" in client.get(f"/jobs/{failed}").text  # the flash message
    assert [(r["actor"], r["action"]) for r in audit_rows(pg_dsn, schema)] == [("ops", "retry")]
    assert client.post("/logout", data={"csrf": csrf}).status_code == 303


def test_the_app_mounts_inside_another_asgi_app(settings: object, queue: Queue) -> None:
    from fastapi import FastAPI

    from skiplock.ui import UiConfig, create_app

    outer = FastAPI()
    outer.mount("/ops/queue", create_app(settings, UiConfig()))  # type: ignore[arg-type]
    queue.enqueue("default", {})
    with TestClient(outer) as c:
        page = c.get("/ops/queue/queues")
        assert page.status_code == 200 and 'href="/ops/queue/jobs"' in page.text
        assert c.get("/ops/queue/api/queues").json()["queues"][0]["ready"] == 1
        assert c.get("/ops/queue/static/ui.js").status_code == 200


def test_a_bulk_action_out_of_time_answers_202_and_goes_on_when_sent_again(
    client: TestClient, queue: Queue, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_ui, "BATCH", 2)
    monkeypatch.setattr(store_ui, "BULK_SECONDS", 0.0)  # one batch a request
    ids = add_failed(pg_dsn, schema, [f"ValueError: bad amount {n}" for n in range(5)])
    fp = group_of(client, ids[0])
    headers = AUTH | {"Idempotency-Key": "slow-1"}
    answers = [client.post(f"/api/failures/{fp}/retry", headers=headers) for _ in range(4)]
    assert [a.status_code for a in answers] == [202, 202, 200, 200]
    assert [a.json()["action"]["job_count"] for a in answers] == [2, 4, 5, 5]
    assert answers[0].json()["continue_with_key"] == "slow-1"
    assert [a.json()["action"]["repeated"] for a in answers] == [False, False, False, True]
    assert set(queue.statuses(ids).values()) == {"pending"}
    assert len(audit_rows(pg_dsn, schema)) == 1


def test_a_bulk_form_out_of_time_sends_itself_again(
    client: TestClient, queue: Queue, pg_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_ui, "BATCH", 2)
    monkeypatch.setattr(store_ui, "BULK_SECONDS", 0.0)
    ids = add_failed(pg_dsn, schema, [f"ValueError: bad amount {n}" for n in range(3)])
    fp = group_of(client, ids[0])
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)[1]  # type: ignore[index]
    client.post("/login", data={"csrf": csrf, "token": "test-token-0123456789"})
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/queues").text)[1]  # type: ignore[index]
    first = client.post(f"/failures/{fp}/retry", data={"csrf": csrf, "action_key": "form-1"})
    assert first.status_code == 303
    page = client.get(first.headers["location"]).text
    resume = re.search(
        r'<form method="post" action="([^"]+)" id="continue" data-autosubmit="1">(.*?)</form>', page, re.S
    )
    assert resume is not None and resume[1] == f"/failures/{fp}/retry" and 'value="form-1"' in resume[2]
    fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', resume[2]))
    assert client.post(resume[1], data=fields).status_code == 303
    assert set(queue.statuses(ids).values()) == {"pending"}
    assert [r["job_count"] for r in audit_rows(pg_dsn, schema)] == [3]


def test_queues_workers_and_limits_are_keyset_paginated(
    client: TestClient, queue: Queue, pg_dsn: str, schema: str
) -> None:
    """Pages of 2 walk every queue, worker and limit once, in order; the pages link to the next one."""
    names = [f"q{n}" for n in range(5)]
    for name in names:  # in each queue a job runs and the next of its serial key waits behind it
        queue.enqueue(name, {}, serial_key=f"k-{name}")
        queue.enqueue(name, {}, serial_key=f"k-{name}")
        assert len(queue.claim(name, limit=1, worker=f"w-{name}")) == 1
    execute_in(
        pg_dsn,
        schema,
        "INSERT INTO {}.task_limits (task, global_concurrency) SELECT 't' || n, n FROM generate_series(1, 5) AS n",
    )

    def walk(path: str, key: str, field: str, cursor: str) -> list[str]:
        seen, url = [], f"{path}?limit=2"
        while url:
            page = client.get(url).json()
            assert len(page[key]) <= 2
            seen += [row[field] for row in page[key]]
            url = f"{path}?limit=2&{cursor}={page['next_' + cursor]}" if page["next_" + cursor] else ""
        return seen

    assert walk("/api/queues", "queues", "queue", "after") == names
    assert walk("/api/workers", "workers", "worker", "after") == [f"w-{n}" for n in names]
    assert walk("/api/limits", "limits", "task", "after") == [f"t{n}" for n in range(1, 6)]
    assert walk("/api/limits", "waiting", "queue", "waiting_after") == names
    first = client.get("/api/queues?limit=2").json()
    assert [q["processing"] for q in first["queues"]] == [1, 1] and first["next_after"] == "q1"
    assert 'href="/queues?after=q1&amp;limit=2"' in client.get("/queues?limit=2").text
    assert 'href="/workers?after=0%3Aw-q1&amp;limit=2"' in client.get("/workers?limit=2").text
    limits_page = client.get("/limits?limit=2").text
    assert 'href="/limits?after=t2&amp;limit=2"' in limits_page
    assert 'href="/limits?waiting_after=q1&amp;limit=2"' in limits_page


def test_the_job_page_shows_result_parents_and_children(
    client: TestClient, make_client: Callable[..., TestClient], queue: Queue, pg_dsn: str, schema: str
) -> None:
    parent = queue.enqueue("default", {"order": 1}).id
    child = queue.enqueue("default", {"order": 2}, after=[parent]).id
    execute_in(  # the parent ends as a worker would, with a result
        pg_dsn,
        schema,
        """UPDATE {}.jobs SET status = 'done', result = '{{"receipt": "r-1"}}' WHERE id = %s""",
        [parent],
    )
    job = client.get(f"/api/jobs/{parent}").json()["job"]
    assert job["result"] == {"receipt": "r-1"} and job["children"] == [
        {"kind": "child", "id": child, "status": "pending"}
    ]
    waiting = client.get(f"/api/jobs/{child}").json()["job"]
    assert waiting["parents"] == [{"kind": "parent", "id": parent, "status": "done"}] and waiting["waiting_on"] == 0
    html = client.get(f"/jobs/{parent}").text
    assert "r-1" in html and f'/jobs/{child}"' in html
    hidden_client = make_client(hide_payloads=True)
    hidden = hidden_client.get(f"/api/jobs/{parent}").json()["job"]
    assert hidden["result"] is None and hidden["result_hidden"] is True
    assert hidden["result_bytes"] == len('{"receipt":"r-1"}'), "a hidden result shows only its size"
    page = hidden_client.get(f"/jobs/{parent}").text
    assert "r-1" not in page and "17 bytes" in page
