"""Where a lone ``send()`` stands against its floors, in one process and one run.

Prints p50 / p99 (ms) of:

- the durable-write floor: one small object written as the local-dir store writes each
  commit (temp file, fsync, link, fsync the directory), on the same disk;
- a bare call to a plain Ray actor, sync and async (the host is an async actor);
- a bare call to the partition's host that answers from its log thread (``last_sequence``);
- a Ray actor that does nothing but the durable write of each call (the store's put_new,
  as the floor row): async, the write on a thread of its own, as a host commits; and sync,
  the write inline. What any actor that answers once the write is durable costs;
- ``Producer.send`` of one 100-byte message due in an hour, in a loop;

and each p50 over the floor's (#48's bar for send: <= 3x). A local Ray as the benchmarks start
it, a local-dir store in a temp dir, a topic of 2 partitions.

    python bench/send_floor.py [--n 600]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import ray  # noqa: E402

import raydelay  # noqa: E402
from bench.common import start_local_ray  # noqa: E402
from bench.peer_raydelay import durable_write_floor  # noqa: E402


@ray.remote
class _Sync:
    def call(self, data: bytes) -> int:
        return len(data)


@ray.remote
class _Async:
    async def call(self, data: bytes) -> int:
        return len(data)


class _Writes:
    def __init__(self, root: str) -> None:
        from raydelay.storage import LocalDirObjectStore

        self._store = LocalDirObjectStore(root)
        self._n = 0

    def _write(self, data: bytes) -> int:
        self._n += 1
        self._store.put_new(f"w/{self._n:08d}", data)
        return self._n


@ray.remote
class _SyncWriter(_Writes):
    def write(self, data: bytes) -> int:
        return self._write(data)


@ray.remote
class _AsyncWriter(_Writes):
    def __init__(self, root: str) -> None:
        super().__init__(root)
        self._thread = ThreadPoolExecutor(1)

    async def write(self, data: bytes) -> int:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._write, data)


def _times(fn, n: int) -> tuple[float, float]:
    for _ in range(20):  # (warm)
        fn()
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000)
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=600, help="calls per row (default 600)")
    n = ap.parse_args().n
    if n < 20:
        raise SystemExit("--n: at least 20")
    root = Path(tempfile.mkdtemp(prefix="raydelay-send-floor-"))
    start_local_ray()
    cluster = raydelay.connect(
        {"storage": {"kind": "local", "local": {"root": str(root / "data")}}}
    )
    try:
        cluster.create_topic("send", partitions=2)
        producer = cluster.create_producer("send")
        at = int(time.time() * 1000) + 3_600_000
        payload = b"x" * 100
        plain_sync, plain_async = _Sync.remote(), _Async.remote()
        sync_writer = _SyncWriter.remote(str(root / "sync-writer"))
        async_writer = _AsyncWriter.remote(str(root / "async-writer"))
        obj = b"x" * 300  # (about one message's ledger object, as the floor's)
        rows = [
            ("durable-write floor (write, fsync, link, fsync dir)", None),
            ("plain Ray actor call, sync", lambda: ray.get(plain_sync.call.remote(payload))),
            ("plain Ray actor call, async", lambda: ray.get(plain_async.call.remote(payload))),
            ("host call on its log thread (last_sequence)",
             lambda: ray.get(producer.link.last_sequence(0, "nobody"))),
            ("async Ray actor: the durable write, on its thread",
             lambda: ray.get(async_writer.write.remote(obj))),
            ("sync Ray actor: the durable write, inline",
             lambda: ray.get(sync_writer.write.remote(obj))),
            ("Producer.send, one message", lambda: producer.send(payload, deliver_at=at)),
        ]  # fmt: skip
        out = []
        for label, fn in rows:
            if fn is None:
                floor = durable_write_floor(root / "floor", n)
                out.append((label, floor, None))
            else:
                out.append((label, *_times(fn, n)))
        width = max(len(label) for label, _, _ in out)
        print(f"{'figure':<{width}}  p50 ms  p99 ms  p50 / floor")
        for label, p50, p99 in out:
            p99s = "" if p99 is None else f"{p99:6.2f}"
            print(f"{label:<{width}}  {p50:6.2f}  {p99s:>6}  {p50 / floor:5.1f}x")
        print(f"({n} calls per row; the floor is p50 of {max(n, 100)} writes)")
        producer.close()
    finally:
        cluster.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
