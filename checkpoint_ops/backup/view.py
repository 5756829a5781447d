"""A backup seen as a read-only file system, so the checkpoint model reads it like any checkpoint.

Restoring to an earlier batch validates that batch's restart set and plans the rollback on the backup
itself, before anything is written to the target. Paths are ``<root id>/<rel>`` (``checkpoint/offsets/7``,
``sink0/_spark_metadata/3``, ``ledger/<segment>``); reads fetch the object the manifest names.
"""

from __future__ import annotations

import concurrent.futures
from typing import Iterable

from ..errors import RefusedError
from ..storage.manager import AtomicWriter, CheckpointFileManager, FileInfo
from ..storage.paths import Location
from .repository import Manifest, Repository


class BackupView(CheckpointFileManager):
    strategy = "backup-view"

    def __init__(self, repo: Repository, manifest: Manifest):
        super().__init__(Location("backup", manifest.id, "backup"))
        self.repo = repo
        self.manifest = manifest
        self.files: dict[str, tuple[str, int]] = {}  # path -> (sha, size)
        for rid in manifest.roots:
            for rel, sha, size in manifest.files(rid):
                self.files[f"{rid}/{rel}"] = (sha, size)

    def url(self, path: str) -> str:
        """Where the file was when it was backed up (messages name the checkpoint the user knows, and
        the ledger finds its sinks by their URLs)."""
        rid, _, rel = path.strip("/").partition("/")
        root = self.manifest.roots.get(rid)
        if root is None:
            return f"backup {self.manifest.id}:{path}"
        return root["url"] + (f"/{rel}" if rel else "")

    def _sha(self, path: str) -> str:
        got = self.files.get(path.strip("/"))
        if got is None:
            raise FileNotFoundError(path)
        return got[0]

    def read_bytes(self, path: str) -> bytes:
        self.counter.add("read")
        return self.repo.read_object(self._sha(path))

    def read_many(self, paths: Iterable[str], errors: dict | None = None) -> dict[str, bytes | None]:
        paths = list(paths)

        def one(p):
            try:
                return p, self.read_bytes(p)
            except FileNotFoundError:
                return p, None

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            return dict(pool.map(one, paths))

    def open_read(self, path: str):
        self.counter.add("read")
        return self.repo.fm.open_read(self.repo.object_path(self._sha(path)))

    def info(self, path: str) -> FileInfo | None:
        got = self.files.get(path.strip("/"))
        return FileInfo(path, got[1], None) if got else None

    def list(self, path: str) -> list[FileInfo]:
        prefix = path.strip("/") + "/"
        out, dirs = [], set()
        for p, (_, size) in self.files.items():
            if p.startswith(prefix):
                rest = p[len(prefix):]
                if "/" in rest:
                    dirs.add(rest.split("/", 1)[0])
                else:
                    out.append(FileInfo(p, size, None))
        return out + [FileInfo(prefix + d, 0, None, is_dir=True) for d in sorted(dirs)]

    def walk(self, path: str, empty_dirs: bool = False) -> list[FileInfo]:
        prefix = path.strip("/") + "/"
        return [FileInfo(p, size, None) for p, (_, size) in self.files.items() if p.startswith(prefix)]

    # read-only: planning on a backup never writes to it
    def _refuse(self, *a, **k):
        raise RefusedError("a backup is read-only", path=self.url(""))

    def create_atomic(self, path: str, overwrite: bool = False) -> AtomicWriter:
        self._refuse()

    def delete_many(self, paths: Iterable[str]) -> None:
        self._refuse()

    def rename(self, src: str, dst: str, overwrite: bool = False) -> None:
        self._refuse()

    def copy(self, src: str, dst: str) -> None:
        self._refuse()

    def mkdirs(self, path: str) -> None:
        self._refuse()
