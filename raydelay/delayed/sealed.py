"""Sealed buckets: a partition's delayed index, built once by the topic at write time (pure).

A partition's host already holds every entry in memory when it commits it. Its
:class:`TopicIndex` (the partition's ``LastMutableBucket``) keeps the rows of the delayed
entries of the ledgers not sealed yet. At a ledger boundary, once it holds at least
``min_index_count_per_bucket`` rows, it hands them to :func:`seal`, which sorts them by
(deliver_at, position), cuts them into segments (``max_time_step_per_segment_ms``,
``max_indexes_per_segment``) and encodes the bucket as three objects:

- ``data``: the segments back to back, each an Arrow IPC stream of one
  :data:`~raydelay.log.entries.ROWS_SCHEMA` batch: position, publish time, payload, key,
  properties, deliver_at. A due window of one bucket is one ranged read, and a due
  message is delivered from it without touching the log.
- ``index``: versioned msgpack: a 64-bit roaring bitmap of each segment's position keys.
  Only a lookup of given positions needs it (a redelivery or a cancel whose ledger is gone
  from the log), so nobody else reads it.
- ``meta``: versioned msgpack: the bucket's ledger range, one bitmap of all its position
  keys and, per segment, its min and max deliver_at, its row count and its byte range in
  ``data``. It stays small (the bitmap of a bucket's keys is mostly runs), because every
  subscription reads every meta when it starts.

Format 1 metas (before ``index``) carried the segment bitmaps inline; they still decode.

Every subscription reads the same buckets (:mod:`raydelay.delayed.reader`). Each payload
is written twice in all (the log, then its bucket), after which the log's ledger can go.

**Merges.** Above ``max_num_buckets``, adjacent buckets are merged (:func:`merge_metas`)
without rewriting a payload: a merged bucket is a new meta over the *runs* of its sources
(each run is the data and index objects one seal wrote, which the merged bucket now owns),
and its *load groups*: the runs' segments taken in deliver_at order and gathered a few
thousand rows at a time. A subscription loads one group with one ranged read per segment
in it, so the number of buckets it keeps bookkeeping for stays bounded while the payloads
stay where the seal wrote them. A format 3 meta is a merged one; a bucket a seal wrote is
one run with one group per segment, and keeps format 2.

"Delayed" here means not due when committed: ``deliver_at`` later than the entry's
publish time. Entries due at commit are delivered from the log like immediate ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import msgpack
import numpy as np
from pyroaring import BitMap64

from raydelay.delayed.index import bitmap64_of, bitmap64_values
from raydelay.errors import CodecError, InvalidArgument
from raydelay.log.entries import (
    NO_CANCEL,
    LedgerObject,
    Rows,
    _ipc,
    _read_ipc,
)
from raydelay.positions import SHIFT

FORMAT_VERSION = 2
MERGED_FORMAT_VERSION = 3
INDEX_FORMAT_VERSION = 1
SEGMENT_FORMAT = b"raydelay.sealed.v1"
THROUGH_KEY = "~through"  # the registry record holding sealed_through (msgpack int)


def registry_name(topic: str, partition: int) -> str:
    """The bucket registry's name for a partition's sealed buckets."""
    return f"topics/{topic}/{partition}/buckets"


def bucket_key(start_ledger: int, end_ledger: int, bucket_id: int) -> str:
    return f"{start_ledger:020d}_{end_ledger:020d}_{bucket_id}"


def parse_bucket_key(key: str) -> tuple[int, int, int]:
    """(start ledger, end ledger, id) of a bucket key."""
    try:
        start, end, bid = key.split("_")
        return int(start), int(end), int(bid)
    except ValueError as exc:
        raise CodecError(f"sealed bucket key {key!r}: expected <start>_<end>_<id>") from exc


def bucket_object(topic: str, partition: int, key: str, what: str) -> str:
    """The store key of a bucket's ``meta``, ``index`` or ``data`` object."""
    return f"{registry_name(topic, partition)}/{key}/{what}"


