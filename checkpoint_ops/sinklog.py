"""File-sink logs at batch granularity (reference §4 and §8), as a library the Dagster jobs call.

* ``batch_files``: the files batch N wrote, from Spark's log while it still knows, else from the batch
  ledger, else "unknown, and why" (never a guess).
* ``plan_compact``: offline compaction Spark keeps reading and keeps compacting after. The latest
  compact file is streamed and checked line by line (and rewritten under its own name when entries are
  dropped); every log file older than the two newest compact files, and the plain files between them,
  go, after their batches are recorded in the ledger. Two compact files stay, so Spark derives the same
  compact interval from the files left; nothing after the latest compact is touched.
* ``plan_retain``: drops whole batches (up to a batch, or older than a duration) from every log file
  Spark or a rollback reads, and optionally deletes their data files. The batch ledger keeps what they
  wrote (history); what compares it with the log (``_check_ledger``, a rollback's rebuild of a log file
  Spark deleted, the window fsck judges) looks at the entries the log still holds as of its latest batch.
* ``plan_orphans``: data files no entry of the log references (failed task attempts, rolled-back
  batches whose files were kept), older than a safety window, deleted or moved to a quarantine.

Each is a ``Plan`` applied by the executor: journaled beside the checkpoint (or beside the output when
there is none), fenced, resumable, undoable. Rewrites stream: memory does not grow with the log.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from .errors import BadInputError, RefusedError, StoreUnavailableError, param, require_batch_number
from .activity import refuse_if_active, refuse_if_sink_active
from .executor import Anchor, AppliedOperation, JournalHooks, apply_plan, clear_staged_sources, staging_dir
from .journal import ops_dir, scan_journals
from .lag import SinkLag, sink_lag
from .lease import read_lease
from .ledger import Ledger, attribute_batch, attribute_sink_batches, sync
from .liveness import OPERATION
from .model.checkpoint import Checkpoint
from .model.compactible import CompactibleLog, all_valid_batches, infer_interval
from .model.logfile import LogFormatError, refuse_misnamed_batch_files, unreadable
from .model.sink import SinkOutput
from .operation import ApplyContext, Operation, Site
from .pairing import PAIRING_FILE, paired_checkpoint, paired_checkpoint_url, record_pairing_after, require_pairing
from .plan import SIDECAR_PREFIX, Plan
from .rollback import sidecars
from .storage import open_file_manager
from .storage.paths import join

SINK = "sink0"
# One entry exactly as Spark writes it (SinkFileStatus, fields in this order): checked at regex speed;
# anything else goes through json.loads and a field check.
_ENTRY = re.compile(rb'\{"path":"([^"\\]*)","size":-?\d+,"isDir":(?:true|false),"modificationTime":(-?\d+),'
                    rb'"blockReplication":-?\d+,"blockSize":-?\d+,"action":"add"\}\Z')
_FIELDS = {"path": str, "size": int, "isDir": bool, "modificationTime": int, "blockReplication": int,
           "blockSize": int, "action": str}


@dataclass
class SinkContext:
    """A file sink's output, the checkpoint of its query (if given) and the batch ledger that goes
    with them: the checkpoint's, or one beside the output when there is no checkpoint."""

    sink: SinkOutput
    ckpt: Checkpoint | None
    ledger: Ledger
    storage_options: dict | None = None

    @property
    def anchor(self) -> Anchor:
        return Anchor.of_checkpoint(self.ckpt) if self.ckpt is not None else Anchor.of_sink(self.sink)

    def roots(self) -> dict[str, str]:
        out = {SINK: self.sink.url}
        if self.ckpt is not None:
            out["checkpoint"] = self.ckpt.url  # fenced while the operation runs
        return out

    def root_fms(self) -> dict:
        out = {SINK: (self.sink.fm, self.sink.root)}
        if self.ckpt is not None:
            out["checkpoint"] = (self.ckpt.fm, self.ckpt.root)
        return out


def open_context(output_url: str, checkpoint_url: str | None = None, storage_options: dict | None = None,
                 compact_interval: int = 10, data: bool = False) -> SinkContext:
    """Open a sink output (with its data files listed only if ``data``) and its checkpoint and ledger.
    With a checkpoint, the output must be its query's (``pairing.require_pairing``: PairingRefused, exit 1)."""
    fm, root = open_file_manager(output_url, storage_options)
    sink = SinkOutput(fm, root, compact_interval, data=data)
    if not sink.log.files:
        raise BadInputError("not a file-sink output: no _spark_metadata/ log here", path=output_url,
                            fix="pass the path given to writeStream...start(path)")
    ckpt = None
    if checkpoint_url:
        ckpt = Checkpoint.open(checkpoint_url, storage_options)
        ledger = Ledger.for_checkpoint(ckpt)
        require_pairing(ckpt, [sink], ledger)
    else:
        ledger = Ledger(fm, join(ops_dir(fm, root), "ledger"))
    return SinkContext(sink, ckpt, ledger, storage_options)


def lag_of(ctx: SinkContext) -> SinkLag:
    """Whether the sink is behind its checkpoint: the one given, else the one its pairing record names
    (and that checkpoint's ledger), else what the ledger beside the output recorded."""
    ckpt, ledger = ctx.ckpt, ctx.ledger
    if ckpt is None:
        ckpt = paired_checkpoint(ctx.sink, ctx.storage_options)
        if ckpt is not None:
            lag = sink_lag(ckpt, ctx.sink, Ledger.for_checkpoint(ckpt))
            if lag.behind:
                return lag
    return sink_lag(ckpt, ctx.sink, ledger)


# ---- which files a batch wrote ------------------------------------------------------------------------


