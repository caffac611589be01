"""The HTTP API against the Python client, in one run. Prints a table.

One process starts a local raydelay (a temp local-dir store, fsync on), a topic of
``--partitions`` partitions, and the HTTP API on Ray Serve (one replica) on a free
127.0.0.1 port. One HTTP client (a keep-alive ``http.client`` connection, as a service
would hold) and the Python client take turns, round by round (``--rounds``), so that the
machine's drift falls on both:

- **single send**: one message per request, from the request until the answer (the
  message durable); Python: ``send()``;
- **batch send**: ``--batch`` messages per request (JSON, base64 payloads of 100 B);
  Python: ``send_many`` of as many, in messages per second;
- **cancel by id**: one id per request; Python: ``cluster.cancel([id])``;
- **cancel by key**: ``DELETE /v1/topics/{topic}/keys/{key}``; Python:
  ``cluster.cancel(topic, key=key)``.

The floor of each HTTP figure is the Python client's in the same run: the API is that
client behind Serve's proxy and a replica, so the ratio is what HTTP, JSON and Serve add.

Usage: python bench/http_bench.py [--sends 300] [--batches 30] [--batch 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import logging
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import raydelay  # noqa: E402
from raydelay.config import config_from_dict, config_to_dict  # noqa: E402
from raydelay.console import table  # noqa: E402

TOPIC = "http-bench"
PAYLOAD = os.urandom(100)


class Http:
    """One keep-alive connection to the API, with a token."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.app_ms: list[float] = []  # the app's own time over each POST (Server-Timing)

    def get(self, path: str) -> float:
        """GET ``path``; the app's own time over it, ms (its ``Server-Timing``)."""
        self.conn.request("GET", path, headers=self.headers)
        reply = self.conn.getresponse()
        reply.read()
        return _app_ms(reply)

    def delete(self, path: str) -> dict:
        self.conn.request("DELETE", path, headers=self.headers)
        reply = self.conn.getresponse()
        body = reply.read()
        if reply.status >= 300:
            raise RuntimeError(f"DELETE {path}: {reply.status} {body[:300]!r}")
        return json.loads(body)

    def post(self, path: str, doc: object) -> dict:
        self.conn.request("POST", path, body=json.dumps(doc), headers=self.headers)
        reply = self.conn.getresponse()
        body = reply.read()
        if reply.status >= 300:
            raise RuntimeError(f"POST {path}: {reply.status} {body[:300]!r}")
        self.app_ms.append(_app_ms(reply))
        return json.loads(body)


