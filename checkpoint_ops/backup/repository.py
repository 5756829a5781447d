"""A backup destination: content-addressed objects, immutable manifests, and the locks that let garbage
collection run while another backup is being taken.

Layout under the destination URL (local directory or object-store prefix)::

    checkpoint-ops-backups.json     marks a destination (format); anything else there is refused
    objects/<aa>/<sha256>           file contents, stored once however many backups hold them
    manifests/<backup id>.json      one per backup, put-if-absent, published last: a backup exists
                                    exactly when its manifest does
    verified/<backup id>.json       the outcome of the last full verification of that backup
    drills/<backup id>.json         the outcome of the last restore drill of that backup (``drill.py``)
    intents/<backup id>.json        a backup being taken: every hash it will reference (GC keeps them)
    locks/prune-<id>.json           a garbage collection in progress (backups wait for it)

Every write goes through the atomic file manager. Objects are only ever created (put-if-absent); a
manifest names each file by path relative to its root and the hash of its content.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
import uuid
from dataclasses import dataclass, field

from ..errors import BadInputError
from ..journal import utc_stamp
from ..storage import CheckpointFileManager, open_file_manager
from ..storage.paths import join

MARKER = "checkpoint-ops-backups.json"
FORMAT = 1
INTENT_TTL_S = 24 * 3600  # an intent older than this belongs to a backup that died (its objects are garbage)
LOCK_TTL_S = 6 * 3600
_STREAM = 8 * 2**20


def new_backup_id() -> str:
    return f"{utc_stamp()}-{uuid.uuid4().hex[:8]}"


def safe_rel(rel: str, where: str) -> str:
    """A manifest path must stay inside its root: relative, normalized, no ``..``."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or ":" in rel.split("/")[0]:
        raise BadInputError(f"manifest names {rel!r}, which is not a relative path", path=where,
                            fix="the manifest was not written by this tool or was edited: do not restore it")
    norm = posixpath.normpath(rel)
    if norm != rel or norm.startswith("../") or norm == "..":
        raise BadInputError(f"manifest names {rel!r}, which would leave its root", path=where,
                            fix="the manifest was not written by this tool or was edited: do not restore it")
    return rel


@dataclass
class Manifest:
    id: str
    doc: dict
    url: str  # where it is stored

    @property
    def created(self) -> str:
        return self.doc["created"]

    @property
    def checkpoint_url(self) -> str:
        return self.doc["checkpoint"]["url"]

    @property
    def batch(self) -> int | None:
        return self.doc["checkpoint"].get("batch")

    @property
    def roots(self) -> dict:
        return self.doc["roots"]

    def files(self, rid: str) -> list[tuple[str, str, int]]:
        """(rel, sha256, size) of one root, each path checked to stay inside it."""
        return [(safe_rel(rel, self.url), sha, size) for rel, sha, size, *_ in self.roots[rid]["files"]]

    def hashes(self) -> set[str]:
        return {f[1] for r in self.roots.values() for f in r["files"]}

    @property
    def stats(self) -> dict:
        return self.doc.get("stats", {})


