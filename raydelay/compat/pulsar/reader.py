"""Pulsar's reader: a topic read in log order with no subscription, over
:class:`raydelay.client.reader.Reader`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from raydelay.compat.pulsar._checks import check_type
from raydelay.compat.pulsar._endpoint import Endpoint, last_id, seek_target, wrap_message
from raydelay.compat.pulsar._topics import TopicMap
from raydelay.compat.pulsar.exceptions import AlreadyClosed, Timeout
from raydelay.compat.pulsar.message import Message, MessageId
from raydelay.compat.pulsar.schema import BytesSchema
from raydelay.errors import InvalidArgument

log = logging.getLogger(__name__)


class Reader(Endpoint):
    """Reads a topic in log order with no subscription (Pulsar's reader), over
    :class:`raydelay.client.reader.Reader`; it ignores deliver_at."""

    def __init__(
        self,
        topics: TopicMap,
        core: Any,
        topic_name: str,
        partitions: int,
        name: str,
        inclusive: bool = False,
    ) -> None:
        self._topics, self._core, self._inclusive = topics, core, inclusive
        self._topic_name, self._partitions, self._name = topic_name, partitions, name
        self._closed = False
        self._listener: threading.Thread | None = None

    _what = "reader"

    def reader_name(self) -> str:
        return self._name

    def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; waits up to ``timeout_millis`` (None: until one comes) and
        raises :class:`Timeout` when none came."""
        self._check_open()
        if timeout_millis is not None:
            check_type(int, timeout_millis, "timeout_millis")
            if timeout_millis < 0:
                raise ValueError(f"timeout_millis: must be >= 0, got {timeout_millis}")
        m = self._core.read_next(None if timeout_millis is None else timeout_millis / 1000)
        if m is None:
            raise Timeout(f"no message within {timeout_millis} ms")
        return wrap_message(self._topics, m, BytesSchema(), self._topic_name, self._partitions)

    def has_message_available(self) -> bool:
        self._check_open()
        return self._core.has_message_available()

    def seek(self, messageid: Any) -> None:
        """Read from elsewhere: a message id (the message after it, or it for a reader
        made with ``start_message_id_inclusive``), ``MessageId.earliest`` /
        ``MessageId.latest``, or a publish time (epoch ms)."""
        self._check_open()
        target = seek_target(self._core.topic, messageid)
        try:
            self._core.seek(target, inclusive=self._inclusive)
        except InvalidArgument as exc:
            raise ValueError(str(exc)) from None

    def get_last_message_id(self) -> MessageId:
        self._check_open()
        return last_id(self._core)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._core.close()

    def _start_listener(self, listener: Callable[[Reader, Message], None]) -> None:
        def run() -> None:
            while not self._closed:
                try:
                    m = self.read_next(500)
                except (Timeout, AlreadyClosed, InvalidArgument):
                    continue
                try:
                    listener(self, m)
                except Exception:  # noqa: BLE001 - a user's listener must not stop it
                    log.exception("reader listener failed")

        self._listener = threading.Thread(target=run, name="pulsar-reader", daemon=True)
        self._listener.start()
