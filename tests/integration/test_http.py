"""The HTTP API on Ray Serve, in the session's Ray, driven from outside Python: ``curl``
and a Node script with its built-in ``fetch`` produce, cancel and read; a Python consumer
receives what they sent. Bad requests each get one 4xx and write nothing; a revoked token
stops working; docs/http.md's shell examples run as written.

The server is the real one (``raydelay.http.serve.start``): Serve's proxy on a free
127.0.0.1 port, one replica with its own raydelay client. Under CI=true a missing curl or
Node fails; it never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import ray

from raydelay.clock import now_ms
from raydelay.config import config_from_dict, config_to_dict
from tests.conftest import missing_backend
from tests.integration.helpers import (
    http_status,
    key_on,
    receive_until,
    received_before,
    send_markers,
    wait_until,
)

pytest.importorskip("ray.serve")

HERE = Path(__file__).resolve().parent
DOCS = HERE.parents[1] / "docs" / "http.md"
NODE_CLIENT = HERE / "http_client.mjs"
MAX_BODY_BYTES = 64 * 1024  # this server's http.max_body_bytes
DOCS_TOPIC = "webhooks"  # docs/http.md's topic (a name no other page uses: one session cluster)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing_backend(f"{name} (the HTTP API is tested with it from outside Python)")
    return path  # type: ignore[return-value]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    """The server of this module: its URL, its config, and a way to make tokens."""

    def __init__(self, cluster, port: int) -> None:
        raw = config_to_dict(cluster.config)
        raw["http"] = {
            **raw["http"],
            "host": "127.0.0.1",
            "port": port,
            "max_body_bytes": MAX_BODY_BYTES,
            "max_batch_messages": 100,
            "token_refresh_s": 1.0,
        }
        self.config = config_from_dict(raw)
        self.url = f"http://127.0.0.1:{port}"

    def tokens(self):
        from raydelay.http.tokens import TokenStore
        from raydelay.storage import make_store

        return TokenStore(make_store(self.config))

    def token(self, *scopes: str, rate_per_s: float = -1) -> str:
        name = f"t{time.monotonic_ns()}"
        return self.tokens().create(name, scopes, rate_per_s)[1]


@pytest.fixture(scope="module")
def api(ray_cluster):
    from ray import serve

    from raydelay.http import serve as http_serve

    made = Api(ray_cluster, _free_port())
    http_serve.start(made.config, made.config.http)
    try:
        wait_until(
            "the HTTP API to answer", lambda: http_status(made.url + "/v1/health") == 200, 120
        )
        yield made
    finally:
        serve.shutdown()


def curl(*args: str, token: str | None = None) -> tuple[int, dict | list | None]:
    """``curl`` with the token; the HTTP status and the JSON answer."""
    argv = [_tool("curl"), "-sS", "-o", "-", "-w", "\n%{http_code}"]
    if token is not None:
        argv += ["-H", f"Authorization: Bearer {token}"]
    out = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60, check=True)
    body, _, status = out.stdout.rpartition("\n")
    return int(status), (json.loads(body) if body.strip() else None)


def test_curl_sends_cancels_and_reads_and_a_python_consumer_receives(
    api, cluster, topic_name, tmp_path
):
    # Given a topic with a subscription, and a token that may produce, cancel and read
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "billing")
    token = api.token("produce", "cancel", "read")
    base = f"{api.url}/v1/topics/{topic_name}"
    due = now_ms() + 2_000
    # When curl sends a JSON message, a raw binary one and a batch, and cancels one of those
    code, one = curl(
        "-H", "Content-Type: application/json",
        "-d", json.dumps({"text": "json-1", "deliver_at": due, "key": "order-1"}),
        f"{base}/messages", token=token,
    )  # fmt: skip
    assert code == 201, one
    binary = tmp_path / "payload.bin"
    binary.write_bytes(b"\x00raw\xff")
    code, raw = curl(
        "-H", "Content-Type: application/octet-stream",
        "-H", "Raydelay-Deliver-After: 2",
        "-H", 'Raydelay-Properties: {"source": "curl"}',
        "--data-binary", f"@{binary}",
        f"{base}/messages", token=token,
    )  # fmt: skip
    assert code == 201, raw
    batch = {"messages": [{"text": f"batch-{i}", "deliver_after": 2} for i in range(3)]}
    code, sent = curl(
        "-H", "Content-Type: application/json", "-d", json.dumps(batch),
        f"{base}/messages/batch", token=token,
    )  # fmt: skip
    assert code == 201 and len(sent["message_ids"]) == 3, sent
    gone = sent["message_ids"][1]
    code, scheduled = curl(f"{base}/subscriptions/billing/scheduled?limit=10", token=token)
    assert code == 200 and gone in [m["message_id"] for m in scheduled], scheduled
    code, answer = curl(
        "-H", "Content-Type: application/json", "-d", json.dumps({"message_ids": [gone]}),
        f"{api.url}/v1/cancel", token=token,
    )  # fmt: skip
    assert (code, answer) == (200, {"cancelled": [True]})
    # Then the consumer receives each message that was not cancelled, as it was sent
    wanted = {one["message_id"], raw["message_id"], *sent["message_ids"]} - {gone}
    got = receive_until(consumer, lambda ms: wanted <= {str(m.message_id) for m in ms})
    by_id = {str(m.message_id): m for m, _ in got}
    assert by_id[one["message_id"]].payload == b"json-1"
    assert by_id[one["message_id"]].key == "order-1"
    assert by_id[one["message_id"]].deliver_at_ms == due
    assert by_id[raw["message_id"]].payload == b"\x00raw\xff"
    assert by_id[raw["message_id"]].properties == {"source": "curl"}
    # And the cancelled one never comes: markers due after it arrive, and it not before them
    markers = send_markers(cluster.create_producer(topic_name), [now_ms() + 500])
    late = received_before(consumer, markers)
    assert gone not in {str(m.message_id) for m in late} | set(by_id)


def test_a_node_service_with_fetch_sends_and_a_python_consumer_receives(api, cluster, topic_name):
    # Given a Node program that knows only the URL and a token
    node = _tool("node")
    cluster.create_topic(topic_name, partitions=2)
    consumer = cluster.subscribe(topic_name, "push")
    token = api.token("produce", "cancel", "read")
    # When it sends a batch, a raw message and a JSON one, and cancels one of the batch
    out = subprocess.run(
        [node, str(NODE_CLIENT), api.url, token, topic_name, "push"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["statuses"] == [201, 201, 201, 200] and doc["cancelled"] == [True]
    assert {"delayed", "backlog", "consumers"} <= set(doc["stats_keys"]), doc
    assert doc["put"][0] != doc["put"][1] and doc["dup"][0] == doc["dup"][1]
    assert doc["cancelled_by_key"] is True
    # Then a Python consumer receives the six it did not cancel or replace, with their fields
    cancelled = doc["batch"][1]
    wanted = {doc["batch"][0], doc["batch"][2], doc["raw"], doc["one"], doc["put"][1],
              doc["dup"][0]}  # fmt: skip
    got = {str(m.message_id): m for m, _ in receive_until(
        consumer, lambda ms: wanted <= {str(m.message_id) for m in ms}
    )}  # fmt: skip
    assert got[doc["batch"][0]].payload == b"node-0"
    assert got[doc["batch"][2]].key == "order-2"
    assert got[doc["batch"][2]].properties == {"from": "node"}
    assert got[doc["raw"]].payload == bytes([0, 1, 2, 255]) and got[doc["raw"]].key == "raw-key"
    assert got[doc["one"]].payload == b"node-json"
    assert got[doc["put"][1]].payload == b"order-9 v2" and got[doc["put"][1]].key == "order-9"
    assert got[doc["dup"][0]].payload == b"dup first"
    markers = send_markers(cluster.create_producer(topic_name), [now_ms() + 500])
    later = {str(m.message_id) for m in received_before(consumer, markers)}
    assert not later & {cancelled, doc["put"][0], doc["doomed"]}
    assert not {cancelled, doc["put"][0], doc["doomed"]} & set(got)


BAD_REQUESTS = [
    # (what, curl arguments after the token, status, the error names)
    (
        "a missing payload",
        ["-H", "Content-Type: application/json", "-d", '{"deliver_after": 0}'],
        400,
        "payload",
    ),
    (
        "a bad time",
        [
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"text": "x", "deliver_at": "tomorrow 9am"}',
        ],
        400,
        "deliver_at",
    ),
    (
        "a negative delay",
        ["-H", "Content-Type: application/json", "-d", '{"text": "x", "deliver_after": -1}'],
        400,
        "deliver_after",
    ),
    (
        "a time too far away",
        [
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"text": "x", "deliver_at": 99999999999999999999}',
        ],
        400,
        "deliver_at",
    ),
    (
        "not JSON",
        ["-H", "Content-Type: application/json", "-d", "{text: x}"],
        400,
        "body: not valid JSON",
    ),
    (
        "a wrong field type",
        ["-H", "Content-Type: application/json", "-d", '{"text": 17}'],
        400,
        "text",
    ),
    (
        "an oversized body",
        ["-H", "Content-Type: application/octet-stream", "--data-binary", "@BIG"],
        413,
        "http.max_body_bytes",
    ),
    (
        "a bad batch entry",
        [
            "-H",
            "Content-Type: application/json",
            "-d",
            '{"messages": [{"text": "ok"}, {"payload": "%%%"}]}',
            "BATCH",
        ],
        400,
        "messages[1].payload",
    ),
]


@pytest.mark.parametrize(
    ("what", "args", "status", "says"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS]
)
def test_bad_input_gets_one_clear_4xx(api, cluster, topic_name, tmp_path, what, args, status, says):
    cluster.create_topic(topic_name, partitions=1)
    token = api.token("produce")
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (MAX_BODY_BYTES + 1))
    path = f"{api.url}/v1/topics/{topic_name}/messages"
    args = [a.replace("@BIG", f"@{big}") for a in args]
    if args[-1] == "BATCH":
        args, path = args[:-1], path + "/batch"
    code, answer = curl(*args, path, token=token)
    assert code == status, (what, answer)
    assert answer["error"]["status"] == status and says in answer["error"]["message"], answer


def test_refused_requests_write_nothing(api, cluster, topic_name, tmp_path):
    # Given a subscribed topic, and tokens of each kind
    cluster.create_topic(topic_name, partitions=1)
    consumer = cluster.subscribe(topic_name, "audit")
    producer_token = api.token("produce")
    reader_token = api.token("read")
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (MAX_BODY_BYTES + 1))
    path = f"{api.url}/v1/topics/{topic_name}/messages"
    json_headers = ["-H", "Content-Type: application/json"]
    # When every kind of bad request is made, each for a message due now
    refused = [
        curl(*json_headers, "-d", '{"text": "no token"}', path),
        curl(*json_headers, "-d", '{"text": "bad token"}', path, token="rdk_000000000000_" + "A" * 43),
        curl(*json_headers, "-d", '{"text": "read scope"}', path, token=reader_token),
        curl(*json_headers, "-d", '{"text": "bad time", "deliver_at": "soon"}', path, token=producer_token),
        curl(*json_headers, "-d", '{"txt": "missing field"}', path, token=producer_token),
        curl("-H", "Content-Type: application/octet-stream", "--data-binary", f"@{big}", path, token=producer_token),
        curl(
            *json_headers, "-d", '{"messages": [{"text": "first of a bad batch"}, {"text": 1}]}',
            path + "/batch", token=producer_token,
        ),
        curl(*json_headers, "-d", '{"text": "unknown topic"}', f"{api.url}/v1/topics/no-such-topic-{topic_name}/messages", token=producer_token),
    ]  # fmt: skip
    # Then each got its 4xx
    assert [code for code, _ in refused] == [401, 401, 403, 400, 400, 413, 400, 404], refused
    assert all(set(answer) == {"error"} for _, answer in refused), refused
    # And none of them wrote a message: markers sent after them are all the consumer gets
    markers = send_markers(cluster.create_producer(topic_name))
    assert received_before(consumer, markers) == []


def test_a_token_made_and_revoked_with_the_cli(api, cluster, topic_name):
    # Given a token made with `raydelay tokens create`
    cluster.create_topic(topic_name, partitions=1)
    address = ray.get_runtime_context().gcs_address
    cli = [sys.executable, "-m", "raydelay.cli", "--address", address]
    env = {**os.environ, "RAYDELAY_HTTP__TOKEN_REFRESH_S": "1"}
    name = f"svc-{topic_name}"
    made = subprocess.run(
        [*cli, "tokens", "create", name, "--scope", "produce", "--json"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    doc = json.loads(made.stdout)
    token = doc["token"]
    assert re.fullmatch(r"rdk_[0-9a-f]{12}_[A-Za-z0-9_-]{43}", token) and doc["scopes"] == [
        "produce"
    ]
    listed = subprocess.run(
        [*cli, "tokens", "list", "--json"], capture_output=True, text=True, timeout=300
    )
    assert listed.returncode == 0, listed.stderr
    mine = [t for t in json.loads(listed.stdout)["tokens"] if t["name"] == name]
    assert len(mine) == 1 and "token" not in mine[0] and token not in listed.stdout
    send = [
        "-H",
        "Content-Type: application/json",
        "-d",
        '{"text": "x"}',
        f"{api.url}/v1/topics/{topic_name}/messages",
    ]
    assert curl(*send, token=token)[0] == 201
    # When it is revoked
    revoked = subprocess.run(
        [*cli, "tokens", "revoke", name], capture_output=True, text=True, timeout=300
    )
    assert revoked.returncode == 0, revoked.stderr
    # Then the server refuses it within its refresh time
    wait_until("the revoked token to be refused", lambda: curl(*send, token=token)[0] == 401, 30)


def test_a_token_over_its_rate_gets_429(api, cluster, topic_name):
    cluster.create_topic(topic_name, partitions=1)
    token = api.token("read", rate_per_s=1)
    codes = [curl(f"{api.url}/v1/topics/{topic_name}/stats", token=token)[0] for _ in range(3)]
    assert codes[0] == 200 and 429 in codes[1:], codes


def _doc_blocks(lang: str) -> list[str]:
    """docs/http.md's code blocks of ``lang`` that say they are run here."""
    found = re.findall(rf"```{lang}\n(.*?)```", DOCS.read_text(), re.S)
    return [b for b in found if "run by tests/integration/test_http.py" in b.split("\n", 1)[0]]


