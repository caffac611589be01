"""Which cluster a `raydelay up` / `down` acts on, checked before anything joins Ray."""

from __future__ import annotations

import pytest

from raydelay.cli import main
from raydelay.cluster import local
from raydelay.errors import Unavailable


@pytest.fixture
def no_target(tmp_path, monkeypatch):
    """No `up` marker, no RAYDELAY_ADDRESS: nothing says which Ray is ours."""
    monkeypatch.setattr(local, "UP_MARKER", tmp_path / "no-marker.json")
    monkeypatch.delenv("RAYDELAY_ADDRESS", raising=False)


def test_down_without_a_noted_ray_or_an_address_stops_nothing(no_target, monkeypatch, capsys):
    # Ray's "auto" would join any Ray on the machine, and down would stop its actors
    def joined(*_a, **_k):
        raise AssertionError("down attached with no target")

    monkeypatch.setattr("raydelay.cli.local.attach", joined)
    assert main(["down"]) == 2
    err = capsys.readouterr().err
    assert "noted no Ray here" in err and "--address" in err


def test_up_refuses_an_address_beside_port_or_temp_dir(no_target, monkeypatch, capsys):
    def started(*_a, **_k):
        raise AssertionError("up started a Ray for contradictory arguments")

    monkeypatch.setattr(local, "start_head", started)
    assert main(["--address", "127.0.0.1:6379", "up", "--port", "6390"]) == 2
    assert "give one or the other" in capsys.readouterr().err


def test_up_with_a_port_starts_its_own_ray_whatever_raydelay_address_says(no_target, monkeypatch):
    monkeypatch.setenv("RAYDELAY_ADDRESS", "127.0.0.1:1")  # (nothing listens there)
    asked = {}

    def started(cfg, **kwargs):
        asked.update(kwargs)
        raise Unavailable("stop here")  # (started: what follows needs a real Ray)

    monkeypatch.setattr(local, "start_head", started)
    assert main(["up", "--port", "6390"]) == 4  # (the Unavailable raised above)
    assert asked["port"] == 6390


@pytest.mark.parametrize("timeout", ["nan", "inf", "-5", "0"])
def test_consume_refuses_a_timeout_that_is_no_duration(no_target, monkeypatch, capsys, timeout):
    def joined(*_a, **_k):
        raise AssertionError("consume attached with a bad timeout")

    monkeypatch.setattr("raydelay.cli.messages.attach", joined)
    assert main(["consume", "t", "s", "--timeout", timeout]) == 2
    assert "timeout: expected a finite number of seconds > 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.4, "0 s"), (42, "42 s"), (60, "1 min"), (3515, "58 min 35 s"), (3600, "1 h"),
     (11_100, "3 h 5 min"), (86_400 * 2 + 3600 * 4, "2 d 4 h"), (86_400 * 400, "400 d")],
)  # fmt: skip
def test_a_wait_is_said_as_a_reader_says_it(seconds, said):
    from raydelay.cli.messages import duration_text

    assert duration_text(seconds) == said


def test_a_read_command_with_no_ray_named_refuses_rather_than_join_any(no_target, monkeypatch):
    # Given no marker (a failed `up`), no RAY_ADDRESS and no live `ray start` noted: Ray's
    # "auto" would join whatever Ray runs on the machine (another user's, a test suite's)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(local, "running_ray_address", lambda: None)
    monkeypatch.setattr("ray.is_initialized", lambda: False)

    def joined(*_a, **_k):
        raise AssertionError("stats joined a Ray nothing named")

    monkeypatch.setattr("raydelay.client.bootstrap.attach_ray", joined)
    # Then stats says there is none to read, as down does, and joins nothing
    with pytest.raises(Unavailable, match="no Ray cluster is running here that `raydelay up`"):
        from raydelay.cli.attach import attach

        attach(_args())


def test_a_read_command_says_which_ray_it_joined_when_only_ray_start_named_it(
    no_target, monkeypatch
):
    from raydelay.cli.attach import attach_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(local, "running_ray_address", lambda: "10.0.0.1:6379")
    address, note = attach_address(_args())
    assert address == "10.0.0.1:6379"
    assert note is not None and "joined the Ray at 10.0.0.1:6379" in note and "--address" in note
    # named by the user (RAY_ADDRESS, RAYDELAY_ADDRESS, --address, `up`): no note
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert attach_address(_args()) == ("10.0.0.1:6379", None)
    assert attach_address(_args(address="10.0.0.2:6379")) == ("10.0.0.2:6379", None)


def _args(address=None):
    import argparse

    return argparse.Namespace(address=address, config=None)


def test_stats_says_the_delayed_count_is_partial_while_partitions_recover():
    from raydelay.cli.reports import _delayed_text

    s = {"delayed": 1_200, "counting": [1], "partitions": [{}, {}, {}]}
    assert _delayed_text(s) == "1,200 so far (1 of 3 partitions recovering: not all counted yet)"
    one = {"delayed": 4, "counting": [0], "partitions": [{}]}
    assert _delayed_text(one) == "4 so far (1 of 1 partition recovering: not all counted yet)"
    assert _delayed_text({"delayed": 3_500, "counting": [], "partitions": [{}, {}]}) == "3,500"
