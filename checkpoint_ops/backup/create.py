"""Taking a backup: a consistent cut at the last committed batch N, while the query may run.

Spark writes a batch's files in this order: source log entry, ``offsets/N``, state files and sink data
files, the sink log entry, ``commits/N`` (reference §7). So the cut is fixed by the commit log: the
backup holds ``metadata``, offsets and commits up to N, each file-source log up to the log offset
``offsets/N`` records, state up to version N+1 (all providers, V2 lineage and checksum files, the SSTs
zips name, operator metadata and schemas up to N), each sink's ``_spark_metadata`` up to N with the data
files it lists, and the batch ledger. Nothing above N is taken: a running batch's files are left out, so
a restore resumes at N+1. Files Spark's maintenance deletes during the copy are skipped if no restart
from N needs them; if one that does vanishes, the backup starts over at the new last commit.

Incremental: a file whose path, size and modification time (for Spark's uniquely named files, path and
size) match the previous backup of the same checkpoint is not read again; its hash is taken from that
manifest. New content is hashed, then stored once per destination (put-if-absent).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import re
import sys
import threading
import time

from ..errors import BadInputError, RefusedError, StoreUnavailableError
from ..ledger import Ledger
from ..model.checkpoint import Checkpoint, open_sink
from ..model.logfile import batch_id_from_name
from ..model.sink import SINK_LOG_DIR, SinkOutput
from ..model.state import SCHEMA_V3_FILE, STATE_FILE
from ..restart import RestartSets, state_bytes_problem
from .repository import Manifest, Repository, new_backup_id

WORKERS = 16  # parallel reads and uploads to an object store (each waits on the network)
LOCAL_WORKERS = 2  # to local disk the work is system calls under the GIL: more threads only contend
_BIG = 64 * 2**20  # files above this are streamed (hashed, then uploaded) instead of held in memory
_UNIQUE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")  # Spark's once-only names
_LOCK_WAIT_S = 600
_ATTEMPTS = 3


def _hidden(rel: str) -> bool:
    """Hidden names are Spark's temp files and Hadoop checksum sidecars (rewritten on restore), our lease."""
    return any(part.startswith(".") for part in rel.split("/"))


def checkpoint_files(ckpt: Checkpoint, batch: int) -> dict[str, object]:
    """rel -> FileInfo of what a backup at ``batch`` takes from the checkpoint (module docstring)."""
    if ckpt.kind == "dstream":
        return {rel: f for rel, f in ckpt.listing.files.items() if not _hidden(rel) and rel != "temp"}
    offsets = ckpt.offsets(batch)
    log_offset = {}
    for sid, src in ckpt.sources.items():
        so = offsets.source(sid) if offsets else None
        log_offset[sid] = (so.log_offset if so else None) if src.log is not None else "all"
    out = {}
    for rel, f in ckpt.listing.files.items():
        if _hidden(rel):
            continue
        parts = rel.split("/")
        top, name = parts[0], parts[-1]
        if top in ("offsets", "commits"):
            b = batch_id_from_name(name) if len(parts) == 2 else None
            if b is not None and b <= batch:
                out[rel] = f
        elif top == "sources" and len(parts) == 3:
            k = log_offset.get(parts[1], "all")
            b = batch_id_from_name(name, compactible=True)
            if k == "all" or (k is not None and b is not None and b <= k):
                out[rel] = f
        elif top == "state":
            if _state_file_wanted(parts, batch):
                out[rel] = f
        else:
            out[rel] = f  # metadata, and anything else Spark keeps at the top
    return out


def _state_file_wanted(parts: list[str], batch: int) -> bool:
    name = parts[-1]
    if "_metadata" in parts and len(parts) >= 4 and parts[-2] == "v2":  # state/<op>/_metadata/v2/<batch>
        return name.isdigit() and int(name) <= batch
    if "_stateSchema" in parts:
        m = SCHEMA_V3_FILE.match(name)
        return bool(m) and int(m.group(1)) <= batch
    main = name[:-4] if name.endswith(".crc") else name  # Spark's checksum file goes with its state file
    m = STATE_FILE.match(main)
    if m:
        return int(m.group(1)) <= batch + 1  # versions above N+1 belong to a batch still running
    return True  # SSTs, logs, operator metadata, schema: immutable or written once


def sink_files(sink: SinkOutput, batch: int) -> dict[str, object]:
    """The sink's log up to ``batch`` and the data files it lists as of then."""
    log = sink.log
    out = {}
    for b, f in log.files.items():
        if b <= batch:
            out[f.rel] = f.info
    upto = min(batch, log.latest) if log.latest is not None else None
    if upto is not None:
        for e in log.entries_after(upto):
            rel = sink.rel_of(e)
            if rel is not None and rel in sink.listing:
                out[rel] = sink.listing.get(rel)
    return out


