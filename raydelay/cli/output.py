"""What a ``raydelay`` command prints, for a reader or for a script, and how it exits.

- ``--json``: the command's stdout is JSON. A command that prints messages (``consume``,
  ``peek``, ``produce --ids``) prints JSON Lines, one object per message, as they come;
  every other command prints one object. Progress and summaries stay on stderr, as text.
- Payloads: ``--payload-format auto`` (the default) shows a payload as text when it is
  UTF-8 without control characters, else as base64; ``text``, ``base64`` and ``hex`` ask
  for one form. In JSON, ``payload_encoding`` names the form of ``payload``.
- The exit status says what kind of failure it was (:class:`Exit`); docs/cli.md lists them.
"""

from __future__ import annotations

import argparse
import base64
import enum
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from raydelay.errors import (
    Conflict,
    ConsumerBusy,
    InvalidArgument,
    KeyPending,
    MissingExtra,
    NotFound,
    ProducerQueueIsFull,
    RaydelayError,
    StorageError,
    StoreOwned,
    Unavailable,
)
from raydelay.jsonable import jsonable  # noqa: F401 - the commands' JSON form, here too

PAYLOAD_FORMATS = ("auto", "text", "base64", "hex")


class Exit(enum.IntEnum):
    """The ``raydelay`` command's exit statuses."""

    OK = 0
    FAILED = 1  # the command ran and found a failure (a demo that lost a message) or an error
    USAGE = 2  # bad arguments or input, or a feature whose extra is not installed
    NOT_FOUND = 3  # a topic, subscription, schedule or message that does not exist
    UNAVAILABLE = 4  # no cluster to attach to, an actor or the store out of reach: retry later
    REFUSED = 5  # the cluster said no: a cancel too late, a pending key, another cluster's store
    INTERRUPTED = 130  # Ctrl-C


_REFUSALS = (Conflict, StoreOwned, ConsumerBusy, ProducerQueueIsFull, KeyPending)


def exit_for(exc: RaydelayError) -> Exit:
    """The exit status of a command that raised ``exc``."""
    if isinstance(exc, InvalidArgument | MissingExtra):
        return Exit.USAGE
    if isinstance(exc, NotFound):
        return Exit.NOT_FOUND
    if isinstance(exc, _REFUSALS):
        return Exit.REFUSED
    if isinstance(exc, Unavailable) or (isinstance(exc, StorageError) and exc.retriable):
        return Exit.UNAVAILABLE
    return Exit.FAILED


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def emit(args: argparse.Namespace, doc: Any, text: Callable[[], str] | str) -> None:
    """Print ``doc`` as one JSON object under ``--json``, else ``text`` (or what it makes)."""
    if wants_json(args):
        print(dumps(doc))
    else:
        print(text() if callable(text) else text)


def dumps(doc: Any) -> str:
    return json.dumps(jsonable(doc), ensure_ascii=False, separators=(",", ":"))


def payload_form(payload: bytes, fmt: str) -> tuple[str, str]:
    """(the payload shown, its encoding) for ``--payload-format fmt``."""
    if fmt == "base64":
        return base64.b64encode(payload).decode("ascii"), "base64"
    if fmt == "hex":
        return payload.hex(), "hex"
    if fmt == "text":
        return payload.decode("utf-8", "replace"), "text"
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode("ascii"), "base64"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):  # would break a line, or a terminal
        return base64.b64encode(payload).decode("ascii"), "base64"
    return text, "text"


def _due_text(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def message_doc(m: Any, fmt: str) -> dict[str, Any]:
    """One message as a JSON object."""
    shown, encoding = payload_form(m.payload, fmt)
    return {
        "message_id": str(m.message_id),
        "deliver_at": _due_text(m.deliver_at_ms),
        "deliver_at_ms": m.deliver_at_ms,
        "key": m.key,
        "properties": dict(m.properties or {}),
        "redelivery_count": m.redelivery_count,
        "payload": shown,
        "payload_encoding": encoding,
    }


def message_line(m: Any, fmt: str) -> str:
    """One message as a tab-separated line: id, deliver_at, key, properties, redelivery
    count, payload (``b64:`` or ``hex:`` before a payload that is not shown as text)."""
    props = ",".join(f"{k}={v}" for k, v in sorted((m.properties or {}).items()))
    shown, encoding = payload_form(m.payload, fmt)
    if encoding != "text" and fmt == "auto":
        shown = f"b64:{shown}"
    return (
        f"{m.message_id}\t{_due_text(m.deliver_at_ms) or '-'}\t{m.key or '-'}\t{props or '-'}\t"
        f"{m.redelivery_count}\t{shown}"
    )


def print_message(args: argparse.Namespace, m: Any) -> None:
    fmt = getattr(args, "payload_format", "auto")
    print(dumps(message_doc(m, fmt)) if wants_json(args) else message_line(m, fmt))
