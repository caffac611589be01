"""The sends a producer queues for one go (a *round*) and their futures.

``send_async`` adds a message to the open round: five column appends and a small future.
The producer's flusher takes the round whole, sends it as one batch per partition, and
resolves the round once: every future reads its outcome from the round it belongs to (its
MessageId is made when asked for; most never are). Resolving 20,000 futures one by one,
each with its own state, was a fifth of what a ``send_async`` cost.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, PENDING
from typing import Any

import numpy as np

from raydelay.client.message import MessageIds

log = logging.getLogger(__name__)


class Round:
    """One round of queued sends: their columns, and the state their futures share."""

    __slots__ = (
        "condition", "parts", "payloads", "keys", "props", "ats", "any_keys", "any_props",
        "state", "ids", "error", "failed", "waiters", "callbacks",
    )  # fmt: skip

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.parts: list[int] = []
        self.payloads: list[bytes] = []
        self.keys: list[str | None] = []
        self.props: list[dict[str, str] | None] = []
        self.ats: list[int] = []
        self.any_keys = self.any_props = False
        self.state = PENDING
        self.ids: MessageIds | None = None
        self.error: BaseException | None = None  # the whole round's
        self.failed: dict[int, BaseException] = {}  # a partition's
        # only futures somebody waits on or set a callback for have an entry
        self.waiters: dict[SendFuture, list[Any]] = {}
        self.callbacks: dict[SendFuture, list[Any]] = {}

    def __len__(self) -> int:
        return len(self.parts)

    def add(
        self, partition: int, payload: bytes, key: str | None, props: dict | None, at: int
    ) -> SendFuture:
        """Queue one checked send; its future."""
        fut = SendFuture(self, len(self.parts))
        self.parts.append(partition)
        self.payloads.append(payload)
        self.keys.append(key)
        self.props.append(props)
        self.ats.append(at)
        if key is not None:
            self.any_keys = True
        if props is not None:
            self.any_props = True
        return fut

    def columns(self) -> tuple[np.ndarray, list[bytes], list | None, list | None, np.ndarray]:
        """(partitions, payloads, keys or None when none has one, properties likewise,
        deliver_at ms): what ``Producer.submit`` takes."""
        return (
            np.array(self.parts, dtype=np.int64),
            self.payloads,
            self.keys if self.any_keys else None,
            self.props if self.any_props else None,
            np.array(self.ats, dtype=np.int64),
        )

    def resolve(
        self,
        ids: MessageIds | None = None,
        failed: dict[int, BaseException] | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Resolve every future of the round at once: ``error`` for all, or the ``ids`` of
        the messages with the error of each partition in ``failed``. Waiters are woken once
        all are done, then the done-callbacks run (as ``Future`` does one by one)."""
        with self.condition:
            self.ids, self.failed, self.error = ids, failed or {}, error
            self.state = FINISHED
            for fut, waiters in self.waiters.items():
                failure = fut._exception
                for waiter in waiters:
                    if failure is None:
                        waiter.add_result(fut)
                    else:
                        waiter.add_exception(fut)
            self.condition.notify_all()
        for fut, callbacks in list(self.callbacks.items()):
            for callback in callbacks:
                try:
                    callback(fut)
                except Exception:  # (as Future does: a callback's error is logged, not raised)
                    log.exception("a done-callback of %r failed", fut)


class SendFuture(Future):
    """The ``concurrent.futures.Future`` of one ``send_async``: a place in its round, whose
    state it reads (see the module docstring). A queued send cannot be taken back:
    :meth:`cancel` returns False (cancel the message itself with ``Producer.cancel``)."""

    def __init__(self, round_: Round, at: int) -> None:  # (no Future.__init__: see the class)
        self._round = round_
        self._at = at

    # Future's own methods and concurrent.futures.wait / as_completed use these fields.
    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        return self._round.condition

    @property
    def _state(self) -> str:  # type: ignore[override]
        return self._round.state

    @property
    def _waiters(self) -> list[Any]:  # type: ignore[override]
        return self._round.waiters.setdefault(self, [])

    @property
    def _done_callbacks(self) -> list[Any]:
        return self._round.callbacks.setdefault(self, [])

    @property
    def _exception(self) -> BaseException | None:  # type: ignore[override]
        r = self._round
        if r.error is not None or not r.failed:
            return r.error
        return r.failed.get(r.parts[self._at])

    @property
    def _result(self) -> Any:  # type: ignore[override]
        ids = self._round.ids
        return None if ids is None or self._exception is not None else ids[self._at]

    def cancel(self) -> bool:
        return False

    def set_result(self, result: Any) -> None:
        raise RuntimeError("a send's future is resolved by its producer")

    set_exception = set_result  # type: ignore[assignment]

    def set_running_or_notify_cancel(self) -> bool:
        raise RuntimeError("a send's future is resolved by its producer")