@dataclass(frozen=True)
class SegmentInfo:
    min_d: int
    max_d: int
    count: int
    offset: int  # byte range in the bucket's data object
    length: int


@dataclass(frozen=True)
class RunInfo:
    """Segments one seal wrote: their bytes are in the ``data`` object of bucket ``key``
    and their position keys in its ``index`` object."""

    key: str
    segments: tuple[SegmentInfo, ...]

    @property
    def ledgers(self) -> tuple[int, int]:
        return parse_bucket_key(self.key)[:2]

    @cached_property
    def rows_from(self) -> tuple[int, ...]:
        """``rows_from[i]``: the rows of segments ``i`` and after (one more item, 0, at the
        end): a subscription's count of what is left in a run, asked at every stats call,
        without a sum over its segments each time."""
        out = [0] * (len(self.segments) + 1)
        for i in range(len(self.segments) - 1, -1, -1):
            out[i] = out[i + 1] + self.segments[i].count
        return tuple(out)


Part = tuple[int, int]  # (run number, segment number in the run)


@dataclass(frozen=True)
class SealedMeta:
    start_ledger: int
    end_ledger: int
    bucket_id: int
    segments: tuple[SegmentInfo, ...]  # a sealed bucket's own; () for a merged one
    ledgers: tuple[tuple[int, int], ...] = ()  # (id, entry count) of the ledgers it covers
    # (marker, target) position keys of the cancel markers in its ledgers: a subscription
    # that skips those ledgers in the log learns them here before it delivers anything
    markers: tuple[tuple[int, int], ...] = ()
    keys: BitMap64 = field(default_factory=BitMap64)  # every position key (do not mutate)
    # a format 1 meta carried its segments' keys inline; a format 2 one leaves them to the
    # bucket's index object
    segment_keys: tuple[BitMap64, ...] | None = field(default=None, compare=False)
    # a merged bucket: the runs it owns (in ledger order) and its load groups (below)
    merged_runs: tuple[RunInfo, ...] = ()
    merged_groups: tuple[tuple[Part, ...], ...] = ()

    @property
    def key(self) -> str:
        return bucket_key(self.start_ledger, self.end_ledger, self.bucket_id)

    @cached_property
    def runs(self) -> tuple[RunInfo, ...]:
        """The runs of segments the bucket reads: its own one, or a merged bucket's."""
        return self.merged_runs or (RunInfo(self.key, self.segments),)

    @cached_property
    def groups(self) -> tuple[tuple[Part, ...], ...]:
        """What a subscription loads at once, in deliver_at order: each group is a few
        segments of its runs (one per group for a bucket a seal wrote)."""
        return self.merged_groups or tuple(((0, i),) for i in range(len(self.segments)))

    @property
    def count(self) -> int:
        return sum(s.count for r in self.runs for s in r.segments)

    def positions(self) -> BitMap64:
        """Every position key of the bucket (shared: do not mutate)."""
        return self.keys


def segment_of(segment_keys: tuple[BitMap64, ...], keys: np.ndarray) -> np.ndarray:
    """For each key, the index of the segment holding it (-1: none), given each segment's
    keys (a bucket's index)."""
    where = np.full(len(keys), -1, dtype=np.int64)
    bm = bitmap64_of(keys)
    ascending = bool(np.all(keys[1:] > keys[:-1]))  # (then a hit's place is a binary search)
    for i, seg in enumerate(segment_keys):
        hit = bm & seg
        if hit:
            found = bitmap64_values(hit).astype(np.int64)
            if ascending:
                where[np.searchsorted(keys, found)] = i
            else:
                where[np.isin(keys, found)] = i
    return where


def _segments_out(segments: tuple[SegmentInfo, ...]) -> list:
    return [[s.min_d, s.max_d, s.count, s.offset, s.length] for s in segments]


def _segments_in(raw: list) -> tuple[SegmentInfo, ...]:
    return tuple(SegmentInfo(int(a), int(b), int(c), int(o), int(n)) for a, b, c, o, n, *_ in raw)