def batch_files(ctx: SinkContext, batch: int) -> dict:
    """The files ``batch`` wrote to the sink, from Spark's log or the ledger; RefusedError if unknown."""
    log, sink = ctx.sink.log, ctx.sink
    require_batch_number(batch, "batch", sink.url)
    entries, source = attribute_batch(log, batch), "spark log"
    if entries is None:
        entries, source = ctx.ledger.sink_entries(sink, batch), "batch ledger"
    if entries is None:
        raise RefusedError(f"which files batch {batch} wrote is unknown: {_why_unknown(ctx, batch)}",
                           path=sink.url, fix="keep a batch ledger: `checkpoint-ops ledger sync CHECKPOINT --sink "
                           "OUTPUT` after every run (the Dagster asset does), then this is answered for every batch "
                           "from then on")
    files = [{"path": e.path, "size": e.doc.get("size"), "modification_time_ms": e.doc.get("modificationTime")}
             for e in entries]
    return {"output": sink.url, "batch": batch, "source": source, "files": files,
            "bytes": sum(int(f["size"] or 0) for f in files)}


@dataclass(frozen=True)
class SinkSnapshot:
    """The output of a file sink as it was right after a batch: exactly the files Spark's file index would
    have read then (``spark.read.parquet(*paths)`` reads that output, with nothing rolled back)."""

    output: str
    as_of_batch: int
    paths: tuple[str, ...]
    bytes: int
    source: str  # "spark log", or "spark log and batch ledger" when log files Spark deleted came from the ledger

    def to_dict(self) -> dict:
        return {"output": self.output, "as_of_batch": self.as_of_batch, "source": self.source,
                "files": len(self.paths), "bytes": self.bytes, "paths": list(self.paths)}


def files_as_of_batch(ctx: SinkContext, batch: int) -> SinkSnapshot:
    """The sink's files as of ``batch`` (Spark's ``allFiles()`` then: every entry added up to it, minus those
    deleted), from Spark's log where it still has the files a reader needed then, else from the batch ledger.
    BadInputError for a batch the log never reached, RefusedError when neither keeps what it needs. Reads only.

    Data files that sink retention or an orphan cleanup deleted since are still listed (and fail to read):
    the answer is what the output was, not what is left of it."""
    log, sink = ctx.sink.log, ctx.sink
    require_batch_number(batch, "as_of_batch", sink.url)
    if log.latest is None or batch > log.latest:
        raise BadInputError(f"the sink log has no batch {batch}: it ends at batch {log.latest}", path=sink.url,
                            fix=f"pick a batch from 0 to {log.latest}")
    restored = ctx.ledger.sink_log_files_at(sink, batch, history=True) if log.missing_for(batch) else {}
    if restored is None:
        raise RefusedError(f"the output as of batch {batch} is unknown: Spark deleted "
                           f"{', '.join(log.rel(b) for b in log.missing_for(batch))} and no batch ledger recorded "
                           "them", path=sink.url,
                           fix="keep a batch ledger (`checkpoint-ops ledger sync CHECKPOINT --sink OUTPUT` after "
                           "every run; the Dagster asset does), then every later batch can be answered")
    ids = list(all_valid_batches(batch, log.interval))
    on_disk = log.read([b for b in ids if b not in restored])
    entries = [e for b in ids for e in (restored[b] if b in restored else on_disk.get(b, []))]
    deleted = {e.path for e in entries if e.doc.get("action") == "delete"}
    live: dict[str, int] = {}
    for e in entries:
        if e.doc.get("action", "add") != "delete" and e.path not in deleted:
            live[e.path] = int(e.doc.get("size") or 0)
    return SinkSnapshot(sink.url, batch, tuple(live), sum(live.values()),
                        "spark log and batch ledger" if restored else "spark log")


def _why_unknown(ctx: SinkContext, batch: int) -> str:
    log = ctx.sink.log
    if log.latest is None or batch > log.latest:
        return f"the sink log ends at batch {log.latest}"
    later = [c for c in log.compact_ids if c >= batch]
    ledger = "no batch ledger recorded it" + ("" if ctx.ckpt is not None else
                                              " (pass --checkpoint to use the query's ledger)")
    if later and batch not in log.files:
        return (f"Spark compacted it into {log.rel(min(later))} and deleted {log.rel(batch)}; a compact file "
                f"does not say which batch added each entry, and {ledger}")
    if batch in log.files:
        return f"{log.rel(batch)} is a compact file whose previous log state is gone, and {ledger}"
    return f"{log.rel(batch)} is gone and {ledger}"


# ---- streaming a log file ----------------------------------------------------------------------------------


_CHUNK = 4 * 2**20  # bytes of lines read (and written) at a time


class _Rewrite:
    """Lines of one log file streamed through a filter, every line checked as Spark would read it.
    With a filter: the content Spark would write for the kept lines (``v1``, then one entry per line,
    no trailing newline), hashed, and staged if asked. Without one (``keep`` None) a check only."""

    def __init__(self, fm, path: str, url: str, keep: Callable[[bytes, int], bool] | None, stage: tuple | None):
        self.kept = self.dropped = 0
        self.size = 0
        self.sha = hashlib.sha256()
        self._out = stage[0].create_atomic(stage[1], overwrite=False) if stage and keep is not None else None
        self._buf: list[bytes] = []
        self._pending = 0
        try:
            self._scan(fm, path, url, keep)
        except OSError as e:
            self._cancel()
            if isinstance(e, FileNotFoundError):
                raise LogFormatError("vanished while being read (is the query running?)", path=url,
                                     kind="missing") from None
            raise unreadable(url, e) from None
        except BaseException:
            self._cancel()
            raise
        self._flush()
        if self._out is not None:
            self._out.close()
        self.digest = self.sha.hexdigest()

    def _scan(self, fm, path: str, url: str, keep) -> None:
        with fm.open_read(path) as f:
            first = f.readline()
            head = first.rstrip(b"\r\n")
            if not first:
                raise LogFormatError("file is empty (0 bytes)", path=url, kind="empty",
                                     fix="restore it from a backup before compacting")
            if head != b"v1":
                version = head.decode("utf-8", "replace")[:20]
                kind = "unknown-version" if re.fullmatch(r"v\d+", version) else "no-version"
                raise LogFormatError(f"first line {version!r} is not the sink log version this tool writes (v1)",
                                     path=url, kind=kind, fix="use a tool version that reads it; do not compact")
            self._emit(b"v1")
            lineno, carry = 1, None
            check = _ENTRY.match
            while True:
                lines = f.readlines(_CHUNK)
                if carry is not None:  # the last line of the previous chunk: is it the file's last?
                    lineno += 1
                    self._line(carry, url, lineno, not lines, keep)
                if not lines:
                    return
                carry = lines.pop()
                for line in lines:
                    lineno += 1
                    body = line[:-1] if line[-1:] == b"\n" else line
                    if keep is None and check(body):
                        self.kept += 1  # a canonical entry, nothing to filter: checked
                        continue
                    self._line(line, url, lineno, False, keep)

    def _line(self, line: bytes, url: str, lineno: int, last: bool, keep) -> None:
        body = line.rstrip(b"\r\n")
        if not body and last:
            return  # a trailing newline (Spark writes none; a rewrite drops it)
        path, mtime = _entry(body, url, lineno, last)
        if keep is None or keep(path, mtime):
            self.kept += 1
            if keep is not None:
                self._emit(b"\n" + body)
        else:
            self.dropped += 1

    def _emit(self, data: bytes) -> None:
        self._buf.append(data)
        self._pending += len(data)
        if self._pending >= _CHUNK:
            self._flush()

    def _flush(self) -> None:
        if not self._buf:
            return
        data = b"".join(self._buf)
        self._buf, self._pending = [], 0
        self.sha.update(data)
        self.size += len(data)
        if self._out is not None:
            self._out.write(data)

    def _cancel(self) -> None:
        if self._out is not None:
            self._out.cancel()


