"""The cluster's metadata and its journal (pure: no Ray; the coordinator actor wraps it).

What it owns: topics and their partition counts, each partition's ledger list,
subscriptions and their options, each subscription partition's mark-delete
position, and the bucket registry of every subscription.

Write ahead, then apply: every change is one journal object
(``meta/journal/<seq>``) written **before** the state changes and before the call
returns. Every ``snapshot_after()`` changes (64, more for a large state, at most
``snapshot_every``) the whole state is written as
``meta/snapshot/<seq>`` and the journal up to it is deleted. :meth:`Metadata.recover`
loads the newest snapshot and replays the journal after it.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack

from raydelay.cluster.assignments import Assignments
from raydelay.errors import CodecError, Conflict, InvalidArgument, NotFound
from raydelay.storage.base import ObjectStore
from raydelay.storage.keys import journal_key, snapshot_key, validate_name
from raydelay.subscription_types import check_subscription_type, spreads

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
JOURNAL_PREFIX = "meta/journal/"
SNAPSHOT_PREFIX = "meta/snapshot/"
MAX_PARTITIONS = 1024
REPLAY_READERS = 16  # journal records read at once by a recovery
# when a snapshot is written: see Metadata.snapshot_after
MIN_SNAPSHOT_EVERY = 64
SNAPSHOT_BYTES_PER_RECORD = 16 * 1024


def _pk(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _empty_state() -> dict[str, Any]:
    return {
        "topics": {},  # name -> {"partitions": n}
        "ledgers": {},  # "topic/p" -> [[ledger_id, count or None], ...]
        "next_ledger": 1,
        "subs": {},  # topic -> {sub -> options}
        "mark_delete": {},  # "topic/p/sub" -> [ledger, entry]
        "registry": {},  # tracker name -> {bucket_key: record bytes}
        "log_mark": {},  # "topic/p/sub" -> [ledger, entry]: the log it still needs starts after
        "progress": {},  # "topic/p/sub" -> {sealed bucket key: segments done, -1 all}
        "hosts": {},  # "topic/p" -> the name of the partition host serving it
        "units": {},  # "topic/sub/group" -> the name of the subscription host serving it
    }


class Metadata:
    def __init__(
        self,
        store: ObjectStore,
        *,
        snapshot_every: int = 1000,
        guard=lambda: None,
        fence=lambda: None,
    ) -> None:
        self._store = store
        self._snapshot_every = snapshot_every
        self._guard = guard  # raises when this cluster must not write (it lost the store)
        # called when a journal number is taken: raises if a newer coordinator owns the store
        self._fence = fence
        self.state = _empty_state()
        # which host serves each partition and each subscription unit (journaled here)
        self.hosts = Assignments(self)
        self._seq = 0  # last journal sequence written
        self._since_snapshot = 0
        self._snapshot_bytes = 0  # the size of the last snapshot written or read
        self.recover()

    # --- journal ----------------------------------------------------------------------

    def recover(self) -> None:
        self.state, self._seq = _empty_state(), 0
        for key in reversed(self._store.list(SNAPSHOT_PREFIX)):
            try:
                data = self._store.get(key)
                raw = _decode(data, key)
            except (CodecError, NotFound) as exc:
                log.error("metadata snapshot %s unusable, trying an older one: %s", key, exc)
                continue
            self.state, self._seq = _empty_state() | raw["state"], int(raw["seq"])
            self._snapshot_bytes = len(data)
            break
        keys = [k for k in self._store.list(JOURNAL_PREFIX) if _seq_of(k) > self._seq]
        replayed = 0
        # read in parallel, applied in order: up to snapshot_every records, each a store
        # round trip (one after another, 999 of them took 3.2-3.7 s over SeaweedFS, on the
        # path of every coordinator's restart)
        with ThreadPoolExecutor(max_workers=max(1, min(REPLAY_READERS, len(keys)))) as pool:
            for key, data in zip(keys, pool.map(self._store.get, keys), strict=True):
                record = _decode(data, key)
                self._apply(record["op"], record["args"])
                self._seq = _seq_of(key)
                replayed += 1
        self._since_snapshot = replayed
        log.info("metadata recovered at seq %d (%d journal records replayed)", self._seq, replayed)

    def change(self, op: str, **args: Any) -> Any:
        """Journal ``op`` durably, then apply it. A failed write leaves the state unchanged."""
        self._guard()
        record = _encode({"op": op, "args": args})
        while True:
            seq = self._seq + 1
            # create-only: the journal's numbers fence coordinators. The same bytes at this
            # number are our own retried write; other bytes were written by another
            # coordinator (one that Ray replaced while this process still ran, or another
            # cluster). Then ``fence`` raises StoreOwned if a newer one owns the store;
            # otherwise this one catches up with the records it missed and tries again.
            try:
                self._store.put_new(journal_key(seq), record)
                break
            except Conflict:
                self._fence()
                before = self._seq
                if not self.catch_up():
                    self.recover()  # it snapshotted past our number meanwhile
                if self._seq <= before:
                    raise
        self._seq = seq
        result = self._apply(op, args)
        self._since_snapshot += 1
        if self._since_snapshot >= self.snapshot_after():
            self.snapshot()
        return result

    def snapshot_after(self) -> int:
        """How many journal records make the next snapshot: about one per
        ``SNAPSHOT_BYTES_PER_RECORD`` of the last snapshot, at least ``MIN_SNAPSHOT_EVERY``
        and at most ``snapshot_every``. A recovery reads each record as one store round
        trip (about 3 ms of CPU each with boto3, however small): 999 of them took 3.2-3.7 s
        over SeaweedFS, on the path of every coordinator restart, and the snapshot then
        deleted 999 keys inside one caller's call. A small state is rewritten often
        instead (a few KB every 64 changes); a large one less often."""
        by_size = self._snapshot_bytes // SNAPSHOT_BYTES_PER_RECORD
        return min(self._snapshot_every, max(MIN_SNAPSHOT_EVERY, by_size))

    def catch_up(self) -> int:
        """Apply the journal records written after this one's sequence by another
        coordinator; returns how many."""
        applied = 0
        for key in self._store.list(JOURNAL_PREFIX):
            seq = _seq_of(key)
            if seq != self._seq + 1:
                continue
            record = _decode(self._store.get(key), key)
            self._apply(record["op"], record["args"])
            self._seq, applied = seq, applied + 1
        if applied:
            log.warning("metadata: caught up with %d records another coordinator wrote", applied)
        return applied

    def snapshot(self) -> None:
        seq = self._seq
        data = _encode({"seq": seq, "state": self.state})
        self._store.put(snapshot_key(seq), data)
        self._since_snapshot, self._snapshot_bytes = 0, len(data)
        for key in self._store.list(JOURNAL_PREFIX):
            if _seq_of(key) <= seq:
                self._store.delete(key)
        for key in self._store.list(SNAPSHOT_PREFIX)[:-1]:
            self._store.delete(key)

    @property
    def seq(self) -> int:
        return self._seq

    def _apply(self, op: str, a: dict[str, Any]) -> Any:
        s = self.state
        if op == "create_topic":
            s["topics"][a["topic"]] = {"partitions": a["partitions"]}
            for p in range(a["partitions"]):
                s["ledgers"].setdefault(_pk(a["topic"], p), [])
            s["subs"].setdefault(a["topic"], {})
        elif op == "delete_topic":
            t = a["topic"]
            n = s["topics"].pop(t, {"partitions": 0})["partitions"]
            for p in range(n):
                s["ledgers"].pop(_pk(t, p), None)
            s["subs"].pop(t, None)
            for table in ("mark_delete", "log_mark", "progress", "units"):
                for key in [k for k in s[table] if k.startswith(f"{t}/")]:
                    del s[table][key]
            for name in [k for k in s["registry"] if k.startswith((f"subs/{t}/", f"topics/{t}/"))]:
                del s["registry"][name]
            for p in range(n):
                s["hosts"].pop(_pk(t, p), None)
        elif op == "create_subscription":
            s["subs"].setdefault(a["topic"], {})[a["subscription"]] = a["options"]
            if a.get("start") is not None:  # a new subscription: where each partition starts
                for p, position in enumerate(a["start"]):
                    key = f"{a['topic']}/{p}/{a['subscription']}"
                    for table in ("mark_delete", "log_mark", "progress"):
                        s[table].pop(key, None)
                    if position is not None:
                        s["mark_delete"][key] = list(position)
        elif op == "delete_subscription":
            t, sub = a["topic"], a["subscription"]
            s["subs"].get(t, {}).pop(sub, None)
            for table in ("mark_delete", "log_mark", "progress"):
                for key in [k for k in s[table] if _sub_of(k) == (t, sub)]:
                    del s[table][key]
            for key in [k for k in s["units"] if k.startswith(f"{t}/{sub}/")]:
                del s["units"][key]
        elif op == "roll":
            ledgers = s["ledgers"][_pk(a["topic"], a["partition"])]
            if a["closed"] is not None:
                for item in ledgers:
                    if item[0] == a["closed"]:
                        item[1] = a["count"]
            ledgers.append([a["new"], None])
            s["next_ledger"] = max(s["next_ledger"], a["new"] + 1)
            return a["new"]
        elif op == "mark_delete":
            _apply_mark(s, a)
        elif op == "mark_delete_many":
            for mark in a["marks"]:
                _apply_mark(s, mark)
        elif op == "drop_ledgers":
            pk = _pk(a["topic"], a["partition"])
            drop = set(a["ledgers"])
            s["ledgers"][pk] = [x for x in s["ledgers"][pk] if x[0] not in drop]
        elif op == "assign":
            s["hosts"][a["key"]] = a["host"]
        elif op == "assign_unit":
            if a["host"] is None:
                s["units"].pop(a["key"], None)
            else:
                s["units"][a["key"]] = a["host"]
        elif op == "merge":
            entries = s["registry"].setdefault(a["name"], {})
            for key in a["sources"]:
                entries.pop(key, None)
            entries[a["key"]] = a["record"]
            prefix = f"{a['topic']}/{a['partition']}/"
            for sub_key, done in s["progress"].items():
                if sub_key.startswith(prefix):
                    merged_progress(done, a["sources"], a["runs"], a["key"])
        elif op == "registry":
            for kind, name, bucket_key, record in a["ops"]:
                entries = s["registry"].setdefault(name, {})
                if kind == "put":
                    entries[bucket_key] = record
                else:
                    entries.pop(bucket_key, None)
                if not entries:
                    del s["registry"][name]
        else:
            raise CodecError(f"metadata journal: unknown op {op!r}")
        return None

    # --- topics -----------------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int) -> int:
        """Create a topic (idempotent for the same partition count); returns the count."""
        validate_name("topic", topic)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidArgument(f"partitions: expected an int, got {type(partitions).__name__}")
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidArgument(f"partitions: must be 1..{MAX_PARTITIONS}, got {partitions}")
        existing = self.state["topics"].get(topic)
        if existing is not None:
            if existing["partitions"] != partitions:
                raise InvalidArgument(
                    f"partitions: topic {topic!r} exists with {existing['partitions']} "
                    f"partitions, not {partitions}"
                )
            return partitions
        self.change("create_topic", topic=topic, partitions=partitions)
        return partitions

    def delete_topic(self, topic: str) -> None:
        """Forget a topic, its ledgers, subscriptions, cursors' marks and bucket registry."""
        self.partitions(topic)
        self.change("delete_topic", topic=topic)

    def partitions(self, topic: str) -> int:
        validate_name("topic", topic)
        t = self.state["topics"].get(topic)
        if t is None:
            raise NotFound(f"topic {topic!r} does not exist")
        return int(t["partitions"])

    def topics(self) -> dict[str, int]:
        return {k: int(v["partitions"]) for k, v in self.state["topics"].items()}

    # --- ledgers ---------------------------------------------------------------------------

    def ledgers(self, topic: str, partition: int) -> list[list]:
        self.check_partition(topic, partition)
        return [list(x) for x in self.state["ledgers"][_pk(topic, partition)]]

    def roll_ledger(self, topic: str, partition: int, closed: int | None, count: int) -> int:
        """Close ``closed`` at ``count`` entries (if given) and open a new ledger; its id.

        A retried call (its reply was lost: the coordinator restarted after journaling it)
        gets the ledger the first call opened, and nothing is journaled again. Without
        that, the first new ledger would stay open and empty between closed ones forever,
        and retention, which stops at an open ledger, would never pass it."""
        self.check_partition(topic, partition)
        ledgers = self.state["ledgers"][_pk(topic, partition)]
        if ledgers and ledgers[-1][1] is None:  # an open ledger: is this call a retry?
            if closed is None:
                return ledgers[-1][0]
            before = ledgers[-2] if len(ledgers) > 1 else None
            if closed != ledgers[-1][0] and before is not None and before[0] == closed:
                if before[1] != count:
                    raise InvalidArgument(
                        f"count: ledger {closed} of {topic}/{partition} was closed at "
                        f"{before[1]} entries, not {count}"
                    )
                return ledgers[-1][0]
        return self.change(
            "roll",
            topic=topic,
            partition=partition,
            closed=closed,
            count=count,
            new=self.state["next_ledger"],
        )

    def retention(self, topic: str, partition: int) -> list[int]:
        """Closed ledgers no subscription needs any more (none without subs): each has
        acknowledged every entry in them, or holds the rest in sealed buckets (its
        ``log_mark``)."""
        self.check_partition(topic, partition)
        subs = self.state["subs"].get(topic, {})
        if not subs:
            return []
        marks = []
        for sub in subs:
            key = f"{topic}/{partition}/{sub}"
            md = tuple(self.state["mark_delete"].get(key, [-1, -1]))
            marks.append(max(md, tuple(self.state["log_mark"].get(key, md))))
        low = min(marks)
        out = []
        for ledger_id, count in self.state["ledgers"][_pk(topic, partition)]:
            if count is None:
                break
            if ledger_id < low[0] or (ledger_id == low[0] and low[1] >= count - 1):
                out.append(ledger_id)
        return out

    def drop_ledgers(self, topic: str, partition: int, ledger_ids: list[int]) -> None:
        self.check_partition(topic, partition)
        if ledger_ids:
            self.change("drop_ledgers", topic=topic, partition=partition, ledgers=ledger_ids)

    # --- subscriptions ------------------------------------------------------------------------

    def create_subscription(
        self,
        topic: str,
        subscription: str,
        options: dict[str, Any],
        start: list[list[int] | None] | None = None,
    ) -> dict:
        """Create (or update the options of) a subscription; its type can never change.
        ``start``: per partition, the last position a *new* subscription counts as
        acknowledged (None: from the oldest entry); an existing one keeps its cursor."""
        n = self.partitions(topic)
        validate_name("subscription", subscription)
        check_subscription_type(options.get("type"))
        existing = self.state["subs"].get(topic, {}).get(subscription)
        if existing is not None and existing["type"] != options["type"]:
            raise InvalidArgument(
                f"subscription_type: {topic}/{subscription} exists as {existing['type']!r}; "
                f"it cannot become {options['type']!r}"
            )
        if existing is None:
            if start is not None and len(start) != n:
                raise InvalidArgument(f"start: {len(start)} positions for {n} partitions")
            self.change(
                "create_subscription",
                topic=topic,
                subscription=subscription,
                options=options,
                start=[None if x is None else [int(x[0]), int(x[1])] for x in start or [None] * n],
            )
        elif existing != options:
            self.change(
                "create_subscription", topic=topic, subscription=subscription, options=options
            )
        return dict(options)

    def delete_subscription(self, topic: str, subscription: str) -> None:
        """Forget a subscription and its marks (its actors must be stopped first)."""
        self.subscription(topic, subscription)  # NotFound
        self.change("delete_subscription", topic=topic, subscription=subscription)

    def subscriptions(self, topic: str) -> dict[str, dict]:
        self.partitions(topic)
        return {k: dict(v) for k, v in self.state["subs"].get(topic, {}).items()}

    def subscription(self, topic: str, subscription: str) -> dict:
        subs = self.subscriptions(topic)
        validate_name("subscription", subscription)
        if subscription not in subs:
            raise NotFound(f"subscription {topic}/{subscription} does not exist")
        return subs[subscription]

    def set_mark_delete(
        self, topic: str, partition: int, subscription: str, position: list[int]
    ) -> None:
        self.check_partition(topic, partition)
        key = f"{topic}/{partition}/{subscription}"
        position = [int(position[0]), int(position[1])]
        if self.state["mark_delete"].get(key) != position:
            self.change("mark_delete", key=key, position=position)

    def set_progress(
        self,
        topic: str,
        partition: int,
        subscription: str,
        position: list[int],
        log_mark: list[int],
        progress: dict[str, int],
    ) -> None:
        """Mark-delete, the log mark and the sealed-bucket progress of a subscription
        partition, in one journal record (only when something changed)."""
        self.check_partition(topic, partition)
        record = _progress_record(
            self.state, [topic, partition, subscription, position, log_mark, progress]
        )
        if record is not None:
            self.change("mark_delete", **record)

    def set_progress_many(self, reports: list) -> int:
        """:meth:`set_progress` for many subscription partitions at once (each report
        ``[topic, partition, subscription, position, log_mark, progress]``), the ones that
        changed in one journal record: what one subscription host's units report together.
        A report of a partition that no longer exists (its topic deleted, or made again
        with fewer partitions, meanwhile) is left out: it must not hold up the others.
        Returns how many changed."""
        records = []
        for report in reports:
            try:
                self.check_partition(report[0], report[1])
            except (NotFound, InvalidArgument) as exc:
                log.info("metadata: a progress report left out: %s", exc)
                continue
            record = _progress_record(self.state, report)
            if record is not None:
                records.append(record)
        if records:
            self.change("mark_delete_many", marks=records)
        return len(records)

    def progress(self, topic: str, partition: int, subscription: str) -> dict[str, Any]:
        return dict(self.state["progress"].get(f"{topic}/{partition}/{subscription}", {}))

    def bucket_retention(
        self, topic: str, partition: int, name: str, through_key: str
    ) -> list[str]:
        """Sealed buckets (of registry ``name``) every shared subscription is done with
        (none without subscriptions; FIFO subscriptions read the log, not buckets)."""
        self.check_partition(topic, partition)
        subs = self.state["subs"].get(topic, {})
        if not subs:
            return []
        keys = [k for k in self.state["registry"].get(name, {}) if k != through_key]
        shared = [s for s, o in subs.items() if spreads(o.get("type"))]
        done = [self.state["progress"].get(f"{topic}/{partition}/{s}", {}) for s in shared]
        return [k for k in keys if all(d.get(k) == -1 for d in done)]

    def mark_delete(self, topic: str, partition: int, subscription: str) -> list[int]:
        return list(self.state["mark_delete"].get(f"{topic}/{partition}/{subscription}", [-1, -1]))

    # --- the bucket registry ----------------------------------------------------------------

    def merge_buckets(
        self,
        topic: str,
        partition: int,
        name: str,
        sources: list[str],
        key: str,
        record: bytes,
        runs: list[int],
    ) -> bool:
        """Register the merged bucket ``key`` in place of ``sources`` (of registry
        ``name``; ``runs``: how many runs each holds), and carry every subscription's
        progress through them over to it, in one journal record. True once done (again
        when it was done already); False when a source is no longer registered (retention
        deleted it meanwhile): nothing changes."""
        self.check_partition(topic, partition)
        if not isinstance(record, bytes):
            raise InvalidArgument("record: a merged bucket's record must be bytes")
        if len(sources) < 2 or len(runs) != len(sources):
            raise InvalidArgument("sources: a merge needs two buckets or more, with their runs")
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in runs):
            raise InvalidArgument(f"runs: positive run counts expected, got {runs!r}")
        entries = self.state["registry"].get(name, {})
        if key in entries and not any(k in entries for k in sources):
            return True  # (a retried call)
        if not all(k in entries for k in sources):
            return False
        self.change(
            "merge",
            topic=topic,
            partition=partition,
            name=name,
            sources=list(sources),
            key=key,
            record=record,
            runs=list(runs),
        )
        return True

    def registry_list(self, name: str) -> dict[str, bytes]:
        return dict(self.state["registry"].get(name, {}))

    def registry_apply(self, ops: list[tuple[str, str, str, bytes | None]]) -> None:
        """Apply a batch of ("put" | "remove", name, bucket_key, record) in one journal write."""
        for kind, name, bucket_key, record in ops:
            if kind not in ("put", "remove"):
                raise InvalidArgument(f"ops: unknown registry op {kind!r}")
            if kind == "put" and not isinstance(record, bytes):
                raise InvalidArgument("ops: a put needs a bytes record")
            if not isinstance(name, str) or not isinstance(bucket_key, str):
                raise InvalidArgument("ops: name and bucket_key must be str")
        if ops:
            self.change("registry", ops=[list(op) for op in ops])

    def check_partition(self, topic: str, partition: int) -> None:
        n = self.partitions(topic)
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < n:
            raise InvalidArgument(
                f"partition: topic {topic!r} has partitions 0..{n - 1}, got {partition!r}"
            )