def _app_ms(reply: http.client.HTTPResponse) -> float:
    return float((reply.getheader("server-timing") or "app;dur=0").split("dur=")[1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
    return out


def ms(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sends", type=int, default=300, help="single sends per client per round")
    ap.add_argument("--batches", type=int, default=30, help="batches per client per round")
    ap.add_argument("--batch", type=int, default=1_000, help="messages per batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=2)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    root = tempfile.mkdtemp(prefix="http-bench-")
    cluster = raydelay.connect({"storage": {"kind": "local", "local": {"root": root}}})
    cluster.create_topic(TOPIC, partitions=args.partitions)
    from ray import serve

    from raydelay.http import serve as http_serve
    from raydelay.http.tokens import TokenStore
    from raydelay.storage import make_store

    port = _free_port()
    raw = config_to_dict(cluster.config)
    raw["http"] = {**raw["http"], "port": port, "max_batch_messages": max(10_000, args.batch)}
    config = config_from_dict(raw)
    url = http_serve.start(config, config.http)
    _, token = TokenStore(make_store(config)).create("bench", ["admin"], -1)
    client = Http(port, token)
    deadline = time.monotonic() + 120
    while True:  # the first answer (the replica connects its client)
        try:
            client.post(f"/v1/topics/{TOPIC}/messages", {"text": "warm"})
            break
        except (OSError, RuntimeError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            client = Http(port, token)
            time.sleep(0.5)
    producer = cluster.create_producer(TOPIC)
    payload_b64 = base64.b64encode(PAYLOAD).decode()
    far = 4_000_000_000_000  # due in 2096: nothing is delivered while the bench runs
    one = {"payload": payload_b64, "deliver_at": far}
    batch_doc = {"messages": [one] * args.batch}
    payloads = [PAYLOAD] * args.batch

    def http_cancel(_: int) -> None:
        mid = client.post(f"/v1/topics/{TOPIC}/messages", one)["message_id"]
        t0 = time.perf_counter()
        client.post("/v1/cancel", {"message_ids": [mid]})
        cancel_times["http"].append(time.perf_counter() - t0)

    def http_cancel_key(i: int) -> None:
        key = f"http-{i}-{time.monotonic_ns()}"
        client.post(f"/v1/topics/{TOPIC}/messages", {**one, "key": key})
        t0 = time.perf_counter()
        assert client.delete(f"/v1/topics/{TOPIC}/keys/{key}")["cancelled"]
        cancel_times["http key"].append(time.perf_counter() - t0)

    def py_cancel_key(i: int) -> None:
        key = f"py-{i}-{time.monotonic_ns()}"
        producer.send(PAYLOAD, deliver_at=far, key=key)
        t0 = time.perf_counter()
        assert cluster.cancel(TOPIC, key=key)
        cancel_times["python key"].append(time.perf_counter() - t0)

    def py_cancel(_: int) -> None:
        mid = producer.send(PAYLOAD, deliver_at=far)
        t0 = time.perf_counter()
        cluster.cancel([mid])
        cancel_times["python"].append(time.perf_counter() - t0)

    results = {k: {"single": [], "batch": []} for k in ("http", "python")}
    floor: list[float] = []  # GET /v1/health: Serve's proxy and a replica, the app doing nothing
    app_single: list[float] = []  # the app's own time over each single send, ms
    cancel_times: dict[str, list[float]] = {
        "http": [],
        "python": [],
        "http key": [],
        "python key": [],
    }
    for _ in range(20):  # warm both paths
        client.post(f"/v1/topics/{TOPIC}/messages", one)
        producer.send(PAYLOAD, deliver_at=far)
    for r in range(args.rounds):
        order = ("http", "python") if r % 2 == 0 else ("python", "http")
        for kind in order:
            if kind == "http":
                floor += timed(lambda _: client.get("/v1/health"), args.sends)
                client.app_ms.clear()
                single = timed(
                    lambda _: client.post(f"/v1/topics/{TOPIC}/messages", one), args.sends
                )
                app_single += client.app_ms
                batch = timed(
                    lambda _: client.post(f"/v1/topics/{TOPIC}/messages/batch", batch_doc),
                    args.batches,
                )
                timed(http_cancel, args.sends // 3)
                timed(http_cancel_key, args.sends // 3)
            else:
                single = timed(lambda _: producer.send(PAYLOAD, deliver_at=far), args.sends)
                batch = timed(
                    lambda _: producer.send_many(payloads, deliver_at=[far] * args.batch),
                    args.batches,
                )
                timed(py_cancel, args.sends // 3)
                timed(py_cancel_key, args.sends // 3)
            results[kind]["single"] += single
            results[kind]["batch"].append(args.batch * args.batches / sum(batch))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    h, p = results["http"], results["python"]
    rows = [
        [
            "single send p50 / p99 ms",
            f"{ms(h['single'], 50):.2f} / {ms(h['single'], 99):.2f}",
            f"{ms(p['single'], 50):.2f} / {ms(p['single'], 99):.2f}",
            f"{ms(h['single'], 50) / ms(p['single'], 50):.2f}x",
        ],
        [
            "  of which in the app (Server-Timing) p50 ms",
            f"{statistics.median(app_single):.2f}",
            "",
            "",
        ],
        [
            "  Serve's floor: GET /v1/health p50 / p99 ms",
            f"{ms(floor, 50):.2f} / {ms(floor, 99):.2f}",
            "",
            "",
        ],
        [
            f"batch send of {args.batch:,}, msg/s (median of {args.rounds})",
            f"{statistics.median(h['batch']):,.0f}",
            f"{statistics.median(p['batch']):,.0f}",
            f"{statistics.median(h['batch']) / statistics.median(p['batch']):.2f}x",
        ],
        [
            "cancel by id p50 / p99 ms",
            f"{ms(cancel_times['http'], 50):.2f} / {ms(cancel_times['http'], 99):.2f}",
            f"{ms(cancel_times['python'], 50):.2f} / {ms(cancel_times['python'], 99):.2f}",
            f"{ms(cancel_times['http'], 50) / ms(cancel_times['python'], 50):.2f}x",
        ],
        [
            "cancel by key p50 / p99 ms",
            f"{ms(cancel_times['http key'], 50):.2f} / {ms(cancel_times['http key'], 99):.2f}",
            f"{ms(cancel_times['python key'], 50):.2f} / {ms(cancel_times['python key'], 99):.2f}",
            f"{ms(cancel_times['http key'], 50) / ms(cancel_times['python key'], 50):.2f}x",
        ],
    ]
    print(table(["figure", "HTTP API", "Python client", "HTTP / Python"], rows))
    print(
        f"({args.sends} single sends, {args.batches} batches and {args.sends // 3} cancels per "
        f"client per round, {args.rounds} rounds alternating; {args.partitions} partitions, "
        f"one API replica at {url}, local-dir store, fsync on)"
    )
    serve.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
