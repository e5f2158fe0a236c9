"""``skiplock grant`` recommends and sets a CONNECTION LIMIT per role (issue 37 item 10): the bound the server
enforces on a tenant's roles, beyond the operator's per-server cap."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from skiplock.errors import ConfigError
from skiplock.grant import apply_grants, grant_sql, parse_connection_limits, recommended_connection_limit
from skiplock.settings import WORKER_EXTRA_CONNECTIONS
from support.roles import Roles, login_roles


@pytest.fixture
def roles(pg_dsn: str, schema: str) -> Iterator[Roles]:
    with login_roles(pg_dsn, schema) as made:
        yield made


def limit_of(pg_dsn: str, role: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT rolconnlimit FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    assert row is not None
    return int(row[0])


def test_the_recommendation_is_replicas_times_concurrency_plus_the_extra_connections() -> None:
    assert recommended_connection_limit(10, 4) == 10 * (4 + WORKER_EXTRA_CONNECTIONS)
    assert recommended_connection_limit(0, 1) == 0
    with pytest.raises(ConfigError):
        recommended_connection_limit(-1, 4)


def test_limits_are_checked_and_quoted() -> None:
    assert parse_connection_limits(["w=12", "odd=name=3"]) == {"w": 12, "odd=name": 3}
    for bad in (["w"], ["w=x"], ["=3"]):
        with pytest.raises(ConfigError, match="ROLE=N"):
            parse_connection_limits(bad)
    with pytest.raises(ConfigError, match="not one of the roles named"):
        grant_sql("s", worker="w", connection_limits={"other": 3})
    with pytest.raises(ConfigError, match=">= -1"):
        grant_sql("s", worker="w", connection_limits={"w": -2})
    [statement] = [st for st in grant_sql("s", worker='we"ird', connection_limits={'we"ird': 7}) if "LIMIT" in str(st)]
    assert statement.as_string(None) == 'ALTER ROLE "we""ird" CONNECTION LIMIT 7'


def test_grant_sets_the_connection_limit_the_server_enforces(pg_dsn: str, schema: str, roles: Roles) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        apply_grants(conn, schema, worker=roles.worker, connection_limits={roles.worker: 1})
    assert limit_of(pg_dsn, roles.worker) == 1
    with (
        psycopg.connect(roles.dsn(pg_dsn, roles.worker)),  # the first connection is allowed
        pytest.raises(psycopg.OperationalError, match="too many connections"),
    ):
        psycopg.connect(roles.dsn(pg_dsn, roles.worker)).close()  # the second is refused by the server
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        apply_grants(conn, schema, worker=roles.worker, connection_limits={roles.worker: -1})
    assert limit_of(pg_dsn, roles.worker) == -1


def test_the_cli_recommends_a_limit_and_sets_one(pg_dsn: str, schema: str, roles: Roles) -> None:
    def grant(*extra: str) -> str:
        cmd = [sys.executable, "-m", "skiplock", "grant", "--dsn", pg_dsn, "--schema", schema, "--worker", roles.worker]
        done = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    assert f"--connection-limit {roles.worker}=N" in grant()
    out = grant("--connection-limit", f"{roles.worker}=40")
    assert "hint" not in out and limit_of(pg_dsn, roles.worker) == 40
