"""The server-rendered pages (the API's reads through templates) and their forms' actions (POST, CSRF-checked,
then a redirect back with what happened)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from skiplock.ui import api
from skiplock.ui.auth import Denied, check_csrf, form_actor, login
from skiplock.ui.render import page

Read = Callable[[Request], Awaitable[dict[str, Any]]]


def _view(template: str, read: Read, title: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        data = await read(request)
        context = data | {"title": title, "query": dict(request.query_params), "action_key": uuid.uuid4().hex}
        return page(request, template, context)

    return endpoint


def _back(request: Request, form: Any, fallback: str) -> str:
    """Where a form returns to: its ``next`` when it is a path of this app, else ``fallback``."""
    root = request.scope.get("root_path", "")
    nxt = form.get("next")
    if isinstance(nxt, str) and nxt.startswith(f"{root}/") and not nxt.startswith("//") and "\\" not in nxt:
        return nxt
    return f"{root}{fallback}"


def _said(result: dict[str, Any]) -> str:
    again = " (already done: this form was sent before)" if result.get("repeated") else ""
    detail = result.get("detail") or {}
    canary = f"; canary #{result['id']}: {len(detail.get('canary', []))} job(s)" if "canary" in detail else ""
    return f"{result['action']} {result['target']}: {result['job_count']} job(s){canary}{again}"


def _form_action(kind: str, fallback: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        form = await request.form()
        actor = form_actor(request, request.app.state.config, form)
        act = api.action_for(kind, request.path_params, form, request.app.state.config)
        key = api.action_key(form.get("action_key"))
        result = await act(await api.store_of(request), actor, key)
        request.session["flash"] = _said(result)
        if (result.get("detail") or {}).get("finished") is False:
            # a bulk action's time ran out: the next page sends the same form again (ui.js), which goes on
            fields = {k: str(v) for k, v in form.items()} | {"action_key": key}
            request.session["continue"] = {"url": str(request.url.path), "fields": fields}
            request.session["flash"] += " so far, continuing…"
        target = fallback.format(**request.path_params)
        if kind == "retry_group" and "canary" in (result.get("detail") or {}):
            target += f"?canary={result['id']}"
            return RedirectResponse(f"{request.scope.get('root_path', '')}{target}", status_code=303)
        return RedirectResponse(_back(request, form, target), status_code=303)

    return endpoint


async def login_page(request: Request) -> Response:
    if request.method == "POST":
        form = await request.form()
        try:
            who = login(request, request.app.state.config, form)
        except Denied as exc:
            return page(request, "login.html", {"title": "Log in", "error": str(exc)}, status=exc.status)
        request.session["flash"] = f"logged in as {who}"
        return RedirectResponse(_back(request, form, "/queues"), status_code=303)
    return page(request, "login.html", {"title": "Log in", "next": request.query_params.get("next", "")})


async def logout(request: Request) -> Response:
    form = await request.form()
    check_csrf(request.session, form)
    request.session.clear()
    return RedirectResponse(f"{request.scope.get('root_path', '')}/queues", status_code=303)


async def home(request: Request) -> Response:
    return RedirectResponse(f"{request.scope.get('root_path', '')}/queues", status_code=307)


def routes() -> list[Route]:
    post = ["POST"]
    return [
        Route("/", home),
        Route("/login", login_page, methods=["GET", "POST"]),
        Route("/logout", logout, methods=post),
        Route("/queues", _view("queues.html", api.read_queues, "Queues")),
        Route("/queues/{queue}/pause", _form_action("pause", "/queues"), methods=post),
        Route("/queues/{queue}/resume", _form_action("resume", "/queues"), methods=post),
        Route("/jobs", _view("jobs.html", api.read_jobs, "Jobs")),
        Route("/jobs/retry", _form_action("retry_filter", "/jobs"), methods=post),
        Route("/jobs/cancel", _form_action("cancel_filter", "/jobs"), methods=post),
        Route("/jobs/{job_id}", _view("job.html", api.read_job, "Job")),
        Route("/jobs/{job_id}/retry", _form_action("retry_job", "/jobs/{job_id}"), methods=post),
        Route("/jobs/{job_id}/cancel", _form_action("cancel_job", "/jobs/{job_id}"), methods=post),
        Route("/failures", _view("failures.html", api.read_failures, "Failures")),
        Route("/failures/{fingerprint}", _view("group.html", api.read_failure, "Failure group")),
        Route("/failures/{fingerprint}/retry", _form_action("retry_group", "/failures/{fingerprint}"), methods=post),
        Route(
            "/failures/{fingerprint}/retry-rest", _form_action("retry_rest", "/failures/{fingerprint}"), methods=post
        ),
        Route("/failures/{fingerprint}/cancel", _form_action("cancel_group", "/failures/{fingerprint}"), methods=post),
        Route("/schedules", _view("schedules.html", api.read_schedules, "Schedules")),
        Route("/limits", _view("limits.html", api.read_limits, "Limits")),
        Route("/workers", _view("workers.html", api.read_workers, "Workers")),
        Route("/audit", _view("audit.html", api.read_audit, "Audit")),
    ]
