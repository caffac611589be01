"""What the HTTP API's requests carry, checked and turned into the client's arguments
(pure: no web framework). Every problem is one InvalidArgument naming the field, as the
Python client's are: ``messages[3].deliver_at: ...``.

A message in JSON::

    {"payload": "<base64>"  or  "text": "<UTF-8 text>",
     "deliver_at": 1790000000000  or  "2026-12-02T10:00:00Z",   # epoch ms, or RFC 3339
     "deliver_after": 30.5,                                      # seconds (not both)
     "key": "order-17", "properties": {"k": "v"},
     "on_duplicate": "ignore"}                     # or "replace", "error", "allow"

Neither time: delivered at once. ``on_duplicate`` says what a keyed message scheduled for
later does about a message still pending under its key (a batch gives it once, beside
``messages``). A raw message is the request body as it is, with the same
fields as headers (:data:`RAW_HEADERS`); its ``Raydelay-Properties`` is a JSON object.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from raydelay.errors import InvalidArgument
from raydelay.log.keys import ON_DUPLICATE

# the headers of a raw message (Content-Type: application/octet-stream)
RAW_HEADERS = {
    "deliver_at": "raydelay-deliver-at",
    "deliver_after": "raydelay-deliver-after",
    "key": "raydelay-key",
    "properties": "raydelay-properties",
    "on_duplicate": "raydelay-on-duplicate",
}
MESSAGE_FIELDS = frozenset({"payload", "text", "deliver_at", "deliver_after", "key", "properties"})
ONE_MESSAGE_FIELDS = MESSAGE_FIELDS | {"on_duplicate"}  # (a batch gives it once, for all)
_RAW_NAMES = frozenset(RAW_HEADERS.values())
_HEADER_TITLES = {h: "-".join(p.capitalize() for p in h.split("-")) for h in _RAW_NAMES}
_FIELD_OF_HEADER = {h: f for f, h in RAW_HEADERS.items()}
RAW = "application/octet-stream"


class Outgoing(NamedTuple):
    """One message to send, as ``Producer.send`` takes it (a tuple: a batch makes a
    thousand, and a frozen dataclass costs a microsecond each to make)."""

    payload: bytes
    deliver_at: int | datetime | None
    deliver_after: float | None
    key: str | None
    properties: dict[str, str] | None
    on_duplicate: str = "ignore"


def parse_json(body: bytes) -> Any:
    """The JSON document of a request body."""
    if not body:
        raise InvalidArgument("body: empty; expected a JSON object")
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"body: not valid JSON ({exc})") from None


def message_of(doc: object, where: str = "", key: str | None = None) -> Outgoing:
    """One message of a JSON body; ``where`` prefixes field names (``messages[3].``).
    ``key``: the key the route names (the body then has none of its own)."""
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{where.rstrip('.') or 'body'}: expected a JSON object")
    fields = MESSAGE_FIELDS if where else ONE_MESSAGE_FIELDS
    if not fields.issuperset(doc):
        unknown = sorted(set(doc) - fields)
        also = (
            " (a batch gives on_duplicate once, beside messages)"
            if unknown[0] == "on_duplicate"
            else ""
        )
        raise InvalidArgument(
            f"{where}{unknown[0]}: not a field of a message{also} "
            f"(fields: {', '.join(sorted(fields))})"
        )
    if key is not None and "key" in doc:
        raise InvalidArgument("key: the path names the key; the body must not")
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
        key if key is not None else _key(f"{where}key", doc.get("key")),
        _properties(f"{where}properties", doc.get("properties")),
        _on_duplicate("on_duplicate", doc.get("on_duplicate", "ignore")),
    )


def batch_of(doc: object, max_messages: int) -> tuple[list[Outgoing], str]:
    """The messages of a batch body ``{"messages": [...], "on_duplicate": "ignore"}``
    (``on_duplicate`` optional), and its on_duplicate."""
    if (
        not isinstance(doc, dict)
        or "messages" not in doc
        or set(doc) - {"messages", "on_duplicate"}
    ):
        raise InvalidArgument('body: expected {"messages": [ ... ], "on_duplicate": ...}')
    on_duplicate = _on_duplicate("on_duplicate", doc.get("on_duplicate", "ignore"))
    items = doc["messages"]
    if not isinstance(items, list) or not items:
        raise InvalidArgument("messages: expected a non-empty JSON array")
    if len(items) > max_messages:
        raise InvalidArgument(
            f"messages: {len(items):,} in one request; at most {max_messages:,} "
            "(http.max_batch_messages)"
        )
    return [message_of(m, f"messages[{i}].") for i, m in enumerate(items)], on_duplicate


def raw_message_of(body: bytes, headers: Mapping[str, str], key: str | None = None) -> Outgoing:
    """A raw message: the body, and its fields as headers (names in any case; values in
    UTF-8, as a client sends them, though HTTP reads headers as Latin-1). ``key``: the
    key the route names (then no Raydelay-Key header)."""
    got = {k.lower(): _utf8(k, v) for k, v in headers.items() if k.lower() in _RAW_NAMES}
    if key is not None and RAW_HEADERS["key"] in got:
        raise InvalidArgument("Raydelay-Key: the path names the key; no header may")
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
        key if key is not None else _key("Raydelay-Key", got.get(RAW_HEADERS["key"])),
        _properties("Raydelay-Properties", props),
        _on_duplicate("Raydelay-On-Duplicate", got.get(RAW_HEADERS["on_duplicate"], "ignore")),
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
    return _strings(doc, "message_ids", max_ids)


def keys_of(doc: object, max_keys: int) -> list[str]:
    """The keys of a cancel-by-key body ``{"keys": ["order-17", ...]}``."""
    return _strings(doc, "keys", max_keys)


def _strings(doc: object, name: str, most: int) -> list[str]:
    """The non-empty strings of a body ``{name: [...]}`` (at least one, at most ``most``)."""
    if not isinstance(doc, dict) or set(doc) != {name}:
        raise InvalidArgument(f'body: expected {{"{name}": [ ... ]}}')
    items = doc[name]
    if not isinstance(items, list) or not items:
        raise InvalidArgument(f"{name}: expected a non-empty JSON array")
    if len(items) > most:
        raise InvalidArgument(f"{name}: {len(items):,} in one request; at most {most:,}")
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item:
            raise InvalidArgument(f"{name}[{i}]: expected a non-empty string")
    return items


def _on_duplicate(field: str, value: object) -> str:
    if value not in ON_DUPLICATE:
        raise InvalidArgument(f"{field}: expected one of {', '.join(ON_DUPLICATE)}, got {value!r}")
    return str(value)


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
    # (the field names are made only for an error: a batch checks a thousand of these)
    def at_field() -> str:
        return "Raydelay-Deliver-At" if headers else f"{where}deliver_at"

    if at is not None and after is not None:
        raise InvalidArgument(f"{at_field()}: give deliver_at or deliver_after, not both")
    deliver_at: int | datetime | None = None
    if type(at) is int:  # (bool is an int's subclass, and refused below)
        deliver_at = at
    elif isinstance(at, str):
        deliver_at = _aware(at_field(), at)
    elif at is not None:
        raise InvalidArgument(
            f"{at_field()}: expected epoch ms as an integer, or an RFC 3339 time with an offset"
        )
    deliver_after = None
    if after is not None:
        if isinstance(after, bool) or not isinstance(after, (int, float)):
            after_field = "Raydelay-Deliver-After" if headers else f"{where}deliver_after"
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
    try:  # (b64decode's own check, without its wrapper: a str of ASCII is taken as is)
        return binascii.a2b_base64(value, strict_mode=True)
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
