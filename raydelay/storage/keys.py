"""Key validation and the key layout of the store (docs/design.md, "Formats").

Every backend validates keys the same way, so a bad key is an InvalidArgument
everywhere and can never address a file outside a local store's root.
"""

from __future__ import annotations

import re

from raydelay.errors import InvalidArgument

NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MAX_KEY_BYTES = 1024  # S3's limit


def validate_name(field: str, name: object) -> str:
    """A topic or subscription name: ``[A-Za-z0-9._-]{1,128}``, and not ``.`` or ``..``."""
    if not isinstance(name, str):
        raise InvalidArgument(f"{field}: expected a str, got {type(name).__name__}")
    if not NAME_RE.match(name) or name in (".", ".."):
        raise InvalidArgument(
            f"{field}: {name!r} must match [A-Za-z0-9._-]{{1,128}} and not be '.' or '..'"
        )
    return name


def _check_text(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{field}: expected a str, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidArgument(f"{field}: {value!r} contains a NUL byte")
    if "\\" in value:
        raise InvalidArgument(f"{field}: {value!r} contains a backslash")
    if value.startswith("/"):
        raise InvalidArgument(f"{field}: {value!r} is absolute (starts with '/')")
    if len(value.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidArgument(f"{field}: longer than {MAX_KEY_BYTES} bytes")
    return value


def validate_key(key: object) -> str:
    """An object key: relative, '/'-separated, no empty, '.' or '..' segment, no NUL or backslash."""
    key = _check_text("key", key)
    if not key:
        raise InvalidArgument("key: may not be empty")
    for segment in key.split("/"):
        if segment == "":
            raise InvalidArgument(f"key: {key!r} has an empty segment")
        if segment in (".", ".."):
            raise InvalidArgument(f"key: {key!r} has a {segment!r} segment")
    return key


def validate_prefix(prefix: object) -> str:
    """A listing prefix: like a key, but it may be empty and may end in '/' or mid-segment."""
    prefix = _check_text("prefix", prefix)
    if not prefix:
        return prefix
    segments = prefix.split("/")
    if segments[-1] == "":
        segments = segments[:-1]
    for segment in segments:
        if segment == "":
            raise InvalidArgument(f"prefix: {prefix!r} has an empty segment")
        if segment in (".", ".."):
            raise InvalidArgument(f"prefix: {prefix!r} has a {segment!r} segment")
    return prefix


# --- layout -------------------------------------------------------------------------------


def subscription_prefix(topic: str, partition: int, subscription: str) -> str:
    """``subs/<topic>/<partition>/<sub>``: the store prefix of one subscription partition."""
    validate_name("topic", topic)
    validate_name("subscription", subscription)
    _check_partition(partition)
    return f"subs/{topic}/{partition}/{subscription}"


def ledger_entries_key(topic: str, partition: int, ledger_id: int, first_entry: int) -> str:
    validate_name("topic", topic)
    _check_partition(partition)
    return f"topics/{topic}/{partition}/ledgers/{ledger_id:020d}/{first_entry:020d}.entries"


def cursor_key(topic: str, partition: int, subscription: str, version: int) -> str:
    return f"{subscription_prefix(topic, partition, subscription)}/cursor/{version:020d}"


def journal_key(seq: int) -> str:
    return f"meta/journal/{seq:020d}"


def snapshot_key(seq: int) -> str:
    return f"meta/snapshot/{seq:020d}"


def _check_partition(partition: object) -> None:
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise InvalidArgument(f"partition: expected an int >= 0, got {partition!r}")
