"""Actor calls are typed: each entry point is a method of its own, never a method name to
dispatch on, and every call names a real method with arguments its signature takes.

mypy checks the calls in ``raydelay`` (a Peer's call is typed by the method it names);
these tests hold the rule for the code mypy is not asked about, and fail on a way back to
names: an actor method that looks a method up by a parameter, an allow-list of method
names, a call naming a method the actor lacks, or arguments its signature refuses.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from raydelay.actors.coordinator import CoordinatorActor
from raydelay.actors.handles import (
    HostPartition,
    SubscriptionHandles,
    SubscriptionPartition,
    TopicHandles,
)
from raydelay.actors.host import HostActor
from raydelay.actors.subscription import SubscriptionHost, UnitPeer
from raydelay.cluster.handles import Peer
from raydelay.cluster.names import Unit

PKG = Path(__file__).resolve().parents[2] / "raydelay"
ACTORS = {c.__name__: c for c in (HostActor, SubscriptionHost, CoordinatorActor)}
# the Peer (and Cluster) methods that take the actor method first
CALLS = {"submit", "call", "call_from_thread", "once", "_coord", "actor"}


def _trees(root: Path) -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), filename=str(p))) for p in sorted(root.rglob("*.py"))]


def test_no_actor_method_dispatches_on_a_name():
    found = []
    for path, tree in _trees(PKG / "actors"):
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for fn in cls.body:
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
                for node in ast.walk(fn):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Name)
                        and node.func.id == "getattr"
                        and len(node.args) >= 2
                        and isinstance(node.args[1], ast.Name)
                        and node.args[1].id in params
                    ):
                        found.append(f"{path.name}: {cls.name}.{fn.name}")
    assert found == [], f"methods that look a method up by a parameter: {found}"


def test_no_allow_list_of_method_names():
    found = [
        f"{path.relative_to(PKG)}: {target.id}"
        for path, tree in _trees(PKG)
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and "METHODS" in target.id
    ]
    assert found == [], f"allow-lists of method names: {found}"


def _named_calls() -> list[tuple[str, ast.Call]]:
    """Every call in raydelay that names an actor method first (``peer.once(X.m, ...)``)."""
    out = []
    for path, tree in _trees(PKG):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in CALLS
                and node.args
                and isinstance(node.args[0], ast.Attribute)
                and isinstance(node.args[0].value, ast.Name)
                and node.args[0].value.id in ACTORS
            ):
                out.append((f"{path.relative_to(PKG)}:{node.lineno}", node))
    return out


def test_every_named_call_fits_the_signature_of_a_real_method():
    calls = _named_calls()
    assert len(calls) > 40  # (the walk sees them)
    bad = []
    for where, node in calls:
        ref = node.args[0]
        assert isinstance(ref, ast.Attribute) and isinstance(ref.value, ast.Name)
        method = getattr(ACTORS[ref.value.id], ref.attr, None)
        if not callable(method):
            bad.append(f"{where}: {ref.value.id} has no method {ref.attr}")
            continue
        rest = node.args[1:]
        if any(isinstance(a, ast.Starred) for a in rest) or any(
            k.arg is None for k in node.keywords
        ):
            continue  # (*args: the arguments are not known here; mypy checks them)
        try:
            inspect.signature(method).bind(
                None, *[None] * len(rest), **{k.arg: None for k in node.keywords if k.arg}
            )
        except TypeError as exc:
            bad.append(f"{where}: {ref.value.id}.{ref.attr}: {exc}")
    assert bad == [], "\n".join(bad)


class _Recorder:
    """A Ray handle that records the calls submitted to it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        recorder = self

        class Method:
            @staticmethod
            def remote(*args, **kwargs):
                recorder.calls.append((name, args, kwargs))
                return name

        return Method


def _binds(actor: type, calls: list[tuple[str, tuple, dict]]) -> None:
    for name, args, kwargs in calls:
        inspect.signature(getattr(actor, name)).bind(None, *args, **kwargs)


@pytest.fixture
def recorders():
    made: list[_Recorder] = []

    def peers(n: int, unit: Unit | None = None) -> list[Peer]:
        made.extend(_Recorder() for _ in range(n))
        if unit is not None:  # a subscription's: the unit goes first in each call
            return [
                UnitPeer(unit, f"p{i}", lambda: None, handle=h) for i, h in enumerate(made[-n:])
            ]
        return [Peer(f"p{i}", lambda: None, handle=h) for i, h in enumerate(made[-n:])]

    return made, peers


def test_what_a_producer_submits_binds_to_the_host(recorders):
    made, peers = recorders
    topic = TopicHandles(
        "t",
        peers(2),
        deadline_s=1,
        cancel=lambda b, p: ({}, 0),
        apply=lambda w, s=None: {},
        subscriptions_ahead=lambda: lambda: [],
    )
    topic.append(1, [b"batch"])
    topic.last_sequence(0, "producer")
    topic.append_keyed(1, b"batch", "replace")
    topic.cancel_keys(0, ["k"], "producer", 3)
    topic.pending_keys(1, ["k"])
    calls = [c for r in made for c in r.calls]
    assert sorted(c[0] for c in calls) == sorted(
        ["last_sequence", "append", "append_keyed", "cancel_keys", "pending_keys"]
    )
    _binds(HostActor, calls)


def test_what_a_consumer_submits_binds_to_the_subscription_host(recorders):
    made, peers = recorders
    unit = Unit("t", "s", 0)
    sub = SubscriptionHandles(peers(2, unit), deadline_s=1)
    keys = [1, 2]
    sub.receive(0, "c", 10, 1.0, 0)
    sub.receive_many([0, 1], "c", 10, 1.0, 0)
    sub.ack(1, "c", keys)
    sub.ack_many([(0, keys)], "c", None)
    sub.nack(0, "c", keys, 1.0, 5)
    sub.heartbeat([0, 1], "c")
    sub.add_consumer(0, "c")
    sub.remove_consumer(1, "c")
    sub.redeliver(0, "c", None, 1, True)
    calls = [c for r in made for c in r.calls]
    assert len(calls) == 9
    assert all(args[0] == unit for _, args, _ in calls)  # the unit goes first
    _binds(SubscriptionHost, calls)


def test_one_partition_called_directly_puts_its_route_first():
    host, actor = _Recorder(), _Recorder()
    HostPartition(host, "t", 3, "host/a/0").submit(HostActor.read, (0, 0), 10)
    unit = Unit("t", "s", 0)
    SubscriptionPartition(actor, unit, 3, "subhost/a/0").submit(SubscriptionHost.stats)
    assert host.calls == [("read", ("t", 3, (0, 0), 10), {})]
    assert actor.calls == [("stats", (unit, 3), {})]
    _binds(HostActor, host.calls)
    _binds(SubscriptionHost, actor.calls)
