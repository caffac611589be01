"""In-process fakes of ``raydelay.client.links`` (no Ray): a Producer or a Consumer runs
against them in unit tests, as Ray Serve tests its managers against fake handles."""

from __future__ import annotations

from collections import defaultdict
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa

from raydelay.actors.partition.keyed import KeyedReply
from raydelay.actors.protocol import ReceiveReply
from raydelay.dispatch.wire import DELIVERY_SCHEMA, pack_delivery
from raydelay.errors import KeyPending, Unavailable
from raydelay.log.entries import AppendBatch, decode_batch, encode_batch
from raydelay.positions import position_keys


class Reply:
    """An answered call: its value, or the error it raised."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


class FakeLink:
    """The waiting side of a link. ``down`` holds the partitions whose calls fail with
    Unavailable (until ``reconnect`` brings them back, when ``comes_back``)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.deadline_s = 5.0
        self.down: set[int] = set()
        self.comes_back = True
        self.reconnects: list[int] = []
        self.calls: list[tuple[str, int, Any]] = []  # (method, partition, args)

    def _call(self, method: str, partition: int, *args: Any) -> Reply:
        self.calls.append((method, partition, args))
        if partition in self.down:
            return Reply(error=Unavailable(f"partition {partition} is down"))
        try:
            return Reply(getattr(self, f"_{method}")(partition, *args))
        except Exception as exc:  # noqa: BLE001 - handed back as the call's error
            return Reply(error=exc)

    def ready(self, replies, num, timeout_s):
        replies = list(replies)
        if len({id(r) for r in replies}) != len(replies):  # as ray.wait
            raise ValueError("Wait requires a list of unique ray_waitables.")
        return replies  # every fake call has answered

    def future(self, reply):
        done = Future()  # every fake call has answered
        if reply.error is not None:
            done.set_exception(reply.error)
        else:
            done.set_result(reply.value)
        return done

    def get(self, replies, what, timeout_s=None):
        if isinstance(replies, list):
            return [self.get(r, what) for r in replies]
        if replies.error is not None:
            raise replies.error
        return replies.value

    def retried(self, submit, what, *, partition=None, deadline_s=None, timeout_s=None):
        for _ in range(3):
            try:
                return self.get(submit(), what)
            except Unavailable:
                if partition is not None:
                    self.reconnect(partition)
        raise Unavailable(f"{what}: still down")

    def reconnect(self, partition: int) -> None:
        self.reconnects.append(partition)
        if self.comes_back:
            self.down.discard(partition)
        else:
            raise Unavailable(f"partition {partition}: cannot look it up")

    def connected(self) -> bool:
        return True


