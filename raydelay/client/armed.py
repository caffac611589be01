"""Whether each recurring schedule has its next occurrence waiting in the tasks topic.

A schedule lives as a chain: each occurrence arms the next when it fires. An occurrence
is found either pending under the schedule's name (the key index of its partition: due
later), or due and not delivered yet (a peek of the ``runners`` subscription by key). A
schedule with neither has lost its chain, and nothing of it will run: ``schedules list``
shows it, the console too, and runner 0 counts it in ``raydelay_schedules_unarmed``.

(For the moment an occurrence fires, it is held by a runner, which arms the next first:
a look that falls in that moment, or in the lease after a runner died holding it, sees
no occurrence. The runner counts a schedule only when two looks in a row saw none.)
"""

from __future__ import annotations

from raydelay.actors.host import HostActor
from raydelay.actors.subscription import SubscriptionHost
from raydelay.client.peers import ClusterPeers
from raydelay.dispatch.keys import key_hash

RUNNERS_SUBSCRIPTION = "runners"


def armed(peers: ClusterPeers, topic: str, names: list[str]) -> dict[str, bool]:
    """Per schedule name: whether an occurrence of it waits in ``topic``. One call per
    partition for all the names, then one peek per name not pending."""
    if not names:
        return {}
    n = peers.partitions(topic)
    by_partition: dict[int, list[str]] = {}
    for name in names:
        by_partition.setdefault(key_hash(name) % n, []).append(name)
    parts = list(by_partition)
    answers = peers.call(
        lambda: [
            peers.topic_peer(topic, p).submit(HostActor.pending_keys, topic, p, by_partition[p])
            for p in parts
        ],
        "topic",
    )
    out: dict[str, bool] = {}
    for p, pending in zip(parts, answers, strict=True):
        for name in by_partition[p]:
            out[name] = bool(pending.get(name))
    waiting = [name for name in names if not out[name]]
    if waiting:
        peeks = peers.call(
            lambda: [
                peers.on_subscription(
                    topic,
                    key_hash(name) % n,
                    RUNNERS_SUBSCRIPTION,
                    SubscriptionHost.peek,
                    1,
                    None,
                    None,
                    name,
                )
                for name in waiting
            ],
            "subscription",
        )
        for name, batch in zip(waiting, peeks, strict=True):
            out[name] = batch.num_rows > 0
    return out
