"""Where raydelay's actors go, and the Ray options they are created with (STYLE.md 1).

The actor classes are plain classes; each actor module applies ``ray.remote`` with
:func:`actor_options` where it creates its actor (``spawn_*`` and ``*_peer``), so this
module knows no actor class and ``cluster`` never imports ``actors``.

Every actor is named in the ``raydelay`` namespace, detached (it outlives the
client that created it) and restarted by Ray after a crash (``max_restarts=-1``);
a restarted actor rebuilds itself from the store in its constructor. Actors are
created with ``get_if_exists=True``, so any client may create or attach to them.

**Placement.** Ray would scatter actors that ask for no CPU at random, so raydelay
chooses each actor's node itself and pins it there (a hard node affinity):

- partitions live in **hosts**. Each node has ``placement.hosts_per_node`` host slots
  (-1: one per CPU of the node, at most MAX_AUTO_HOSTS), named ``host/<node>/<slot>``:
  the name says the node. The coordinator assigns a partition to the slot that serves the
  fewest partitions (then the emptier node, then the one with the fewest of its topic;
  ``Assignments.choose_host``) and starts the slot's host when it does not run, so hosts
  start only as partitions need them, and never more than the slots;
- subscriptions live in **subscription hosts**, ``subhost/<node>/<slot>``
  (``placement.subscription_hosts_per_node`` per node, the same way), each serving many
  units (a unit: a subscription's partition group). The coordinator assigns a unit to a
  slot by failure domain (``Assignments.choose_subhost``): the node holding the fewest units
  of its own subscription, so that one node's loss stops as few subscriptions as can be,
  then the node and the slot serving the fewest units, then a slot already running, then
  the node whose hosts serve most of its partitions. ``placement.warm_subscription_hosts``
  slots of every node are kept running even when idle, so that the units of a lost node
  resume in processes already running: no process start on the recovery path;
- the head node (it runs Ray's control service) is left out while a worker node is
  alive, unless ``placement.avoid_head = false``.

A crashed actor process is restarted by Ray on the same node. When the node itself is
lost, the pinned actor cannot be scheduled and Ray ends it. raydelay does not wait for
that: after a failed call, the caller probes the raylet of the actor's node, and a node
whose raylet refuses connections is gone at once (:func:`node_gone`). The partitions of
a host on a gone node are assigned again, to the slots of the nodes that are left, when a
client next looks one up (``CoordinatorActor.locate``); so are the units of a subscription host
(``CoordinatorActor.locate_unit``); the coordinator itself is ended and re-created on the
least loaded node left by whoever needs it next (``raydelay.cluster.handles``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import zlib
from collections import Counter
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raydelay.cluster.names import (
    HOST_PREFIX,
    NAMESPACE,
    SUBHOST_PREFIX,
    host_actor_name,
    host_node_prefix,
    subhost_actor_name,
)

log = logging.getLogger(__name__)

_COMMON: dict[str, Any] = {
    "namespace": NAMESPACE,
    "lifetime": "detached",
    "max_restarts": -1,
    "get_if_exists": True,
    "num_cpus": 0,  # I/O-bound shells: never hold a CPU slot
}

ACTOR_CLASSES = ("CoordinatorActor", "HostActor", "SubscriptionHost", "TaskRunner")
_SLOTTED = (HOST_PREFIX, SUBHOST_PREFIX)  # actors whose name says their node
MAX_AUTO_HOSTS = 4  # hosts per node with placement.hosts_per_node = -1 (one per CPU)
_LIVE_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "ALIVE", "RESTARTING")


def actor_options(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """The Ray options every raydelay actor is created with: its name, the common options
    above, and the node it is pinned to."""
    return {"name": name, **_COMMON, **_pinned(name, config)}


def pinned_actor_options(name: str, node: str | None) -> dict[str, Any]:
    """The common options, pinned to ``node`` (chosen by the caller; None: Ray places it)."""
    if node is None:
        return floating_actor_options(name)
    return {
        "name": name,
        **_COMMON,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False),
    }


def floating_actor_options(name: str) -> dict[str, Any]:
    """The common options without a pinned node: Ray places the actor, and places it again
    elsewhere when its node dies (a task runner holds no partition state)."""
    return {"name": name, **_COMMON}


def node_of(name: str) -> str | None:
    """The node of the live actor called ``name`` (None when there is none, or Ray has not
    placed it yet)."""
    for a in actors():
        if a["name"] == name and a["node"]:
            return a["node"]
    return None


def lookup(name: str) -> Any:
    """An existing actor by name (raises ValueError when there is none)."""
    return ray.get_actor(name, namespace=NAMESPACE)


def lookup_or_none(name: str) -> Any | None:
    try:
        return lookup(name)
    except ValueError:
        return None


# --- nodes gone before Ray says so ------------------------------------------------------------
#
# Ray declares a node dead after its health checks fail (``timeout`` x ``threshold``: 3 s
# with raydelay's settings, about 15 s with Ray's). A node whose machine is up but whose
# raylet died (a SIGKILLed node, a crashed raylet) refuses connections at once: raydelay
# probes the raylet of an actor's node when a call to the actor failed, and a node that
# refuses is gone for this process from then on (a raylet that starts again is a new node).
# A machine that vanished does not refuse, it does not answer: the probe times out and
# Ray's verdict decides, as before.
PROBE_TIMEOUT_S = 0.25
PROBE_EVERY_S = 1.0  # a node is probed at most this often (per process)
_gone: set[str] = set()  # nodes whose raylet refused a connection
_probed: dict[str, float] = {}  # node id -> when it was last probed (monotonic)
_probe_lock = threading.Lock()


def refuses(address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``address:port`` refuses a TCP connection (nothing listens there). A timeout
    or an unreachable network is not a refusal."""
    try:
        socket.create_connection((address, int(port)), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def node_gone(node_id: str, info: dict[str, Any] | None = None) -> bool:
    """Whether node ``node_id`` is gone: Ray says it is dead, or its raylet refuses
    connections (probed at most once per PROBE_EVERY_S). ``info``: its row of
    ``ray.nodes()``, when the caller has it."""
    if node_id in _gone:
        return True
    if info is None:
        info = next((n for n in ray.nodes() if n["NodeID"] == node_id), None)
    if info is None or not info.get("Alive"):
        return True
    with _probe_lock:
        now = time.monotonic()
        if now - _probed.get(node_id, -PROBE_EVERY_S) < PROBE_EVERY_S:
            return node_id in _gone
        _probed[node_id] = now
    address, port = info.get("NodeManagerAddress"), info.get("NodeManagerPort")
    if address and port and refuses(address, port):
        log.warning("node %s: its raylet refuses connections; taken as lost", node_id[:8])
        _gone.add(node_id)
        return True
    return False


def node_lost(host: str) -> bool:
    """Whether the node of ``host`` (a slotted name, ``host/<node>/<slot>`` or
    ``subhost/<node>/<slot>``) is a node of this Ray that is gone (:func:`node_gone`). A node
    this Ray never had (one of an earlier session, before the cluster was started again) is
    not lost: nothing there ran in this session."""
    prefix = host_node_prefix(host)
    rows = [n for n in ray.nodes() if n["NodeID"].startswith(prefix)]
    return bool(rows) and all(node_gone(n["NodeID"], n) for n in rows)


# --- choosing a node ---------------------------------------------------------------------------


def nodes() -> tuple[list[str], str | None]:
    """The live nodes' ids (sorted) and the head node's id (None if not among them); a
    node found gone by a probe (:func:`node_gone`) is not live."""
    alive, head = [], None
    for n in ray.nodes():
        if not n.get("Alive") or n["NodeID"] in _gone:
            continue
        alive.append(n["NodeID"])
        if "node:__internal_head__" in n.get("Resources", {}):
            head = n["NodeID"]
    return sorted(alive), head


def candidate_nodes(avoid_head: bool) -> list[str]:
    """The nodes raydelay's actors may go to: the live ones, without the head while a
    worker is alive (when ``avoid_head``)."""
    alive, head = nodes()
    workers = [n for n in alive if n != head]
    return workers if avoid_head and workers else alive


def actors() -> list[dict[str, Any]]:
    """raydelay's actors that are alive or on their way: name, class, state, node, pid,
    restarts (from Ray's actor table)."""
    out = []
    for info in ray._private.state.actors().values():  # noqa: SLF001 - no public equivalent
        if info["ActorClassName"] not in ACTOR_CLASSES or info["State"] not in _LIVE_STATES:
            continue
        out.append(
            {
                "name": info["Name"],
                "class": info["ActorClassName"],
                "state": info["State"],
                "node": info["Address"]["NodeID"] or None,
                "pid": info["Pid"],
                "restarts": info["NumRestarts"],
                "started_ms": int(info["StartTime"]),  # when its process was started
            }
        )
    return out


def live_hosts(kind: str = "HostActor") -> dict[str, str]:
    """The partition hosts (``kind="SubscriptionHost"``: the subscription hosts) alive or on
    their way: name -> node id. A host whose node is gone is not among them, even while Ray
    still tries to restart it (it is pinned there: it can never come back), so what it
    served moves at once."""
    alive, _ = nodes()
    return {
        a["name"]: a["node"] or ""
        for a in actors()
        if a["class"] == kind and any(n.startswith(host_node_prefix(a["name"])) for n in alive)
    }


def stranded(name: str) -> bool:
    """Whether the live actor called ``name`` is pinned to a node that is gone (Ray says
    so, or its raylet refuses connections: see :func:`node_gone`). Ray keeps trying to
    restart it there until it declares the node dead and gives up, which takes seconds;
    raydelay ends it at once and re-creates it elsewhere. Asked after a call failed."""
    live = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in _gone}
    if name.startswith(_SLOTTED):
        prefix = host_node_prefix(name)
        node = next((n for n in live if n.startswith(prefix)), None)
    else:
        node = node_of(name)
        if node is None:
            return False
    return node is None or node not in live or node_gone(node, live[node])


