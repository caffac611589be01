"""The web console (``raydelay console``): server-rendered pages over one cluster client.

Pages: topics (partitions, hosts, append rates, backlog), subscriptions (consumers, in
flight, lateness, dead letters), the due chart of the next hour and the next day, and a
browser of the scheduled messages (peek), a page at a time. Each read page says when it was
read and can reload itself (``?refresh=N``: a meta refresh, no JavaScript). Actions (cancel, reset a cursor, redrive a dead-letter topic)
exist only when the console was started with ``allow_writes``, and each goes through a
confirmation page whose form carries this process's token, so that another site's page
cannot post one blind.
"""

from __future__ import annotations

import hmac
import secrets
import time
from contextlib import asynccontextmanager
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from raydelay import __version__
from raydelay.client.message import MessageId
from raydelay.errors import InvalidArgument, NotFound, RaydelayError
from raydelay.web.attach import ClusterDown
from raydelay.web.chart import Bar, bar_chart
from raydelay.web.guard import SECURITY_HEADERS, allowed_hosts, refusal
from raydelay.web.model import (
    DAY_BIN_S,
    HOUR_BIN_S,
    ConsoleData,
    RateSampler,
    parse_limit,
    parse_offset,
    parse_refresh,
    parse_time,
)
from raydelay.web.tasks_page import TasksData
from raydelay.web.tasks_page import add_routes as add_task_routes

_MAX_IDS = 10_000  # message ids in one cancel
REFRESH_S = 10  # the period the "auto-refresh" link turns on


_STATUSES = {int(s) for s in HTTPStatus}