class FakeTopic(FakeLink):
    """A topic whose partitions append in memory, one ledger each, and deduplicate by
    (producer, sequence id) as the real log does."""

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self.payloads: dict[int, list[bytes]] = defaultdict(list)
        self.keys: dict[int, list[str | None]] = defaultdict(list)
        self.seen: dict[int, dict[tuple[str, int], list]] = defaultdict(dict)

    def append(self, partition, batches):
        return self._call("append", partition, batches)

    def last_sequence(self, partition, producer):
        return self._call("last_sequence", partition, producer)

    def cancel(self, batches, producer):
        return {p: [True] * len(positions) for p, (positions, _) in batches.items()}, 0

    def check_cancel(self, targets):
        self.checked = getattr(self, "checked", []) + [targets]

    def _append(self, partition, batches):
        out = []
        for data in batches:
            batch = decode_batch(data)
            known = self.seen[partition].get((batch.producer, batch.sequence_id))
            if known is None:  # a batch sent again after a failure is not appended twice
                first = len(self.payloads[partition])
                payloads = batch.entries.batch.column(0).to_pylist()
                self.payloads[partition].extend(payloads)
                self.keys[partition].extend(batch.entries.batch.column("key").to_pylist())
                known = [(partition, first, len(payloads))]  # (ledger, first entry, count)
                self.seen[partition][(batch.producer, batch.sequence_id)] = known
            out.append(known)
        return out

    def append_keyed(self, partition, data, on_duplicate):
        return self._call("append_keyed", partition, data, on_duplicate)

    def guard_keys(self, keys):
        return None

    def cancel_keys(self, partition, keys, producer, sequence_id):
        return self._call("cancel_keys", partition, keys)

    def pending_keys(self, partition, keys):
        return self._call("pending_keys", partition, keys)

    def subscriptions_ahead(self):
        self.calls.append(("subscriptions", -1, ()))
        return self.listed

    def listed(self) -> list[str]:
        """The getter :meth:`subscriptions_ahead` gives (a fake topic's one subscription)."""
        return ["s"]

    def apply(self, work, subscriptions=None):
        self.applied = getattr(self, "applied", []) + [work]
        self.applied_with = getattr(self, "applied_with", []) + [subscriptions]
        return {p: [True] * len(targets) for p, (targets, _) in work.items()}

    def _pending(self, partition):
        """key -> entry of the message pending under it (a fake's: kept until cancelled)."""
        if not hasattr(self, "pending"):
            self.pending = defaultdict(dict)
        return self.pending[partition]

    def _append_keyed(self, partition, data, on_duplicate):
        """As a host's keyed append (one batch at a time), over :meth:`_append`."""
        batch = decode_batch(data)
        keys = batch.entries.batch.column("key").to_pylist()
        pending = self._pending(partition)
        for k in keys:
            if k in pending and on_duplicate == "error":
                raise KeyPending(f"key: {k!r} is held by a message still scheduled")
        positions, replaced = [], []
        for i, k in enumerate(keys):
            if k in pending and on_duplicate == "ignore":
                positions.append((partition, pending[k]))
                continue
            one = AppendBatch(batch.producer, batch.sequence_id * 10_000 + i,
                              batch.entries.slice(i, i + 1))  # fmt: skip
            ((lg, first, _),) = self._append(partition, [encode_batch(one)])[0]
            if k in pending:
                replaced.append(((partition, pending[k]), (partition, first)))
            if k is not None:
                pending[k] = first
            positions.append((lg, first))
        return KeyedReply(positions, replaced, len(positions))

    def _cancel_keys(self, partition, keys):
        pending = self._pending(partition)
        out = []
        for k in keys:
            entry = pending.pop(k, None)
            marker = (partition, 1_000_000 + (entry or 0))  # (a marker of its own per target)
            out.append([] if entry is None else [((partition, entry), marker)])
        return out

    def _pending_keys(self, partition, keys):
        pending = self._pending(partition)
        return {k: [pending[k]] for k in keys if k in pending}

    def _last_sequence(self, partition, producer):
        return max((s for name, s in self.seen[partition] if name == producer), default=0)


