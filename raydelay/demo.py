"""The main job (``raydelay demo``, what ``make demo`` runs): order timeouts, end to end.

1. Start a local Ray with raydelay on it (a local-dir store) and Spark on that Ray (RayDP).
2. Generate orders: each gets an "unpaid order timeout" at an offset within ``spread_s``
   seconds, written to parquet.
3. Pace the schedule to this machine: two small warm-up jobs on a scratch topic (the
   first pays Spark's cold start, the second measures the warm ingest rate); the timeouts
   then start after a lead that covers twice the ingestion that rate predicts.
4. Ingest the file with the Spark-on-Ray job: each timeout's key is its order id, which
   routes it to one partition and names it there.
5. Meanwhile a share of the orders get paid, some time before their timeout: the payment
   service cancels those timeouts by order id (``cancel_keys``, in batches), keeping no
   message ids.
6. Shared-subscription consumers receive the timeouts as they fall due, and ack them.
   A live line shows delivered / pending / cancelled / late and a lateness histogram.
7. The report: delivered, cancels honoured, early (must be 0), and lateness in two parts.
   A timeout written after its own due time (its publish time is past its deliver_at) is
   late because the demo wrote it late: those are counted apart, with how late they were
   written. The lateness of the timeouts written in time is raydelay's. Then buckets
   sealed and loaded, and the peak RSS of the subscription hosts and partition hosts.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from raydelay._extras import require
from raydelay.accounting import Lateness, Ledger
from raydelay.clock import now_ms
from raydelay.console import table
from raydelay.errors import InvalidArgument

require("spark")  # the demo's main job is a Spark ingest

log = logging.getLogger(__name__)

LATE_MS = 100  # a delivery later than this after its due time counts as late
# the live line's lateness windows: up to each edge (ms), and past the last one
_EDGES_MS = np.array([10, 50, LATE_MS, 1_000])
_LABELS = ["<=10ms", "<=50ms", f"<={LATE_MS}ms", "<=1s", ">1s"]
_PARTITIONS = 2
_PAY_MARGIN_MS = 2_000  # an order is paid at least this long before its timeout
WARMUP_ROWS = 20_000  # rows of each warm-up job
LEAD_MIN_S = 5.0  # the least lead before the first timeout, and the margin in each lead
# the columns of the order timeouts, as ingest_dataframe takes them
_ORDER_COLUMNS: dict[str, Any] = {
    "payload_col": "payload",
    "deliver_at_col": "timeout_at",
    "key_col": "order_id",
    "property_cols": ["region"],
}


@dataclass
class DemoReport:
    messages: int
    paid: int = 0
    ingest_rows_per_s: float = 0.0
    ingest_s: float = 0.0
    delivered: int = 0
    duplicates: int = 0
    early: int = 0
    cancels_honoured: int = 0
    cancelled_delivered: int = 0
    lost: int = 0
    lateness_ms: list[int] = field(default_factory=list)
    # the first deliveries of timeouts written before their due time: raydelay's lateness
    lateness_in_time_ms: list[int] = field(default_factory=list)
    # timeouts written after their due time (publish time - deliver_at, ms): the pacing's
    written_late_ms: list[int] = field(default_factory=list)
    warmup_rows_per_s: float = 0.0  # the second warm-up job's (warm) ingest rate
    lead_s: float = 0.0  # from the ingestion's start to the first timeout
    buckets_sealed: int = 0
    buckets_loaded: int = 0
    peak_rss_mb: float = 0.0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.early == 0 and self.lost == 0 and self.cancelled_delivered == 0

    def summary(self) -> dict:
        """The report as plain values (``raydelay demo --json``): the counts, and each
        lateness as its summary instead of every value."""
        lists = ("lateness_ms", "lateness_in_time_ms", "written_late_ms")
        doc = {k: v for k, v in self.__dict__.items() if k not in lists}
        doc["ok"] = self.ok
        doc["written_late"] = len(self.written_late_ms)
        doc["lateness_in_time"] = Lateness.of(self.lateness_in_time_ms).as_dict()
        doc["lateness"] = Lateness.of(self.lateness_ms).as_dict()
        return doc

    def table(self) -> str:
        late = Lateness.of(self.lateness_ms)
        rows = [
            ["order timeouts scheduled", f"{self.messages:,}"],
            [
                "ingested (Spark on Ray)",
                f"{self.ingest_rows_per_s:,.0f} rows/s ({self.ingest_s:.1f} s)",
            ],
            [
                "pacing: warm ingest measured / lead",
                f"{self.warmup_rows_per_s:,.0f} rows/s / {self.lead_s:.1f} s",
            ],
            ["delivered", f"{self.delivered:,}"],
            ["orders paid (timeouts cancelled)", f"{self.paid:,}"],
            ["cancels honoured", f"{self.cancels_honoured:,}"],
            ["cancelled but delivered", f"{self.cancelled_delivered:,}"],
            ["early (must be 0)", f"{self.early:,}"],
            ["lost", f"{self.lost:,}"],
            ["duplicates", f"{self.duplicates:,}"],
            [
                "written after their due time (the demo's pacing)",
                f"{len(self.written_late_ms):,}"
                + (f", by up to {max(self.written_late_ms):,} ms" if self.written_late_ms else ""),
            ],
            [
                "lateness of those written in time p50 / p99 / max",
                _lateness_cell(Lateness.of(self.lateness_in_time_ms)),
            ],
            ["lateness of every delivery p50 / p99 / max", _lateness_cell(late)],
            ["buckets sealed / segments loaded", f"{self.buckets_sealed} / {self.buckets_loaded}"],
            ["peak RSS of the subscription and partition hosts", f"{self.peak_rss_mb:,.0f} MB"],
            ["elapsed", f"{self.elapsed_s:.1f} s"],
        ]
        return table(["raydelay demo", ""], rows)


def _lateness_cell(late: Lateness) -> str:
    return f"{late.p50_ms or 0:.0f} / {late.p99_ms or 0:.0f} / {late.max_ms or 0:,} ms"


def run_demo(
    messages: int = 200_000,
    spread_s: float = 45.0,
    paid_share: float = 0.2,
    consumers: int = 2,
    config: Any = None,
    out: TextIO | None = None,
) -> DemoReport:
    """Run the demo (see the module docstring); prints progress and the report to ``out``."""
    if isinstance(messages, bool) or not isinstance(messages, int) or messages < 1:
        raise InvalidArgument(f"messages: expected an int >= 1, got {messages!r}")
    if not 1 <= spread_s <= 3600:
        raise InvalidArgument(f"seconds: expected 1..3600, got {spread_s!r}")
    if not 0 <= paid_share <= 1:
        raise InvalidArgument(f"paid_share: expected 0..1, got {paid_share!r}")
    if isinstance(consumers, bool) or not isinstance(consumers, int) or not 1 <= consumers <= 16:
        raise InvalidArgument(f"consumers: expected 1..16, got {consumers!r}")
    out = out or sys.stdout
    import raydelay
    from raydelay.ingest import ingest_dataframe, start_spark, stop_spark

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="raydelay-demo-"))
    topic = f"demo-orders-{int(time.time())}"
    report = DemoReport(messages=messages)
    say = _printer(out)
    cfg = _demo_config(config)
    say(
        f"starting Ray and raydelay (store: {_where(cfg)}; ledgers of "
        f"{cfg.topic.max_entries_per_ledger:,} entries, buckets from "
        f"{cfg.delayed.min_index_count_per_bucket:,} messages)"
    )
    cluster = raydelay.connect(cfg)
    run = None
    try:
        cluster.create_topic(topic, _PARTITIONS)
        subscribers = [cluster.subscribe(topic, "billing", "shared") for _ in range(consumers)]
        say("starting Spark on Ray (RayDP: 2 executors)")
        spark = start_spark("raydp", executors=2, executor_cores=1, executor_memory="768m")
        try:
            orders = _orders(messages, spread_s)
            path = work / "orders"
            _write_parquet(orders, path, files=4)
            rate = _warm_up(cluster, spark, work, min(messages, WARMUP_ROWS), say)
            report.warmup_rows_per_s = rate
            report.lead_s = lead_s = _lead_s(messages, rate)
            base = now_ms() + int(lead_s * 1000)
            orders.timeout_at = base + orders.timeout_in_ms
            run = _Run(cluster, topic, subscribers, orders, report, say)
            run.start_consumers()  # they wait for what falls due while the rest loads
            say(
                f"ingesting {messages:,} order timeouts due over {spread_s:.0f} s, from "
                f"{lead_s:.1f} s on, from {path}"
            )
            ing = ingest_dataframe(
                _timeouts(spark, path, base),
                topic,
                **_ORDER_COLUMNS,
                cluster=cluster,
                total_rows=messages,
            )
        finally:
            stop_spark(spark)
        report.ingest_rows_per_s, report.ingest_s = ing.rows_per_s, ing.elapsed_s
        run.pay(ing.accepted, paid_share)
        run.watch(deadline_s=spread_s + lead_s + 60)
        report.elapsed_s = time.monotonic() - started
    finally:
        if run is not None:
            run.halt()
        try:
            cluster.delete_topic(topic, force=True)
        except Exception as exc:  # noqa: BLE001 - cleanup: say it and go on
            log.warning("deleting the demo topic failed: %s", exc)
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    # last, once Ray has stopped: what it prints as it stops (log lines it held back to
    # count repeats) comes before the report, not after it
    print(report.table(), file=out, flush=True)
    return report


def _demo_config(config: Any) -> Any:
    """The config, with ledgers and buckets small enough that a demo of this size shows
    buckets being sealed, loaded and deleted."""
    from raydelay.client.connection import resolve_config

    cfg = resolve_config(config)
    return cfg.model_copy(
        update={
            "topic": cfg.topic.model_copy(update={"max_entries_per_ledger": 10_000}),
            "delayed": cfg.delayed.model_copy(
                update={"min_index_count_per_bucket": 10_000, "max_indexes_per_segment": 2_000}
            ),
        }
    )


def _where(cfg: Any) -> str:
    return cfg.storage.local.root if cfg.storage.kind == "local" else cfg.storage.kind


def _printer(out: TextIO):
    def say(text: str) -> None:
        print(f"[demo] {text}", file=out, flush=True)

    return say


@dataclass
class _Orders:
    order_id: list[str]
    timeout_in_ms: np.ndarray  # from the schedule's start, which the pacing sets
    region: list[str]
    timeout_at: np.ndarray | None = None  # epoch ms, once the start is known


def _orders(n: int, spread_s: float) -> _Orders:
    rng = np.random.default_rng()
    offsets = rng.integers(0, int(spread_s * 1000), n)
    regions = np.array(["eu-west", "us-east", "ap-south"])[rng.integers(0, 3, n)]
    return _Orders([f"order-{i:08d}" for i in range(n)], offsets, regions.tolist())


def _lead_s(messages: int, rows_per_s: float) -> float:
    """From the ingestion's start to the first timeout: twice the ingestion at the rate
    the warm-up measured, plus a margin of LEAD_MIN_S (so never less than that)."""
    ingest_s = messages / max(rows_per_s, 1.0)
    return 2.0 * ingest_s + LEAD_MIN_S


def _warm_up(cluster, spark, work: Path, rows: int, say) -> float:
    """Two ingestion jobs of ``rows`` order-like rows, due in an hour, on a scratch topic
    (deleted after): the first pays Spark's cold start (its Python workers attaching to
    Ray), the second measures the warm rate (rows/s), which the demo paces its schedule
    to."""
    from raydelay.ingest import ingest_dataframe

    scratch = f"demo-warmup-{int(time.time())}"
    path = work / "warmup"
    _write_parquet(_orders(rows, 3600.0), path, files=4)
    cluster.create_topic(scratch, _PARTITIONS)
    try:
        frame = _timeouts(spark, path, now_ms() + 3_600_000)
        reports = []
        for job in ("first", "second"):
            reports.append(
                ingest_dataframe(
                    frame,
                    scratch,
                    **_ORDER_COLUMNS,
                    cluster=cluster,
                    job_id=f"{scratch}-{job}",
                    progress=False,
                )
            )
    finally:
        cluster.delete_topic(scratch, force=True)
    cold, warm = reports
    say(
        f"warm-up: {rows:,} rows ingested in {cold.elapsed_s:.1f} s (Spark's first job), "
        f"then in {warm.elapsed_s:.1f} s: {warm.rows_per_s:,.0f} rows/s"
    )
    return warm.rows_per_s


def _timeouts(spark, path: Path, base_ms: int) -> Any:
    """The orders at ``path`` as a DataFrame whose ``timeout_at`` (epoch ms) is each
    order's offset from ``base_ms``."""
    from pyspark.sql import functions as F

    return spark.read.parquet(str(path)).withColumn(
        "timeout_at", F.lit(base_ms) + F.col("timeout_in_ms")
    )


