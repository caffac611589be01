"""The work every peer of ``bench/compare.py`` is given, and the one way it is measured.

A message is 100 bytes: a little-endian (sequence, deliver_at_ms) header and 84 random
bytes. Every peer carries the same bytes, and every consumer reads lateness from the
header, so no peer's own bookkeeping is trusted for timing. ``Drain`` is the single
consumption loop: a peer hands it a ``receive()`` that returns delivered (and acked)
payloads, and it records when each batch arrived.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from raydelay.accounting import Lateness
from raydelay.clock import now_ms
from raydelay.dispatch import stages

PAYLOAD_BYTES = 100
HEADER = np.dtype([("seq", "<i8"), ("at", "<i8"), ("pad", "V84")])
assert HEADER.itemsize == PAYLOAD_BYTES
HOUR_MS = 3_600_000


def payloads(seq0: int, deliver_at_ms: np.ndarray) -> list[bytes]:
    """Distinct 100-byte payloads for sequences seq0.. with their due times in the header."""
    n = len(deliver_at_ms)
    rec = np.empty(n, dtype=HEADER)
    rec["seq"] = np.arange(seq0, seq0 + n)
    rec["at"] = deliver_at_ms
    rec["pad"] = np.frombuffer(os.urandom(84 * n), dtype="V84")
    buf = rec.tobytes()
    return [buf[i : i + PAYLOAD_BYTES] for i in range(0, len(buf), PAYLOAD_BYTES)]


def header_at(items) -> np.ndarray:
    """deliver_at_ms of each payload, from its header. ``items``: a list of bytes, or an
    Arrow binary (chunked) array, whose 100-byte payloads are read in place."""
    chunks = getattr(items, "chunks", None)
    if chunks is None and hasattr(items, "buffers"):
        chunks = [items]
    if chunks is None:
        return np.frombuffer(b"".join(p[8:16] for p in items), dtype="<i8")
    out = []
    for c in chunks:
        if len(c) == 0:
            continue
        offsets = np.frombuffer(c.buffers()[1], dtype="<i4", count=len(c) + 1, offset=4 * c.offset)
        if not (np.diff(offsets) == PAYLOAD_BYTES).all():
            out.append(header_at(c.to_pylist()))
            continue
        data = np.frombuffer(c.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
        out.append(data.view(HEADER)["at"].astype(np.int64))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def spread_schedule(rng: np.random.Generator, n: int, base_ms: int) -> np.ndarray:
    """Due times uniform over the hour after ``base_ms`` (at least 1 s ahead)."""
    return base_ms + rng.integers(1_000, HOUR_MS, n)


def spread_now(first: int, count: int) -> np.ndarray:
    """A ``produce`` schedule: each batch due uniformly over the hour after it is made."""
    return spread_schedule(np.random.default_rng(), count, now_ms())


def batches(n: int, size: int):
    """(first index, count) of each batch of ``size`` covering range(n)."""
    for lo in range(0, n, size):
        yield lo, min(size, n - lo)


@dataclass
class Drain:
    """Runs ``receive`` in a thread and records each batch: (wall ms, count) and the
    lateness (receive time - deliver_at, ms) of every message. ``receive()`` waits a
    little for messages and returns the payloads it delivered, already acknowledged; it
    may raise while its peer is restarting, which counts as an empty poll."""

    receive: Callable[[], list[bytes]]
    times_ms: list[int] = field(default_factory=list)
    starts_ms: list[int] = field(default_factory=list)  # when each batch's receive was called
    counts: list[int] = field(default_factory=list)
    lates: list[np.ndarray] = field(default_factory=list)
    errors: int = 0
    received: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Drain:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = now_ms()
            try:
                items = self.receive()
            except Exception:  # the peer is down or restarting; keep polling
                self.errors += 1
                time.sleep(0.002)
                continue
            if not items:
                continue
            t = now_ms()
            self.starts_ms.append(asked)
            self.times_ms.append(t)
            self.counts.append(len(items))
            self.lates.append(t - header_at(items))
            self.received += len(items)

    def wait_for(self, total: int, timeout_s: float) -> bool:
        """True once ``total`` messages arrived; False after ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while self.received < total:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def lateness(self) -> np.ndarray:
        return np.concatenate(self.lates) if self.lates else np.zeros(0, dtype=np.int64)

    def first_after(self, t_ms: int) -> int | None:
        """Wall ms of the first batch whose receive was called after ``t_ms``: a call made
        before (a reply on its way, or one a client had buffered) does not count."""
        for asked, t in zip(list(self.starts_ms), list(self.times_ms), strict=False):
            if asked > t_ms:
                return t
        return None

    def curve(self, t0_ms: int) -> list[tuple[float, int]]:
        """(seconds since t0_ms, messages received so far) after each batch."""
        total, out = 0, []
        for t, c in zip(list(self.times_ms), list(self.counts), strict=False):
            total += c
            out.append(((t - t0_ms) / 1000, total))
        return out


