"""What the HTTP API's requests carry, checked and turned into the client's arguments
(pure: no web framework). Every problem is one InvalidArgument naming the field, as the
Python client's are: ``messages[3].deliver_at: ...``.

A message in JSON::

    {"payload": "<base64>"  or  "text": "<UTF-8 text>",
     "deliver_at": 1790000000000  or  "2026-12-02T10:00:00Z",   # epoch ms, or RFC 3339
     "deliver_after": 30.5,                                      # seconds (not both)
     "key": "order-17", "properties": {"k": "v"}}

Neither time: delivered at once. A raw message is the request body as it is, with the same
fields as headers (:data:`RAW_HEADERS`); its ``Raydelay-Properties`` is a JSON object.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from raydelay.errors import InvalidArgument

# the headers of a raw message (Content-Type: application/octet-stream)
RAW_HEADERS = {
    "deliver_at": "raydelay-deliver-at",
    "deliver_after": "raydelay-deliver-after",
    "key": "raydelay-key",
    "properties": "raydelay-properties",
}
MESSAGE_FIELDS = frozenset({"payload", "text", "deliver_at", "deliver_after", "key", "properties"})
_RAW_NAMES = frozenset(RAW_HEADERS.values())
_HEADER_TITLES = {h: "-".join(p.capitalize() for p in h.split("-")) for h in _RAW_NAMES}
_FIELD_OF_HEADER = {h: f for f, h in RAW_HEADERS.items()}
RAW = "application/octet-stream"


@dataclass(frozen=True)
class Outgoing:
    """One message to send, as ``Producer.send`` takes it."""

    payload: bytes
    deliver_at: int | datetime | None
    deliver_after: float | None
    key: str | None
    properties: dict[str, str] | None


def parse_json(body: bytes) -> Any:
    """The JSON document of a request body."""
    if not body:
        raise InvalidArgument("body: empty; expected a JSON object")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"body: not valid JSON ({exc})") from None


def message_of(doc: object, where: str = "") -> Outgoing:
    """One message of a JSON body; ``where`` prefixes field names (``messages[3].``)."""
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{where.rstrip('.') or 'body'}: expected a JSON object")
    unknown = sorted(set(doc) - MESSAGE_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"{where}{unknown[0]}: not a field of a message "
            f"(fields: {', '.join(sorted(MESSAGE_FIELDS))})"
        )
    if ("payload" in doc) == ("text" in doc):
        raise InvalidArgument(
            f"{where}payload: give exactly one of 'payload' (base64) and 'text' (UTF-8)"
        )
    if "payload" in doc:
        payload = _base64(f"{where}payload", doc["payload"])
    else:
        payload = _text(f"{where}text", doc["text"]).encode("utf-8")
    deliver_at, deliver_after = _when(where, doc.get("deliver_at"), doc.get("deliver_after"))
    return Outgoing(
        payload,
        deliver_at,
        deliver_after,
        _key(f"{where}key", doc.get("key")),
        _properties(f"{where}properties", doc.get("properties")),
    )


def batch_of(doc: object, max_messages: int) -> list[Outgoing]:
    """The messages of a batch body ``{"messages": [...]}``."""
    if not isinstance(doc, dict) or set(doc) != {"messages"}:
        raise InvalidArgument('body: expected {"messages": [ ... ]}')
    items = doc["messages"]
    if not isinstance(items, list) or not items:
        raise InvalidArgument("messages: expected a non-empty JSON array")
    if len(items) > max_messages:
        raise InvalidArgument(
            f"messages: {len(items):,} in one request; at most {max_messages:,} "
            "(http.max_batch_messages)"
        )
    return [message_of(m, f"messages[{i}].") for i, m in enumerate(items)]


def raw_message_of(body: bytes, headers: Mapping[str, str]) -> Outgoing:
    """A raw message: the body, and its fields as headers (names in any case; values in
    UTF-8, as a client sends them, though HTTP reads headers as Latin-1)."""
    got = {k.lower(): _utf8(k, v) for k, v in headers.items() if k.lower() in _RAW_NAMES}
    at_text = got.get(RAW_HEADERS["deliver_at"])
    after_text = got.get(RAW_HEADERS["deliver_after"])
    at: object = at_text
    if at_text is not None and at_text.strip().lstrip("-").isdigit():
        at = int(at_text.strip())
    after: object = None
    if after_text is not None:
        try:
            after = float(after_text)
        except ValueError:
            raise InvalidArgument(
                f"Raydelay-Deliver-After: expected seconds as a number, got {after_text!r}"
            ) from None
    deliver_at, deliver_after = _when("", at, after, headers=True)
    props_text = got.get(RAW_HEADERS["properties"])
    props = None
    if props_text is not None:
        try:
            props = json.loads(props_text)
        except json.JSONDecodeError:
            raise InvalidArgument("Raydelay-Properties: expected a JSON object") from None
    return Outgoing(
        body,
        deliver_at,
        deliver_after,
        _key("Raydelay-Key", got.get(RAW_HEADERS["key"])),
        _properties("Raydelay-Properties", props),
    )


def no_raw_headers(headers: Mapping[str, str]) -> None:
    """InvalidArgument for a ``Raydelay-*`` field header on a JSON message: its fields go
    in the body (a header there would be ignored, and its message sent otherwise)."""
    for k in headers:
        if k.lower() in _RAW_NAMES:
            raise InvalidArgument(
                f"{_HEADER_TITLES[k.lower()]}: a header of raw messages (Content-Type: "
                f"{RAW}); a JSON message carries "
                f"{_FIELD_OF_HEADER[k.lower()]} in its body"
            )


def raw_field_error(exc: InvalidArgument) -> InvalidArgument:
    """A client's InvalidArgument about a raw message's field (``deliver_after: ...``),
    naming the header that carried it."""
    field, sep, rest = str(exc).partition(":")
    header = RAW_HEADERS.get(field.strip())
    return InvalidArgument(f"{_HEADER_TITLES[header]}:{rest}") if sep and header else exc


def message_ids_of(doc: object, max_ids: int) -> list[str]:
    """The ids of a cancel body ``{"message_ids": ["topic/partition/ledger:entry", ...]}``."""
    if not isinstance(doc, dict) or set(doc) != {"message_ids"}:
        raise InvalidArgument('body: expected {"message_ids": [ ... ]}')
    ids = doc["message_ids"]
    if not isinstance(ids, list) or not ids:
        raise InvalidArgument("message_ids: expected a non-empty JSON array")
    if len(ids) > max_ids:
        raise InvalidArgument(f"message_ids: {len(ids):,} in one request; at most {max_ids:,}")
    for i, mid in enumerate(ids):
        if not isinstance(mid, str):
            raise InvalidArgument(f"message_ids[{i}]: expected a string")
    return ids


def time_of(field: str, value: str | None) -> int | datetime | None:
    """A query's time: epoch ms, or RFC 3339 with an offset."""
    if value is None:
        return None
    if value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return _aware(field, value)


