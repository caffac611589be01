"""The Redis peer: the sorted-set delay queue of Sidekiq, Bull and many hand-rolled queues.

- ``redis-server`` from Debian (installed with apt-get when missing and we are root),
  started per scenario on 127.0.0.1 with a temp dir, AOF on and ``appendfsync everysec``,
  no RDB snapshots, and automatic AOF rewrites off (a rewrite forks the server, which could
  double its memory in the middle of a 50M load; turning it off only helps Redis).
- Producers ``ZADD delayed <deliver_at_ms> <payload>`` with 1,000 members per command and
  5 commands per pipeline round trip, from several threads.
- A mover process runs the usual "pop due" Lua script: move up to 1,000 members with
  score <= now from the sorted set to the ``ready`` list, and return the next due score;
  it loops at once while it moves full batches, else sleeps until the next due time
  (at most 10 ms).
- Consumers ``BLMPOP ready LEFT COUNT 1000``: a popped message counts as delivered and
  acknowledged (at-most-once; Redis has no redelivery in this pattern).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.workload import (
    Drain,
    dir_bytes,
    now_ms,
    produce,
    progress,
    run_burst,
    run_lateness,
    run_send,
    run_steady,
    spread_now,
)

MOVE_BATCH = 1_000
POP_BATCH = 1_000
ZADD_PER_COMMAND = 1_000
COMMANDS_PER_PIPELINE = 5
BATCH = 5_000  # messages per producer round trip, as raydelay's send_many

# KEYS[1] the delayed sorted set, KEYS[2] the ready list; ARGV[1] now (ms), ARGV[2] batch.
POP_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #due - 1)
  redis.call('RPUSH', KEYS[2], unpack(due))
end
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {#due, nxt[2] or false}
"""


def redis_binary() -> str:
    """The redis-server binary; installs Debian's package when it is missing (as root)."""
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )
    if found:
        return found
    if os.geteuid() != 0:
        raise SystemExit("redis-server is missing and we are not root: apt-get install it first")
    progress("redis-server not found: installing Debian's redis-server")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", "redis-server"]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, check=True, capture_output=True)
        subprocess.run(install, env=env, check=True, capture_output=True)
    return shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    return next((w[2:] for w in out.split() if w.startswith("v=")), out.strip())


def connect(port: int) -> redis.Redis:
    """A client that raises at once when the server is down (redis-py's default retries
    with a backoff of up to seconds would be counted against Redis's recovery time); the
    loops here retry every 2 ms themselves."""
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=30, retry=Retry(NoBackoff(), 0))


