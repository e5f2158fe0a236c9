"""The JSON API under ``/api/`` (the pages read the same functions): reads for anyone who can reach the UI,
``POST`` actions for a bearer token or a trusted proxy's user (see :mod:`skiplock.ui.auth`)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from skiplock.store.ui import RELATIVES_SHOWN, ActionError, JobFilter, UiStore
from skiplock.store.validation import check_queue_name
from skiplock.ui import params as p
from skiplock.ui.auth import Denied, api_actor
from skiplock.ui.config import UiConfig
from skiplock.ui.render import Json, json_error

MAX_BODY = 64 * 1024


# ---------------------------------------------------------------------------------------------- shared reads
def hide(row: dict[str, Any], config: UiConfig) -> dict[str, Any]:
    """A job row as shown: with ``hide_payloads``, payloads, results and errors become their sizes."""
    if not config.hide_payloads:
        return row
    out = dict(row)
    if "payload" in out:
        out["payload"] = None
        out["payload_hidden"] = True
    if out.get("result") is not None:
        out["result_bytes"] = len(orjson.dumps(out["result"]))  # its JSON, compact
        out["result"] = None
        out["result_hidden"] = True
    if out.get("normalised") is not None:  # a group keeps only its error's type: the message may name a person
        out["normalised"] = str(out["normalised"]).split(":", 1)[0] + ": (message hidden)"
    for key in ("last_error", "sample_error"):
        if out.get(key) is not None:
            out[f"{key}_bytes"] = len(str(out[key]).encode())
            out[key] = None
    if isinstance(out.get("errors"), list):
        out["errors"] = [
            {k: v for k, v in e.items() if k not in ("error", "traceback")}
            | {"error_bytes": len(str(e.get("error", "")).encode())}
            for e in out["errors"]
            if isinstance(e, dict)
        ]
    return out


async def store_of(request: Request) -> UiStore:
    store: UiStore = await request.app.state.backend.store()
    return store


def config_of(request: Request) -> UiConfig:
    config: UiConfig = request.app.state.config
    return config


def _only(params: Mapping[str, Any], known: set[str]) -> None:
    unknown = set(params) - known
    if unknown:
        raise p.BadRequest(f"unknown parameter {sorted(unknown)[0]!r}")


async def read_queues(request: Request) -> dict[str, Any]:
    q = request.query_params
    _only(q, {"after", "limit"})
    store = await store_of(request)
    page = await store.queues(after=p.name(q.get("after"), "after"), limit=p.limit(q))
    return {"queues": page.rows, "next_after": page.next}


def searchable(f: JobFilter, config: UiConfig) -> JobFilter:
    """``f``, unless it searches the errors' text while they are hidden: a search would tell what they hold."""
    if f.text is not None and config.hide_payloads:
        raise p.BadRequest("searching the errors' text (q) is off with --hide-payloads: it would tell what they hold")
    return f


async def read_jobs(request: Request) -> dict[str, Any]:
    q = request.query_params
    f = searchable(p.job_filter(q), config_of(request))
    before, limit = p.optional_int(q.get("before"), "before"), p.limit(q)
    store = await store_of(request)
    page = await store.jobs(f, before=before, limit=limit)
    return {
        "jobs": [hide(r, config_of(request)) for r in page.rows],
        "next_before": page.next,
        "filter": {k: v for k, v in vars(f).items() if v is not None},
        "table_rows_estimate": await store.estimate(),
    }


async def read_job(request: Request) -> dict[str, Any]:
    job_id = p.job_id(request.path_params["job_id"])
    store = await store_of(request)
    return {"job": hide(await store.job(job_id), config_of(request)), "relatives_shown": RELATIVES_SHOWN}


async def read_failures(request: Request) -> dict[str, Any]:
    q = request.query_params
    unknown = set(q) - {"queue", "task", "after", "limit"}
    if unknown:
        raise p.BadRequest(f"unknown filter {sorted(unknown)[0]!r}")
    store = await store_of(request)
    page = await store.failure_groups(
        queue=p.name(q.get("queue"), "queue"),
        task=p.name(q.get("task"), "task"),
        after=p.group_cursor(q.get("after")),
        limit=p.limit(q),
    )
    nxt = f"{page.next[0]}-{page.next[1]}" if page.next else None
    return {"groups": [hide(g, config_of(request)) for g in page.rows], "next_after": nxt}


