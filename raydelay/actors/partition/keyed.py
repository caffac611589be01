"""Keyed sends and cancels by key on a partition's host: the key is a scheduled message's
identity within its topic.

A send whose message has a key and falls due later asks the partition's key index
(:class:`raydelay.log.keys.KeyIndex`) for a message with that key still pending, and reads
the candidate rows to be sure (a fingerprint is only a hint). What it does about one it
finds is the caller's ``on_duplicate``:

- ``"ignore"``: the message is not written; its id is the pending one's;
- ``"replace"``: the message is written, and a cancel marker for the pending one with it,
  in the same group commit (the caller then applies the markers in the subscriptions);
- ``"error"``: :class:`~raydelay.errors.KeyPending`, and nothing of the batch is written;
- ``"allow"``: no check (the keys only route), as a plain append.

Keyed calls of one partition run one at a time (check, write, index), so two sends of one
key never both find it free. A message is pending until ``subscription.handout_ahead_ms``
before its due time: from then on a consumer may hold it (handed out ahead, returned at its
instant), and a cancel could no longer keep it from being delivered. So a replace, a cancel
by key or an ``ignore`` in that last stretch finds the key free, as after its delivery. A batch re-sent with its sequence id (a lost reply) is
answered from what the first attempt wrote: the rows at its recorded positions.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from raydelay.actors.partition.context import PartitionContext
from raydelay.actors.partition.reads import LogReads
from raydelay.clock import now_ms
from raydelay.errors import InvalidArgument, KeyPending
from raydelay.log.entries import NO_CANCEL, NO_DELAY, AppendBatch, Entries, Rows
from raydelay.log.keys import check_on_duplicate
from raydelay.positions import key_of, position_of

Position = tuple[int, int]


@dataclass
class KeyedReply:
    """What a keyed append answers: each input message's position (its own, or the
    pending one's it was ignored for), and the (target, marker) pairs of the messages it
    replaced, for the subscriptions."""

    positions: list[Position]
    replaced: list[tuple[Position, Position]] = field(default_factory=list)
    written: int = 0


class KeyedAppends:
    """The keyed calls of one partition (see the module docstring). ``queue(batch)`` puts
    a batch in the partition's next group commit and returns the future of its position
    ranges."""

    def __init__(self, ctx: PartitionContext, reads: LogReads, queue) -> None:
        self._ctx = ctx
        self._log = ctx.log
        self._reads = reads
        self._queue = queue
        self._lock = asyncio.Lock()
        self._ahead_ms = ctx.config.subscription.handout_ahead_ms

    def _horizon(self) -> int:
        """Messages due by this time (epoch ms) are no longer pending: a consumer may hold
        them already (see the module docstring)."""
        return now_ms() + self._ahead_ms

    async def pending(self, keys: list[str], now: int) -> dict[str, list[int]]:
        """The positions (keys) of messages still pending under each of ``keys``: the
        index's candidates, checked against their rows."""
        wanted = self._log.keys.candidates_of(list(dict.fromkeys(keys)), now)
        every = sorted({p for ps in wanted.values() for p in ps})
        if not every:
            return {}
        rows = await self._reads.key_rows(np.array(every, dtype=np.int64))
        found: dict[str, list[int]] = {}
        texts, due = rows.keys, rows.deliver_at_ms
        for i, pos in enumerate(rows.positions.tolist()):
            k = texts[i]
            if k in wanted and due[i] > now and pos in wanted[k]:
                found.setdefault(k, []).append(pos)
        return {k: sorted(ps) for k, ps in found.items()}

    async def append(self, batch: AppendBatch, on_duplicate: str) -> KeyedReply:
        check_on_duplicate(on_duplicate)
        if on_duplicate == "allow":  # (no check: the keys only route)
            ranges = await self._queue(batch)
            return KeyedReply(
                [(lg, f + j) for lg, f, c in ranges for j in range(c)], [], len(batch.entries)
            )
        async with self._lock:
            known = await self._recorded(batch.producer, batch.sequence_id)
            if known is not None:
                return await self._again(batch, known)
            return await self._first(batch, on_duplicate)

    async def _recorded(self, producer: str, sequence_id: int) -> list[int] | None:
        """The position keys of the batch ``sequence_id`` of ``producer`` if the log holds
        it (None: never written, or not named)."""
        if not (producer and sequence_id):
            return None
        known = await self._ctx.threads.run(self._log.recorded, producer, int(sequence_id))
        return (
            None if known is None else [key_of(lg, f + i) for lg, f, c in known for i in range(c)]
        )

    async def _first(self, batch: AppendBatch, on_duplicate: str) -> KeyedReply:
        entries = batch.entries
        n = len(entries)
        keys = entries.keys or [None] * n
        due = entries.deliver_at_ms
        now = self._horizon()
        held = {i: k for i, k in enumerate(keys) if k is not None and due[i] > now}
        scheduled = list(held)
        pending = await self.pending(list(held.values()), now) if held else {}
        answer: list[int | tuple[str, int]] = list(range(n))  # input -> own index, or pending
        write = [True] * n
        olds: list[int] = []
        taken: dict[str, int] = {}  # key -> the input of this batch that holds it
        for i in scheduled:
            k = held[i]
            before = taken.get(k)
            there = pending.get(k, [])
            if before is None and not there:
                taken[k] = i
                continue
            if on_duplicate == "error":
                which = f"message {i} of the batch has key {k!r}, which" if n > 1 else f"{k!r}"
                raise KeyPending(
                    f"key: {which} is held by a message still scheduled in this topic "
                    "(on_duplicate='error'); nothing was written"
                )
            if on_duplicate == "ignore":
                write[i] = False
                answer[i] = before if before is not None else ("pos", there[0])
                continue
            # replace: the newest send wins, the one of this batch before it is not written
            if before is not None:
                write[before] = False
                answer[before] = i
            else:
                olds.extend(there)
                pending.pop(k, None)
            taken[k] = i
        idx = [i for i in range(n) if write[i]]
        markers = len(olds)
        written: list[int] = []
        if idx or markers:
            parts = [entries.take(idx).batch] if idx else []
            if markers:
                cancels = {j: position_of(t) for j, t in enumerate(olds)}
                parts.append(
                    Entries.build(
                        [b""] * markers, np.full(markers, NO_DELAY, dtype=np.int64),
                        cancels=cancels,
                    ).batch
                )  # fmt: skip
            out = Entries(pa.concat_batches(parts)) if len(parts) > 1 else Entries(parts[0])
            ranges = await self._queue(AppendBatch(batch.producer, batch.sequence_id, out))
            written = [key_of(lg, f + j) for lg, f, c in ranges for j in range(c)]
        own = dict(zip(idx, written[: len(idx)], strict=True))

        def resolve(a: int | tuple[str, int]) -> int:
            while isinstance(a, int) and a not in own:
                a = answer[a]  # (an input not written answers what replaced it)
            return a[1] if isinstance(a, tuple) else own[a]

        return KeyedReply(
            [position_of(resolve(answer[i])) for i in range(n)],
            [
                (position_of(t), position_of(m))
                for t, m in zip(olds, written[len(idx) :], strict=True)
            ],
            len(idx),
        )

    async def _again(self, batch: AppendBatch, known: list[int]) -> KeyedReply:
        """The reply to a batch re-sent after its first attempt was written: the messages
        it wrote are the rows at ``known`` (in input order, the replaced' markers after
        them); an input that has no row of its own there was not written, and answers the
        message pending under its key."""
        rows = Rows.from_batch(await self._reads.read_positions(np.array(known, dtype=np.int64)))
        targets = rows.entries.cancel_targets
        mine = np.flatnonzero(targets == NO_CANCEL)
        marks = np.flatnonzero(targets != NO_CANCEL)
        row_keys = rows.entries.batch.column(2).to_pylist()
        row_due = rows.entries.deliver_at_ms
        entries = batch.entries
        n = len(entries)
        keys = entries.keys or [None] * n
        due = entries.deliver_at_ms
        out: list[int | None] = [None] * n
        j = 0
        for i in range(n):
            if j < len(mine):
                r = int(mine[j])
                if row_keys[r] == keys[i] and int(row_due[r]) == int(due[i]):
                    out[i] = int(rows.positions[r])
                    j += 1
        missing = {i: k for i, k in enumerate(keys) if out[i] is None and k is not None}
        pending = await self.pending(list(missing.values()), self._horizon()) if missing else {}
        found: list[int] = []
        for i in range(n):
            at = out[i]
            if at is None:
                there = pending.get(missing[i], []) if i in missing else []
                if not there:
                    raise InvalidArgument(
                        f"batch: sequence id {batch.sequence_id} of producer {batch.producer!r} "
                        "was written with other messages than these"
                    )
                at = there[0]
            found.append(at)
        replaced = [
            (position_of(int(targets[r])), position_of(int(rows.positions[r]))) for r in marks
        ]
        return KeyedReply([position_of(p) for p in found], replaced, len(mine))

    async def cancel(self, keys: list[str], producer: str, sequence_id: int) -> list[list]:
        """Cancel markers for every message pending under each of ``keys``; per key, its
        [(target, marker)] (empty: none was pending). A retry (same producer and sequence
        id) gets the markers the first attempt wrote."""
        async with self._lock:
            known = await self._recorded(producer, sequence_id)
            if known is not None:
                return await self._cancelled_again(keys, known)
            pending = await self.pending(keys, self._horizon())
            pairs = [(k, t) for k in dict.fromkeys(keys) for t in pending.get(k, [])]
            if not pairs:
                return [[] for _ in keys]
            m = len(pairs)
            markers = Entries.build(
                [b""] * m,
                np.full(m, NO_DELAY, dtype=np.int64),
                cancels={j: position_of(t) for j, (_, t) in enumerate(pairs)},
            )
            ranges = await self._queue(AppendBatch(producer, sequence_id, markers))
            written = [key_of(lg, f + j) for lg, f, c in ranges for j in range(c)]
            by_key: dict[str, list] = {}
            for (k, t), w in zip(pairs, written, strict=True):
                by_key.setdefault(k, []).append((position_of(t), position_of(w)))
            return [by_key.get(k, []) for k in keys]

    async def _cancelled_again(self, keys: list[str], known: list[int]) -> list[list]:
        rows = Rows.from_batch(await self._reads.read_positions(np.array(known, dtype=np.int64)))
        targets = rows.entries.cancel_targets
        hit = Rows.from_batch(
            await self._reads.read_positions(np.sort(targets[targets != NO_CANCEL]))
        )
        key_at = dict(
            zip(hit.positions.tolist(), hit.entries.batch.column(2).to_pylist(), strict=True)
        )
        by_key: dict[str, list] = {}
        for r in range(len(rows)):
            t = int(targets[r])
            if t != NO_CANCEL and key_at.get(t) is not None:
                by_key.setdefault(key_at[t], []).append(
                    (position_of(t), position_of(int(rows.positions[r])))
                )
        return [by_key.get(k, []) for k in keys]
