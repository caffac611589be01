"""Merging sealed buckets: what raydelay does (a new meta over the sources' runs) against a
full rewrite of their rows, in one run, in process. Prints a table.

A partition seals ``--buckets`` buckets of ``--rows`` delayed rows each (100-byte payloads,
due uniformly over an hour, as ``bench/drain_buckets.py`` loads them), one after the other;
after each seal, buckets are merged while there are more than ``--max-buckets``, the
smallest adjacent window first (the partition's own policy, ``merge_window``). The two
ways of merging then differ only in what a merge writes:

- **runs** (raydelay): the merged bucket's meta only; payloads stay where the seal wrote
  them, and a subscription reads a group of segments with one ranged read each;
- **rewrite**: every row of the sources is read, sorted and sealed again (data, index and
  meta), the sources deleted.

For each it reports the bytes merges wrote and read per byte of payload sealed, the
seconds merging took, and what delivering everything once costs a subscription after
the load: ranged reads and bytes read.

Usage: python bench/merge_bench.py [--buckets 1000] [--rows 2000] [--max-buckets 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydelay.delayed.sealed import (  # noqa: E402
    SealedMeta,
    TopicIndex,
    seal,
)
from raydelay.delayed.store import SealedStore, merge, merge_window  # noqa: E402
from raydelay.log.entries import Entries, LedgerObject, Rows  # noqa: E402
from raydelay.storage.counting import CountingObjectStore  # noqa: E402
from raydelay.storage.memory import MemoryObjectStore  # noqa: E402

PAYLOAD = 100
MAX_INDEXES = 5_000
MAX_STEP_MS = 300_000


def bucket_rows(ledger: int, rows: int, rng: np.random.Generator) -> Rows:
    entries = Entries.build(
        [bytes(PAYLOAD)] * rows, rng.integers(60_000, 3_660_000, rows).astype(np.int64)
    )
    index = TopicIndex(min_index_count=1, sealed_through=ledger - 1)
    index.add(LedgerObject(ledger, 0, 0, entries, {}))
    job = index.ledger_closed(ledger)
    assert job is not None and job.rows is not None
    return job.rows


def sources_rows(sealed: SealedStore, metas: list[SealedMeta]) -> Rows:
    segments = [(r.key, s) for m in metas for r in m.runs for s in r.segments]
    return Rows.concat([sealed.segment(key, s.offset, s.length) for key, s in segments])


def rewrite(sealed: SealedStore, keys: list[str], bucket_id: int) -> SealedMeta:
    """The alternative: read every row of the sources, seal them again, drop the sources."""
    metas = [sealed.meta(k) for k in keys]
    meta, data, index = seal(
        sources_rows(sealed, metas),
        start_ledger=metas[0].start_ledger,
        end_ledger=metas[-1].end_ledger,
        bucket_id=bucket_id,
        max_indexes=MAX_INDEXES,
        max_step_ms=MAX_STEP_MS,
        ledgers=tuple(x for m in metas for x in m.ledgers),
    )
    sealed.write(meta, data, index)
    for k in keys:
        sealed.delete(k)
    return meta


def one_way(way: str, n_buckets: int, rows: int, max_buckets: int) -> dict:
    store = CountingObjectStore(MemoryObjectStore())
    sealed = SealedStore(store, "t", 0, meta_cache=4 * max_buckets)
    rng = np.random.default_rng(7)
    held: list[SealedMeta] = []
    merge_s = 0.0
    merge_written = merge_read = merges = 0
    sealed_bytes = 0
    for ledger in range(1, n_buckets + 1):
        meta, data, index = seal(
            bucket_rows(ledger, rows, rng),
            start_ledger=ledger,
            end_ledger=ledger,
            bucket_id=ledger,
            max_indexes=MAX_INDEXES,
            max_step_ms=MAX_STEP_MS,
        )
        sealed_bytes += sealed.write(meta, data, index)
        held.append(meta)
        while len(held) > max_buckets:
            window = merge_window([m.count for m in held], len(held) - max_buckets)
            keys = [held[i].key for i in window]
            w0, r0, t0 = store.bytes_written, store.bytes_read, time.process_time()
            bid = 10**9 + merges
            if way == "runs":
                done = merge(sealed, keys, bucket_id=bid, group_rows=MAX_INDEXES,
                             register=lambda *a: True)  # fmt: skip
                assert done is not None
                new = done[0]
            else:
                new = rewrite(sealed, keys, bid)
            merge_s += time.process_time() - t0
            merge_written += store.bytes_written - w0
            merge_read += store.bytes_read - r0
            merges += 1
            held[window[0] : window[-1] + 1] = [new]
    # what a subscription reads to deliver everything once: every segment (group part)
    reads = sum(len(r.segments) for m in held for r in m.runs)
    read_bytes = sum(s.length for m in held for r in m.runs for s in r.segments)
    payload = n_buckets * rows * PAYLOAD
    return {
        "way": way,
        "buckets": len(held),
        "merges": merges,
        "merge_written": merge_written / payload,
        "merge_read": merge_read / payload,
        "merge_s": merge_s,
        "sealed_per_payload": sealed_bytes / payload,
        "reads": reads,
        "read_bytes": read_bytes / payload,
        "groups": sum(len(m.groups) for m in held),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--buckets", type=int, default=1_000)
    ap.add_argument("--rows", type=int, default=2_000)
    ap.add_argument("--max-buckets", type=int, default=64)
    args = ap.parse_args()
    runs = [one_way(w, args.buckets, args.rows, args.max_buckets) for w in ("runs", "rewrite")]
    print(
        f"\n## Merging {args.buckets:,} buckets of {args.rows:,} rows down to "
        f"{args.max_buckets} ({args.buckets * args.rows:,} rows of {PAYLOAD} B)\n"
    )
    print("| merge | buckets left | merges | merge bytes written / payload | merge bytes read "
          "/ payload | merge CPU s | seal bytes / payload | loads to deliver all "
          "(groups) | ranged reads | bytes read / payload |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(
            f"| {r['way']} | {r['buckets']} | {r['merges']:,} | {r['merge_written']:.3f} "
            f"| {r['merge_read']:.3f} | {r['merge_s']:.1f} | {r['sealed_per_payload']:.2f} "
            f"| {r['groups']:,} | {r['reads']:,} | {r['read_bytes']:.2f} |"
        )
    a, b = runs
    print(
        f"\nruns against rewrite: {a['merge_written'] / b['merge_written']:.3f}x the bytes "
        f"written by merges, {a['merge_s'] / b['merge_s']:.3f}x the CPU"
    )


if __name__ == "__main__":
    main()