def test_the_docs_examples_run_as_written(api, cluster, tmp_path):
    # Given the docs' topic and a token with every scope, as the page makes them
    if DOCS_TOPIC not in cluster.topics():
        cluster.create_topic(DOCS_TOPIC, partitions=2)
    cluster.subscribe(DOCS_TOPIC, "app").close()  # (the scheduled page's subscription)
    env = {**os.environ, "RAYDELAY_URL": api.url, "TOKEN": api.token("admin")}
    shell, js = _doc_blocks("sh"), _doc_blocks("js")
    assert len(shell) >= 3 and len(js) == 1
    # When each shell block runs in bash, and the Node example in node
    for block in shell:
        out = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, (block, out.stdout, out.stderr)
    script = tmp_path / "example.mjs"
    script.write_text(js[0])
    out = subprocess.run(
        [_tool("node"), str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    # Then each succeeded (curl --fail-with-body fails on a 4xx)
    assert out.returncode == 0 and "message_id" in out.stdout, (out.stdout, out.stderr)


def test_raydelay_serve_stops_and_starts_the_api_and_refuses_to_move_its_port(api):
    # Given the API running on this module's port, and the CLI attached to the same Ray
    address = ray.get_runtime_context().gcs_address
    cli = [sys.executable, "-m", "raydelay.cli", "--address", address, "serve"]
    port = api.config.http.port
    env = {
        **os.environ,
        "RAYDELAY_HTTP__MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        "RAYDELAY_HTTP__MAX_BATCH_MESSAGES": "100",
        "RAYDELAY_HTTP__TOKEN_REFRESH_S": "1",
    }

    def serve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=300, env=env)

    # When it is asked for another port, it says where Serve's proxy is, and changes nothing
    moved = serve("--port", str(_free_port()))
    assert moved.returncode == 2, moved.stderr
    assert f"proxy on 127.0.0.1:{port}" in moved.stderr
    assert http_status(api.url + "/v1/health") == 200
    # When it is stopped, nothing answers there any more
    stopped = serve("--stop", "--json")
    assert stopped.returncode == 0 and json.loads(stopped.stdout) == {"stopped": True}, (
        stopped.stderr
    )
    # (no other application of Serve ran: Serve stopped too, and its port is free)
    wait_until("the API to be removed", lambda: http_status(api.url + "/v1/health") is None, 60)
    assert json.loads(serve("--stop", "--json").stdout) == {"stopped": False}
    # Then `raydelay serve` starts it again, and returns once it answers
    started = serve("--port", str(port), "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout) == {"url": api.url, "replicas": 1}
    assert http_status(api.url + "/v1/health") == 200


def test_a_cancel_with_an_id_that_is_not_there_cancels_none(api, cluster, topic_name):
    # Given two messages due later, on the two partitions of a topic
    cluster.create_topic(topic_name, partitions=2)
    token = api.token("produce", "cancel")
    producer = cluster.create_producer(topic_name)
    keys = [key_on(p, 2) for p in (0, 1)]
    ids = producer.send_many([b"a", b"b"], deliver_after=[3600, 3600], keys=keys)
    assert {m.partition for m in ids} == {0, 1}
    cancel = ["-H", "Content-Type: application/json", f"{api.url}/v1/cancel"]
    missing = f"{topic_name}/1/{ids[1].ledger_id}:{ids[1].entry_id + 1000}"
    # When a cancel names them with an id not in the log, or an id of an unknown topic
    for bad in (missing, f"no-such-{topic_name}/0/1:0"):
        code, answer = curl(
            *cancel[:2],
            "-d",
            json.dumps({"message_ids": [str(ids[0]), bad]}),
            cancel[2],
            token=token,
        )
        # Then it is a 404 naming the id, and none of the ids was cancelled
        assert code == 404, answer
        assert bad.split("/")[0] in answer["error"]["message"], answer
    assert cluster.cancel(ids) == [True, True]


def test_the_served_openapi_document_is_the_checked_in_one(api):
    with urllib.request.urlopen(api.url + "/openapi.json", timeout=30) as reply:
        served = json.loads(reply.read())
    assert served == json.loads((HERE.parents[1] / "docs" / "http-openapi.json").read_text())


def test_a_schedules_armed_occurrence_is_not_cancelled_over_http(api, cluster):
    from tests.integration import task_jobs

    # Given a schedule whose next occurrence waits in the tasks topic
    name = f"http-guarded-{uuid.uuid4().hex[:6]}"
    cluster.schedule_cron("0 3 * * *", task_jobs.noop, name=name)
    topic = cluster.config.tasks.topic
    (occurrence,) = cluster.peek(topic, "runners", key=name)
    token = api.token("cancel")
    # When it is cancelled over HTTP, by id or by the schedule's name as key
    for path, body in (
        ("/v1/cancel", {"message_ids": [str(occurrence.message_id)]}),
        (f"/v1/topics/{topic}/cancel", {"keys": [name]}),
    ):
        code, answer = curl(
            "-H", "Content-Type: application/json", "-d", json.dumps(body), api.url + path,
            token=token,
        )  # fmt: skip
        # Then it is refused with the reason, and the occurrence stays
        assert code == 400, answer
        assert f"schedule '{name}'" in answer["error"]["message"], answer
    assert [m.message_id for m in cluster.peek(topic, "runners", key=name)] == [
        occurrence.message_id
    ]
    cluster.delete_schedule(name)
