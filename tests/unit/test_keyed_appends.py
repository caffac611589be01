"""Keyed appends on a partition's host (raydelay.actors.partition.keyed), without Ray:
ignore, replace and error; keys that share a fingerprint; a batch sent again after its
reply was lost; two sends of one key at once; cancels by key and their retries."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from raydelay.clock import now_ms
from raydelay.errors import InvalidArgument, KeyPending
from raydelay.log.entries import AppendBatch, Entries, Rows, encode_batch
from raydelay.positions import key_of
from tests.unit.test_hosted_partition import Parts
from tests.unit.test_log_keys import colliding_keys


def batch(keys, payloads=None, producer="p", seq=0, after_ms=60_000) -> bytes:
    n = len(keys)
    payloads = payloads or [f"m{i}".encode() for i in range(n)]
    due = np.full(n, now_ms() + after_ms, np.int64)
    return encode_batch(AppendBatch(producer, seq, Entries.build(payloads, due, keys)))


@pytest.fixture
def parts():
    made = Parts()
    yield made
    made.close()


def run(parts: Parts, coro_fn):
    async def go():
        parts.appender.start()
        return await coro_fn()

    return asyncio.run(go())


def rows(parts: Parts, positions) -> Rows:
    keys = np.array(sorted(key_of(*p) for p in positions), dtype=np.int64)
    return Rows.from_batch(asyncio.run(parts.reads.read_positions(keys)))


def test_ignore_keeps_the_first_and_answers_its_position(parts):
    async def go():
        a = await parts.appender.append_keyed(batch(["k"], seq=1), "ignore")
        b = await parts.appender.append_keyed(batch(["k"], [b"other"], seq=2), "ignore")
        return a, b

    a, b = run(parts, go)
    assert b.positions == a.positions and b.written == 0 and b.replaced == []
    assert parts.ctx.log.tail() == a.positions[0]  # nothing more was written


def test_replace_writes_the_new_message_and_a_marker_in_one_commit(parts):
    async def go():
        a = await parts.appender.append_keyed(batch(["k"], seq=1), "replace")
        b = await parts.appender.append_keyed(batch(["k"], [b"new"], seq=2), "replace")
        return a, b

    a, b = run(parts, go)
    assert b.positions != a.positions
    ((target, marker),) = b.replaced
    assert target == a.positions[0]
    got = rows(parts, [marker])
    assert int(got.entries.cancel_targets[0]) == key_of(*a.positions[0])
    assert parts.ctx.log.keys.candidates("k", now_ms()) == [key_of(*b.positions[0])]


def test_error_writes_nothing_of_the_batch(parts):
    async def go():
        await parts.appender.append_keyed(batch(["held"], seq=1), "error")
        tail = parts.ctx.log.tail()
        with pytest.raises(KeyPending, match="message 1 of the batch has key 'held'"):
            await parts.appender.append_keyed(batch(["free", "held"], seq=2), "error")
        return tail

    tail = run(parts, go)
    assert parts.ctx.log.tail() == tail


def test_keys_that_share_a_fingerprint_are_told_apart_by_their_rows(parts):
    one, other = colliding_keys()

    async def go():
        a = await parts.appender.append_keyed(batch([one], seq=1), "error")
        b = await parts.appender.append_keyed(batch([other], seq=2), "error")
        c = await parts.appender.append_keyed(batch([other], seq=3), "ignore")
        return a, b, c

    a, b, c = run(parts, go)
    assert a.positions != b.positions and c.positions == b.positions


def test_a_batch_sent_again_gets_the_first_answer(parts):
    async def go():
        await parts.appender.append_keyed(batch(["x"], seq=1), "ignore")
        data = batch(["y", "x", "z", "y"], seq=2)
        first = await parts.appender.append_keyed(data, "ignore")
        again = await parts.appender.append_keyed(data, "ignore")
        data = batch(["z", "z"], [b"z1", b"z2"], seq=3)
        replaced = await parts.appender.append_keyed(data, "replace")
        replaced_again = await parts.appender.append_keyed(data, "replace")
        return first, again, replaced, replaced_again

    first, again, replaced, replaced_again = run(parts, go)
    assert again.positions == first.positions and first.positions[0] == first.positions[3]
    assert replaced_again.positions == replaced.positions
    assert replaced_again.replaced == replaced.replaced != []


def test_two_sends_of_one_key_at_once_hold_it_once(parts):
    async def go():
        return await asyncio.gather(
            *[parts.appender.append_keyed(batch(["race"], seq=i + 1), "ignore") for i in range(5)]
        )

    answers = run(parts, go)
    assert len({tuple(a.positions) for a in answers}) == 1
    assert sum(a.written for a in answers) == 1


def test_cancel_by_key_and_its_retry(parts):
    async def go():
        a = await parts.appender.append_keyed(batch(["c1", "c2"], seq=1), "ignore")
        done = await parts.appender.cancel_keys(["c1", "nothing", "c1"], "p", 2)
        again = await parts.appender.cancel_keys(["c1", "nothing", "c1"], "p", 2)
        after = await parts.appender.cancel_keys(["c1"], "p", 3)
        return a, done, again, after

    a, done, again, after = run(parts, go)
    assert [len(x) for x in done] == [1, 0, 1] and done[0][0][0] == a.positions[0]
    assert again == done
    assert after == [[]]  # nothing pending under it any more
    assert parts.ctx.log.keys.candidates("c1", now_ms()) == []


def test_bad_arguments(parts):
    async def go():
        with pytest.raises(InvalidArgument, match="on_duplicate"):
            await parts.appender.append_keyed(batch(["k"], seq=1), "overwrite")
        with pytest.raises(InvalidArgument, match="keys"):
            await parts.appender.cancel_keys(["ok", 3], "p", 1)

    run(parts, go)


def test_a_message_within_the_hand_out_ahead_of_its_time_is_no_longer_pending(parts):
    # Given the partition's handout_ahead_ms (a consumer may hold a message that soon)
    ahead = parts.ctx.config.subscription.handout_ahead_ms
    assert ahead > 0

    async def go():
        # a message due after that stretch is pending: a replace cancels it ...
        a = await parts.appender.append_keyed(batch(["far"], seq=1, after_ms=60_000), "replace")
        b = await parts.appender.append_keyed(batch(["far"], seq=2, after_ms=60_000), "replace")
        # ... but one due within it is as good as delivered: the key is free, nothing is
        # cancelled (a consumer may hold it already), and an ignore writes the new one
        c = await parts.appender.append_keyed(batch(["near"], seq=3, after_ms=ahead // 2), "ignore")
        d = await parts.appender.append_keyed(batch(["near"], seq=4, after_ms=60_000), "replace")
        return a, b, c, d

    a, b, c, d = run(parts, go)
    assert [t for t, _ in b.replaced] == [a.positions[0]]
    assert d.replaced == [] and d.positions != c.positions and d.written == 1