def create_app(
    cluster: Any,
    *,
    allow_writes: bool = False,
    sample_every_s: float = 5.0,
    listen_host: str = "127.0.0.1",
) -> FastAPI:
    """The console's ASGI app over ``cluster`` (a connected Cluster). ``allow_writes``
    turns the actions on; ``sample_every_s``: how often append rates are read;
    ``listen_host``: the address it is served on (the Host names it answers to, see
    :mod:`raydelay.web.guard`)."""
    data = ConsoleData(cluster)
    rates = RateSampler(data, every_s=sample_every_s)
    token = secrets.token_urlsafe(24)
    web = resources.files("raydelay.web")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(web / "templates")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["num"] = lambda v: "" if v is None else f"{v:,}"
    env.filters["rate"] = lambda v: "-" if v is None else f"{v:,.1f}/s"
    env.filters["q"] = lambda v: quote(str(v), safe="")
    env.filters["article"] = lambda word: (
        ("An " if str(word)[:1] in tuple("aeiou") else "A ") + word
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        rates.start()
        try:
            yield
        finally:
            rates.stop()

    app = FastAPI(title="raydelay console", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=str(web / "static")), name="static")

    def page(
        template: str, status: int = 200, live: dict | None = None, **context: Any
    ) -> HTMLResponse:
        """A page; ``live``: a read page's auto-refresh (:func:`_live`), None on the others.
        ``as_of``: when it was rendered, its data read just before (UTC, as every time)."""
        html = env.get_template(template).render(
            allow_writes=allow_writes,
            token=token,
            version=__version__,
            live=live,
            as_of=time.strftime("%H:%M:%S", time.gmtime()),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    hosts = allowed_hosts(listen_host)

    @app.middleware("http")
    async def _guard(request: Request, call_next: Any) -> Response:
        why = refusal(request.method, request.headers, hosts)
        if why is not None:
            response: Response = page("error.html", status=403, title="Refused", message=why)
        else:
            response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.exception_handler(RaydelayError)
    async def _failed(_: Request, exc: RaydelayError) -> HTMLResponse:
        status = (
            400 if isinstance(exc, InvalidArgument) else 404 if isinstance(exc, NotFound) else 503
        )
        title = {400: "Bad request", 404: "Not found"}.get(status, "Unavailable")
        return page("error.html", status=status, title=title, message=str(exc))

    @app.exception_handler(ClusterDown)
    async def _cluster_down(_: Request, exc: ClusterDown) -> HTMLResponse:
        response = page("error.html", status=503, title="The cluster is down", message=str(exc))
        response.headers["Retry-After"] = "5"
        return response

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        if exc.status_code == 404:
            message = f"There is no page {request.url.path!r} in this console."
            return page("error.html", status=404, title="Not found", message=message)
        if exc.status_code == 405:
            message = (
                f"{request.method} is not how {request.url.path!r} is used: its pages are read "
                "with GET, and actions are posted from their forms."
            )
            return page("error.html", status=405, title="Not allowed", message=message)
        title = HTTPStatus(exc.status_code).phrase if exc.status_code in _STATUSES else "Error"
        return page("error.html", status=exc.status_code, title=title, message=str(exc.detail))

    # --- pages --------------------------------------------------------------------------------

    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return RedirectResponse("/topics", status_code=302)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return FileResponse(str(web / "static" / "favicon.ico"), media_type="image/x-icon")

    @app.get("/topics", response_class=HTMLResponse)
    def topics(request: Request) -> HTMLResponse:
        live = _live(request)
        return page("topics.html", live=live, title="Topics", topics=data.topics(rates))

    @app.get("/topics/{topic}", response_class=HTMLResponse)
    def topic(request: Request, topic: str) -> HTMLResponse:
        live = _live(request)
        info = data.topic(topic, rates)
        held = data.dead_letters(topic) if topic.endswith("-DLQ") else None
        return page("topic.html", live=live, title=topic, topic=info, dead_letters=held)

    @app.get("/subscriptions", response_class=HTMLResponse)
    def subscriptions(request: Request) -> HTMLResponse:
        live = _live(request)
        return page(
            "subscriptions.html", live=live, title="Subscriptions", subs=data.subscriptions()
        )

    @app.get("/topics/{topic}/subscriptions/{name}", response_class=HTMLResponse)
    def subscription(request: Request, topic: str, name: str) -> HTMLResponse:
        live = _live(request)
        sub = data.subscription(topic, name)
        charts = []
        if sub["schedulable"]:
            for chart_id, title, span, step in (
                ("due-hour", "Due in the next hour (5-minute bars)", 3600, HOUR_BIN_S),
                ("due-day", "Due in the next day (hourly bars)", 86400, DAY_BIN_S),
            ):
                bins = data.due_bins(topic, name, span, step)
                svg = bar_chart(
                    [Bar(b.label, b.count) for b in bins],
                    title=title,
                    chart_id=chart_id,
                    unit="due",
                )
                charts.append({"id": chart_id, "title": title, "svg": svg})
        lateness = bar_chart(
            [Bar(b["label"], b["count"]) for b in sub["lateness"]],
            title="First deliveries by lateness",
            chart_id="lateness",
        )
        return page(
            "subscription.html",
            live=live,
            title=f"{topic} / {name}",
            sub=sub,
            charts=charts,
            lateness=lateness,
            measured=sum(b["count"] for b in sub["lateness"]),
            dlq=data.dead_letter_link(topic, name, set(data.topic_names())),
        )

    @app.get("/topics/{topic}/subscriptions/{name}/scheduled", response_class=HTMLResponse)
    def scheduled(
        request: Request,
        topic: str,
        name: str,
        due_after: str | None = None,
        due_before: str | None = None,
        key: str | None = None,
        limit: str | None = None,
        offset: str | None = None,
    ) -> HTMLResponse:
        live = _live(request)
        form = {
            "due_after": due_after or "",
            "due_before": due_before or "",
            "key": key or "",
            "limit": limit or "",
        }
        n, start = parse_limit(limit), parse_offset(offset)
        rows, more = data.scheduled(
            topic,
            name,
            n,
            parse_time("due_after", due_after),
            parse_time("due_before", due_before),
            key or None,
            start,
        )
        return page(
            "scheduled.html",
            live=live,
            title=f"Scheduled: {topic} / {name}",
            topic=topic,
            name=name,
            rows=rows,
            form=form,
            limit=n,
            offset=start,
            previous=_with(request, offset=max(start - n, 0) or None) if start else None,
            next=_with(request, offset=start + n) if more else None,
            back=_with(request, refresh=None),
            dlq=data.dead_letter_link(topic, name, set(data.topic_names())),
        )

    # --- actions: a form, a confirmation, then the deed -----------------------------------------

    async def fields(request: Request) -> dict[str, list[str]]:
        if not allow_writes:
            raise _WritesOff()
        body = (await request.body()).decode("utf-8", "replace")
        return parse_qs(body, keep_blank_values=True)

    def confirmed(form: dict[str, list[str]]) -> None:
        sent = _one(form, "token")
        if not hmac.compare_digest(sent.encode(), token.encode()):
            raise InvalidArgument(
                "token: this confirmation does not come from this console (reload the page)"
            )

    @app.post("/actions/cancel", response_class=HTMLResponse)
    async def cancel(request: Request) -> HTMLResponse:
        form = await fields(request)
        ids = _message_ids(form)
        # checked now, before the question: an id that cannot be cancelled is named here,
        # not after the confirmation
        where = _one(form, "topic", default="") or None
        name = _one(form, "subscription", default="") or None
        refused = await run_in_threadpool(data.uncancellable, ids, where, name)
        ok = [i for i in ids if i not in refused]
        question = (
            f"Cancel {len(ok):,} scheduled message{'s' if len(ok) != 1 else ''}?"
            if ok
            else "The message cannot be cancelled."
            if len(ids) == 1
            else f"None of the {len(ids):,} messages can be cancelled."
        )
        return page(
            "confirm.html",
            status=200 if ok else 409,
            title="Cancel messages",
            question=question,
            details=ok,
            refused=sorted(refused.items()),
            action="/actions/cancel/confirm",
            hidden=[("id", i) for i in ok] + [("back", _back(form))],
            back=_back(form),
            button="Cancel them" if ok else None,
        )

    @app.post("/actions/cancel/confirm", response_class=HTMLResponse)
    async def cancel_confirmed(request: Request) -> HTMLResponse:
        form = await fields(request)
        confirmed(form)
        ids = _message_ids(form)
        outcome = await run_in_threadpool(data.cancel, ids)
        done = sum(ok for _, ok in outcome)
        return page(
            "done.html",
            title="Cancelled",
            summary=f"{done:,} of {len(ids):,} cancelled",
            lines=[
                f"{i}: {'cancelled' if ok else 'not cancelled (delivered already, or cancelled before)'}"
                for i, ok in outcome
            ],
            back=_back(form),
        )

    @app.post("/actions/reset", response_class=HTMLResponse)
    async def reset(request: Request) -> HTMLResponse:
        form = await fields(request)
        topic, name, to = _one(form, "topic"), _one(form, "subscription"), _reset_target(form)
        here = _sub_url(topic, name)
        return page(
            "confirm.html",
            title="Reset a cursor",
            question=f"Move the cursor of {topic} / {name} to {to}?",
            details=[
                "What follows that point is delivered again; cancelled messages stay cancelled.",
                "The subscription must have no consumers.",
            ],
            action="/actions/reset/confirm",
            hidden=[("topic", topic), ("subscription", name), ("to", to)],
            refused=[],
            back=here,
            button="Reset the cursor",
        )

    @app.post("/actions/reset/confirm", response_class=HTMLResponse)
    async def reset_confirmed(request: Request) -> HTMLResponse:
        form = await fields(request)
        confirmed(form)
        topic, name, to = _one(form, "topic"), _one(form, "subscription"), _reset_target(form)
        target: Any = to
        if to not in ("earliest", "latest") and "/" not in to:
            target = parse_time("to", to)
        marks = await run_in_threadpool(data.reset_cursor, topic, name, target)
        lines = [
            f"{topic}/{p}: delivers again "
            + ("from its first entry" if md[0] < 0 else f"from {md[0]}:{md[1] + 1} on")
            for p, md in sorted(marks.items())
        ]
        return page(
            "done.html",
            title="Cursor reset",
            summary=f"{topic} / {name} reset to {to}",
            lines=lines,
            back=_sub_url(topic, name),
        )

    @app.post("/actions/redrive", response_class=HTMLResponse)
    async def redrive(request: Request) -> HTMLResponse:
        form = await fields(request)
        dlq, to_topic, limit = _redrive_args(form)
        await run_in_threadpool(data.check_redrive, dlq, to_topic)
        held = await run_in_threadpool(data.dead_letters, dlq)
        where = f"to {to_topic}" if to_topic else "back to the topic and partition each came from"
        details = [
            "Each is due at once, with its payload, key and properties, and goes back exactly once."
        ]
        if to_topic is None and not dlq.endswith("-DLQ"):
            details.append(
                f"{dlq} is not named like a dead-letter topic (<topic>-<subscription>-DLQ). "
                "If it is not one, its messages do not say where they came from, and the "
                "redrive stops at the first of them: give a topic to send them to."
            )
        n = held if limit == -1 else min(limit, held)
        of = f" of the {held:,}" if n < held else ""
        question = (
            f"Send {n:,}{of} message{'s' if held != 1 else ''} from {dlq} {where}?"
            if held
            else f"{dlq} holds no dead letters to send back."
        )
        return page(
            "confirm.html",
            title="Redrive a dead-letter topic",
            question=question,
            refused=[],
            details=details,
            action="/actions/redrive/confirm",
            hidden=[
                ("dead_letter_topic", dlq),
                ("to_topic", to_topic or ""),
                ("limit", str(limit)),
                ("back", _back(form)),
            ],
            back=_back(form),
            button="Redrive" if held else None,
        )

    @app.post("/actions/redrive/confirm", response_class=HTMLResponse)
    async def redrive_confirmed(request: Request) -> HTMLResponse:
        form = await fields(request)
        confirmed(form)
        dlq, to_topic, limit = _redrive_args(form)
        moved = await run_in_threadpool(data.redrive, dlq, to_topic, limit)
        return page(
            "done.html",
            title="Redriven",
            summary=f"{moved:,} message{'s' if moved != 1 else ''} sent back from {dlq}",
            lines=[],
            back=_back(form),
        )

    add_task_routes(app, TasksData(cluster, data.lock), page, _live, fields, confirmed, _one)

    @app.exception_handler(_WritesOff)
    async def _writes_off(_: Request, __: _WritesOff) -> HTMLResponse:
        return page(
            "error.html",
            status=403,
            title="Writes are off",
            message="This console is read-only: start it with `raydelay console --allow-writes` "
            "to cancel, reset cursors and redrive.",
        )

    return app


class _WritesOff(Exception):
    """An action posted to a read-only console."""


# --- form fields -------------------------------------------------------------------------------


def _one(form: dict[str, list[str]], field: str, default: str | None = None) -> str:
    values = [v.strip() for v in form.get(field, [])]
    if not values or not values[0]:
        if default is not None:
            return default
        raise InvalidArgument(f"{field}: missing")
    if len(values) > 1:
        raise InvalidArgument(f"{field}: given {len(values)} times, expected once")
    return values[0]


def _message_ids(form: dict[str, list[str]]) -> list[str]:
    """The ids of a cancel: checked boxes (``id``) and a text box (``ids``, one or more per
    line, or separated by spaces or commas), each a valid message id."""
    raw = list(form.get("id", []))
    for text in form.get("ids", []):
        raw.extend(text.replace(",", " ").split())
    ids = list(dict.fromkeys(r.strip() for r in raw if r.strip()))
    if not ids:
        raise InvalidArgument("id: no message selected")
    if len(ids) > _MAX_IDS:
        raise InvalidArgument(f"id: at most {_MAX_IDS:,} messages in one cancel, got {len(ids):,}")
    return [str(MessageId.parse(i)) for i in ids]


def _reset_target(form: dict[str, list[str]]) -> str:
    to = _one(form, "to")
    if to in ("earliest", "latest"):
        return to
    if "/" in to:
        return str(MessageId.parse(to))
    parse_time("to", to)  # checked now, converted at the deed
    return to


def _redrive_args(form: dict[str, list[str]]) -> tuple[str, str | None, int]:
    dlq = _one(form, "dead_letter_topic")
    to_topic = _one(form, "to_topic", default="") or None
    text = _one(form, "limit", default="-1")
    try:
        limit = int(text)
    except ValueError:
        raise InvalidArgument(f"limit: expected a whole number (-1: all), got {text!r}") from None
    if limit == 0 or limit < -1:
        raise InvalidArgument(f"limit: expected a positive number or -1 (all), got {limit}")
    return dlq, to_topic, limit


def _back(form: dict[str, list[str]]) -> str:
    """Where a "back" link leads: a page of this console only."""
    back = _one(form, "back", default="/topics")
    return back if back.startswith("/") and not back.startswith("//") else "/topics"


def _sub_url(topic: str, name: str) -> str:
    return f"/topics/{quote(topic, safe='')}/subscriptions/{quote(name, safe='')}"


def _with(request: Request, **changes: Any) -> str:
    """This page's path and query with ``changes`` made (None: the field taken out)."""
    query = dict(request.query_params)
    for field, value in changes.items():
        if value is None:
            query.pop(field, None)
        else:
            query[field] = str(value)
    query = {k: v for k, v in query.items() if v != ""}
    return request.url.path + ("?" + urlencode(query) if query else "")


def _live(request: Request) -> dict:
    """A read page's auto-refresh: its period (``?refresh=N``, off unless given; checked
    before the page reads anything) and the links that turn it on and off."""
    return {
        "refresh": parse_refresh(request.query_params.get("refresh")),
        "on": _with(request, refresh=REFRESH_S),
        "off": _with(request, refresh=None),
    }
