"""The restart set: every file Spark reads when it restarts a query after batch N, and what is wrong with it.

After batch N is the last committed one, Spark's restart reads (reference §2.5, §3, §4.3, §5):

* ``metadata`` (the query id);
* ``offsets/N`` and ``offsets/N-1``, and ``commits/N``;
* each file-source log as of the log offset ``offsets/N`` records: its latest compact file at or below
  that offset and the plain files after it;
* the state files that load version N+1 for every operator, partition and store (HDFS snapshot and
  deltas; RocksDB zip and changelogs, and the SSTs the zips name; on checkpoint format V2 the files the
  unique ids in ``commits/N`` and the changelog lineage lead to);
* every operator's state schema files (v1/v2), and for transformWithState the newest operator metadata
  v2 at or below N and the v3 schema files it names (``model/operators.py``);
* each file sink's log as of batch N (latest compact at or below N and the plain files after it), and
  the data files those entries name.

Rollback validates the whole set before planning, ``inspect`` computes the rollback window from it and
``fsck`` reports it for the latest batch, all in the same words. A problem is either *purged* (below
what Spark's retention keeps: the batch is simply out of reach) or *damage* (a file that should be
there is missing, torn, unreadable, from a newer Spark, or has a stale checksum). A RocksDB state file's Hadoop
``.X.crc`` sidecar that does not match it is damage (RocksDB reads its files through Hadoop's FileSystem API,
which checks it); that of an HDFS-store state file, a log file, ``metadata``, operator metadata or a state
schema is not: Spark 4.3 does not check it when it reads them (``tests/test_stale_crc_spark.py``), and fsck
names it as a warning.

``deep=False`` judges from the listing, the log files and the operator files (all small); ``deep``
also reads every state file of the set (LZ4 framing, zips, SST sizes, checksum files).
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass, field
from functools import cached_property

from .errors import BadInputError, StorageError
from .model.checkpoint import Checkpoint
from .model.codecs import LZ4_MAGIC, CodecError, changelog_header, decompress_prefix
from .model.compactible import CompactibleLog, LogEntry, all_valid_batches, is_compaction_batch
from .model.listing import Listing
from .model.logfile import LogFormatError, unreadable
from .model.operators import METADATA as OPERATOR_METADATA
from .model.operators import SCHEMA as OPERATOR_SCHEMA
from .model.operators import FileProblem, OperatorFile
from .model.sink import SinkOutput
from .model.state import StateFile, Store
from .model.state_schema import StateSchemaFile
from .storage.checksums import hadoop_crc_matches, hadoop_crc_name, hadoop_crc_size, spark_checksum_matches

CKPT = "checkpoint"

# kinds of problem
PURGED = "purged"  # below Spark's retention window: out of reach, nothing is wrong
MISSING = "missing"
TORN = "torn"
UNREADABLE = "unreadable"
FUTURE = "future-version"
STALE = "stale-checksum"

_LOG_CODES = {"empty": "empty-log-file", "truncated": "truncated-log-file", "not-json": "not-json",
              "unknown-version": "unknown-version", "no-version": "no-version-line", "unreadable": "unreadable-file",
              "missing": "missing-log-file", "gap": "missing-log-file"}
_LOG_KINDS = {"empty": TORN, "truncated": TORN, "unknown-version": FUTURE, "missing": MISSING, "gap": MISSING}
# (operator metadata and state schema problems use the same kinds)
_SUMMARY = {TORN: "is torn", MISSING: "is missing", UNREADABLE: "is unreadable", FUTURE: "is from a newer Spark",
            STALE: "has a stale checksum", PURGED: "is gone (purged)"}
_MAX_CHANGELOG_VERSION = 4
_STATE_GROUP = 16  # stores whose files are read at once in deep mode (bounded memory)


@dataclass(frozen=True)
class RestartFile:
    root: str  # "checkpoint", "sink0", ...
    rel: str
    role: str  # metadata | offsets | commits | source log | state | sink log | sink data
    origin: str = "disk"  # or "batch ledger", or "rebuilt from <rel>"


@dataclass(frozen=True)
class Damage:
    root: str
    rel: str
    url: str
    role: str
    kind: str  # PURGED | MISSING | TORN | UNREADABLE | FUTURE | STALE
    code: str  # the fsck finding code
    problem: str
    fix: str

    @property
    def summary(self) -> str:
        """Short form for plan warnings: ``commits/24 is torn (0 bytes)``."""
        detail = " (0 bytes)" if self.code == "empty-log-file" or self.problem.startswith("is empty") else ""
        return f"{self.rel} {_SUMMARY[self.kind]}{detail}"

    def text(self) -> str:
        return f"{self.url}: {self.problem}"

    def to_dict(self) -> dict:
        return {"root": self.root, "rel": self.rel, "path": self.url, "role": self.role, "kind": self.kind,
                "code": self.code, "problem": self.problem, "fix": self.fix}


@dataclass
class RestartSet:
    batch: int
    files: list[RestartFile] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)

    @property
    def broken(self) -> list[Damage]:
        """Damage: files that should be readable and are not."""
        return [d for d in self.damage if d.kind != PURGED]

    @property
    def purged(self) -> list[Damage]:
        return [d for d in self.damage if d.kind == PURGED]

    @property
    def ok(self) -> bool:
        return not self.damage


def log_finding_code(e: LogFormatError) -> str:
    """The fsck code for a log file Spark cannot read."""
    return _LOG_CODES.get(e.kind, "malformed-log-file")


def metadata_damage(ckpt: Checkpoint) -> Damage | None:
    """What is wrong with ``metadata`` (the query id) for a restart, if anything. A fence is not
    damage: the operation that wrote it says how to finish."""
    L = ckpt.listing
    url = L.url("metadata")
    fix = 'restore it from a backup (it holds only {"id":"<query id>"}; the id is also in the driver logs)'
    try:
        raw = ckpt.metadata_raw
        if raw is None:
            if ckpt.metadata_error is not None:
                raise ckpt.metadata_error
            if L.dir_entry("metadata") is not None:
                raise unreadable(url, IsADirectoryError(21, "Is a directory"))
            if ckpt.offset_files or ckpt.commit_files:
                return Damage(CKPT, "metadata", url, "metadata", MISSING, "missing-metadata",
                              "metadata is missing: Spark 4.2+ refuses to start "
                              "(STREAMING_CHECKPOINT_MISSING_METADATA_FILE) and older Spark starts the query under "
                              "a new id, which defeats sink idempotency", fix + "; --force goes ahead without it")
            return None
        if ckpt.fence is not None:
            return None
        if not raw.strip():
            raise LogFormatError("metadata is empty (0 bytes): Spark cannot read the query id", path=url,
                                 kind="empty", fix=fix)
        if not ckpt.query_id:
            raise LogFormatError("metadata has no query id", path=url, kind="malformed", fix=fix)
    except LogFormatError as e:
        return _log_damage(CKPT, "metadata", "metadata", e)
    return None


def _log_damage(root: str, rel: str, role: str, e: LogFormatError) -> Damage:
    kind = _LOG_KINDS.get(e.kind, UNREADABLE)
    return Damage(root, rel, e.path, role, kind, log_finding_code(e), e.problem, e.fix or "restore this file from a backup")


class RestartSets:
    """Restart sets of one checkpoint (and its sinks) for any batch. Each file is judged once, however
    many batches share it (the rollback window asks for every retained batch)."""

    def __init__(self, ckpt: Checkpoint, sinks: list[SinkOutput] = (), ledger=None, deep: bool = False,
                 cache=None):
        """``cache`` (a ``verdicts.VerdictCache``, optional): log files an earlier run found sound, and
        that Spark can no longer rewrite, are taken from it instead of read (not in deep mode)."""
        self.ckpt = ckpt
        self.sinks = list(sinks)
        self.ledger = ledger
        self.deep = deep
        self.cache = cache if not deep else None
        self._live: set | None = None
        self._seal_ok: dict[str, bool] = {}
        self._sound: dict[tuple[str, str, str], bool] = {}  # what the cache said, asked once per file
        self.window = None  # the rollback window judged with these sets (window.py), once per pass
        self._verdicts: dict[tuple[str, str], Damage | None] = {}
        self._sink_missing: dict[tuple[int, int], list[Damage]] = {}
        self._state_done: dict[int, list] = {}
        self._missing: dict[tuple, list[Damage]] = {}  # missing store directories, by the operators commits name
        self._metadata: tuple[list[RestartFile], list[Damage]] | None = None
        self._every_version: dict[int, bool] = {}  # per operator: snapshots at consecutive versions (see below)

    @cached_property
    def _oldest_logged(self) -> int | None:
        """The oldest batch Spark's log purge left (``_oldest_logged_batch``), once per set of restart sets."""
        return _oldest_logged_batch(self.ckpt.offset_files, self.ckpt.commit_files)

    # -- public -------------------------------------------------------------------------------
    def of(self, batch: int) -> RestartSet:
        rs = RestartSet(batch)
        # the small files of the set in two concurrent reads (a round trip each on object stores)
        self.ckpt.load_offsets([batch, batch - 1], errors=[])
        self.ckpt.load_commits([batch], errors=[])
        self._add_metadata(rs)
        for kind, b in (("offsets", batch), ("offsets", batch - 1), ("commits", batch)):
            if b >= 0:
                self._add_log_file(rs, kind, b)
        offsets = self._parsed("offsets", batch)
        commit = self._parsed("commits", batch)
        if offsets is not None:
            self._add_sources(rs, offsets)
        if commit is not None or not self.ckpt.state.has_unique_ids:
            self._add_state(rs, batch, commit)
        self._add_operator_files(rs, batch)
        for i, sink in enumerate(self.sinks):
            self._add_sink(rs, i, sink, batch)
        return rs

    # -- metadata -----------------------------------------------------------------------------
    def _add_metadata(self, rs: RestartSet) -> None:
        if self._metadata is None:
            d = metadata_damage(self.ckpt)
            files = [RestartFile(CKPT, "metadata", "metadata")] if self.ckpt.metadata_raw is not None else []
            self._metadata = (files, [d] if d else [])
        rs.files += self._metadata[0]
        rs.damage += self._metadata[1]

    # -- offsets and commits ---------------------------------------------------------------------
    def _add_log_file(self, rs: RestartSet, kind: str, b: int) -> None:
        ck, L = self.ckpt, self.ckpt.listing
        files = ck.offset_files if kind == "offsets" else ck.commit_files
        rel = f"{kind}/{b}"
        if b in files:
            rs.files.append(RestartFile(CKPT, rel, kind))
            key = (CKPT, rel)
            if key not in self._verdicts:
                errors: list[LogFormatError] = []
                load = ck.load_offsets if kind == "offsets" else ck.load_commits
                load([b], errors=errors)
                self._verdicts[key] = _log_damage(CKPT, rel, kind, errors[0]) if errors else None
            if self._verdicts[key]:
                rs.damage.append(self._verdicts[key])
            return
        if self.ledger is not None and self.ledger.has(kind, b):
            rs.files.append(RestartFile(CKPT, rel, kind, "batch ledger"))
            try:
                (self.ledger.offsets if kind == "offsets" else self.ledger.commit)(b)
            except LogFormatError as e:
                rs.damage.append(_log_damage(CKPT, rel, kind, e))
            return
        url = L.url(rel)
        if files and b < min(files):
            why = ("purged after minBatchesToRetain" if kind == "offsets" else
                   f"batch {b} was purged, or never committed")
            problem = f"{rel} is gone ({why})"
            if kind == "offsets" and b == rs.batch - 1:
                problem += f": Spark's restart needs offsets/{b} and offsets/{b + 1}"
            rs.damage.append(Damage(CKPT, rel, url, kind, PURGED, "purged", problem,
                                    "choose a later batch (see `checkpoint-ops inspect`); a batch ledger or an "
                                    "older backup reaches further"))
        else:
            rs.damage.append(Damage(CKPT, rel, url, kind, MISSING, "offsets-gap" if kind == "offsets" else
                                    "missing-log-file", f"{rel} is missing (the {kind} log has a gap there): "
                                    f"Spark's restart after batch {rs.batch} reads it",
                                    "restore it from a backup, or roll back to a batch whose files are complete"))

    def _parsed(self, kind: str, b: int):
        ck = self.ckpt
        files = ck.offset_files if kind == "offsets" else ck.commit_files
        if b in files:
            got = (ck.load_offsets if kind == "offsets" else ck.load_commits)([b], errors=[])
            return got.get(b)
        if self.ledger is not None and self.ledger.has(kind, b):
            try:
                return (self.ledger.offsets if kind == "offsets" else self.ledger.commit)(b)
            except LogFormatError:
                return None
        return None

    # -- the verdict cache ---------------------------------------------------------------------------
    def _cached_sound(self, scope: str, root: str, listing: Listing, rel: str) -> bool:
        if self.cache is None:
            return False
        key = (scope, root, rel)
        if key not in self._sound:
            self._sound[key] = self._ask_cache(scope, root, listing, rel)
        return self._sound[key]

    def _ask_cache(self, scope: str, root: str, listing: Listing, rel: str) -> bool:
        if self._live is None:
            from .verdicts import live_rels

            self._live = live_rels(self.ckpt, self.sinks)
        if (root, rel) in self._live:
            return False
        if scope == "sink data":
            if root not in self._seal_ok:
                self._seal_ok[root] = self.cache.seal_holds(root, listing)
            if not self._seal_ok[root]:
                return False
        from .verdicts import file_stamp

        return self.cache.is_sound(scope, root, rel, file_stamp(listing, rel))

    def _record_sound(self, scope: str, root: str, listing: Listing, rel: str) -> None:
        if self.cache is not None and (root, rel) not in (self._live or ()):
            from .verdicts import file_stamp

            self.cache.record_sound(scope, root, rel, file_stamp(listing, rel))

    # -- compactible logs ---------------------------------------------------------------------------
    def _add_log(self, rs: RestartSet, root: str, listing: Listing, log: CompactibleLog, upto: int,
                 role: str, ledger_files: dict[int, list[LogEntry]] | None = None) -> list[int] | None:
        """The files a reader of ``log`` as of ``upto`` needs. Returns the batch ids read from disk, or
        None if any is unusable."""
        ok = []
        lowest = min(log.files) if log.files else None
        if role != "source log":  # source log files are only checked, streamed (see _log_verdict)
            log.prefetch([b for b in all_valid_batches(upto, log.interval)
                          if b not in log.files or not self._cached_sound("window", root, listing, log.files[b].rel)])
        for b in all_valid_batches(upto, log.interval):
            rel = log.rel(b)
            f = log.files.get(b)
            if f is not None and f.compact == is_compaction_batch(b, log.interval):
                rs.files.append(RestartFile(root, rel, role))
                d = self._log_verdict(root, listing, log, b, role)
                if d:
                    rs.damage.append(d)
                    ok = None
                elif ok is not None:
                    ok.append(b)
                continue
            if role == "source log":
                donors = [x for x in log.compact_ids if x >= b]
                if donors:
                    donor = min(donors)
                    rs.files.append(RestartFile(root, rel, role, f"rebuilt from {log.rel(donor)}"))
                    d = self._log_verdict(root, listing, log, donor, role)
                    if d:
                        rs.damage.append(d)
                        ok = None
                    continue
            elif ledger_files is not None and b in ledger_files:
                rs.files.append(RestartFile(root, rel, role, "batch ledger"))
                continue
            url = listing.url(rel)
            if lowest is not None and b < lowest:
                why = ("and cannot be rebuilt (sink entries carry no batch id; a batch ledger would know)"
                       if role == "sink log" else "and no later compact file holds its entries")
                rs.damage.append(Damage(root, rel, url, role, PURGED, "purged", f"{rel} is gone {why}",
                                        "choose a later batch (see `checkpoint-ops inspect`); a batch ledger or an "
                                        "older backup reaches further"))
            else:
                named = f" (Spark reads it as {log.file_name(b)} with compact interval {log.interval})" if f else ""
                rs.damage.append(Damage(root, rel, url, role, MISSING,
                                        "sink-log-gap" if role == "sink log" else "source-log-gap",
                                        f"{rel} is missing{named}: the {role} cannot be read as of "
                                        f"{'batch' if role == 'sink log' else 'log offset'} {upto}",
                                        "restore it from a backup, or roll back to an earlier batch"))
            ok = None
        return ok

    def _log_verdict(self, root: str, listing: Listing, log: CompactibleLog, b: int, role: str) -> Damage | None:
        rel = log.rel(b)
        key = (root, rel)
        if key not in self._verdicts:
            if self._cached_sound("window", root, listing, rel):
                self._verdicts[key] = None
                return None
            try:
                if role == "source log":
                    log.check(b)  # whether it reads; its entries are not needed (and can be many)
                else:
                    log.read([b])
                verdict = None
            except LogFormatError as e:
                verdict = _log_damage(root, rel, role, e)
            self._verdicts[key] = verdict
            if verdict is None:
                self._record_sound("window", root, listing, rel)
        return self._verdicts[key]

    def _add_sources(self, rs: RestartSet, offsets) -> None:
        ck = self.ckpt
        for sid, src in ck.sources.items():
            if src.log is None:
                continue
            so = offsets.source(sid)
            k = so.log_offset if so else None
            if k is None:
                continue
            self._add_log(rs, CKPT, ck.listing, src.log, k, "source log")

    def _add_sink(self, rs: RestartSet, i: int, sink: SinkOutput, batch: int) -> None:
        log, root = sink.log, f"sink{i}"
        if log.latest is None:
            return
        upto = min(batch, log.latest)
        ledger_files = None
        if log.missing_for(upto) and self.ledger is not None:
            ledger_files = self.ledger.sink_log_files_at(sink, upto)
        read = self._add_log(rs, root, sink.listing, log, upto, "sink log", ledger_files)
        if read is None:
            return
        for b in all_valid_batches(upto, log.interval):
            if b in read:
                key = (i, b)
                if key not in self._sink_missing:
                    rel = log.files[b].rel
                    if self._cached_sound("sink data", root, sink.listing, rel):
                        self._sink_missing[key] = []
                    else:
                        self._sink_missing[key] = self._missing_data(root, sink, log.read([b])[b], b)
                        if not self._sink_missing[key]:
                            self._record_sound("sink data", root, sink.listing, rel)
                missing = self._sink_missing[key]
            else:  # from the ledger
                missing = self._missing_data(root, sink, ledger_files[b], b)
            for d in missing:
                rs.damage.append(d)
            if self.deep:  # every data file, by name (the window asks for too many batches to list them)
                entries = log.read([b])[b] if b in read else ledger_files[b]
                for e in entries:
                    rel = sink.rel_of(e)
                    if rel is not None and rel in sink.listing:
                        rs.files.append(RestartFile(root, rel, "sink data"))

    def _missing_data(self, root: str, sink: SinkOutput, entries: list[LogEntry], b: int) -> list[Damage]:
        out = []
        for e in entries:
            rel = sink.rel_of(e)
            if rel is None:
                continue  # elsewhere (a moved output): fsck reports it; rollback refuses to touch it
            if rel not in sink.listing:
                newest_compact = max(sink.log.compact_ids, default=-1)
                # ``sink compact --drop-missing`` rewrites the newest compact file only (and what follows)
                log = sink.log
                fix = ("restore the file from a backup, or drop its entry from the sink log "
                       "(`checkpoint-ops sink compact --drop-missing`)" if 0 <= newest_compact <= b else
                       "restore the file from a backup (`checkpoint-ops sink compact --drop-missing` drops its entry "
                       f"once Spark has written the sink log's first compact file, {log.rel(log.interval - 1)})"
                       if newest_compact < 0 else
                       f"restore the file from a backup (`sink compact --drop-missing` rewrites the newest compact "
                       f"file only, {sink.log.rel(newest_compact)}, not {sink.log.rel(b)}, which readers read again "
                       f"after a rollback to a batch from {b} to {newest_compact - 1})")
                out.append(Damage(root, rel, sink.listing.url(rel), "sink data", MISSING, "sink-file-missing",
                                  f"{rel} is listed in the sink log ({sink.log.rel(b)}) but missing: Spark's readers "
                                  "of the sink fail with FileNotFoundException", fix))
        return out

    # -- state ------------------------------------------------------------------------------------------
    def _add_state(self, rs: RestartSet, batch: int, commit) -> None:
        if batch not in self._state_done:
            self._state_done[batch] = self._state(batch, commit)
        for item in self._state_done[batch]:
            (rs.files if isinstance(item, RestartFile) else rs.damage).append(item)

    def _missing_stores(self, commit) -> list[Damage]:
        """Damage for every store directory a restart loads that is not there (``StateModel.missing_stores``),
        once per set of operators the commits name."""
        committed = tuple(sorted((commit.state_unique_ids or {}) if commit is not None else ()))
        if committed not in self._missing:
            ck = self.ckpt
            missing = ck.state.missing_stores(self.ckpt.pinned_partitions(), committed, self._keyed)
            # an operator gone whole took its operator metadata along: where the others have theirs, Spark's check
            # of the query against them refuses the restart before any state is loaded (tested with Spark)
            checked = any(op.declared[2] is not None for op in ck.state.operators.values())
            self._missing[committed] = [
                Damage(CKPT, m.rel_dir, ck.listing.url(m.rel_dir), "state", MISSING, "state-missing",
                       f"the state of {m.label} has no directory, and every restart loads it ({m.evidence}): Spark "
                       + ("refuses the restart with STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA (its "
                          "operator metadata went with it)" if m.partition is None and checked
                          else "fails with CANNOT_LOAD_STATE_STORE"),
                       "restore the checkpoint from a backup taken before it went (checkpoint-ops backup list, then "
                       "backup restore into a new location, with its sinks) and run the query from there; a rollback "
                       "does not repair it: every batch loads this state")
                for m in missing]
            if not ck.state.operators and not committed:
                self._missing[committed] += self._no_state_at_all()
        return self._missing[committed]

    def _no_state_at_all(self) -> list[Damage]:
        """Damage when the checkpoint has no state at all while the query recorded beside it as the one that wrote
        its last committed batch is stateful (``query_profile``): ``state/`` was deleted whole, which leaves no
        file to judge and no commit to name an operator (format V1). Spark numbers stateful operators from 0, and
        its restart finds no state directory (STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY, a hostile
        review). No record made for this checkpoint (its query id), or one of a stateless query or that cannot say
        (Spark Connect): nothing is known."""
        from .query_profile import read_profile

        ck = self.ckpt
        if ck.latest_commit is None:
            return []
        try:
            query_id = ck.query_id
            record = read_profile(ck.fm, ck.root, as_of=ck.latest_commit, query_id=query_id)
        except StorageError:
            raise  # refused, like an outage (not caught here), would pass a checkpoint that lost its state
        except (BadInputError, OSError, LogFormatError):
            return []  # an unreadable record or metadata is named elsewhere; this judges what Spark reads
        # only a record made for this very checkpoint (its query id): the profile beside it outlives a checkpoint
        # deleted by hand, and a stateless query started at the same place is not missing state (a second review)
        if record is None or record.query_id is None or record.query_id != query_id or not record.profile.operators:
            return []
        ops = "; ".join(op.describe() for op in record.profile.operators)
        return [Damage(CKPT, "state", ck.listing.url("state"), "state", MISSING, "state-missing",
                       f"the checkpoint has no state, but the query recorded as the one that wrote its last committed "
                       f"batch ({ck.latest_commit}) is stateful ({ops}; query-profile.json beside the checkpoint, "
                       f"recorded {record.recorded_at}): state/ was deleted, and Spark fails every restart with "
                       "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY",
                       "restore the checkpoint from a backup taken before it went (checkpoint-ops backup list, then "
                       "backup restore into a new location, with its sinks) and run the query from there; a rollback "
                       "does not repair it: every batch loads this state")]

    def _keyed(self, op) -> bool | None:
        """Whether an operator's state has a key (so Spark writes every partition), from its state schema files
        (read once: the restart set reads them anyway); None when none can be read. A streaming limit has none."""
        if op.name == "globalLimit":
            return False
        catalog = self.ckpt.operator_files
        schemas = [f for f in catalog.files(op) if f.role == OPERATOR_SCHEMA]
        parsed = [p for p in catalog.read(schemas).values() if isinstance(p, StateSchemaFile)]
        if not parsed:
            return None
        return any((cf.key_schema or {}).get("fields") for p in parsed for cf in p.column_families)

    def _state(self, batch: int, commit) -> list:
        ck = self.ckpt
        st, L = ck.state, ck.listing
        v = batch + 1
        out: list = list(self._missing_stores(commit))
        chains: list[tuple[Store, list[StateFile]]] = []
        pinned = self.ckpt.pinned_partitions()
        for op in st.operators.values():
            names = op.store_names
            for (part, name), store in op.stores.items():
                if pinned is not None and part >= pinned:
                    continue  # Spark loads partitions 0..pinned-1 only: a directory beyond them is never read
                idx = names.index(name)
                uid = None
                if commit is not None and commit.state_unique_ids:
                    uid = commit.unique_id(op.op_id, part, idx)
                    if uid is None:
                        out.append(Damage(CKPT, f"commits/{batch}", L.url(f"commits/{batch}"), "state", MISSING,
                                          "state-missing", f"commits/{batch} lists no state unique id for {store.label}",
                                          "restore commits/{batch} from a backup, or roll back to an earlier batch"))
                        continue
                ids_for = ck.unique_ids_for(op.op_id, part, idx) if uid else None
                if self.deep:
                    first = st.check(store, v, uid, ids_for, exact=False)
                    if first.ok:  # read the whole chain once: the exact check below uses the same bytes
                        chains.append((store, first.files))
                        continue
                b = st.check(store, v, uid, ids_for, exact=self.deep)
                if not b.ok:
                    out.append(self._state_failure(store, v, b))
                    continue
                out += self._chain(store, b.files, None)
        for i in range(0, len(chains), _STATE_GROUP):
            group = chains[i:i + _STATE_GROUP]
            blobs = self._read_state([f for _, fs in group for f in fs])
            for store, files in group:
                broken = [self._content(store, f, blobs) for f in files]
                broken = [d for d in broken if d]
                if broken:
                    out += [RestartFile(CKPT, f.rel, "state") for f in files] + broken
                    continue
                op = st.operators[store.op_id]
                uid = commit.unique_id(store.op_id, store.partition, op.store_names.index(store.name)) \
                    if commit is not None and commit.state_unique_ids else None
                ids_for = ck.unique_ids_for(store.op_id, store.partition, op.store_names.index(store.name)) if uid else None
                st.preload({f.rel: blobs.get(L.abs(f.rel)) for f in files})
                b = st.check(store, v, uid, ids_for, exact=True)
                st.preload(None)
                if not b.ok:
                    out.append(self._state_failure(store, v, b))
                    continue
                extra = [f for f in b.files if L.abs(f.rel) not in blobs]
                if extra:
                    blobs.update(self._read_state(extra))
                out += self._chain(store, b.files, blobs)
        return out

    # -- operator metadata and state schema files -------------------------------------------------------
    def _add_operator_files(self, rs: RestartSet, batch: int) -> None:
        """The operator metadata v2 and state schema files Spark reads to restart (model/operators.py)."""
        catalog = self.ckpt.operator_files
        for op in sorted(self.ckpt.state.operators.values(), key=lambda o: o.op_id):
            items = catalog.restart_files(op, batch)
            parsed = catalog.read([f for f in items if isinstance(f, OperatorFile)])
            for item in items:
                if isinstance(item, OperatorFile):
                    rs.files.append(RestartFile(CKPT, item.rel, item.role))
                    item = parsed[item.rel]
                if isinstance(item, FileProblem):
                    rs.damage.append(_operator_damage(item))

    def _state_failure(self, store: Store, v: int, b) -> Damage:
        L = self.ckpt.listing
        rel = b.missing or store.rel_dir
        problem = f"state version {v} cannot be loaded: {b.reason}"
        if b.missing and b.missing in L:
            return Damage(CKPT, rel, L.url(rel), "state", UNREADABLE, "state-file-damaged", problem,
                          "restore the state file from a backup, or roll back to a batch whose state is intact")
        lowest = min(store.versions) if store.versions else None
        if b.missing_version is not None and lowest is not None and b.missing_version < lowest:
            oldest = self._oldest_logged
            if store.op_id not in self._every_version:
                op = self.ckpt.state.operators.get(store.op_id)
                self._every_version[store.op_id] = op is not None and any(
                    _snapshots_at_consecutive_versions(s) for s in op.stores.values())
            if not _cleanup_could_leave(store, lowest, oldest, self._every_version[store.op_id]):
                return Damage(CKPT, store.rel_dir, L.url(store.rel_dir), "state", MISSING, "state-missing",
                              f"{problem}; the oldest file left is version {lowest} without a snapshot, which "
                              "Spark's cleanup never leaves: a snapshot or zip was deleted",
                              "restore the store's files from a backup, or roll back to a batch whose state is "
                              "complete (see `checkpoint-ops inspect`)")
            return Damage(CKPT, rel, L.url(rel), "state", PURGED, "purged", problem,
                          "choose a later batch (see `checkpoint-ops inspect`): state maintenance deleted the files "
                          "older batches need (minBatchesToRetain)")
        return Damage(CKPT, rel, L.url(rel), "state", MISSING, "state-missing", problem,
                      "restore the missing state files from a backup, or roll back to a batch whose state is "
                      "complete (see `checkpoint-ops inspect`)")

    def _chain(self, store: Store, files: list[StateFile], blobs: dict | None) -> list:
        """The files of one store's load chain, with the problems found in them. Without ``blobs``
        (shallow) only what the listing shows."""
        L = self.ckpt.listing
        out: list = []
        ssts: dict[str, int] = {}
        for f in files:
            out.append(RestartFile(CKPT, f.rel, "state"))
            d = self._content(store, f, blobs)
            if d:
                out.append(d)
            if blobs is not None and f.kind == "zip":
                md = self.ckpt.state.zip_metadata(f)
                for s in md.get("sstFiles", []) + md.get("logFiles", []):
                    ssts[s.get("dfsSstFileName") or s.get("dfsLogFileName")] = s.get("sizeBytes")
        for name, size in ssts.items():
            rel = store.ssts.get(name)
            if rel is None:
                continue  # the exact check already reported it
            out.append(RestartFile(CKPT, rel, "state"))
            info = L.get(rel)
            if info is not None and isinstance(size, int) and info.size != size:
                out.append(Damage(CKPT, rel, L.url(rel), "state", TORN, "state-file-damaged",
                                  f"is {info.size} bytes but the RocksDB checkpoint zip that names it records {size}: "
                                  "RocksDB fails to open it", "restore it from a backup, or roll back to an earlier batch"))
        return out

    def _read_state(self, files: list[StateFile]) -> dict[str, bytes | None]:
        L = self.ckpt.listing
        paths = [L.abs(f.rel) for f in files] + [L.abs(s) for f in files for s in f.sidecars]
        self._read_errors: dict[str, OSError] = {}
        return L.fm.read_many(paths, errors=self._read_errors)

    def _content(self, store: Store, f: StateFile, blobs: dict | None) -> Damage | None:
        """What is wrong with one state file: from the listing, and from its bytes when read."""
        L = self.ckpt.listing
        url = L.url(f.rel)
        info = L.get(f.rel)

        def bad(kind: str, problem: str) -> Damage:
            return Damage(CKPT, f.rel, url, "state", kind, "state-file-damaged", problem,
                          "restore it from a backup, or roll back to a batch before the damage")

        if info is not None and info.error is not None:
            return bad(UNREADABLE, unreadable(url, info.error).problem)
        if info is not None and info.size == 0:
            return bad(TORN, "is empty (0 bytes): Spark fails to load the state from it")
        # RocksDB reads its files through Hadoop's FileSystem API, which checks their sidecars; the HDFS store does
        # not (its load, like the logs', restarts over a stale one: tests/test_stale_crc_spark.py)
        checked = self.ckpt.state.provider != "hdfs"
        for rel in f.sidecars if checked else ():
            name = rel.rsplit("/", 1)[-1]
            side = L.get(rel)
            if name == hadoop_crc_name(f.name) and side is not None and info is not None \
                    and side.size != hadoop_crc_size(info.size):
                return bad(STALE, f"its checksum sidecar {name} does not match it: Spark's load of the state fails "
                                  "with ChecksumException (delete the sidecar if the file is right)")
        if blobs is None:
            return None
        data = blobs.get(L.abs(f.rel))
        if data is None:
            e = getattr(self, "_read_errors", {}).get(L.abs(f.rel))
            return bad(UNREADABLE, unreadable(url, e).problem) if e else bad(MISSING, "vanished while being read")
        problem = state_bytes_problem(f, data, self.ckpt.state.codec)
        if problem:
            return bad(FUTURE if problem.startswith("is from a newer") else TORN if "truncated" in problem
                       else UNREADABLE, problem)
        for rel in f.sidecars:
            name = rel.rsplit("/", 1)[-1]
            side = blobs.get(L.abs(rel))
            if side is None:
                continue
            if checked and name == hadoop_crc_name(f.name) and not hadoop_crc_matches(data, side):
                return bad(STALE, f"its checksum sidecar {name} does not match its content: Spark's load of the "
                                  "state fails with ChecksumException")
            if name == f"{f.name}.crc" and not spark_checksum_matches(data, side):
                return bad(STALE, f"its Spark checksum file {name} does not match its content: Spark fails "
                                  "verifying it when the state loads")
        return None


