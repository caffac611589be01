"""Accounting of a delivery run: what was sent, cancelled and received, and what went wrong.

The one definition, shared by the demo, the end-to-end and chaos tests and the benches, of

- **lost**: sent, neither cancelled nor excused, and never received;
- **early**: a delivery received before its message's deliver_at;
- **cancelled-delivered**: a message received although its cancel was honoured;
- **duplicates**: the deliveries of a message after its first one;
- **unmarked duplicates**: those repeats whose ``redelivery_count`` is not above the first
  delivery's, so that the consumer could not tell them from the first. A subscription
  restarted twice in a row gives some: after each restart, the messages that may have
  gone out before come with a count of at least 1, not one more than they had (the counts
  of a life are not persisted, as in Pulsar);
- **silent duplicates**: those repeats with a ``redelivery_count`` of 0, nothing telling
  the consumer that they may be repeats;
- **unknown**: messages received that were never sent;
- **lateness**: receive time minus deliver_at of the first delivery of each delayed message.

Ids are any hashable value (a ``MessageId``, an order id). All times are integer
milliseconds since the epoch. Pure Python and numpy: no Ray. A bad argument raises
:class:`~raydelay.errors.InvalidArgument` naming it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Container, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from raydelay.errors import InvalidArgument

DEFAULT = ""  # the subscription of a Ledger used for one subscription


@dataclass(frozen=True)
class Delivery:
    """One message received: its id, when (``received_at_ms``, epoch ms), and the
    ``redelivery_count`` it came with."""

    id: Hashable
    received_at_ms: int
    redelivery_count: int = 0


@dataclass(frozen=True)
class Early:
    """A delivery received before its message's deliver_at (both epoch ms)."""

    id: Hashable
    deliver_at_ms: int
    received_at_ms: int


@dataclass(frozen=True)
class Lateness:
    """A summary of lateness values (receive time - deliver_at, ms): how many, p50, p99 and
    max (None when there are none), and how many were early (negative)."""

    n: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: int | None
    early: int

    @classmethod
    def of(cls, lateness_ms: Iterable[int] | np.ndarray) -> Lateness:
        """The summary of ``lateness_ms`` (any int sequence or array, in ms)."""
        a = np.asarray(
            lateness_ms if isinstance(lateness_ms, np.ndarray) else list(lateness_ms),
            dtype=np.int64,
        )
        if len(a) == 0:
            return cls(n=0, p50_ms=None, p99_ms=None, max_ms=None, early=0)
        return cls(
            n=len(a),
            p50_ms=float(np.percentile(a, 50)),
            p99_ms=float(np.percentile(a, 99)),
            max_ms=int(a.max()),
            early=int((a < 0).sum()),
        )

    def as_dict(self) -> dict[str, float | int | None]:
        """The benches' form: ``p50``, ``p99``, ``max`` (ms), ``early`` and ``n``."""
        return {
            "p50": self.p50_ms,
            "p99": self.p99_ms,
            "max": self.max_ms,
            "early": self.early,
            "n": self.n,
        }


@dataclass(frozen=True, eq=False)
class Result:
    """What one subscription got, against what was sent (see the module docstring)."""

    sent: int  # messages sent
    received: int  # deliveries, repeats included
    lost: frozenset
    early: tuple[Early, ...]  # in receive order
    cancelled_delivered: frozenset
    duplicates: int
    unmarked_duplicates: int
    silent_duplicates: int
    unknown: frozenset
    lateness_ms: np.ndarray  # first deliveries of delayed messages, in receive order

    @property
    def distinct(self) -> int:
        """How many different messages were received."""
        return self.received - self.duplicates

    @property
    def lateness(self) -> Lateness:
        return Lateness.of(self.lateness_ms)

    @property
    def ok(self) -> bool:
        """Nothing lost, early, cancelled-but-delivered, unknown or repeated unmarked."""
        return not (
            self.lost
            or self.early
            or self.cancelled_delivered
            or self.unknown
            or self.unmarked_duplicates
        )

    def counts(self) -> dict[str, int]:
        """The figures as counts: lost, early, cancelled_delivered, duplicates,
        unmarked_duplicates, silent_duplicates, unknown and received."""
        return {
            "lost": len(self.lost),
            "early": len(self.early),
            "cancelled_delivered": len(self.cancelled_delivered),
            "duplicates": self.duplicates,
            "unmarked_duplicates": self.unmarked_duplicates,
            "silent_duplicates": self.silent_duplicates,
            "unknown": len(self.unknown),
            "received": self.received,
        }


def account(
    sent: Mapping[Hashable, int | None],
    deliveries: Iterable[Delivery],
    *,
    cancelled: Collection[Hashable] = (),
    excused: Collection[Hashable] = (),
) -> Result:
    """Account for one subscription's ``deliveries`` against ``sent`` (id -> deliver_at_ms,
    None for an immediate message).

    ``cancelled``: the ids whose cancel was honoured (they must not arrive). ``excused``:
    ids that may be missing without counting as lost, for instance those of refused
    cancels in a run with restarts, where a retried cancel may answer False for one that
    did take effect. Deliveries are taken in ``received_at_ms`` order (ties: as given)."""
    ordered = sorted(deliveries, key=lambda d: d.received_at_ms)
    first_count: dict[Hashable, int] = {}
    early: list[Early] = []
    lateness: list[int] = []
    duplicates = unmarked = silent = 0
    for d in ordered:
        at = sent.get(d.id)
        if at is not None and d.received_at_ms < at:
            early.append(Early(d.id, at, d.received_at_ms))
        if d.id in first_count:
            duplicates += 1
            unmarked += d.redelivery_count <= first_count[d.id]
            silent += d.redelivery_count == 0
            continue
        first_count[d.id] = d.redelivery_count
        if at is not None:
            lateness.append(d.received_at_ms - at)
    seen = first_count.keys()
    return Result(
        sent=len(sent),
        received=len(ordered),
        lost=lost(sent, seen, cancelled=cancelled, excused=excused),
        early=tuple(early),
        cancelled_delivered=frozenset(m for m in cancelled if m in seen),
        duplicates=duplicates,
        unmarked_duplicates=unmarked,
        silent_duplicates=silent,
        unknown=frozenset(m for m in seen if m not in sent),
        lateness_ms=np.asarray(lateness, dtype=np.int64),
    )


