"""Taking a backup: a consistent cut at the last committed batch N, while the query may run.

Spark writes a batch's files in this order: source log entry, ``offsets/N``, state files and sink data
files, the sink log entry, ``commits/N`` (reference §7). So the cut is fixed by the commit log: the
backup holds ``metadata``, offsets and commits up to N, each file-source log up to the log offset
``offsets/N`` records, state up to version N+1 (all providers, V2 lineage and checksum files, the SSTs
zips name, operator metadata and schemas up to N), each sink's ``_spark_metadata`` up to N with the data
files it lists, and the batch ledger. Nothing above N is taken: a running batch's files are left out, so
a restore resumes at N+1. Except ``offsets/N+1`` of a **no-data batch** (the source offsets of batch N
again, only the watermark moved on: ``rollback.no_data_next``), left planned by a rollback to N or by a
query stopped between planning and committing it: Spark plans such a batch only within a run, never at a
restart whose last batch is committed, so a copy without it would never emit the windows it closes (for a
finished source, for good). The backup takes that one file (``kept_planned`` in the manifest and the
summary; its Hadoop ``.crc`` sidecar is rewritten on restore, as every sidecar) and nothing else of batch
N+1 (``commits/N+1``, state versions above N+1, sink log entries above N); a restore writes it, and Spark
runs the batch again at restart. Files Spark's maintenance deletes during the copy are skipped if no restart
from N needs them; if one that does vanishes, the backup starts over at the new last commit.

Incremental: a file whose path, size and modification time match the previous backup of the same
checkpoint (the parent), and on local disk its inode and ctime too (what ``cp -p``, ``touch -r`` or
``rsync -a`` cannot carry over; recorded after the four manifest columns), is not read again; its hash
is taken from that manifest. A file the parent recorded with a modification time within ``RACY_S`` of
its listing (or after it) is read again all the same: it may have changed since within one tick of a
coarse clock ("racily clean"). The parent's object is reused only if it is there at its size (on local
disk one stat each; on an object store the one listing of ``objects/``) and no verification stored
since the parent was created found it bad (``verified/<id>.json``); otherwise it is stored again
(created if missing, replaced atomically if there: ``repaired_objects``), so a backup taken after a
failed ``verify`` repairs what it names. Its bytes are not read (a verification does that).

New content is hashed, then stored once per destination, never replacing an object that holds it:
created in place (``Repository.put_objects_direct``; on local disk no temp file and no rename) and made
durable by the one sync before the manifest. An object that was already there is trusted only if a
published manifest names it; any other may be the part-written leftover of a backup that died before
its manifest, so it is read back and hashed, and replaced atomically if it does not hold its content
(``repaired_objects``).

Names: a manifest holds relative POSIX paths (``repository.rel_problem``). A stray file whose name it
cannot hold (a backslash, a newline, a ':' in its first part) is left out with a warning
(``skipped_names``) when it lies outside Spark's own top-level names; inside them (or in a sink, the
ledger, a DStream checkpoint) it is exit 2, named, before the destination is touched. A backup never
publishes a manifest its own reader would set aside as damaged.

Order: the source is validated whole before the destination is created or written (a backup of an
unusable source leaves nothing behind); then the backup writes its intent (a heartbeat keeps it alive),
waits while a live prune holds its lock, chooses its parent and copies; before it publishes its manifest
it checks that its intent never lapsed (else a garbage collection may have run meanwhile).
"""

from __future__ import annotations

import calendar
import concurrent.futures
import hashlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, TypeVar

from ..errors import BadInputError, CheckpointOpsError, RefusedError, StoreUnavailableError, store_kept_failing
from ..executor import per_file_manager
from ..fence import is_fence, parse_fence, recovery_advice
from ..ledger import PAIRING_DIR, ledger_or_none
from ..model.checkpoint import Checkpoint, open_sink
from ..model.listing import Listing
from ..model.logfile import batch_id_from_name
from ..model.sink import SINK_LOG_DIR, SinkOutput
from ..model.state import SCHEMA_V3_FILE, STATE_FILE
from ..operation import InterruptedAfterPublishing
from ..pairing import (CHECKPOINT_ELSEWHERE, NOT_LINED_UP, SINK_ELSEWHERE, PairingRefused, check_pairing,
                       record_pairing, refuse_repeated)
from ..recorded_sinks import backup_without_sink, left_out
from ..restart import RestartSets, state_bytes_problem
from ..rollback import no_data_next, no_data_note
from ..storage.paths import how_places_overlap, spark_url_to_location
from .claims import HeldClaim
from .repository import TIME_FORMAT, Manifest, Repository, new_backup_id, rel_problems
from .verify import bad_hashes