def encode_meta(meta: SealedMeta) -> bytes:
    obj = {
        "v": MERGED_FORMAT_VERSION if meta.merged_runs else FORMAT_VERSION,
        "start": meta.start_ledger,
        "end": meta.end_ledger,
        "id": meta.bucket_id,
        "ledgers": [list(x) for x in meta.ledgers],
        "markers": [list(x) for x in meta.markers],
        "keys": meta.keys.serialize(),
    }
    if meta.merged_runs:
        obj["runs"] = [[r.key, _segments_out(r.segments)] for r in meta.merged_runs]
        obj["groups"] = [[x for part in g for x in part] for g in meta.merged_groups]
    else:
        obj["segments"] = _segments_out(meta.segments)
    return msgpack.packb(obj, use_bin_type=True)


def decode_meta(raw: bytes, what: str = "sealed bucket meta") -> SealedMeta:
    try:
        obj = msgpack.unpackb(raw, raw=False)
        version = obj.get("v")
        if version not in (1, FORMAT_VERSION, MERGED_FORMAT_VERSION):
            raise CodecError(
                f"{what}: format {version!r}, expected {FORMAT_VERSION} or {MERGED_FORMAT_VERSION}"
            )
        segment_keys = None
        if version == 1:  # each segment ended with its keys
            segment_keys = tuple(BitMap64.deserialize(s[5]) for s in obj["segments"])
            keys = BitMap64()
            for k in segment_keys:
                keys |= k
        else:
            keys = BitMap64.deserialize(obj["keys"])
        runs: tuple[RunInfo, ...] = ()
        groups: tuple[tuple[Part, ...], ...] = ()
        if version == MERGED_FORMAT_VERSION:
            runs = tuple(RunInfo(str(k), _segments_in(segs)) for k, segs in obj["runs"])
            groups = tuple(
                tuple((int(g[i]), int(g[i + 1])) for i in range(0, len(g), 2))
                for g in obj["groups"]
            )
            for r, no in (p for g in groups for p in g):
                if not (0 <= r < len(runs) and 0 <= no < len(runs[r].segments)):
                    raise CodecError(f"{what}: group names segment {no} of run {r}, not held")
        ledgers = tuple((int(i), int(c)) for i, c in obj["ledgers"])
        markers = tuple((int(m), int(t)) for m, t in obj["markers"])
        return SealedMeta(
            int(obj["start"]),
            int(obj["end"]),
            int(obj["id"]),
            _segments_in(obj.get("segments", [])),
            ledgers,
            markers,
            keys,
            segment_keys,
            runs,
            groups,
        )
    except CodecError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed meta is a codec error
        raise CodecError(f"{what}: cannot decode: {exc}") from exc


def encode_index(segment_keys: tuple[BitMap64, ...]) -> bytes:
    return msgpack.packb(
        {"v": INDEX_FORMAT_VERSION, "segments": [k.serialize() for k in segment_keys]},
        use_bin_type=True,
    )


def decode_index(raw: bytes, what: str = "sealed bucket index") -> tuple[BitMap64, ...]:
    try:
        obj = msgpack.unpackb(raw, raw=False)
        if obj.get("v") != INDEX_FORMAT_VERSION:
            raise CodecError(f"{what}: format {obj.get('v')!r}, expected {INDEX_FORMAT_VERSION}")
        return tuple(BitMap64.deserialize(k) for k in obj["segments"])
    except CodecError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed index is a codec error
        raise CodecError(f"{what}: cannot decode: {exc}") from exc


def encode_segment(rows: Rows) -> bytes:
    return _ipc(rows.to_batch(), {b"raydelay.sealed": SEGMENT_FORMAT})


def decode_segment(data, what: str = "sealed segment") -> Rows:
    return Rows.from_batch(_read_ipc(data, what).replace_schema_metadata(None))


