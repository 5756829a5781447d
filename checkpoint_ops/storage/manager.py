"""The checkpoint file manager: the single path through which every operation touches storage.

Modelled on Spark's ``CheckpointFileManager`` (SPARK-23966): one small interface, one strategy
per kind of file system, chosen by URL scheme.

* ``create_atomic(path, overwrite=False)`` returns a writer whose ``close()`` publishes the whole
  file at once and whose ``cancel()`` (or an exception inside ``with``) leaves nothing visible.
  With ``overwrite=False`` an existing file is never replaced, even when writers race: the loser
  gets ``FileExistsError``.
* ``read_versioned`` and ``replace_if_same`` replace a small record only if it is still the version
  read, in one request where the store has conditional writes (S3: ``If-Match``); elsewhere the
  replace is unconditional (``conditional_replace`` says which). Leases renew this way.
* Everything else (``read_bytes``, ``exists``, ``list``, ``walk``, ``delete``, ``rename``...) is
  plain, and every call is counted so benchmarks and tests can see the requests we make.
"""

from __future__ import annotations

import abc
import collections
import hashlib
import threading
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable

from . import killswitch
from .checksums import sidecar_names
from .paths import Location, basename, dirname, join

COPY_CHUNK = 8 * 2**20  # bytes per read when a copy streams through this process


class FileChangedError(OSError):
    """``replace_if_same`` found the file replaced (or deleted) since the version it was given: nothing
    was written."""


class FileInfo:
    """One listed file (or directory): full fsspec path, size in bytes, mtime in seconds.

    ``error`` holds the OSError met while looking at it (a symlink loop, no permission): the
    listing still shows the name, as Spark's listing would, and whoever needs the file says why
    it cannot be used.

    ``link_target`` is set on a symbolic link to a directory found inside a walked tree: ``walk``
    lists the link itself (``is_dir``, with its target) and does not enter it, so that nobody
    mistakes it for a file or for an empty directory (see ``model/listing.py``).
    """

    __slots__ = ("path", "_size", "_mtime", "is_dir", "_error", "link_target")

    def __init__(self, path: str, size: int | None = None, mtime: float | None = None, is_dir: bool = False):
        self.path = path
        self._size = size
        self._mtime = mtime
        self.is_dir = is_dir
        self._error = None
        self.link_target: str | None = None

    @property
    def error(self) -> OSError | None:
        return self._error

    @property
    def size(self) -> int:
        return self._size or 0

    @property
    def mtime(self) -> float | None:
        return self._mtime

    @property
    def known_size(self) -> int | None:
        """The size if the listing already knows it (object stores always do), without a stat."""
        return self._size

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    def __repr__(self) -> str:
        return f"FileInfo({self.path!r}, size={self.size}, mtime={self.mtime}, is_dir={self.is_dir})"


