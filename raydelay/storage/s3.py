"""The S3 store, over a boto3 client that the caller provides.

This is the only module that knows botocore's errors: they become StorageError
(retriable or not) and a missing key becomes NotFound. Credentials come from
boto3's standard chain; nothing here reads them from a config file.

Every object is written by one ``PutObject`` call (no multipart upload, no copy), made
in :meth:`S3ObjectStore._put_object`, which adds the server-side encryption the store
was built with (``storage.s3.sse``).
"""

from __future__ import annotations

import logging
from typing import Any

from raydelay.errors import InvalidArgument, NotFound, StorageError
from raydelay.storage.base import check_data, check_range, same_or_conflict
from raydelay.storage.keys import validate_key, validate_prefix

_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_RETRIABLE_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
}

# storage.s3.sse: "" asks for nothing (the bucket's default encryption applies)
SSE_MODES = ("", "AES256", "aws:kms")


def make_s3_client(
    *, endpoint_url: str | None = None, region: str = "us-east-1", max_attempts: int = 3
) -> Any:
    """A boto3 S3 client with standard-mode retries, ``max_attempts`` tries per call (keep
    it small: raydelay's own retries stack on it). Credentials: boto3's standard chain."""
    import boto3
    from botocore.config import Config as BotoConfig

    cfg = BotoConfig(
        retries={"mode": "standard", "max_attempts": max_attempts},
        connect_timeout=5,
        read_timeout=30,
        max_pool_connections=32,
    )
    return boto3.client("s3", endpoint_url=endpoint_url or None, region_name=region, config=cfg)