async def read_failure(request: Request) -> dict[str, Any]:
    """A failure group, a page of its jobs and, with ``?canary=<id>``, that canary's jobs and their statuses. A
    group no failed job has any more is a 404, unless a canary is asked for (all of the group may be in it)."""
    fp = p.fingerprint(request.path_params["fingerprint"])
    q = request.query_params
    unknown = set(q) - {"before", "limit", "canary"}
    if unknown:
        raise p.BadRequest(f"unknown parameter {sorted(unknown)[0]!r}")
    canary_id = p.optional_int(q.get("canary"), "canary")
    store = await store_of(request)
    canary = await store.canary(canary_id, fp) if canary_id is not None else None
    group = await store.failure_group(fp, missing_ok=canary is not None)
    before = p.optional_int(q.get("before"), "before")
    page = await store.jobs(JobFilter(fingerprint=fp), before=before, limit=p.limit(q))
    config = config_of(request)
    return {
        "fingerprint": fp,
        "group": hide(group, config) if group else None,
        "jobs": [hide(r, config) for r in page.rows],
        "next_before": page.next,
        "canary": canary,
    }


async def read_schedules(request: Request) -> dict[str, Any]:
    q = request.query_params
    store = await store_of(request)
    page = await store.schedules(after=p.name(q.get("after"), "after"), limit=p.limit(q))
    return {"schedules": page.rows, "next_after": page.next}


async def read_limits(request: Request) -> dict[str, Any]:
    """Two keyset-paginated lists: task limits by task (``after``), held-back jobs by queue (``waiting_after``)."""
    q = request.query_params
    _only(q, {"after", "waiting_after", "limit"})
    store = await store_of(request)
    limits = await store.limits(after=p.name(q.get("after"), "after"), limit=p.limit(q))
    waiting = await store.waiting(after=p.name(q.get("waiting_after"), "waiting_after"), limit=p.limit(q))
    return {
        "limits": limits.rows,
        "next_after": limits.next,
        "waiting": waiting.rows,
        "next_waiting_after": waiting.next,
    }


async def read_workers(request: Request) -> dict[str, Any]:
    q = request.query_params
    _only(q, {"after", "limit"})
    store = await store_of(request)
    page = await store.workers(after=p.worker_cursor(q.get("after")), limit=p.limit(q))
    nxt = f"{page.next[0]}:{page.next[1]}" if page.next else None
    return {"workers": page.rows, "next_after": nxt}


async def read_audit(request: Request) -> dict[str, Any]:
    q = request.query_params
    store = await store_of(request)
    page = await store.audit(before=p.optional_int(q.get("before"), "before"), limit=p.limit(q))
    return {"entries": page.rows, "next_before": page.next}


# ---------------------------------------------------------------------------------------------- shared actions
Action = Callable[[UiStore, str, str], Awaitable[dict[str, Any]]]


def action_key(value: Any) -> str:
    if value in (None, ""):
        return uuid.uuid4().hex
    if not isinstance(value, str) or not 1 <= len(value) <= 100:
        raise p.BadRequest("the action key (Idempotency-Key) must be 1 to 100 characters")
    return value


BULK_FILTERS = ("queue", "task", "q", "since", "until")
ENVELOPE = ("action_key", "csrf", "next")
"""What a body or form carries beside its action's own fields."""


def bulk_filter(body: Mapping[str, Any], verb: str) -> JobFilter:
    """A bulk action's filter: the job list's filters without status (retry takes failed and cancelled jobs,
    cancel pending and running ones); at least one of them must be given. Any other key is refused: a misspelt
    filter left out would widen the action."""
    unknown = set(body) - {*BULK_FILTERS, *ENVELOPE, "status"}
    if unknown:
        raise p.BadRequest(
            f"unknown filter {sorted(unknown)[0]!r}: a bulk {verb} takes {', '.join(BULK_FILTERS)} "
            "(a failure group's jobs: POST /api/failures/{fingerprint}/" + verb + ")"
        )
    given = {k: str(v) for k, v in body.items() if k in BULK_FILTERS and v not in (None, "")}
    if "status" in body and body["status"] not in (None, ""):
        raise p.BadRequest(f"a bulk {verb} picks the statuses itself: leave status out")
    if not given:
        raise p.BadRequest(f"a bulk {verb} needs a filter: queue, task, q, since or until")
    return p.job_filter(given)