def _operator_damage(p: FileProblem) -> Damage:
    """An operator metadata or state schema file of the restart set that is missing, damaged or purged."""
    if p.kind == "purged":
        return Damage(CKPT, p.rel, p.path, p.role, PURGED, "purged", p.problem,
                      "choose a later batch (see `checkpoint-ops inspect`); an older backup reaches further")
    noun = "operator-metadata" if p.role == OPERATOR_METADATA else "state-schema"
    kind = _LOG_KINDS.get(p.kind, UNREADABLE)
    if p.rel.endswith("/_metadata/schema"):
        fix = "restore it from a backup (Spark wrote it when the query first ran: every batch's restart reads it)"
    else:
        fix = "restore it from a backup, or roll back to a batch before the query run that wrote it"
    return Damage(CKPT, p.rel, p.path, p.role, kind, f"{noun}-missing" if kind == MISSING else f"{noun}-damaged",
                  p.problem, fix)


# Batches the log purge may trail the state cleanup by. Spark 4.3 purges offsets and commits
# asynchronously by default (spark.sql.streaming.asyncLogPurge.enabled) and skips a batch's purge while the
# previous one still runs (AsyncLogPurge.purgeAsync: "Skipped log purging since there is already one in
# progress"), so a query stopped then keeps a log file or two below what its state cleanup allows.
PURGE_LAG_ALLOWED = 2


