"""raydelay as a peer of ``bench/compare.py``: one local Ray on the machine's 2 cores, the
default config (strict mode, bucket tracker) over a local-dir store that fsyncs every
write. Each scenario uses a fresh topic with one shared subscription and deletes it after.

- Producers: ``send_many`` with 5,000 messages per call from several threads; it returns
  once the messages are durable in the partition log.
- Consumers: ``receive_batch(max_messages=40,000)`` (10,000 from each of 4 partitions) then
  ``ack`` of the whole batch, from the driver. The burst is also run with
  ``receive_batch(max_messages=10,000)`` (the default) and through ``receive()`` +
  ``ack(list)``, each as its own row.
- Memory: RSS of the topic actor(s) and the subscription actor(s) (psutil), after the
  subscription has read the whole log in; store bytes are the store directory's size.
- Recovery: ``ray.kill(no_restart=False)`` of the subscription actor (Ray restarts it);
  time from the kill until the restarted process makes its first delivery (not what the
  consumer's prefetch buffer hands out meanwhile).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import ray

import raydelay
from bench.common import ask, cpu_times, kill_and_recover, ray_processes, start_local_ray
from bench.workload import (
    Drain,
    dir_bytes,
    lateness_summary,
    now_ms,
    produce,
    progress,
    run_burst,
    run_lateness,
    run_send,
    run_steady,
    sleep_until,
    spread_now,
    stages_line,
)
from raydelay.actors.handles import host_of, subscription_partition, topic_partition, unit_host_of
from raydelay.actors.host import HostActor
from raydelay.cluster.names import NAMESPACE
from raydelay.dispatch import stages

BATCH = 5_000
# max_messages per receive: 40,000 asks each of the 4 partitions for 10,000 per call
RECEIVE = int(os.environ.get("RAYDELAY_BENCH_RECEIVE", "40000"))
SUB = "bench"
SEND_PARTITIONS = 2  # the send and steady scenarios: a topic as the demo makes
PAYLOAD_BYTES = 100  # bench/workload.py's payloads


class RaydelayPeer:
    def __init__(self, root: str, config: dict | None = None) -> None:
        self.root = Path(root)
        start_local_ray()
        self.cluster = raydelay.connect(
            {"storage": {"kind": "local", "local": {"root": root}}} | (config or {})
        )

    # --- plumbing ---------------------------------------------------------------------------

    def _open(
        self,
        topic: str,
        partitions: int,
        path: str = "batch",
        size: int = RECEIVE,
        prefetch: bool = True,
        defer_ack: bool = False,
    ):
        self.cluster.create_topic(topic, partitions=partitions)
        consumer = self.cluster.subscribe(topic, SUB, prefetch=prefetch)
        producer = self.cluster.create_producer(topic)

        def send(items: list[bytes], ats: np.ndarray) -> None:
            producer.send_many(items, deliver_at=ats.tolist())

        return producer, consumer, send, receive_from(consumer, path, size, defer_ack)

    def _close(self, topic: str, producer, consumer) -> None:
        consumer.close()
        producer.close()
        self.cluster.delete_topic(topic, force=True)

    def _actors(self, topic: str, partitions: int) -> tuple[list, list]:
        """The hosts of the topic's partitions, and the subscription host of the
        subscription's unit."""
        hosts = sorted({host_of(topic, p) for p in range(partitions)})
        subs = [unit_host_of(topic, SUB)]
        return (
            [ray.get_actor(n, namespace=NAMESPACE) for n in hosts],
            [ray.get_actor(n, namespace=NAMESPACE) for n in subs],
        )

    def _rss(self, topic: str, partitions: int) -> dict[str, int]:
        hosts, subs = self._actors(topic, partitions)
        out = {"topic": 0, "subscription": 0}
        for kind, actors in (("topic", hosts), ("subscription", subs)):
            for pid in ray.get([a.pid.remote() for a in actors]):
                out[kind] += psutil.Process(pid).memory_info().rss
        return out

    def _settle(self, topic: str, sent: int, timeout_s: float = 600) -> dict:
        """Wait until the subscription has read (nearly) every message in and its count holds
        still. Delayed + acked misses the few due messages on their way to the consumer, so
        both checks allow 0.1% of ``sent``."""
        deadline = time.monotonic() + timeout_s
        last = -sent
        while time.monotonic() < deadline:
            s = self.cluster.stats(topic, SUB)
            seen = s["delayed"] + s["acked"]
            slack = max(sent // 1000, 10)
            if s["read_ahead"] == 0 and seen >= sent - slack and abs(seen - last) <= slack:
                return s
            last = seen
            time.sleep(1.0)
        # measured anyway, marked: the report says how much the subscription had indexed
        progress(f"{topic}: after {timeout_s:.0f} s the subscription had read {seen:,} of {sent:,}")
        return s | {"not_settled": True}

    # --- scenarios --------------------------------------------------------------------------

    def ingest(self, n: int, threads: int) -> dict:
        topic = "ingest"
        producer, consumer, send, receive = self._open(topic, 4)
        drain = Drain(receive).start()
        seconds = produce(
            send, n, spread_now, threads=threads, batch=BATCH, label="raydelay ingest"
        )
        drain.stop()
        out = {"seconds": seconds, "acked_rate": n / seconds, "durable_rate": n / seconds}
        out["disk_bytes"] = dir_bytes(self.root)
        self._close(topic, producer, consumer)
        return out

    def memory(self, points: list[int], kill_at: set[int], threads: int) -> list[dict]:
        """One partition (one subscription actor holds everything); load to each point,
        measure, and kill the subscription actor at the points in ``kill_at``."""
        topic = "memory"
        producer, consumer, send, receive = self._open(topic, 1)
        time.sleep(1.0)
        idle = self._rss(topic, 1)
        drain = Drain(receive).start()
        rows, sent = [], 0
        for p in points:
            produce(send, p - sent, spread_now, threads=threads, batch=BATCH, seq0=sent,
                    label=f"raydelay memory {p:,}")  # fmt: skip
            sent = p
            stats = self._settle(topic, sent)
            time.sleep(2.0)  # a cursor write and the last seals land
            rss = self._rss(topic, 1)
            row = {
                "sent": p,
                # not read in yet: count only what the subscription holds, not the log's rest
                "pending": stats["delayed"] if stats.get("not_settled") else sent - drain.received,
                "indexed": stats["delayed"] + stats["acked"],
                "stored": sent - drain.received,  # what the log holds for this subscription
                "not_settled": bool(stats.get("not_settled")),
                "memory_bytes": rss["topic"] + rss["subscription"],
                "rss_topic": rss["topic"],
                "rss_subscription": rss["subscription"],
                "baseline_bytes": idle["topic"] + idle["subscription"],
                "tracker_bytes": stats["partitions"][0]["tracker"].get("memory_bytes"),
                "buckets": stats["buckets"],
                "disk_bytes": dir_bytes(self.root),
            }
            progress(f"raydelay {p:,}: {row['memory_bytes'] / 2**20:,.0f} MiB RSS")
            if p in kill_at:
                row |= self._kill(topic)
            rows.append(row)
        drain.stop()
        self._close(topic, producer, consumer)
        return rows

    def _kill(self, topic: str) -> dict:
        """SIGKILL the subscription actor; the figure is from the kill to the first delivery
        the restarted process makes (its own clock reading, ``first_delivery_at_ms``). What
        the consumer receives after the kill does not count: its prefetch buffer still
        hands out what the old process delivered."""
        sub = subscription_partition(topic, 0, SUB)
        killed, _, rec = kill_and_recover(sub)
        first = rec.get("first_delivery_at_ms")
        return {
            "recovery_s": None if first is None else (first - killed) / 1000,
            "recovery_detail": {
                k: rec.get(k) for k in ("init_s", "first_receive_s", "first_delivery_s")
            },
        }

    def burst(
        self, n: int, due_ms: int, threads: int, path: str = "batch", size: int = RECEIVE
    ) -> dict:
        """``path``: "batch" consumes with receive_batch, "list" with receive(); ``size`` is
        max_messages per call."""
        topic = "burst"
        producer, consumer, send, receive = self._open(topic, 4, path, size)
        roles = ray_processes()
        out = run_burst(send, receive, n, due_ms, threads=threads, batch=BATCH,
                        cpu=lambda: cpu_times(roles), label="raydelay burst load")  # fmt: skip
        self._close(topic, producer, consumer)
        return out

    def lateness(self, rate: int, seconds: int, start_ms: int, threads: int) -> dict:
        topic = "lateness"
        producer, consumer, send, receive = self._open(topic, 4)
        out = run_lateness(send, receive, rate, seconds, start_ms, threads=threads, batch=BATCH,
                           label="raydelay lateness load")  # fmt: skip
        self._close(topic, producer, consumer)
        return out

    def send(self, loop_n: int, threads: int, threads_n: int, async_n: int) -> dict:
        """send() in a loop, from many threads sharing one producer, and send_async from one
        thread, on a topic of 2 partitions (each send returns once durable: fsynced)."""
        topic = "send"
        self.cluster.create_topic(topic, partitions=SEND_PARTITIONS)
        producer = self.cluster.create_producer(topic)
        at = now_ms() + 3_600_000
        try:
            # (a raydelay before send_async, measured for comparison, has none)
            send_async = getattr(producer, "send_async", None)
            floor = durable_write_floor(self.root / "floor", loop_n)
            progress(f"durable-write floor (write, fsync, link, fsync the dir): p50 {floor:.2f} ms")
            return {"floor_p50_ms": floor} | run_send(
                lambda p: producer.send(p, deliver_at=at),
                None if send_async is None else lambda p: send_async(p, deliver_at=at),
                producer.flush,
                loop_n=loop_n,
                threads=threads,
                threads_n=threads_n,
                async_n=async_n,
                label="raydelay",
            )
        finally:
            producer.close()
            self.cluster.delete_topic(topic, force=True)

    def steady(self, rates: list[int], seconds: float, prefetch_at: list[int]) -> dict:
        """The steady stream at each rate on a topic of 2 partitions, one consumer with
        the default receive (prefetch off), and with prefetch at the rates ``prefetch_at``."""
        out: dict = {"default": [], "prefetch": []}
        runs = [(r, False) for r in rates] + [(r, True) for r in prefetch_at]
        for i, (rate, prefetch) in enumerate(runs):
            topic = f"steady{i}"
            producer, consumer, send, receive = self._open(
                topic, SEND_PARTITIONS, size=10_000, prefetch=prefetch, defer_ack=True
            )
            try:
                label = "raydelay steady" + (" (prefetch)" if prefetch else "")
                result = run_steady(send, receive, rate, seconds, label=label)
                # where the lateness went: the subscription's stages and the consumer's
                result["stages"] = stages.merge(
                    [
                        self.cluster.stats(topic, SUB)["lateness"]["stages"],
                        consumer.lateness_stages(),
                    ]
                )
                progress(f"{label} {rate:,}/s by stage: {stages_line(result['stages'])}")
            finally:
                self._close(topic, producer, consumer)
            out["prefetch" if prefetch else "default"].append(result)
        return out

    def scale(self, n: int, drain_s: float, threads: int) -> dict:
        """``n`` pending in one partition's subscription with no consumer while loading (due
        uniform over the hour starting a minute after the load starts), RSS sampled every
        5 s; then a consumer drains the overdue backlog for ``drain_s`` seconds."""
        topic = "scale"
        producer, consumer, send, receive = self._open(topic, 1)
        consumer.close()  # nobody consumes while loading
        t0 = now_ms()
        first_due = t0 + 60_000

        def schedule(lo: int, c: int) -> np.ndarray:
            return first_due + np.random.default_rng(lo).integers(0, 3_600_000, c)

        samples: list[dict] = []
        sent = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(5.0):
                try:
                    rss = self._rss(topic, 1)
                    s = self.cluster.stats(topic, SUB)
                except Exception as e:  # a sample is lost, the run goes on
                    progress(f"scale: sample failed: {e!r}")
                    continue
                samples.append({"t_s": (now_ms() - t0) / 1000, "sent": sent[0],
                                "delayed": s["delayed"], "acked": s["acked"], **rss})  # fmt: skip

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()

        def counted(items: list[bytes], ats: np.ndarray) -> None:
            send(items, ats)
            sent[0] += len(items)

        load_s = produce(counted, n, schedule, threads=threads, batch=BATCH,
                         label="raydelay scale load")  # fmt: skip
        stats = self._settle(topic, n)
        overdue = int(np.clip((now_ms() - first_due) / 3_600_000, 0, 1) * n)
        consumer = self.cluster.subscribe(topic, SUB)
        drain = Drain(receive_from(consumer)).start()
        drain_t0 = now_ms()
        time.sleep(drain_s)
        drain.stop()
        drained_s = (now_ms() - drain_t0) / 1000
        stop.set()
        sampler.join()
        store = dir_bytes(self.root)
        topic_stats = ask(lambda: topic_partition(topic, 0).submit(HostActor.stats))
        written = None
        if "bytes_written" in topic_stats:  # the log's and the buckets' bytes
            written = _written(topic_stats) / (n * PAYLOAD_BYTES)
        out = {
            "n": n,
            "load_s": load_s,
            "written_per_appended": written,
            "load_rate": n / load_s,
            "buckets": stats["buckets"],
            "indexed_at_drain": stats["delayed"],
            "store_bytes": store,
            "overdue_at_drain": overdue,
            "drained": drain.received,
            "drain_rate": drain.received / drained_s,
            "drain_lateness": lateness_summary(drain.lateness()),
            "samples": samples,
        }
        self._close(topic, producer, consumer)
        return out

    def drain(self, n: int, spread_s: int, threads: int) -> dict:
        """``n`` messages in one partition due over ``spread_s`` seconds, with no consumer
        until every one is overdue; then one consumer drains them: messages/s."""
        topic = "drain"
        producer, consumer, send, receive = self._open(topic, 1)
        consumer.close()
        first_due = now_ms() + 5_000 + n // 50  # after the load

        def schedule(lo: int, c: int) -> np.ndarray:
            return first_due + np.random.default_rng(lo).integers(0, spread_s * 1000, c)

        load_s = produce(send, n, schedule, threads=threads, batch=BATCH,
                         label="raydelay drain load")  # fmt: skip
        sleep_until(first_due + spread_s * 1000 + 2_000)
        stats = self.cluster.stats(topic, SUB)
        consumer = self.cluster.subscribe(topic, SUB)
        drain = Drain(receive_from(consumer)).start()
        t0 = now_ms()
        done = drain.wait_for(n, 600)
        seconds = (now_ms() - t0) / 1000
        drain.stop()
        topic_stats = ask(lambda: topic_partition(topic, 0).submit(HostActor.stats))
        out = {
            "n": n,
            "spread_s": spread_s,
            "load_s": load_s,
            "topic_buckets": topic_stats["buckets"],
            "merges": topic_stats.get("merged", 0),
            "written_per_appended": _written(topic_stats) / (n * PAYLOAD_BYTES),
            "drained": drain.received,
            "complete": done,
            "seconds": seconds,
            "rate": drain.received / seconds,
            "buckets": stats["buckets"],
            "point_reads": topic_stats["point_reads"],
        }
        progress(f"drain: {out['rate']:,.0f} msg/s")
        self._close(topic, producer, consumer)
        return out

    def close(self) -> None:
        self.cluster.shutdown()
        ray.shutdown()


def durable_write_floor(root: Path, n: int) -> float:
    """The p50 (ms) of one durable write of a small object on this disk, as the local-dir
    store makes each commit (a temp file written and fsynced, linked to its key, the
    directory fsynced): what a ``send()`` cannot go below, measured in the same run."""
    from raydelay.storage import LocalDirObjectStore

    store = LocalDirObjectStore(str(root))
    data = os.urandom(300)  # (about one message's ledger object)
    times = []
    for i in range(max(n, 100)):
        t0 = time.perf_counter()
        store.put_new(f"floor/{i:08d}", data)
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.percentile(times, 50))