WORKERS = 16  # parallel reads and uploads to an object store (each waits on the network), one file per task
# To local disk the work is system calls (which release the GIL) and hashing: a few threads keep the disk
# and both cores busy; each task is a run of files whose new contents are stored in one ``put_objects_direct``
LOCAL_WORKERS = 4
LOCAL_BATCH = 256  # files per task to local disk (a future per file cost more than its copy)
BATCH_BYTES = 16 * 2**20  # new content one task holds in memory before it stores it
_BIG = 64 * 2**20  # files above this are streamed (hashed, then uploaded) instead of held in memory
# A file modified this close to (or after) the listing of the backup that took it may have changed again
# since without its modification time changing (a coarse clock tick: 1 s on S3, a few ms on local disk;
# or clocks that disagree a little): the next backup reads it again ("racily clean", as git says)
RACY_S = 2.0
# How much earlier than a backup's creation a verification may be stored and still say something about the
# objects that backup reused (the store's clock against the one of the machine that took the backup)
_RECORD_SKEW_S = 60.0
# Spark's own top-level names in a checkpoint: a name a manifest cannot hold anywhere else is a stray file
SPARK_TOP = frozenset({"metadata", "offsets", "commits", "sources", "state"})
_LOCK_WAIT_S = 600
_ATTEMPTS = 3
T = TypeVar("T")
# What a backup reads (and checks) before the destination is touched, at most this many bytes; the copy
# stores it from memory instead of reading it again
PREFETCH_BYTES = 64 * 2**20


def _hidden(rel: str) -> bool:
    """Hidden names are Spark's temp files and Hadoop checksum sidecars (rewritten on restore), our lease."""
    return any(part.startswith(".") for part in rel.split("/"))


def checkpoint_files(ckpt: Checkpoint, batch: int, kept_planned: bool = False) -> dict[str, object]:
    """rel -> FileInfo of what a backup at ``batch`` takes from the checkpoint (module docstring);
    ``kept_planned``: ``offsets/batch+1`` too (a no-data batch)."""
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
            if b is not None and (b <= batch or (kept_planned and top == "offsets" and b == batch + 1)):
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
        return name.isdecimal() and int(name) <= batch
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


@dataclass
class _Cut:
    """What a backup at the last commit takes, read from the source and validated there: nothing at
    the destination is looked at to build it."""

    kind: str  # structured | dstream
    url: str  # the checkpoint's URL
    batch: int | None
    query_id: str | None
    roots: dict[str, tuple]  # root id -> (url, fm, root path, files: rel -> FileInfo)
    needed: dict[str, set[str]]  # files a restart at the cut needs: vanishing ones restart the backup
    codec: str
    state_files: dict  # rel -> StateFile of every state file the model knows
    intervals: tuple[int, int]  # source and sink compact intervals
    listed_at: float  # when the source's listing began (seconds since the epoch): see ``RACY_S``
    skipped_names: list[dict] = field(default_factory=list)  # stray files whose names a manifest cannot hold
    kept_planned: list[str] = field(default_factory=list)  # ``offsets/N+1`` of a no-data batch, taken beside the cut
    kept: str | None = None  # what that means (``rollback.no_data_note``)
    prefetched: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (root id, rel) -> bytes read, checked
    warnings: list[str] = field(default_factory=list)  # for the user: what the backup leaves out and what that does


def create_backup(checkpoint_url: str, dest_url: str, sink_urls: list[str] = (), storage_options: dict | None = None,
                  progress: bool = False, source_compact_interval: int = 10, sink_compact_interval: int = 10,
                  without_recorded_sinks: bool = False, warn: Callable[[str], None] | None = None) -> dict:
    """Back up a checkpoint (and its file sinks and ledger) to ``dest_url``; returns the summary.

    The source is validated before anything at the destination is created or written: a missing, not
    a checkpoint, unreadable or damaged source (its restart set at the cut; every file the copy reads,
    up to ``PREFETCH_BYTES``, read, and the state files among them checked) is exit 2 (1 if there is
    nothing to back up yet) and leaves no marker, object or intent. Then the intent is written (and kept
    alive by a heartbeat) before any object is looked at.

    A file sink the checkpoint's batch ledger records as its query's output (``recorded_sinks``) and not in
    ``sink_urls`` is refused (exit 1): restored without it, the copy's query writes into an empty output whose
    log lacks every earlier batch, and Spark fails there (or the earlier rows are simply not in it), unless
    ``without_recorded_sinks`` (an output abandoned on purpose)."""
    sink_urls = list(sink_urls)
    refuse_repeated(sink_urls)
    refuse_destination_overlapping(dest_url, checkpoint_url, sink_urls)
    cut = _prepare(checkpoint_url, sink_urls, storage_options, source_compact_interval, sink_compact_interval,
                   without_recorded_sinks)
    repo = Repository.locate(dest_url, storage_options)  # a foreign location is refused here, unwritten
    for note in cut.warnings if warn is not None else ():
        warn(note)
    _prefetch(cut, _parent(repo, cut.url) if repo.exists else None)
    repo.create()
    backup_id = new_backup_id()
    try:
        intent = repo.hold_intent(backup_id, cut.url)  # before any object is looked at: a garbage collection now waits
        published = None
        try:
            wait_for_prune(repo, warn)
            cuts = [cut]

            def copy(attempt: int) -> dict:
                if attempt > 0:  # a file the cut needs vanished: fix a new cut
                    cuts.append(_prepare(checkpoint_url, sink_urls, storage_options, source_compact_interval,
                                         sink_compact_interval, without_recorded_sinks))
                return _copy(repo, backup_id, cuts[-1], intent, progress)

            try:
                published = _while_vanishing(copy, checkpoint_url)
            except KeyboardInterrupt:
                if _manifest_stored(repo, backup_id):  # interrupted as or after it was published: it is complete
                    raise InterruptedAfterPublishing(backup_id, dest_url) from None
                raise
        finally:
            # the store may be down, or refuse deletes: the error that stopped the backup (or the backup it
            # published) matters, not this cleanup (an intent left behind goes stale without its heartbeat and is
            # cleared by the next prune)
            try:
                intent.release()
            except KeyboardInterrupt:  # held while the intent was released (claims.py): after the manifest, or not
                if published is None:
                    raise
                if warn is not None:
                    warn(f"interrupted after backup {backup_id} was published: it is complete (`checkpoint-ops backup "
                         f"list {dest_url}` shows it); nothing to run again")
            except Exception as e:  # noqa: BLE001 - only storage failures; a bug is raised
                if not store_kept_failing(e):
                    raise
        return published
    except StoreUnavailableError as e:
        raise e.finish_with(f"backup {backup_id} was not completed: a backup exists only once its manifest is stored "
                            "(`backup list` shows it), so nothing half-made is visible; once the store answers, run "
                            "the same command again (what was already uploaded is reused)") from e.__cause__