class FakeSubscription(FakeLink):
    """A subscription whose partitions hand out what ``publish`` put there and record
    what was acked and nacked."""

    def __init__(self, partitions: int, actors: int | None = None) -> None:
        super().__init__(partitions)
        # partition p is served by actor p % actors (one actor per partition by default)
        self.actors = partitions if actors is None else actors
        self.waiting: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        self.acked: dict[int, set[int]] = defaultdict(set)
        self.nacked: dict[int, list[int]] = defaultdict(list)
        self.nacks: list[tuple[int, float, int]] = []  # (partition, delay_s, nacked_at_ms)
        self.consumers: dict[int, set[str]] = defaultdict(set)
        self.nodes: dict[str, str] = {}  # actor name -> its node (tests set it)
        self.moves: dict[str, str] = {}  # actor name -> the node a reconnect re-creates it on

    def publish(self, partition: int, *payloads: bytes) -> None:
        start = len(self.waiting[partition]) + len(self.acked[partition])
        self.waiting[partition].extend((start + i, p) for i, p in enumerate(payloads))

    def receive(self, partition, consumer, max_messages, timeout_s, rewinds):
        return self._call("receive", partition, consumer, max_messages)

    def receive_many(
        self, partitions, consumer, max_messages, timeout_s, rewinds, packed=False, ahead_ms=0
    ):
        """As the actor's: what each partition has (packed as asked), and each one's error;
        the whole call fails (Unavailable) only when every partition asked is down (the
        actor is)."""
        assert len({p % self.actors for p in partitions}) == 1, "one actor's partitions"
        self.calls.append(("receive_many", partitions[0], (tuple(partitions),)))
        if all(p in self.down for p in partitions):
            return Reply(error=Unavailable(f"partitions {partitions} are down"))
        got, failed = [], []
        for p in partitions:
            one = self._call("receive", p, consumer, max_messages)
            self.calls.pop()  # (counted as the one call above)
            if one.error is not None:
                failed.append((p, one.error))
            elif one.value.num_rows:
                got.append((p, pack_delivery(one.value) if packed else one.value))
        return Reply(ReceiveReply(got, failed))

    def ack(self, partition, consumer, keys):
        return self._call("ack", partition, keys)

    def ack_many(self, acks, consumer, nack=None):
        """As the actor's: each partition's ack (or nack), and the errors of those that
        failed; the whole call fails only when every partition is down."""
        parts = [p for p, _ in acks]
        assert len({p % self.actors for p in parts}) == 1, "one actor's partitions"
        self.calls.append(("ack_many" if nack is None else "nack_many", parts[0], (tuple(parts),)))
        if all(p in self.down for p in parts):
            return Reply(error=Unavailable(f"partitions {parts} are down"))
        failed = {}
        for p, keys in acks:
            if nack is not None:
                self.nacks.append((p, *nack))
            one = self._call("ack" if nack is None else "nack", p, keys)
            self.calls.pop()  # (counted as the one call above)
            if one.error is not None:
                failed[p] = one.error
        return Reply(failed)

    def nack(self, partition, consumer, keys, delay_s, nacked_at_ms):
        self.nacks.append((partition, delay_s, nacked_at_ms))
        return self._call("nack", partition, keys)

    def heartbeat_groups(self):
        return [list(range(a, self.partitions, self.actors)) for a in range(self.actors)]

    def reconnect(self, partition: int) -> None:
        super().reconnect(partition)
        actor = self.actor_of(partition)
        self.down -= {q for q in range(self.partitions) if self.actor_of(q) == actor}
        if actor in self.moves:
            self.nodes[actor] = self.moves.pop(actor)

    def actor_of(self, partition):
        return f"sub/t/s/{partition % self.actors}"

    def node_of(self, partition):
        return self.nodes.get(self.actor_of(partition))

    def heartbeat(self, partitions, consumer):
        return self._call("heartbeat", partitions[0])

    def add_consumer(self, partition, consumer):
        return self._call("add_consumer", partition, consumer)

    def remove_consumer(self, partition, consumer):
        return self._call("remove_consumer", partition, consumer)

    def redeliver(self, partition, consumer, keys, rewinds=0, check_only=False):
        return self._call("redeliver", partition)

    def _receive(self, partition, consumer, max_messages):
        taken = self.waiting[partition][:max_messages]
        del self.waiting[partition][:max_messages]
        entries = np.array([e for e, _ in taken], dtype=np.int64)
        n = len(taken)
        return pa.RecordBatch.from_pydict(
            {
                "ledger_id": np.full(n, 1, np.int64),
                "entry_id": entries,
                "publish_time_ms": np.zeros(n, np.int64),
                "deliver_at_ms": np.full(n, -1, np.int64),
                "redelivery_count": np.zeros(n, np.int64),
                "payload": [p for _, p in taken],
                "key": [None] * n,
                "properties": [None] * n,
            },
            schema=DELIVERY_SCHEMA,
        )

    def _ack(self, partition, keys):
        self.acked[partition].update(int(k) for k in keys)

    def _nack(self, partition, keys):
        self.nacked[partition].extend(int(k) for k in keys)

    def _heartbeat(self, partition):
        return [True]

    def _add_consumer(self, partition, consumer):
        self.consumers[partition].add(consumer)

    def _remove_consumer(self, partition, consumer):
        self.consumers[partition].discard(consumer)

    def _redeliver(self, partition):
        return 0

    @staticmethod
    def key(entry: int) -> int:
        """The position key of entry ``entry`` of ledger 1 (what the consumer acks)."""
        return int(position_keys(np.array([1]), np.array([entry]))[0])
