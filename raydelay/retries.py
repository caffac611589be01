"""How a retried step judges and reports its failures (no Ray here: the log uses it too)."""

from __future__ import annotations

import logging
import time

from raydelay.errors import StorageError, Unavailable


def is_transient(exc: BaseException) -> bool:
    """Whether an error may go away on its own: an actor dead or restarting (or its name
    not registered again yet), or a retriable store failure."""
    if isinstance(exc, StorageError):
        return exc.retriable
    if isinstance(exc, Unavailable):
        return True
    return type(exc) is ValueError and "Failed to look up actor" in str(exc)


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