def _manifest_stored(repo: Repository, backup_id: str) -> bool:
    """Whether backup ``backup_id``'s manifest is stored (asked once an interrupt came: False when the store cannot
    say, so the interrupt reads as a backup not published, which is what a manifest not yet stored means)."""
    try:
        return repo.fm.exists(repo.path(f"manifests/{backup_id}.json"))
    except Exception:  # noqa: BLE001 - the interrupt is what is reported
        return False


def refuse_destination_overlapping(dest_url: str, checkpoint_url: str, sink_urls: list[str]) -> None:
    """BadInputError (exit 2), before anything is read or written, when the destination is the checkpoint or a
    file sink being backed up, lies inside one, or holds one: each backup would copy the destination's earlier
    backups into itself (growing every time), a restore would put them inside the restored checkpoint or output
    (where a raw reader of the output reads them as data), and the destination's own clean-up would list the
    source."""
    for what, url in [("the checkpoint", checkpoint_url)] + [("the file sink", url) for url in sink_urls]:
        how = how_places_overlap(dest_url, url)
        if how is None:
            continue
        raise BadInputError(f"the backup destination {dest_url} {how} {what} {url}: each backup would copy the "
                            "destination's earlier backups into itself, and a restore would put them inside what it "
                            "restores", path=dest_url,
                            fix="back up to a location outside the checkpoint and its file sinks, and not around "
                                "them; nothing was written")


def _require_named_as_logged(sink) -> None:
    """An output given under another name than the one its log's entries use (a symbolic link to it, or the query
    wrote through one): the backup would record the given name as where the entries' files live, and a restore (to
    its place, or relocated) would judge every entry outside it. Refused, naming the name the log uses."""
    if not sink.fm.location.is_local or sink.log.latest is None:
        return
    lines = sink.log.stream_lines(sink.log.latest)  # one entry: a compact file can hold millions
    try:
        line = next(lines, None)
        path = json.loads(line).get("path") if line is not None else None
    except (BadInputError, OSError, ValueError, AttributeError):
        return  # a damaged log is judged by the restart set's check, with its own words
    finally:
        lines.close()
    if not isinstance(path, str):
        return
    rel, where = sink.rel_of_path(path), spark_url_to_location(path)
    if rel is None or not where.is_local or where.path == f"{sink.root}/{rel}":
        return
    logged = where.path
    named = logged[: -len(rel) - 1] if logged.endswith("/" + rel) else logged
    raise BadInputError(f"this output's sink log names its files under {named}, not under the name given here "
                        "(a symbolic link, one place under two names): a backup records where the files live by "
                        "the name given", path=sink.url, fix=f"give --sink {named} (the name the query writes to)")


def _require_recorded_sinks(ckpt: Checkpoint, sinks: list, ledger, storage_options, sink_interval: int) -> None:
    """Refuse a backup without an output the ledger records for this checkpoint's query that still has a sink
    log (or cannot be read to tell): restored, the copy would lack it (``create_backup``)."""
    missing = [m for m in left_out(ckpt, sinks, ledger, storage_options=storage_options,
                                   compact_interval=sink_interval) if m.gone is None]
    if not missing:
        return
    names = ", ".join(m.url for m in missing)
    first = missing[0]
    them = "them" if len(missing) > 1 else "it"
    given = " ".join(f"--sink {url}" for url in [*(s.url for s in sinks), *(m.url for m in missing)])
    effect = (f"it cannot be read to check it ({first.unreadable})" if first.unreadable is not None else
              f"its sink log has batches up to {first.latest_batch}")
    raise RefusedError(
        f"the batch ledger records that this checkpoint's query writes the file sink {names} (recorded by "
        f"{first.recorded.recorded_by}), and it is not part of this backup: {effect}; a restore of the checkpoint "
        f"alone gives the query an output without those batches (Spark fails on its log there, or their rows are "
        f"missing from it)", path=ckpt.url,
        fix=f"back the sink up with the checkpoint: `checkpoint-ops backup create {ckpt.url} DEST {given}`; if the "
            f"query no longer writes {them} (an output abandoned on purpose), add --without-recorded-sinks")


def _refuse_another_querys_output(ckpt: Checkpoint, sinks: list, ledger) -> None:
    """``PairingRefused`` for a ``--sink`` that is not this checkpoint's query's output, as ``record_pairing`` refuses
    it later (a review: the refusal of a recorded sink left out came first, and its fix repeated the wrong one)."""
    for verdict in check_pairing(ckpt, sinks, ledger) if sinks else ():
        if verdict.status in (SINK_ELSEWHERE, NOT_LINED_UP, CHECKPOINT_ELSEWHERE):
            raise PairingRefused(verdict)


