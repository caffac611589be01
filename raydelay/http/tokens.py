"""The HTTP API's bearer tokens: made, listed and revoked (``raydelay tokens``), and checked
on every request. Pure: the store is given, and no web framework is imported.

- **A token** reads ``rdk_<id>_<secret>``. The id (12 hex digits) names its record; the
  secret is 32 random bytes (``secrets.token_urlsafe``). It is shown once, when it is made.
- **Its record** (``auth/tokens/<id>`` in the cluster's store, msgpack with a version
  field) keeps its name, its scopes, its rate limit and the SHA-256 of the whole token,
  never the token. A 256-bit random secret needs no slow hash: nothing can be guessed
  from the digest, and a check is one hash and a constant-time compare.
- **Scopes** (:class:`Scope`): ``produce`` sends, ``cancel`` cancels, ``read`` reads
  (topics, stats, scheduled messages, schedules), ``admin`` pauses and resumes schedules
  and may do everything the others may.
- **Revoking** deletes the record. A server reads the records again every
  ``http.token_refresh_s`` (:class:`TokenCache`), so a revoked token stops working within
  that time, and a new one works at once: an unknown id reads that one record from the
  store, up to ``MISS_READS_PER_S`` such reads a second, so that random tokens cannot make
  a server read the store for each request.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgpack

from raydelay.errors import CodecError, InvalidArgument, NotFound
from raydelay.http.ratelimit import RateLimiter
from raydelay.limits import NO_LIMIT
from raydelay.storage.base import ObjectStore

FORMAT_VERSION = 1
PREFIX = "auth/tokens/"  # one record per token, named by its id
TOKEN_RE = re.compile(r"^rdk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
NAME_RE = re.compile(r"^[A-Za-z0-9._@-]{1,64}$")
MISS_READS_PER_S = 20.0  # reads of an unknown token id's record, per second and server


class Scope(enum.Enum):
    """What a token may do (``admin``: everything)."""

    PRODUCE = "produce"
    CANCEL = "cancel"
    READ = "read"
    ADMIN = "admin"


@dataclass(frozen=True)
class TokenRecord:
    """One token as stored: everything but the token.

    - ``token_id``: 12 hex digits, also in the token itself;
    - ``name``: the operator's name for it (``[A-Za-z0-9._@-]{1,64}``);
    - ``scopes``: what it may do;
    - ``rate_per_s``: requests a second it may make on one server replica (-1: no limit);
    - ``created_ms``: when it was made, epoch ms;
    - ``digest``: SHA-256 of the token, hex.
    """

    token_id: str
    name: str
    scopes: frozenset[Scope]
    rate_per_s: float
    created_ms: int
    digest: str

    def allows(self, scope: Scope) -> bool:
        return scope in self.scopes or Scope.ADMIN in self.scopes

    def public(self) -> dict:
        """The record as ``tokens list`` shows it (the digest left out)."""
        return {
            "token_id": self.token_id,
            "name": self.name,
            "scopes": sorted(s.value for s in self.scopes),
            "rate_per_s": self.rate_per_s,
            "created_ms": self.created_ms,
        }


def parse_scopes(values: Iterable[object]) -> frozenset[Scope]:
    """The scopes named by ``values`` (``"produce"``, ...); InvalidArgument for an unknown
    one or none at all."""
    known = {s.value: s for s in Scope}
    got = set()
    for v in values:
        if v not in known:
            raise InvalidArgument(f"scopes: {v!r} is not one of {', '.join(known)}")
        got.add(known[v])
    if not got:
        raise InvalidArgument(f"scopes: give at least one of {', '.join(known)}")
    return frozenset(got)


def check_rate(value: object) -> float:
    """A rate limit in requests per second: > 0, or -1 for none."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"rate_per_s: expected a number, got {type(value).__name__}")
    if value == NO_LIMIT:
        return float(NO_LIMIT)
    if not 0 < value < float("inf"):
        raise InvalidArgument(f"rate_per_s: must be > 0, or -1 for no limit; got {value}")
    return float(value)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


def encode(record: TokenRecord) -> bytes:
    return msgpack.packb(
        {
            "v": FORMAT_VERSION,
            "id": record.token_id,
            "name": record.name,
            "scopes": sorted(s.value for s in record.scopes),
            "rate": record.rate_per_s,
            "created_ms": record.created_ms,
            "sha256": record.digest,
        }
    )


def decode(data: bytes) -> TokenRecord:
    try:
        raw = msgpack.unpackb(data)
        if raw.get("v") != FORMAT_VERSION:
            raise CodecError(f"token record: format version {raw.get('v')!r} is not known")
        return TokenRecord(
            token_id=raw["id"],
            name=raw["name"],
            scopes=frozenset(Scope(s) for s in raw["scopes"]),
            rate_per_s=float(raw["rate"]),
            created_ms=int(raw["created_ms"]),
            digest=raw["sha256"],
        )
    except CodecError:
        raise
    except Exception as exc:  # noqa: BLE001 - any damage is one decode error, with its cause
        raise CodecError(f"token record: cannot decode ({exc})") from exc