def _entry(line: bytes, url: str, lineno: int, last: bool) -> tuple[bytes, int]:
    """The path and modification time of one log line, or LogFormatError if Spark could not read it."""
    m = _ENTRY.match(line)
    if m:
        return m.group(1), int(m.group(2))
    try:
        doc = json.loads(line)
    except ValueError:
        what = "ends mid-record (truncated write?)" if last else f"line {lineno} is not valid JSON"
        raise LogFormatError(f"{what}: {line[:80]!r}", path=url, kind="truncated" if last else "not-json",
                             fix="restore this file from a backup; do not compact a damaged log") from None
    bad = [k for k, t in _FIELDS.items() if not isinstance(doc.get(k) if isinstance(doc, dict) else None, t)]
    if bad:
        raise LogFormatError(f"line {lineno} is not a sink log entry (missing or wrong: {', '.join(bad)})",
                             path=url, kind="malformed", fix="restore this file from a backup; do not compact it")
    return doc["path"].encode(), int(doc["modificationTime"])


def _stage_dir(ctx: SinkContext) -> tuple:
    fm = ctx.sink.fm
    return fm, staging_dir(fm, ctx.sink.root)


def _rewrite(ctx: SinkContext, plan: Plan, rel: str, keep, stage: bool, reason: str) -> _Rewrite:
    """Stream one log file through ``keep`` (None: check only); if anything is dropped, the plan
    rewrites it in place."""
    sink = ctx.sink
    staged = None
    if stage and keep is not None:
        sfm, sdir = _stage_dir(ctx)
        staged = (sfm, join(sdir, f"{uuid.uuid4().hex}"))
    r = _Rewrite(sink.fm, sink.listing.abs(rel), sink.listing.url(rel), keep, staged)
    shared = r.digest in plan.sources  # another rewrite of this plan has the same content (several emptied files)
    if r.dropped:
        source = plan.sources[r.digest] if shared else \
            staged[0].url(staged[1]) if staged else f"(staged when applied) {rel}"
        plan.write_from(SINK, rel, r.digest, r.size, source, reason, kind="replace")
    if staged and (shared or not r.dropped):  # not a source of the plan: nothing would ever delete it
        staged[0].delete(staged[1])
    return r


def _check_log(log: CompactibleLog) -> None:
    """Refuse a log Spark's readers cannot read as of its latest batch (exit 2, naming the file)."""
    refuse_misnamed_batch_files([(log.listing, log.rel_dir, True)],
                                "the change to the sink log is refused, nothing was changed")
    if log.latest is None:
        return
    missing = log.missing_for(log.latest)
    if missing:
        raise BadInputError(f"the sink log has a gap: {log.rel(missing[0])} is missing, so Spark's readers fail "
                            f"as of batch {log.latest}", path=log.listing.url(log.rel(missing[0])),
                            fix="restore it from a backup (or roll back to a batch before the gap) before compacting")


def _readable_after(log: CompactibleLog, gone: set[str]) -> None:
    """After the change Spark derives the interval from the compact files left: every file readers of
    the latest batch need must be there under the name that interval gives."""
    prefix = log.rel_dir + "/"
    names = {f.rel for f in log.files.values() if f.rel not in gone}
    compacts = sorted(int(r[len(prefix):-len(".compact")]) for r in names if r.endswith(".compact"))
    interval, how = infer_interval(compacts, log.default_interval)
    if interval != log.interval:
        raise RefusedError(f"the change would make Spark derive compact interval {interval} ({how}) instead of "
                           f"{log.interval}", path=log.listing.url(log.rel_dir))
    missing = [log.rel(b, interval) for b in all_valid_batches(log.latest, interval) if log.rel(b, interval) not in names]
    if missing:
        raise RefusedError(f"after the change Spark's readers would miss {missing[0]}", path=log.listing.url(log.rel_dir))


def _delete(plan: Plan, sink: SinkOutput, rel: str, reason: str, phase: str, size: int | None = None) -> None:
    listing = sink.listing
    plan.delete(SINK, rel, reason, phase, size if size is not None else listing.get(rel).known_size)
    for sc in sidecars(listing, rel):
        plan.delete(SINK, sc, SIDECAR_PREFIX + reason, phase, listing.get(sc).known_size)


def _ledger_view(ctx: SinkContext) -> dict[int, list]:
    """What the ledger will know once synced: its records, plus what Spark's files still attribute."""
    known = {b: e for b in ctx.ledger.records if (e := ctx.ledger.sink_entries(ctx.sink, b)) is not None}
    for b, entries in attribute_sink_batches(ctx.sink.log, damaged=[]).items():
        known.setdefault(b, entries)
    return known


# ---- compaction ------------------------------------------------------------------------------------------


