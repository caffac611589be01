"""Dead-letter redrive: send the messages of a dead-letter topic back to where they came
from (SQS's redrive), each exactly once, however often the redrive is interrupted and
run again.

A dead letter carries its origin in its properties (``raydelay.original_message_id``,
``topic/partition/ledger:entry``, set when it was dead-lettered). A redrive reads the
dead-letter topic through its own exclusive subscription (``raydelay-redrive``: one
redrive at a time; a second one waits for it, or for a killed one's lease to lapse) and,
a batch at a time, up to what the topic held when it started (messages dead-lettered
again meanwhile wait for the next redrive):

1. appends each message to its source topic (or ``to_topic``) on the partition it came
   from, due at once, with its payload, key and properties (the ``raydelay.*`` ones
   replaced by ``raydelay.redriven_from``: its dead-letter id), so its redelivery count
   starts again from 0;
2. then acknowledges the batch in the dead-letter topic.

Step 1 uses a named producer per dead-letter partition, and each message is its own
batch whose sequence id is its position in the dead-letter topic: a redrive interrupted
between 1 and 2 gets the same messages again, in the same order, and the topic
recognises every batch it already holds. Nothing is appended twice and nothing is acked
before it is durable where it goes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from raydelay.actors.host import HostActor
from raydelay.client.message import Message, MessageId
from raydelay.errors import ConsumerBusy, InvalidArgument, NotFound, RaydelayError
from raydelay.log.entries import NO_DELAY, Entries
from raydelay.log.partition import StaleSequence
from raydelay.positions import key_of

if TYPE_CHECKING:
    from raydelay.client.producer import Producer
    from raydelay.client.topics import Topics

log = logging.getLogger(__name__)

SUBSCRIPTION = "raydelay-redrive"
ORIGIN = "raydelay.original_message_id"
REDRIVEN_FROM = "raydelay.redriven_from"
BATCH = 1_000


def redrive(
    topics: Topics,
    dead_letter_topic: str,
    to_topic: str | None,
    limit: int,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Move up to ``limit`` dead letters (-1: all) back; returns how many moved. See the
    module's docstring."""
    n = check_redrive_target(topics.peers.partitions, dead_letter_topic, to_topic)
    # what is dead already: messages dead-lettered again while this runs (their consumer
    # still fails) wait for the next redrive, or one run would go round for ever
    ends = topics.peers.on_partitions(dead_letter_topic, n, HostActor.tail)
    try:
        topics.peers.subscription_options(dead_letter_topic, SUBSCRIPTION)
        created = False
    except NotFound:
        created = True  # (this redrive's subscription: it goes again if nothing moved)
    consumer = _exclusive(topics, dead_letter_topic)
    producers: dict[tuple[str, str], Producer] = {}
    moved = empty = 0
    try:
        while limit == -1 or moved < limit:
            want = BATCH if limit == -1 else min(BATCH, limit - moved)
            got = consumer.receive(max_messages=want, timeout_s=1.0)
            msgs = [m for m in got if _before(m.message_id, ends)]
            if got and not msgs:
                break  # (past every end: what is left came in after the start)
            if not msgs:
                empty += 1  # (the backlog counts what the subscription has not read yet)
                if empty >= 5 or not _backlog(topics, dead_letter_topic):
                    break
                continue
            empty = 0
            _send_back(topics, dead_letter_topic, msgs, to_topic, producers)
            consumer.ack(msgs)
            consumer.flush()
            moved += len(msgs)
            if progress is not None:
                progress(moved)
    except BaseException:
        if created and moved == 0:
            # nothing moved: leave no subscription behind to pin the topic's log
            consumer.close()
            _forget_subscription(topics, dead_letter_topic)
        raise
    finally:
        consumer.close()
        for producer in producers.values():
            producer.close()
    return moved


def check_redrive_target(
    partitions_of: Callable[[str], int], dead_letter_topic: str, to_topic: str | None
) -> int:
    """What a redrive checks before it moves anything (the console too, before it asks for
    confirmation): the dead-letter topic exists, and ``to_topic``, if given, exists and is
    another topic. ``partitions_of(topic)`` gives a topic's partition count, NotFound when
    it does not exist. Returns the dead-letter topic's partition count."""
    if to_topic == dead_letter_topic:
        raise InvalidArgument(f"to_topic: {to_topic!r} is the dead-letter topic itself")
    try:
        n = partitions_of(dead_letter_topic)
    except NotFound:
        raise NotFound(f"dead_letter_topic: there is no topic {dead_letter_topic!r}") from None
    if to_topic is not None:
        try:
            partitions_of(to_topic)
        except NotFound:
            raise NotFound(f"to_topic: there is no topic {to_topic!r}") from None
    return n