def _oldest_logged_batch(offset_batches, commit_batches) -> int | None:
    """The oldest batch Spark's log purge left (None: no log file on disk): the higher of the oldest offsets
    and the oldest commits file. Spark purges both below one threshold; a rollback to T restores
    ``offsets/T-1`` (and ``offsets/T``, ``commits/T``) from the batch ledger when Spark purged them, so the
    oldest offsets file alone can sit one batch below what Spark's purge left."""
    oldest = [min(batches) for batches in (offset_batches, commit_batches) if batches]
    return max(oldest, default=None)


def _snapshots_at_consecutive_versions(store: Store) -> bool:
    """Whether a store holds HDFS snapshots at two consecutive versions: what Spark writes only with
    ``minDeltasForSnapshot=0`` (a snapshot at every maintenance pass that finds a new version)."""
    versions = sorted(f.version for f in store.files if f.kind == "snapshot")
    return any(b - a == 1 for a, b in zip(versions, versions[1:]))


def _cleanup_could_leave(store: Store, lowest: int, oldest_logged: int | None = None,
                         snapshots_every_version: bool = False) -> bool:
    """Whether Spark's state cleanup can leave ``lowest`` as a store's oldest version: it keeps the
    snapshot (HDFS) or zip (RocksDB) the oldest retained version loads from, or everything from 1.

    HDFS also leaves deltas below the snapshot it keeps. Its cleanup lists one file per version, the
    snapshot where a version has both (``fetchFiles``), and deletes every listed version below the kept
    snapshot: each snapshot it deletes leaves that version's delta behind until the next cleanup (seen
    in Spark 4.3's own runs: ``18.delta 21.delta 21.snapshot ...``). A snapshot is written only after
    more than ``minDeltasForSnapshot`` deltas (default 10), so such leftovers are not of consecutive
    versions; consecutive deltas below the oldest snapshot mean a snapshot was deleted by someone else,
    or a cleanup stopped part-way (it deletes in ascending order), or ``minDeltasForSnapshot=0``: Spark
    then snapshots every version a maintenance pass finds, and one cleanup can delete snapshots at
    consecutive versions. ``snapshots_every_version`` (some store of the operator holds snapshots at
    consecutive versions, which shows that setting) accepts consecutive leftovers; without that sign the
    window-cut warning can still say more than is known (a review's real runs: 2 of 10 stops with
    ``minDeltasForSnapshot=0``, both with the sign).

    The snapshot cleanup keeps is the newest at or below (latest version - minBatchesToRetain), and the
    offsets and commits purge keeps the batches from (latest batch - minBatchesToRetain): so the kept
    snapshot is at most ``oldest_logged`` (the oldest batch the purge left, ``_oldest_logged_batch``) + 1,
    give or take ``PURGE_LAG_ALLOWED`` purges skipped. An oldest snapshot above that was not chosen by
    Spark's cleanup: what was deleted below it was deleted by someone else. Within the allowance a hand
    deletion reads as retention; the window ends at the same batch either way."""
    if lowest <= 1 or any(f.version == lowest and f.kind in ("snapshot", "zip") for f in store.files):
        return True
    snapshots = [f.version for f in store.files if f.kind == "snapshot"]
    if not snapshots:
        return False
    if oldest_logged is not None and min(snapshots) > oldest_logged + 1 + PURGE_LAG_ALLOWED:
        return False
    if snapshots_every_version:
        return True
    below = sorted({f.version for f in store.files if f.version < min(snapshots)})
    return all(b - a > 1 for a, b in zip(below, below[1:]))


