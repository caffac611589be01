"""The HTTP API's app over an in-memory cluster (no Ray): each request's checks, in
order, and the answers. A real Producer sends into a fake topic, so what reaches the log
is what the API let through."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from raydelay.client.message import Message, MessageId  # noqa: E402
from raydelay.client.producer import Producer  # noqa: E402
from raydelay.config import load_config  # noqa: E402
from raydelay.errors import InvalidArgument, NotFound  # noqa: E402
from raydelay.http.api import ApiContext, ApiSettings, create_api  # noqa: E402
from raydelay.http.tokens import TokenCache, TokenStore  # noqa: E402
from raydelay.storage.memory import MemoryObjectStore  # noqa: E402
from tests.unit.fakes import FakeTopic  # noqa: E402

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "http-openapi.json"


class FakeCluster:
    """The calls the API makes, over fake topics."""

    def __init__(self) -> None:
        self.config = load_config(None)
        self.logs = {"orders": FakeTopic(partitions=2)}
        self.cancelled: list[list[MessageId]] = []
        self.paused: list[str] = []

    def create_producer(self, topic):
        if topic not in self.logs:
            raise NotFound(f"topic: {topic!r} does not exist")
        return Producer(self.logs[topic], topic, self.config)

    def sent(self, topic="orders") -> list[bytes]:
        return [
            p for part in sorted(self.logs[topic].payloads) for p in self.logs[topic].payloads[part]
        ]

    def cancel(self, ids, key=None, *, keys=None):
        if key is not None or keys is not None:  # by key: ids is the topic
            producer = self.create_producer(ids)
            done = producer.cancel_keys([key] if key is not None else keys)
            return done[0] if key is not None else done
        self.cancelled.append(list(ids))
        return [i % 2 == 0 for i in range(len(ids))]

    def topics(self):
        return {t: log.partitions for t, log in self.logs.items()}

    def stats(self, topic, subscription=None):
        if topic not in self.logs:
            raise NotFound(f"topic: {topic!r} does not exist")
        return {"backlog": np.int64(3), "subscription": subscription}

    def peek(self, topic, subscription, limit, due_after, due_before, key):
        self.peeked = (topic, subscription, limit, due_after, due_before, key)
        return [Message(MessageId(topic, 1, 2, 3), b"\x00hi", "k", {"a": "b"}, 10, 20, 0)]

    def list_schedules(self):
        return [{"name": "nightly", "next_ms": np.int64(5)}]

    def pause_schedule(self, name):
        if name != "nightly":
            raise NotFound(f"schedule: {name!r} does not exist")
        self.paused.append(name)
        return {"name": name, "paused": True}

    def resume_schedule(self, name):
        return {"name": name, "paused": False}


@pytest.fixture
def world():
    cluster = FakeCluster()
    tokens = TokenStore(MemoryObjectStore())
    made = {
        scope: tokens.create(scope, [scope], -1)[1]
        for scope in ("produce", "cancel", "read", "admin")
    }
    made["slow"] = tokens.create("slow", ["produce"], 2)[1]
    ctx = ApiContext(
        cluster,
        TokenCache(tokens, refresh_s=60),
        ApiSettings(max_body_bytes=64 * 1024, max_batch_messages=100),
    )
    with TestClient(create_api(lambda: ctx)) as client:  # (one event loop for its requests)
        yield cluster, made, client


def auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_json_message_is_sent_and_its_id_returned(world):
    cluster, tokens, client = world
    r = client.post(
        "/v1/topics/orders/messages",
        json={"payload": b64(b"\x00\x01bin"), "deliver_after": 30, "key": "order-17"},
        headers=auth(tokens["produce"]),
    )
    assert r.status_code == 201, r.text
    mid = MessageId.parse(r.json()["message_id"])
    assert mid.topic == "orders"
    assert cluster.sent() == [b"\x00\x01bin"]


def test_a_raw_message_takes_its_fields_from_headers(world):
    cluster, tokens, client = world
    r = client.post(
        "/v1/topics/orders/messages",
        content=b"raw bytes \xff",
        headers={
            **auth(tokens["produce"]),
            "Content-Type": "application/octet-stream",
            "Raydelay-Deliver-At": "2030-01-01T00:00:00Z",
            "Raydelay-Key": "k1",
            "Raydelay-Properties": '{"source": "curl"}',
        },
    )
    assert r.status_code == 201, r.text
    assert cluster.sent() == [b"raw bytes \xff"]


def test_a_raw_message_takes_utf8_headers_as_text(world):
    cluster, tokens, client = world
    r = client.post(
        "/v1/topics/orders/messages",
        content=b"payload",
        headers={
            **auth(tokens["produce"]),
            "Content-Type": "application/octet-stream",
            "Raydelay-Key": "ключ".encode(),
            "Raydelay-Properties": '{"città": "Zürich ☃"}'.encode(),
        },
    )
    assert r.status_code == 201, r.text
    keys = [k for part in cluster.logs["orders"].keys.values() for k in part]
    assert keys == ["ключ"]


def test_a_raw_header_that_is_not_utf8_is_refused():
    from raydelay.http import bodies

    # (Starlette hands header bytes over as Latin-1 text: \xff\xfe is no UTF-8)
    with pytest.raises(InvalidArgument, match="^Raydelay-Key: not valid UTF-8"):
        bodies.raw_message_of(b"x", {"Raydelay-Key": "\xff\xfe"})


def test_a_batch_is_sent_in_order_and_answers_every_id(world):
    cluster, tokens, client = world
    messages = [{"text": f"m{i}", "deliver_at": 1_900_000_000_000 + i} for i in range(50)]
    messages[3] = {"payload": b64(b"three"), "deliver_after": 5.5, "properties": {"x": "y"}}
    r = client.post(
        "/v1/topics/orders/messages/batch",
        json={"messages": messages},
        headers=auth(tokens["produce"]),
    )
    assert r.status_code == 201, r.text
    ids = [MessageId.parse(t) for t in r.json()["message_ids"]]
    assert len(ids) == 50 and len(set(ids)) == 50
    assert sorted(cluster.sent()) == sorted(
        [f"m{i}".encode() for i in range(50) if i != 3] + [b"three"]
    )


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "says"),
    [
        ("/v1/topics/orders/messages", {"deliver_after": 1}, {}, 400, "payload: give exactly one"),
        (
            "/v1/topics/orders/messages",
            {"payload": "!!", "deliver_after": 1},
            {},
            400,
            "payload: not valid base64",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "payload": "eA=="},
            {},
            400,
            "payload: give exactly one",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "deliver_at": "tomorrow"},
            {},
            400,
            "deliver_at: 'tomorrow' is not an RFC 3339",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "deliver_at": "2030-01-01T00:00:00"},
            {},
            400,
            "has no offset",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "deliver_at": 1.5},
            {},
            400,
            "deliver_at: expected epoch ms",
        ),
        ("/v1/topics/orders/messages", {"text": "x", "deliver_at": 10**30}, {}, 400, "deliver_at"),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "deliver_at": True},
            {},
            400,
            "deliver_at: expected epoch ms",
        ),
        (
            "/v1/topics/orders/messages",
            {"payload": "\u00e9\u00e9==", "deliver_after": 1},
            {},
            400,
            "payload: not valid base64",
        ),
        (
            "/v1/topics/orders/messages",
            {"payload": "eA", "deliver_after": 1},
            {},
            400,
            "payload: not valid base64",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "deliver_after": -5},
            {},
            400,
            "deliver_after",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "deliver_after": "5"},
            {},
            400,
            "deliver_after: expected seconds",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "deliver_after": 1, "deliver_at": 1},
            {},
            400,
            "not both",
        ),
        ("/v1/topics/orders/messages", {"text": "x", "key": 5}, {}, 400, "key: expected a string"),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "properties": {"a": 1}},
            {},
            400,
            "properties.a: expected a string",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x", "colour": "red"},
            {},
            400,
            "colour: not a field",
        ),
        ("/v1/topics/orders/messages", [1, 2], {}, 400, "body: expected a JSON object"),
        ("/v1/topics/orders/messages", "{nope", {}, 400, "body: not valid JSON"),
        ("/v1/topics/nowhere/messages", {"text": "x"}, {}, 404, "'nowhere' does not exist"),
        (
            "/v1/topics/orders/messages/batch",
            {"messages": []},
            {},
            400,
            "messages: expected a non-empty",
        ),
        (
            "/v1/topics/orders/messages/batch",
            {"messages": [{"text": "a"}] * 101},
            {},
            400,
            "at most 100",
        ),
        (
            "/v1/topics/orders/messages/batch",
            {"messages": [{"text": "a"}, {"text": 3}]},
            {},
            400,
            "messages[1].text",
        ),
        (
            "/v1/topics/orders/messages/batch",
            {"messages": [{"text": "a"}, {"text": "b"}, {"text": "c", "deliver_at": [1]}]},
            {},
            400,
            "messages[2].deliver_at: expected epoch ms",
        ),
        (
            "/v1/topics/orders/messages/batch",
            {"messages": [{"text": "a"}, {"text": "b", "deliver_after": False}]},
            {},
            400,
            "messages[1].deliver_after: expected seconds",
        ),
        ("/v1/topics/orders/messages/batch", {"msgs": []}, {}, 400, 'expected {"messages"'),
        (
            "/v1/topics/orders/messages",
            b"\x00",
            {"Content-Type": "application/octet-stream", "Raydelay-Deliver-After": "soon"},
            400,
            "Raydelay-Deliver-After",
        ),
        (
            "/v1/topics/orders/messages",
            b"\x00",
            {"Content-Type": "application/octet-stream", "Raydelay-Properties": "[1]"},
            400,
            "Raydelay-Properties",
        ),
        (
            "/v1/topics/orders/messages",
            b"x" * 70_000,
            {"Content-Type": "application/octet-stream"},
            413,
            "at most 65,536",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x"},
            {"Authorization": "Bearer nope"},
            401,
            "not a raydelay token",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x"},
            {"Authorization": ""},
            401,
            "no Authorization",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x"},
            {"token": "read"},
            403,
            "has no 'produce' scope",
        ),
        # JSON's escapes can spell a lone surrogate, which is no Unicode text
        ("/v1/topics/orders/messages", '{"text": "\\ud800"}', {}, 400, "text: not valid Unicode"),
        (
            "/v1/topics/orders/messages",
            '{"text": "x", "key": "\\udc00"}',
            {},
            400,
            "key: not valid Unicode",
        ),
        (
            "/v1/topics/orders/messages",
            '{"text": "x", "properties": {"a": "\\ud800"}}',
            {},
            400,
            "properties.a: not valid Unicode",
        ),
        (
            "/v1/topics/orders/messages/batch",
            '{"messages": [{"text": "ok"}, {"text": "\\ud800"}]}',
            {},
            400,
            "messages[1].text: not valid Unicode",
        ),
        (
            "/v1/topics/orders/messages/batch",
            '{"messages": [1]}',
            {},
            400,
            "messages[0]: expected a JSON object",
        ),
        # a body of a type the route does not take, and a raw message's headers on JSON
        (
            "/v1/topics/orders/messages",
            '{"text": "x"}',
            {"Content-Type": "text/plain"},
            415,
            "'text/plain' is not taken here; send application/json or application/octet-stream",
        ),
        (
            "/v1/topics/orders/messages/batch",
            b"a=1",
            {"Content-Type": "application/x-www-form-urlencoded"},
            415,
            "send application/json",
        ),
        (
            "/v1/topics/orders/messages",
            {"text": "x"},
            {"Raydelay-Deliver-After": "999"},
            400,
            "Raydelay-Deliver-After: a header of raw messages",
        ),
        # a raw message's field errors name its header, also those the client finds
        (
            "/v1/topics/orders/messages",
            b"x",
            {"Content-Type": "application/octet-stream", "Raydelay-Deliver-After": "-1"},
            400,
            "Raydelay-Deliver-After: ",
        ),
    ],
)
def test_bad_input_gets_one_clear_error_and_sends_nothing(world, path, body, headers, status, says):
    cluster, tokens, client = world
    headers = dict(headers)
    token = tokens[headers.pop("token", "produce")]
    headers.setdefault("Authorization", f"Bearer {token}")
    if not headers["Authorization"]:
        headers.pop("Authorization")
    kwargs = (
        {"content": body}
        if isinstance(body, bytes)
        else (
            {"content": body.encode(), "headers": headers}
            if isinstance(body, str)
            else {"json": body}
        )
    )
    kwargs["headers"] = headers
    r = client.post(path, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["status"] == status and says in error["message"], error
    assert cluster.sent() == []
    if status == 401:
        assert r.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_token_over_its_rate_gets_429_with_retry_after(world):
    cluster, tokens, client = world
    codes = [
        client.post(
            "/v1/topics/orders/messages", json={"text": "x"}, headers=auth(tokens["slow"])
        ).status_code
        for _ in range(4)
    ]
    assert codes[:2] == [201, 201] and 429 in codes[2:]
    refused = client.post(
        "/v1/topics/orders/messages", json={"text": "x"}, headers=auth(tokens["slow"])
    )
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert len(cluster.sent()) == codes.count(201)


def test_cancel_needs_the_cancel_scope_and_answers_per_id(world):
    cluster, tokens, client = world
    ids = ["orders/0/1:2", "orders/1/1:3"]
    r = client.post("/v1/cancel", json={"message_ids": ids}, headers=auth(tokens["produce"]))
    assert r.status_code == 403 and cluster.cancelled == []
    r = client.post(
        "/v1/cancel", json={"message_ids": ["orders/x"]}, headers=auth(tokens["cancel"])
    )
    assert r.status_code == 400 and "message_ids[0]" in r.json()["error"]["message"]
    assert cluster.cancelled == []
    r = client.post("/v1/cancel", json={"message_ids": ids}, headers=auth(tokens["cancel"]))
    assert r.status_code == 200 and r.json() == {"cancelled": [True, False]}
    assert cluster.cancelled == [[MessageId.parse(t) for t in ids]]


def test_reads_need_the_read_scope_and_answer_json(world):
    cluster, tokens, client = world
    assert client.get("/v1/topics", headers=auth(tokens["produce"])).status_code == 403
    read = auth(tokens["read"])
    assert client.get("/v1/topics", headers=read).json() == {"topics": {"orders": 2}}
    assert client.get("/v1/topics/orders/stats?subscription=s", headers=read).json() == {
        "backlog": 3,
        "subscription": "s",
    }
    assert client.get("/v1/topics/nowhere/stats", headers=read).status_code == 404
    r = client.get(
        "/v1/topics/orders/subscriptions/s/scheduled?limit=5&due_after=2030-01-01T00:00:00Z&key=k",
        headers=read,
    )
    assert r.status_code == 200
    assert r.json() == [
        {
            "message_id": "orders/1/2:3",
            "payload": b64(b"\x00hi"),
            "key": "k",
            "properties": {"a": "b"},
            "publish_time_ms": 10,
            "deliver_at_ms": 20,
            "redelivery_count": 0,
        }
    ]
    assert cluster.peeked[2] == 5 and cluster.peeked[3].year == 2030 and cluster.peeked[5] == "k"
    for bad in ("limit=0", "limit=1001", "limit=x", "due_before=soon"):
        r = client.get(f"/v1/topics/orders/subscriptions/s/scheduled?{bad}", headers=read)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["message"].startswith(bad.split("=")[0]), r.text


def test_schedules_are_read_with_read_and_paused_only_with_admin(world):
    cluster, tokens, client = world
    assert client.get("/v1/schedules", headers=auth(tokens["read"])).json() == [
        {"name": "nightly", "next_ms": 5}
    ]
    assert (
        client.post("/v1/schedules/nightly/pause", headers=auth(tokens["read"])).status_code == 403
    )
    assert cluster.paused == []
    r = client.post("/v1/schedules/nightly/pause", headers=auth(tokens["admin"]))
    assert r.status_code == 200 and r.json() == {"name": "nightly", "paused": True}
    assert (
        client.post("/v1/schedules/other/pause", headers=auth(tokens["admin"])).status_code == 404
    )


def test_health_needs_no_token_and_an_unknown_route_is_a_json_404(world):
    _, _, client = world
    r = client.get("/v1/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"] == "no route GET /v1/nothing"


def test_the_served_openapi_document_is_the_checked_in_one(world):
    _, _, client = world
    served = client.get("/openapi.json").json()
    checked_in = json.loads(OPENAPI.read_text())
    assert served == checked_in, (
        "docs/http-openapi.json is stale: python -m raydelay.http.api > docs/http-openapi.json"
    )
    ops = {(m.upper(), p) for p, item in served["paths"].items() for m in item}
    assert ("POST", "/v1/topics/{topic}/messages/batch") in ops and ("POST", "/v1/cancel") in ops
    send = served["paths"]["/v1/topics/{topic}/messages"]["post"]["requestBody"]["content"]
    assert set(send) == {"application/json", "application/octet-stream"}
    assert served["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_invalid_argument_from_the_client_is_400():
    class Refusing(FakeCluster):
        def cancel(self, ids):
            raise InvalidArgument("message_ids: refused")

    tokens = TokenStore(MemoryObjectStore())
    _, token = tokens.create("c", ["cancel"])
    ctx = ApiContext(Refusing(), TokenCache(tokens, 60), ApiSettings(1024, 10))
    r = TestClient(create_api(lambda: ctx)).post(
        "/v1/cancel", json={"message_ids": ["orders/0/1:2"]}, headers=auth(token)
    )
    assert r.status_code == 400 and r.json()["error"]["message"] == "message_ids: refused"


def test_requests_served_from_separate_event_loops_each_send():
    # a TestClient outside `with` runs each request in an event loop of its own: the
    # asyncio producer of one loop is not used from another
    cluster = FakeCluster()
    tokens = TokenStore(MemoryObjectStore())
    _, token = tokens.create("p", ["produce"])
    ctx = ApiContext(cluster, TokenCache(tokens, 60), ApiSettings(1024, 10))
    client = TestClient(create_api(lambda: ctx))
    for text in ("one", "two", "three"):
        r = client.post("/v1/topics/orders/messages", json={"text": text}, headers=auth(token))
        assert r.status_code == 201, r.text
    assert sorted(cluster.sent()) == [b"one", b"three", b"two"]


def test_every_answer_says_how_long_the_app_took(world):
    _, tokens, client = world
    for r in (
        client.get("/v1/health"),
        client.post(
            "/v1/topics/orders/messages", json={"text": "x"}, headers=auth(tokens["produce"])
        ),
        client.post("/v1/topics/orders/messages", json={}, headers=auth(tokens["produce"])),
    ):
        name, _, duration = r.headers["Server-Timing"].partition(";dur=")
        assert name == "app" and float(duration) >= 0


# --- keys of the caller's choosing ----------------------------------------------------------


def test_a_second_send_of_a_pending_key_does_what_on_duplicate_says(world):
    cluster, tokens, client = world
    h = auth(tokens["produce"])
    url = "/v1/topics/orders/messages"
    first = client.post(url, json={"text": "a", "deliver_after": 60, "key": "o-1"}, headers=h)
    same = client.post(url, json={"text": "b", "deliver_after": 60, "key": "o-1"}, headers=h)
    assert same.status_code == 201 and same.json() == first.json()  # ignored
    refused = client.post(
        url, json={"text": "c", "deliver_after": 60, "key": "o-1", "on_duplicate": "error"},
        headers=h,
    )  # fmt: skip
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "key_pending"
    raw = client.post(
        url, content=b"d", headers={**h, "Content-Type": "application/octet-stream",
        "Raydelay-Deliver-After": "60", "Raydelay-Key": "o-1", "Raydelay-On-Duplicate": "replace"},
    )  # fmt: skip
    assert raw.status_code == 201 and raw.json() != first.json()
    assert cluster.sent() == [b"a", b"d"]


def test_put_under_a_key_replaces_and_delete_cancels(world):
    cluster, tokens, client = world
    put = "/v1/topics/orders/keys/order-17"
    a = client.put(put, json={"text": "v1", "deliver_after": 60}, headers=auth(tokens["produce"]))
    b = client.put(put, json={"text": "v2", "deliver_after": 60}, headers=auth(tokens["produce"]))
    assert a.status_code == b.status_code == 201 and a.json() != b.json()
    assert cluster.logs["orders"].applied  # the replaced one's marker went to the subscriptions
    bad = client.put(
        put, json={"text": "v3", "deliver_after": 60, "key": "x"}, headers=auth(tokens["produce"])
    )
    assert bad.status_code == 400 and "key" in bad.json()["error"]["message"]
    gone = client.delete(put, headers=auth(tokens["cancel"]))
    assert gone.status_code == 200 and gone.json() == {"cancelled": True}
    assert client.delete(put, headers=auth(tokens["cancel"])).json() == {"cancelled": False}
    assert client.delete(put, headers=auth(tokens["produce"])).status_code == 403


def test_cancel_by_keys_and_its_bad_bodies(world):
    cluster, tokens, client = world
    client.post(
        "/v1/topics/orders/messages/batch",
        json={"messages": [{"text": "x", "deliver_after": 60, "key": "k1"}],
              "on_duplicate": "replace"},
        headers=auth(tokens["produce"]),
    )  # fmt: skip
    url = "/v1/topics/orders/cancel"
    r = client.post(url, json={"keys": ["k1", "k2"]}, headers=auth(tokens["cancel"]))
    assert r.status_code == 200 and r.json() == {"cancelled": [True, False]}
    for body, field in [
        ({"keys": []}, "keys"),
        ({"keys": [3]}, "keys[0]"),
        ({"ids": ["k"]}, "body"),
    ]:
        r = client.post(url, json=body, headers=auth(tokens["cancel"]))
        assert r.status_code == 400 and r.json()["error"]["message"].startswith(field), r.text
    r = client.post(
        "/v1/topics/orders/messages/batch",
        json={"messages": [{"text": "x", "on_duplicate": "error"}]},
        headers=auth(tokens["produce"]),
    )
    assert r.status_code == 400 and "once, beside messages" in r.json()["error"]["message"]
    r = client.post(
        "/v1/topics/orders/messages",
        json={"text": "x", "on_duplicate": "overwrite"},
        headers=auth(tokens["produce"]),
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("on_duplicate")