def plan_compact(ctx: SinkContext, drop_missing: bool = False, stage: bool = False) -> Plan:
    """Offline compaction of the sink log (module docstring). ``stage`` writes rewritten files into the
    staging area beside the output (done when applying; a dry run only computes their hash)."""
    sink, log = ctx.sink, ctx.sink.log
    plan = Plan("sink-compact", ctx.roots(), None)
    _check_log(log)
    compacts = sorted(log.compact_ids)
    if not compacts:
        plan.summary["compact"] = f"no compact file yet (latest batch {log.latest}): nothing to compact"
        return plan
    c = compacts[-1]
    p = compacts[-2] if len(compacts) > 1 else None
    plan.target_batch = log.latest
    # 1. every entry readers see, streamed and checked (and filtered with --drop-missing)
    keep = None  # check every entry; without --drop-missing nothing is filtered
    if drop_missing:
        present = set(sink.data_files())

        def present_or_elsewhere(path: bytes, mtime: int) -> bool:
            rel = sink.rel_of_path(path.decode())
            return rel is None or rel in present  # files elsewhere are not ours to judge
        keep = present_or_elsewhere
    entries = dropped = 0
    for b in all_valid_batches(log.latest, log.interval):
        r = _rewrite(ctx, plan, log.rel(b), keep, stage, "entries whose data file is missing dropped (readers "
                     "would fail with FileNotFoundException)")
        entries += r.kept + r.dropped
        dropped += r.dropped
    # 2. log files Spark no longer reads, once the ledger holds their batches
    floor = p if p is not None else c
    gone = [b for b, f in log.files.items() if b < floor or (p is not None and p < b < c and not f.compact)]
    _check_ledger(ctx, [b for b in gone if not log.files[b].compact])
    for b in gone:
        _delete(plan, sink, log.rel(b), f"log files older than {log.rel(c)} (Spark's readers read only it and what "
                "follows; the batch ledger keeps which batch wrote what)", "sink-log")
    _readable_after(log, {log.rel(b) for b in gone})
    plan.summary["compact"] = (f"{log.rel(c)} checked ({entries} entries" + (f", {dropped} dropped" if dropped else "")
                               + f"); {len(gone)} older log files removed; {log.rel(p) if p is not None else 'no older compact'}"
                               f" kept so Spark derives compact interval {log.interval}")
    unrecorded = [b for b in gone if not log.files[b].compact and ctx.ledger.sink_entries(sink, b) is None]
    if unrecorded:
        plan.summary["batch ledger"] = (f"records batches {min(unrecorded)}..{max(unrecorded)} before their log files "
                                        f"go ({ctx.ledger.fm.url(ctx.ledger.path)})")
    plain = [b for b in gone if not log.files[b].compact]
    if plain and ctx.ckpt is None:
        flag = param("checkpoint") or "its checkpoint"
        plan.warnings.append(f"no checkpoint given: batches {min(plain)}..{max(plain)}, whose log files go, are kept in "
                             f"the ledger beside this output ({ctx.ledger.fm.url(ctx.ledger.path)}), where a rollback "
                             "of the query's checkpoint does not look: it can no longer reach them. To keep them in "
                             f"its reach, give {flag} CHECKPOINT")
    return plan


def _check_ledger(ctx: SinkContext, plain: list[int]) -> None:
    """Before plain files go, their batches must be recordable, and what the ledger already says about
    them must agree with the files (else one of the two is wrong: refuse, exit 2). They agree when they
    name the same entries, or the same ones among those the log still holds as of its latest batch: entries
    dropped on purpose since the ledger recorded the batch (``sink retain`` drops whole batches from every
    log file, the ledger keeps what they wrote) are left out of both, as a rollback's rebuild of the file
    from the ledger leaves them out (``Ledger.sink_log_files_at``)."""
    log, sink = ctx.sink.log, ctx.sink
    for b in plain:
        try:
            entries = log.read([b])[b]
        except LogFormatError as e:
            raise BadInputError(f"{e.problem}; compaction would delete it, and with it the only record of what batch "
                                f"{b} wrote", path=e.path, fix="restore it from a backup first") from None
        recorded = ctx.ledger.sink_entries(sink, b)
        if recorded is not None and not _same_entries(ctx, {e.path for e in recorded}, {e.path for e in entries}):
            raise BadInputError(f"the batch ledger disagrees with {log.rel(b)} about the files batch {b} wrote",
                                path=ctx.ledger.fm.url(ctx.ledger.path),
                                fix="find out which is wrong before anything is deleted (`checkpoint-ops ledger show "
                                f"CHECKPOINT --batch {b}`); restore the other from a backup")


def _same_entries(ctx: SinkContext, recorded: set[str], on_disk: set[str]) -> bool:
    """Whether the ledger's record of a batch and its plain log file name the same entries, or the same
    among those readers still see (the log's latest state, read only when they differ)."""
    if recorded == on_disk:
        return True
    live = ctx.ledger.live_sink_paths(ctx.sink)
    return live is not None and recorded & live == on_disk & live


# ---- retention ---------------------------------------------------------------------------------------------