def wait_for_prune(repo: Repository, warn: Callable[[str], None] | None = None, waiting: str = "this backup") -> None:
    """Wait while a live prune holds its lock at ``repo`` (at most ``_LOCK_WAIT_S``); ``warn`` is told once, when
    there is one to wait for (``waiting``: what waits), so a person does not take the wait for a hang."""
    deadline = time.time() + _LOCK_WAIT_S
    told = False
    while True:
        live = [lock for lock in repo.locks() if lock.live]
        if not live:
            return
        if not told and warn is not None:
            who = live[0].holder.describe() if live[0].holder is not None else "a prune of an older release"
            warn(f"{repo.url}: a garbage collection of this backup destination is running, by {who}: {waiting} "
                 f"waits for it to finish (at most {_LOCK_WAIT_S // 60} minutes)")
            told = True
        if time.time() > deadline:
            raise RefusedError("a garbage collection of this destination has held its lock for too long", path=repo.url,
                               fix="`checkpoint-ops backup prune DEST --dry-run` shows who holds it; a lock whose "
                               "process is gone, or whose heartbeat stopped, no longer counts")
        time.sleep(1)


def _prepare(checkpoint_url: str, sink_urls: list[str], storage_options, source_interval: int,
             sink_interval: int, without_recorded_sinks: bool = False) -> _Cut:
    """Open and validate the source, and fix the cut (module docstring). Raises before anything is
    written anywhere: exit 2 for a missing, unreadable or damaged source, 1 when there is nothing to
    back up yet or an operation of ours is in progress there. A file the restart set reads that was listed
    and is gone when read is no damage: the checkpoint changed meanwhile (our own rollback fencing it, the
    query's clean-up), so it is looked at again, as the copy does."""
    return _while_vanishing(lambda attempt: _prepare_once(checkpoint_url, sink_urls, storage_options, source_interval,
                                                          sink_interval, without_recorded_sinks), checkpoint_url)


def _while_vanishing(step: Callable[[int], T], checkpoint_url: str) -> T:
    """``step(attempt)``, again while a file it needs vanishes (``_Vanished``), up to ``_ATTEMPTS`` times."""
    for attempt in range(_ATTEMPTS - 1):
        try:
            return step(attempt)
        except _Vanished:
            pass
    try:
        return step(_ATTEMPTS - 1)
    except _Vanished as v:
        raise RefusedError(f"{v.rel} vanished while the backup read it, {_ATTEMPTS} times: the checkpoint keeps changing "
                           "(the query deleting files a restart needs, or an operation of ours)", path=checkpoint_url,
                           fix="let it finish (`checkpoint-ops history` lists operations of ours), or stop the query "
                           "for the backup, or back up more often; then run it again") from None


def _vanished(ckpt: Checkpoint, sinks: list, damage) -> str | None:
    """The rel of a damaged file that the listing holds and that is not there now (None if none)."""
    roots = {"checkpoint": ckpt, **{f"sink{i}": sink for i, sink in enumerate(sinks)}}
    for d in damage:
        root = roots.get(d.root)
        info = root.listing.get(d.rel) if root is not None else None
        if info is not None and not root.fm.exists(info.path):
            return d.rel
    return None


