"""Server-side encryption on S3 (``storage.s3.sse``): every object raydelay writes asks
for the configured encryption, and none does when it is off.

The objects are written by the code that writes them in production (the store's owner
claim, the coordinator's journal and snapshots, a partition's ledger objects, its
producer table, a sealed bucket, a subscription's cursor) into a store that
``make_store`` builds from a config, over moto's server. Then every key in the bucket is
read back with ``head_object``, and every request the client sent is checked too.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from raydelay.clock import ManualClock
from raydelay.cluster.metadata import Metadata
from raydelay.cluster.owner import StoreOwner
from raydelay.config import S3StorageConfig, StorageConfig, config_from_dict, load_config
from raydelay.delayed.sealed import TopicIndex, seal
from raydelay.delayed.store import SealedStore
from raydelay.dispatch.cursor import Cursor
from raydelay.errors import InvalidArgument
from raydelay.log.entries import NO_DELAY, AppendBatch, Entries
from raydelay.log.partition import LedgerInfo, PartitionLog
from raydelay.storage import make_store
from raydelay.storage.keys import cursor_key

SHARED = {
    "type": "shared",
    "ack_timeout_s": None,
    "max_redeliveries": None,
    "dead_letter_topic": None,
}
TOPIC, SUBSCRIPTION = "orders", "billing"

# each kind of object raydelay writes, by a part of its key; all must be in the bucket
KINDS = {
    "owner claim (create-only)": "meta/owner/",
    "owner renewal": "meta/owner-renewed/",
    "journal record (create-only)": "meta/journal/",
    "metadata snapshot": "meta/snapshot/",
    "ledger object (create-only)": "/ledgers/",
    "producer table snapshot": "/dedup/",
    "sealed bucket data": "/data",
    "sealed bucket index": "/index",
    "sealed bucket meta": "/meta",
    "subscription cursor": "/cursor/",
}


_READS = {"GetObject", "HeadObject", "ListObjectsV2"}


class Recorder:
    """Every S3 operation a boto3 client sends, with its parameters (botocore's
    ``provide-client-params`` event, raised for each call before it is sent)."""

    def __init__(self, client: Any) -> None:
        self.calls: list[tuple[str, dict]] = []
        client.meta.events.register("provide-client-params.s3", self._record)

    def _record(self, params: dict, model: Any, **_: Any) -> None:
        self.calls.append((model.name, dict(params)))

    def of(self, *operations: str) -> list[dict]:
        return [params for name, params in self.calls if name in operations]


class NoConditionalPuts:
    """A client whose endpoint answers ``If-None-Match`` with NotImplemented (as some
    S3-compatible servers do), so the store's create-only writes take their fallback;
    everything else goes to the real client."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def put_object(self, **params: Any) -> Any:
        if "IfNoneMatch" in params:
            from botocore.exceptions import ClientError

            error = {"Error": {"Code": "NotImplemented", "Message": "no conditional writes"}}
            raise ClientError(error, "PutObject")
        return self._client.put_object(**params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.fixture
def s3(moto_server: str) -> Any:
    from raydelay.storage import make_s3_client

    return make_s3_client(endpoint_url=moto_server, region="us-east-1", max_attempts=3)


def _bucket(client: Any) -> str:
    name = f"rd-sse-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


def _store(client: Any, bucket: str, **s3: str) -> Any:
    storage = StorageConfig(kind="s3", s3=S3StorageConfig(bucket=bucket, prefix="p", **s3))
    return make_store(storage, s3_client=client)


def write_everything(store: Any) -> None:
    """Write each kind of object raydelay keeps, through the code that writes it."""
    owner = StoreOwner(store, "10.0.0.1:6379")
    owner.acquire()  # its claim (put_new), then its first renewal (put)
    owner.release()
    meta = Metadata(store, snapshot_every=3)  # a snapshot after every third record
    meta.create_topic(TOPIC, 1)
    meta.create_subscription(TOPIC, SUBSCRIPTION, SHARED)

    # a partition's log, rolling its ledgers through the coordinator's metadata
    log = PartitionLog(
        store=store,
        topic=TOPIC,
        partition=0,
        ledgers=[LedgerInfo(i, c) for i, c in meta.ledgers(TOPIC, 0)],
        roll=lambda closed, count: meta.roll_ledger(TOPIC, 0, closed, count),
        clock=ManualClock(1_000),
        max_entries_per_ledger=4,
        cache_bytes=1 << 20,
    )
    # the topic's index takes the delayed entries; a closed ledger seals a bucket
    index = TopicIndex(min_index_count=1)
    jobs = []
    log.on_object = index.add
    log.on_roll = lambda ledger: jobs.append(index.ledger_closed(ledger))
    deliver_at = np.array([NO_DELAY, 5_000, 9_000, 7_000], dtype=np.int64)
    for seq in (1, 2):
        entries = Entries.build([b"m%d-%d" % (seq, i) for i in range(4)], deliver_at)
        assert log.commit([AppendBatch("producer-1", seq, entries)]) == [[(seq, 0, 4)]]
    job = next(j for j in jobs if j is not None and j.rows is not None)
    bucket, data, raw_index = seal(
        job.rows,
        start_ledger=job.start_ledger,
        end_ledger=job.end_ledger,
        bucket_id=1,
        max_indexes=2,
        max_step_ms=300_000,
    )
    SealedStore(store, TOPIC, 0).write(bucket, data, raw_index)

    # a subscription's cursor, as its actor writes it
    cursor = Cursor()
    store.put(cursor_key(TOPIC, 0, SUBSCRIPTION, 1), cursor.encode(cursor.mark_delete))


def heads(client: Any, bucket: str) -> dict[str, dict]:
    """``head_object`` of every key in ``bucket``."""
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", ())]
    return {key: client.head_object(Bucket=bucket, Key=key) for key in keys}


def assert_every_kind_written(keys: list[str]) -> None:
    missing = [kind for kind, part in KINDS.items() if not any(part in k for k in keys)]
    assert not missing, f"not written: {missing} (keys: {keys})"


def _check(
    client: Any, bucket: str, recorder: Recorder, expect: Callable[[dict], None]
) -> dict[str, dict]:
    found = heads(client, bucket)
    assert_every_kind_written(sorted(found))
    for key, head in found.items():
        try:
            expect(head)
        except AssertionError as exc:
            raise AssertionError(f"object {key}: {exc}") from None
    puts = recorder.of("PutObject")
    assert len(puts) >= len(found)  # (a key written twice is one object)
    for params in puts:
        expect(params)
    # every object was written by PutObject: no copy, no multipart upload
    writes = {name for name, _ in recorder.calls if name not in _READS}
    assert "PutObject" in writes and writes <= {"PutObject", "DeleteObject"}, writes
    return found


@pytest.mark.s3
@pytest.mark.parametrize("conditional", [True, False], ids=["if-none-match", "head-then-put"])
def test_with_aes256_every_object_raydelay_writes_is_encrypted(s3, conditional):
    # Given a store configured with storage.s3.sse = "AES256" (and, in the second case, an
    # endpoint without conditional writes, so that create-only writes check first)
    bucket = _bucket(s3)
    recorder = Recorder(s3)
    client = s3 if conditional else NoConditionalPuts(s3)
    store = _store(client, bucket, sse="AES256")
    # When raydelay writes each kind of object it keeps
    write_everything(store)

    # Then every object in the bucket, and every PutObject sent, says AES256 and no KMS key
    def expect(head: dict) -> None:
        assert head.get("ServerSideEncryption") == "AES256"
        assert "SSEKMSKeyId" not in head

    _check(s3, bucket, recorder, expect)
    conditional_puts = [p for p in recorder.of("PutObject") if "IfNoneMatch" in p]
    assert bool(conditional_puts) is conditional


@pytest.mark.s3
def test_with_aws_kms_every_object_carries_the_configured_key(s3, moto_server):
    import boto3

    # Given a KMS key, and a store configured with sse = "aws:kms" and that key's id
    kms = boto3.client("kms", endpoint_url=moto_server, region_name="us-east-1")
    key_id = kms.create_key(Description="raydelay sse test")["KeyMetadata"]["KeyId"]
    bucket = _bucket(s3)
    recorder = Recorder(s3)
    store = _store(s3, bucket, sse="aws:kms", sse_kms_key_id=key_id)
    # When raydelay writes each kind of object it keeps
    write_everything(store)

    # Then every object is SSE-KMS under that key
    def expect(head: dict) -> None:
        assert head.get("ServerSideEncryption") == "aws:kms"
        assert head.get("SSEKMSKeyId") == key_id

    _check(s3, bucket, recorder, expect)


@pytest.mark.s3
def test_with_aws_kms_and_no_key_id_the_aws_managed_key_is_left_to_s3(s3):
    # Given sse = "aws:kms" without sse_kms_key_id
    bucket = _bucket(s3)
    recorder = Recorder(s3)
    write_everything(_store(s3, bucket, sse="aws:kms"))

    # Then every object is SSE-KMS, and no request names a key (S3 uses aws/s3)
    def expect(head: dict) -> None:
        assert head.get("ServerSideEncryption") == "aws:kms"

    _check(s3, bucket, recorder, expect)
    assert not [p for p in recorder.of("PutObject") if "SSEKMSKeyId" in p]


@pytest.mark.s3
def test_with_sse_off_no_request_asks_for_encryption(s3):
    # Given the default config (sse = "")
    assert S3StorageConfig().sse == ""
    bucket = _bucket(s3)
    recorder = Recorder(s3)
    # When raydelay writes each kind of object
    write_everything(_store(s3, bucket))

    # Then no PutObject asks for encryption, and (moto has no bucket default) no object has it
    def expect(head: dict) -> None:
        assert "ServerSideEncryption" not in head
        assert "SSEKMSKeyId" not in head

    _check(s3, bucket, recorder, expect)


# --- the settings themselves ------------------------------------------------------------------


@pytest.mark.parametrize("value", ["aes256", "AES-256", "kms", "none", "aws:kms:dsse"])
def test_an_unknown_sse_mode_is_refused_naming_the_key(tmp_path, value):
    path = tmp_path / "c.toml"
    path.write_text(f'[storage.s3]\nsse = "{value}"\n')
    with pytest.raises(InvalidArgument, match=r"^storage\.s3\.sse: must be one of .*AES256"):
        load_config(path, env={})
    with pytest.raises(
        InvalidArgument, match=r"^storage\.s3\.sse: .*from RAYDELAY_STORAGE__S3__SSE"
    ):
        load_config(env={"RAYDELAY_STORAGE__S3__SSE": value})


def test_an_sse_mode_of_the_wrong_type_is_refused_naming_the_key():
    with pytest.raises(InvalidArgument, match=r"^storage\.s3\.sse: .*got True"):
        config_from_dict({"storage": {"s3": {"sse": True}}})


@pytest.mark.parametrize("sse", ["", "AES256"])
def test_a_kms_key_without_aws_kms_is_refused(sse):
    with pytest.raises(InvalidArgument, match=r"^storage\.s3\.sse_kms_key_id: only valid with"):
        config_from_dict({"storage": {"s3": {"sse": sse, "sse_kms_key_id": "alias/raydelay"}}})
    with pytest.raises(InvalidArgument, match=r"^storage\.s3\.sse_kms_key_id"):
        S3StorageConfig(sse=sse, sse_kms_key_id="alias/raydelay")


def test_the_settings_load_from_toml_and_from_the_environment(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[storage.s3]\nbucket = "b"\nsse = "aws:kms"\nsse_kms_key_id = "alias/k"\n')
    s3 = load_config(path, env={}).storage.s3
    assert (s3.sse, s3.sse_kms_key_id) == ("aws:kms", "alias/k")
    env = {"RAYDELAY_STORAGE__S3__SSE": "AES256"}
    assert load_config(env=env).storage.s3.sse == "AES256"


def test_the_store_refuses_bad_settings_naming_the_argument():
    from raydelay.storage import S3ObjectStore

    with pytest.raises(InvalidArgument, match=r"^sse: must be one of"):
        S3ObjectStore(object(), "b", sse="aes256")
    with pytest.raises(InvalidArgument, match=r"^sse_kms_key_id: only valid with sse 'aws:kms'"):
        S3ObjectStore(object(), "b", sse="AES256", sse_kms_key_id="k")


def test_the_seaweedfs_test_config_leaves_sse_off():
    # the storage table the SeaweedFS-backed tests run with asks for no encryption
    from tests.seaweed import SeaweedS3

    server = SeaweedS3("http://127.0.0.1:8333", "access", "key")
    storage = config_from_dict({"storage": server.storage_config("b")}).storage
    assert storage.kind == "s3" and storage.s3.bucket == "b"
    assert (storage.s3.sse, storage.s3.sse_kms_key_id) == ("", "")
