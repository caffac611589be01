"""Producer.send_async against fake links (no Ray): futures of MessageIds, errors at the
call or in the future, the pending bound both ways, flush, and close with sends pending."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from raydelay.client.producer import Producer
from raydelay.config import load_config
from raydelay.dispatch.keys import key_hash
from raydelay.errors import InvalidArgument, ProducerQueueIsFull, StorageError
from tests.unit.fakes import FakeTopic


@pytest.fixture
def config():
    return load_config(None)


class GatedTopic(FakeTopic):
    """A topic whose appends answer only once ``gate`` is set (a slow partition);
    ``failing`` partitions answer every append with a non-retriable store error."""

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self.gate = threading.Event()
        self.gate.set()
        self.failing: set[int] = set()
        self.waiting = threading.Event()  # set while an append waits at the gate

    def _append(self, partition, batches):
        if partition in self.failing:
            raise StorageError("disk full", retriable=False)
        return super()._append(partition, batches)

    def get(self, replies, what, timeout_s=None):
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait(10)
        return super().get(replies, what, timeout_s)


def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.001)


def test_send_async_resolves_each_future_with_where_its_message_landed(config):
    topic = FakeTopic(partitions=3)
    producer = Producer(topic, "orders", config)
    keys = [f"k{i % 7}" for i in range(300)]
    futures = [producer.send_async(f"m{i}".encode(), key=k) for i, k in enumerate(keys)]
    ids = [f.result(timeout=5) for f in futures]
    assert producer.pending_messages == 0
    for i, mid in enumerate(ids):
        assert topic.payloads[mid.partition][mid.entry_id] == f"m{i}".encode()
    for k in set(keys):  # one key: one partition, in send order
        mine = [mid for mid, kk in zip(ids, keys, strict=True) if kk == k]
        assert len({m.partition for m in mine}) == 1
        assert [m.entry_id for m in mine] == sorted(m.entry_id for m in mine)


def test_bad_input_raises_at_the_call_and_queues_nothing(config):
    topic = FakeTopic(partitions=1)
    producer = Producer(topic, "orders", config)
    with pytest.raises(InvalidArgument, match="payload"):
        producer.send_async("not bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="deliver_after"):
        producer.send_async(b"x", deliver_after=-1.0)
    with pytest.raises(InvalidArgument):
        producer.send_async(b"x", deliver_after=1.0, deliver_at=1_790_000_000_000)
    with pytest.raises(InvalidArgument, match="properties"):
        producer.send_async(b"x", properties={"k": 1})  # type: ignore[dict-item]
    assert producer.pending_messages == 0
    producer.flush()
    assert topic.calls == []


def test_a_failed_partition_fails_its_own_futures_and_nothing_of_it_is_appended(config):
    topic = GatedTopic(partitions=2)
    topic.failing.add(1)
    producer = Producer(topic, "orders", config)
    topic.gate.clear()  # hold the first round so that both partitions go in one
    zero = next(f"z{i}" for i in range(100) if key_hash(f"z{i}") % 2 == 0)
    first = producer.send_async(b"first", key=zero)  # (to partition 0, which holds)
    wait_until(topic.waiting.is_set)
    keys = [f"key-{i}" for i in range(40)]
    futures = [producer.send_async(f"m{i}".encode(), key=k) for i, k in enumerate(keys)]
    topic.gate.set()
    first.result(timeout=5)
    concurrent.futures.wait(futures, timeout=5)
    ok = [f for f in futures if f.exception() is None]
    failed = [f for f in futures if f.exception() is not None]
    assert ok and failed  # the keys spread over both partitions
    assert all(isinstance(f.exception(), StorageError) for f in failed)
    assert all(f.result().partition == 0 for f in ok)
    assert topic.payloads[1] == []  # nothing of the failed partition went in
    for f in ok:  # each id points at its own payload
        assert topic.payloads[0][f.result().entry_id] == f"m{futures.index(f)}".encode()


def test_a_full_queue_blocks_the_sender_until_an_answer_makes_room(config):
    topic = GatedTopic(partitions=1)
    producer = Producer(topic, "orders", config, max_pending_messages=2)
    topic.gate.clear()
    a, b = producer.send_async(b"a"), producer.send_async(b"b")
    third: list = []
    sender = threading.Thread(target=lambda: third.append(producer.send_async(b"c")))
    sender.start()
    wait_until(topic.waiting.is_set)
    sender.join(timeout=0.2)
    assert sender.is_alive() and not third  # blocked: two sends pending
    topic.gate.set()
    sender.join(timeout=5)
    assert not sender.is_alive()
    ids = [a.result(5), b.result(5), third[0].result(5)]
    assert [topic.payloads[0][m.entry_id] for m in ids] == [b"a", b"b", b"c"]


def test_a_full_queue_raises_when_the_producer_must_not_block(config):
    topic = GatedTopic(partitions=1)
    producer = Producer(topic, "orders", config, max_pending_messages=2, block_if_queue_full=False)
    topic.gate.clear()
    pending = [producer.send_async(b"a"), producer.send_async(b"b")]
    with pytest.raises(ProducerQueueIsFull, match="max_pending_messages = 2"):
        producer.send_async(b"c")
    assert producer.pending_messages == 2
    topic.gate.set()
    producer.flush()
    assert [f.result().entry_id for f in pending] == [0, 1]
    assert topic.payloads[0] == [b"a", b"b"]  # the refused one was never queued


def test_flush_waits_for_every_pending_send(config):
    topic = GatedTopic(partitions=2)
    producer = Producer(topic, "orders", config)
    topic.gate.clear()
    futures = [producer.send_async(f"m{i}".encode()) for i in range(50)]
    flushed = threading.Event()
    flusher = threading.Thread(target=lambda: (producer.flush(), flushed.set()))
    flusher.start()
    wait_until(topic.waiting.is_set)
    assert not flushed.wait(0.1)  # still waiting on the gated answers
    topic.gate.set()
    assert flushed.wait(5)
    assert all(f.done() for f in futures) and producer.pending_messages == 0
    assert sum(len(v) for v in topic.payloads.values()) == 50


def test_close_with_sends_pending_resolves_them_all_then_refuses_new_ones(config):
    topic = GatedTopic(partitions=1)
    closed: list = []
    producer = Producer(topic, "orders", config, on_close=closed.append)
    topic.gate.clear()
    futures = [producer.send_async(f"m{i}".encode()) for i in range(20)]
    closer = threading.Thread(target=producer.close)
    closer.start()
    wait_until(topic.waiting.is_set)
    wait_until(lambda: producer.closed)  # (the flusher can reach the gate before close starts)
    with pytest.raises(InvalidArgument, match="closed"):
        producer.send_async(b"late")
    topic.gate.set()
    closer.join(timeout=5)
    assert not closer.is_alive() and closed == [producer]
    assert [f.result(0).entry_id for f in futures] == list(range(20))
    assert topic.payloads[0] == [f"m{i}".encode() for i in range(20)]


def test_a_send_future_works_with_the_standard_future_tools(config):
    topic = GatedTopic(partitions=1)
    producer = Producer(topic, "orders", config)
    topic.gate.clear()
    fut = producer.send_async(b"x")
    assert isinstance(fut, concurrent.futures.Future)
    called: list = []
    fut.add_done_callback(called.append)
    assert fut.cancel() is False  # a queued send is not taken back
    with pytest.raises(concurrent.futures.TimeoutError):
        fut.result(timeout=0.05)
    done, not_done = concurrent.futures.wait([fut], timeout=0.05)
    assert not done and not_done == {fut}
    topic.gate.set()
    done, _ = concurrent.futures.wait([fut], timeout=5)
    assert done == {fut} and called == [fut]
    assert list(concurrent.futures.as_completed([fut], timeout=5)) == [fut]
    fut.add_done_callback(called.append)  # on a done future: called at once
    assert called == [fut, fut] and fut.result().entry_id == 0


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, "10"])
def test_max_pending_messages_takes_a_positive_int_or_minus_one(config, bad):
    with pytest.raises(InvalidArgument, match="max_pending_messages"):
        Producer(FakeTopic(1), "orders", config, max_pending_messages=bad)


def test_minus_one_pending_messages_is_no_limit(config):
    topic = GatedTopic(partitions=1)
    producer = Producer(topic, "orders", config, max_pending_messages=-1)
    topic.gate.clear()
    futures = [producer.send_async(b"x") for _ in range(20_000)]  # never blocks
    assert producer.pending_messages == 20_000
    topic.gate.set()
    producer.flush()
    assert futures[-1].result().entry_id == 19_999


def test_block_if_queue_full_must_be_a_bool(config):
    with pytest.raises(InvalidArgument, match="block_if_queue_full"):
        Producer(FakeTopic(1), "orders", config, block_if_queue_full="no")  # type: ignore[arg-type]


def test_a_done_callback_that_sends_into_a_full_queue_gets_an_error_not_a_deadlock(config):
    # Given a producer with room for one send, whose pending first send has a callback
    # that sends again (callbacks run on the sending thread, before its round frees room)
    topic = GatedTopic(partitions=1)
    producer = Producer(topic, "orders", config, max_pending_messages=1)
    topic.gate.clear()
    first = producer.send_async(b"first")
    errors: list = []

    def send_more(_fut) -> None:
        try:
            producer.send_async(b"from the callback")
        except ProducerQueueIsFull as exc:
            errors.append(exc)

    first.add_done_callback(send_more)
    # When the first answer comes
    topic.gate.set()
    first.result(timeout=5)
    wait_until(lambda: producer.pending_messages == 0)
    # Then the callback was told the queue is full, instead of waiting for itself
    assert len(errors) == 1 and topic.payloads[0] == [b"first"]


def test_keyless_sends_keep_one_partition_for_a_run_then_take_the_next(config):
    from raydelay.client.producer import STICKY

    # Given a topic of 3 partitions and 3 runs' worth of keyless sends
    topic = FakeTopic(partitions=3)
    producer = Producer(topic, "orders", config, max_pending_messages=-1)
    futures = [producer.send_async(b"m") for _ in range(3 * STICKY)]
    producer.flush()
    parts = [f.result().partition for f in futures]
    # Then each run of STICKY sends went to one partition, and the runs took each in turn
    runs = [parts[i * STICKY : (i + 1) * STICKY] for i in range(3)]
    assert all(len(set(run)) == 1 for run in runs)
    assert sorted(run[0] for run in runs) == [0, 1, 2]
    # and a keyed send still goes where its key hashes, whatever the run
    assert (
        producer.send(b"k", key="order-17").partition
        == producer.send(b"k", key="order-17").partition
    )


def test_keyless_sends_of_short_lived_producers_spread_over_the_partitions(config):
    # Given 40 producers that send a few keyless messages each (a CLI produce, a script)
    topic = FakeTopic(partitions=4)
    for _ in range(40):
        producer = Producer(topic, "orders", config)
        producer.send(b"one")
        producer.send_many([b"two", b"three"])
        producer.close()
    # Then their runs start at partitions of chance, not all at the first
    used = [p for p in range(4) if topic.payloads[p]]
    assert len(used) >= 3, {p: len(topic.payloads[p]) for p in range(4)}
    # and none is lost
    assert sum(len(v) for v in topic.payloads.values()) == 120


def test_futures_of_one_round_wake_their_waiters_with_each_ones_own_outcome(config):
    """A round's futures share its state: a waiter on some of them (wait, as_completed,
    FIRST_EXCEPTION, a done-callback, asyncio) sees each one's own result or error."""
    import asyncio

    topic = GatedTopic(partitions=2)
    topic.failing.add(1)
    producer = Producer(topic, "orders", config)
    zero = [k for k in (f"k{i}" for i in range(200)) if key_hash(k) % 2 == 0][:3]
    one = [k for k in (f"k{i}" for i in range(200)) if key_hash(k) % 2 == 1][:3]
    topic.gate.clear()
    held = producer.send_async(b"held", key=zero[0])  # the next sends queue as one round
    wait_until(topic.waiting.is_set)
    good = [producer.send_async(b"g" + k.encode(), key=k) for k in zero]
    bad = [producer.send_async(b"b" + k.encode(), key=k) for k in one]
    seen: list = []
    bad[1].add_done_callback(lambda f: seen.append(f.exception()))

    async def awaited():
        return await asyncio.wrap_future(good[2])

    waiter = concurrent.futures.ThreadPoolExecutor(1).submit(
        concurrent.futures.wait, good + bad, 5, concurrent.futures.FIRST_EXCEPTION
    )
    assert not good[0].done() and "pending" in repr(good[0])
    topic.gate.set()
    done, _ = waiter.result(timeout=5)
    assert set(bad) <= done
    assert [f.result(timeout=5).partition for f in good] == [0, 0, 0]
    assert [type(f.exception()) for f in bad] == [StorageError] * 3
    assert isinstance(seen[0], StorageError)
    assert set(concurrent.futures.as_completed(good + bad, timeout=5)) == set(good + bad)
    assert asyncio.run(awaited()) == good[2].result()
    assert held.result().entry_id == 0 and "finished" in repr(good[0])
    with pytest.raises(RuntimeError):
        good[0].set_result(None)  # its producer resolves it