class RedisServer:
    """One redis-server process over its own temp dir; ``kill()`` + ``start()`` restarts it
    over the same AOF, as a supervisor with no restart delay would."""

    def __init__(self, binary: str, root: str, fsync: str = "everysec") -> None:
        self.binary = binary
        self.fsync = fsync  # appendfsync: "everysec" (the usual) or "always" (durable per write)
        self.dir = Path(tempfile.mkdtemp(prefix="redis-", dir=root))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        args = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--appendfsync", self.fsync,
            "--save", "",
            "--auto-aof-rewrite-percentage", "0",
            "--daemonize", "no",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        deadline = time.monotonic() + 600
        while True:
            try:
                if client.ping():
                    return
            except (redis.ConnectionError, redis.BusyLoadingError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = (self.dir / "redis.log").read_text()[-2000:]
                    raise RuntimeError(f"redis-server did not start:\n{log}") from None
                time.sleep(0.01)

    def client(self) -> redis.Redis:
        return connect(self.port)

    def kill(self) -> None:
        """SIGKILL, like a crashed node."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def rss(self) -> int:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).memory_info().rss

    def cpu_s(self) -> float:
        assert self.proc is not None
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def disk_bytes(self) -> int:
        return dir_bytes(self.dir / "appendonlydir")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def mover_main(port: int, stop, moved, max_wait_ms: int = 10) -> None:
    """The pop-due loop (its own process): runs until ``stop`` is set; counts into ``moved``.
    With nothing due it sleeps until the next due time, at most ``max_wait_ms``."""
    client = connect(port)
    script = client.register_script(POP_DUE)
    while not stop.is_set():
        try:
            count, next_at = script(keys=["delayed", "ready"], args=[now_ms(), MOVE_BATCH])
        except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
            time.sleep(0.002)  # the server is restarting
            continue
        except redis.exceptions.NoScriptError:
            continue  # a restarted server lost the script cache; the next call loads it again
        with moved.get_lock():
            moved.value += count
        if count >= MOVE_BATCH:
            continue
        wait_ms = (
            max_wait_ms if not next_at else min(max(int(float(next_at)) - now_ms(), 0), max_wait_ms)
        )
        if wait_ms:
            time.sleep(wait_ms / 1000)


class RedisQueue:
    """A server, its mover process and the client calls of the producers and consumers."""

    def __init__(
        self, binary: str, root: str, *, mover_wait_ms: int = 10, fsync: str = "everysec"
    ) -> None:
        self.server = RedisServer(binary, root, fsync=fsync)
        self.client = self.server.client()
        ctx = multiprocessing.get_context("spawn")
        self._stop = ctx.Event()
        self.moved = ctx.Value("q", 0)
        self.mover = ctx.Process(
            target=mover_main,
            args=(self.server.port, self._stop, self.moved, mover_wait_ms),
            daemon=True,
        )
        self.mover.start()
        self._consumer = self.server.client()

    def send(self, items: list[bytes], ats: np.ndarray) -> None:
        pipe = self.client.pipeline(transaction=False)
        for lo in range(0, len(items), ZADD_PER_COMMAND):
            pipe.zadd(
                "delayed",
                dict(
                    zip(
                        items[lo : lo + ZADD_PER_COMMAND],
                        ats[lo : lo + ZADD_PER_COMMAND].tolist(),
                        strict=True,
                    )
                ),
            )
            if (lo // ZADD_PER_COMMAND + 1) % COMMANDS_PER_PIPELINE == 0:
                pipe.execute()
        pipe.execute()

    def receive(self) -> list[bytes]:
        got = self._consumer.blmpop(0.2, 1, "ready", direction="LEFT", count=POP_BATCH)
        return got[1] if got else []

    def pending(self) -> int:
        return int(self.client.zcard("delayed")) + int(self.client.llen("ready"))

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def mover_cpu_s(self) -> float:
        t = psutil.Process(self.mover.pid).cpu_times()
        return t.user + t.system

    def close(self) -> None:
        self._stop.set()
        self.mover.join(timeout=10)
        if self.mover.is_alive():
            self.mover.kill()
        with contextlib.suppress(Exception):
            self.client.close()
            self._consumer.close()
        self.server.close()


def _wait_fsync() -> None:
    """appendfsync everysec: what was written is on disk within about a second."""
    time.sleep(1.0)


class RedisPeer:
    """Each scenario gets its own server, so memory and disk figures are its alone."""

    def __init__(self, root: str) -> None:
        self.binary = redis_binary()
        self.version = redis_version(self.binary)
        self.root = root

    def ingest(self, n: int, threads: int) -> dict:
        q = RedisQueue(self.binary, self.root)
        try:
            drain = Drain(q.receive).start()
            seconds = produce(q.send, n, spread_now, threads=threads, batch=BATCH,
                              label="redis ingest")  # fmt: skip
            drain.stop()
            _wait_fsync()
            return {
                "seconds": seconds,
                "acked_rate": n / seconds,
                # the last write is durable after the next everysec fsync: at most ~1 s later
                "durable_rate": n / (seconds + 1.0),
                "disk_bytes": q.server.disk_bytes(),
            }
        finally:
            q.close()

    def memory(self, points: list[int], kill_at: set[int], threads: int) -> list[dict]:
        q = RedisQueue(self.binary, self.root)
        try:
            idle = q.used_memory()
            drain = Drain(q.receive).start()
            rows, sent = [], 0
            for p in points:
                produce(q.send, p - sent, spread_now, threads=threads, batch=BATCH, seq0=sent,
                        label=f"redis memory {p:,}")  # fmt: skip
                sent = p
                _wait_fsync()
                row = {
                    "sent": p,
                    "pending": q.pending(),
                    "memory_bytes": q.used_memory(),
                    "baseline_bytes": idle,
                    "rss": q.server.rss(),
                    "disk_bytes": q.server.disk_bytes(),
                }
                progress(f"redis {p:,}: used_memory {row['memory_bytes'] / 2**20:,.0f} MiB")
                if p in kill_at:
                    killed = now_ms()
                    q.server.kill()
                    q.server.start()  # returns once the AOF is loaded and PING answers
                    loaded = now_ms()
                    deadline = time.monotonic() + 600
                    while (first := drain.first_after(killed)) is None:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.005)
                    row["recovery_s"] = None if first is None else (first - killed) / 1000
                    row["recovery_detail"] = {"aof_load_s": (loaded - killed) / 1000}
                    row["pending_after"] = q.pending()
                rows.append(row)
            drain.stop()
            return rows
        finally:
            q.close()

    def burst(self, n: int, due_ms: int, threads: int) -> dict:
        q = RedisQueue(self.binary, self.root)
        me = psutil.Process()

        def cpu() -> dict[str, float]:
            return {
                "redis-server": q.server.cpu_s(),
                "mover (Lua pop-due loop)": q.mover_cpu_s(),
                "driver (consumer)": sum(me.cpu_times()[:2]),
            }

        try:
            return run_burst(q.send, q.receive, n, due_ms, threads=threads, batch=BATCH, cpu=cpu,
                             label="redis burst load")  # fmt: skip
        finally:
            q.close()

    def lateness(self, rate: int, seconds: int, start_ms: int, threads: int) -> dict:
        q = RedisQueue(self.binary, self.root)
        try:
            return run_lateness(q.send, q.receive, rate, seconds, start_ms, threads=threads,
                                batch=BATCH, label="redis lateness load")  # fmt: skip
        finally:
            q.close()

    def send(self, loop_n: int, threads: int, threads_n: int, async_n: int) -> dict:
        """send() in a loop, from many threads, and pipelined (the send_async of Redis):
        one ZADD per message. Run twice: with appendfsync everysec (acknowledged before it
        is on disk, the usual setting) and with appendfsync always (durable when
        acknowledged, as raydelay's send is)."""
        return {
            fsync: self._send(fsync, loop_n, threads, threads_n, async_n)
            for fsync in ("everysec", "always")
        }

    def _send(self, fsync: str, loop_n: int, threads: int, threads_n: int, async_n: int) -> dict:
        server = RedisServer(self.binary, self.root, fsync=fsync)
        local = threading.local()
        pipe = server.client().pipeline(transaction=False)
        queued = [0]
        at = now_ms() + 3_600_000

        def one(payload: bytes) -> None:
            c = getattr(local, "c", None)
            if c is None:
                c = local.c = server.client()
            c.zadd("delayed", {payload: at})

        def queue(payload: bytes) -> None:
            pipe.zadd("delayed", {payload: at})
            queued[0] += 1
            if queued[0] % 1_000 == 0:
                pipe.execute()

        try:
            return run_send(one, queue, pipe.execute, loop_n=loop_n, threads=threads,
                            threads_n=threads_n, async_n=async_n, label=f"redis ({fsync})")  # fmt: skip
        finally:
            server.close()

    def steady(self, rates: list[int], seconds: float) -> list[dict]:
        """The steady stream at each rate, with a mover that sleeps at most 1 ms."""
        out = []
        for rate in rates:
            q = RedisQueue(self.binary, self.root, mover_wait_ms=1)
            try:
                out.append(run_steady(q.send, q.receive, rate, seconds, label="redis steady"))
            finally:
                q.close()
        return out

    def close(self) -> None:
        pass