class TokenStore:
    """The token records of one store: made, listed, revoked."""

    def __init__(self, store: ObjectStore, *, clock_ms: Callable[[], int] | None = None) -> None:
        self._store = store
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    def create(
        self, name: str, scopes: Iterable[object], rate_per_s: float = NO_LIMIT
    ) -> tuple[TokenRecord, str]:
        """A new token: its record (stored) and the token itself, which is not kept and
        cannot be shown again."""
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise InvalidArgument(f"name: {name!r} must match [A-Za-z0-9._@-]{{1,64}}")
        checked = parse_scopes(scopes)
        rate = check_rate(rate_per_s)
        if any(r.name == name for r in self.list()):
            raise InvalidArgument(f"name: a token named {name!r} exists; revoke it first")
        token_id = secrets.token_hex(6)
        token = f"rdk_{token_id}_{secrets.token_urlsafe(32)}"
        record = TokenRecord(token_id, name, checked, rate, self._clock_ms(), digest(token))
        self._store.put_new(PREFIX + token_id, encode(record))  # (a taken id: Conflict)
        return record, token

    def list(self) -> list[TokenRecord]:
        """Every token's record, oldest first."""
        records = []
        for key in self._store.list(PREFIX):
            try:
                records.append(decode(self._store.get(key)))
            except NotFound:  # revoked while listing
                continue
        return sorted(records, key=lambda r: (r.created_ms, r.token_id))

    def get(self, token_id: str) -> TokenRecord | None:
        """The record of ``token_id``, or None if there is none."""
        try:
            return decode(self._store.get(PREFIX + token_id))
        except NotFound:
            return None

    def revoke(self, name_or_id: str) -> TokenRecord:
        """Delete the token named ``name_or_id`` (its name or its id); NotFound if none."""
        for record in self.list():
            if name_or_id in (record.name, record.token_id):
                self._store.delete(PREFIX + record.token_id)
                return record
        raise NotFound(f"token: no token is named {name_or_id!r}")


class Unauthorized(Exception):
    """A request's token is missing, malformed, unknown or wrong (HTTP 401)."""


def _parse(authorization: str | None) -> tuple[str, str]:
    """(token id, token) of an ``Authorization: Bearer <token>`` header; Unauthorized
    (with the reason) when there is none, or it does not hold a raydelay token."""
    if not authorization:
        raise Unauthorized("no Authorization header: send 'Authorization: Bearer <token>'")
    kind, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if kind.lower() != "bearer" or not token:
        raise Unauthorized("the Authorization header must read 'Bearer <token>'")
    match = TOKEN_RE.match(token)
    if match is None:
        raise Unauthorized("the bearer token is not a raydelay token (rdk_...)")
    return match.group(1), token


class TokenCache:
    """The records a server checks tokens against, read again every ``refresh_s``."""

    def __init__(
        self,
        tokens: TokenStore,
        refresh_s: float,
        *,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tokens = tokens
        self._refresh_s = refresh_s
        self._clock_s = clock_s
        self._lock = threading.Lock()
        self._by_id: dict[str, TokenRecord] = {}
        self._read_at: float | None = None
        self._misses = RateLimiter(clock_s=clock_s)  # reads of unknown ids' records

    def check_cached(self, authorization: str | None) -> TokenRecord | None:
        """:meth:`check` when the records at hand answer it without a store read (they
        are fresh and know the token's id), else None; Unauthorized as :meth:`check`."""
        token_id, token = _parse(authorization)
        with self._lock:
            fresh = self._read_at is not None and self._clock_s() - self._read_at < self._refresh_s
            record = self._by_id.get(token_id) if fresh else None
        if record is None:
            return None
        if not hmac.compare_digest(record.digest, digest(token)):
            raise Unauthorized("the bearer token is unknown or revoked")
        return record

    def check(self, authorization: str | None) -> TokenRecord:
        """The record of the token in an ``Authorization: Bearer <token>`` header;
        Unauthorized (with the reason) when there is none, or it is not a live token."""
        token_id, token = _parse(authorization)
        record = self._record(token_id)
        if record is None or not hmac.compare_digest(record.digest, digest(token)):
            raise Unauthorized("the bearer token is unknown or revoked")
        return record

    def _record(self, token_id: str) -> TokenRecord | None:
        with self._lock:
            now = self._clock_s()
            if self._read_at is None or now - self._read_at >= self._refresh_s:
                self._by_id = {r.token_id: r for r in self._tokens.list()}
                self._read_at = now
            found = self._by_id.get(token_id)
            if found is None and self._misses.take("miss", MISS_READS_PER_S) == 0.0:
                found = self._tokens.get(token_id)  # (made since the last read)
                if found is not None:
                    self._by_id[token_id] = found
            return found