def _write_parquet(orders: _Orders, path: Path, files: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    payloads = [
        json.dumps(
            {"event": "order_timeout", "order_id": oid, "action": "cancel_if_unpaid"}
        ).encode()
        for oid in orders.order_id
    ]
    table_ = pa.table(
        {
            "order_id": orders.order_id,
            "payload": pa.array(payloads, pa.binary()),
            "timeout_in_ms": pa.array(orders.timeout_in_ms, pa.int64()),
            "region": orders.region,
        }
    )
    path.mkdir(parents=True)
    step = -(-len(orders.order_id) // files)
    for i in range(files):  # several files: several input splits, one per Spark task
        part = table_.slice(i * step, step)
        if part.num_rows:
            pq.write_table(part, path / f"part-{i:05d}.parquet", row_group_size=25_000)


class _Run:
    """Consume the timeouts, pay some orders (cancel their timeouts), show it live."""

    def __init__(self, cluster, topic, consumers, orders: _Orders, report, say):
        self.cluster, self.topic, self.consumers = cluster, topic, consumers
        self.report, self.say = report, say
        if orders.timeout_at is None:
            raise ValueError("orders: their schedule has no start yet")
        self.due = {oid: int(d) for oid, d in zip(orders.order_id, orders.timeout_at, strict=True)}
        self.pay_at: list[tuple[int, str]] = []
        self.paid: set[str] = set()
        self.cancelled_ok: set[str] = set()
        self.ledger = Ledger()  # keyed by order id
        self.ledger.record_sent(list(self.due), list(self.due.values()))
        # per order delivered: its first delivery's lateness, and how late it was written
        # (publish time - due, when > 0: the demo wrote it after its due time)
        self.first_late: dict[str, int] = {}
        self.written_late: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.peak_rss = 0

    def start_consumers(self) -> None:
        for c in self.consumers:
            t = threading.Thread(target=self._consume, args=(c,), daemon=True)
            t.start()
            self.threads.append(t)

    def pay(self, accepted: int, paid_share: float) -> None:
        """Pick the orders that get paid, each at a random time at least _PAY_MARGIN_MS
        before its timeout, and start the payment service (``accepted``: the timeouts the
        ingestion wrote, all of them)."""
        if accepted != len(self.due):
            raise RuntimeError(
                f"ingestion wrote {accepted:,} timeouts for {len(self.due):,} orders"
            )
        now = time.time_ns() // 1_000_000
        rng = np.random.default_rng()
        eligible = [o for o, d in self.due.items() if d - now > 2 * _PAY_MARGIN_MS]
        k = int(round(paid_share * len(self.due)))
        chosen = rng.choice(len(eligible), size=min(k, len(eligible)), replace=False)
        self.pay_at = sorted(
            (int(rng.integers(now, self.due[eligible[i]] - _PAY_MARGIN_MS)), eligible[i])
            for i in chosen
        )
        self.report.paid = len(self.pay_at)
        t = threading.Thread(target=self._pay, daemon=True)
        t.start()
        self.threads.append(t)

    def watch(self, deadline_s: float) -> None:
        pids = self._actor_pids()
        end = time.monotonic() + deadline_s
        expected = len(self.due) - len(self.pay_at)
        # The bookkeeping (every order and its id, and a record per delivery) lives until
        # the report: kept out of the collector's full passes, which took 100-210 ms each
        # over it and held this process's consumer threads (the demo's >100 ms lateness
        # bursts). Frozen now, and each second what was added since.
        gc.freeze()
        while time.monotonic() < end:
            time.sleep(1.0)
            gc.freeze()
            self._sample_rss(pids)
            delivered = self.ledger.distinct_received()
            bins = np.bincount(
                np.searchsorted(_EDGES_MS, self.ledger.lateness_so_far()), minlength=len(_LABELS)
            )
            with self.lock:
                cancelled = len(self.cancelled_ok)
                late_written = sum(
                    1 for o, w in self.written_late.items() if self.first_late.get(o, 0) > LATE_MS
                )
            late = int(bins[np.searchsorted(_EDGES_MS, LATE_MS) + 1 :].sum())
            hist = "  ".join(f"{label} {int(n):,}" for label, n in zip(_LABELS, bins, strict=True))
            self.say(
                f"delivered {delivered:,}  pending {len(self.due) - delivered - cancelled:,}  "
                f"cancelled {cancelled:,}  late(>{LATE_MS}ms) {late:,} ({late_written:,} "
                f"written late)  | lateness {hist}"
            )
            if delivered >= expected and len(self.paid) == len(self.pay_at):
                time.sleep(1.0)  # anything cancelled that still arrives would show now
                break
        self.halt()
        self._finish()

    def halt(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        self.threads = []

    def _pay(self) -> None:
        """The payment service: cancel each paid order's timeout at its payment time, by
        its order id (the timeout's key)."""
        producer = self.cluster.create_producer(self.topic)
        i = 0
        try:
            while i < len(self.pay_at) and not self.stop.is_set():
                now = time.time_ns() // 1_000_000
                batch = []
                while i < len(self.pay_at) and self.pay_at[i][0] <= now:
                    batch.append(self.pay_at[i][1])
                    i += 1
                if batch:
                    results = producer.cancel_keys(batch)
                    self.ledger.record_cancels(batch, results)
                    with self.lock:
                        self.paid.update(batch)
                        self.cancelled_ok.update(
                            o for o, ok in zip(batch, results, strict=True) if ok
                        )
                else:
                    time.sleep(0.05)
        finally:
            producer.close()

    def _consume(self, consumer) -> None:
        while not self.stop.is_set():
            msgs = consumer.receive(max_messages=2_000, timeout_s=0.2)
            if not msgs:
                continue
            at = now_ms()
            order_ids = [m.key for m in msgs]
            self.ledger.record_received(order_ids, at, [m.redelivery_count for m in msgs])
            with self.lock:
                for m in msgs:
                    if m.key not in self.first_late:
                        self.first_late[m.key] = at - m.deliver_at_ms
                        if m.publish_time_ms > m.deliver_at_ms:
                            self.written_late[m.key] = m.publish_time_ms - m.deliver_at_ms
            consumer.ack(msgs)

    def _actor_pids(self) -> list[int]:
        import ray

        from raydelay.cluster import placement

        # the subscription hosts (one serves billing's partitions) and the partitions' hosts
        names = [*placement.live_hosts("SubscriptionHost"), *placement.live_hosts()]
        handles = [placement.lookup(h) for h in names]
        return sorted(set(ray.get([h.pid.remote() for h in handles])))

    def _sample_rss(self, pids: list[int]) -> None:
        import psutil

        total = 0
        for pid in pids:
            try:
                total += psutil.Process(pid).memory_info().rss
            except psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, total)

    def _finish(self) -> None:
        r = self.report
        stats = self.cluster.stats(self.topic, "billing")
        r.buckets_sealed = sum(p["tracker"].get("sealed", 0) for p in stats["partitions"])
        r.buckets_loaded = sum(p["tracker"].get("loaded", 0) for p in stats["partitions"])
        r.peak_rss_mb = self.peak_rss / 1e6
        # a paid order whose cancel came too late must be delivered: missing, it is lost
        result = self.ledger.result()
        r.delivered = result.distinct
        r.duplicates = result.duplicates
        r.early = len(result.early)
        r.cancelled_delivered = len(result.cancelled_delivered)
        r.cancels_honoured = len(self.cancelled_ok) - r.cancelled_delivered
        r.lost = len(result.lost)
        r.lateness_ms = result.lateness_ms.tolist()
        with self.lock:
            r.written_late_ms = sorted(self.written_late.values())
            r.lateness_in_time_ms = [
                late for o, late in self.first_late.items() if o not in self.written_late
            ]