def _prepare_once(checkpoint_url: str, sink_urls: list[str], storage_options, source_interval: int,
                  sink_interval: int, without_recorded_sinks: bool = False) -> _Cut:
    listed_at = time.time()
    ckpt = Checkpoint.open(checkpoint_url, storage_options, source_compact_interval=source_interval)
    _require_readable(ckpt.listing)
    roots: dict[str, tuple] = {}
    needed: dict[str, set[str]] = {}
    batch = query_id = kept = None
    kept_planned: list[str] = []
    warnings: list[str] = []
    if ckpt.kind == "dstream":
        kind = "dstream"
        roots["checkpoint"] = (ckpt.url, ckpt.fm, ckpt.root, checkpoint_files(ckpt, 0))
        if sink_urls:
            raise BadInputError("a DStream checkpoint has no file-sink log to back up: drop --sink", path=checkpoint_url)
    else:
        kind = "structured"
        batch = ckpt.latest_commit
        if ckpt.fence is not None:  # first: a restore killed before its first batch leaves nothing committed
            raise RefusedError(f"a checkpoint-ops {ckpt.fence.operation} is in progress or was interrupted here",
                               path=checkpoint_url, fix=recovery_advice(ckpt.fence, ckpt.url) + "; back it up once it "
                               "is finished")
        if batch is None:
            problem, fix = ckpt.nothing_committed("back up")
            raise RefusedError(problem, path=checkpoint_url, fix=fix)
        query_id = ckpt.query_id
        sinks = [open_sink(u, storage_options, sink_interval) for u in sink_urls]
        ledger = ledger_or_none(ckpt)
        for s in sinks:
            _require_readable(s.listing)
            _require_named_as_logged(s)
        # a restore puts it back as it is, and the query fails there as it does here
        ckpt.refuse_misnamed(sinks, "nothing was backed up")
        if not without_recorded_sinks:
            try:
                _require_recorded_sinks(ckpt, sinks, ledger, storage_options, sink_interval)
            except RefusedError:
                _refuse_another_querys_output(ckpt, sinks, ledger)  # said first: its fix is not to add the other
                raise
        warnings = backup_without_sink(ckpt, sinks, ledger)
        rs = RestartSets(ckpt, sinks).of(batch)
        gone = _vanished(ckpt, sinks, rs.damage)
        if gone is not None:
            raise _Vanished(gone)
        if rs.damage:
            d = rs.damage[0]
            raise BadInputError(f"Spark's restart after batch {batch} (the last commit, where the backup cuts) reads "
                                f"{d.rel}, which {d.summary.split(' ', 1)[1]}: {d.problem}", path=d.url,
                                fix=f"{d.fix}; `checkpoint-ops fsck` lists everything wrong")
        no_data = no_data_next(ckpt, batch, ledger)  # Spark would never plan it again at a restart from the copy
        if no_data is not None:
            kept_planned, kept = [f"offsets/{batch + 1}"], no_data_note(batch, *no_data)
        roots["checkpoint"] = (ckpt.url, ckpt.fm, ckpt.root, checkpoint_files(ckpt, batch, bool(kept_planned)))
        needed["checkpoint"] = {f.rel for f in rs.files if f.root == "checkpoint"} | set(kept_planned)
        for i, s in enumerate(sinks):
            roots[f"sink{i}"] = (s.url, s.fm, s.root, sink_files(s, batch))
            needed[f"sink{i}"] = {f.rel for f in rs.files if f.root == f"sink{i}"} | {
                rel for rel in roots[f"sink{i}"][3] if rel.startswith(SINK_LOG_DIR + "/")}
        if sinks:  # only the query's own outputs, recorded on both sides (before the destination is touched),
            # so every restore of this backup can record its targets
            for v in record_pairing(ckpt, sinks, ledger, by="backup create"):
                if not v.ok:
                    raise PairingRefused(v)
        if ledger is not None:
            files = {f.path[len(ledger.path) + 1:]: f for f in ledger.fm.walk(ledger.path)}
            files = {r: f for r, f in files.items() if not r.rsplit("/", 1)[-1].startswith(".") and (
                "/" not in r or (r.startswith(PAIRING_DIR + "/") and r.count("/") == 1))}
            if files:
                roots["ledger"] = (ledger.fm.url(ledger.path), ledger.fm, ledger.path, files)
    skipped = _unholdable_names(kind, roots)
    codec = ckpt.state.codec if kind == "structured" else "lz4"
    state_files = {f.rel: f for s in ckpt.state.stores() for f in s.files} if kind == "structured" else {}
    return _Cut(kind, ckpt.url, batch, query_id, roots, needed, codec, state_files, (source_interval, sink_interval),
                listed_at, skipped, kept_planned=kept_planned, kept=kept, warnings=warnings)


def _unholdable_names(kind: str, roots: dict[str, tuple]) -> list[dict]:
    """Leave out the stray files whose names no manifest can hold (``repository.rel_problem``: a
    backslash, a newline, a ':' in the first part), so that a backup never publishes a manifest its
    reader rejects: outside Spark's own top-level names in a structured checkpoint (``SPARK_TOP``) such
    a file is not Spark's and is left out, each one returned (the result and the CLI warn); anywhere
    else (Spark's folders, a sink, the ledger, a DStream checkpoint) it is exit 2, named."""
    skipped = []
    unholdable = "a backslash, a newline or a ':' in its first part, which a backup manifest cannot hold"
    for rid, (_, fm, root, files) in roots.items():
        for rel in rel_problems(list(files)):
            url = fm.url(f"{root}/{rel}")
            if kind != "structured" or rid != "checkpoint" or rel.split("/", 1)[0] in SPARK_TOP:
                raise BadInputError(f"cannot be backed up: its name {rel!r} has {unholdable}", path=url,
                                    fix="rename it or move it out of there (Spark never writes such a name: "
                                    "something else put it there), then back up again")
            del files[rel]
            skipped.append({"root": rid, "file": rel, "url": url,
                            "problem": f"not Spark's (outside {', '.join(sorted(SPARK_TOP))}) and its name has "
                            f"{unholdable}: left out of the backup"})
    return skipped


def _require_readable(listing: Listing) -> None:
    """A directory the listing could not read hides files a backup must take: exit 2, naming it."""
    if listing.unreadable_dirs:
        rel, e = min(listing.unreadable_dirs.items())
        raise _unreadable(listing.url(rel), e)


class _Taken(NamedTuple):
    """A file as the previous backup took it: its manifest entry ``[rel, sha256, size, mtime]``, and on
    local disk ``ino, ctime_ns`` after them (what no user can set; manifests of older releases lack them)."""

    sha: str
    size: int
    mtime: float | None
    identity: tuple[int, int] | None


def _known(parent: Manifest | None) -> dict[str, dict[str, _Taken]]:
    """root id -> rel -> how the previous backup took it."""
    known: dict[str, dict[str, _Taken]] = {}
    if parent is not None:
        for rid, r in parent.roots.items():
            known[rid] = {e[0]: _Taken(e[1], e[2], e[3] if len(e) > 3 else None,
                                       tuple(e[4:6]) if len(e) > 5 and all(type(v) is int for v in e[4:6]) else None)
                          for e in r["files"]}
    return known


