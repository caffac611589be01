"""The console's link to its cluster (raydelay/web/attach.py), without a reader process:
what the pages hold in place of a Cluster, and what a 503 says."""

from __future__ import annotations

import ast
import inspect
from datetime import UTC, datetime
from pathlib import Path

import pytest

from raydelay.client.connection import Cluster
from raydelay.web import model
from raydelay.web.attach import (
    ClusterDown,
    ClusterLink,
    LinkState,
    LinkStatus,
    RemoteCluster,
    Wait,
)
from raydelay.web.reader import AttachTarget


def _cluster_calls_of_console_data() -> set[str]:
    """The names ConsoleData calls on its client (``self.cluster.X`` or ``self._reads.X``)."""
    tree = ast.parse(Path(inspect.getfile(model)).read_text())
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "self"
            and node.value.attr in ("cluster", "_reads")
        ):
            found.add(node.attr)
    return found


def test_the_remote_cluster_makes_every_call_the_console_data_makes():
    calls = _cluster_calls_of_console_data()
    assert {"stats", "topics", "cancel", "config"} <= calls  # the walk sees them
    missing = sorted(name for name in calls if not hasattr(RemoteCluster, name))
    assert missing == [], (
        f"ConsoleData calls these on its client, RemoteCluster lacks them: {missing}"
    )
    # and each takes the arguments of the Cluster call it stands for, by the same names
    for name in calls - {"config"}:
        ours = list(inspect.signature(getattr(RemoteCluster, name)).parameters)
        theirs = list(inspect.signature(getattr(Cluster, name)).parameters)
        assert ours == theirs[: len(ours)], (name, ours, theirs)


def test_a_down_cluster_is_described_with_since_when_and_when_it_was_last_seen():
    seen = datetime(2026, 11, 25, 9, 46, 48, tzinfo=UTC).timestamp()
    status = LinkStatus(
        LinkState.DOWN,
        "10.0.0.5:6379",
        since_s=seen + 2,
        last_reachable_s=seen,
        reason="no Ray cluster answers at 10.0.0.5:6379 (Connection refused)",
    )
    text = ClusterDown(status).args[0]
    assert text.startswith("The Ray cluster at 10.0.0.5:6379 is down: unreachable since ")
    assert "2026-11-25 09:46:50 UTC" in text and "(Connection refused)" in text
    assert "last reachable at 2026-11-25 09:46:48 UTC" in text
    assert "attaches again on its own" in text
    never = LinkStatus(LinkState.DOWN, None, 1_795_600_010.0, None, "x")
    assert "has not been reachable since the console started" in never.describe()


def test_a_link_not_attached_refuses_calls_at_once():
    # Given a link whose reader was never started
    link = ClusterLink(AttachTarget(address="127.0.0.1:1"))
    remote = RemoteCluster(link).with_retry_deadline(2.0)
    # Then a read, the config and an action each raise ClusterDown without waiting
    with pytest.raises(ClusterDown, match="attaching"):
        remote.topics()
    with pytest.raises(ClusterDown):
        RemoteCluster(link).config  # noqa: B018 - the property is the call
    with pytest.raises(ClusterDown):
        link.call(Wait(), Cluster.cancel, ["t/0/1:2"])


def test_the_console_says_a_change_once_not_each_flicker(capsys):
    from raydelay.web.attach import LinkState, LinkStatus
    from raydelay.web.serve import _ChangeLog

    say = _ChangeLog()

    def status(state: LinkState, reason: str = "") -> LinkStatus:
        return LinkStatus(state, "127.0.0.1:6379", 0.0, None, reason)

    for s in (
        status(LinkState.UP),
        status(LinkState.UNSURE, "no answer for 2 s"),  # a slow answer, then heard back
        status(LinkState.UP),
        status(LinkState.DOWN, "no answer for 3 s"),
        status(LinkState.DOWN, "connection refused"),  # the reason changes while down
        status(LinkState.UP),
    ):
        say(s)
    lines = capsys.readouterr().err.splitlines()
    assert [("attached" in line, "unreachable" in line) for line in lines] == [
        (True, False),
        (False, True),
        (True, False),
    ]
