"""Signed calls: a scheduled call runs only if the cluster's own secret signed it.

A runner unpickles and runs what the tasks topic holds, so whoever can write the store
could otherwise run code on the cluster. Every task payload is therefore sealed with an
HMAC-SHA256 of a secret that is held **outside the store**, and a runner opens it before
it unpickles anything: an unsigned or badly signed call goes to the dead-letter topic
with the reason, and never runs.

- **The sealed form** (version 1): ``RDS1``, the 32-byte HMAC-SHA256 of the rest under
  the secret, then the task payload itself (:func:`raydelay.tasks.spec.task_payload`).
- **The secret**, in this order:

  1. ``RAYDELAY_TASKS_SECRET``, an environment variable;
  2. the file that ``tasks.secret_file`` names;
  3. for a store on this machine only (``storage.kind = "local"``, not ``shared``), a
     secret made once beside the store's directory (``<root>.tasks-secret``, mode 0600),
     so that the embedded default needs no set-up.

  A store that several machines share (S3, a shared directory) needs 1 or 2, the same on
  every client: scheduling without it is refused with an :class:`InvalidArgument` that
  says so.
- **Rotation.** The variable or the file holds secrets separated by white space: the
  first one signs, and every one is accepted. Put the new one first, keep the old one
  after it until every call it signed has run, then drop it (docs/security.md).

Pure: no Ray, no store. :func:`load_signer` reads the environment and the file system.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from raydelay.errors import InvalidArgument

MAGIC = b"RDS1"
MAC_BYTES = 32
HEADER_BYTES = len(MAGIC) + MAC_BYTES
SECRET_ENV = "RAYDELAY_TASKS_SECRET"
MIN_SECRET_CHARS = 16
AUTO_SUFFIX = ".tasks-secret"  # the made secret's file, beside a local store's directory


class CallSigner:
    """Seals task payloads with the first secret; opens those sealed with any of them."""

    def __init__(self, secrets_: Sequence[bytes]) -> None:
        if not secrets_:
            raise InvalidArgument("tasks secret: none given")
        self._keys = [bytes(s) for s in secrets_]

    @property
    def secret_text(self) -> str:
        """Every secret as the variable holds them (for a runner this client starts)."""
        return " ".join(k.decode("utf-8") for k in self._keys)

    def key_ids(self) -> list[str]:
        """A short fingerprint of each secret, first the one that signs (SHA-256, 16 hex
        digits: it tells secrets apart, and gives nothing of them away)."""
        return [hashlib.sha256(k).hexdigest()[:16] for k in self._keys]

    def sign(self, payload: bytes) -> bytes:
        """``payload`` sealed: the header, then the payload as it was."""
        mac = hmac.new(self._keys[0], payload, hashlib.sha256).digest()
        return b"".join((MAGIC, mac, payload))

    def open(self, sealed: bytes) -> bytes:
        """The payload that ``sealed`` carries, once its signature is checked;
        InvalidArgument naming why it is refused (unsigned, or signed with no secret of
        this cluster)."""
        if len(sealed) < HEADER_BYTES or sealed[: len(MAGIC)] != MAGIC:
            raise InvalidArgument(
                "signature: the call is not signed (refused: only calls signed with this "
                "cluster's tasks secret run; see docs/security.md)"
            )
        mac, payload = sealed[len(MAGIC) : HEADER_BYTES], sealed[HEADER_BYTES:]
        for key in self._keys:
            if hmac.compare_digest(mac, hmac.new(key, payload, hashlib.sha256).digest()):
                return payload
        raise InvalidArgument(
            "signature: the call's signature matches none of this cluster's tasks secrets "
            "(refused: it was changed, or signed with another secret)"
        )


def peel(sealed: bytes) -> bytes:
    """The payload of a sealed call without checking it: for showing, never for running."""
    return sealed[HEADER_BYTES:] if sealed[: len(MAGIC)] == MAGIC else sealed


def parse_secrets(text: str, where: str) -> list[bytes]:
    """The secrets of ``text`` (separated by white space), each checked."""
    found = text.split()
    if not found:
        raise InvalidArgument(f"{where}: holds no secret")
    for s in found:
        if len(s) < MIN_SECRET_CHARS:
            raise InvalidArgument(
                f"{where}: a secret of {len(s)} characters; at least {MIN_SECRET_CHARS}"
            )
    return [s.encode("utf-8") for s in found]


def load_signer(
    secret_file: str,
    local_root: str | None,
    env: Mapping[str, str] | None = None,
) -> CallSigner:
    """The signer of this process: from ``RAYDELAY_TASKS_SECRET``, else ``secret_file``,
    else (``local_root``: the directory of a store on this machine only) the secret made
    beside it. InvalidArgument when none applies, or the one found is unusable."""
    env = os.environ if env is None else env
    text = env.get(SECRET_ENV, "").strip()
    if text:
        return CallSigner(parse_secrets(text, SECRET_ENV))
    if secret_file:
        path = Path(secret_file).expanduser()
        try:
            content = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidArgument(
                f"tasks.secret_file: cannot read {str(path)!r} ({exc.strerror or exc})"
            ) from None
        return CallSigner(parse_secrets(content, f"tasks.secret_file {str(path)!r}"))
    if local_root is None:
        raise InvalidArgument(
            "tasks: scheduled calls are signed with a secret held outside the store, and a "
            f"store that several machines share needs one set: {SECRET_ENV} or "
            "tasks.secret_file, the same on every client (docs/security.md)"
        )
    return CallSigner(parse_secrets(_made_secret(local_root), f"the secret beside {local_root}"))


def _made_secret(local_root: str) -> str:
    """The secret kept beside a local store's directory, made (mode 0600) on first use.
    It appears whole or not at all (written aside, then linked), and of two processes
    making it at once both end with the one that was linked first."""
    path = Path(str(local_root).rstrip("/\\") + AUTO_SUFFIX)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f"{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(aside, path)
        except FileExistsError:  # another process linked its own first: that one holds
            pass
    finally:
        aside.unlink(missing_ok=True)
    return path.read_text(encoding="utf-8")
