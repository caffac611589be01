"""The console's guard against rebinding, cross-site posts and framing, without a server."""

from __future__ import annotations

import pytest

from raydelay.web.guard import allowed_hosts, host_name, refusal

LOCAL = allowed_hosts("127.0.0.1")


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8642", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("[::1]:8642", "::1"),
        ("::1", "::1"),
    ],
)
def test_the_name_of_a_host_header(header, name):
    assert host_name(header) == name


def test_a_console_on_loopback_answers_to_loopback_names_only():
    for host in ("127.0.0.1:8642", "localhost:8642", "[::1]:8642"):
        assert refusal("GET", {"Host": host}, LOCAL) is None
    why = refusal("GET", {"Host": "evil.example:8642"}, LOCAL)
    assert why is not None and "evil.example" in why
    assert refusal("GET", {}, LOCAL) is not None  # no Host at all
    # a console on every interface cannot know its public names: any is served
    assert refusal("GET", {"Host": "console.internal:8642"}, allowed_hosts("0.0.0.0")) is None
    assert "10.1.2.3" in allowed_hosts("10.1.2.3")


def test_a_post_must_come_from_the_consoles_own_origin():
    own = {"Host": "127.0.0.1:8642"}
    assert refusal("POST", {**own, "Origin": "http://127.0.0.1:8642"}, LOCAL) is None
    assert refusal("POST", {**own, "Referer": "http://127.0.0.1:8642/topics"}, LOCAL) is None
    assert refusal("POST", own, LOCAL) is None  # no browser: the form token alone decides
    for header in (
        {"Origin": "http://evil.example"},
        {"Origin": "http://127.0.0.1:9999"},  # another port is another origin
        {"Origin": "null"},  # a sandboxed frame or a file
        {"Referer": "http://evil.example/x.html"},
        {"Origin": "http://evil.example", "Referer": "http://127.0.0.1:8642/topics"},
    ):
        assert refusal("POST", {**own, **header}, LOCAL) is not None, header
    # a GET is never refused for where it came from (links from anywhere may open a page)
    assert refusal("GET", {**own, "Referer": "http://evil.example/"}, LOCAL) is None