class _Progress:
    def __init__(self, total: int, show: bool):
        self._bar = None
        if show and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="file", file=sys.stderr, leave=False, desc="backup")
        self._lock = threading.Lock()

    def step(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _Vanished(Exception):
    def __init__(self, rel: str):
        self.rel = rel


def create_backup(checkpoint_url: str, dest_url: str, sink_urls: list[str] = (), storage_options: dict | None = None,
                  progress: bool = False, source_compact_interval: int = 10, sink_compact_interval: int = 10) -> dict:
    """Back up a checkpoint (and its file sinks and ledger) to ``dest_url``; returns the summary."""
    repo = Repository.open(dest_url, storage_options, create=True)
    backup_id = new_backup_id()
    try:
        repo.write_intent(backup_id, set())  # before anything is checked: a garbage collection now waits
        try:
            _wait_for_prune(repo)
            for attempt in range(_ATTEMPTS):
                try:
                    summary = _take(repo, backup_id, checkpoint_url, list(sink_urls), storage_options, progress,
                                    source_compact_interval, sink_compact_interval)
                    break
                except _Vanished as v:
                    if attempt == _ATTEMPTS - 1:
                        raise RefusedError(f"{v.rel} vanished during the backup {_ATTEMPTS} times: the query deletes "
                                           "files a restart needs faster than they can be copied", path=checkpoint_url,
                                           fix="stop the query for the backup, or back up more often") from None
        except BaseException:
            # the store may be down: the error that stopped the backup matters, not this cleanup (an
            # intent left behind expires by itself)
            with contextlib.suppress(StoreUnavailableError):
                repo.drop_intent(backup_id)
            raise
        repo.drop_intent(backup_id)
        return summary
    except StoreUnavailableError as e:
        raise e.finish_with(f"backup {backup_id} was not completed: a backup exists only once its manifest is stored "
                            "(`backup list` shows it), so nothing half-made is visible; once the store answers, run "
                            "the same command again (what was already uploaded is reused)") from e.__cause__


def _wait_for_prune(repo: Repository) -> None:
    deadline = time.time() + _LOCK_WAIT_S
    while repo.prune_locks():
        if time.time() > deadline:
            raise RefusedError("a garbage collection of this destination has held its lock for too long", path=repo.url,
                               fix="check `locks/` there; a lock of a prune that died expires by itself")
        time.sleep(1)


def _take(repo: Repository, backup_id: str, checkpoint_url: str, sink_urls: list[str], storage_options, progress,
          source_interval: int, sink_interval: int) -> dict:
    ckpt = Checkpoint.open(checkpoint_url, storage_options, source_compact_interval=source_interval)
    roots: dict[str, tuple] = {}  # root id -> (url, fm, root path, files: rel -> FileInfo)
    needed: dict[str, set[str]] = {}  # files a restart at the cut needs: vanishing ones restart the backup
    batch = query_id = None
    if ckpt.kind == "dstream":
        kind = "dstream"
        roots["checkpoint"] = (ckpt.url, ckpt.fm, ckpt.root, checkpoint_files(ckpt, 0))
        if sink_urls:
            raise BadInputError("a DStream checkpoint has no file-sink log to back up: drop --sink", path=checkpoint_url)
    else:
        kind = "structured"
        batch = ckpt.latest_commit
        if batch is None:
            raise RefusedError("no batch has been committed yet: there is nothing to back up", path=checkpoint_url)
        if ckpt.fence is not None:
            raise RefusedError(f"a checkpoint-ops {ckpt.fence.operation} is in progress or was interrupted here",
                               path=checkpoint_url, fix="finish or undo it first")
        query_id = ckpt.query_id
        sinks = [open_sink(u, storage_options, sink_interval) for u in sink_urls]
        rs = RestartSets(ckpt, sinks).of(batch)
        if rs.damage:
            d = rs.damage[0]
            raise BadInputError(f"Spark's restart after batch {batch} (the last commit, where the backup cuts) reads "
                                f"{d.rel}, which {d.summary.split(' ', 1)[1]}: {d.problem}", path=d.url,
                                fix=f"{d.fix}; `checkpoint-ops fsck` lists everything wrong")
        roots["checkpoint"] = (ckpt.url, ckpt.fm, ckpt.root, checkpoint_files(ckpt, batch))
        needed["checkpoint"] = {f.rel for f in rs.files if f.root == "checkpoint"}
        for i, s in enumerate(sinks):
            roots[f"sink{i}"] = (s.url, s.fm, s.root, sink_files(s, batch))
            needed[f"sink{i}"] = {f.rel for f in rs.files if f.root == f"sink{i}"} | {
                rel for rel in roots[f"sink{i}"][3] if rel.startswith(SINK_LOG_DIR + "/")}
        try:
            ledger = Ledger.for_checkpoint(ckpt)
        except BadInputError:
            ledger = None
        if ledger is not None:
            files = {f.path[len(ledger.path) + 1:]: f for f in ledger.fm.walk(ledger.path)}
            files = {r: f for r, f in files.items() if "/" not in r and not r.startswith(".")}
            if files:
                roots["ledger"] = (ledger.fm.url(ledger.path), ledger.fm, ledger.path, files)
    parent = _parent(repo, ckpt.url)
    known = {}  # rid -> rel -> (sha, size, mtime) of the previous backup
    if parent is not None:
        for rid, r in parent.roots.items():
            known[rid] = {rel: (sha, size, rest[0] if rest else None) for rel, sha, size, *rest in r["files"]}
    have = parent.hashes() if parent is not None else set()
    total = sum(len(r[3]) for r in roots.values())
    bar = _Progress(total, progress)
    lock = threading.Lock()
    stats = {"new_objects": 0, "new_bytes": 0, "read_files": 0, "read_bytes": 0, "skipped_vanished": []}
    codec = ckpt.state.codec if kind == "structured" else "lz4"
    state_files = ({f.rel: f for s in ckpt.state.stores() for f in s.files}
                   if kind == "structured" else {})

    def one(rid: str, fm, root_path: str, rel: str, info) -> tuple | None:
        size, mtime = info.size, info.mtime
        prev = known.get(rid, {}).get(rel)
        if prev is not None and prev[1] == size and (prev[2] == mtime or _UNIQUE.search(rel.rsplit("/", 1)[-1])):
            bar.step()
            return rel, prev[0], size, mtime
        path = f"{root_path}/{rel}"
        try:
            if size > _BIG:
                sha = _hash_stream(fm, path)
                created = sha not in have and repo.put_object_stream(sha, fm, path)
                nbytes = size
            else:
                data = fm.read_bytes(path)
                sha = hashlib.sha256(data).hexdigest()
                nbytes = len(data)
                if rid == "checkpoint" and rel in needed.get(rid, ()) and rel in state_files:
                    problem = state_bytes_problem(state_files[rel], data, codec)
                    if problem:
                        raise BadInputError(f"{problem} (Spark's restart after batch {batch} reads it)",
                                            path=fm.url(path), fix="restore it from an older backup, or roll back "
                                            "to a batch before the damage, then back up")
                created = sha not in have and repo.put_object(sha, data)
        except FileNotFoundError:
            if rel in needed.get(rid, ()):
                raise _Vanished(rel) from None
            with lock:
                stats["skipped_vanished"].append(f"{rid}:{rel}")  # maintenance deleted it: nothing needs it
            bar.step()
            return None
        with lock:
            stats["read_files"] += 1
            stats["read_bytes"] += nbytes
            if created:
                stats["new_objects"] += 1
                stats["new_bytes"] += nbytes
        bar.step()
        return rel, sha, nbytes, mtime

    doc_roots = {}
    try:
        workers = LOCAL_WORKERS if repo.fm.location.is_local else WORKERS
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for rid, (url, fm, root_path, files) in roots.items():
                futures = [pool.submit(one, rid, fm, root_path, rel, info) for rel, info in sorted(files.items())]
                entries = [f.result() for f in futures]
                doc_roots[rid] = {"url": url, "files": [list(e) for e in entries if e is not None]}
    finally:
        bar.close()
    nfiles = sum(len(r["files"]) for r in doc_roots.values())
    nbytes = sum(f[2] for r in doc_roots.values() for f in r["files"])
    doc = {
        "format": 1,
        "id": backup_id,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kind": kind,
        "checkpoint": {"url": ckpt.url, "query_id": query_id, "batch": batch},
        "roots": doc_roots,
        "compact_intervals": {"source": source_interval, "sink": sink_interval},
        "parent": parent.id if parent is not None else None,
        "stats": {"files": nfiles, "bytes": nbytes, "new_objects": stats["new_objects"],
                  "new_bytes": stats["new_bytes"], "read_files": stats["read_files"], "read_bytes": stats["read_bytes"]},
    }
    m = repo.publish(backup_id, doc)
    return {"backup_id": backup_id, "destination": repo.url, "manifest": m.url, "kind": kind, "checkpoint": ckpt.url,
            "query_id": query_id, "batch": batch, "parent": doc["parent"], **doc["stats"],
            "skipped_vanished": stats["skipped_vanished"], "requests": repo.fm.counter.snapshot(),
            "retries": {"destination": repo.fm.counter.retries(),
                        **{rid: fm.counter.retries() for rid, (_, fm, _, _) in roots.items()}}}


def _parent(repo: Repository, checkpoint_url: str) -> Manifest | None:
    """The newest backup of the same checkpoint: the base the new one is incremental to."""
    same = [m for m in repo.manifests() if m.checkpoint_url == checkpoint_url]
    return same[-1] if same else None


def _hash_stream(fm, path: str) -> str:
    h = hashlib.sha256()
    with fm.open_read(path) as f:
        while chunk := f.read(8 * 2**20):
            h.update(chunk)
    return h.hexdigest()

