"""The HTTP API's ASGI app (FastAPI): the routes, each request's checks, and the answers.

Every request but ``GET /v1/health`` and ``GET /openapi.json`` is checked in this order,
and the first failure is its answer, with nothing sent to the cluster:

1. its bearer token (:mod:`raydelay.http.tokens`): 401 when missing, malformed, unknown
   or revoked; 403 when the token lacks the route's scope;
2. its token's rate (:mod:`raydelay.http.ratelimit`): 429, with ``Retry-After``;
3. its type: 415 for a Content-Type the route does not take (JSON, and for a single
   send also ``application/octet-stream``);
4. its body's size: 413 past ``http.max_body_bytes`` (read no further);
5. its fields (:mod:`raydelay.http.bodies`): 400 naming the field and the problem.

Then the cluster answers: 404 for an unknown topic, subscription or schedule; 409 for a
keyed send with ``on_duplicate: error`` whose key a scheduled message holds; 503 while it
cannot be reached; 201 with the ids once a send is durable. Every error is
``{"error": {"status": ..., "code": ..., "message": ...}}``.

The app reads what it serves through ``context()`` (:class:`ApiContext`), called per
request: in a Ray Serve replica that is the replica's client (:mod:`raydelay.http.serve`),
in tests a fake cluster's.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from raydelay._extras import require

require("http")  # (before the web stack's imports: a missing extra is one clear error)

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.exceptions import RequestValidationError  # noqa: E402
from fastapi.openapi.utils import get_openapi  # noqa: E402
from fastapi.responses import JSONResponse, Response  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402
from starlette.concurrency import run_in_threadpool  # noqa: E402
from starlette.exceptions import HTTPException as StarletteHTTPException  # noqa: E402

from raydelay import __version__, aio  # noqa: E402
from raydelay.client.message import MessageId  # noqa: E402
from raydelay.errors import (  # noqa: E402
    InvalidArgument,
    KeyPending,
    NotFound,
    RaydelayError,
    StorageError,
    Unavailable,
)
from raydelay.http import bodies  # noqa: E402
from raydelay.http.ratelimit import RateLimiter  # noqa: E402
from raydelay.http.tokens import Scope, TokenCache, TokenRecord, Unauthorized  # noqa: E402
from raydelay.jsonable import jsonable  # noqa: E402

JSON = "application/json"
RAW = bodies.RAW
MAX_CANCEL_IDS = 10_000  # message ids in one cancel request
MAX_PEEK = 1_000  # scheduled messages in one peek answer


@dataclass(frozen=True)
class ApiSettings:
    """The limits of one server (the ``http`` section of the config)."""

    max_body_bytes: int
    max_batch_messages: int


@dataclass
class ApiContext:
    """What the routes serve from: a connected client, the token records and the buckets.
    A topic's producer is made on its first send and kept: an asyncio producer over the
    client's, so that a send awaits its append in the event loop (no thread per request)
    and the sends of concurrent requests go out together, one append per partition."""

    cluster: Any
    tokens: TokenCache
    settings: ApiSettings
    limiter: RateLimiter = field(default_factory=RateLimiter)
    # (an asyncio producer belongs to the event loop it was made in: one loop in a server)
    _producers: dict[tuple[int, str], aio.Producer] = field(default_factory=dict)

    async def producer(self, topic: str) -> aio.Producer:
        key = (id(asyncio.get_running_loop()), topic)
        found = self._producers.get(key)
        if found is not None and not found.sync.closed:
            return found
        # NotFound for an unknown topic; made in a thread (it asks the coordinator)
        made = aio.Producer(await run_in_threadpool(self.cluster.create_producer, topic))
        raced = self._producers.get(key)  # (another request made one meanwhile)
        if raced is not None and not raced.sync.closed:
            made.sync.close()
            return raced
        self._producers[key] = made
        return made


class ApiError(Exception):
    """An answer other than 2xx, decided before the cluster is asked."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.headers = status, code, headers or {}


