"""The UI connected as the ``ui`` role of ``skiplock grant``: every page and action works, and the role can do
nothing more (no insert or delete of jobs, no payload change, no rewrite of the audit trail, no DDL)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors, sql
from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

from skiplock import Queue, Settings
from skiplock.grant import UI_JOB_COLUMNS, apply_grants, grant_sql
from skiplock.ui import UiConfig, create_app
from ui.conftest import AUTH, TOKEN, add_failed, audit_rows

PASSWORD = "Ui-s3cr3t%x"


def test_grant_sql_gives_the_ui_role_reads_its_actions_columns_and_the_audit_table() -> None:
    joined = "\n".join(s.as_string(None) for s in grant_sql("sk", ui="ops ui"))
    columns = ", ".join(f'"{c}"' for c in UI_JOB_COLUMNS)
    assert f'GRANT UPDATE ({columns}) ON "sk"."jobs" TO "ops ui"' in joined
    assert 'GRANT SELECT, INSERT ON "sk"."ui_audit" TO "ops ui"' in joined
    assert 'GRANT UPDATE ("job_count", "detail") ON "sk"."ui_audit" TO "ops ui"' in joined
    assert "DELETE" not in joined and "OWNER" not in joined and 'INSERT ON "sk"."jobs"' not in joined
    with pytest.raises(Exception, match="cannot also be"):
        grant_sql("sk", ui="a", operator="a")


@pytest.fixture
def ui_role(pg_dsn: str, schema: str) -> Iterator[str]:
    role = f"sk_ui_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(PASSWORD)))
        apply_grants(conn, schema, ui=role)
    yield role
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_ui_works_connected_as_the_ui_role(pg_dsn: str, schema: str, queue: Queue, ui_role: str) -> None:
    dsn = make_conninfo(pg_dsn, user=ui_role, password=PASSWORD)
    settings = Settings.load(env={}, dsn=dsn, schema=schema)
    live = queue.enqueue("default", {"n": 1}).id
    failed = add_failed(pg_dsn, schema, [f"RuntimeError: order {n} rejected" for n in range(4)])
    with TestClient(create_app(settings, UiConfig(token=TOKEN, token_name="ops")), follow_redirects=False) as client:
        for path in ("queues", "jobs", f"jobs/{failed[0]}", "failures", "schedules", "limits", "workers", "audit"):
            assert client.get(f"/api/{path}").status_code == 200, path
            assert client.get(f"/{path}").status_code == 200, path
        fp = client.get(f"/api/jobs/{failed[0]}").json()["job"]["fingerprint"]
        assert client.get(f"/api/failures/{fp}").json()["group"]["jobs"] == 4
        assert client.post(f"/api/jobs/{failed[0]}/retry", headers=AUTH).status_code == 200
        assert client.post(f"/api/jobs/{live}/cancel", headers=AUTH).status_code == 200
        assert client.post("/api/queues/default/pause", headers=AUTH).status_code == 200
        assert client.get("/api/queues").json()["queues"][0]["paused"] is True
        assert client.post("/api/queues/default/resume", headers=AUTH).status_code == 200
        canary = client.post(f"/api/failures/{fp}/retry", headers=AUTH, json={"canary": 1}).json()["action"]
        assert canary["job_count"] == 1
        assert client.post(f"/api/failures/{fp}/cancel", headers=AUTH).json()["action"]["job_count"] == 2
        assert client.post("/api/jobs/retry", headers=AUTH, json={"queue": "default"}).status_code == 200
    assert [r["action"] for r in audit_rows(pg_dsn, schema)] == [
        "retry",
        "cancel",
        "pause",
        "resume",
        "retry_group_canary",
        "cancel_group",
        "retry_filter",
    ]
    assert set(queue.statuses([live, *failed]).values()) == {"pending"}

    jobs, audit = sql.Identifier(schema, "jobs"), sql.Identifier(schema, "ui_audit")
    with psycopg.connect(dsn) as conn:
        for statement in (
            sql.SQL("INSERT INTO {} (queue, payload) VALUES ('q', '{{}}')").format(jobs),
            sql.SQL("DELETE FROM {}").format(jobs),
            sql.SQL("UPDATE {} SET payload = '{{}}'").format(jobs),
            sql.SQL("UPDATE {} SET actor = 'someone else'").format(audit),
            sql.SQL("DELETE FROM {}").format(audit),
            sql.SQL("ALTER TABLE {} ADD COLUMN x int").format(jobs),
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)
            conn.rollback()
