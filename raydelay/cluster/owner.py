"""One owner per store: the coordinator of one raydelay cluster at a time.

Two clusters writing one store would hand out the same ledger ids and overwrite each
other's acknowledged messages. So the coordinator takes the store before it serves
anything, and a second cluster's coordinator is refused with :class:`StoreOwned`.

The claim is an owner record, ``meta/owner/<epoch>``, written create-only
(``put_new``): of two coordinators claiming the same epoch exactly one wins. The highest
epoch is the current claim. Whether it is still held:

- **local dir:** the owner also holds an exclusive ``flock`` on ``<root>/.owner.lock``
  for as long as its process lives. The kernel drops the lock when the process dies
  (even by SIGKILL), so a dead owner is noticed at once, with no lease to wait out.
- **any other store (S3):** the owner renews ``meta/owner-renewed/<epoch>`` every third
  of ``lease_s``; a claim not renewed for ``lease_s`` has lapsed. The owner checks at each
  renewal that no higher epoch exists, and stops serving if one does (it lost the store).

A coordinator of the same Ray cluster (the same GCS address) takes over its own claim at
once: that is Ray restarting it.

Processes that start at the same moment on one store must end up in one cluster, not in
one cluster and a refusal. On a local-dir store a client that is about to start a Ray
of its own takes its turn first, with :class:`StartTurn`: an exclusive ``flock`` on
``<root>/.owner-start.lock``, held until its coordinator has claimed the store. The
others wait for the turn, see the claim and attach to its cluster (``connect()``).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import NoReturn

from raydelay.clock import now_ms as _now_ms
from raydelay.errors import Conflict, NotFound, StoreOwned

log = logging.getLogger(__name__)

CLAIM_PREFIX = "meta/owner/"
RENEWED_PREFIX = "meta/owner-renewed/"
LOCK_FILE = ".owner.lock"
START_LOCK_FILE = ".owner-start.lock"
DEFAULT_LEASE_S = 30.0
# A lock held by another cluster is tried again this long before the store is refused:
# claim_is_live() in a client holds it for an instant to see whether an owner holds it.
PROBE_GRACE_S = 0.5


@dataclass(frozen=True)
class Claim:
    epoch: int
    address: str  # the Ray cluster's GCS address
    host: str
    pid: int
    claimed_ms: int
    lease_s: float

    def describe(self) -> str:
        return (
            f"the raydelay cluster at Ray address {self.address} (host {self.host}, pid {self.pid})"
        )


def _decode(raw: bytes) -> Claim:
    return Claim(**json.loads(raw))


def current_claim(store) -> Claim | None:
    """The highest claim in the store, or None."""
    keys = store.list(CLAIM_PREFIX)
    for key in reversed(keys):
        try:
            return _decode(store.get(key))
        except NotFound:
            continue
    return None


def _lock_path(store) -> str | None:
    """The lock file of a local-dir store (through any wrapper), or None for other stores."""
    while not hasattr(store, "root") and hasattr(store, "inner"):
        store = store.inner
    root = getattr(store, "root", None)
    return None if root is None else os.path.join(str(root), LOCK_FILE)


def _open_lock(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


class StartTurn:
    """One process at a time starts a cluster on a local-dir store (see the module's
    docstring). :meth:`try_take` does not block; the turn is held until :meth:`release`
    or until the process ends (the kernel drops the ``flock``). On other stores there is
    no turn to take: :meth:`try_take` always succeeds, and a race is settled by the
    claim's ``put_new``."""

    def __init__(self, store) -> None:
        path = _lock_path(store)
        self._path = None if path is None else os.path.join(os.path.dirname(path), START_LOCK_FILE)
        self._fd: int | None = None

    def try_take(self) -> bool:
        """Take the turn if no other process holds it; True if this process holds it now."""
        if self._path is None or self._fd is not None:
            return True
        try:
            fd = _open_lock(self._path)
        except OSError as exc:  # a read-only root, say: go on without a turn
            log.debug("cannot open %s (%s): starting without a turn", self._path, exc)
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())  # (read by the waiting: who holds the turn)
        self._fd = fd
        return True

    def holder_pid(self) -> int | None:
        """The process id written by the holder of the turn, if it can be read."""
        if self._path is None:
            return None
        try:
            with open(self._path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def claim_is_live(store, claim: Claim) -> bool:
    """Whether ``claim``'s owner still holds the store (see the module's docstring)."""
    path = _lock_path(store)
    if path is not None:
        try:
            fd = _open_lock(path)
        except OSError:
            return True  # cannot tell: assume held
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        finally:
            os.close(fd)
    try:
        renewed = int(store.get(f"{RENEWED_PREFIX}{claim.epoch:020d}"))
    except NotFound:
        renewed = claim.claimed_ms
    return _now_ms() - renewed < claim.lease_s * 1000


class StoreOwner:
    """The coordinator's hold on its store: :meth:`acquire` once, then it is kept until
    the process ends (local dir) or renewed by a thread (other stores)."""

    def __init__(self, store, address: str, lease_s: float = DEFAULT_LEASE_S) -> None:
        self._store = store
        self._address = address
        self._lease_s = lease_s
        self._fd: int | None = None
        self.claim: Claim | None = None
        self.lost: str | None = None  # why this owner lost the store, once it did
        self._stop = threading.Event()

    def acquire(self) -> Claim:
        path = _lock_path(self._store)
        if path is not None and self._fd is None:  # (a retried acquire holds it already)
            self._fd = self._lock(path)  # held while this process lives
        prior = current_claim(self._store)
        if (
            path is None
            and prior is not None
            and prior.address != self._address
            and claim_is_live(self._store, prior)
        ):
            self._refuse(prior)
        epoch = (prior.epoch if prior else 0) + 1
        claim = Claim(
            epoch, self._address, socket.gethostname(), os.getpid(), _now_ms(), self._lease_s
        )
        try:
            self._store.put_new(f"{CLAIM_PREFIX}{epoch:020d}", json.dumps(asdict(claim)).encode())
        except Conflict:
            self._refuse(current_claim(self._store))
        self.claim = claim
        for key in self._store.list(CLAIM_PREFIX)[:-2]:  # keep the last two claims
            self._store.delete(key)
        for key in self._store.list(RENEWED_PREFIX):
            if int(key.rsplit("/", 1)[1]) < epoch:
                self._store.delete(key)
        if path is None:
            self._renew()
            threading.Thread(target=self._renewer, name="raydelay-owner", daemon=True).start()
        log.info("this cluster owns the store (epoch %d)", epoch)
        return claim

    def _lock(self, path: str, wait_own_s: float = 60.0) -> int:
        """Take the local store's lock. Held by an earlier life of this cluster's own
        coordinator (Ray restarting it while the old process exits), wait for it to go;
        held by another cluster (or by no claim yet), refuse after ``PROBE_GRACE_S``."""
        fd = _open_lock(path)
        now = time.monotonic()
        deadline, probed = now + wait_own_s, now + PROBE_GRACE_S
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
                except BlockingIOError:
                    holder = current_claim(self._store)
                    mine = holder is not None and holder.address == self._address
                    if time.monotonic() > (deadline if mine else probed):
                        break
                    time.sleep(0.1 if mine else 0.01)
        except BaseException:
            os.close(fd)  # the store failed while we waited: the caller tries again
            raise
        os.close(fd)
        self._refuse(holder)

    def _refuse(self, holder: Claim | None) -> NoReturn:
        who = holder.describe() if holder else "another raydelay cluster"
        raise StoreOwned(
            f"the store is owned by {who}; attach to it with connect(address=...) or "
            'start one shared cluster with `raydelay up` and connect(address="auto")',
            asdict(holder) if holder else None,
        )

    def _renew(self) -> None:
        assert self.claim is not None
        newest = current_claim(self._store)
        if newest is not None and newest.epoch > self.claim.epoch:
            self.lost = f"the store was taken over by {newest.describe()}"
            log.error("this cluster lost its store: %s", self.lost)
            self._stop.set()
            return
        self._store.put(f"{RENEWED_PREFIX}{self.claim.epoch:020d}", str(_now_ms()).encode())

    def _renewer(self) -> None:
        while not self._stop.wait(self._lease_s / 3):
            try:
                self._renew()
            except Exception as exc:  # noqa: BLE001 - the store failing: try again
                log.warning("renewing the store's owner record failed: %s", exc)

    def check(self) -> None:
        """Raise :class:`StoreOwned` if this owner lost the store."""
        if self.lost is not None:
            raise StoreOwned(f"this cluster no longer owns its store: {self.lost}")

    def fence(self) -> None:
        """Raise :class:`StoreOwned` (and stop serving) if a newer claim than this owner's
        is in the store: another coordinator took over (called when a journal write finds
        its number taken)."""
        newest = current_claim(self._store)
        if self.claim is not None and newest is not None and newest.epoch > self.claim.epoch:
            self.lost = f"the store was taken over by {newest.describe()} (epoch {newest.epoch})"
            self._stop.set()
            log.error("this coordinator is fenced off: %s", self.lost)
        self.check()

    def release(self) -> None:
        self._stop.set()
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