# --- the documented shapes (the OpenAPI document; the bodies are parsed by `bodies`) -----


OnDuplicate = Literal["ignore", "replace", "error", "allow"]


class _Message(BaseModel):
    """What every message body has. Exactly one of payload and text; at most one of
    deliver_at and deliver_after (neither: delivered at once)."""

    payload: str | None = Field(None, description="the payload, base64")
    text: str | None = Field(None, description="the payload as UTF-8 text")
    deliver_at: int | str | None = Field(
        None, description="epoch ms, or an RFC 3339 time with an offset"
    )
    deliver_after: float | None = Field(None, description="seconds from now")
    properties: dict[str, str] | None = None


class BatchMessageIn(_Message):
    """One message of a batch (its on_duplicate is the batch's)."""

    key: str | None = Field(
        None,
        description="the message's identity in its topic while it is scheduled (and its "
        "partition: one key, one partition)",
    )


class MessageIn(BatchMessageIn):
    """One message."""

    on_duplicate: OnDuplicate = Field(
        "ignore",
        description="a keyed message scheduled for later, when a message is pending under "
        "its key: ignore (keep that one; answer its id), replace (cancel it, schedule this), "
        "error (409), allow (send this one too: the key only routes)",
    )


class BatchIn(BaseModel):
    messages: list[BatchMessageIn]
    on_duplicate: OnDuplicate = Field("ignore", description="as a single message's")


class KeyedMessageIn(_Message):
    """A message put under the key the path names (no key of its own)."""


class KeysIn(BaseModel):
    keys: list[str] = Field(description="keys the messages were sent with")


class KeyCancelOut(BaseModel):
    cancelled: bool = Field(
        description="true if a message was scheduled under the key and this cancelled it"
    )


class CancelIn(BaseModel):
    message_ids: list[str] = Field(description="ids as a send answered them")


class SentOut(BaseModel):
    message_id: str = Field(description="topic/partition/ledger:entry")


class BatchOut(BaseModel):
    message_ids: list[str]


class CancelOut(BaseModel):
    cancelled: list[bool] = Field(
        description="per id: true if cancelled, false if delivered or cancelled before"
    )


class ScheduledOut(BaseModel):
    message_id: str
    payload: str = Field(description="base64")
    key: str | None
    properties: dict[str, str]
    publish_time_ms: int
    deliver_at_ms: int | None
    redelivery_count: int


class ErrorBody(BaseModel):
    status: int
    code: str
    message: str


class ErrorOut(BaseModel):
    error: ErrorBody


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, "description": what}
    for status, what in [
        (400, "a field is missing or wrong (the message names it)"),
        (401, "no token, or not a live one"),
        (403, "the token lacks the scope"),
        (404, "no such topic, subscription or schedule"),
        (409, "a message is scheduled under the key (on_duplicate: error)"),
        (413, "the body is over http.max_body_bytes"),
        (415, "the body is of a Content-Type the route does not take"),
        (429, "over the token's rate (Retry-After says when to try again)"),
        (503, "the cluster cannot be reached now"),
    ]
}


