"""Fixtures shared by every test tier."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing_backend(what: str) -> None:
    """A backend that is missing skips locally but fails under CI (STYLE.md 14)."""
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true")
    pytest.skip(f"{what} is not available")


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto's ThreadedMotoServer on 127.0.0.1 with an ephemeral port; yields the endpoint URL."""
    try:
        from moto.server import ThreadedMotoServer
    except Exception as exc:  # pragma: no cover - depends on the environment
        missing_backend(f"moto[server] ({exc})")
    saved = {k: os.environ.get(k) for k in _AWS_ENV}
    os.environ.update(_AWS_ENV)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# Fake credentials for moto only; real deployments use boto3's standard chain.
_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3_store_factory(moto_server: str):
    """Returns a function making an S3ObjectStore over a fresh bucket on the moto server."""
    from raydelay.storage import S3ObjectStore, make_s3_client

    client = make_s3_client(endpoint_url=moto_server, region="us-east-1", max_attempts=3)

    def make(prefix: str = "") -> S3ObjectStore:
        bucket = f"rd-{uuid.uuid4().hex[:16]}"
        client.create_bucket(Bucket=bucket)
        return S3ObjectStore(client, bucket, prefix)

    return make