def cut_segments(d: np.ndarray, max_indexes: int, max_step_ms: int) -> list[tuple[int, int]]:
    """Segment bounds over sorted deliver_ats: a segment ends when it holds ``max_indexes``
    positions or when the next position would stretch its span beyond ``max_step_ms``."""
    bounds = []
    i, n = 0, len(d)
    while i < n:
        j = int(np.searchsorted(d, d[i] + max_step_ms, side="right"))
        j = max(i + 1, min(j, i + max_indexes, n))
        bounds.append((i, j))
        i = j
    return bounds


def seal(
    rows: Rows,
    *,
    start_ledger: int,
    end_ledger: int,
    bucket_id: int,
    max_indexes: int,
    max_step_ms: int,
    ledgers: tuple[tuple[int, int], ...] = (),
    markers: tuple[tuple[int, int], ...] = (),
) -> tuple[SealedMeta, bytes, bytes]:
    """Sort ``rows`` by (deliver_at, position), cut them into segments and encode the
    bucket: its meta, its data object and its index object."""
    if not len(rows):
        raise InvalidArgument("rows: a sealed bucket needs at least one row")
    d = rows.entries.deliver_at_ms
    order = np.lexsort((rows.positions, d))
    d = d[order]
    ordered = Rows(rows.positions[order], rows.publish_time_ms[order], rows.entries.take(order))
    limit = max_indexes if max_indexes > 0 else len(d)
    parts: list[bytes] = []
    infos: list[SegmentInfo] = []
    segment_keys: list[BitMap64] = []
    offset = 0
    for lo, hi in cut_segments(d, limit, max_step_ms):
        seg = Rows(
            ordered.positions[lo:hi],
            ordered.publish_time_ms[lo:hi],
            ordered.entries.slice(lo, hi),
        )
        data = encode_segment(seg)
        segment_keys.append(bitmap64_of(seg.positions))
        infos.append(SegmentInfo(int(d[lo]), int(d[hi - 1]), hi - lo, offset, len(data)))
        parts.append(data)
        offset += len(data)
    meta = SealedMeta(
        start_ledger,
        end_ledger,
        bucket_id,
        tuple(infos),
        tuple(ledgers),
        tuple(markers),
        bitmap64_of(rows.positions),
    )
    return meta, b"".join(parts), encode_index(tuple(segment_keys))


def merge_metas(metas: list[SealedMeta], *, bucket_id: int, group_rows: int) -> SealedMeta:
    """The meta of a bucket that merges ``metas`` (adjacent ledger ranges, in ledger order)
    without rewriting a payload: it owns their runs, and its load groups take every
    segment of them in order of earliest deliver_at, ``group_rows`` rows or so at a time
    (a group never splits a segment, so neighbouring groups may overlap in time: the
    reader takes due rows from every loaded group)."""
    if len(metas) < 2:
        raise InvalidArgument("metas: a merge needs at least two buckets")
    for a, b in zip(metas, metas[1:], strict=False):
        if b.start_ledger <= a.end_ledger:
            raise InvalidArgument(
                f"metas: buckets {a.key} and {b.key} overlap or are out of ledger order"
            )
    runs = tuple(r for m in metas for r in m.runs)
    order = sorted(
        (seg.min_d, r, no) for r, run in enumerate(runs) for no, seg in enumerate(run.segments)
    )
    groups: list[tuple[Part, ...]] = []
    group: list[Part] = []
    rows = 0
    for _, r, no in order:
        group.append((r, no))
        rows += runs[r].segments[no].count
        if rows >= group_rows:
            groups.append(tuple(group))
            group, rows = [], 0
    if group:
        groups.append(tuple(group))
    keys = BitMap64()
    for m in metas:
        keys |= m.keys
    return SealedMeta(
        metas[0].start_ledger,
        metas[-1].end_ledger,
        bucket_id,
        (),
        tuple(x for m in metas for x in m.ledgers),
        tuple(x for m in metas for x in m.markers),
        keys,
        None,
        runs,
        tuple(groups),
    )