def _racy_from(parent: Manifest | None) -> float:
    """Files the parent recorded with a modification time at or after this are read again (``RACY_S``):
    from when its listing began (manifests of older releases: when it was created, later still)."""
    if parent is None:
        return 0.0
    listed = parent.doc.get("listed_at")
    if not isinstance(listed, (int, float)) or isinstance(listed, bool):
        listed = calendar.timegm(time.strptime(parent.created, TIME_FORMAT)) + 1
    return listed - RACY_S


def _unchanged(prev: _Taken | None, size: int, mtime: float | None, racy_from: float) -> bool:
    """Whether a file of this size and modification time is the one the previous backup took, as far as
    the listing tells (then it is not read again; on local disk ``take`` also compares its identity)."""
    return prev is not None and prev.size == size and prev.mtime == mtime and mtime is not None \
        and mtime < racy_from


def _identity(local: bool, path: str, info) -> tuple[int, float | None, tuple[int, ...]]:
    """size, mtime and (local disk) ``(st_ino, st_ctime_ns)`` of a source file, from one stat (the
    listing's, where it took one, as the size and mtime always came from; else now): what
    ``cp -p``, ``touch -r`` or ``rsync -a`` cannot carry over (elsewhere the listing's size and mtime,
    which no user sets on an object store)."""
    if not local:
        return info.size, info.mtime, ()
    identity = getattr(info, "identity", None)  # the listing's one stat, where it took one
    if identity is not None:
        return info.size, info.mtime, identity
    st = os.stat(path)
    return st.st_size, st.st_mtime, (st.st_ino, st.st_ctime_ns)


def _damaged_state(cut: _Cut, url: str, problem: str) -> BadInputError:
    return BadInputError(f"{problem} (Spark's restart after batch {cut.batch} reads it)", path=url,
                         fix="restore it from an older backup, or roll back to a batch before the damage, then back up")


def _prefetch(cut: _Cut, parent: Manifest | None) -> None:
    """Read what the copy will read (every file new since ``parent``), up to ``PREFETCH_BYTES`` in all,
    before the destination is touched, and check the state files Spark's restart reads: a file that
    cannot be read or a damaged state file is exit 2, named, with nothing written. The copy then stores
    these bytes instead of reading them again. (Beyond the budget, the copy reads and checks the rest.)"""
    known, racy_from = _known(parent), _racy_from(parent)

    def first(c: tuple) -> tuple:  # the restart set's state files first: their bytes are checked
        rid, rel, _ = c
        return rid != "checkpoint" or rel not in cut.needed.get(rid, ()) or rel not in cut.state_files, rid, rel

    budget, want = PREFETCH_BYTES, {}
    for rid, rel, info in sorted(((rid, rel, info) for rid, r in cut.roots.items() for rel, info in r[3].items()),
                                 key=first):
        if info.size > min(_BIG, budget) or _unchanged(known.get(rid, {}).get(rel), info.size, info.mtime, racy_from):
            continue
        budget -= info.size
        want.setdefault(rid, []).append(rel)
    for rid, rels in want.items():
        _, fm, root, _ = cut.roots[rid]
        errors: dict[str, OSError] = {}
        data = fm.read_many([f"{root}/{rel}" for rel in rels], errors=errors)
        for rel in rels:
            path = f"{root}/{rel}"
            if path in errors:
                raise _unreadable(fm.url(path), errors[path])
            blob = data.get(path)
            if blob is None:
                continue  # vanished since the listing: the copy decides whether that matters
            problem = _state_problem(cut, rid, rel, blob)
            if problem:
                raise _damaged_state(cut, fm.url(path), problem)
            cut.prefetched[(rid, rel)] = blob


def _state_problem(cut: _Cut, rid: str, rel: str, data: bytes) -> str | None:
    """What is wrong with the bytes of a state file Spark's restart at the cut reads (None otherwise)."""
    if rid != "checkpoint" or rel not in cut.needed.get(rid, ()) or rel not in cut.state_files:
        return None
    return state_bytes_problem(cut.state_files[rel], data, cut.codec)


def _fenced_meanwhile(cut: _Cut, url: str, data: bytes) -> RefusedError:
    """``metadata`` read as a fence: an operation of ours began changing the checkpoint after the cut was
    fixed (no fence then), so the files read are not one state Spark could restart from. Nothing is published."""
    try:
        what = f"a checkpoint-ops {parse_fence(data).operation}"
    except (ValueError, KeyError, TypeError, CheckpointOpsError):
        what = "a checkpoint-ops operation"
    return RefusedError(f"{what} began changing {cut.url} while the backup read it (metadata is its fence now): "
                        "the files read are not one state Spark could restart from, so no backup was published",
                        path=url, fix=f"let it finish (or finish or undo it: checkpoint-ops fsck {cut.url} says "
                        "how), then run the backup again")


def _unreadable(url: str, e: OSError) -> BadInputError:
    return BadInputError(f"cannot be read ({e.strerror or e})", path=url,
                         fix="make it readable by this user (or fix the storage permissions), then back up again")


def _read(fm, path: str, fn):
    """``fn()`` (a read of the source file ``path``; the file manager retries what fails transiently); a
    read that cannot succeed is exit 2 naming the file (FileNotFoundError passes: a vanished file is
    judged apart; a store that stays unavailable is StoreUnavailableError, not a damaged source)."""
    try:
        return fn()
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _unreadable(fm.url(path), e) from None


