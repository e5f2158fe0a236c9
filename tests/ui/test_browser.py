"""The UI in a real headless Chromium (Debian's ``chromium``, driven by Playwright with that binary), against a
real PostgreSQL and a real ``skiplock worker``: a failed job retried to done, a failure group's canary then the
rest, cancel, pause and resume, the queues page's live refresh, and actions refused without a token. Each page is
saved as a screenshot under ``tests/artifacts/ui/`` (two of them are in docs/img/)."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import uvicorn
from psycopg import sql

from skiplock import Queue, Settings
from skiplock.migrate import migrate
from skiplock.ui import UiConfig, create_app
from skiplock.ui.server import bind
from support.ci import missing
from support.pg import drop_schema
from support.workers import WorkerProcess

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "ui"
TOKEN = "browser-token-0123456789"
QUEUE = "orders"
WAIT = 30.0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install -e '.[test]')")
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        missing("no chromium (apt-get install chromium chromium-driver)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def db(pg_dsn: str) -> Iterator[Settings]:
    """One schema for the module (its worker and servers live as long), with the handler's ``fixed`` table."""
    schema = f"t_ui_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        migrate(conn, schema)
        conn.execute(sql.SQL("CREATE TABLE {}.fixed (at timestamptz)").format(sql.Identifier(schema)))
    yield Settings.load(env={}, dsn=pg_dsn, schema=schema)
    drop_schema(pg_dsn, schema)


class Served:
    """The app served by uvicorn in a thread on a free port."""

    def __init__(self, settings: Settings, config: UiConfig) -> None:
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = create_app(settings, config)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def ui(db: Settings) -> Iterator[str]:
    served = Served(db, UiConfig(token=TOKEN, token_name="ops"))
    yield served.url
    served.stop()


@pytest.fixture(scope="module")
def readonly_ui(db: Settings) -> Iterator[str]:
    served = Served(db, UiConfig())
    yield served.url
    served.stop()


@pytest.fixture(scope="module")
def worker(db: Settings) -> Iterator[WorkerProcess]:
    w = WorkerProcess(
        db.require_dsn(), db.schema, QUEUE, "ui.handlers:until_fixed", poll_seconds=0.3, max_attempts=1, concurrency=4
    )
    yield w
    w.stop()


@pytest.fixture(scope="module")
def queue(db: Settings) -> Iterator[Queue]:
    with Queue(settings=db, max_size=2) as q:
        yield q


