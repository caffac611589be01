from raydelay.config import Config, LocalStorageConfig, S3StorageConfig, StorageConfig
from raydelay.storage import LocalDirObjectStore, MemoryObjectStore, S3ObjectStore, make_store


def test_make_store_builds_each_kind(tmp_path, moto_server):
    local = make_store(
        Config(
            storage=StorageConfig(kind="local", local=LocalStorageConfig(root=str(tmp_path / "d")))
        )
    )
    assert isinstance(local, LocalDirObjectStore)
    local.put("x", b"1")
    assert (tmp_path / "d" / "x").read_bytes() == b"1"
    assert isinstance(make_store(StorageConfig(kind="memory")), MemoryObjectStore)
    s3cfg = StorageConfig(
        kind="s3", s3=S3StorageConfig(bucket="made", prefix="p", endpoint_url=moto_server)
    )
    s3 = make_store(s3cfg)
    assert isinstance(s3, S3ObjectStore)
    s3._client.create_bucket(Bucket="made")
    s3.put("k", b"v")
    assert s3.get("k") == b"v"
    assert s3._client.get_object(Bucket="made", Key="p/k")["Body"].read() == b"v"