def state_bytes_problem(f: StateFile, data: bytes, codec: str) -> str | None:
    """Whether a state file's bytes can be loaded at all: framing, zip structure, format version."""
    if not data:
        return "is empty (0 bytes): Spark fails to load the state from it"
    if f.kind == "zip":
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                md = z.read("metadata")
        except KeyError:
            return "is a zip without the RocksDB 'metadata' entry"
        except (zipfile.BadZipFile, EOFError, ValueError, OSError):
            return "is not a readable zip (truncated or corrupt): RocksDB cannot restore from it"
        head = md.split(b"\n", 1)[0].strip()
        if not head.startswith(b"v") or not head[1:].isdigit():
            return "has RocksDB zip metadata without a version line"
        if int(head[1:]) > 1:
            return f"is from a newer Spark (RocksDB checkpoint metadata {head.decode()}, this tool reads v1)"
        return None
    lz4 = (codec or "lz4").lower()
    if not (lz4 == "lz4" or lz4.endswith("lz4compressioncodec")):
        return None  # other codecs: checked by size only
    problem = lz4_stream_problem(data)
    if problem:
        return problem
    if f.kind == "changelog":
        try:
            version, _ = changelog_header(decompress_prefix(data, codec, 4096))
        except (CodecError, ValueError):
            return "has an unreadable changelog header"
        if version > _MAX_CHANGELOG_VERSION:
            return f"is from a newer Spark (changelog format v{version}, Spark 4.3 writes up to v4)"
    return None


