"""Calls that many subscription units of one process would make alike, made once.

A subscription host serves many subscriptions of the same topics. Caught up at a
partition's tail, they read it from the same position with the same bounds, and ask its
unsealed index the same due query. Each such call is made once between them
(:data:`SHARED`): a reader asking what another asks already waits for that call's answer
instead of making its own. The answer is read-only (log objects are views of shared
memory), so it goes to each of them alike. A call also ends for all its askers alike: a
failure is each one's to retry, and an asker that stops waiting (its unit closed) does not
end the call for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SharedCalls:
    """The shared calls under way in this process, by key (see the module docstring)."""

    def __init__(self) -> None:
        self._calls: dict[tuple, asyncio.Future[Any]] = {}
        self.joined = 0  # calls answered by another's call (for the tests and stats)

    async def call(self, key: tuple, make: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """``await make(*args)``, unless a call of ``key`` is under way on this event loop:
        then its answer (or its error)."""
        key = (id(asyncio.get_running_loop()), *key)
        call = self._calls.get(key)
        if call is None:
            call = asyncio.ensure_future(make(*args))
            self._calls[key] = call
            call.add_done_callback(lambda done: self._forget(key, done))
        else:
            self.joined += 1
        return await asyncio.shield(call)

    def _forget(self, key: tuple, call: asyncio.Future[Any]) -> None:
        if self._calls.get(key) is call:
            del self._calls[key]
        if not call.cancelled():
            call.exception()  # (retrieved: a failure no asker waited for is not logged)

    def __len__(self) -> int:
        return len(self._calls)


SHARED = SharedCalls()