@dataclass(frozen=True)
class SealJob:
    """What the topic must write: a bucket of ``rows`` covering ledgers start..end, or,
    with no rows, only the news that ledgers through ``end_ledger`` are indexed."""

    start_ledger: int
    end_ledger: int
    rows: Rows | None
    ledgers: tuple[tuple[int, int], ...] = ()  # (id, entry count), filled in by the topic
    markers: tuple[tuple[int, int], ...] = ()  # (marker, target) keys of its cancel markers


# Parts smaller than this many rows are merged as they come (see TopicIndex._merge_small).
SMALL_PART_ROWS = 1024


class _Part:
    """Delayed rows of committed objects: positions ascending, and their order by
    deliver_at for the due queries."""

    __slots__ = ("rows", "d", "order", "d_sorted")

    def __init__(self, rows: Rows) -> None:
        self.rows = rows
        self.d = rows.entries.deliver_at_ms
        self.order = np.argsort(self.d, kind="stable")
        self.d_sorted = self.d[self.order]


class TopicIndex:
    """The partition's mutable bucket: the delayed rows of the ledgers after
    ``sealed_through``, in commit order. Called on the log's thread.

    Rows handed to a seal stay visible to :meth:`due` until :meth:`published` says their
    bucket is registered: until then subscriptions do not know the bucket, and a seal
    must never hold back a due message."""

    def __init__(self, *, min_index_count: int, sealed_through: int = -1) -> None:
        self.min_index_count = max(1, int(min_index_count))
        self.sealed_through = sealed_through  # every ledger up to it is indexed
        self._parts: list[_Part] = []
        self._sealing: list[tuple[int, list[_Part]]] = []  # (end ledger, parts) not published
        self._count = 0
        self._markers: list[tuple[int, int]] = []

    @property
    def count(self) -> int:
        return self._count

    @property
    def part_count(self) -> int:
        """How many parts the rows of the ledgers not sealed yet are held in (a due query
        walks each)."""
        return len(self._parts)

    def nbytes(self) -> int:
        return sum(p.rows.entries.nbytes() + p.rows.positions.nbytes * 4 for p in self._parts)

    def add(self, obj: LedgerObject) -> int:
        """Take in a committed ledger object; returns how many of its rows are delayed."""
        if obj.ledger_id <= self.sealed_through:
            return 0
        ents = obj.entries
        d = ents.deliver_at_ms
        targets = ents.cancel_targets
        is_marker = targets != NO_CANCEL
        if is_marker.any():
            at = np.flatnonzero(is_marker)
            base = np.int64(obj.ledger_id) << SHIFT
            self._markers += zip(
                (base | (obj.first_entry + at).astype(np.int64)).tolist(), targets[at].tolist()
            )
        keep = np.flatnonzero((d > obj.publish_time_ms) & ~is_marker)
        if not len(keep):
            return 0
        positions = (np.int64(obj.ledger_id) << SHIFT) | (obj.first_entry + keep).astype(np.int64)
        times = np.full(len(keep), obj.publish_time_ms, dtype=np.int64)
        # (all of them: the block as it is, not a copy; a take of one row cost 70 us)
        kept = ents if len(keep) == len(ents) else ents.take(keep)
        self._parts.append(_Part(Rows(positions, times, kept)))
        self._merge_small()
        self._count += len(keep)
        return len(keep)

    def _merge_small(self) -> None:
        """Keep the parts few when commits are small. A steady stream of single sends made
        one part per commit, and every due query walks every part: 145 ms a query at
        50,000 of them, asked by each subscription about once a second. The last two
        parts are merged while both are under SMALL_PART_ROWS and the older holds at most
        twice the newer: small parts grow geometrically to that size (a few dozen parts
        per 50,000-entry ledger), each row is copied O(log SMALL_PART_ROWS) times, and
        parts of bulk commits are never copied."""
        parts = self._parts
        while len(parts) >= 2:
            older, newer = len(parts[-2].d), len(parts[-1].d)
            if older >= SMALL_PART_ROWS or newer >= SMALL_PART_ROWS or older > 2 * newer:
                return
            parts[-2:] = [_Part(Rows.join([parts[-2].rows, parts[-1].rows]))]

    def ledger_closed(self, ledger_id: int) -> SealJob | None:
        """Ledger ``ledger_id`` is closed: the rows of the ledgers up to it become a bucket
        when there are enough of them (or, when there are none and no cancel markers, the
        range is indexed with no bucket; cancel markers wait for a bucket to carry them)."""
        if ledger_id <= self.sealed_through:
            return None
        start = self.sealed_through + 1
        if self._count == 0 and not self._markers:
            self._reset(ledger_id)
            return SealJob(start, ledger_id, None)
        if self._count < self.min_index_count:
            return None
        rows, markers = Rows.concat([p.rows for p in self._parts]), tuple(self._markers)
        self._sealing.append((ledger_id, self._parts))
        self._reset(ledger_id)
        return SealJob(start, ledger_id, rows, markers=markers)

    def _reset(self, sealed_through: int) -> None:
        self.sealed_through = sealed_through
        self._parts, self._count, self._markers = [], 0, []

    def published(self, end_ledger: int) -> None:
        """The bucket of the ledgers through ``end_ledger`` is registered: subscriptions
        read its rows from it from now on."""
        self._sealing = [(end, parts) for end, parts in self._sealing if end > end_ledger]

    def rows(self) -> Rows:
        """The rows held (sorted by position)."""
        return Rows.concat([p.rows for p in self._parts])

    def due(self, taken_below: int, taken_through: int, now_ms: int) -> tuple[Rows, int, int, int]:
        """The rows of the unsealed ledgers (those sealing included) a subscription has not
        taken yet and that are due: it took every row at a position below ``taken_below``
        with a deliver_at at or before ``taken_through``. Returns the rows (sorted by
        position), the position after the last row held (the new ``taken_below``), the
        earliest deliver_at still to come (or -1), and how many rows are not due yet."""
        parts = [p for _, ps in self._sealing for p in ps] + self._parts
        taken: list[Rows] = []
        next_d, waiting = -1, 0
        for p in parts:
            hi = int(np.searchsorted(p.d_sorted, now_ms, "right"))
            lo = 0
            if int(p.rows.positions[-1]) < taken_below:
                lo = min(hi, int(np.searchsorted(p.d_sorted, taken_through, "right")))
            elif int(p.rows.positions[0]) < taken_below:  # the boundary falls inside
                old = p.rows.positions < taken_below
                idx = np.flatnonzero((p.d <= now_ms) & ~(old & (p.d <= taken_through)))
                if len(idx):
                    taken.append(p.rows.take(idx))
                lo = hi  # done with this part
            if hi > lo:
                taken.append(p.rows.take(np.sort(p.order[lo:hi])))
            if hi < len(p.d_sorted):
                d = int(p.d_sorted[hi])
                next_d = d if next_d < 0 else min(next_d, d)
                waiting += len(p.d_sorted) - hi
        end = int(parts[-1].rows.positions[-1]) + 1 if parts else taken_below
        return Rows.concat(taken), max(end, taken_below), next_d, waiting

    def untaken(self, taken_below: int, taken_through: int) -> Rows:
        """The rows held (those sealing included) a subscription has not taken yet (see
        :meth:`due`), due or not, sorted by position: what a peek looks at."""
        parts = [p for _, ps in self._sealing for p in ps] + self._parts
        out = []
        for p in parts:
            keep = ~((p.rows.positions < taken_below) & (p.d <= taken_through))
            out.append(p.rows if keep.all() else p.rows.take(np.flatnonzero(keep)))
        return Rows.concat(out)

    def waiting_histogram(self, edges: np.ndarray, now_ms: int) -> np.ndarray:
        """Rows not due yet per due window (as the trackers count them)."""
        out = np.zeros(len(edges) + 1, dtype=np.int64)
        for p in [p for _, ps in self._sealing for p in ps] + self._parts:
            later = p.d[p.d > now_ms]
            out += np.bincount(np.searchsorted(edges, later, side="right"), minlength=len(out))
        return out
