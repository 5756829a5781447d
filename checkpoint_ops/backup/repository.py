"""A backup destination: content-addressed objects, immutable manifests, and the locks that let garbage
collection run while another backup is being taken.

Layout under the destination URL (local directory or object-store prefix)::

    checkpoint-ops-backups.json     marks a destination (format); anything else there is refused
    objects/<aa>/<sha256>           file contents, stored once however many backups hold them
    manifests/<backup id>.json      one per backup, put-if-absent, published last: a backup exists
                                    exactly when its manifest does
    verified/<backup id>.json       the outcome of the last verification of that backup (good or bad)
    bad/<sha256>                    (empty) an object a verification found missing, damaged or unreadable,
                                    until it is stored again or found whole: every backup that needs its
                                    content stores it again, whichever checkpoint it backs up
    drills/<backup id>.json         the outcome of the last restore drill of that backup (``drill.py``)
    intents/<backup id>.json        a backup being taken (claims.py: its holder, kept alive by a heartbeat)
    locks/prune-<id>.json           a garbage collection in progress (backups wait for it while it lives)

Every write goes through the file manager. A manifest names each file by path relative to its root and
the hash of its content: ``[path, sha256, size, mtime]``, and for a file on local disk ``ino,
ctime_ns`` after them (``create.py`` compares them; readers take the first three columns), and when the
backup's listing of its source began (``listed_at``, seconds since the epoch). Fields are only ever
added, so older releases read newer manifests.

Objects are created under their hashes, never replaced while they hold what their name says; on local
disk they are created in place (``put_objects_direct``: no temp file, no rename), so a backup that dies
before its manifest can leave one part-written under its name. An object is therefore trusted only when
a published manifest names it (each is published after ``sync()``, once every object it names is whole
and durable); an existing object no manifest names is read back and checked before a backup relies on
it, and replaced atomically if it does not match (``replace_object``), as is one a verification found
bad (``verified/<id>.json``) or that is not there at its size. Restore, verify and drills read only
objects a manifest names; prune deletes the ones none names, part-written or not, while no backup is
being taken.

A manifest ends with the SHA-256 of the bytes before it (``,"digest":"<hex>"}``: ``seal_manifest``), so an
entry lost, changed or added after it was written, in a manifest that still parses, is found when it is read
(manifests written before the digest was added have none, and are read as before).

A manifest is checked whole when it is read (``manifest_problem``). A damaged one (not JSON, the wrong
shape, an unknown format, a path outside its root, a hash that is not one, content that does not match its
digest) is set aside with its reason
(``damaged_manifests``): every other backup stays usable, and asking for the damaged one by id is exit 2
naming its file.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import time
import uuid
from dataclasses import dataclass, field

from ..errors import BadInputError
from ..journal import utc_stamp
from ..storage import CheckpointFileManager, FileInfo, open_file_manager
from ..storage.paths import join
from .claims import INTENT, PRUNE_LOCK, Claim, HeldClaim, intent_claim, prune_lock_claim, read_claims, restore_claim

MARKER = "checkpoint-ops-backups.json"
FORMAT = 1
BAD_DIR = "bad"  # bad/<sha256>: objects a verification found bad, until stored again (module docstring)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_STREAM = 8 * 2**20
_ROOT_ID = re.compile(r"checkpoint|ledger|sink\d+")
_UNSAFE = ("\n/", "/\n", "\n\n", "//", "\\", "/./", "/../", "\n./", "\n../", "/.\n", "/..\n", "\n.\n", "\n..\n", ":")
_HEX = b"0123456789abcdef"
_MANIFEST_FIX = "it was edited, damaged or written by something else: remove it (after saving a copy if you want to " \
                "investigate), then `checkpoint-ops backup prune` can collect objects again"


def new_backup_id() -> str:
    return f"{utc_stamp()}-{uuid.uuid4().hex[:8]}"


def rel_problem(rel: object) -> str | None:
    """Why a manifest path is not one inside its root (relative, normalized, no ``..``); None if it is."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\n" in rel \
            or ":" in rel.split("/")[0]:
        return f"names {rel!r}, which is not a relative path"
    norm = posixpath.normpath(rel)
    if norm != rel or norm.startswith("../") or norm in ("..", "."):
        return f"names {rel!r}, which would leave its root"
    return None