def _written(topic_stats: dict) -> int:
    """Bytes the partition wrote to the store: its log, its buckets, and its merges."""
    return (
        topic_stats["bytes_written"]
        + topic_stats["sealed_bytes"]
        + topic_stats.get("merged_bytes", 0)
    )


def receive_from(consumer, path: str = "batch", size: int = RECEIVE, defer_ack: bool = False):
    """A ``Drain`` receive: up to ``size`` messages, acked as one batch. ``path`` "batch":
    ``receive_batch`` (the payload column goes to the Drain as it is); "list":
    ``receive()`` and a list of Message objects. ``defer_ack``: each batch is acked at the
    start of the next call, so that the Drain stamps a batch when it was received (as a
    Redis BLMPOP, which has no ack), not after its ack went out."""
    unacked: list = []

    def receive_batch():
        if unacked:
            consumer.ack(unacked.pop())
        batch = consumer.receive_batch(max_messages=size, timeout_s=0.2)
        if len(batch):
            if defer_ack:
                unacked.append(batch)
            else:
                consumer.ack(batch)
        return batch.payloads

    def receive_list() -> list[bytes]:
        msgs = consumer.receive(max_messages=size, timeout_s=0.2)
        if msgs:
            consumer.ack(msgs)
        return [m.payload for m in msgs]

    return receive_batch if path == "batch" else receive_list