def end_stranded(name: str, handle: Any, timeout_s: float = 5.0) -> None:
    """End a stranded actor for good and wait (up to ``timeout_s``) until its name is free."""
    log.warning("%s: its node is gone; ending it to start it elsewhere", name)
    ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while lookup_or_none(name) is not None and time.monotonic() < deadline:
        time.sleep(0.05)


def hosts_per_node(config: dict[str, Any], cpus: float, setting: str = "hosts_per_node") -> int:
    """How many partition hosts a node with ``cpus`` CPUs gets: ``placement.hosts_per_node``
    (or the ``setting`` named), or with -1 one per CPU, at least 1 and at most
    MAX_AUTO_HOSTS."""
    n = int(config.get("placement", {}).get(setting, -1))
    if n > 0:
        return n
    return max(1, min(MAX_AUTO_HOSTS, int(cpus)))


def host_slots(
    config: dict[str, Any], subscriptions: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The host slots partitions (``subscriptions``: subscription units) may be assigned
    to, every slot of every candidate node, running or not, and the node of each."""
    avoid_head = bool(config.get("placement", {}).get("avoid_head", True))
    candidates = set(candidate_nodes(avoid_head))
    setting = "subscription_hosts_per_node" if subscriptions else "hosts_per_node"
    name_of = subhost_actor_name if subscriptions else host_actor_name
    slots, node_of = [], {}
    for n in ray.nodes():
        if n["NodeID"] not in candidates:
            continue
        for slot in range(hosts_per_node(config, n.get("Resources", {}).get("CPU", 1), setting)):
            name = name_of(n["NodeID"], slot)
            slots.append(name)
            node_of[name] = n["NodeID"]
    return sorted(slots), node_of


def warm_slots(config: dict[str, Any], slots: list[str]) -> list[str]:
    """Of the subscription host ``slots``, those kept running even when idle: the first
    ``placement.warm_subscription_hosts`` of each node."""
    warm = int(config.get("placement", {}).get("warm_subscription_hosts", 1))
    return [s for s in slots if int(s.rsplit("/", 1)[1]) < warm]


def choose_node(name: str, avoid_head: bool) -> str | None:
    """The node for a new actor called ``name`` (see the module's docstring); None when Ray
    reports no node at all."""
    if name.startswith(_SLOTTED):  # a host's name says its node
        prefix = host_node_prefix(name)
        alive, _ = nodes()
        return next((n for n in alive if n.startswith(prefix)), None)
    candidates = candidate_nodes(avoid_head)
    if not candidates:
        return None
    live = [a for a in actors() if a["node"] and a["name"] != name]
    salt = zlib.crc32(name.encode())
    # the least loaded node; among equals, a stable per-name order
    every = Counter(a["node"] for a in live)
    return min(candidates, key=lambda n: (every[n], zlib.crc32(n.encode()) ^ salt))


def _pinned(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """The scheduling option that pins actor ``name`` to its chosen node."""
    avoid_head = bool(config.get("placement", {}).get("avoid_head", True))
    node = choose_node(name, avoid_head)
    if node is None:
        return {}
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}


def placement_table() -> list[dict[str, Any]]:
    """Which node holds which raydelay actor: one row per actor, with the node's address
    and whether it is the head, sorted by node then name."""
    info = {n["NodeID"]: n for n in ray.nodes()}
    rows = []
    for a in actors():
        node = info.get(a["node"] or "", {})
        rows.append(
            {
                **a,
                "address": node.get("NodeManagerAddress", ""),
                "head": "node:__internal_head__" in node.get("Resources", {}),
            }
        )
    return sorted(rows, key=lambda r: (r["node"] or "", r["name"]))