def lz4_stream_problem(data: bytes) -> str | None:
    """Walk lz4-java ``LZ4BlockOutputStream`` frames without decompressing; None if whole."""
    pos, n = 0, len(data)
    header = len(LZ4_MAGIC) + 13
    while True:
        if pos == n:
            return "is truncated: the compressed stream has no end-of-stream block"
        if n - pos < header:
            return "is truncated inside a block header"
        if data[pos:pos + 8] != LZ4_MAGIC:
            return "is not an lz4-java block stream (no 'LZ4Block' magic where a block should start)"
        clen, dlen = struct.unpack_from("<ii", data, pos + 9)
        method = data[pos + 8] & 0xF0
        if method not in (0x10, 0x20) or clen < 0 or dlen < 0:
            return "has a corrupt LZ4 block header"
        pos += header
        if dlen == 0 and clen == 0:
            return None  # the end-of-stream block
        if n - pos < clen:
            return "is truncated inside a compressed block"
        pos += clen


def restart_set(ckpt: Checkpoint, batch: int, sinks: list[SinkOutput] = (), ledger=None,
                deep: bool = True) -> RestartSet:
    """The files Spark reads to restart after ``batch``, and what is wrong with them."""
    return RestartSets(ckpt, sinks, ledger, deep).of(batch)