def safe_rel(rel: str, where: str) -> str:
    """A manifest path must stay inside its root: relative, normalized, no ``..``."""
    problem = rel_problem(rel)
    if problem:
        raise BadInputError(f"manifest {problem}", path=where, fix=_MANIFEST_FIX)
    return rel


def _is_int(v: object, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _files_problem(rid: str, files: list) -> str | None:
    """The first thing wrong with a root's ``[rel, sha256, size, mtime]`` entries (column-wise: a
    manifest of a million files is checked in well under a second)."""
    if not all(type(e) is list and len(e) >= 3 for e in files):
        return f"has a file entry in root {rid!r} that is not [path, sha256, size, mtime]"
    rels, shas, sizes = [e[0] for e in files], [e[1] for e in files], [e[2] for e in files]
    if files and not (set(map(type, shas)) == {str} and set(map(len, shas)) == {64}
                      and not "".join(shas).encode("utf-8").translate(None, _HEX)):
        bad = next(h for h in shas
                   if not (isinstance(h, str) and len(h) == 64 and not h.encode("utf-8").translate(None, _HEX)))
        return f"names {bad!r} in root {rid!r}, which is not a sha256"
    if files and not all(_is_int(n) for n in sizes):
        return f"has a size in root {rid!r} that is not a byte count"
    if set(map(type, rels)) - {str}:
        return rel_problem(next(r for r in rels if not isinstance(r, str)))
    return next(iter(rel_problems(rels).values()), None)


def rel_problems(rels: list[str]) -> dict[str, str]:
    """rel -> ``rel_problem`` of every path a manifest cannot hold (column-wise: a million paths are
    checked in well under a second; each path is looked at alone only when the whole column trips)."""
    joined = "\n" + "\n".join(rels) + "\n"
    if joined.count("\n") == len(rels) + 1 and not any(u in joined for u in _UNSAFE):
        return {}
    return {rel: problem for rel in rels if (problem := rel_problem(rel))}


_DIGEST = re.compile(rb',"digest":"([0-9a-f]{64})"\}\s*$')


def seal_manifest(doc: dict) -> bytes:
    """The bytes of a manifest: ``doc`` (without a digest) as compact JSON, then its own SHA-256 as the last
    field, the hash of those bytes with ``}`` in place of the digest field."""
    body = json.dumps({k: v for k, v in doc.items() if k != "digest"}, separators=(",", ":")).encode()
    digest = hashlib.sha256(body).hexdigest()
    return body[:-1] + f',"digest":"{digest}"}}'.encode()


def digest_problem(blob: bytes, doc: dict) -> str | None:
    """Why a manifest does not match the digest it records (None: it does, or it records none: written by a
    release before the digest). Its bytes are hashed as they are; a manifest rewritten in another layout (pretty
    printed) is judged by its content, written again as ``seal_manifest`` writes it."""
    found = _DIGEST.search(blob)
    if found is not None:
        body, digest = blob[:found.start()] + b"}", found.group(1).decode()
    elif "digest" in doc:
        body = json.dumps({k: v for k, v in doc.items() if k != "digest"}, separators=(",", ":")).encode()
        digest = doc["digest"]
    else:
        return None
    if hashlib.sha256(body).hexdigest() != digest:
        return ("does not match the digest it records: it was changed after it was written (an entry lost, "
                "altered or added)")
    return None


def manifest_problem(backup_id: str, doc: object) -> str | None:
    """What makes a parsed manifest unusable, or None. Checked once, when it is read, so restore,
    verify, prune and the next incremental backup can trust every field they use."""
    if not isinstance(doc, dict):
        return "is not a JSON object"
    fmt = doc.get("format")
    if not _is_int(fmt, 1):
        return f"has no format version this tool knows ({fmt!r})"
    if fmt > FORMAT:
        return f"is format {fmt}, newer than this tool reads ({FORMAT}): use the release that wrote it"
    if doc.get("id", backup_id) != backup_id:
        return f"says it is backup {doc.get('id')!r}, but is stored as {backup_id!r}"
    try:
        time.strptime(doc.get("created"), TIME_FORMAT)
    except (TypeError, ValueError):
        return f"has no creation time ({doc.get('created')!r})"
    kind = doc.get("kind")
    if kind not in ("structured", "dstream"):
        return f"is of an unknown kind ({kind!r})"
    ck = doc.get("checkpoint")
    if not isinstance(ck, dict) or not isinstance(ck.get("url"), str):
        return "does not name the checkpoint it backs up"
    batch = ck.get("batch")
    if (kind == "structured" and not _is_int(batch)) or (batch is not None and not _is_int(batch)):
        return f"has no valid batch ({batch!r})"
    kept = ck.get("kept_planned", [])
    if not (isinstance(kept, list) and all(isinstance(k, str) for k in kept)):
        return f"has a kept planned batch that is not a list of paths ({kept!r})"
    roots = doc.get("roots")
    if not isinstance(roots, dict) or "checkpoint" not in roots:
        return "lists no checkpoint root"
    for rid, root in roots.items():
        if not _ROOT_ID.fullmatch(rid):
            return f"has a root named {rid!r}"
        if not (isinstance(root, dict) and isinstance(root.get("url"), str) and isinstance(root.get("files"), list)):
            return f"has a root {rid!r} without its url and files"
        problem = _files_problem(rid, root["files"])
        if problem:
            return problem
    for key in ("stats", "compact_intervals"):
        if not isinstance(doc.get(key, {}), dict):
            return f"has {key} that are not an object"
    if not all(_is_int(v, 1) for v in doc.get("compact_intervals", {}).values()):
        return "has a compact interval that is not a positive number"
    if not isinstance(doc.get("parent"), (str, type(None))):
        return f"names a parent that is not a backup id ({doc.get('parent')!r})"
    return None


@dataclass(frozen=True)
class DamagedManifest:
    """A manifest this tool cannot use, and why. Its backup cannot be restored or verified; garbage
    collection of objects waits until it is removed (the objects it may name are unknown)."""

    id: str
    url: str
    problem: str

    def error(self) -> BadInputError:
        return BadInputError(f"backup manifest {self.problem}", path=self.url, fix=_MANIFEST_FIX)

    def to_dict(self) -> dict:
        return {"id": self.id, "manifest": self.url, "problem": self.problem}


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
    def kept_planned(self) -> list[str]:
        """``offsets/N+1`` of a no-data batch the backup took beside its cut at batch N (``create.py``)."""
        return list(self.doc["checkpoint"].get("kept_planned", []))

    @property
    def roots(self) -> dict:
        return self.doc["roots"]

    def files(self, rid: str) -> list[tuple[str, str, int]]:
        """(rel, sha256, size) of one root (every path was checked to stay inside it when read)."""
        return [(rel, sha, size) for rel, sha, size, *_ in self.roots[rid]["files"]]

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
    exists: bool = True  # False: ``locate`` found nothing there yet (``create`` makes it a destination)
    _manifests: list[Manifest] | None = field(default=None, repr=False)
    _damaged: list[DamagedManifest] = field(default_factory=list, repr=False)
    _held: dict[str, HeldClaim] = field(default_factory=dict, repr=False)
    _bad_seen: set[str] | None = field(default=None, repr=False)  # ``bad_objects`` as last listed

    @classmethod
    def locate(cls, url: str, storage_options: dict | None = None) -> "Repository":
        """The destination at ``url``, read only: a destination (``exists``), or an empty location that
        may become one (``exists`` False). Anything else there is refused (exit 2). Writes nothing."""
        fm, root = open_file_manager(url, storage_options)
        if fm.hadoop_crc:  # nothing Hadoop reads a backup destination: no .crc sidecars, one sync per backup
            fm.hadoop_crc = False
            fm.defer_sync = True
        repo = cls(fm, root.rstrip("/"), url.rstrip("/"), storage_options)
        try:
            marker = fm.read_bytes(repo.path(MARKER))
        except FileNotFoundError:
            marker = None
        except NotADirectoryError:
            raise BadInputError("not a directory (a file is there): a backup destination is a directory or an "
                                "object-store prefix", path=url,
                                fix="point at the URL backups were created with, or use an empty location") from None
        if marker is None:
            # hidden names are temp files of an interrupted write (ours): they do not make it foreign
            names = [f for f in fm.list(root) if not f.name.startswith(".")]
            if names:
                raise BadInputError(f"not a backup destination (no {MARKER}) and not empty: it holds "
                                    f"{', '.join(sorted(f.name for f in names)[:3])}", path=url,
                                    fix="point at the URL backups were created with, or use an empty location")
            repo.exists = False
            return repo
        try:
            doc = json.loads(marker)
        except ValueError:
            raise BadInputError(f"{MARKER} is not JSON", path=url, fix="this is not a destination this tool wrote") from None
        if not isinstance(doc, dict) or doc.get("format", 0) > FORMAT:
            raise BadInputError(f"backup format {doc.get('format') if isinstance(doc, dict) else '?'} is newer than "
                                "this tool reads", path=url, fix="use the spark-checkpoint-ops release that wrote it")
        return repo

    @classmethod
    def open(cls, url: str, storage_options: dict | None = None, create: bool = False) -> "Repository":
        """The destination at ``url``; with ``create``, an empty location becomes one (its marker is
        written). Without, an empty location is exit 2."""
        repo = cls.locate(url, storage_options)
        if not repo.exists:
            if not create:
                raise BadInputError("no backups here (nothing at this location)", path=url,
                                    fix="check the URL (and --storage-options / AWS_ENDPOINT_URL for object stores)")
            repo.create()
        return repo

    def create(self) -> None:
        """Make this location a destination (write its marker), unless it is one."""
        if self.exists:
            return
        doc = {"format": FORMAT, "created": time.strftime(TIME_FORMAT, time.gmtime())}
        try:
            self.fm.write_bytes(self.path(MARKER), json.dumps(doc).encode(), overwrite=False)
        except FileExistsError:
            pass  # another backup created it first
        self.exists = True

    # -- paths ------------------------------------------------------------------------------------
    def path(self, rel: str) -> str:
        return join(self.root, rel)

    def object_path(self, sha: str) -> str:
        return self.path(f"objects/{sha[:2]}/{sha}")

    def object_url(self, sha: str) -> str:
        return self.fm.url(self.object_path(sha))

    # -- manifests --------------------------------------------------------------------------------
    def manifests(self, refresh: bool = False) -> list[Manifest]:
        """Every usable backup, oldest first (ids start with a UTC time). Damaged manifests are left
        out (``damaged_manifests``)."""
        if self._manifests is None or refresh:
            self._load_manifests()
        return self._manifests

    def damaged_manifests(self, refresh: bool = False) -> list[DamagedManifest]:
        """The manifests this tool cannot use, each with its reason, oldest first."""
        if self._manifests is None or refresh:
            self._load_manifests()
        return self._damaged

    def manifest_ids(self) -> set[str]:
        """The ids of the manifests there now, usable or not: one listing, nothing read."""
        return {name[:-len(".json")] for name in self._manifest_names()}

    def _manifest_names(self) -> list[str]:
        return sorted(f.name for f in self.fm.list(self.path("manifests"))
                      if f.name.endswith(".json") and not f.name.startswith("."))

    def _load_manifests(self) -> None:
        names = self._manifest_names()
        paths = [self.path(f"manifests/{n}") for n in names]
        read_errors: dict[str, OSError] = {}
        data = self.fm.read_many(paths, errors=read_errors)
        good, damaged = [], []
        for n, p in zip(names, paths):
            backup_id, url, blob = n[:-len(".json")], self.fm.url(p), data.get(p)
            if blob is None:
                if p in read_errors:
                    damaged.append(DamagedManifest(backup_id, url, f"cannot be read ({read_errors[p]})"))
                continue  # deleted since the listing
            try:
                doc = json.loads(blob)
            except ValueError as e:
                damaged.append(DamagedManifest(backup_id, url, f"is not JSON ({e})"))
                continue
            problem = manifest_problem(backup_id, doc) or (digest_problem(blob, doc) if isinstance(doc, dict)
                                                           else None)
            if problem:
                damaged.append(DamagedManifest(backup_id, url, problem))
            else:
                good.append(Manifest(backup_id, doc, url))
        self._manifests, self._damaged = good, damaged

    def manifest(self, backup_id: str) -> Manifest:
        """One usable backup; a damaged or unknown id is exit 2, naming the manifest (or the destination)."""
        for m in self.manifests():
            if m.id == backup_id:
                return m
        for d in self.damaged_manifests():
            if d.id == backup_id:
                raise d.error()
        have = [m.id for m in self.manifests()]
        raise BadInputError(f"no backup {backup_id!r} here" + (f" (newest: {have[-1]})" if have else " (none yet)"),
                            path=self.url, fix="`checkpoint-ops backup list DEST` lists them")

    def publish(self, backup_id: str, doc: dict) -> Manifest:
        """Publish a manifest, after every object it names is durable (and it is, before this returns)."""
        path = self.path(f"manifests/{backup_id}.json")
        self.fm.sync()
        self.fm.write_bytes(path, seal_manifest(doc), overwrite=False)
        self.fm.sync()
        m = Manifest(backup_id, doc, self.fm.url(path))
        if self._manifests is not None:
            self._manifests.append(m)
        return m

    def verified(self, since: float | None = None) -> dict[str, dict]:
        """backup id -> the record of its last verification ({} if that record is unreadable); with
        ``since`` (seconds since the epoch), only records stored at or after it (by the time the listing
        gives: only those are read)."""
        return self._records("verified", since)

    def drills(self) -> dict[str, dict]:
        """backup id -> the record of its last restore drill (``drill.py``)."""
        return self._records("drills")

    def _records(self, folder: str, since: float | None = None) -> dict[str, dict]:
        names = [f.name for f in self.fm.list(self.path(folder))
                 if f.name.endswith(".json") and not f.name.startswith(".")
                 and (since is None or f.mtime is None or f.mtime >= since)]
        data = self.fm.read_many([self.path(f"{folder}/{n}") for n in names], errors={})
        out = {}
        for n in names:
            blob = data.get(self.path(f"{folder}/{n}"))
            try:
                doc = json.loads(blob) if blob else {}
            except ValueError:
                doc = {}
            out[n[:-len(".json")]] = doc if isinstance(doc, dict) else {}
        return out

    def record_drill(self, backup_id: str, doc: dict) -> None:
        self.fm.write_bytes(self.path(f"drills/{backup_id}.json"), json.dumps(doc).encode(), overwrite=True)

    def record_verified(self, backup_id: str, doc: dict) -> None:
        self.fm.write_bytes(self.path(f"verified/{backup_id}.json"), json.dumps(doc).encode(), overwrite=True)

    # -- objects --------------------------------------------------------------------------------------
    def object_exists(self, sha: str) -> bool:
        return self.fm.exists(self.object_path(sha))

    def object_size(self, sha: str) -> int | None:
        """The size of the object stored under ``sha`` (None if there is none): one stat, or one HEAD."""
        info = self.fm.info(self.object_path(sha))
        return None if info is None or info.is_dir else info.size

    def put_object(self, sha: str, data: bytes) -> bool:
        """Store content under its hash, unless it is there; True if this call created it."""
        try:
            self.fm.write_bytes(self.object_path(sha), data, overwrite=False)
            return True
        except FileExistsError:
            return False

    def put_objects_direct(self, items: list[tuple[str, bytes]]) -> list[bool]:
        """Store each (sha256, content) under its hash, created in place where the file manager can
        (``write_many_direct``: on local disk no temp file and no rename); per item, True if this call
        created it. An object is never replaced. Not atomic: until ``sync()`` and a manifest seal it, an
        object may be part-written, and one that was already there (False) may be the part-written
        leftover of a backup that died (``objects_may_be_partial``): check it (``object_hash``) before
        relying on it. Only a writer that publishes a manifest after ``sync()`` may use this."""
        return self.fm.write_many_direct([(self.object_path(sha), data) for sha, data in items])

    @property
    def objects_may_be_partial(self) -> bool:
        """Whether an object no manifest names may be part-written here (``names_may_be_partial`` of the
        file manager: local disk). Elsewhere every stored object is whole."""
        return self.fm.names_may_be_partial

    def replace_object(self, sha: str, data: bytes) -> None:
        """Store ``data`` (whose hash is ``sha``) in place of whatever is there, atomically: a reader sees
        the old file or the new one, whole (a temp file renamed over it)."""
        self.fm.write_bytes(self.object_path(sha), data, overwrite=True)

    # -- objects found bad ----------------------------------------------------------------------------
    def mark_bad(self, shas) -> None:
        """Remember objects a verification found missing, damaged or unreadable (``BAD_DIR``)."""
        for sha in shas:
            self.fm.write_bytes(self.path(f"{BAD_DIR}/{sha}"), b"", overwrite=True)

    def bad_objects(self) -> set[str]:
        """The objects marked bad (one listing)."""
        self._bad_seen = {f.name for f in self.fm.list(self.path(BAD_DIR)) if not f.is_dir and len(f.name) == 64}
        return set(self._bad_seen)

    def clear_bad(self, shas) -> None:
        """Objects stored again (cleared once the manifest naming them is published: then they are durable),
        or found whole: no longer bad."""
        paths = [self.path(f"{BAD_DIR}/{sha}") for sha in shas]
        if paths and (self._bad_seen is None or self._bad_seen & set(shas)):
            self.fm.delete_many(paths)

    def put_object_stream(self, sha: str, fm: CheckpointFileManager, path: str, replace: bool = False) -> bool:
        """``put_object`` for a big file of ``fm``, copied without holding it in memory (in the kernel
        between local disks: ``CheckpointFileManager.copy_in``), published whole; stored only if its
        content still has hash ``sha`` (else OSError: it changed while it was being backed up). With
        ``replace``, it atomically replaces whatever is stored under ``sha`` (``replace_object`` for a big
        file: True)."""
        if replace:
            return self.fm.copy_in(fm, path, self.object_path(sha), sha256=sha, overwrite=True)
        if self.object_exists(sha):
            return False
        return self.fm.copy_in(fm, path, self.object_path(sha), sha256=sha)

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

    def walk(self) -> list[FileInfo]:
        """Every file at the destination (one listing: one paginated LIST on an object store)."""
        return self.fm.walk(self.root)

    def all_objects(self, files: list[FileInfo] | None = None) -> dict[str, int]:
        """sha256 -> size of every stored object (one listing of ``objects/``, or taken from ``files``,
        a listing of the whole destination)."""
        base = self.path("objects")
        if files is None:
            files = self.fm.walk(base)
        out = {}
        for f in files:
            if not f.path.startswith(base + "/"):
                continue
            name = f.path.rsplit("/", 1)[-1]
            if len(name) == 64 and not name.startswith("."):
                out[name] = f.known_size if f.known_size is not None else f.size
        return out

    # -- intents and prune locks (claims.py) ------------------------------------------------------------
    def intents(self, now: float | None = None) -> list[Claim]:
        """Every backup intent here, each judged live or stale at ``now``."""
        return read_claims(self.fm, self.root, INTENT, now)

    def locks(self, now: float | None = None) -> list[Claim]:
        """Every prune lock here, each judged live or stale at ``now``."""
        return read_claims(self.fm, self.root, PRUNE_LOCK, now)

    def hold_intent(self, backup_id: str, checkpoint_url: str, hashes: set[str] = frozenset()) -> HeldClaim:
        """Write backup ``backup_id``'s intent and keep it alive until ``release()``."""
        return intent_claim(self.fm, self.root, backup_id, checkpoint_url, hashes).acquire()

    def hold_restore_claim(self, backup_id: str, target_url: str) -> HeldClaim:
        """Write the intent of a restore of ``backup_id`` and keep it alive until ``release()``: no prune
        collects objects meanwhile (``claims.restore_claim``)."""
        return restore_claim(self.fm, self.root, backup_id, target_url).acquire()

    def hold_prune_lock(self) -> HeldClaim:
        """Take a prune lock and keep it alive until ``release()``."""
        return prune_lock_claim(self.fm, self.root).acquire()

    def live_intents(self, now: float | None = None) -> dict[str, set[str]]:
        """backup id -> the hashes it said it will reference, for every live intent."""
        return {c.backup_id: set(c.hashes) for c in self.intents(now) if c.live}

    def prune_locks(self, now: float | None = None) -> list[str]:
        """Names of the live prune locks."""
        return [c.name for c in self.locks(now) if c.live]

    def take_prune_lock(self) -> str:
        """``hold_prune_lock`` by name: released by ``release_prune_lock(name)``."""
        held = self.hold_prune_lock()
        name = held.rel.rsplit("/", 1)[-1]
        self._held[name] = held
        return name

    def release_prune_lock(self, name: str) -> None:
        held = self._held.pop(name, None)
        if held is not None:
            held.release()
        else:
            self.fm.delete(self.path(f"locks/{name}"))