def merged_progress(done: dict[str, Any], sources: list[str], runs: list[int], key: str) -> None:
    """Carry a subscription's progress through the ``sources`` of a merge (``runs``: how
    many runs each holds) over to the merged bucket ``key``, in place: one number per run
    (-1: finished), or -1 when every run is finished. A source it never reported starts at
    its first segment."""
    if not any(k in done for k in sources):
        return
    per_run: list[int] = []
    for src, n in zip(sources, runs, strict=True):
        v = done.pop(src, 0)
        if isinstance(v, list) and len(v) == n:
            per_run += [int(x) for x in v]
        elif v == -1:
            per_run += [-1] * n
        elif n == 1 and not isinstance(v, list):
            per_run.append(int(v))
        else:
            per_run += [0] * n
    done[key] = -1 if all(x == -1 for x in per_run) else per_run


def _encode(obj: dict[str, Any]) -> bytes:
    return msgpack.packb({"v": FORMAT_VERSION} | obj, use_bin_type=True)


def _decode(data: bytes, what: str) -> dict[str, Any]:
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        raise CodecError(f"{what}: cannot decode ({exc})") from exc
    if not isinstance(raw, dict) or raw.get("v") != FORMAT_VERSION:
        raise CodecError(f"{what}: unknown format version")
    return raw


