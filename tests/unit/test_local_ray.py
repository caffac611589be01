"""Which Ray a plain connect() joins: a live one, never the stale note of a stopped one."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from raydelay.cluster import local
from raydelay.cluster.local import running_ray_address
from raydelay.config import Config
from raydelay.errors import Unavailable


def test_a_live_ray_is_joined_and_a_stale_note_is_ignored():
    # RAY_ADDRESS wins over anything noted
    assert running_ray_address(noted="10.0.0.1:6379", live=set(), env="10.0.0.9:6379") == (
        "10.0.0.9:6379"
    )
    # the last `ray start` is joined while a GCS with that address runs
    assert running_ray_address(noted="10.0.0.1:6379", live={"10.0.0.1:6379"}, env="") == (
        "10.0.0.1:6379"
    )
    # a note left by a Ray that was stopped without `ray stop` (its processes killed) is
    # stale: connect() then starts a new local Ray instead of failing to attach
    assert running_ray_address(noted="10.0.0.1:6379", live={"10.0.0.2:6379"}, env="") is None
    assert running_ray_address(noted="", live=set(), env="") is None


def test_down_removes_ray_s_note_of_the_ray_it_stopped_and_only_that(tmp_path, monkeypatch):
    marker, note = tmp_path / "up.json", tmp_path / "ray_current_cluster"
    monkeypatch.setattr(local, "UP_MARKER", marker)
    monkeypatch.setattr(local, "ray_address_file", lambda: note)
    stopped_sessions = []
    monkeypatch.setattr(
        local, "_stop_session", lambda s, a=None: stopped_sessions.append((s, a)) or 3
    )
    # Given `raydelay up` started the Ray at 10.0.0.1:6379, and Ray noted that address
    marker.write_text(json.dumps({"address": "10.0.0.1:6379", "session": "session_x"}))
    note.write_text("10.0.0.1:6379\n")
    # When `raydelay down` stops it, the note goes with it
    assert local.stop_started_ray() == 3 and stopped_sessions == [("session_x", "10.0.0.1:6379")]
    assert not marker.exists() and not note.exists()
    # but a note of another Ray (started later by someone else) stays
    marker.write_text(json.dumps({"address": "10.0.0.1:6379", "session": "session_y"}))
    note.write_text("10.0.0.7:6379")
    assert local.stop_started_ray() == 3
    assert note.read_text() == "10.0.0.7:6379"


def test_the_client_server_of_the_stopped_ray_is_known_by_its_address_only():
    server = ["python", "-m", "ray.util.client.server", "--address=10.0.0.1:6379", "--port=10001"]
    assert local._is_client_server_of(server, "10.0.0.1:6379")
    assert not local._is_client_server_of(server, "10.0.0.1:6380")
    assert not local._is_client_server_of(server, None)
    assert not local._is_client_server_of(
        ["python", "x.py", "--address=10.0.0.1:6379"], "10.0.0.1:6379"
    )


def test_up_reads_its_session_where_ray_start_keeps_it(monkeypatch):
    # `down` stops the session `up` noted: read from the root Ray used (RAY_TMPDIR, else
    # TMPDIR), not /tmp/ray, where another Ray's newest session may be
    monkeypatch.setenv("RAY_TMPDIR", "/srv/raytmp")
    monkeypatch.setenv("TMPDIR", "/var/tmp/me")
    assert local.default_ray_root() == "/srv/raytmp/ray"
    monkeypatch.delenv("RAY_TMPDIR")
    assert local.default_ray_root() == "/var/tmp/me/ray"
    monkeypatch.delenv("TMPDIR")
    assert local.default_ray_root() == "/tmp/ray"


def test_a_ray_start_that_failed_half_way_is_stopped(tmp_path, monkeypatch):
    # `ray start` can fail after its GCS started (the raylet timed out): that session's
    # processes are stopped, and no older session is ever named
    root = tmp_path / "r"
    old = root / "session_2026-01-01_00-00-00_000000_1"
    old.mkdir(parents=True)
    (root / "session_latest").symlink_to(old)
    stopped: list[str] = []
    monkeypatch.setattr(local, "_stop_session", lambda s, a=None: stopped.append(s) or 3)
    monkeypatch.setattr(local, "ray_binary", lambda: "ray")
    monkeypatch.setattr(local, "UP_MARKER", tmp_path / "up.json")

    def failing_start(cmd, **_kwargs):
        new = root / "session_2026-11-27_08-00-00_000000_2"
        new.mkdir()
        (root / "session_latest").unlink()
        (root / "session_latest").symlink_to(new)
        return subprocess.CompletedProcess(cmd, 1, "", "The current node timed out during startup")

    monkeypatch.setattr(local.subprocess, "run", failing_start)
    with pytest.raises(Unavailable, match="timed out during startup; the 3 processes"):
        local.start_head(Config(), temp_dir=str(root))
    assert stopped == ["session_2026-11-27_08-00-00_000000_2"]
    assert not (tmp_path / "up.json").exists()
    # a start that fails before it made a session stops nothing of the older one
    stopped.clear()
    monkeypatch.setattr(
        local.subprocess, "run", lambda cmd, **_k: subprocess.CompletedProcess(cmd, 1, "", "no")
    )
    os.utime(old, (0, 0))
    (root / "session_latest").unlink()
    (root / "session_latest").symlink_to(old)
    with pytest.raises(Unavailable):
        local.start_head(Config(), temp_dir=str(root))
    assert stopped == [""]