def action_for(kind: str, path: Mapping[str, Any], body: Mapping[str, Any], config: UiConfig) -> Action:
    """What one action does, from its kind, the path's parameters and the body or form (checked here: 400)."""
    if kind in ("retry_job", "cancel_job"):
        job_id = p.job_id(str(path["job_id"]))
        if kind == "retry_job":
            return lambda s, actor, key: s.retry_job(job_id, actor=actor, key=key)
        return lambda s, actor, key: s.cancel_job(job_id, actor=actor, key=key)
    if kind in ("pause", "resume"):
        try:
            queue = check_queue_name(str(path["queue"]))
        except ValueError as exc:
            raise p.BadRequest(str(exc)) from None
        return lambda s, actor, key: s.set_paused(queue, kind == "pause", actor=actor, key=key)
    if kind in ("retry_group", "cancel_group", "retry_rest"):
        fp = p.fingerprint(str(path["fingerprint"]))
        if kind == "retry_rest":
            canary_id = p.integer(_str(body.get("canary_id")), "canary_id")
            return lambda s, actor, key: s.retry_rest(fp, canary_id, actor=actor, key=key)
        canary = _str(body.get("canary"))
        if kind == "retry_group" and canary not in (None, "", "0"):
            n = p.integer(canary, "canary", high=1000)
            return lambda s, actor, key: s.retry_canary(fp, n, actor=actor, key=key)
        return lambda s, actor, key: s.bulk(kind, f"group {fp}", actor=actor, key=key, group=fp)
    if kind in ("retry_filter", "cancel_filter"):
        f = searchable(bulk_filter(body, kind.split("_", maxsplit=1)[0]), config)
        target = "jobs " + " ".join(f"{k}={v}" for k, v in vars(f).items() if v is not None)
        return lambda s, actor, key: s.bulk(kind, target, actor=actor, key=key, jobs=f)
    raise p.BadRequest(f"unknown action {kind!r}")


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


# ---------------------------------------------------------------------------------------------- routes
def _json_errors(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The API answers its errors in JSON: ``{"error": message, "status": code}``."""

    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except p.BadRequest as exc:
            return json_error(400, str(exc))
        except (Denied, ActionError) as exc:
            return json_error(exc.status, str(exc))

    return wrapped


def _get(read: Callable[[Request], Awaitable[dict[str, Any]]]) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return Json(await read(request))

    return _json_errors(endpoint)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise p.BadRequest(f"the request body is over {MAX_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise p.BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise p.BadRequest("the request body must be a JSON object")
    return body


def _post(kind: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        actor = api_actor(request, config_of(request))
        body = await _body(request)
        act = action_for(kind, request.path_params, body, config_of(request))
        key = action_key(request.headers.get("idempotency-key") or body.get("action_key"))
        result = await act(await store_of(request), actor, key)
        if (result.get("detail") or {}).get("finished") is False:  # a bulk action's time ran out: POST it again
            return Json(
                {"action": result, "finished": False, "continue_with_key": result["action_key"]}, status_code=202
            )
        return Json({"action": result})

    return _json_errors(endpoint)


def routes() -> list[Route]:
    return [
        Route("/queues", _get(read_queues)),
        Route("/queues/{queue}/pause", _post("pause"), methods=["POST"]),
        Route("/queues/{queue}/resume", _post("resume"), methods=["POST"]),
        Route("/jobs", _get(read_jobs)),
        Route("/jobs/retry", _post("retry_filter"), methods=["POST"]),
        Route("/jobs/cancel", _post("cancel_filter"), methods=["POST"]),
        Route("/jobs/{job_id}", _get(read_job)),
        Route("/jobs/{job_id}/retry", _post("retry_job"), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", _post("cancel_job"), methods=["POST"]),
        Route("/failures", _get(read_failures)),
        Route("/failures/{fingerprint}", _get(read_failure)),
        Route("/failures/{fingerprint}/retry", _post("retry_group"), methods=["POST"]),
        Route("/failures/{fingerprint}/retry-rest", _post("retry_rest"), methods=["POST"]),
        Route("/failures/{fingerprint}/cancel", _post("cancel_group"), methods=["POST"]),
        Route("/schedules", _get(read_schedules)),
        Route("/limits", _get(read_limits)),
        Route("/workers", _get(read_workers)),
        Route("/audit", _get(read_audit)),
    ]
