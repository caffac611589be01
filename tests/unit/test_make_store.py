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


def test_a_process_shares_one_store_per_storage_config_but_never_a_memory_one(tmp_path):
    import threading

    from raydelay.storage import shared_store

    def local(name: str) -> StorageConfig:
        return StorageConfig(kind="local", local=LocalStorageConfig(root=str(tmp_path / name)))

    # Given many partitions of one host opening at once with the same storage config
    got: list = []
    threads = [
        threading.Thread(target=lambda: got.append(shared_store(local("a")))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then they share one store (one client made), a Config naming it gets it too
    assert len({id(s) for s in got}) == 1
    assert shared_store(Config(storage=local("a"))) is got[0]
    # and another root is another store; a memory store is never shared
    assert shared_store(local("b")) is not got[0]
    memory = StorageConfig(kind="memory")
    assert shared_store(memory) is not shared_store(memory)
