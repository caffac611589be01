"""Subscription hosts, the units they serve, and the asyncio shell around each pure
``Subscription`` in them.

A :class:`SubscriptionHost` process (:mod:`.host`) serves many units of any
subscriptions. A unit (:mod:`.unit`) is every partition of a subscription (or, with
``subscription.partitions_per_actor``, a group of them): a
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

This package re-exports what the rest of raydelay calls: the host's class and
:func:`unit_peer`.
"""

from raydelay.actors.subscription.host import SubscriptionHost, UnitPeer, unit_peer

__all__ = ["SubscriptionHost", "UnitPeer", "unit_peer"]