def _when(
    where: str, at: object, after: object, *, headers: bool = False
) -> tuple[int | datetime | None, float | None]:
    at_field = "Raydelay-Deliver-At" if headers else f"{where}deliver_at"
    after_field = "Raydelay-Deliver-After" if headers else f"{where}deliver_after"
    if at is not None and after is not None:
        raise InvalidArgument(f"{at_field}: give deliver_at or deliver_after, not both")
    deliver_at: int | datetime | None = None
    if isinstance(at, bool) or (at is not None and not isinstance(at, (int, str))):
        raise InvalidArgument(
            f"{at_field}: expected epoch ms as an integer, or an RFC 3339 time with an offset"
        )
    if isinstance(at, int):
        deliver_at = at
    elif isinstance(at, str):
        deliver_at = _aware(at_field, at)
    deliver_after = None
    if after is not None:
        if isinstance(after, bool) or not isinstance(after, (int, float)):
            raise InvalidArgument(f"{after_field}: expected seconds as a number")
        deliver_after = float(after)
    return deliver_at, deliver_after


def _aware(field: str, text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument(
            f"{field}: {text!r} is not an RFC 3339 time (e.g. 2026-12-02T10:00:00Z) nor epoch ms"
        ) from None
    if when.tzinfo is None:
        raise InvalidArgument(f"{field}: {text!r} has no offset (add Z or +hh:mm)")
    return when


def _base64(field: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise InvalidArgument(f"{field}: expected a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(f"{field}: not valid base64") from None


def _key(field: str, value: object) -> str | None:
    return None if value is None else _text(field, value)


def _text(field: str, value: object) -> str:
    """A JSON string that is Unicode text: JSON's escapes can spell a lone surrogate."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field}: expected a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{field}: not valid Unicode (a lone surrogate at character {exc.start})"
        ) from None
    return value


def _utf8(name: str, value: str) -> str:
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise InvalidArgument(f"{_HEADER_TITLES[name.lower()]}: not valid UTF-8") from None


def _properties(field: str, value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{field}: expected a JSON object of strings")
    for k, v in value.items():
        _text(f"{field} key {k!r}", k)
        _text(f"{field}.{k}", v)
    return value
