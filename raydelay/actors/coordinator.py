"""CoordinatorActor: a thin shell over :class:`~raydelay.cluster.metadata.Metadata`.

One per cluster (named ``coordinator``, detached, restarted forever). Calls are
served one at a time; every change is journaled in the store before it returns.

It assigns partitions to partition hosts (:meth:`CoordinatorActor.locate`) and
subscription units to subscription hosts (:meth:`CoordinatorActor.locate_unit`), and
starts those hosts through the ``start_host`` it is given when created
(``raydelay.actors.host.spawn_host``, passed by ``raydelay.actors.host.coordinator_peer``).
When a node is lost, every partition and unit of its hosts moves at once, and the new
hosts are told to open them through the ``adopt`` it is given the same way
(``raydelay.actors.host.adopt_on_host``): hosts call the coordinator, so this module
imports no other actor's.

While it serves, a second one stands by on another node, warm, and takes over when this
one's node is lost (``raydelay.actors.standby``): a standby's first call makes it serve.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import ray

from raydelay.actors.standby import (
    FIRST_LOOK_AFTER_TAKE_OVER_S,
    FIRST_LOOK_S,
    ROLE_GROUP,
    RayCoordinators,
    StandbyKeeper,
    Standing,
)
from raydelay.cluster import placement, rpc
from raydelay.cluster.metadata import Metadata
from raydelay.cluster.names import COORDINATOR, Unit, host_node_prefix, subscription_groups
from raydelay.cluster.nodes import check_store
from raydelay.cluster.owner import StoreOwner
from raydelay.config import config_from_dict, config_to_dict
from raydelay.errors import NotFound
from raydelay.storage import make_store
from raydelay.storage.keys import subscription_prefix

log = logging.getLogger(__name__)

# Starts the host of a given name with a given config (``raydelay.actors.host.spawn_host``).
StartHost = Callable[[str, dict[str, Any]], Any]
# Has the running host of a given name open the given partitions (a subscription host: units)
# now, without waiting (``raydelay.actors.host.adopt_on_host``).
Adopt = Callable[[str, list], None]


def _no_adopt(host: str, keys: list) -> None:
    """Without an ``Adopt``, moved work is opened by its callers' next calls."""


# how often a lookup of a unit looks for warm subscription slots that do not run (the
# lookups come in bursts after a node loss, and this one is served one call at a time)
KEEP_WARM_EVERY_S = 2.0


# what a standby answers without taking over (the rest needs the metadata)
_STANDBY_ANSWERS = ("call_times", "pid", "role")


def _entry_points(cls: type) -> type:
    """Each public method of ``cls`` serves only once the coordinator does (a standby's
    first call takes over: ``_serve``) and counts its calls and their time
    (``call_times``)."""
    for name, fn in list(vars(cls).items()):
        if name.startswith("_") or not callable(fn) or name in _STANDBY_ANSWERS:
            continue

        def served(self: Any, *args: Any, __fn: Any = fn, **kwargs: Any) -> Any:
            if self._meta is None:
                self._serve()
            began = time.monotonic()
            try:
                return __fn(self, *args, **kwargs)
            finally:
                self._times.add(__fn.__name__, time.monotonic() - began)

        setattr(cls, name, functools.wraps(fn)(served))
    return cls


