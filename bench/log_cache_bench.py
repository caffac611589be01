"""The partition log's cache against cachetools' (issue #17: keep ours only if faster).

Both caches are byte-bounded LRUs shaped as the log uses them: keys (ledger, first entry),
values of ``--value-bytes`` bytes, room for ``--values`` of them (size = ``len``). Three
operations, each timed over ``--ops`` calls, best of ``--repeats`` runs (the two caches
alternate, so a busy machine slows both alike):

- get-hit: a key held (it becomes the most recently used);
- get-miss: a key not held;
- put-with-eviction: a new key into a full cache (the least recently used value goes).

Prints a markdown table of ops/s and the ratio ours / cachetools (above 1: ours is faster).
Runs in a few seconds.

Usage: python bench/log_cache_bench.py [--ops 200000] [--values 1000] [--value-bytes 4096]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cachetools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydelay.log.cache import LruCache  # noqa: E402

Key = tuple[int, int]


class Ours:
    """The log's cache behind the bench's three calls."""

    def __init__(self, max_bytes: int) -> None:
        self.cache: LruCache[Key, bytes] = LruCache(max_bytes, len)

    def fill(self, keys: list[Key], value: bytes) -> None:
        for key in keys:
            self.cache.put(key, value)

    def gets(self, keys: list[Key]) -> None:
        get = self.cache.get
        for key in keys:
            get(key)

    def puts(self, keys: list[Key], value: bytes) -> None:
        put = self.cache.put
        for key in keys:
            put(key, value)


class Theirs:
    """cachetools.LRUCache behind the same calls."""

    def __init__(self, max_bytes: int) -> None:
        self.cache: cachetools.LRUCache[Key, bytes] = cachetools.LRUCache(max_bytes, len)

    def fill(self, keys: list[Key], value: bytes) -> None:
        for key in keys:
            self.cache[key] = value

    def gets(self, keys: list[Key]) -> None:
        get = self.cache.get
        for key in keys:
            get(key)

    def puts(self, keys: list[Key], value: bytes) -> None:
        cache = self.cache
        for key in keys:
            cache[key] = value


def timed_ops_per_s(run: Callable[[], None], ops: int) -> float:
    started = time.perf_counter()
    run()
    return ops / (time.perf_counter() - started)


def measure(make: Callable[[int], Ours | Theirs], args: argparse.Namespace) -> dict[str, float]:
    """ops/s of each operation on a cache filled to its bound."""
    value = b"x" * args.value_bytes
    held = [(1, i) for i in range(args.values)]
    hits = [held[i % args.values] for i in range(args.ops)]
    misses = [(2, i) for i in range(args.ops)]
    fresh = [(3, i) for i in range(args.ops)]
    cache = make(args.values * args.value_bytes)
    cache.fill(held, value)
    return {
        "get-hit": timed_ops_per_s(lambda: cache.gets(hits), args.ops),
        "get-miss": timed_ops_per_s(lambda: cache.gets(misses), args.ops),
        "put-with-eviction": timed_ops_per_s(lambda: cache.puts(fresh, value), args.ops),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=200_000)
    parser.add_argument("--values", type=int, default=1_000)
    parser.add_argument("--value-bytes", type=int, default=4_096)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    best: dict[str, dict[str, float]] = {"ours": {}, "cachetools": {}}
    for _ in range(args.repeats):
        for name, make in (("ours", Ours), ("cachetools", Theirs)):
            for op, rate in measure(make, args).items():
                best[name][op] = max(best[name].get(op, 0.0), rate)
    print(
        f"cache of {args.values} values x {args.value_bytes} B, {args.ops} ops per run, "
        f"best of {args.repeats}; cachetools {cachetools.__version__}\n"
    )
    print("| operation | ours ops/s | cachetools ops/s | ours / cachetools |")
    print("|---|---:|---:|---:|")
    for op, ours in best["ours"].items():
        theirs = best["cachetools"][op]
        print(f"| {op} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f} |")


if __name__ == "__main__":
    main()
