"""Runs the bucket tracker's store I/O off the caller's path.

A job is a pure function of immutable inputs (it encodes, writes or reads; it
never touches tracker state). Its result comes back as a completion that the
tracker applies on its own thread, at the start of its next call or in flush().
Inline mode runs jobs at once (deterministic: for in-memory stores and tests).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

log = logging.getLogger(__name__)

Completion = Callable[[Any, BaseException | None], None]

_TRIM_INTERVAL_S = 1.0


def _load_malloc_trim() -> Callable[[int], int] | None:
    # Encoding and decoding on the I/O threads leaves freed blocks in glibc's per-thread
    # arenas; without giving them back, RSS grows far beyond what the index holds.
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_malloc_trim = _load_malloc_trim()


class JobRunner:
    """``background``: jobs run on I/O threads. ``manual`` (tests): jobs wait in a queue until
    ``run_queued`` runs them, so tests choose exactly when each background job lands."""

    def __init__(self, *, background: bool, name: str, manual: bool = False) -> None:
        self.background = background or manual
        self.manual = manual
        self._queued: deque[tuple[Callable[[], Any], Completion]] = deque()
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._name = name
        self._pending: set[Future] = set()
        self._done: deque[tuple[Completion, Any, BaseException | None]] = deque()
        self._lock = threading.Lock()
        self._last_trim = 0.0

    def _pool(self, lane: str) -> ThreadPoolExecutor:
        pool = self._pools.get(lane)
        if pool is None:
            # One thread per lane: loads never queue behind a long merge.
            pool = self._pools[lane] = ThreadPoolExecutor(1, thread_name_prefix=f"raydelay-{lane}")
        return pool

    @property
    def sleeps(self) -> bool:
        """Whether retries should back off in real time (only with real threads)."""
        return self.background and not self.manual

    def submit(self, lane: str, fn: Callable[[], Any], on_done: Completion) -> None:
        if self.manual:
            self._queued.append((fn, on_done))
            return
        if not self.background:
            try:
                result, error = fn(), None
            except BaseException as exc:  # noqa: BLE001 - handed to on_done, never swallowed
                result, error = None, exc
            self._done.append((on_done, result, error))
            return
        future = self._pool(lane).submit(self._run_and_trim, fn)
        with self._lock:
            self._pending.add(future)

        def finished(f: Future) -> None:
            error = f.exception()
            self._done.append((on_done, None if error else f.result(), error))
            with self._lock:
                self._pending.discard(f)

        future.add_done_callback(finished)

    def _run_and_trim(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        finally:
            now = time.monotonic()
            if _malloc_trim is not None and now - self._last_trim >= _TRIM_INTERVAL_S:
                self._last_trim = now
                _malloc_trim(0)

    def drain(self) -> int:
        """Apply finished jobs' completions on the caller's thread; returns how many."""
        applied = 0
        while self._done:
            on_done, result, error = self._done.popleft()
            on_done(result, error)
            applied += 1
        return applied

    def run_queued(self, n: int | None = None) -> int:
        """Manual mode: run up to ``n`` queued jobs (all when None), oldest first."""
        ran = 0
        while self._queued and (n is None or ran < n):
            fn, on_done = self._queued.popleft()
            try:
                result, error = fn(), None
            except BaseException as exc:  # noqa: BLE001 - handed to on_done
                result, error = None, exc
            self._done.append((on_done, result, error))
            ran += 1
        return ran

    def busy(self) -> bool:
        with self._lock:
            return bool(self._pending) or bool(self._done) or bool(self._queued)

    def wait(self) -> None:
        if self.manual:
            self.run_queued()
            return
        while True:
            with self._lock:
                pending = list(self._pending)
            if not pending:
                return
            wait(pending)

    def shutdown(self) -> None:
        self.wait()
        for pool in self._pools.values():
            pool.shutdown(wait=True)
        self._pools.clear()
