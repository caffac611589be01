"""The HTTP API's tokens and rate limit: made, stored hashed, checked, revoked."""

from __future__ import annotations

import pytest

from raydelay.errors import CodecError, InvalidArgument, NotFound
from raydelay.http import tokens as tk
from raydelay.http.ratelimit import RateLimiter
from raydelay.http.tokens import Scope, TokenCache, TokenStore, Unauthorized
from raydelay.storage.memory import MemoryObjectStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store():
    return MemoryObjectStore()


def test_a_token_is_stored_hashed_and_shown_only_once(store):
    tokens = TokenStore(store, clock_ms=lambda: 1_700_000_000_000)
    record, token = tokens.create("billing-svc", ["produce", "cancel"], 50)
    assert tk.TOKEN_RE.match(token) and token.split("_")[1] == record.token_id
    raw = store.get(tk.PREFIX + record.token_id)
    secret = token.split("_", 2)[2]
    assert secret.encode() not in raw and token.encode() not in raw
    assert record.digest == tk.digest(token)
    [listed] = tokens.list()
    assert listed == record
    assert listed.public() == {
        "token_id": record.token_id,
        "name": "billing-svc",
        "scopes": ["cancel", "produce"],
        "rate_per_s": 50.0,
        "created_ms": 1_700_000_000_000,
    }


def test_the_record_format_round_trips_and_a_damaged_one_is_a_codec_error():
    record = tk.TokenRecord("0123456789ab", "n", frozenset({Scope.READ}), -1.0, 5, "ab" * 32)
    assert tk.decode(tk.encode(record)) == record
    with pytest.raises(CodecError, match="token record"):
        tk.decode(b"\x93garbage")
    import msgpack

    with pytest.raises(CodecError, match="format version 9"):
        tk.decode(msgpack.packb({"v": 9}))


@pytest.mark.parametrize(
    ("name", "scopes", "rate", "match"),
    [
        ("has space", ["read"], 1, "name"),
        ("", ["read"], 1, "name"),
        ("x" * 65, ["read"], 1, "name"),
        (17, ["read"], 1, "name"),
        ("ok", [], 1, "scopes: give at least one"),
        ("ok", ["write"], 1, "scopes: 'write' is not one of"),
        ("ok", ["read"], 0, "rate_per_s: must be > 0, or -1"),
        ("ok", ["read"], -2, "rate_per_s"),
        ("ok", ["read"], float("inf"), "rate_per_s"),
        ("ok", ["read"], "10", "rate_per_s: expected a number"),
        ("ok", ["read"], True, "rate_per_s: expected a number"),
    ],
)
def test_bad_token_arguments_are_refused_and_nothing_is_stored(store, name, scopes, rate, match):
    with pytest.raises(InvalidArgument, match=match):
        TokenStore(store).create(name, scopes, rate)
    assert store.list("") == []


def test_names_are_unique_and_revoke_takes_a_name_or_an_id(store):
    tokens = TokenStore(store)
    a, _ = tokens.create("a", ["read"])
    b, _ = tokens.create("b", ["admin"])
    with pytest.raises(InvalidArgument, match="a token named 'a' exists"):
        tokens.create("a", ["read"])
    assert tokens.revoke("a") == a
    assert tokens.revoke(b.token_id) == b
    assert tokens.list() == []
    with pytest.raises(NotFound, match="no token is named 'a'"):
        tokens.revoke("a")


def test_every_bad_authorization_is_unauthorized_with_its_reason(store):
    tokens = TokenStore(store)
    _, token = tokens.create("svc", ["read"])
    cache = TokenCache(tokens, refresh_s=5.0, clock_s=Clock())
    assert cache.check(f"Bearer {token}").name == "svc"
    assert cache.check(f"bearer  {token} ").name == "svc"
    token_id = token.split("_")[1]
    forged = f"rdk_{token_id}_{'A' * 43}"
    for header, reason in [
        (None, "no Authorization header"),
        ("", "no Authorization header"),
        (f"Basic {token}", "must read 'Bearer <token>'"),
        ("Bearer", "must read 'Bearer <token>'"),
        ("Bearer abc", "not a raydelay token"),
        (forged, "must read 'Bearer"),
        (f"Bearer {forged}", "unknown or revoked"),
        (f"Bearer rdk_ffffffffffff_{'A' * 43}", "unknown or revoked"),
    ]:
        with pytest.raises(Unauthorized, match=reason):
            cache.check(header)