def _copy(repo: Repository, backup_id: str, cut: _Cut, intent: HeldClaim, progress: bool) -> dict:
    """Store what the cut takes (incremental to the newest backup of the same checkpoint, chosen now,
    under the intent) and publish the manifest."""
    parent = _parent(repo, cut.url, refresh=True)
    known, racy_from = _known(parent), _racy_from(parent)
    bad = _found_bad(repo, parent)
    # the parent's objects, by size: each is reused once it is seen there at that size (``reusable``)
    have = {t.sha: t.size for r in known.values() for t in r.values() if t.sha not in bad}
    local_dest = repo.fm.location.is_local
    total = sum(len(r[3]) for r in cut.roots.values())
    bar = _Progress(total, progress)
    lock = threading.Lock()
    stats = {"new_objects": 0, "new_bytes": 0, "repaired_objects": 0, "read_files": 0, "read_bytes": 0,
             "skipped_vanished": []}
    uploading: set[str] = set()  # content one worker is storing: files with the same bytes do not store it again
    sealed: list[set[str]] = []  # every object a usable manifest names, built when first needed
    seen: dict[str, bool] = {}  # parent's object -> whether it is there at its size
    suspect = set(bad)  # objects to replace wherever they are: found bad, or there at the wrong size
    stored_again: set[str] = set()  # objects marked bad that this backup stored again (cleared once published)
    stored: list[dict[str, int]] = []  # object stores: the one listing of ``objects/``, when first needed

    def reusable(sha: str) -> bool:
        """Whether the parent's object ``sha`` may be named without storing it again: no verification
        since the parent was created found it bad (``_found_bad``) and it is there, at its size (on local
        disk one stat; on an object store the one listing of ``objects/``, cheaper than a HEAD each). Its
        bytes are not read: a verification reads them."""
        if sha not in have:
            return False
        with lock:
            ok = seen.get(sha)
        if ok is None:
            if local_dest:
                size = repo.object_size(sha)
            else:
                with lock:
                    if not stored:
                        stored.append(repo.all_objects())
                size = stored[0].get(sha)
            ok = size == have[sha]
            with lock:
                seen[sha] = ok
                if size is not None and not ok:
                    suspect.add(sha)
        return ok

    def damaged_leftover(sha: str) -> bool:
        """Whether the object of content ``sha``, which was already there (not created by this backup),
        must be replaced: a verification found it bad or it has the wrong size (``suspect``); or no
        published manifest names it, so it may be the part-written leftover of a backup that died before
        its manifest, and it is read back and hashed (where objects may be partial). The caller then
        replaces it atomically, and counts it in ``repaired_objects``."""
        with lock:
            if sha in suspect:
                return True
        if not repo.objects_may_be_partial:
            return False
        with lock:
            if not sealed:
                sealed.append(set(have).union(*(m.hashes() for m in repo.manifests())) - bad)
        return sha not in sealed[0] and repo.object_hash(sha) != sha

    def first_upload(sha: str) -> bool:
        if reusable(sha):
            return False
        with lock:
            if sha in uploading:
                return False
            uploading.add(sha)
            return True

    def take(rid: str, fm, root_path: str, rel: str, info) -> tuple[tuple | None, bytes | None]:
        """One file: its manifest entry (None if it vanished and nothing needs it), and its bytes if this
        worker is the one to store them (claimed: no other worker stores the same content)."""
        path = f"{root_path}/{rel}"
        prev = known.get(rid, {}).get(rel)
        store, repaired = None, False
        try:
            size, mtime, identity = _read(fm, path, lambda: _identity(fm.location.is_local, path, info))
            if _unchanged(prev, size, mtime, racy_from) and prev.identity == (identity or None) \
                    and reusable(prev.sha):
                bar.step()
                return (rel, prev.sha, size, mtime, *identity), None
            if size > _BIG:
                sha = _read(fm, path, lambda: _hash_stream(fm, path))
                created = not reusable(sha) and repo.put_object_stream(sha, fm, path)
                if not created and not reusable(sha) and damaged_leftover(sha):
                    repaired = repo.put_object_stream(sha, fm, path, replace=True)
                if (created or repaired) and sha in bad:
                    with lock:
                        stored_again.add(sha)
                nbytes = size
            else:
                data = cut.prefetched.pop((rid, rel), None)
                if data is None:
                    data = _read(fm, path, lambda: fm.read_bytes(path))
                    problem = _state_problem(cut, rid, rel, data)
                    if problem:
                        raise _damaged_state(cut, fm.url(path), problem)
                if rid == "checkpoint" and rel == "metadata" and is_fence(data):
                    raise _fenced_meanwhile(cut, fm.url(path), data)
                sha = hashlib.sha256(data).hexdigest()
                nbytes = len(data)
                # (in memory: once claimed, the upload cannot fail for a vanished file; any other failure stops
                # the whole backup)
                created = False
                if first_upload(sha):
                    store = data
        except FileNotFoundError:
            if rel in cut.needed.get(rid, ()):
                raise _Vanished(rel) from None
            with lock:
                stats["skipped_vanished"].append(f"{rid}:{rel}")  # maintenance deleted it: nothing needs it
            bar.step()
            return None, None
        with lock:
            stats["read_files"] += 1
            stats["read_bytes"] += nbytes
            if created:
                stats["new_objects"] += 1
                stats["new_bytes"] += nbytes
            stats["repaired_objects"] += int(repaired)
        bar.step()
        return (rel, sha, nbytes, mtime, *identity), store

    def store(pending: list[tuple[str, bytes]]) -> None:
        """Store the claimed contents (one ``put_objects_direct``: three system calls each on local disk);
        replace the ones that were already there but damaged (``damaged_leftover``)."""
        if not pending:
            return
        created = repo.put_objects_direct(pending)
        new_objects = new_bytes = repaired = 0
        for (sha, data), made in zip(pending, created):
            if made:
                new_objects += 1
                new_bytes += len(data)
            elif damaged_leftover(sha):
                repo.replace_object(sha, data)
                repaired += 1
                made = True
            if made and sha in bad:
                with lock:
                    stored_again.add(sha)
        with lock:
            stats["new_objects"] += new_objects
            stats["new_bytes"] += new_bytes
            stats["repaired_objects"] += repaired

    def batch(rid: str, fm, root_path: str, items: list[tuple[str, object]]) -> list[tuple | None]:
        """A run of files, read and hashed one by one, their new contents stored in batches of at most
        ``BATCH_BYTES``; the manifest entries in the order given."""
        entries, pending, held = [], [], 0
        for rel, info in items:
            entry, data = take(rid, fm, root_path, rel, info)
            entries.append(entry)
            if data is not None:
                pending.append((entry[1], data))
                held += len(data)
                if held >= BATCH_BYTES:
                    store(pending)
                    pending, held = [], 0
        store(pending)
        return entries

    doc_roots = {}
    try:
        local = repo.fm.location.is_local
        workers, per_task = (LOCAL_WORKERS, LOCAL_BATCH) if local else (WORKERS, 1)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for rid, (url, fm, root_path, files) in cut.roots.items():
                items = sorted(files.items())
                futures = [pool.submit(batch, rid, fm, root_path, items[i:i + per_task])
                           for i in range(0, len(items), per_task)]
                entries = [e for f in futures for e in f.result()]
                doc_roots[rid] = {"url": url, "files": [list(e) for e in entries if e is not None]}
    finally:
        bar.close()
    nfiles = sum(len(r["files"]) for r in doc_roots.values())
    nbytes = sum(f[2] for r in doc_roots.values() for f in r["files"])
    source_interval, sink_interval = cut.intervals
    doc = {
        "format": 1,
        "id": backup_id,
        "created": time.strftime(TIME_FORMAT, time.gmtime()),
        "kind": cut.kind,
        "checkpoint": {"url": cut.url, "query_id": cut.query_id, "batch": cut.batch,
                       **({"kept_planned": cut.kept_planned} if cut.kept_planned else {})},
        "roots": doc_roots,
        "compact_intervals": {"source": source_interval, "sink": sink_interval},
        "parent": parent.id if parent is not None else None,
        "listed_at": cut.listed_at,
        "stats": {"files": nfiles, "bytes": nbytes, "new_objects": stats["new_objects"],
                  "new_bytes": stats["new_bytes"], "repaired_objects": stats["repaired_objects"],
                  "read_files": stats["read_files"], "read_bytes": stats["read_bytes"]},
    }
    intent.check()  # a lapsed intent let a garbage collection run: objects this backup reuses may be gone
    m = repo.publish(backup_id, doc)
    repo.clear_bad(sorted(stored_again))  # durable now, named by a manifest: no longer bad
    return {"backup_id": backup_id, "destination": repo.url, "manifest": m.url, "kind": cut.kind, "checkpoint": cut.url,
            "query_id": cut.query_id, "batch": cut.batch, "kept_planned": cut.kept_planned,
            **({"kept": cut.kept} if cut.kept else {}), "parent": doc["parent"], **doc["stats"],
            "skipped_vanished": stats["skipped_vanished"], "skipped_names": cut.skipped_names,
            "warnings": cut.warnings, "requests": repo.fm.counter.snapshot(),
            # each file manager once: the ledger shares the checkpoint's, and counting it twice doubled its retries
            "retries": {"destination": repo.fm.counter.retries(),
                        **{rid: counter.retries() for rid, counter in
                           per_file_manager({rid: fm for rid, (_, fm, _, _) in cut.roots.items()}).items()}}}


