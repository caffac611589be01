"""The local-directory store: the embedded default.

Each key is a file under ``root``. A put writes a temp file in the same
directory, fsyncs it, renames it over the key and fsyncs the directory, so a
reader sees all of a value or none of it, and a crash leaves either the old or
the new value. Every path is resolved and checked to stay inside ``root``, even
through symlinks placed in the tree.
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path

from raydelay.errors import InvalidArgument, NotFound, StorageError
from raydelay.storage.base import check_data, check_range, same_or_conflict
from raydelay.storage.keys import validate_key, validate_prefix

_TMP_SUFFIX = ".rdtmp"
# where an open file descriptor's real path can be read (Linux); elsewhere paths are resolved
_FD_PATHS = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else ""
_CHECKED_DIRS = 4096  # directories remembered as checked (then it starts over)
_RETRIABLE_ERRNOS = {errno.EIO, errno.ENOSPC, errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.EMFILE}


class LocalDirObjectStore:
    """Objects as files under ``root`` (created if missing)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        if not str(root):
            raise InvalidArgument("root: may not be empty")
        self._root = Path(os.path.realpath(os.path.abspath(root)))
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _translate(exc, f"cannot create store root {self._root}") from exc
        self._dirs: set[Path] = set()  # directories made and checked to be inside the root

    @property
    def root(self) -> Path:
        return self._root

    # -- path safety ------------------------------------------------------------------

    def _inside(self, path: str) -> bool:
        root = str(self._root)
        return path == root or path.startswith(root + os.sep)

    @staticmethod
    def _key(key: str) -> str:
        key = validate_key(key)
        if key.endswith(_TMP_SUFFIX):
            raise InvalidArgument(f"key: {key!r} ends with the reserved suffix {_TMP_SUFFIX}")
        return key

    def _path(self, key: str) -> Path:
        path = self._root.joinpath(*self._key(key).split("/"))
        # realpath resolves any symlink on the way; the result must stay under the root.
        if not self._inside(os.path.realpath(path)):
            raise InvalidArgument(f"key: {key!r} resolves outside the store root")
        return path

    # -- operations -------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        self._write(key, data, create_only=False)

    def put_new(self, key: str, data: bytes) -> None:
        data = check_data(data)
        if not self._write(key, data, create_only=True):
            same_or_conflict(self, key, data)

    def _write(self, key: str, data: bytes, *, create_only: bool) -> bool:
        """Write a temp file, fsync it, then rename it over the key (or, create-only, link it
        to the key: False if the key exists) and fsync the directory."""
        # (the key's own last part is not resolved: a link or a replace over a symlink puts
        # the object in its place, never through it; its directory is checked)
        path = self._root.joinpath(*self._key(key).split("/"))
        data = check_data(data)
        parent = path.parent
        tmp = parent / f".{path.name}.{uuid.uuid4().hex}{_TMP_SUFFIX}"
        try:
            self._checked_dir(parent, key)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileNotFoundError:  # pruned since it was checked (a delete, elsewhere too)
                self._dirs.discard(parent)
                self._checked_dir(parent, key)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            if create_only:
                try:
                    os.link(tmp, path)  # atomic, and fails if the key exists
                except FileExistsError:
                    return False
                finally:
                    tmp.unlink(missing_ok=True)
            else:
                os.replace(tmp, path)
            _fsync_dir(parent)
            return True
        except InvalidArgument:
            raise
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            raise _translate(exc, f"put {key!r} failed") from exc

    def _checked_dir(self, parent: Path, key: str) -> None:
        """Make ``parent`` and check that it resolves inside the root, once: a commit's
        write no longer walks its key's path twice (a tenth of a send's time on the host)."""
        if parent in self._dirs:
            return
        parent.mkdir(parents=True, exist_ok=True)
        if not self._inside(os.path.realpath(parent)):
            raise InvalidArgument(f"key: {key!r} resolves outside the store root")
        if len(self._dirs) >= _CHECKED_DIRS:
            self._dirs.clear()
        self._dirs.add(parent)

    def get(self, key: str) -> bytes:
        return self._read(key, None, "get")

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self._read(key, check_range(start, end), "get_range")

    def _read(self, key: str, span: tuple[int, int] | None, what: str) -> bytes:
        """The object (or bytes ``span``). Where the OS names an open file's real path
        (Linux: /proc/self/fd), the file is opened first and that path checked: one call
        where resolving the key's path walks each of its parts (a merged bucket's loads
        read thousands of ranges), and what is checked is what is read."""
        path = self._root.joinpath(*self._key(key).split("/")) if _FD_PATHS else self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise NotFound(f"no object at key {key!r}") from None
        except OSError as exc:
            raise _translate(exc, f"{what} {key!r} failed") from exc
        try:
            if _FD_PATHS and not self._inside(os.readlink(f"{_FD_PATHS}/{fd}")):
                raise InvalidArgument(f"key: {key!r} resolves outside the store root")
            if span is None:
                with os.fdopen(os.dup(fd), "rb") as f:
                    return f.read()
            start, end = span
            out = os.pread(fd, end - start, start)
            while len(out) < end - start:  # (a short read: not at the end of the file yet)
                more = os.pread(fd, end - start - len(out), start + len(out))
                if not more:
                    break
                out += more
            return out
        except IsADirectoryError:
            raise NotFound(f"no object at key {key!r}") from None
        except OSError as exc:
            raise _translate(exc, f"{what} {key!r} failed") from exc
        finally:
            os.close(fd)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return  # a "directory" key holds no object of its own
        except OSError as exc:
            raise _translate(exc, f"delete {key!r} failed") from exc
        self._prune_empty_dirs(path.parent)

    def _prune_empty_dirs(self, directory: Path) -> None:
        # Keep the tree from filling with empty directories; stop at the root or a non-empty one.
        while directory != self._root and self._inside(str(directory)):
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    def list(self, prefix: str = "") -> list[str]:
        prefix = validate_prefix(prefix)
        dir_part = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self._root.joinpath(*dir_part.split("/")) if dir_part else self._root
        real = os.path.realpath(base)
        if not self._inside(real) or not os.path.isdir(real):
            return []
        keys: list[str] = []
        try:
            for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
                rel_dir = os.path.relpath(dirpath, self._root)
                rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
                # prune directories that cannot hold a matching key
                dirnames[:] = [
                    d
                    for d in dirnames
                    if not os.path.islink(os.path.join(dirpath, d))
                    and _could_match(rel_dir + d + "/", prefix)
                ]
                for name in filenames:
                    if name.endswith(_TMP_SUFFIX):
                        continue
                    full = os.path.join(dirpath, name)
                    if os.path.islink(full):
                        continue
                    key = rel_dir + name
                    if key.startswith(prefix):
                        keys.append(key)
        except OSError as exc:
            raise _translate(exc, f"list {prefix!r} failed") from exc
        keys.sort()
        return keys

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def __repr__(self) -> str:
        return f"LocalDirObjectStore({str(self._root)!r})"


def _could_match(dir_key: str, prefix: str) -> bool:
    return dir_key.startswith(prefix) or prefix.startswith(dir_key)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _translate(exc: OSError, what: str) -> StorageError:
    retriable = exc.errno in _RETRIABLE_ERRNOS
    return StorageError(f"{what}: {exc}", retriable=retriable)