class S3ObjectStore:
    """Objects in ``bucket`` under ``prefix``. ``client`` is a boto3 S3 client.

    ``sse`` is the server-side encryption every write asks for: ``""`` (none asked;
    the bucket's default applies), ``"AES256"`` (SSE-S3) or ``"aws:kms"`` (SSE-KMS, with
    the key ``sse_kms_key_id``, or the AWS-managed key when it is empty)."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "",
        *,
        sse: str = "",
        sse_kms_key_id: str = "",
    ) -> None:
        if not isinstance(bucket, str) or not bucket:
            raise InvalidArgument("bucket: must be a non-empty str")
        prefix = validate_prefix(prefix)
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        if sse not in SSE_MODES:
            raise InvalidArgument(f"sse: must be one of {SSE_MODES}, got {sse!r}")
        if not isinstance(sse_kms_key_id, str):
            raise InvalidArgument(f"sse_kms_key_id: must be a str, got {sse_kms_key_id!r}")
        if sse_kms_key_id and sse != "aws:kms":
            raise InvalidArgument(f"sse_kms_key_id: only valid with sse 'aws:kms', not {sse!r}")
        self._client = client
        self._bucket = bucket
        self._prefix = prefix
        self._conditional = True  # the endpoint honours If-None-Match (until it says not)
        self._encryption: dict[str, str] = {}  # PutObject's arguments for sse
        if sse:
            self._encryption["ServerSideEncryption"] = sse
        if sse_kms_key_id:
            self._encryption["SSEKMSKeyId"] = sse_kms_key_id

    def _full(self, key: str) -> str:
        return self._prefix + validate_key(key)

    def _put_object(self, full: str, data: bytes, **conditions: str) -> None:
        """The one call that writes an object, with the store's encryption."""
        self._client.put_object(
            Bucket=self._bucket, Key=full, Body=data, **self._encryption, **conditions
        )

    def put(self, key: str, data: bytes) -> None:
        full = self._full(key)
        data = check_data(data)
        try:
            self._put_object(full, data)
        except Exception as exc:
            raise _translate(exc, f"put {key!r}") from exc

    def put_new(self, key: str, data: bytes) -> None:
        """Create-only, with ``If-None-Match: *`` (AWS, moto and SeaweedFS honour it; a
        server that answers NotImplemented gets a HEAD first, which narrows the race)."""
        full = self._full(key)
        data = check_data(data)
        try:
            if self._conditional:
                self._put_object(full, data, IfNoneMatch="*")
                return
            if not self.exists(key):
                self._put_object(full, data)
                return
        except Exception as exc:
            code = _code(exc)
            if code == "NotImplemented" and self._conditional:
                log.warning("S3 endpoint ignores If-None-Match: create-only writes check first")
                self._conditional = False
                return self.put_new(key, data)
            if code not in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                raise _translate(exc, f"put {key!r}") from exc
        same_or_conflict(self, key, data)

    def get(self, key: str) -> bytes:
        full = self._full(key)
        try:
            resp = self._client.get_object(Bucket=self._bucket, Key=full)
            return resp["Body"].read()
        except Exception as exc:
            raise _translate(exc, f"get {key!r}") from exc

    def get_range(self, key: str, start: int, end: int) -> bytes:
        start, end = check_range(start, end)
        full = self._full(key)
        if start == end:
            if not self.exists(key):
                raise NotFound(f"no object at key {key!r}")
            return b""
        try:
            resp = self._client.get_object(
                Bucket=self._bucket, Key=full, Range=f"bytes={start}-{end - 1}"
            )
            return resp["Body"].read()
        except Exception as exc:
            if _code(exc) == "InvalidRange":  # start at or past the end of the object
                return b""
            raise _translate(exc, f"get_range {key!r}") from exc

    def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            self._client.delete_object(Bucket=self._bucket, Key=full)
        except Exception as exc:
            if _code(exc) in _MISSING_CODES:
                return
            raise _translate(exc, f"delete {key!r}") from exc

    def list(self, prefix: str = "") -> list[str]:
        prefix = validate_prefix(prefix)
        keys: list[str] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self._bucket, Prefix=self._prefix + prefix):
                for obj in page.get("Contents", ()):
                    keys.append(obj["Key"][len(self._prefix) :])
        except Exception as exc:
            raise _translate(exc, f"list {prefix!r}") from exc
        keys.sort()
        return keys

    def exists(self, key: str) -> bool:
        full = self._full(key)
        try:
            self._client.head_object(Bucket=self._bucket, Key=full)
            return True
        except Exception as exc:
            if _code(exc) in _MISSING_CODES:
                return False
            raise _translate(exc, f"exists {key!r}") from exc

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self._bucket!r}, prefix={self._prefix!r})"


log = logging.getLogger(__name__)


def _code(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error") or {}
        code = err.get("Code")
        if code is not None:
            return str(code)
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        if status is not None:
            return str(status)
    return None


def _translate(exc: Exception, what: str) -> Exception:
    from botocore import exceptions as bexc

    if isinstance(exc, bexc.ClientError):
        code = _code(exc) or "?"
        if code in _MISSING_CODES:
            return NotFound(f"{what}: no such key")
        status = (exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode", 0) or 0
        retriable = code in _RETRIABLE_CODES or int(status) >= 500
        return StorageError(f"{what}: S3 error {code}: {exc}", retriable=retriable)
    if isinstance(
        exc,
        (
            bexc.EndpointConnectionError,
            bexc.ConnectionClosedError,
            bexc.ReadTimeoutError,
            bexc.ConnectTimeoutError,
            bexc.ConnectionError,
        ),
    ):
        return StorageError(f"{what}: connection failed: {exc}", retriable=True)
    if isinstance(exc, bexc.NoCredentialsError):
        return StorageError(f"{what}: no AWS credentials in boto3's chain", retriable=False)
    if isinstance(exc, bexc.BotoCoreError):
        return StorageError(f"{what}: {exc}", retriable=False)
    if isinstance(exc, (InvalidArgument, NotFound, StorageError)):
        return exc
    return StorageError(f"{what}: {type(exc).__name__}: {exc}", retriable=False)
