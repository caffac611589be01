"""Handles to raydelay's named actors that outlive the actor behind them.

A Ray handle is bound to one actor. Ray restarts a crashed actor behind the same
handle, but an actor that ended for good (its node was lost, or its constructor
failed during a restart) leaves its handles dead, and every call on them fails.
A :class:`Peer` holds the current handle to one named actor; after a call found the
actor unavailable, the next use looks the name up again and, when there is no such
actor any more, re-creates it (``raydelay.cluster.placement`` chooses its node and
the new actor recovers from the store). Every actor-to-actor and client-to-actor
handle goes through one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayError

from raydelay.cluster import placement, rpc
from raydelay.cluster.names import COORDINATOR, topic_actor_name
from raydelay.errors import Unavailable

log = logging.getLogger(__name__)


class Peer:
    """One named actor: ``create()`` returns a handle to it, creating it when it does not
    exist (``get_if_exists``)."""

    def __init__(
        self, name: str, create: Callable[[], Any], what: str | None = None, handle: Any = None
    ) -> None:
        self.name = name
        self.what = what or name
        self._create = create
        self._handle: Any = handle
        self._lock = threading.Lock()
        self.re_resolved = 0  # how many times a lost handle was looked up again

    @property
    def handle(self) -> Any:
        h = self._handle
        if h is None:
            with self._lock:
                if self._handle is None:
                    try:
                        self._handle = placement.lookup_or_none(self.name) or self._create()
                    except (RayError, ValueError) as exc:  # Ray's control service in trouble
                        raise Unavailable(f"{self.what}: cannot look it up: {exc}") from None
                h = self._handle
        return h

    def lost(self) -> None:
        """A call found the actor unavailable: the next use looks it up again."""
        with self._lock:
            if self._handle is not None:
                self._handle = None
                self.re_resolved += 1

    def remote(self, method: str, *args: Any) -> Any:
        """Submit one call (an ObjectRef); a failure to submit marks the handle lost."""
        try:
            return getattr(self.handle, method).remote(*args)
        except Exception:
            self.lost()
            raise

    def call(
        self, method: str, *args: Any, deadline_s: float, wait: Any = None, sleep=time.sleep
    ) -> Any:
        """A blocking call, retried (with the handle looked up again) while the actor is
        unavailable or the store fails retriably, for up to ``deadline_s``. Only for
        idempotent calls."""
        return rpc.call(
            lambda: self.remote(method, *args),
            what=self.what,
            deadline_s=deadline_s,
            sleep=sleep,
            wait=wait,
            on_failure=self.lost,
        )

    def call_from_thread(self, method: str, *args: Any, deadline_s: float) -> Any:
        """:meth:`call` from a thread of an async actor (not its event loop's)."""
        return self.call(method, *args, deadline_s=deadline_s, wait=rpc.get_blocking)

    async def once(self, method: str, *args: Any) -> Any:
        """One call from an async actor; an unavailable actor marks the handle lost (and
        the error is raised for the caller's own retry loop)."""
        if self._handle is None:  # looking up (or creating) asks Ray's control service:
            await asyncio.to_thread(lambda: self.handle)  # never on the event loop
        try:
            return await rpc.wait(self.remote(method, *args), what=self.what)
        except Unavailable:
            self.lost()
            raise


def coordinator_peer(config: dict[str, Any], handle: Any = None) -> Peer:
    return Peer(COORDINATOR, lambda: placement.coordinator(config), "coordinator", handle)


def topic_peer(topic: str, partition: int, config: dict[str, Any]) -> Peer:
    return Peer(
        topic_actor_name(topic, partition),
        lambda: placement.topic_actor(topic, partition, config),
        f"topic actor {topic}/{partition}",
    )