def test_a_revoked_token_stops_within_the_refresh_and_a_new_one_works_at_once(store):
    tokens = TokenStore(store)
    clock = Clock()
    cache = TokenCache(tokens, refresh_s=5.0, clock_s=clock)
    _, old = tokens.create("old", ["read"])
    assert cache.check(f"Bearer {old}").name == "old"
    _, new = tokens.create("new", ["produce"])
    assert cache.check(f"Bearer {new}").name == "new"
    tokens.revoke("old")
    clock.now += 4.9  # (still within the refresh of the last read)
    assert cache.check(f"Bearer {old}").name == "old"
    clock.now += 0.2
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        cache.check(f"Bearer {old}")


def test_unknown_ids_read_at_most_a_few_records_a_second(store):
    class Counting:
        gets = 0

        def get(self, key):
            Counting.gets += 1
            return store.get(key)

        def __getattr__(self, name):
            return getattr(store, name)

    clock = Clock()
    cache = TokenCache(TokenStore(Counting()), refresh_s=60.0, clock_s=clock)
    for i in range(100):
        with pytest.raises(Unauthorized):
            cache.check(f"Bearer rdk_{i:012x}_{'A' * 43}")
    assert Counting.gets == tk.MISS_READS_PER_S
    clock.now += 1.0
    for i in range(100):
        with pytest.raises(Unauthorized):
            cache.check(f"Bearer rdk_{i:012x}_{'A' * 43}")
    assert Counting.gets == 2 * tk.MISS_READS_PER_S


def test_admin_allows_every_scope_and_the_others_only_their_own():
    admin = tk.TokenRecord("0" * 12, "a", frozenset({Scope.ADMIN}), -1, 0, "")
    reader = tk.TokenRecord("1" * 12, "r", frozenset({Scope.READ}), -1, 0, "")
    assert all(admin.allows(s) for s in Scope)
    assert [s for s in Scope if reader.allows(s)] == [Scope.READ]


def test_the_rate_limit_allows_a_second_of_burst_then_the_rate():
    clock = Clock()
    limiter = RateLimiter(clock_s=clock)
    assert [limiter.take("t", 5) for _ in range(5)] == [0.0] * 5
    wait = limiter.take("t", 5)
    assert wait == pytest.approx(0.2)
    assert RateLimiter.retry_after(wait) == "1"
    assert limiter.take("other", 5) == 0.0  # each token its own bucket
    clock.now += 0.2
    assert limiter.take("t", 5) == 0.0
    assert limiter.take("t", 5) > 0
    assert all(limiter.take("free", -1) == 0.0 for _ in range(10_000))


def test_a_check_from_the_records_at_hand_never_reads_the_store(store):
    tokens = TokenStore(store)
    clock = Clock()
    cache = TokenCache(tokens, refresh_s=5.0, clock_s=clock)
    _, token = tokens.create("svc", ["read"])
    header = f"Bearer {token}"
    # nothing read yet: the cached check cannot answer, the full one reads and answers
    assert cache.check_cached(header) is None
    assert cache.check(header).name == "svc"
    assert cache.check_cached(header).name == "svc"
    token_id = token.split("_")[1]
    with pytest.raises(Unauthorized, match="unknown or revoked"):
        cache.check_cached(f"Bearer rdk_{token_id}_{'A' * 43}")  # the right id, a wrong secret
    with pytest.raises(Unauthorized, match="not a raydelay token"):
        cache.check_cached("Bearer abc")
    assert cache.check_cached(f"Bearer rdk_ffffffffffff_{'A' * 43}") is None  # unknown: read
    clock.now += 5.0  # stale: the next check reads again
    assert cache.check_cached(header) is None