@dataclass
class Repository:
    """One backup destination."""

    fm: CheckpointFileManager
    root: str
    url: str
    storage_options: dict | None = None
    _manifests: list[Manifest] | None = field(default=None, repr=False)

    @classmethod
    def open(cls, url: str, storage_options: dict | None = None, create: bool = False) -> "Repository":
        fm, root = open_file_manager(url, storage_options)
        if fm.hadoop_crc:  # nothing Hadoop reads a backup destination: no .crc sidecars, one sync per backup
            fm.hadoop_crc = False
            fm.defer_sync = True
        repo = cls(fm, root.rstrip("/"), url.rstrip("/"), storage_options)
        try:
            marker = fm.read_bytes(repo.path(MARKER))
        except FileNotFoundError:
            marker = None
        if marker is None:
            # hidden names are temp files of an interrupted write (ours): they do not make it foreign
            names = [f for f in fm.list(root) if not f.name.startswith(".")]
            if names and not create:
                raise BadInputError(f"not a backup destination (no {MARKER}; it holds "
                                    f"{', '.join(sorted(f.name for f in names)[:3])}...)", path=url,
                                    fix="point at the URL backups were created with")
            if names:
                raise BadInputError(f"not a backup destination (no {MARKER}) and not empty: it holds "
                                    f"{', '.join(sorted(f.name for f in names)[:3])}", path=url,
                                    fix="use an empty location (or one created by `checkpoint-ops backup create`)")
            if not create:
                raise BadInputError("no backups here (nothing at this location)", path=url,
                                    fix="check the URL (and --storage-options / AWS_ENDPOINT_URL for object stores)")
            doc = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            try:
                fm.write_bytes(repo.path(MARKER), json.dumps(doc).encode(), overwrite=False)
            except FileExistsError:
                pass  # another backup created it first
            return repo
        try:
            doc = json.loads(marker)
        except ValueError:
            raise BadInputError(f"{MARKER} is not JSON", path=url, fix="this is not a destination this tool wrote") from None
        if not isinstance(doc, dict) or doc.get("format", 0) > FORMAT:
            raise BadInputError(f"backup format {doc.get('format') if isinstance(doc, dict) else '?'} is newer than "
                                "this tool reads", path=url, fix="use the spark-checkpoint-ops release that wrote it")
        return repo

    # -- paths ------------------------------------------------------------------------------------
    def path(self, rel: str) -> str:
        return join(self.root, rel)

    def object_path(self, sha: str) -> str:
        return self.path(f"objects/{sha[:2]}/{sha}")

    def object_url(self, sha: str) -> str:
        return self.fm.url(self.object_path(sha))

    # -- manifests --------------------------------------------------------------------------------
    def manifests(self, refresh: bool = False) -> list[Manifest]:
        """Every backup, oldest first (ids start with a UTC time)."""
        if self._manifests is None or refresh:
            names = sorted(f.name for f in self.fm.list(self.path("manifests")) if f.name.endswith(".json"))
            paths = [self.path(f"manifests/{n}") for n in names]
            data = self.fm.read_many(paths)
            out = []
            for n, p in zip(names, paths):
                blob = data.get(p)
                if blob is None:
                    continue
                try:
                    doc = json.loads(blob)
                    assert isinstance(doc, dict) and doc["format"] <= FORMAT and "roots" in doc
                except (ValueError, AssertionError, KeyError, TypeError):
                    raise BadInputError("backup manifest is not one this tool reads", path=self.fm.url(p),
                                        fix="it was edited or written by something else; remove it") from None
                out.append(Manifest(n[:-len(".json")], doc, self.fm.url(p)))
            self._manifests = out
        return self._manifests

    def manifest(self, backup_id: str) -> Manifest:
        for m in self.manifests():
            if m.id == backup_id:
                return m
        have = [m.id for m in self.manifests()]
        raise BadInputError(f"no backup {backup_id!r} here" + (f" (newest: {have[-1]})" if have else " (none yet)"),
                            path=self.url, fix="`checkpoint-ops backup list DEST` lists them")

    def publish(self, backup_id: str, doc: dict) -> Manifest:
        """Publish a manifest, after every object it names is durable (and it is, before this returns)."""
        path = self.path(f"manifests/{backup_id}.json")
        self.fm.sync()
        self.fm.write_bytes(path, json.dumps(doc, separators=(",", ":")).encode(), overwrite=False)
        self.fm.sync()
        m = Manifest(backup_id, doc, self.fm.url(path))
        if self._manifests is not None:
            self._manifests.append(m)
        return m

    def verified(self) -> dict[str, dict]:
        """backup id -> the record of its last verification."""
        return self._records("verified")

    def drills(self) -> dict[str, dict]:
        """backup id -> the record of its last restore drill (``drill.py``)."""
        return self._records("drills")

    def _records(self, folder: str) -> dict[str, dict]:
        names = [f.name for f in self.fm.list(self.path(folder)) if f.name.endswith(".json")]
        data = self.fm.read_many([self.path(f"{folder}/{n}") for n in names])
        out = {}
        for n in names:
            blob = data.get(self.path(f"{folder}/{n}"))
            try:
                out[n[:-len(".json")]] = json.loads(blob) if blob else {}
            except ValueError:
                out[n[:-len(".json")]] = {}
        return out

    def record_drill(self, backup_id: str, doc: dict) -> None:
        self.fm.write_bytes(self.path(f"drills/{backup_id}.json"), json.dumps(doc).encode(), overwrite=True)

    def record_verified(self, backup_id: str, doc: dict) -> None:
        self.fm.write_bytes(self.path(f"verified/{backup_id}.json"), json.dumps(doc).encode(), overwrite=True)

    # -- objects --------------------------------------------------------------------------------------
    def object_exists(self, sha: str) -> bool:
        return self.fm.exists(self.object_path(sha))

    def put_object(self, sha: str, data: bytes) -> bool:
        """Store content under its hash, unless it is there; True if this call created it."""
        try:
            self.fm.write_bytes(self.object_path(sha), data, overwrite=False)
            return True
        except FileExistsError:
            return False

    def put_object_stream(self, sha: str, fm: CheckpointFileManager, path: str) -> bool:
        """``put_object`` for a big file, streamed from ``fm``; checks the hash as it goes."""
        if self.object_exists(sha):
            return False
        h = hashlib.sha256()
        try:
            with fm.open_read(path) as src, self.fm.create_atomic(self.object_path(sha), overwrite=False) as out:
                while chunk := src.read(_STREAM):
                    h.update(chunk)
                    out.write(chunk)
                if h.hexdigest() != sha:
                    raise OSError(f"{fm.url(path)} changed while it was being backed up")
        except FileExistsError:
            return False
        return True

    def read_object(self, sha: str) -> bytes:
        return self.fm.read_bytes(self.object_path(sha))

    def object_hash(self, sha: str) -> str | None:
        """The sha256 of what is stored under ``sha`` (None if it is missing)."""
        h = hashlib.sha256()
        try:
            with self.fm.open_read(self.object_path(sha)) as f:
                while chunk := f.read(_STREAM):
                    h.update(chunk)
        except FileNotFoundError:
            return None
        return h.hexdigest()

    def all_objects(self) -> dict[str, int]:
        """sha256 -> size of every stored object (one listing)."""
        base = self.path("objects")
        out = {}
        for f in self.fm.walk(base):
            name = f.path.rsplit("/", 1)[-1]
            if len(name) == 64 and not name.startswith("."):
                out[name] = f.known_size if f.known_size is not None else f.size
        return out

    # -- intents and locks ------------------------------------------------------------------------------
    def write_intent(self, backup_id: str, hashes: set[str]) -> None:
        doc = {"id": backup_id, "expires": time.time() + INTENT_TTL_S, "hashes": sorted(hashes)}
        self.fm.write_bytes(self.path(f"intents/{backup_id}.json"), json.dumps(doc).encode(), overwrite=True)

    def drop_intent(self, backup_id: str) -> None:
        self.fm.delete(self.path(f"intents/{backup_id}.json"))

    def live_intents(self, now: float | None = None) -> dict[str, set[str]]:
        now = time.time() if now is None else now
        names = [f.name for f in self.fm.list(self.path("intents")) if f.name.endswith(".json")]
        data = self.fm.read_many([self.path(f"intents/{n}") for n in names])
        out = {}
        for n in names:
            try:
                doc = json.loads(data.get(self.path(f"intents/{n}")) or b"{}")
            except ValueError:
                continue
            if doc.get("expires", 0) > now:
                out[n[:-len(".json")]] = set(doc.get("hashes", []))
        return out

    def prune_locks(self, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        names = [f.name for f in self.fm.list(self.path("locks")) if f.name.startswith("prune-")]
        data = self.fm.read_many([self.path(f"locks/{n}") for n in names])
        live = []
        for n in names:
            try:
                doc = json.loads(data.get(self.path(f"locks/{n}")) or b"{}")
            except ValueError:
                doc = {"expires": float("inf")}
            if doc.get("expires", 0) > now:
                live.append(n)
        return live

    def take_prune_lock(self) -> str:
        name = f"prune-{utc_stamp()}-{uuid.uuid4().hex[:8]}.json"
        doc = {"expires": time.time() + LOCK_TTL_S}
        self.fm.write_bytes(self.path(f"locks/{name}"), json.dumps(doc).encode(), overwrite=False)
        return name

    def release_prune_lock(self, name: str) -> None:
        self.fm.delete(self.path(f"locks/{name}"))