def _found_bad(repo: Repository, parent: Manifest | None) -> set[str]:
    """The objects a verification found missing, damaged or unreadable and that no backup stored again
    since: marked bad (``Repository.bad_objects``, one listing: whichever backup the verification was
    of), and those a verification stored since ``parent`` was created lists (records of releases that
    did not mark them; one listing of ``verified/``, only the records stored since are read). A backup
    stores their content again instead of naming them as they are."""
    bad = repo.bad_objects()
    if parent is None:
        return bad
    since = calendar.timegm(time.strptime(parent.created, TIME_FORMAT)) - _RECORD_SKEW_S
    return bad.union(*(bad_hashes(doc) for doc in repo.verified(since).values() if doc.get("ok") is False))


def _parent(repo: Repository, checkpoint_url: str, refresh: bool = False) -> Manifest | None:
    """The newest usable backup of the same checkpoint: the base the new one is incremental to
    (damaged manifests are never chosen)."""
    same = [m for m in repo.manifests(refresh=refresh) if m.checkpoint_url == checkpoint_url]
    return same[-1] if same else None


def _hash_stream(fm, path: str) -> str:
    h = hashlib.sha256()
    with fm.open_read(path) as f:
        while chunk := f.read(8 * 2**20):
            h.update(chunk)
    return h.hexdigest()
