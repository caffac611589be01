"""The CLI for scripts (#49): exit statuses by kind of failure, JSON output, payloads shown
without loss, global options after the command, RAYDELAY_CONFIG, shell completion."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from raydelay.cli import main
from raydelay.cli.output import Exit, exit_for, jsonable, message_doc, message_line, payload_form
from raydelay.cli.parser import build_parser
from raydelay.errors import (
    Conflict,
    ConsumerBusy,
    InvalidArgument,
    MissingExtra,
    NotFound,
    RaydelayError,
    StorageError,
    StoreOwned,
    Unavailable,
)


@pytest.mark.parametrize(
    "exc,code",
    [
        (InvalidArgument("x"), Exit.USAGE),
        (MissingExtra("x"), Exit.USAGE),
        (NotFound("x"), Exit.NOT_FOUND),
        (Unavailable("x"), Exit.UNAVAILABLE),
        (StorageError("x", retriable=True), Exit.UNAVAILABLE),
        (StorageError("x", retriable=False), Exit.FAILED),
        (Conflict("x"), Exit.REFUSED),
        (StoreOwned("x"), Exit.REFUSED),
        (ConsumerBusy("x"), Exit.REFUSED),
        (RaydelayError("x"), Exit.FAILED),
    ],
)
def test_each_kind_of_failure_has_its_exit_status(exc, code):
    assert exit_for(exc) == code


def test_the_statuses_are_distinct():
    values = [e.value for e in Exit]
    assert len(values) == len(set(values))
    assert (Exit.USAGE, Exit.NOT_FOUND, Exit.UNAVAILABLE, Exit.REFUSED) == (2, 3, 4, 5)


def test_main_returns_the_status_of_what_it_raised(monkeypatch, capsys):
    def missing(_args):
        raise NotFound("topic 't' does not exist")

    monkeypatch.setattr("raydelay.cli.parser.cmd_stats", missing)
    assert main(["stats", "t"]) == Exit.NOT_FOUND
    assert capsys.readouterr().err == "raydelay: error: topic 't' does not exist\n"


@pytest.mark.parametrize(
    "payload,fmt,shown,encoding",
    [
        (b"hello", "auto", "hello", "text"),
        ("café ✓".encode(), "auto", "café ✓", "text"),
        (b"\xff\xfe\x00", "auto", base64.b64encode(b"\xff\xfe\x00").decode(), "base64"),
        (b"a\tb", "auto", base64.b64encode(b"a\tb").decode(), "base64"),  # a tab breaks the line
        (b"a\nb", "auto", base64.b64encode(b"a\nb").decode(), "base64"),
        (b"", "auto", "", "text"),
        (b"\x01\x02", "hex", "0102", "hex"),
        (b"hello", "base64", "aGVsbG8=", "base64"),
        (b"\xffok", "text", "\ufffdok", "text"),  # asked for text: shown as text, marked
    ],
)
def test_payloads_are_shown_as_text_only_when_they_are_text(payload, fmt, shown, encoding):
    assert payload_form(payload, fmt) == (shown, encoding)
    if encoding == "base64":
        assert base64.b64decode(shown) == payload  # nothing lost
    if encoding == "hex":
        assert bytes.fromhex(shown) == payload


def _message(payload: bytes):
    return SimpleNamespace(
        message_id="t/0/1:2",
        deliver_at_ms=1_800_000_000_000,
        key="k",
        properties={"b": "2", "a": "1"},
        redelivery_count=0,
        payload=payload,
    )


def test_a_message_line_marks_a_payload_that_is_not_text():
    line = message_line(_message(b"\x00\x01"), "auto")
    assert line.split("\t") == [
        "t/0/1:2",
        "2027-01-15T08:00:00.000+00:00",
        "k",
        "a=1,b=2",
        "0",
        "b64:AAE=",
    ]
    assert message_line(_message(b"plain"), "auto").endswith("\tplain")


def test_a_message_document_round_trips_its_payload():
    doc = json.loads(json.dumps(message_doc(_message(b"\x00\xff"), "auto")))
    assert doc["payload_encoding"] == "base64"
    assert base64.b64decode(doc["payload"]) == b"\x00\xff"
    assert doc["deliver_at_ms"] == 1_800_000_000_000 and doc["key"] == "k"
    assert doc["properties"] == {"a": "1", "b": "2"}


def test_jsonable_makes_stats_plain():
    doc = {"tail": (3, 4), "n": np.int64(7), "arr": np.array([1, 2]), 5: {b"\x00"}}
    assert json.loads(json.dumps(jsonable(doc))) == {
        "tail": [3, 4],
        "n": 7,
        "arr": [1, 2],
        "5": ["AA=="],
    }


def test_global_options_go_before_or_after_the_command():
    parser = build_parser()
    before = parser.parse_args(["--json", "--address", "a:1", "--config", "c.toml", "stats", "t"])
    after = parser.parse_args(["stats", "t", "--json", "--address", "a:1", "--config", "c.toml"])
    nested = parser.parse_args(["topics", "list", "--json", "--payload-format", "hex"])
    for args in (before, after):
        assert (args.json, args.address, args.config) == (True, "a:1", "c.toml")
    assert nested.json and nested.payload_format == "hex"
    # an option given before the command is not undone by the command's own default
    assert parser.parse_args(["--json", "peek", "t", "s"]).json is True
    plain = parser.parse_args(["peek", "t", "s"])
    assert (plain.json, plain.payload_format, plain.address) == (False, "auto", None)


def test_raydelay_config_is_the_default_config(monkeypatch):
    monkeypatch.setenv("RAYDELAY_CONFIG", "/etc/raydelay/s3.toml")
    assert build_parser().parse_args(["stats", "t"]).config == "/etc/raydelay/s3.toml"
    assert build_parser().parse_args(["stats", "t", "--config", "x.toml"]).config == "x.toml"
    monkeypatch.delenv("RAYDELAY_CONFIG")
    assert build_parser().parse_args(["stats", "t"]).config is None


def _complete(line: str, tmp_path) -> list[str]:
    out = tmp_path / "completions"
    env = {
        **os.environ,
        "_ARGCOMPLETE": "1",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    subprocess.run([sys.executable, "-m", "raydelay.cli"], env=env, check=True, timeout=60)
    return out.read_text().split()


def test_the_shell_completes_commands_and_options(tmp_path):
    assert _complete("raydelay top", tmp_path) == ["topics"]
    assert "--json" in _complete("raydelay stats --js", tmp_path)
    assert set(_complete("raydelay topics ", tmp_path)) >= {"list", "create", "delete"}
    assert set(_complete("raydelay peek t s --payload-format ", tmp_path)) == {
        "auto",
        "text",
        "base64",
        "hex",
    }


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_a_script_for_each_shell(shell, capsys):
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    assert "raydelay" in script and "_ARGCOMPLETE" in script


def test_a_missing_config_named_by_the_environment_says_so(monkeypatch, tmp_path, capsys):
    missing = str(tmp_path / "nope.toml")
    monkeypatch.setenv("RAYDELAY_CONFIG", missing)
    assert main(["topics", "list"]) == Exit.USAGE
    assert capsys.readouterr().err == (
        f"raydelay: error: config: {missing!r} does not exist (named by $RAYDELAY_CONFIG)\n"
    )