def plan_retain(ctx: SinkContext, keep_after_batch: int | None = None, older_than_s: float | None = None,
                delete_files: bool = False, stage: bool = False, now: float | None = None,
                drop_every_batch: bool = False) -> Plan:
    """Drop whole batches from every log file on disk (readers, the next compaction and rollbacks all
    stop seeing them) and optionally their data files. A rule that reaches the log's last batch would drop
    every batch (Spark's readers then find no file of the output): refused unless ``drop_every_batch``, and then
    the plan warns what was overridden."""
    if (keep_after_batch is None) == (older_than_s is None):
        raise BadInputError("give exactly one of --keep-after-batch N and --older-than DURATION")
    sink, log = ctx.sink, ctx.sink.log
    if keep_after_batch is not None:
        require_batch_number(keep_after_batch, "keep_after_batch", sink.url)
    _check_log(log)
    now = time.time() if now is None else now
    plan = Plan("sink-retain", ctx.roots(), log.latest)
    known = _ledger_view(ctx)
    if keep_after_batch is not None:
        drop_batches = sorted(b for b in known if b <= keep_after_batch)
        rule = f"batches up to {keep_after_batch}"
    else:
        cutoff_ms = (now - older_than_s) * 1000
        drop_batches = sorted(b for b in known if _batch_time_ms(ctx, b, known[b]) < cutoff_ms)
        rule = f"batches older than {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now - older_than_s))}"
    dropped_paths = {e.path.encode() for b in drop_batches for e in known[b]}
    known_paths = {e.path.encode() for entries in known.values() for e in entries}
    unknown: list[bytes] = []
    by_age: set[bytes] = set()  # entries no record attributes, dropped by their modification time

    def kept(path: bytes, mtime: int) -> bool | None:
        """Whether an entry stays; None: no record says which batch wrote it (refused below)."""
        if path in dropped_paths:
            return False
        if path in known_paths:
            return True
        if older_than_s is not None:  # no record says which batch wrote it: Spark's retention rule (its mtime)
            return mtime >= (now - older_than_s) * 1000
        return None

    def keep(path: bytes, mtime: int) -> bool:
        verdict = kept(path, mtime)
        if verdict is None:
            unknown.append(path)
        elif verdict is False and path not in dropped_paths:
            by_age.add(path)
        return verdict is not False

    try:
        _refuse_dropping_every_batch(sink, log, rule, keep_after_batch, drop_batches)
        _refuse_dropping_every_visible_file(sink, log, rule, known, drop_batches, kept)
    except RefusedError as e:
        if not drop_every_batch:
            raise
        plan.warnings.append(f"--force overrode a refusal: {e.problem}")  # emptied on purpose, never silently

    reason = f"entries of {rule} dropped (batch-granular retention)"
    for b in sorted(log.files):
        _rewrite(ctx, plan, log.rel(b), keep, stage, reason)
    if unknown:
        raise RefusedError(f"{len(unknown)} entries of the sink log belong to batches no record attributes (e.g. "
                           f"{unknown[0].decode()}): whether they are up to batch {keep_after_batch} is unknown",
                           path=sink.url, fix="keep a batch ledger (`checkpoint-ops ledger sync` after every run), or "
                           "use --older-than, which judges such entries by their modification time as Spark's "
                           "`retention` sink option does")
    files = 0
    if delete_files:
        deleted: set[str] = set()
        for b in drop_batches:
            for e in known[b]:
                rel = sink.rel_of(e)
                if rel is not None and rel in sink.listing and rel not in deleted:
                    _delete(plan, sink, rel, f"data files of {rule}", "sink-data", int(e.doc.get("size") or 0))
                    deleted.add(rel)
        for path in sorted(by_age):  # the log's own entries no record attributes, dropped by age: their files too
            rel = sink.rel_of_path(path.decode())
            if rel is not None and rel in sink.listing and rel not in deleted:
                _delete(plan, sink, rel, "data files of log entries older than the cutoff that no record attributes "
                        "to a batch (their modificationTime)", "sink-data", sink.listing.get(rel).size)
                deleted.add(rel)
        files = len(deleted)
    entries = len(dropped_paths) + len(by_age)  # each once, however many log files hold it
    plan.summary["retain"] = (f"{rule}: {len(drop_batches)} batches"
                              + (f" ({drop_batches[0]}..{drop_batches[-1]})" if drop_batches else "")
                              + f", {entries} entries"
                              + (f" ({len(by_age)} of them attributed to no batch by any record, dropped by their "
                                 "modificationTime)" if by_age else "")
                              + (f", {files} data files deleted" if delete_files else
                                 " (data files kept: `sink orphans` finds them)"))
    return plan


def _refuse_dropping_every_batch(sink: SinkOutput, log: CompactibleLog, rule: str, keep_after_batch: int | None,
                                 drop_batches: list[int]) -> None:
    """Refuse (before anything is staged) a retention that reaches the log's last batch: Spark's readers
    list the output from the log alone, so the whole output would disappear from them."""
    latest = log.latest
    if latest is None or not ((keep_after_batch is not None and keep_after_batch >= latest) or latest in drop_batches):
        return
    if latest == 0:
        keep = "the log holds batch 0 alone: there is nothing older to drop"
    elif keep_after_batch is not None:
        keep = f"{param('keep_after_batch')} {latest - 1} or lower keeps the newest batch"
    else:
        keep = f"a shorter {param('older_than')} (or {param('keep_after_batch')} {latest - 1}) keeps the newest batch"
    raise RefusedError(f"dropping {rule} drops every batch left in the sink log (it ends at batch {latest}): "
                       "Spark's readers of the output list its files from the log alone, so they would find none "
                       "(spark.read fails with [UNABLE_TO_INFER_SCHEMA]; given a schema, it reads no row) until the "
                       "query writes again",
                       path=sink.url, fix=f"{keep}; to empty the output on purpose, run it again with --force")