class _CallTimes:
    def __init__(self) -> None:
        self.by_method: dict[str, list[float]] = {}  # name -> [calls, seconds, longest]

    def add(self, name: str, seconds: float) -> None:
        row = self.by_method.setdefault(name, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += seconds
        row[2] = max(row[2], seconds)


@_entry_points
class CoordinatorActor:
    def __init__(
        self,
        config: dict[str, Any],
        start_host: StartHost,
        adopt: Adopt = _no_adopt,
        standby: bool = False,
    ) -> None:
        """``standby``: stand by, warm, and take over on the first call that needs the
        metadata (``raydelay.actors.standby``); otherwise serve from the start."""
        self._times = _CallTimes()
        self._config = config_from_dict(config)
        self._start_host = start_host
        self._adopt = adopt
        self._warm_at = -KEEP_WARM_EVERY_S  # when the warm slots were last looked at
        check_store(self._config.storage)  # before anything is written where it should not be
        self._store = make_store(self._config)
        context = ray.get_runtime_context()
        self._name = context.get_actor_name() or COORDINATOR
        coordinators = RayCoordinators(self._config.placement.avoid_head)
        self._standing = Standing(self._name, not standby, coordinators)
        self._keeper = StandbyKeeper(
            self._name, context.get_node_id(), self._spawn_standby, coordinators
        )
        self._owner = StoreOwner(self._store, context.gcs_address)
        self._meta: Metadata | None = None
        self.claim = None
        if not standby:
            self._activate()
            self._keep_standby(FIRST_LOOK_S)

    def _activate(self) -> None:
        """Claim the store, then load the metadata. The store is ours before anything is
        read or written (StoreOwned: another cluster holds it, and this actor must not
        come up)."""
        self.claim = rpc.recover(self._owner.acquire, what="coordinator: owning the store")
        self._meta = rpc.recover(
            lambda: Metadata(self._store, guard=self._owner.check, fence=self._owner.fence),
            what="coordinator",
        )

    def _serve(self) -> None:
        """A standby's first call: take over (Unavailable while the other serves)."""
        self._standing.take_over(self._activate)
        self._keep_standby(FIRST_LOOK_AFTER_TAKE_OVER_S)

    def _keep_standby(self, first_look_s: float) -> None:
        if self._config.placement.standby_coordinator:
            self._keeper.start(first_look_s)

    def _spawn_standby(self, name: str, node: str) -> Any:
        return spawn_coordinator(
            config_to_dict(self._config), self._start_host, self._adopt, name=name, node=node
        )

    @property
    def meta(self) -> Metadata:
        assert self._meta is not None, "a standby serves nothing"
        return self._meta

    def role(self) -> str:
        """Whether this coordinator serves, is taking over, or stands by (a
        ``raydelay.actors.standby.Role``'s value); answered at once, on a thread of its
        own (``ROLE_GROUP``)."""
        return self._standing.role.value

    def call_times(self) -> dict[str, dict[str, float]]:
        """Per method, since this process started: its calls, the seconds they took in all,
        and the longest (calls are served one at a time: the sum is how busy it was)."""
        return {
            name: {"calls": int(n), "seconds": round(total, 3), "longest_s": round(top, 3)}
            for name, (n, total, top) in sorted(self._times.by_method.items())
        }

    def owner(self) -> dict[str, Any]:
        """This cluster's claim on the store."""
        assert self.claim is not None
        return dataclasses.asdict(self.claim)

    def config(self) -> dict[str, Any]:
        return config_to_dict(self._config)

    def ping(self) -> int:
        return self.meta.seq

    def pid(self) -> int:
        """The process id (tests use it to see a restart)."""
        return os.getpid()

    def create_topic(self, topic: str, partitions: int) -> int:
        return self.meta.create_topic(topic, partitions)

    def delete_topic(self, topic: str) -> int:
        """Delete a topic's objects (its log, and its subscriptions' cursors and buckets),
        then its metadata; returns how many objects went. Its actors must be stopped
        first. Retrying after a failure finishes the job."""
        self.meta.partitions(topic)  # NotFound before touching anything
        deleted = 0
        for prefix in (f"topics/{topic}/", f"subs/{topic}/"):
            for key in self._store.list(prefix):
                self._store.delete(key)
                deleted += 1
        self.meta.delete_topic(topic)
        return deleted

    def delete_subscription(self, topic: str, subscription: str) -> int:
        """Delete a subscription's cursors in the store, then its metadata; returns how many
        objects went. Its actors must be stopped first. Retrying finishes the job."""
        n = self.meta.partitions(topic)
        self.meta.subscription(topic, subscription)  # NotFound before touching anything
        deleted = 0
        for p in range(n):
            for key in self._store.list(subscription_prefix(topic, p, subscription) + "/"):
                self._store.delete(key)
                deleted += 1
        self.meta.delete_subscription(topic, subscription)
        return deleted

    def partitions(self, topic: str) -> int:
        return self.meta.partitions(topic)

    def topics(self) -> dict[str, int]:
        return self.meta.topics()

    def ledgers(self, topic: str, partition: int) -> list[list]:
        return self.meta.ledgers(topic, partition)

    def roll_ledger(self, topic: str, partition: int, closed: int | None, count: int) -> int:
        return self.meta.roll_ledger(topic, partition, closed, count)

    def retention(self, topic: str, partition: int) -> list[int]:
        return self.meta.retention(topic, partition)

    def drop_ledgers(self, topic: str, partition: int, ledger_ids: list[int]) -> None:
        self.meta.drop_ledgers(topic, partition, ledger_ids)

    def create_subscription(
        self, topic: str, subscription: str, options: dict, start: list | None = None
    ) -> dict:
        return self.meta.create_subscription(topic, subscription, options, start)

    def subscriptions(self, topic: str) -> dict[str, dict]:
        return self.meta.subscriptions(topic)

    def subscription(self, topic: str, subscription: str) -> dict:
        return self.meta.subscription(topic, subscription)

    def set_mark_delete(self, topic: str, partition: int, subscription: str, position) -> None:
        self.meta.set_mark_delete(topic, partition, subscription, position)

    def set_progress(
        self, topic: str, partition: int, subscription: str, position, log_mark, progress
    ) -> None:
        self.meta.set_progress(topic, partition, subscription, position, log_mark, progress)

    def set_progress_many(self, reports: list) -> int:
        """Many ``set_progress`` reports in one journal record (see
        ``Metadata.set_progress_many``); returns how many changed."""
        return self.meta.set_progress_many(reports)

    def progress(self, topic: str, partition: int, subscription: str) -> dict:
        return self.meta.progress(topic, partition, subscription)

    def bucket_retention(
        self, topic: str, partition: int, name: str, through_key: str
    ) -> list[str]:
        return self.meta.bucket_retention(topic, partition, name, through_key)

    def mark_delete(self, topic: str, partition: int, subscription: str) -> list[int]:
        return self.meta.mark_delete(topic, partition, subscription)

    # --- partition hosts -------------------------------------------------------------------

    def locate(self, topic: str, partition: int) -> str:
        """The name of the host that serves the partition, started when it is not running.
        A partition not assigned yet, or assigned to a host that ended for good (its node
        was lost), is assigned to a host slot of a live node first (journaled; see
        ``Assignments.choose_host``). A lost node's partitions and units all move at once
        (:meth:`_evacuate`)."""
        current = self.meta.hosts.host_of(topic, partition)
        live = placement.live_hosts()
        # (a caller asks again after a failed call: a host whose node's raylet refuses
        # connections is lost before Ray's health checks say so)
        if current is not None and current in live and not placement.stranded(current):
            return current
        if current is not None and self._evacuate(current):
            return str(self.meta.hosts.host_of(topic, partition))
        return self._place(topic, partition, current, placement.live_hosts())

    def _place(self, topic: str, partition: int, current: str | None, live: dict) -> str:
        """Assign the partition to a host slot (journaled), starting its host if it does not
        run; one whose host was lost goes to a running host, so nothing starts."""
        slots, node_of = placement.host_slots(self._config_dict())
        moving = set(live) if current is not None else None
        host = self.meta.hosts.choose_host(topic, partition, slots, node_of, moving)
        self.meta.hosts.assign(topic, partition, host)
        if current is not None:
            log.warning("%s/%d: host %s is gone; assigned to %s", topic, partition, current, host)
        if host not in live:
            self._start_host(host, self._config_dict())
            live[host] = node_of[host]  # (an evacuation's next partition sees it running)
        return host

    def _evacuate(self, lost: str) -> bool:
        """When the node of host ``lost`` (a partition host or a subscription host) is gone
        (Ray says it is dead, or its raylet refuses connections; a node of an earlier Ray
        session is not: see :func:`placement.node_lost`), assign every partition and unit
        of that node's hosts to hosts of the nodes left now, rather than each when its
        callers come back, and have each new host open what it got at once, in parallel
        (``adopt``: fire and forget; the host claims each as on a first call, so fencing is
        unchanged). Returns whether the node was lost."""
        if not placement.node_lost(lost):
            return False
        prefix = host_node_prefix(lost)
        adopted: dict[str, list] = {}
        live = placement.live_hosts()
        for key, host in self.meta.hosts.assignments().items():
            if host_node_prefix(host) == prefix and host not in live:
                topic, p = key.rsplit("/", 1)
                new = self._place(topic, int(p), host, live)
                adopted.setdefault(new, []).append((topic, int(p)))
        config = self._config_dict()
        live = placement.live_hosts("SubscriptionHost")
        for key, host in self.meta.hosts.unit_assignments().items():
            if host_node_prefix(host) == prefix and host not in live:
                unit = Unit.of_key(key)
                try:
                    new = self._place_unit(unit, host, live, config)
                except NotFound:  # (its subscription is being deleted)
                    continue
                adopted.setdefault(new, []).append(tuple(unit))
        if adopted:
            log.warning(
                "node %s lost: its work moved at once (%s)",
                prefix,
                ", ".join(f"{len(v)} to {h}" for h, v in sorted(adopted.items())),
            )
        for host, keys in adopted.items():
            try:
                self._adopt(host, keys)
            except Exception as exc:  # noqa: BLE001 - their callers open them anyway
                log.warning("%s: cannot have it adopt %d item(s): %s", host, len(keys), exc)
        return True

    def claim_partition(self, topic: str, partition: int, host: str) -> str:
        """A host about to serve the partition asks whether it may: the partition's host
        after the call (``host`` itself when it was assigned to it, or to nobody, or to a
        host that ended for good)."""
        current = self.meta.hosts.host_of(topic, partition)
        if current == host:
            return host
        if current is not None and current in placement.live_hosts():
            return current
        return self.meta.hosts.assign(topic, partition, host)

    def assignments(self) -> dict[str, str]:
        """``"topic/partition"`` -> its host, for every assigned partition."""
        return self.meta.hosts.assignments()

    def host_partitions(self, host: str) -> list[tuple[str, int]]:
        """The partitions assigned to ``host``."""
        out = []
        for key, h in self.meta.hosts.assignments().items():
            if h == host:
                topic, p = key.rsplit("/", 1)
                out.append((topic, int(p)))
        return sorted(out)

    def _config_dict(self) -> dict[str, Any]:
        return config_to_dict(self._config)

    # --- subscription hosts ----------------------------------------------------------------

    def locate_unit(self, topic: str, subscription: str, group: int) -> str:
        """The name of the subscription host that serves partition group ``group`` of a
        subscription. A unit not assigned yet, or assigned to a host that ended for good
        (or whose node's raylet refuses connections), is assigned to a slot first
        (journaled; see ``Assignments.choose_subhost``): after a node loss, a slot already
        running, so nothing starts on the way back. NotFound once the subscription is
        deleted. Keeps the warm slots of every node running
        (``placement.warm_subscription_hosts``; looked at every KEEP_WARM_EVERY_S, and
        whenever a unit is assigned)."""
        unit = Unit(topic, subscription, int(group))
        current = self.meta.hosts.unit_host(unit)
        config = self._config_dict()
        live = placement.live_hosts("SubscriptionHost")
        if current is not None and current in live and not placement.stranded(current):
            if time.monotonic() - self._warm_at >= KEEP_WARM_EVERY_S:
                self._keep_warm(config, placement.host_slots(config, True)[0], live)
            return current
        if current is not None and self._evacuate(current):
            return str(self.meta.hosts.unit_host(unit))
        return self._place_unit(unit, current, placement.live_hosts("SubscriptionHost"), config)

    def _place_unit(
        self, unit: Unit, current: str | None, live: dict[str, str], config: dict[str, Any]
    ) -> str:
        """Assign the unit to a subscription host slot (journaled), starting its host if it
        does not run; one whose host was lost goes to a running host, so nothing starts."""
        slots, node_of = placement.host_slots(config, subscriptions=True)
        self._keep_warm(config, slots, live)
        host = self.meta.hosts.choose_subhost(
            unit,
            slots,
            node_of,
            set(live),
            self._served_by_node(unit, node_of),
            moving=current is not None,
        )
        self.meta.hosts.assign_unit(unit, host)
        if current is not None:
            log.warning(
                "unit %s: subscription host %s is gone; assigned to %s", unit.key, current, host
            )
        if host not in live:
            self._start_host(host, config)
            live[host] = node_of[host]  # (an evacuation's next unit sees it running)
        return host

    def _keep_warm(self, config: dict[str, Any], slots: list[str], live: dict[str, str]) -> None:
        self._warm_at = time.monotonic()
        for name in placement.warm_slots(config, slots):
            if name not in live:
                log.info("starting subscription host %s (kept warm)", name)
                self._start_host(name, config)
                live[name] = ""  # (started: not started again by this lookup)

    def _served_by_node(self, unit: Unit, node_of: dict[str, str]) -> dict[str, int]:
        """Node -> how many of the unit's partitions the partition hosts there serve."""
        per_actor = self.meta.subscription(unit.topic, unit.subscription).get(
            "partitions_per_actor", self._config.subscription.partitions_per_actor
        )
        partitions = subscription_groups(self.meta.partitions(unit.topic), per_actor)
        hosts = self.meta.hosts.assignments()
        nodes = set(node_of.values())
        out: dict[str, int] = {}
        for p in partitions.get(unit.group, []):
            host = hosts.get(f"{unit.topic}/{p}")
            if host is None:
                continue
            node = next((n for n in nodes if n.startswith(host_node_prefix(host))), None)
            if node is not None:
                out[node] = out.get(node, 0) + 1
        return out

    def claim_unit(self, topic: str, subscription: str, group: int, host: str) -> str:
        """A subscription host about to serve a unit asks whether it may: the unit's host
        after the call (``host`` itself when it was assigned to it, or to nobody, or to a
        host that ended for good). NotFound once the subscription is deleted."""
        unit = Unit(topic, subscription, int(group))
        current = self.meta.hosts.unit_host(unit)
        if current == host:
            return host
        if current is not None and current in placement.live_hosts("SubscriptionHost"):
            return current
        return self.meta.hosts.assign_unit(unit, host)

    def unit_assignments(self) -> dict[str, str]:
        """``"topic/subscription/group"`` -> its subscription host, for every assigned unit."""
        return self.meta.hosts.unit_assignments()

    def release_units(self, keys: list[str]) -> None:
        """Unassign units their host has stopped serving (``SubscriptionHost.drop``)."""
        for key in keys:
            self.meta.hosts.release_unit(key)

    def host_units(self, host: str) -> list[Unit]:
        """The units assigned to subscription host ``host``."""
        return sorted(
            Unit.of_key(k) for k, h in self.meta.hosts.unit_assignments().items() if h == host
        )

    def merge_buckets(
        self,
        topic: str,
        partition: int,
        name: str,
        sources: list[str],
        key: str,
        record: bytes,
        runs: list[int],
    ) -> bool:
        return self.meta.merge_buckets(topic, partition, name, sources, key, record, runs)

    def registry_list(self, name: str) -> dict[str, bytes]:
        return self.meta.registry_list(name)

    def registry_apply(self, ops: list) -> None:
        self.meta.registry_apply(ops)


def spawn_coordinator(
    config: dict[str, Any],
    start_host: StartHost,
    adopt: Adopt = _no_adopt,
    *,
    name: str | None = None,
    node: str | None = None,
) -> Any:
    """The cluster's coordinator, created from ``config`` if it does not exist yet; it starts
    hosts with ``start_host`` and hands a lost node's work to running hosts with ``adopt``
    (module-level functions: Ray pickles them by reference). With ``name`` and ``node``:
    a standby of that name pinned to that node (``raydelay.actors.standby``)."""
    options = (
        placement.actor_options(COORDINATOR, config)
        if name is None
        else placement.pinned_actor_options(name, node)
    )
    return (
        # (``role`` is answered on a thread of its own: a concurrency group, which Ray
        # takes only here, not in ``.options``)
        ray.remote(concurrency_groups={ROLE_GROUP: 1})(CoordinatorActor)  # type: ignore[call-overload]
        # Its calls are idempotent (or harmless when repeated: an extra empty ledger), so
        # Ray may retry them across a restart.
        .options(max_concurrency=1, max_task_retries=-1, **options)
        .remote(config, start_host, adopt, name is not None)
    )