def _body(model: type[BaseModel], raw: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {JSON: {"schema": model.model_json_schema(ref_template="#/$defs")}}
    if raw:
        content[RAW] = {"schema": {"type": "string", "format": "binary"}}
    return {"requestBody": {"required": True, "content": content}}


# --- the app -------------------------------------------------------------------------------


def create_api(context: Callable[[], ApiContext]) -> FastAPI:
    """The HTTP API's app; ``context()`` gives what a request is served from."""
    app = FastAPI(
        title="raydelay",
        version=__version__,
        description="Delayed and scheduled messages over HTTP: see docs/http.md.",
        docs_url=None,  # (Swagger's page loads its assets from a CDN; the document is served)
        redoc_url=None,
    )

    app.add_middleware(ServerTiming)

    async def authorized(request: Request, scope: Scope) -> tuple[ApiContext, TokenRecord]:
        ctx = context()
        header = request.headers.get("authorization")
        try:
            # (in the event loop when the records at hand answer; a store read in a thread)
            record = ctx.tokens.check_cached(header)
            if record is None:
                record = await run_in_threadpool(ctx.tokens.check, header)
        except Unauthorized as exc:
            raise ApiError(
                401, "unauthorized", str(exc), {"WWW-Authenticate": 'Bearer realm="raydelay"'}
            ) from None
        if not record.allows(scope):
            raise ApiError(
                403,
                "forbidden",
                f"token {record.name!r} has no {scope.value!r} scope "
                f"(it has: {', '.join(sorted(s.value for s in record.scopes))})",
            )
        wait_s = ctx.limiter.take(record.token_id, record.rate_per_s)
        if wait_s > 0:
            raise ApiError(
                429,
                "rate_limited",
                f"token {record.name!r} is over its rate of {record.rate_per_s:g} requests/s",
                {"Retry-After": RateLimiter.retry_after(wait_s)},
            )
        return ctx, record

    async def json_of(request: Request, ctx: ApiContext, also: str | None = None) -> Any:
        """The request's JSON document: 415 for a body of another type (``also``: the
        other type the route takes, named in the answer), 413 past the size bound."""
        kind = _content_type(request)
        if kind != JSON and not kind.endswith("+json"):
            takes = JSON if also is None else f"{JSON} or {also}"
            raise ApiError(
                415,
                "unsupported_media_type",
                f"Content-Type: {kind!r} is not taken here; send {takes}",
            )
        return bodies.parse_json(await body_of(request, ctx))

    async def body_of(request: Request, ctx: ApiContext) -> bytes:
        limit = ctx.settings.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise _too_large(int(length), limit)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            chunks.append(chunk)
        return b"".join(chunks)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return _error(exc.status, exc.code, str(exc), exc.headers)

    @app.exception_handler(RaydelayError)
    async def _raydelay_error(request: Request, exc: RaydelayError) -> Response:
        if isinstance(exc, InvalidArgument):
            return _error(400, "invalid_argument", str(exc))
        if isinstance(exc, NotFound):
            return _error(404, "not_found", str(exc))
        if isinstance(exc, KeyPending):
            return _error(409, "key_pending", str(exc))
        if isinstance(exc, Unavailable) or (isinstance(exc, StorageError) and exc.retriable):
            return _error(503, "unavailable", str(exc), {"Retry-After": "1"})
        return _error(500, type(exc).__name__, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _bad_query(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
        return _error(400, "invalid_argument", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = "not_found" if exc.status_code == 404 else "http_error"
        message = f"no route {request.method} {request.url.path}" if code == "not_found" else ""
        return _error(exc.status_code, code, message or str(exc.detail))

    @app.get("/v1/health", tags=["server"], openapi_extra={"security": []})
    async def health() -> dict:
        """Up, and its version (no token needed)."""
        return {"status": "ok", "version": __version__}

    @app.post(
        "/v1/topics/{topic}/messages",
        tags=["produce"],
        status_code=201,
        response_model=SentOut,
        responses=_ERRORS,
        openapi_extra=_body(MessageIn, raw=True),
    )
    async def send(topic: str, request: Request) -> Response:
        """Send one message; answers once it is durable. A JSON body is a message; an
        ``application/octet-stream`` body is the payload, with the other fields as
        ``Raydelay-Deliver-At``, ``Raydelay-Deliver-After``, ``Raydelay-Key`` and
        ``Raydelay-Properties`` (a JSON object) headers."""
        ctx, _ = await authorized(request, Scope.PRODUCE)
        if _content_type(request) != RAW:
            bodies.no_raw_headers(request.headers)
            out = bodies.message_of(await json_of(request, ctx, also=RAW))
            mid = await _send_one(ctx, topic, out)
            return JSONResponse({"message_id": str(mid)}, status_code=201)
        out = bodies.raw_message_of(await body_of(request, ctx), request.headers)
        try:
            mid = await _send_one(ctx, topic, out)
        except InvalidArgument as exc:  # (the client's checks name fields, not headers)
            raise bodies.raw_field_error(exc) from None
        return JSONResponse({"message_id": str(mid)}, status_code=201)

    @app.post(
        "/v1/topics/{topic}/messages/batch",
        tags=["produce"],
        status_code=201,
        response_model=BatchOut,
        responses=_ERRORS,
        openapi_extra=_body(BatchIn),
    )
    async def send_batch(topic: str, request: Request) -> Response:
        """Send a batch (up to ``http.max_batch_messages``); answers once all are durable,
        with the ids in input order. Every message is checked first: one bad message and
        none is sent."""
        ctx, _ = await authorized(request, Scope.PRODUCE)
        outs, on_duplicate = bodies.batch_of(
            await json_of(request, ctx), ctx.settings.max_batch_messages
        )
        ids = await _send_many(ctx, topic, outs, on_duplicate)
        return JSONResponse({"message_ids": [str(m) for m in ids]}, status_code=201)

    @app.post(
        "/v1/cancel",
        tags=["cancel"],
        response_model=CancelOut,
        responses=_ERRORS,
        openapi_extra=_body(CancelIn),
    )
    async def cancel(request: Request) -> dict:
        """Cancel messages by id (of any topics). Per id: true if this cancelled it,
        false if it was delivered or cancelled already. All or nothing: an id that is not
        in its topic's log, or of an unknown topic, is a 404 and none is cancelled."""
        ctx, _ = await authorized(request, Scope.CANCEL)
        texts = bodies.message_ids_of(await json_of(request, ctx), MAX_CANCEL_IDS)
        ids = [_message_id(f"message_ids[{i}]", t) for i, t in enumerate(texts)]
        done = await run_in_threadpool(ctx.cluster.cancel, ids)
        return {"cancelled": [bool(d) for d in done]}

    @app.put(
        "/v1/topics/{topic}/keys/{key}",
        tags=["produce"],
        status_code=201,
        response_model=SentOut,
        responses=_ERRORS,
        openapi_extra=_body(KeyedMessageIn, raw=True),
    )
    async def put_key(topic: str, key: str, request: Request) -> Response:
        """Schedule a message under ``key``, replacing the one pending under it (if any):
        a send with ``on_duplicate: replace``. The body is a JSON message without a key,
        or raw bytes with ``Raydelay-*`` headers."""
        ctx, _ = await authorized(request, Scope.PRODUCE)
        if _content_type(request) != RAW:
            bodies.no_raw_headers(request.headers)
            doc = await json_of(request, ctx, also=RAW)
            if isinstance(doc, dict) and "on_duplicate" in doc:
                raise InvalidArgument("on_duplicate: a PUT replaces; send with POST to choose")
            out = bodies.message_of(doc, key=key)
        else:
            out = bodies.raw_message_of(await body_of(request, ctx), request.headers, key=key)
        out = out._replace(on_duplicate="replace")
        try:
            mid = await _send_one(ctx, topic, out)
        except InvalidArgument as exc:
            raise bodies.raw_field_error(exc) from None
        return JSONResponse({"message_id": str(mid)}, status_code=201)

    @app.delete(
        "/v1/topics/{topic}/keys/{key}",
        tags=["cancel"],
        response_model=KeyCancelOut,
        responses=_ERRORS,
    )
    async def cancel_key(topic: str, key: str, request: Request) -> dict:
        """Cancel the message scheduled under ``key``: true if one was pending and this
        kept it from delivery; false if none was (delivered, cancelled, or never sent)."""
        ctx, _ = await authorized(request, Scope.CANCEL)
        done = await run_in_threadpool(ctx.cluster.cancel, topic, key)
        return {"cancelled": bool(done)}

    @app.post(
        "/v1/topics/{topic}/cancel",
        tags=["cancel"],
        response_model=CancelOut,
        responses=_ERRORS,
        openapi_extra=_body(KeysIn),
    )
    async def cancel_keys(topic: str, request: Request) -> dict:
        """Cancel messages by key: per key, true if one was pending under it and this
        kept it from delivery."""
        ctx, _ = await authorized(request, Scope.CANCEL)
        keys = bodies.keys_of(await json_of(request, ctx), MAX_CANCEL_IDS)
        done = await run_in_threadpool(ctx.cluster.cancel, topic, keys=keys)
        return {"cancelled": [bool(d) for d in done]}

    @app.get("/v1/topics", tags=["read"], responses=_ERRORS)
    async def topics(request: Request) -> dict:
        """The topics and their partitions."""
        ctx, _ = await authorized(request, Scope.READ)
        return {"topics": await run_in_threadpool(ctx.cluster.topics)}

    @app.get("/v1/topics/{topic}/stats", tags=["read"], responses=_ERRORS)
    async def stats(topic: str, request: Request, subscription: str | None = None) -> Response:
        """A topic's numbers, or one subscription's (``?subscription=``)."""
        ctx, _ = await authorized(request, Scope.READ)
        found = await run_in_threadpool(ctx.cluster.stats, topic, subscription)
        return JSONResponse(jsonable(found))

    @app.get(
        "/v1/topics/{topic}/subscriptions/{subscription}/scheduled",
        tags=["read"],
        response_model=list[ScheduledOut],
        responses=_ERRORS,
    )
    async def scheduled(
        topic: str,
        subscription: str,
        request: Request,
        limit: int = 100,
        due_after: str | None = None,
        due_before: str | None = None,
        key: str | None = None,
    ) -> Response:
        """The next scheduled messages of a subscription, in delivery order (nothing is
        delivered). ``limit``: 1 to 1,000; ``due_after`` / ``due_before``: epoch ms or
        RFC 3339; ``key``: only this key's."""
        ctx, _ = await authorized(request, Scope.READ)
        if not 1 <= limit <= MAX_PEEK:
            raise InvalidArgument(f"limit: must be 1 to {MAX_PEEK:,}, got {limit}")
        after = bodies.time_of("due_after", due_after)
        before = bodies.time_of("due_before", due_before)
        found = await run_in_threadpool(
            ctx.cluster.peek, topic, subscription, limit, after, before, key
        )
        return JSONResponse([_message(m) for m in found])

    @app.get("/v1/schedules", tags=["schedules"], responses=_ERRORS)
    async def schedules(request: Request) -> Response:
        """The recurring schedules, with their next occurrence."""
        ctx, _ = await authorized(request, Scope.READ)
        return JSONResponse(jsonable(await run_in_threadpool(ctx.cluster.list_schedules)))

    @app.post("/v1/schedules/{name}/pause", tags=["schedules"], responses=_ERRORS)
    async def pause(name: str, request: Request) -> Response:
        """Pause a schedule (admin)."""
        ctx, _ = await authorized(request, Scope.ADMIN)
        return JSONResponse(jsonable(await run_in_threadpool(ctx.cluster.pause_schedule, name)))

    @app.post("/v1/schedules/{name}/resume", tags=["schedules"], responses=_ERRORS)
    async def resume(name: str, request: Request) -> Response:
        """Resume a paused schedule (admin)."""
        ctx, _ = await authorized(request, Scope.ADMIN)
        return JSONResponse(jsonable(await run_in_threadpool(ctx.cluster.resume_schedule, name)))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(
                title=app.title,
                version="1",  # the API's version, not the package's (a new field is not a new API)
                description=app.description,
                routes=app.routes,
            )
            defs: dict[str, Any] = {}
            for model in (MessageIn, BatchIn, CancelIn):
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                defs.update(schema.pop("$defs", {}))
                defs[model.__name__] = schema
            comps = doc.setdefault("components", {})
            comps.setdefault("schemas", {}).update(defs)
            comps["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            doc["security"] = [{"bearer": []}]
            for path in doc["paths"].values():
                for op in path.values():
                    _refs_to_components(op)
                    for param in op.get("parameters", []):
                        # (under serve.ingress, FastAPI documents {} as each parameter's
                        # example: the same document either way)
                        if param.get("example") == {}:
                            del param["example"]
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


class ServerTiming:
    """Every answer says how long the app took over it (``Server-Timing: app;dur=<ms>``):
    what a caller measures beyond it went to the network and Serve's proxy."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed(message: dict) -> None:
            if message["type"] == "http.response.start":
                took_ms = (time.perf_counter() - start) * 1000
                message.setdefault("headers", []).append(
                    (b"server-timing", b"app;dur=%.2f" % took_ms)
                )
            await send(message)

        await self.app(scope, receive, timed)


def _refs_to_components(op: dict[str, Any]) -> None:
    """A request body documented from a model points at ``components/schemas``."""
    content = op.get("requestBody", {}).get("content", {})
    if JSON in content:
        title = content[JSON]["schema"].get("title")
        if title:
            content[JSON]["schema"] = {"$ref": f"#/components/schemas/{title}"}


async def _send_one(ctx: ApiContext, topic: str, out: bodies.Outgoing) -> MessageId:
    producer = await ctx.producer(topic)
    return await producer.send(
        out.payload,
        deliver_at=out.deliver_at,
        deliver_after=out.deliver_after,
        key=out.key,
        properties=out.properties,
        on_duplicate=out.on_duplicate,
    )


async def _send_many(
    ctx: ApiContext, topic: str, outs: list[bodies.Outgoing], on_duplicate: str
) -> Any:
    keyed = any(o.key is not None for o in outs)
    props = any(o.properties is not None for o in outs)
    producer = await ctx.producer(topic)
    return await producer.send_many(
        [o.payload for o in outs],
        deliver_at=_column([o.deliver_at for o in outs]),
        deliver_after=_column([o.deliver_after for o in outs]),
        keys=[o.key for o in outs] if keyed else None,
        properties=[o.properties for o in outs] if props else None,
        on_duplicate=on_duplicate,
    )


def _column(values: list) -> list | None:
    """A batch's column, or None when no message has it (the batch check is faster)."""
    return values if any(v is not None for v in values) else None


def _message_id(field_name: str, text: str) -> MessageId:
    try:
        return MessageId.parse(text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{field_name}: {exc}") from None


def _message(m: Any) -> dict[str, Any]:
    return {
        "message_id": str(m.message_id),
        "payload": base64.b64encode(m.payload).decode("ascii"),
        "key": m.key,
        "properties": dict(m.properties),
        "publish_time_ms": int(m.publish_time_ms),
        "deliver_at_ms": None if m.deliver_at_ms is None else int(m.deliver_at_ms),
        "redelivery_count": int(m.redelivery_count),
    }


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", JSON).split(";")[0].strip().lower()


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413, "too_large", f"body: {size:,} bytes or more; at most {limit:,} (http.max_body_bytes)"
    )


def _error(status: int, code: str, message: str, headers: dict | None = None) -> Response:
    return JSONResponse(
        {"error": {"status": status, "code": code, "message": message}},
        status_code=status,
        headers=headers,
    )


def main() -> None:
    """Print the API's OpenAPI document (``python -m raydelay.http.api``), as checked in
    at docs/http-openapi.json."""
    import json

    print(json.dumps(create_api(_no_context).openapi(), indent=2, sort_keys=True))


def _no_context() -> ApiContext:
    raise RuntimeError("the document needs no cluster")


if __name__ == "__main__":
    main()
