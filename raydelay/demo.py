"""The demo job: order timeouts through the delayed index, in real time, on the embedded store.

It generates orders whose 'cancel if unpaid' timeout falls over the next few seconds,
loads them into a BucketDelayedDeliveryTracker on the local-dir store (batches in log
order, as a subscription would), cancels the timeouts of the orders that get paid,
restarts the tracker half-way (a new instance recovers from the store and the log is
replayed from the start, as after a crash), and delivers everything as it falls due.
It reports delivered, cancels honoured, early deliveries (must be 0), lateness and
the bucket work done. Until the Ray data path lands this is the most complete
real path through raydelay.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from raydelay.clock import SystemClock
from raydelay.config import Config
from raydelay.delayed import BucketDelayedDeliveryTracker, InMemoryBucketRegistry
from raydelay.errors import InvalidArgument
from raydelay.storage import LocalDirObjectStore

log = logging.getLogger(__name__)

BATCH = 10_000


@dataclass
class DemoReport:
    messages: int
    cancelled: int
    delivered: int = 0
    duplicates: int = 0
    early: int = 0
    cancels_honoured: int = 0
    cancelled_delivered: int = 0
    lost: int = 0
    lateness_ms: list[int] = field(default_factory=list)
    recovered_pending: int = 0
    recovery_s: float = 0.0
    stats: dict = field(default_factory=dict)
    sealed_before: int = 0
    merged_before: int = 0
    elapsed_s: float = 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.lateness_ms, q)) if self.lateness_ms else 0.0

    @property
    def ok(self) -> bool:
        return self.early == 0 and self.lost == 0 and self.cancelled_delivered == 0


def run_demo(
    *,
    messages: int = 200_000,
    spread_s: float = 20.0,
    paid_share: float = 0.2,
    config: Config | None = None,
    out: TextIO = sys.stdout,
    seed: int = 17,
) -> DemoReport:
    if messages < 1:
        raise InvalidArgument(f"messages: must be >= 1, got {messages}")
    if spread_s <= 0:
        raise InvalidArgument(f"spread_s: must be > 0, got {spread_s}")
    if not 0 <= paid_share < 1:
        raise InvalidArgument(f"paid_share: must be in [0, 1), got {paid_share}")
    cfg = config or Config()
    dcfg = cfg.delayed
    root = Path(cfg.storage.local.root) / "demo"
    shutil.rmtree(root, ignore_errors=True)
    store = LocalDirObjectStore(root)
    registry = (
        InMemoryBucketRegistry()
    )  # the coordinator-backed registry arrives with the Ray data path
    clock = SystemClock()
    rng = np.random.default_rng(seed)

    def tracker() -> BucketDelayedDeliveryTracker:
        return BucketDelayedDeliveryTracker(
            store=store,
            registry=registry,
            name="subs/orders/0/timeouts",
            clock=clock,
            tick_time_ms=dcfg.tick_time_ms,
            strict=dcfg.strict,
            min_index_count_per_bucket=min(
                dcfg.min_index_count_per_bucket, max(1_000, messages // 20)
            ),
            max_num_buckets=min(dcfg.max_num_buckets, 8),
            max_time_step_per_segment_ms=dcfg.max_time_step_per_segment_ms,
            max_indexes_per_segment=dcfg.max_indexes_per_segment,
        )

    # The "log": order i is entry i % ledger_size of ledger i // ledger_size + 1. Ledgers
    # roll over often enough that buckets seal, load, merge and recover during the run.
    ledger_size = min(cfg.topic.max_entries_per_ledger, max(500, messages // 40))
    idx = np.arange(messages, dtype=np.int64)
    ledgers, entries = idx // ledger_size + 1, idx % ledger_size
    start_ms = clock.now_ms() + 1_500
    deliver_at = start_ms + rng.integers(0, int(spread_s * 1000), messages)
    paid = rng.random(messages) < paid_share
    report = DemoReport(messages=messages, cancelled=int(paid.sum()))
    out.write(
        f"raydelay demo: {messages:,} order timeouts due over {spread_s:.0f} s, "
        f"{report.cancelled:,} orders paid (their timeouts cancelled); store {root}\n"
    )

    t = tracker()
    run_began = began = time.perf_counter()
    for s in range(0, messages, BATCH):
        t.add_messages(ledgers[s : s + BATCH], entries[s : s + BATCH], deliver_at[s : s + BATCH])
    for i in np.flatnonzero(paid).tolist():
        t.remove_message(int(ledgers[i]), int(entries[i]))
    out.write(
        f"loaded {messages:,} in {time.perf_counter() - began:.2f} s; "
        f"{t.immutable_bucket_count()} buckets sealed, {t.number_of_delayed_messages():,} pending\n"
    )

    delivered = np.zeros(messages, dtype=np.int8)
    restart_at = start_ms + int(spread_s * 500)
    restarted = False
    end_ms = int(deliver_at.max())
    last_print = 0.0
    hist_edges = [0, 5, 10, 20, 50, 100, 10**9]
    while True:
        now = clock.now_ms()
        if not restarted and now >= restart_at:
            restarted = True
            report.sealed_before = t.stats()["sealed"]
            report.merged_before = t.stats()["merged"]
            t.close()
            began = time.perf_counter()
            t = tracker()
            # replay the log from the start: the acknowledged and cancelled ones are skipped,
            # as a subscription's cursor would; bitmaps recognise what buckets already hold
            replay = (delivered == 0) & ~paid
            got = np.ones(int(replay.sum()), dtype=bool)
            r_idx = np.flatnonzero(replay)
            for s in range(0, len(r_idx), BATCH):
                sl = r_idx[s : s + BATCH]
                got[s : s + BATCH] = t.add_messages(ledgers[sl], entries[sl], deliver_at[sl])
            for i in r_idx[~got].tolist():  # due by now: delivered straight away
                _deliver(i, clock.now_ms(), deliver_at, paid, delivered, report)
            report.recovery_s = time.perf_counter() - began
            report.recovered_pending = t.number_of_delayed_messages()
            out.write(
                f"restarted: a new tracker recovered from the store in {report.recovery_s:.2f} s "
                f"({report.recovered_pending:,} pending)\n"
            )
        got = t.get_scheduled_messages(100_000)
        pop_ms = clock.now_ms()
        for ledger, entry in got:
            _deliver(
                (ledger - 1) * ledger_size + entry, pop_ms, deliver_at, paid, delivered, report
            )
        if time.perf_counter() - last_print >= 1.0:
            last_print = time.perf_counter()
            late = np.array(report.lateness_ms[-50_000:]) if report.lateness_ms else np.array([0])
            hist = np.histogram(late, bins=hist_edges)[0]
            out.write(
                f"  delivered {report.delivered:>8,}  pending {t.number_of_delayed_messages():>8,}  "
                f"early {report.early}  late p99 {np.percentile(late, 99):5.1f} ms  "
                f"[<5:{hist[0]} <10:{hist[1]} <20:{hist[2]} <50:{hist[3]} <100:{hist[4]} more:{hist[5]}]\n"
            )
            out.flush()
        if now > end_ms + 500 and t.number_of_delayed_messages() == 0:
            break
        if not got:
            nxt = t.next_delivery_time()
            wait_ms = 5 if nxt is None else max(0, min(5, nxt - clock.now_ms()))
            time.sleep(wait_ms / 1000)
    report.stats = t.stats()
    t.close()
    report.lost = int(((delivered == 0) & ~paid).sum())
    report.cancels_honoured = int(((delivered == 0) & paid).sum())
    report.elapsed_s = time.perf_counter() - run_began
    _print_report(report, out)
    return report


def _deliver(i: int, now_ms: int, deliver_at, paid, delivered, report: DemoReport) -> None:
    if delivered[i]:
        # Acknowledged before the restart and resurrected from a partly consumed segment:
        # a subscription's cursor drops it as acked. Counted, never delivered twice.
        report.duplicates += 1
        return
    delivered[i] = 1
    if paid[i]:
        report.cancelled_delivered += 1
        return
    report.delivered += 1
    lateness = now_ms - int(deliver_at[i])
    if lateness < 0:
        report.early += 1
    report.lateness_ms.append(lateness)


def _print_report(r: DemoReport, out: TextIO) -> None:
    s = r.stats
    rows = [
        ("messages", f"{r.messages:,}"),
        ("delivered", f"{r.delivered:,}"),
        ("cancels honoured", f"{r.cancels_honoured:,} of {r.cancelled:,}"),
        ("cancelled but delivered", f"{r.cancelled_delivered}"),
        ("lost", f"{r.lost}"),
        ("early (must be 0)", f"{r.early}"),
        (
            "re-surfaced after the restart",
            f"{r.duplicates:,} (already acked: dropped, as a cursor would)",
        ),
        (
            "lateness p50 / p99 / max",
            f"{r.percentile(50):.0f} / {r.percentile(99):.0f} / {max(r.lateness_ms, default=0)} ms",
        ),
        ("recovery", f"{r.recovery_s:.2f} s, {r.recovered_pending:,} pending"),
        (
            "buckets sealed / merged / deleted",
            f"{r.sealed_before} + {s.get('sealed', 0)} / {r.merged_before} + {s.get('merged', 0)} / {s.get('deleted', 0)} (before + after the restart)",
        ),
        ("elapsed", f"{r.elapsed_s:.1f} s"),
        ("segments loaded", f"{s.get('loaded', 0)}"),
        ("result", "OK" if r.ok else "FAILED"),
    ]
    width = max(len(k) for k, _ in rows)
    out.write("\n" + "-" * (width + 30) + "\n")
    for k, v in rows:
        out.write(f"{k:<{width}}  {v}\n")
    out.write("-" * (width + 30) + "\n")
