"""The one retry policy: which failures are worth another try (:func:`is_transient`), how
long to wait between tries (:class:`Backoff`), how a bounded retry runs
(:func:`retry`), and how a retrying loop reports its failures (:class:`Retries`).

No Ray here: the log, the trackers and the actors all use it.

How the layers stack. A store call is retried by boto3 itself (``storage.s3.max_attempts``,
default 3, standard mode) and then by whoever called the store with this policy. Keep boto3's
budget small: its attempts multiply with ours (3 x 4 = 12 for a snapshot write, not 10 x 4).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from raydelay.errors import StorageError, Unavailable

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Whether an error may go away on its own: an actor dead or restarting (or its name
    not registered again yet), or a retriable store failure."""
    if isinstance(exc, StorageError):
        return exc.retriable
    if isinstance(exc, Unavailable):
        return True
    return type(exc) is ValueError and "Failed to look up actor" in str(exc)


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Waits between tries: ``first_s``, then doubled up to ``max_s``, each scaled by a
    random factor in [0.5, 1.5) so that many retriers do not march in step. ``attempts``
    bounds the tries (the first one included); ``-1`` means no limit."""

    first_s: float = 0.05
    max_s: float = 2.0
    attempts: int = -1

    def __post_init__(self) -> None:
        if self.first_s < 0 or self.max_s < self.first_s:
            raise ValueError("Backoff: need 0 <= first_s <= max_s")
        if self.attempts == 0 or self.attempts < -1:
            raise ValueError("Backoff.attempts: must be >= 1, or -1 for no limit")

    def delays_s(self) -> Iterator[float]:
        """The wait after each failed try, in seconds; ends when the tries are used up."""
        delay, tries = self.first_s, 1
        while self.attempts == -1 or tries < self.attempts:
            yield delay * (0.5 + random.random())
            delay, tries = min(delay * 2, self.max_s), tries + 1


# The policies in use (one shape, three budgets). Calls and recoveries wait at most 0.5 s
# (0.75 s jittered) between tries: a caller then notices within that of the actor or the
# store coming back, at the price of about two tries a second during a long outage (with
# a 2 s cap, a 10 s store outage held sends up to 3 s past its end).
PEER_CALL = Backoff(first_s=0.05, max_s=0.5)  # actor calls, bounded by a deadline instead
RECOVERY = Backoff(first_s=0.1, max_s=0.5)  # an actor's recovery: until it works
STORE_WRITE = Backoff(first_s=0.05, max_s=0.5, attempts=4)  # a tracker's snapshot write


def retry(
    fn: Callable[[], T],
    policy: Backoff,
    *,
    retriable: Callable[[BaseException], bool] | None = None,
    sleep: Callable[[float], None] | None = time.sleep,
    on_failure: Callable[[BaseException], None] | None = None,
) -> T:
    """``fn()`` until it works, retrying the failures ``retriable`` accepts (default
    :func:`is_transient`) by ``policy``; the last failure is raised when the tries are used
    up. ``sleep=None`` retries without waiting (a deterministic, inline tracker)."""
    worth_retrying = retriable or is_transient
    delays = policy.delays_s()
    while True:
        try:
            return fn()
        except Exception as exc:
            if not worth_retrying(exc):
                raise
            delay = next(delays, None)
            if delay is None:
                raise
            if on_failure is not None:
                on_failure(exc)
            if sleep is not None:
                sleep(delay)


class Retries:
    """How a loop that retries a step reports its failures: one warning line when a bout
    of transient failures starts (store or peer unavailable), one every 30 s while it
    lasts with the count so far, and one when the step works again, instead of a
    traceback per attempt. Other errors (bugs) still get their traceback."""

    EVERY_S = 30.0

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log, self.what = logger, what
        self.failures, self._since, self._said = 0, 0.0, 0.0

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if not self.failures:
            self._since = now
        self.failures += 1
        if not is_transient(exc):
            self._log.error("%s failed; retrying", self.what, exc_info=exc)
            self._said = now
        elif self.failures == 1 or now - self._said >= self.EVERY_S:
            self._log.warning(
                "%s failed (%s); retrying (%d failed attempts so far)",
                self.what,
                _first_line(exc),
                self.failures,
            )
            self._said = now

    def ok(self) -> None:
        if self.failures:
            self._log.warning(
                "%s works again, after %d failed attempts in %.1f s",
                self.what,
                self.failures,
                time.monotonic() - self._since,
            )
            self.failures = 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