def _refuse_dropping_every_visible_file(sink: SinkOutput, log: CompactibleLog, rule: str, known: dict[int, list],
                                        drop_batches: list[int], kept: Callable[[bytes, int], bool | None]) -> None:
    """Refuse (before anything is staged) a retention that keeps batches, but none that lists a file readers
    see now: the newest batches of a query often write nothing (a filter that kept no row; in append mode a
    data batch whose windows the next, no-data, batch emits), and dropping every batch that did empties the
    output for Spark's readers as surely as dropping every batch."""
    try:
        entries = log.entries_after(log.latest)
    except LogFormatError:
        return  # a log that cannot be read as of its latest batch is refused by ``_check_log``
    deleted = {e.path for e in entries if e.doc.get("action") == "delete"}
    visible = [e for e in entries if e.doc.get("action", "add") != "delete" and e.path not in deleted]
    staying = [e for e in visible if kept(e.path.encode(), int(e.doc.get("modificationTime") or 0)) is not False]
    if not visible or _any_holds_rows(sink, staying):
        return
    paths = {e.path for e in visible}
    wrote = [b for b in drop_batches if any(e.path in paths for e in known[b])]
    newest_with_rows = next((b for b in reversed(wrote[-_ROW_CHECKS:])
                             if _any_holds_rows(sink, [e for e in known[b] if e.path in paths])), None)
    if newest_with_rows is not None:  # the hint names the newest dropped batch whose files hold rows
        wrote = wrote[:wrote.index(newest_with_rows) + 1]
    left = [b for b in sorted(log.files) if b not in set(drop_batches)]
    span = f"batch {left[0]}" if len(left) == 1 else f"batches {left[0]}..{left[-1]}" if left else "none"
    if wrote and wrote[-1] > 0:
        keep = (f"{param('keep_after_batch')} {wrote[-1] - 1} or lower keeps batch {wrote[-1]}, the newest that "
                "wrote a file readers see")
    elif wrote:
        keep = f"batch {wrote[-1]} wrote the only files readers see: there is nothing older to drop"
    else:
        keep = f"a shorter {param('older_than')} keeps the files readers see"
    kept_files = ("list no data file" if not staying else
                  f"list only files without a row ({len(staying)}: Spark writes one for a batch that kept no row)")
    raise RefusedError(f"dropping {rule} drops every file with rows Spark's readers see in the output "
                       f"({len(visible) - len(staying)}): the batches it keeps ({span}) {kept_files}, so readers "
                       "would read no row (without a data file, spark.read fails with [UNABLE_TO_INFER_SCHEMA]) "
                       "until the query writes again",
                       path=sink.url, fix=f"{keep}; to empty the output on purpose, run it again with --force")


_ROW_CHECKS = 20  # data files a retention opens, newest first, to find one with rows (a footer read each)


def _any_holds_rows(sink: SinkOutput, entries: list) -> bool:
    """Whether some of the data files ``entries`` name hold a row, as far as can be told cheaply: an empty file
    holds none; a Parquet file says how many in its footer (read with pyarrow when it is installed); any other
    file, or one that cannot be read, counts as holding rows (never a refusal on a guess). The newest
    ``_ROW_CHECKS`` files are opened at most: a retention's kept batches that all wrote nothing are few."""
    for e in sorted(entries, key=lambda e: int(e.doc.get("modificationTime") or 0), reverse=True)[:_ROW_CHECKS]:
        if _rows_in(sink, e) != 0:
            return True
    return len(entries) > _ROW_CHECKS


def _rows_in(sink: SinkOutput, e) -> int | None:
    """Rows in the data file of entry ``e``: 0 for an empty file, a Parquet footer's count, else None."""
    if e.doc.get("size") == 0:
        return 0
    rel = sink.rel_of(e)
    if rel is None or not rel.endswith(".parquet"):
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        with sink.fm.open_read(join(sink.root, rel)) as f:
            return pq.ParquetFile(f).metadata.num_rows
    except StoreUnavailableError:
        raise  # not a file that cannot be read: counted as holding rows, it would let the refusal above pass
    except Exception:  # noqa: BLE001 - unreadable here: counts as holding rows (fsck judges the file)
        return None


def _batch_time_ms(ctx: SinkContext, b: int, entries) -> float:
    """When batch b ran: its batchTimestampMs (ledger or checkpoint), else its newest file's mtime."""
    rec = ctx.ledger.records.get(b) or {}
    if rec.get("timestamp_ms") is not None:
        return rec["timestamp_ms"]
    if ctx.ckpt is not None and b in ctx.ckpt.offset_files:
        o = ctx.ckpt.load_offsets([b], errors=[]).get(b)
        if o is not None and o.timestamp_ms is not None:
            return o.timestamp_ms
    return max((int(e.doc.get("modificationTime") or 0) for e in entries), default=0)


# ---- orphans -------------------------------------------------------------------------------------------------


def plan_orphans(ctx: SinkContext, min_age_s: float, delete: bool = False, quarantine: str | None = None,
                 now: float | None = None) -> Plan:
    """Data files no entry of the log (as readers see it) references, older than ``min_age_s``."""
    sink, log = ctx.sink, ctx.sink.log
    if delete and quarantine:
        raise BadInputError("give one of --delete and --quarantine DIR")
    _check_log(log)
    lag = lag_of(ctx)
    if lag.behind and (delete or quarantine):
        raise RefusedError(
            f"the sink is behind its checkpoint: {lag.describe()} {'were' if len(lag.missing) > 1 else 'was'} "
            f"committed ({lag.committed_by}) but the sink log has no entry for "
            f"{'them' if len(lag.missing) > 1 else 'it'}, so the files that look orphaned may be exactly the rows it "
            "lost; removing them would make the loss permanent", path=sink.url,
            fix="roll back the checkpoint and the sink to the last batch the sink has and reprocess "
            + (f"(`checkpoint-ops rollback {lag.checkpoint or 'CHECKPOINT'} --to-batch {lag.rollback_target} --sink "
               f"{sink.url}`, then run the query)" if lag.rollback_target is not None else "(restore from a backup)")
            + "; then clean orphans")
    now = time.time() if now is None else now
    entries = log.entries_after(log.latest) if log.latest is not None else []
    rels = [sink.rel_of(e) for e in entries]
    live = {rel for rel in rels if rel is not None}
    elsewhere = [e.path for e, rel in zip(entries, rels) if rel is None]
    if elsewhere:  # a copied or moved output: every file here would look unreferenced, and be listed (or removed)
        raise RefusedError(
            f"the sink log lists {len(elsewhere)} files outside this output directory (e.g. {elsewhere[0]}): the "
            "output was copied or moved, so every data file here would look like an orphan; nothing was changed",
            path=sink.url, fix="clean orphans at the output's original location (a restore with --relocate rewrites "
            "a copy's log to its new place)")
    plan = Plan("sink-orphans", ctx.roots(), log.latest, keep_dir=quarantine)
    young, orphans, nbytes = 0, [], 0
    for rel, size in sorted(sink.data_files().items()):
        if rel in live:
            continue
        info = sink.listing.get(rel)
        if info.mtime is not None and now - info.mtime < min_age_s:
            young += 1  # a writer may be about to log it
            continue
        orphans.append(rel)
        nbytes += size
        reason = "data files no sink log entry references (failed task attempts, rolled-back batches)"
        if quarantine:
            plan.keep(SINK, rel, reason, size)
            for sc in sidecars(sink.listing, rel):
                plan.delete(SINK, sc, SIDECAR_PREFIX + reason, "sink-data")
        elif delete:
            _delete(plan, sink, rel, reason, "sink-data", size)
    plan.summary["orphans"] = (f"{len(orphans)} files, {nbytes} bytes"
                               + (f"; {young} younger than the safety window left alone" if young else "")
                               + ("" if delete or quarantine else " (listed only: --delete or --quarantine DIR acts)"))
    plan.summary["orphan files"] = orphans  # every one (the text shows the first few, --verbose and --json all)
    if lag.behind:
        plan.warnings.append(f"the sink is behind its checkpoint ({lag.describe()} committed without a sink log entry): "
                             "these files may be the rows it lost; do not remove them before rolling back and "
                             "reprocessing")
    return plan


