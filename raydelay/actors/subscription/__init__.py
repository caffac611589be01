"""A subscription's actor, and the asyncio shell around each pure ``Subscription`` in it.

One :class:`SubscriptionActor` process (:mod:`.actor`) serves every partition of a
subscription (or, with ``subscription.partitions_per_actor``, a group of them): a
:class:`~raydelay.actors.subscription.shell.SubscriptionShell` per partition, each the
actor-side owner of its own pure :class:`~raydelay.dispatch.subscription.Subscription`.

A shared subscription indexes no delayed message itself: the partition's host does it once
for every subscription. Due delayed messages come with their payloads from the host's
unsealed index (``due_unsealed``) and from the partition's sealed buckets (see
:mod:`raydelay.delayed.reader`); the log is read for everything else, and an in-memory
tracker holds only this subscription's delayed nacks.

The shell owns the I/O; the subscription decides. A consumer's ``receive`` is
``Subscription.receive`` given a fetch that reads the partition on its host. Beside the
calls, per partition, a driver (:mod:`.driver`) runs ``Subscription.step`` and the I/O it
asks for, and a log reader (:mod:`.log_reader`) reads the log ahead; the other parts are
listed in :mod:`.shell`. The picture is in docs/design.md ("actors/subscription").

This package re-exports what the rest of raydelay starts and calls: the actor class and
:func:`spawn_subscription`.
"""

from raydelay.actors.subscription.actor import SubscriptionActor, spawn_subscription

__all__ = ["SubscriptionActor", "spawn_subscription"]