def _forget_subscription(topics: Topics, topic: str) -> None:
    try:
        topics.delete_subscription(topic, SUBSCRIPTION)
    except RaydelayError as exc:  # the redrive's own error is the one to raise
        log.warning("redrive: could not delete its subscription of %s: %s", topic, exc)


def _exclusive(topics: Topics, topic: str) -> Any:
    """The redrive's consumer; while another redrive holds the subscription (or a killed
    one's lease runs), wait for it, up to the lease and a margin."""
    lease_s = topics.config.subscription.consumer_lease_s
    deadline = time.monotonic() + lease_s + 5.0
    while True:
        try:
            return topics.subscribe(topic, SUBSCRIPTION, "exclusive")
        except ConsumerBusy:
            if time.monotonic() > deadline:
                raise ConsumerBusy(
                    f"redrive: another redrive of {topic} is running (its subscription "
                    f"{SUBSCRIPTION!r} has a consumer)"
                ) from None
            log.warning(
                "another redrive of %s holds it (or a killed one's lease runs): waiting", topic
            )
            time.sleep(1.0)


def _before(mid: MessageId, ends: list) -> bool:
    """Whether ``mid`` was in the dead-letter topic when the redrive started."""
    end = ends[mid.partition]
    return end is not None and (mid.ledger_id, mid.entry_id) <= (int(end[0]), int(end[1]))


def _backlog(topics: Topics, topic: str) -> int:
    return int(topics.stats(topic, SUBSCRIPTION)["backlog"])


def _send_back(
    topics: Topics,
    dlq: str,
    msgs: list[Message],
    to_topic: str | None,
    producers: dict[tuple[str, str], Producer],
) -> None:
    """Append each of ``msgs`` where it goes (one batch each, its sequence id its position
    in the dead-letter topic); every batch is durable when this returns."""
    by_target: dict[tuple[str, str], list[tuple[int, int, Entries]]] = {}
    for m in sorted(msgs, key=lambda m: m.message_id):
        target, partition = _target(topics, dlq, m, to_topic)
        props = {k: v for k, v in m.properties.items() if not k.startswith("raydelay.")}
        props[REDRIVEN_FROM] = str(m.message_id)
        entries = Entries.build([m.payload], np.array([NO_DELAY], dtype=np.int64), [m.key], [props])
        seq = key_of(m.message_id.ledger_id, m.message_id.entry_id) + 1
        name = _producer_name(dlq, m.message_id.partition)
        by_target.setdefault((target, name), []).append((partition, seq, entries))
    for (target, name), batches in by_target.items():
        producer = producers.get((target, name))
        if producer is None:
            producer = producers[(target, name)] = topics.create_producer(target, name)
        try:
            producer.append_sequenced(batches)
        except StaleSequence:
            # some were appended by an interrupted run, too long ago for the topic to
            # name their positions: one at a time, to tell those from the rest
            for batch in batches:
                try:
                    producer.append_sequenced([batch])
                except StaleSequence:
                    pass  # (held already)


def _target(topics: Topics, dlq: str, m: Message, to_topic: str | None) -> tuple[str, int]:
    """The topic and partition a dead letter goes back to."""
    origin = m.properties.get(ORIGIN)
    source = None
    if origin is not None:
        try:
            source = MessageId.parse(origin)
        except InvalidArgument:
            source = None
    if to_topic is not None:
        topic = to_topic
    elif source is not None:
        topic = source.topic
    else:
        raise InvalidArgument(
            f"to_topic: dead letter {m.message_id} has no {ORIGIN} property to say where it "
            "came from; give to_topic"
        )
    if topic == dlq:
        raise InvalidArgument(
            f"redrive: dead letter {m.message_id} came from the dead-letter topic itself; give "
            "to_topic"
        )
    try:
        n = topics.peers.partitions(topic)
    except NotFound:
        raise NotFound(
            f"redrive: dead letter {m.message_id} came from {topic!r}, which does not exist "
            "any more; give to_topic"
        ) from None
    return topic, (source.partition if source is not None else m.message_id.partition) % n


def _producer_name(dlq: str, partition: int) -> str:
    """The producer name of one dead-letter partition's redrives (a valid name, however
    long the topic's)."""
    name = f"redrive.{dlq}.{partition}"
    if len(name) > 128:
        name = f"redrive.{hashlib.sha1(dlq.encode()).hexdigest()}.{partition}"
    return name