def damage_in_removed(ckpt: Checkpoint, sinks: list[SinkOutput], plan, target: int) -> list[str]:
    """Plan warnings for damaged files an operation removes anyway (a repair). Torn writes happen to the
    newest file of a directory: its size and content are judged (a stale Hadoop checksum sidecar of a log file is
    no damage: Spark does not check it, see fsck's ``stale-crc``). The other removed files
    are judged from the listing where it knows their sizes (object stores); on local disk that would cost
    a ``stat`` of every removed file for a warning about a file being deleted anyway, so it is not made."""
    listings = {CKPT: ckpt.listing, **{f"sink{i}": s.listing for i, s in enumerate(sinks)}}
    out = []
    # the removed files of each directory, by name: one pass over the plan, then each directory's names
    by_dir: dict[tuple[str, str, str], list[str]] = {}
    for a in plan.actions:
        if a.kind != "delete" or a.phase not in _JUDGED_PHASES or a.root not in listings \
                or a.reason.startswith("checksum sidecars"):
            continue
        parent, _, name = a.rel.rpartition("/")
        names = by_dir.get(key := (a.root, parent, a.phase))
        if names is None:
            names = by_dir[key] = []
        names.append(name)
    newest: dict[tuple[str, str, bool], tuple[int, list[str]]] = {}
    for (root, parent, phase), names in by_dir.items():
        prefix = f"{parent}/" if parent else ""
        for name in names:
            head = name.split(".", 1)[0].split("_", 1)[0]
            if not head.isdecimal() or name.startswith("."):
                continue
            bid = int(head)
            cur = newest.get(key := (root, parent, phase == "state"))
            if cur is None or bid > cur[0]:
                newest[key] = (bid, [prefix + name])
            elif bid == cur[0]:
                cur[1].append(prefix + name)
    judged_whole = {(root, rel) for (root, _, _), (_, rels) in newest.items() for rel in rels}
    damaged = set()
    for (root, parent, phase), names in by_dir.items():
        listing = listings[root]
        files = listing.files
        prefix = f"{parent}/" if parent else ""
        for name in names:
            rel = prefix + name
            info = files.get(rel)
            if info is None or (info.known_size is None and (root, rel) not in judged_whole):
                continue
            d = None
            if info.error is not None:
                d = f"{rel} is unreadable ({info.error.strerror or info.error})"
            elif info.size == 0:
                d = f"{rel} is torn (0 bytes)"
            if d:
                out.append(d)
                damaged.add((root, rel))
    for key, (bid, rels) in list(newest.items()):  # a file found damaged above is not read for its content
        kept = [rel for rel in rels if (key[0], rel) not in damaged]
        if kept:
            newest[key] = (bid, kept)
        else:
            del newest[key]
    parsers = {"offsets": ckpt.load_offsets, "commits": ckpt.load_commits}
    stores = {s.rel_dir: s for s in ckpt.state.stores()} if any(k[2] for k in newest) else {}
    state_files = {f.rel: f for (root, parent, is_state) in newest if is_state and root == CKPT and parent in stores
                   for f in stores[parent].files}
    newest_state = [rel for (root, _, is_state), (_, rels) in newest.items() if is_state for rel in rels
                    if rel in state_files]
    if newest_state:
        blobs = ckpt.fm.read_many([ckpt.listing.abs(r) for r in newest_state], errors={})
        for rel in newest_state:
            data = blobs.get(ckpt.listing.abs(rel))
            problem = state_bytes_problem(state_files[rel], data, ckpt.state.codec) if data is not None else None
            if problem:
                kind = TORN if "truncated" in problem or "empty" in problem else UNREADABLE
                out.append(f"{rel} {_SUMMARY[kind]} ({problem.split(':')[0]})")
    for (root, parent, is_state), (b, rels) in newest.items():
        if is_state:
            continue
        rel = rels[0]
        errors: list = []
        if root == CKPT and parent in parsers:
            parsers[parent]([b], errors=errors)
        else:
            log = _log_for(ckpt, sinks, root, parent)
            if log is not None:
                try:
                    log.check(b)  # only whether it reads (a compact file can hold millions of entries)
                except LogFormatError as e:
                    errors.append(e)
        if errors:
            out.append(_log_damage(root, rel, parent, errors[0]).summary)
    return [f"{w}; it is removed with the batches after {target}" for w in out]


_JUDGED_PHASES = frozenset(("offsets", "commits", "source-log", "sink-log", "state"))


def _log_for(ckpt: Checkpoint, sinks: list[SinkOutput], root: str, rel_dir: str) -> CompactibleLog | None:
    if root == CKPT:
        for src in ckpt.sources.values():
            if src.log is not None and src.rel_dir == rel_dir:
                return src.log
        return None
    return sinks[int(root[4:])].log