def lateness_summary(lates: np.ndarray) -> dict:
    """p50, p99, max, early and n of lateness values (ms): raydelay.accounting's."""
    return Lateness.of(lates).as_dict()


def dir_bytes(path: str | os.PathLike) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass  # a file removed while we walk (a ledger being retired)
    return total


def sleep_until(t_ms: int) -> None:
    while (left := t_ms - now_ms()) > 0:
        time.sleep(min(left / 1000, 0.5))


def progress(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def produce(
    send: Callable[[list[bytes], np.ndarray], None],
    n: int,
    schedule: Callable[[int, int], np.ndarray],
    *,
    threads: int,
    batch: int,
    seq0: int = 0,
    label: str = "",
) -> float:
    """Send messages seq0 .. seq0+n-1 in batches of ``batch`` from ``threads`` threads;
    ``schedule(first, count)`` gives each batch's deliver_at_ms (called as the batch is
    made). Returns the seconds from the first send until the last ``send`` returned."""
    todo = iter(list(batches(n, batch)))
    lock = threading.Lock()
    done = [0]
    failures: list[BaseException] = []
    step = max(n // 10, batch)

    def work() -> None:
        while not failures:
            with lock:
                job = next(todo, None)
            if job is None:
                return
            lo, cnt = job
            try:
                ats = schedule(seq0 + lo, cnt)
                send(payloads(seq0 + lo, ats), ats)
            except BaseException as e:  # surfaced below, after the other threads stop
                failures.append(e)
                return
            with lock:
                before = done[0]
                done[0] += cnt
                if label and before // step != done[0] // step:
                    progress(f"{label}: sent {done[0]:,}/{n:,}")

    t0 = time.perf_counter()
    workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - t0


def run_burst(
    send, receive, n: int, due_ms: int, *, threads: int, batch: int, cpu, label: str = ""
) -> dict:
    """The burst scenario for any peer: load ``n`` messages all due at ``due_ms``, then
    consume from that instant until the last arrives. ``cpu()`` returns CPU seconds so far
    per process role; the result holds what each role spent during the drain."""
    load_s = produce(send, n, lambda lo, c: np.full(c, due_ms), threads=threads, batch=batch,
                     label=label)  # fmt: skip
    late_load = now_ms() > due_ms
    drain = Drain(receive).start()
    sleep_until(due_ms)
    cpu0 = cpu()
    drain.wait_for(n, timeout_s=600)
    cpu1 = cpu()
    drain.stop()
    return {
        "load_s": load_s,
        "late_load": late_load,
        "delivered": drain.received,
        "drain_s": (drain.times_ms[-1] - due_ms) / 1000 if drain.times_ms else None,
        "curve": drain.curve(due_ms),
        "early": Lateness.of(drain.lateness()).early,
        "cpu": {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()},
    }


def run_lateness(
    send, receive, rate: int, seconds: int, start_ms: int, *, threads: int, batch: int,
    label: str = "",
) -> dict:  # fmt: skip
    """The lateness scenario for any peer: ``rate`` messages a second falling due for
    ``seconds`` from ``start_ms`` (loaded ahead), consumed as they come due."""
    n = rate * seconds
    produce(send, n, lambda lo, c: start_ms + np.arange(lo, lo + c) * 1000 // rate,
            threads=threads, batch=batch, label=label)  # fmt: skip
    late_load = now_ms() > start_ms
    drain = Drain(receive).start()
    drain.wait_for(n, timeout_s=(start_ms - now_ms()) / 1000 + seconds + 120)
    drain.stop()
    lates = drain.lateness()
    return lateness_summary(lates) | {"lates": lates, "late_load": late_load}


def _percentiles_ms(values_s: list[float]) -> dict:
    a = np.asarray(values_s, dtype=np.float64) * 1000
    return {
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
    }


def run_send(
    send_one: Callable[[bytes], object],
    send_async: Callable[[bytes], object] | None,
    flush: Callable[[], None],
    *,
    loop_n: int,
    threads: int,
    threads_n: int,
    async_n: int,
    label: str = "",
) -> dict:
    """What a user's first loop does, for any peer: ``send_one(payload)`` returns once the
    message is accepted (raydelay: durable); ``send_async(payload)`` queues one and
    ``flush()`` waits for every queued one. Payloads are 100 B, due an hour ahead.

    - ``loop``: ``loop_n`` sends one after another from one thread: latency p50 / p99 / max
      (ms) and messages/s;
    - ``threads``: ``threads_n`` sends from ``threads`` threads sharing the peer: msg/s;
    - ``async``: ``async_n`` send_async calls from one thread, then flush: msg/s until
      all are accepted, and the calls' own rate (None when the peer has no
      ``send_async``)."""
    at = np.full(max(loop_n, threads_n, async_n), now_ms() + HOUR_MS, dtype=np.int64)
    items = payloads(0, at)
    lat: list[float] = []
    t0 = time.perf_counter()
    for i in range(loop_n):
        t = time.perf_counter()
        send_one(items[i])
        lat.append(time.perf_counter() - t)
    loop_s = time.perf_counter() - t0
    if label:
        progress(f"{label}: send() loop {loop_n / loop_s:,.0f} msg/s")
    per = threads_n // threads

    def worker(k: int) -> None:
        for i in range(k * per, (k + 1) * per):
            send_one(items[i])

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    threads_s = time.perf_counter() - t0
    out = {
        "loop": _percentiles_ms(lat) | {"rate": loop_n / loop_s, "n": loop_n},
        "threads": {"rate": per * threads / threads_s, "threads": threads},
        "async": None,
    }
    if send_async is None:
        return out
    t0 = time.perf_counter()
    for i in range(async_n):
        send_async(items[i])
    calls_s = time.perf_counter() - t0
    flush()
    async_s = time.perf_counter() - t0
    if label:
        progress(f"{label}: send_async {async_n / async_s:,.0f} msg/s")
    out["async"] = {"rate": async_n / async_s, "calls_rate": async_n / calls_s, "n": async_n}
    return out


def stages_line(by_stage: dict) -> str:
    """Lateness by stage (raydelay.dispatch.stages) in one line: each stage's p50 / p99
    bucket edges, mean and share."""
    parts = []
    for r in stages.summary(by_stage):
        p50, p99 = (stages.edge_label(r[k]) for k in ("p50_ms", "p99_ms"))
        mean = "-" if r["mean_ms"] is None else f"{r['mean_ms']:.1f}"
        share = "-" if r["share"] is None else f"{100 * r['share']:.0f}%"
        parts.append(f"{r['stage']} {p50} / {p99} / {mean} ms ({share})")
    return "; ".join(parts)


def run_steady(
    send: Callable[[list[bytes], np.ndarray], None],
    receive: Callable[[], list],
    rate: int,
    seconds: float,
    *,
    delay_ms: int = 2_000,
    tick_ms: int = 10,
    label: str = "",
) -> dict:
    """A steady stream, for any peer: one producer thread sends ``rate * tick_ms / 1000``
    messages every ``tick_ms`` (one ``send`` call, as a service would), each due
    ``delay_ms`` after it was sent, for ``seconds``; one consumer thread receives and acks
    (:class:`Drain`). A producer that falls behind sends the next batch at once; what it
    managed is ``sent_rate``. Lateness: receive time - deliver_at (ms), p50 / p99 / p99.9 /
    max, and how many arrived early."""
    per = max(1, rate * tick_ms // 1000)
    drain = Drain(receive).start()
    sent = 0
    t0 = time.monotonic()
    k = 0
    while (elapsed := time.monotonic() - t0) < seconds:
        wait = t0 + k * tick_ms / 1000 - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        ats = np.full(per, now_ms() + delay_ms, dtype=np.int64)
        send(payloads(sent, ats), ats)
        sent += per
        k += 1
    elapsed = time.monotonic() - t0
    complete = drain.wait_for(sent, timeout_s=delay_ms / 1000 + 30)
    drain.stop()
    lates = drain.lateness()
    out = lateness_summary(lates) | {
        "p999": float(np.percentile(lates, 99.9)) if len(lates) else None,
        "rate": rate,
        "sent": sent,
        "sent_rate": sent / elapsed,
        "delivered": drain.received,
        "complete": complete,
    }
    if label:
        progress(
            f"{label} {rate:,}/s: sent {out['sent_rate']:,.0f}/s, lateness p50 {out['p50']} "
            f"p99 {out['p99']} max {out['max']} ms, early {out['early']}"
        )
    return out