# ---- applying ------------------------------------------------------------------------------------------------


def apply(ctx: SinkContext, plan: Plan, storage_options: dict | None = None, progress: bool = False,
          guard=None) -> AppliedOperation:
    """Record in the ledger what the plan's log deletions would forget, apply the plan, and clear the
    staged rewrites it used."""
    sync(ctx.ckpt, [ctx.sink], ledger=ctx.ledger, guard=guard)
    hooks = JournalHooks(undo_guard={SINK: ["_spark_metadata"]})
    result = apply_plan(plan, ctx.anchor, ctx.root_fms(), storage_options, progress, hooks, guard=guard)
    clear_staging(ctx, plan)
    return result


def sweep_staging(ctx: SinkContext) -> None:
    """Delete staged rewrites no unfinished operation needs (left by a crash while planning, before
    its journal existed). Those of unfinished operations stay: their resume reads them."""
    from .journal import load_journal, scan_journals

    sfm, sdir = _stage_dir(ctx)
    staged = {sfm.url(f.path): f.path for f in sfm.walk(sdir)}
    if not staged:
        return
    anchor = ctx.anchor
    for path, markers in scan_journals(anchor.fm, anchor.ops).items():
        if markers & {"applied", "undone", "abandoned"}:
            continue
        for url in load_journal(anchor.fm, path).record["plan"].get("sources", {}).values():
            staged.pop(url, None)
    sfm.delete_many(list(staged.values()))


def clear_staging(ctx: SinkContext, plan: Plan) -> None:
    """Delete the staged rewrites a finished plan used (a resume needs them until then; a resume clears
    them the same way). Best effort when the store is failing: they are hidden, and ``sweep_staging``
    removes them next time."""
    clear_staged_sources(plan, {SINK: (ctx.sink.fm, ctx.sink.root)})


# ---- the operations ----------------------------------------------------------------------------------------


# operations anchored at a checkpoint that change its file sinks' outputs too (their journal is beside the checkpoint)
CHECKPOINT_OPERATIONS = ("rollback", "restore", "undo", "resume")


def _unfinished_journal(fm, root: str) -> bool:
    """Whether an operation journaled beside ``root`` (a sink command run without its checkpoint) stopped part-way:
    neither applied nor abandoned, or its undo begun and not finished."""
    try:
        journals = scan_journals(fm, ops_dir(fm, root))
    except (OSError, ValueError, BadInputError):
        return False
    return any(("applied" not in markers and "abandoned" not in markers)
               or ("undoing" in markers and "undone" not in markers) for markers in journals.values())


