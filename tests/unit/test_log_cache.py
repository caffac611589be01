"""The log's LRU cache (pure): bounded by total size, least recently used out first."""

from __future__ import annotations

from raydelay.log.cache import LruCache


def test_the_least_recently_used_values_go_first_when_over_the_bound():
    # Given a cache of 10 bytes holding a (4 B) and b (4 B), a used after b
    cache: LruCache[str, bytes] = LruCache(10, len)
    cache.put("a", b"aaaa")
    cache.put("b", b"bbbb")
    assert cache.get("a") == b"aaaa"
    # When c (4 B) goes over the bound
    cache.put("c", b"cccc")
    # Then b, the least recently used, is out, and the size is what is held
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (b"aaaa", None, b"cccc")
    assert (cache.size, len(cache)) == (8, 2)


def test_a_value_larger_than_the_bound_is_not_kept_and_evicts_nothing():
    # Given a cache of 10 bytes holding a, and an older value under "big"
    cache: LruCache[str, bytes] = LruCache(10, len)
    cache.put("a", b"aaaa")
    cache.put("big", b"bb")
    # When 11 bytes go in under "big"
    cache.put("big", b"x" * 11)
    # Then neither the new nor the old value is there, and a stays
    assert cache.get("big") is None
    assert cache.get("a") == b"aaaa" and cache.size == 4


def test_replacing_a_value_counts_its_new_size_only():
    cache: LruCache[str, bytes] = LruCache(10, len)
    cache.put("a", b"aaaa")
    cache.put("a", b"aaaaaaa")
    assert cache.size == 7 and len(cache) == 1


def test_without_a_size_function_the_bound_counts_values():
    # Given a cache of 2 values
    cache: LruCache[int, str] = LruCache(2)
    for key in range(3):
        cache.put(key, f"v{key}")
    # Then the first is out
    assert [cache.get(k) for k in range(3)] == [None, "v1", "v2"]


def test_pop_and_discard_remove_values_and_their_size():
    # Given values of ledgers 1 and 2
    cache: LruCache[tuple[int, int], bytes] = LruCache(100, len)
    for key in [(1, 0), (1, 5), (2, 0)]:
        cache.put(key, b"12345")
    # When ledger 1's are discarded and (2, 0) popped
    cache.discard(lambda key: key[0] == 1)
    assert cache.pop((2, 0)) == b"12345"
    # Then nothing is held
    assert cache.pop((2, 0)) is None
    assert (len(cache), cache.size) == (0, 0)
