"""The heapq peer: an in-process heap of (deliver_at_ms, sequence, payload) tuples, the floor
for Python with no durability. Each scenario runs in a fresh spawned interpreter, so its
RSS is the heap's alone and is returned to the OS afterwards.

The consumer is the dispatcher: ``receive()`` pops up to 1,000 due tuples under a lock, or
sleeps until the next due time (at most 10 ms) when none is due.
"""

from __future__ import annotations

import gc
import heapq
import multiprocessing
import threading
import time

import numpy as np
import psutil

from bench.workload import (
    now_ms,
    produce,
    progress,
    run_burst,
    run_lateness,
    spread_now,
)

POP_BATCH = 1_000
BATCH = 5_000


class Heap:
    def __init__(self) -> None:
        self.heap: list[tuple[int, int, bytes]] = []
        self.lock = threading.Lock()

    def send(self, items: list[bytes], ats: np.ndarray) -> None:
        with self.lock:
            push = heapq.heappush
            for at, item in zip(ats.tolist(), items, strict=True):
                push(self.heap, (at, int.from_bytes(item[:8], "little"), item))

    def receive(self) -> list[bytes]:
        out: list[bytes] = []
        with self.lock:
            now = now_ms()
            heap = self.heap
            while heap and heap[0][0] <= now and len(out) < POP_BATCH:
                out.append(heapq.heappop(heap)[2])
            nxt = heap[0][0] if heap else None
        if not out:
            time.sleep(0.01 if nxt is None else min(max(nxt - now, 0), 10) / 1000)
        return out


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def ingest(n: int) -> dict:
    h = Heap()
    seconds = produce(h.send, n, spread_now, threads=1, batch=BATCH, label="heapq ingest")
    return {"seconds": seconds, "acked_rate": n / seconds}


def memory(points: list[int]) -> list[dict]:
    h = Heap()
    base = _rss()
    rows, sent = [], 0
    for p in points:
        avail = psutil.virtual_memory().available
        if rows and (p - sent) * rows[-1]["per_msg_growth"] > avail * 0.7:
            progress(f"heapq: {p:,} would not fit in {avail / 2**30:.1f} GiB available; skipped")
            rows.append({"sent": p, "skipped": True})
            break
        produce(h.send, p - sent, spread_now, threads=1, batch=BATCH, label=f"heapq memory {p:,}")
        sent = p
        with h.lock:
            pending = len(h.heap)
        rss = _rss()
        rows.append(
            {
                "sent": p,
                "pending": pending,
                "memory_bytes": rss,
                "rss": rss,
                "disk_bytes": 0,
                "baseline_bytes": base,
                "per_msg_growth": (rss - base) / pending,
            }
        )
    return rows


def burst(n: int, due_ms: int) -> dict:
    h = Heap()
    me = psutil.Process()
    return run_burst(h.send, h.receive, n, due_ms, threads=1, batch=BATCH,
                     cpu=lambda: {"python (heap + consumer)": sum(me.cpu_times()[:2])})  # fmt: skip


def lateness(rate: int, seconds: int, start_ms: int) -> dict:
    h = Heap()
    return run_lateness(h.send, h.receive, rate, seconds, start_ms, threads=1, batch=BATCH)


def _in_child(fn, *args):
    """Run one scenario of this module in a fresh interpreter and return its result."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


class HeapqPeer:
    """The scenarios above behind the interface of the other peers; the heap takes one
    producer thread (it holds a lock) and keeps nothing, so there is no recovery."""

    def ingest(self, n: int, threads: int) -> dict:
        return _in_child(ingest, n)

    def memory(self, points: list[int], kill_at: set[int], threads: int) -> list[dict]:
        return _in_child(memory, points)

    def burst(self, n: int, due_ms: int, threads: int) -> dict:
        return _in_child(burst, n, due_ms)

    def lateness(self, rate: int, seconds: int, start_ms: int, threads: int) -> dict:
        return _in_child(lateness, rate, seconds, start_ms)

    def close(self) -> None:
        pass