@dataclass
class OpCounter:
    """Requests (object stores) or file-system calls (local) a manager has issued, by kind; and how
    many of them were retries of an attempt that failed for a moment (``storage/retry.py``), by kind.
    Every attempt is a request: ``snapshot()`` includes the retried ones."""

    counts: collections.Counter = field(default_factory=collections.Counter)
    retry_counts: collections.Counter = field(default_factory=collections.Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.counts[kind] += n

    def add_retry(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.retry_counts[kind] += n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def total_retries(self) -> int:
        return sum(self.retry_counts.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self.counts.items()))

    def retries(self) -> dict[str, int]:
        """Retried requests by kind (empty when every request succeeded at once)."""
        with self._lock:
            return dict(sorted(self.retry_counts.items()))

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.retry_counts.clear()


@dataclass(frozen=True)
class PendingUpload:
    """An object-store upload that was started and never completed or aborted (a multipart upload
    whose writer died): invisible to listings, its parts kept (and billed) until it is aborted."""

    path: str  # the fsspec path it would have published
    upload_id: str
    initiated: float | None  # when it started (seconds since the epoch), if the store says

    def to_dict(self) -> dict:
        return {"path": self.path, "upload_id": self.upload_id, "initiated": self.initiated}


class AtomicWriter(abc.ABC):
    """A writable binary stream: ``close()`` publishes, ``cancel()`` discards."""

    def __init__(self, path: str, overwrite: bool):
        self.path = path
        self.overwrite = overwrite
        self._done = False

    @abc.abstractmethod
    def write(self, data: bytes) -> int: ...

    @abc.abstractmethod
    def _publish(self) -> None: ...

    @abc.abstractmethod
    def _discard(self) -> None: ...

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        try:  # an interrupt as it publishes (a Ctrl-C, or the crash switch's SIGINT) leaves no temp file
            killswitch.tick(what=self.path)  # publishing is a mutating call (the crash-matrix tests count it)
            self._publish()
        except BaseException:
            self._discard()
            raise

    def cancel(self) -> None:
        if self._done:
            return
        self._done = True
        self._discard()

    def __enter__(self) -> "AtomicWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()


class CheckpointFileManager(abc.ABC):
    """Storage strategy for one file system. Paths are fsspec paths (see ``paths.Location``)."""

    #: the strategy name shown to users and accepted by ``strategy=`` overrides
    strategy: str = ""
    #: Hadoop ChecksumFs sidecars (``.<name>.crc``) are maintained on this file system
    hadoop_crc: bool = False
    #: ``rename`` is a metadata operation (cheap, atomic), not copy + delete
    atomic_rename: bool = False
    #: ``replace_if_same`` is one conditional request at the store, not an unconditional replace
    conditional_replace: bool = False

    def __init__(self, location: Location):
        self.location = location
        self.counter = OpCounter()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        killswitch.instrument(cls)  # every strategy's mutating calls count for the crash switch

    # -- writing ---------------------------------------------------------------------------
    @abc.abstractmethod
    def create_atomic(self, path: str, overwrite: bool = False) -> AtomicWriter: ...

    def write_bytes(self, path: str, data: bytes, overwrite: bool = False) -> None:
        with self.create_atomic(path, overwrite=overwrite) as out:
            out.write(data)

    def replace_if_same(self, path: str, data: bytes, version: str | None) -> None:
        """Replace ``path`` with ``data``, whole, only if it is still the ``version`` ``read_versioned``
        returned; else ``FileChangedError`` and nothing is written (a deleted file counts as changed).
        Where ``conditional_replace`` is True this is one conditional request, so a write that reaches the
        store late (stuck in retries) can never replace what another process wrote meanwhile; a retried
        attempt refused because an earlier attempt of this very call was stored (its reply lost) is taken
        as done, by reading back exactly ``data``. Elsewhere (local disk, HDFS: a rename cannot be made
        conditional), or without a ``version``, it replaces unconditionally, as ``write_bytes(path, data,
        overwrite=True)``. One mutating call for the crash switch."""
        self.write_bytes(path, data, overwrite=True)

    def write_many(self, items: Iterable[tuple[str, bytes]]) -> list[bool]:
        """Publish several new files, each exactly as ``write_bytes(path, data, overwrite=False)`` does.

        Each file appears whole or not at all; an existing file is never replaced, even against a
        racing writer; checksum sidecars are kept where this file system keeps them; each file is
        as durable as ``write_bytes`` makes it (where the strategy defers syncing, only once
        ``sync()`` returns). Each publish is one mutating call for the crash switch. Returns, per
        item in order, True where this call created the file, False where a file was already there
        (left alone, its content not compared: meant for content-addressed names). An error stops
        the batch: files published before it stay (each is whole), none after it is started.

        The default is that loop; a strategy may publish with fewer calls per file (local disk: no
        writer object, no sidecar bookkeeping where none is kept).
        """
        created = []
        for path, data in items:
            try:
                self.write_bytes(path, data, overwrite=False)
                created.append(True)
            except FileExistsError:
                created.append(False)
        return created

    def write_many_direct(self, items: Iterable[tuple[str, bytes]]) -> list[bool]:
        """Create several new files directly under their names: for contents that nobody trusts until
        something published after ``sync()`` vouches for them (a backup's objects, sealed by its manifest).

        Returns, per item in order, True where this call created the file, False where a file of that name
        was already there (left alone, its content not compared). An existing file is never replaced, even
        against a racing writer; no checksum sidecar is written where none is kept (names that need one
        are published as ``write_many`` publishes them). Each created file is one mutating call for the
        crash switch. A file is as durable as ``write_bytes`` makes it (where the strategy defers syncing,
        only once ``sync()`` returns).

        Unlike ``write_many``, a file is not published whole where ``names_may_be_partial`` is True
        (local disk): it is visible under its name from the moment it is created, so a reader may see it
        part-written while it is written, and a crash of the process or the machine (before ``sync()``
        returns) can leave it part-written or empty under its name for good; so can an error while it is
        written (it is not removed: a racing writer may have replaced it meanwhile), which stops the batch.
        A file this call did not create (False) may be such a leftover: a caller trusts it only if
        something it trusts vouches for it, and otherwise reads it back to check it.

        The default is ``write_many`` (object stores: a PUT is whole anyway; HDFS-like stores).
        """
        return self.write_many(items)

    @property
    def names_may_be_partial(self) -> bool:
        """Whether a file under its final name here may be part-written, left by a crash during
        ``write_many_direct`` of any strategy that writes here: on local disk (``LocalFileManager``
        creates them in place). Object stores never hold one (every write is one whole PUT, or a multipart
        upload completed at once); nor do HDFS-like stores (``write_many_direct`` publishes atomically)."""
        return self.location.is_local

    def copy_in(self, src: "CheckpointFileManager", src_path: str, dst_path: str, sha256: str | None = None,
                overwrite: bool = False) -> bool:
        """Publish a copy of ``src_path`` (a file of ``src``, any strategy) at ``dst_path``, with the
        guarantees of ``write_bytes(dst_path, ..., overwrite)``: whole or not at all; without ``overwrite``
        never replacing (False when a file is there already, True when this call created it), with it
        replacing what is there in one atomic step (True); as durable as ``write_bytes`` makes it. With
        ``sha256``, the copy is published only if its content has that hash, else OSError naming the
        source (it changed while it was copied) and nothing is published. A missing source is
        FileNotFoundError. One mutating call for the crash switch (the publish).

        The default streams the bytes through ``create_atomic``, hashing them as they go by; a strategy
        may copy without them passing through this process (local disk from local disk: in the kernel).
        """
        h = hashlib.sha256()
        try:
            with src.open_read(src_path) as f, self.create_atomic(dst_path, overwrite=overwrite) as out:
                while chunk := f.read(COPY_CHUNK):
                    h.update(chunk)
                    out.write(chunk)
                if sha256 is not None and h.hexdigest() != sha256:
                    raise OSError(f"{src.url(src_path)} changed while it was being copied")
        except FileExistsError:
            return False
        return True

    # -- reading ---------------------------------------------------------------------------
    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """Whole file; raises FileNotFoundError."""

    def read_versioned(self, path: str) -> tuple[bytes, str | None]:
        """The whole file and the version it was (for ``replace_if_same``; None where the store names no
        versions, and ``replace_if_same`` is then unconditional); raises FileNotFoundError."""
        return self.read_bytes(path), None

    def read_prefix(self, path: str, n: int) -> bytes:
        """The first ``n`` bytes (fewer if the file is shorter)."""
        return self.read_bytes(path)[:n]

    def open_read(self, path: str) -> BinaryIO:
        """A binary stream of the file (for files too big to hold in memory); FileNotFoundError."""
        import io

        return io.BytesIO(self.read_bytes(path))

    def read_many(self, paths: Iterable[str], errors: dict | None = None) -> dict[str, bytes | None]:
        """Several files (concurrently where the backend can); missing ones map to None.

        Any other OSError (no permission, a directory, a symlink loop) is raised, unless ``errors``
        is given: then it is put there by path, and the path maps to None.
        """
        out: dict[str, bytes | None] = {}
        for p in paths:
            try:
                out[p] = self.read_bytes(p)
            except FileNotFoundError:
                out[p] = None
            except OSError as e:
                if errors is None:
                    raise
                errors[p] = e
                out[p] = None
        return out

    @abc.abstractmethod
    def info(self, path: str) -> FileInfo | None:
        """Size/mtime of one file, or None if it does not exist."""

    def exists(self, path: str) -> bool:
        return self.info(path) is not None

    @abc.abstractmethod
    def list(self, path: str) -> list[FileInfo]:
        """Direct children (files and directories); empty if ``path`` does not exist."""

    def any_under(self, path: str) -> bool:
        """Whether anything is below ``path`` (False for a path, or an object store bucket, that is not there).
        Object stores answer from one short listing page instead of every page."""
        return bool(self.list(path))

    @abc.abstractmethod
    def walk(self, path: str, empty_dirs: bool = False) -> list[FileInfo]:
        """Every file below ``path`` (recursively), in as few requests as the backend allows.

        With ``empty_dirs``, directories holding nothing are listed too (``is_dir``): Spark's
        listing sees a directory named like a batch file as that batch. Object stores have none.
        """

    # -- deleting and moving ---------------------------------------------------------------
    @abc.abstractmethod
    def delete_many(self, paths: Iterable[str]) -> None:
        """Delete exactly these files (batched where possible); missing files are ignored."""

    def delete(self, path: str) -> None:
        """Delete one file and its checksum sidecars; a missing file is ignored."""
        parent, name = dirname(path), basename(path)
        # Hadoop's sidecars exist only where this file system keeps them; Spark's (state files) anywhere
        extra = [join(parent, n) for n in sidecar_names(name) if self.hadoop_crc or not n.startswith(".")]
        present = [p for p in extra if self.exists(p)]
        # Sidecars first: a checksum without its file is harmless, the reverse can be stale.
        self.delete_many(present)
        self.delete_many([path])

    @abc.abstractmethod
    def rename(self, src: str, dst: str, overwrite: bool = False) -> None:
        """Move a file; with ``overwrite=False`` an existing ``dst`` raises FileExistsError."""

    @abc.abstractmethod
    def copy(self, src: str, dst: str) -> None: ...

    def move_many(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Move files to fresh destinations nobody else writes (our trash, a keep directory).

        Renames where the file system can, else copies and deletes. Returns the sources that did
        not exist (already moved, or never there). Files of one source directory are moved in the
        order given (a log shrinks from the top); a strategy may move different directories at once,
        and may be stopped by a crash with a file under both names (local disk: linked, not yet
        unlinked), which the next call for the same pairs finishes.
        """
        missing = []
        for src, dst in pairs:
            try:
                self.rename(src, dst, overwrite=True)
            except FileNotFoundError:
                missing.append(src)
        return missing

    def sync(self) -> None:
        """Make every write so far durable, where writes can be deferred (object stores: each PUT
        already is)."""

    def ensure_checksum(self, path: str) -> None:
        """Where the file system keeps checksum sidecars, write the one of ``path`` if it is missing
        (a crash between a file and its sidecar). Elsewhere nothing to do."""

    def versioning_enabled(self, path: str) -> bool:
        """Whether deleted objects stay restorable (object-store versioning). False elsewhere."""
        return False

    def undelete_many(self, paths: list[str]) -> list[str]:
        """Undo deletes on a versioned store (remove the delete markers); returns paths not restored."""
        raise NotImplementedError(f"{self.strategy} has no versioned deletes")

    def pending_uploads(self, path: str) -> list[PendingUpload]:
        """Uploads started below ``path`` and never completed or aborted. Only object stores have
        them (a file system's interrupted write is a hidden temp file, which ``walk`` lists)."""
        return []

    def abort_uploads(self, uploads: list[PendingUpload]) -> None:
        """Abort these uploads (the store drops their parts); ones already gone are ignored."""
        if uploads:
            raise NotImplementedError(f"{self.strategy} has no uploads to abort")

    @abc.abstractmethod
    def mkdirs(self, path: str) -> None: ...

    def remove_empty_dirs(self, path: str) -> None:
        """Remove ``path`` and the directories below it that hold no file. Object stores have no
        directories, so by default there is nothing to do."""

    def remove_dirs_if_empty(self, paths: Iterable[str]) -> None:
        """Remove each of these directories that holds nothing, deepest first (a parent emptied by the
        removal of a listed child goes too when it is listed); one that holds anything, or is not there,
        stays as it is. Object stores have no directories, so by default there is nothing to do."""

    # -- helpers ---------------------------------------------------------------------------
    def url(self, path: str) -> str:
        """How to show ``path`` to a user (with the scheme they typed)."""
        return self.location.url(path)


killswitch.instrument(CheckpointFileManager)