class _SinkOperation(Operation):
    """A plan on a sink's log (and data files), anchored at its checkpoint when given, else at the output."""

    recovery = "journal"

    data = False  # list the data files too
    records_batches = True  # records in the batch ledger what the log files it changes held (not: orphans)

    def __init__(self, output_url: str, checkpoint_url: str | None = None, storage_options: dict | None = None,
                 compact_interval: int = 10):
        self.output_url, self.checkpoint_url = output_url, checkpoint_url
        self.storage_options, self.compact_interval = storage_options, compact_interval
        self.ctx: SinkContext | None = None

    def sites(self) -> list[Site]:
        if not hasattr(self, "_sites"):
            fm, root = open_file_manager(self.output_url, self.storage_options)
            self._sites = [Site(fm, root, f"sink output {self.output_url}")]
            if self.checkpoint_url:
                cfm, croot = open_file_manager(self.checkpoint_url, self.storage_options)
                self._sites.append(Site(cfm, croot, f"checkpoint {self.checkpoint_url}"))
        return self._sites

    def recovery_url(self) -> str | None:
        return self.sites()[-1].url  # the anchor: the checkpoint when given, else the output

    def precheck(self) -> None:
        super().precheck()
        if self.checkpoint_url is None:
            self._refuse_a_dead_checkpoint_operation()

    def _refuse_a_dead_checkpoint_operation(self) -> None:
        """Without its checkpoint, refuse to take over the output's lease from a dead rollback, restore, undo or
        resume of a checkpoint: it may have stopped part-way through this output, its journal is beside its
        checkpoint (which fences only itself), and this command would change the sink log under it. A compaction
        did, between a killed rollback and its ``resume``: the resume then reported success over a log missing
        the batches it kept, and Spark failed (BATCH_METADATA_NOT_FOUND; a hostile review). With ``--checkpoint``
        its fence is seen; a live holder is refused when the lease is taken. Before that: an operation journaled
        beside this output that stopped part-way (a sink command run without its checkpoint, or its undo), which
        nothing fences, is refused, naming ``resume`` of the output."""
        fm, root = open_file_manager(self.output_url, self.storage_options)
        here = self.output_url
        state = read_lease(fm, root)
        if state.held:
            return  # a live holder (perhaps that very operation, still running): refused, by name, at the lease
        if _unfinished_journal(fm, root):  # a sink command run without its checkpoint fences nothing: its journal
            raise RefusedError(               # is all there is to see of it
                f"an operation journaled beside this output stopped part-way (`checkpoint-ops history {here}` lists "
                "it): this command would change the sink log under it; nothing was changed", path=fm.url(root),
                fix=f"finish it first: `checkpoint-ops resume {here}` (or `checkpoint-ops undo {here}`)")
        holder = state.holder
        if not (state.present and state.stale_reason is not None and holder is not None
                and holder.kind == OPERATION and holder.operation in CHECKPOINT_OPERATIONS):
            return
        flag = param("checkpoint") or "the checkpoint"
        raise RefusedError(
            f"the lease of this output is {state.describe()}: that {holder.operation} of a checkpoint stopped while "
            "it held this output, perhaps part-way through changing it, and its journal is beside that checkpoint, "
            f"which this {self.what} was not given; nothing was changed", path=fm.url(root),
            fix=f"run this again with {flag} CKPT (the checkpoint of this output): a {holder.operation} it stopped "
                f"part-way is then named with what finishes it (`checkpoint-ops resume CKPT`, or undo), and one "
                f"that stopped before it changed anything is taken over. Or, if `checkpoint-ops history CKPT` shows "
                f"nothing unfinished, `checkpoint-ops lease break {here}` frees the lease")

    def open(self) -> None:
        self.ctx = open_context(self.output_url, self.checkpoint_url, self.storage_options, self.compact_interval,
                                data=self.data)
        if self.checkpoint_url is None and self.records_batches:
            self._refuse_without_its_checkpoint()

    def _refuse_without_its_checkpoint(self) -> None:
        """An output whose pairing record names a checkpoint that is there (same query id) is that query's file
        sink: without its checkpoint, the batches whose log files this removes would be recorded in a ledger
        beside the output, where the checkpoint's rollback never looks, and its rollback window would shrink for
        good (a hostile review: `ledger sync` could not bring it back). Refused before anything changes."""
        url = paired_checkpoint_url(self.ctx.sink, self.storage_options)
        if url is None:
            return
        flag = param("checkpoint") or "the checkpoint"
        raise RefusedError(f"this is the file sink of checkpoint {url} (its pairing record "
                           f"{self.ctx.sink.fm.url(join(self.ctx.sink.root, PAIRING_FILE))} says so): without it, the "
                           f"{self.what} would record the batches whose log files go beside the output, where a "
                           "rollback of that checkpoint never looks, and the rollback could no longer reach them",
                           path=self.ctx.sink.url, fix=f"run it again with {flag} {url} (its batch ledger records "
                           "them, and its lease is held too); if the query now runs from a copy of that checkpoint "
                           f"(moved, or restored elsewhere), pass the copy with {flag} instead: the stale record is "
                           "then named, with what to do")

    def check_active(self, force: bool) -> list[str]:
        if self.ctx.ckpt is not None:
            return refuse_if_active(self.ctx.ckpt, force)
        return refuse_if_sink_active(self.ctx.sink, force)

    def plan(self, stage: bool) -> Plan:
        if stage:
            sweep_staging(self.ctx)  # rewrites staged by a planning run that died before its journal
        return self.build(stage)

    def build(self, stage: bool) -> Plan:
        raise NotImplementedError

    def apply(self, plan: Plan, ctx: ApplyContext) -> AppliedOperation:
        applied = apply(self.ctx, plan, ctx.storage_options, ctx.progress, guard=ctx.guard)
        if self.ctx.ckpt is not None:  # checked when opened; now recorded on both sides
            record_pairing_after(self.ctx.ckpt, [self.ctx.sink], self.ctx.ledger, operation=self.name,
                                 op_id=applied.op_id, anchor_url=self.ctx.anchor.url)
        return applied

    def discard(self, plan: Plan) -> None:
        clear_staging(self.ctx, plan)

    def describe(self, plan: Plan, outcome: AppliedOperation) -> str:
        return (f"Applied {self.what} plan {plan.hash[:12]} ({outcome.op_id}). Undo with: checkpoint-ops undo "
                f"{self.ctx.anchor.url}")


class SinkCompactOperation(_SinkOperation):
    """``checkpoint-ops sink compact``: offline compaction (``plan_compact``)."""

    name = "sink-compact"
    what = "sink compaction"

    def __init__(self, output_url: str, checkpoint_url: str | None = None, drop_missing: bool = False, **kw):
        super().__init__(output_url, checkpoint_url, **kw)
        self.drop_missing = drop_missing
        self.data = drop_missing

    def build(self, stage: bool) -> Plan:
        return plan_compact(self.ctx, self.drop_missing, stage)


class SinkRetainOperation(_SinkOperation):
    """``checkpoint-ops sink retain``: drop whole old batches (``plan_retain``)."""

    name = "sink-retain"
    what = "sink retention"

    def __init__(self, output_url: str, checkpoint_url: str | None = None, keep_after_batch: int | None = None,
                 older_than_s: float | None = None, delete_files: bool = False, drop_every_batch: bool = False,
                 **kw):
        super().__init__(output_url, checkpoint_url, **kw)
        self.keep_after_batch, self.older_than_s, self.delete_files = keep_after_batch, older_than_s, delete_files
        self.drop_every_batch = drop_every_batch
        self.data = delete_files

    def build(self, stage: bool) -> Plan:
        return plan_retain(self.ctx, self.keep_after_batch, self.older_than_s, self.delete_files, stage,
                           drop_every_batch=self.drop_every_batch)


class SinkOrphansOperation(_SinkOperation):
    """``checkpoint-ops sink orphans``: data files no log entry references (``plan_orphans``)."""

    name = "sink-orphans"
    what = "orphan cleanup"
    records_batches = False  # deletes data files no log entry names: the log and the ledger stay as they are
    data = True

    def __init__(self, output_url: str, checkpoint_url: str | None = None, min_age_s: float = 3600,
                 delete: bool = False, quarantine: str | None = None, **kw):
        super().__init__(output_url, checkpoint_url, **kw)
        self.min_age_s, self.delete, self.quarantine = min_age_s, delete, quarantine

    def check_active(self, force: bool) -> list[str]:
        if self.delete or self.quarantine:  # a listing alone changes nothing, whoever writes meanwhile
            return super().check_active(force)
        return []

    def build(self, stage: bool) -> Plan:
        return plan_orphans(self.ctx, self.min_age_s, self.delete, self.quarantine)