def lost(
    sent: Iterable[Hashable],
    seen: Container[Hashable],
    *,
    cancelled: Container[Hashable] = (),
    excused: Container[Hashable] = (),
) -> frozenset:
    """The ids of ``sent`` that are neither in ``seen`` (received), ``cancelled`` (cancel
    honoured) nor ``excused`` (see :func:`account`)."""
    return frozenset(m for m in sent if m not in seen and m not in cancelled and m not in excused)


class Ledger:
    """Records a run as it goes: what was sent and cancelled, and what each subscription
    received; :meth:`result` accounts for it. Thread-safe: producers and consumer threads
    record concurrently."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: dict[Hashable, int | None] = {}
        self._cancelled: set[Hashable] = set()
        self._refused: set[Hashable] = set()
        self._deliveries: dict[str, list[Delivery]] = {}
        self._seen: dict[str, set[Hashable]] = {}
        self._live_lateness: dict[str, list[int]] = {}

    def record_sent(
        self, ids: Sequence[Hashable], deliver_at_ms: Sequence[int | None] | int | None
    ) -> None:
        """Messages sent, with their deliver_at (epoch ms; one value for all, or one per
        message; None: immediate)."""
        ats = (
            [deliver_at_ms] * len(ids)
            if deliver_at_ms is None or isinstance(deliver_at_ms, int)
            else [None if a is None else int(a) for a in deliver_at_ms]
        )
        if len(ats) != len(ids):
            raise InvalidArgument(f"deliver_at_ms: {len(ats)} values for {len(ids)} ids")
        with self._lock:
            self._sent.update(zip(ids, ats, strict=True))

    def record_cancels(self, ids: Sequence[Hashable], honoured: Sequence[bool]) -> None:
        """Cancels tried, with what each answered (True: honoured)."""
        with self._lock:
            for m, ok in zip(ids, honoured, strict=True):
                (self._cancelled if ok else self._refused).add(m)

    def record_received(
        self,
        ids: Sequence[Hashable],
        received_at_ms: int,
        redelivery_counts: Sequence[int] | None = None,
        *,
        subscription: str = DEFAULT,
    ) -> None:
        """Messages ``subscription`` received at ``received_at_ms`` (epoch ms), with their
        redelivery counts (0 for each when not given)."""
        counts = [0] * len(ids) if redelivery_counts is None else list(redelivery_counts)
        if len(counts) != len(ids):
            raise InvalidArgument(
                f"redelivery_counts: {len(counts)} redelivery counts for {len(ids)} ids"
            )
        with self._lock:
            got = self._deliveries.setdefault(subscription, [])
            got.extend(Delivery(m, received_at_ms, c) for m, c in zip(ids, counts, strict=True))
            seen = self._seen.setdefault(subscription, set())
            late = self._live_lateness.setdefault(subscription, [])
            for m in ids:
                if m not in seen:
                    seen.add(m)
                    at = self._sent.get(m)
                    if at is not None:
                        late.append(received_at_ms - at)

    @property
    def sent(self) -> int:
        with self._lock:
            return len(self._sent)

    def distinct_received(self, subscription: str = DEFAULT) -> int:
        """How many different messages ``subscription`` received so far."""
        with self._lock:
            return len(self._seen.get(subscription, ()))

    def lateness_so_far(self, subscription: str = DEFAULT) -> np.ndarray:
        """A live view for progress lines: the lateness (ms) of the first deliveries so far
        of delayed messages whose send was recorded before they arrived. :meth:`result`
        has every one."""
        with self._lock:
            return np.asarray(self._live_lateness.get(subscription, ()), dtype=np.int64)

    def missing(self, subscription: str = DEFAULT, *, excuse_refused: bool = False) -> int:
        """How many messages that must arrive have not reached ``subscription`` yet
        (``excuse_refused``: as in :meth:`result`)."""
        with self._lock:
            seen = self._seen.get(subscription, set())
            excused = self._refused if excuse_refused else set()
            return len(lost(self._sent, seen, cancelled=self._cancelled, excused=excused))

    def result(self, subscription: str = DEFAULT, *, excuse_refused: bool = False) -> Result:
        """The accounting of ``subscription``. ``excuse_refused``: a message whose cancel
        was refused may be missing without counting as lost (a run with restarts, where a
        retried cancel may answer False for one that did take effect)."""
        with self._lock:
            sent = dict(self._sent)
            deliveries = list(self._deliveries.get(subscription, ()))
            cancelled = set(self._cancelled)
            excused = set(self._refused) if excuse_refused else set()
        return account(sent, deliveries, cancelled=cancelled, excused=excused)