@pytest.fixture
def page(browser: Any, ui: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    yield pg
    context.close()


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def until(check: Callable[[], bool], what: str, page: Any = None) -> None:
    """Wait for ``check`` (reloading ``page`` between tries), at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)
        if page is not None:
            page.reload()


def fixed(db: Settings, yes: bool) -> None:
    with psycopg.connect(db.require_dsn(), autocommit=True) as conn:
        table = sql.Identifier(db.schema)
        conn.execute(sql.SQL("DELETE FROM {}.fixed").format(table))
        if yes:
            conn.execute(sql.SQL("INSERT INTO {}.fixed VALUES (now())").format(table))


def failed_jobs(queue: Queue, db: Settings, n: int, worker: WorkerProcess) -> list[int]:
    """``n`` jobs the real worker fails (the cause not fixed yet)."""
    fixed(db, False)
    ids = list(queue.enqueue_many(QUEUE, [{"order": 1000 + i} for i in range(n)], max_attempts=1))
    until(lambda: set(queue.statuses(ids).values()) == {"failed"}, f"the worker to fail {ids}")
    assert worker.alive, worker.output()
    with psycopg.connect(db.require_dsn(), autocommit=True) as conn:  # a job another cause failed is left out
        q = sql.SQL(
            "SELECT id FROM {}.jobs WHERE id = ANY(%s) AND last_error LIKE 'RuntimeError: upstream%%' ORDER BY id"
        ).format(sql.Identifier(db.schema))
        return [r[0] for r in conn.execute(q, (ids,)).fetchall()]


def log_in(page: Any, ui: str) -> None:
    page.goto(f"{ui}/login")
    page.fill("input[name=token]", TOKEN)
    page.click("text=Log in >> nth=-1")
    page.wait_for_url(f"{ui}/queues")
    assert "logged in as ops" in page.inner_text(".flash")


def test_without_a_token_the_buttons_are_refused(
    browser: Any, readonly_ui: str, queue: Queue, db: Settings, worker: WorkerProcess
) -> None:
    job = failed_jobs(queue, db, 1, worker)[0]
    pg = browser.new_page()
    pg.goto(f"{readonly_ui}/jobs/{job}")
    assert pg.inner_text(".who") == "read-only"
    pg.click("button:has-text('Retry')")
    assert "Error 403" in pg.inner_text("h1") and "read-only" in pg.inner_text(".error")
    shot(pg, "refused-without-token")
    assert queue.statuses([job]) == {job: "failed"}
    pg.close()
    with psycopg.connect(db.require_dsn(), autocommit=True) as conn:  # out of the next tests' failure group
        conn.execute(sql.SQL("DELETE FROM {}.jobs WHERE id = %s").format(sql.Identifier(db.schema)), (job,))


def test_a_failed_job_is_retried_to_done(page: Any, ui: str, queue: Queue, db: Settings, worker: WorkerProcess) -> None:
    job = failed_jobs(queue, db, 1, worker)[0]
    log_in(page, ui)
    page.goto(f"{ui}/jobs?status=failed")
    shot(page, "jobs")
    page.click(f"a[href='/jobs/{job}']")
    assert "upstream rejected order 1000" in page.inner_text("pre.err")
    shot(page, "job-failed")
    fixed(db, True)
    page.click("button:has-text('Retry')")
    assert f"retry job {job}: 1 job(s)" in page.inner_text(".flash")
    until(lambda: "done" in page.inner_text("h1 .status"), "the retried job to be done", page)
    shot(page, "job-done")
    assert queue.statuses([job]) == {job: "done"}


def test_a_failure_group_canary_then_the_rest(
    page: Any, ui: str, queue: Queue, db: Settings, worker: WorkerProcess
) -> None:
    ids = failed_jobs(queue, db, 6, worker)
    log_in(page, ui)
    page.goto(f"{ui}/failures")
    row = page.locator("#groups tr", has_text="upstream rejected order <n> (request <uuid>)")
    assert row.locator("td.n").inner_text() == str(len(ids))
    shot(page, "failures")
    row.locator("a").first.click()
    shot(page, "failure-group")
    fixed(db, True)
    page.fill("#canary-form input[name=canary]", "2")
    page.click("#canary-form button")
    assert page.inner_text("#canary h2").startswith("Canary #")
    until(lambda: "Canary succeeded" in page.inner_text("#canary"), "the canary to succeed", page)
    assert sorted(i for i, s in queue.statuses(ids).items() if s == "done") == ids[:2]
    shot(page, "canary-succeeded")
    page.click("button:has-text('Canary succeeded: retry the rest')")
    assert "retry_group" in page.inner_text(".flash") and f"{len(ids) - 2} job(s)" in page.inner_text(".flash")
    until(lambda: set(queue.statuses(ids).values()) == {"done"}, "the rest of the group to be done")
    page.goto(f"{ui}/audit")
    actions = page.locator("#audit tbody tr td:nth-child(4)").all_inner_texts()
    assert actions[:2] == ["retry_group", "retry_group_canary"]
    shot(page, "audit")


def test_cancel_a_pending_job(page: Any, ui: str, queue: Queue) -> None:
    job = queue.enqueue(QUEUE, {"order": 7}, delay=3600).id
    log_in(page, ui)
    page.goto(f"{ui}/jobs/{job}")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Cancel')")
    assert "cancelled" in page.inner_text("h1 .status")
    assert queue.statuses([job]) == {job: "cancelled"}


def test_pause_resume_and_the_live_refresh_of_the_queues(page: Any, ui: str, queue: Queue, db: Settings) -> None:
    queue.enqueue(QUEUE, {"order": 0}, delay=3600)  # the queue has a live job: it is listed
    log_in(page, ui)
    page.goto(f"{ui}/queues")
    row = page.locator(f"tr[data-queue='{QUEUE}']")
    row.locator("button:has-text('Pause')").click()
    assert row.locator(".status").inner_text() == "paused" and queue.paused() == [QUEUE]
    shot(page, "queues-paused")
    row.locator("button:has-text('Resume')").click()
    assert row.locator(".status").inner_text() == "running" and queue.paused() == []
    page.evaluate("window.__notReloaded = true")
    before = row.locator("[data-k=delayed]").inner_text()
    queue.enqueue_many(QUEUE, [{"order": -i} for i in range(3)], delay=3600)
    until(lambda: row.locator("[data-k=delayed]").inner_text() != before, "the live refresh of the delayed count")
    assert page.evaluate("window.__notReloaded") is True  # updated in place, not by a reload
    assert "live ·" in page.inner_text("#live")
    shot(page, "queues")


def test_every_other_page_renders(page: Any, ui: str) -> None:
    for name in ("schedules", "limits", "workers"):
        page.goto(f"{ui}/{name}")
        assert page.inner_text("h1") == name.capitalize()
        shot(page, name)
    assert "worker" in page.inner_text("#workers")  # the real worker finished jobs: it shows