def _sub_of(key: str) -> tuple[str, str]:
    """(topic, subscription) of a ``topic/partition/subscription`` key."""
    topic, _, sub = key.rsplit("/", 2)
    return topic, sub


def _seq_of(key: str) -> int:
    """The sequence number of a journal key."""
    return int(key.rsplit("/", 1)[1])


def _apply_mark(s: dict[str, Any], a: dict[str, Any]) -> None:
    """Apply one progress record (a ``mark_delete`` journal record's arguments)."""
    s["mark_delete"][a["key"]] = a["position"]
    if a.get("log_mark") is not None:
        s["log_mark"][a["key"]] = a["log_mark"]
    if a.get("progress") is not None:
        s["progress"][a["key"]] = a["progress"]


def _progress_record(s: dict[str, Any], report: list) -> dict[str, Any] | None:
    """The journal record of a progress report (``[topic, partition, subscription,
    position, log_mark, progress]``, of a partition that exists) against state ``s``, or
    None when nothing changed."""
    topic, partition, subscription, position, log_mark, progress = report
    key = f"{topic}/{partition}/{subscription}"
    position = [int(position[0]), int(position[1])]
    log_mark = [int(log_mark[0]), int(log_mark[1])]
    progress = {
        str(k): [int(x) for x in v] if isinstance(v, (list, tuple)) else int(v)
        for k, v in progress.items()
    }
    if (
        s["mark_delete"].get(key) != position
        or s["log_mark"].get(key) != log_mark
        or s["progress"].get(key, {}) != progress
    ):
        return {"key": key, "position": position, "log_mark": log_mark, "progress": progress}
    return None
