"""Signed calls (raydelay.tasks.signing): a payload sealed with the cluster's secret opens,
anything else is refused with the reason; where the secret comes from, and the one a local
store makes for itself."""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import threading

import pytest

from raydelay.config import config_from_dict
from raydelay.errors import InvalidArgument
from raydelay.tasks import signing
from raydelay.tasks.signing import CallSigner, load_signer, parse_secrets, peel

SECRET = b"s" * 32
OLD = b"o" * 32


def test_a_sealed_payload_opens_to_what_was_sealed():
    signer = CallSigner([SECRET])
    sealed = signer.sign(b"RDT1 the call")
    assert sealed[:4] == b"RDS1" and len(sealed) == 4 + 32 + len(b"RDT1 the call")
    assert signer.open(sealed) == b"RDT1 the call"
    assert peel(sealed) == b"RDT1 the call"


def test_the_sealed_form_is_the_hmac_sha256_of_the_payload():
    # version 1, pinned: RDS1, then HMAC-SHA256(secret, payload), then the payload
    payload = b"RDT1\x00\x00\x00\x02{}args"
    expected = b"RDS1" + hmac.new(SECRET, payload, hashlib.sha256).digest() + payload
    assert CallSigner([SECRET]).sign(payload) == expected
    assert expected.hex()[:8] == "52445331"


@pytest.mark.parametrize(
    ("sealed", "says"),
    [
        (b"RDT1 an unsigned call", "not signed"),
        (b"", "not signed"),
        (b"RDS1short", "not signed"),
        (CallSigner([b"x" * 32]).sign(b"RDT1 call"), "matches none"),
        (CallSigner([SECRET]).sign(b"RDT1 call")[:-1] + b"X", "matches none"),  # changed
        (b"RDS1" + bytes(32) + b"RDT1 call", "matches none"),
    ],
)
def test_an_unsigned_or_badly_signed_payload_is_refused_with_the_reason(sealed, says):
    with pytest.raises(InvalidArgument, match=f"signature: .*{says}"):
        CallSigner([SECRET]).open(sealed)


def test_during_a_rotation_the_old_secret_still_opens_and_the_new_one_signs():
    old = CallSigner([OLD])
    rotating = CallSigner([SECRET, OLD])
    signed_before = old.sign(b"RDT1 before")
    assert rotating.open(signed_before) == b"RDT1 before"
    signed_now = rotating.sign(b"RDT1 now")
    assert CallSigner([SECRET]).open(signed_now) == b"RDT1 now"
    with pytest.raises(InvalidArgument):
        old.open(signed_now)
    # after the rotation the old secret is dropped: what it signed is refused
    with pytest.raises(InvalidArgument):
        CallSigner([SECRET]).open(signed_before)


def test_the_secret_comes_from_the_variable_then_the_file(tmp_path):
    file = tmp_path / "secret"
    file.write_text("f" * 20 + "\n")
    from_env = load_signer(str(file), None, env={signing.SECRET_ENV: "e" * 20 + " " + "o" * 20})
    assert from_env.secret_text == "e" * 20 + " " + "o" * 20
    from_file = load_signer(str(file), None, env={})
    assert from_file.secret_text == "f" * 20


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ({"env": "short"}, "at least 16"),
        ({"env": "   "}, "share needs one set"),  # blank: as if unset, and no other source
        ({"file": "missing"}, "cannot read"),
        ({"file": ""}, "holds no secret"),
        ({}, "RAYDELAY_TASKS_SECRET or tasks.secret_file"),
    ],
)
def test_no_usable_secret_is_a_clear_error(tmp_path, setup, says):
    env = {signing.SECRET_ENV: setup["env"]} if "env" in setup else {}
    secret_file = ""
    if "file" in setup:
        secret_file = str(tmp_path / "secret")
        if setup["file"] != "missing":
            (tmp_path / "secret").write_text(setup["file"])
    with pytest.raises(InvalidArgument, match=says):
        load_signer(secret_file, None, env=env)


def test_a_local_store_makes_its_secret_once_readable_by_its_owner_only(tmp_path):
    root = str(tmp_path / "store")
    first = load_signer("", root, env={})
    path = tmp_path / f"store{signing.AUTO_SUFFIX}"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_signer("", root, env={}).secret_text == first.secret_text
    assert not (tmp_path / "store").exists()  # beside the store, not in it


def test_processes_making_the_secret_at_once_all_get_the_same(tmp_path):
    root = str(tmp_path / "store")
    got: list[str] = []
    threads = [
        threading.Thread(target=lambda: got.append(load_signer("", root, env={}).secret_text))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len(set(got)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [f"store{signing.AUTO_SUFFIX}"]


def test_a_client_of_a_shared_store_needs_a_set_secret(tmp_path, monkeypatch):
    from raydelay.client.tasks import signer_of

    monkeypatch.delenv(signing.SECRET_ENV, raising=False)
    s3 = config_from_dict({"storage": {"kind": "s3", "s3": {"bucket": "b"}}})
    with pytest.raises(InvalidArgument, match="share needs one set"):
        signer_of(s3)
    shared = config_from_dict(
        {"storage": {"kind": "local", "local": {"root": str(tmp_path / "d"), "shared": True}}}
    )
    with pytest.raises(InvalidArgument, match="share needs one set"):
        signer_of(shared)
    monkeypatch.setenv(signing.SECRET_ENV, "k" * 24)
    assert signer_of(s3).secret_text == "k" * 24
    local = config_from_dict({"storage": {"kind": "local", "local": {"root": str(tmp_path / "l")}}})
    monkeypatch.delenv(signing.SECRET_ENV)
    assert len(signer_of(local).secret_text) >= 32


def test_parse_secrets_splits_on_white_space():
    assert parse_secrets("a" * 16 + "\n" + "b" * 16 + "\n", "x") == [b"a" * 16, b"b" * 16]


def test_key_ids_tell_secrets_apart_and_start_with_the_signing_one():
    ids = CallSigner([SECRET, OLD]).key_ids()
    assert ids == [hashlib.sha256(SECRET).hexdigest()[:16], hashlib.sha256(OLD).hexdigest()[:16]]
    assert CallSigner([OLD, SECRET]).key_ids() == ids[::-1]
