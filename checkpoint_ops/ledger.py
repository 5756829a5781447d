"""The batch ledger: what each batch read and wrote, kept after Spark compacts and purges its logs.

Spark keeps just enough log files to rebuild the batches it retains. Beyond that window (and for
batch-granular cleanup of old batches) only a record made earlier can say which files a batch
wrote: sink log entries carry no batch id, and a compact file merges every batch before it.

The ledger lives beside the checkpoint (``<parent>/.checkpoint-ops/<name>/ledger/``), never inside
Spark's folders. It is a sequence of immutable segment files, applied in name (= time) order:

* ``<time>-sync-<id>.jsonl``: one record per batch: the raw ``offsets/N`` and ``commits/N`` files,
  the source offsets, the state version and unique ids, and per sink the log entries batch N added
  (path, size, mtime, ...): what the batch wrote, kept when ``sink retain`` or ``sink compact
  --drop-missing`` drop entries from the log since (a sink log file rebuilt from it leaves out what the log
  no longer holds: ``Ledger.sink_log_files_at``);
* ``<time>-truncate-<op id>.json``: written by a rollback to N; records above N recorded before it
  belong to the abandoned timeline and are ignored. ``undo`` removes it. ``sync`` writes one too
  (``timeline-<id>``, no undo) when the checkpoint's ``offsets/`` show a timeline the ledger did not see
  begin (``diverged_at``).

Beside the segments, ``pairing/<time>-<id>.json`` records which file-sink outputs the checkpoint's query
writes (``PairingRecord``; the same record sits beside each sink log, see ``pairing.py``). They live in a
subdirectory so that releases before them, which read only the segments, still read the ledger.

**Segment indexes** (``.index/<segment>.idx``): where each line of a sync or merged segment starts, its
batch and which of offsets, commits and sink entries it holds, so that a load reads a few bytes per
batch, not every record (a ledger of a year of batches holds hundreds of MB). Written with the segment
(sync, merge), and for a segment that has none by the next ``sync`` that reads it. An optimisation only:
an index whose header does not name the segment as it is (name, size and mtime, as the verdict cache keys
its files), whose digest does not match, or that holds an entry no line of the segment can have, is
ignored and the segment read instead (so a segment changed in place is judged as without an index); a
record read through an index that is not the batch it should be is refused, naming the segment, and so
is a merge that meets a line that is not a record. Deleted with their segment.

**Merges in progress** (``.merging/<merged segment>.json``): the segments a merge replaces, written before
the merged segment and deleted after its inputs. A merge stopped between the two (a crash, a store that
gave up after its retries) leaves its inputs beside the merged segment: harmless to a load (records merge
idempotently), but the run stays longer than a run keeps, so every later sync would merge again. The next
compaction that sees the directory finishes such merges first: it deletes the inputs of each merged segment
that exists, and drops the intent of one that was never written.
"""

from __future__ import annotations

import array
import collections
import hashlib
import heapq
import json
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .errors import STORE_FAILURES, BadInputError, RefusedError
from .journal import ops_dir, utc_stamp
from .lease import guard_saying
from .model.checkpoint import Checkpoint
from .model.commits import CommitMetadata, parse_commit
from .model.compactible import CompactibleLog, LogEntry, all_valid_batches, is_compaction_batch
from .model.logfile import LogFormatError, parse_json_line
from .model.offsets import OffsetSeq, parse_offsets
from .model.sink import SinkOutput
from .storage import CheckpointFileManager
from .storage.checksums import hadoop_crc_target, is_hadoop_crc_name, sidecar_names
from .storage.paths import join

FORMAT = 1
MAX_SYNC_RUN = 8  # consecutive sync segments kept before they are merged into one
PAIRING_DIR = "pairing"
INDEX_DIR = ".index"  # <segment>.idx: each line's batch, offset and kinds (module docstring)
MERGING_DIR = ".merging"  # <merged segment>.json: the segments a merge replaces, until they are deleted
INDEX_FORMAT = 1


@dataclass(frozen=True)
class PairingRecord:
    """That the query of one checkpoint writes these file-sink outputs: kept in the checkpoint's ledger
    and beside each sink log, so either side alone still tells (``pairing.py`` judges them)."""

    checkpoint: str  # the checkpoint's URL
    query_id: str | None  # the ``id`` in its ``metadata`` when recorded
    sinks: tuple[str, ...]  # output URLs
    recorded_at: str  # UTC, as utc_stamp() writes it (a restore: when its backup was taken)
    by: str  # what recorded it: "ledger sync", "backup create", "backup restore", ...

    def to_dict(self) -> dict:
        return {"format": FORMAT, "checkpoint": self.checkpoint, "query_id": self.query_id, "sinks": list(self.sinks),
                "recorded_at": self.recorded_at, "by": self.by}

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def parse(cls, data: bytes, url: str) -> "PairingRecord":
        """The record in a pairing file; BadInputError (naming the file) if it is not one."""
        try:
            doc = json.loads(data)
            if doc.get("format", 0) > FORMAT:
                raise BadInputError(f"pairing record format {doc.get('format')} is newer than this tool understands",
                                    path=url, fix="use the spark-checkpoint-ops release that wrote it")
            sinks = doc["sinks"]
            if not isinstance(doc["checkpoint"], str) or not isinstance(sinks, list) or \
                    not all(isinstance(x, str) for x in sinks):
                raise TypeError
            return cls(doc["checkpoint"], doc.get("query_id"), tuple(sinks), str(doc.get("recorded_at", "")),
                       str(doc.get("by", "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise BadInputError("not a pairing record this tool writes (JSON naming a checkpoint and its sinks)",
                                path=url, fix="move it away: the pairing is then judged from the batch history "
                                "and recorded again by the next `checkpoint-ops ledger sync`") from None


_KINDS = {"offsets": 1, "commits": 2, "sinks": 4}
_MASK_BITS = 3
_SEG_BITS = 20  # up to a million segments; the rest of a position is the byte offset of the line


class LedgerRecords(Mapping):
    """The ledger's records by batch, read from the segments when asked for (memory: an index of a few
    dozen bytes per batch, whatever the records hold). Each batch's record is the merge of its lines in
    segment order, as ``Ledger.load`` always defined it."""

    def __init__(self, ledger: "Ledger", index: dict[int, int], more: dict[int, list[int]]):
        self._ledger = ledger
        self._index = index  # batch -> (byte offset << SEG_BITS | segment) << MASK_BITS | kinds
        self._more = more  # batch -> positions of its earlier lines, when it has several
        self._recent: collections.OrderedDict[int, dict] = collections.OrderedDict()

    def __getitem__(self, batch: int) -> dict:
        got = self._recent.get(batch)
        if got is not None:
            self._recent.move_to_end(batch)
            return got
        packed = self._index[batch]  # KeyError: not recorded
        rec: dict = {"batch": batch}
        for pos in self._more.get(batch, []) + [packed >> _MASK_BITS]:
            _merge(rec, self._ledger._read_line(pos & ((1 << _SEG_BITS) - 1), pos >> _SEG_BITS, batch))
        self._recent[batch] = rec
        if len(self._recent) > 256:
            self._recent.popitem(last=False)
        return rec

    def __iter__(self):
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, batch) -> bool:
        return batch in self._index

    def add_entries(self, seg: int, entries: "array.array") -> None:
        """Index segment ``seg`` from its entries (``_entries``), written after every segment indexed so far."""
        for b in _apply_entries(seg, entries, self._index, self._more):
            self._recent.pop(b, None)

    def kinds(self, batch: int) -> int:
        return self._index.get(batch, 0) & ((1 << _MASK_BITS) - 1)

    def first_last(self) -> tuple[int | None, int | None]:
        return (min(self._index), max(self._index)) if self._index else (None, None)


@dataclass
class Ledger:
    """Read lazily: a rollback that Spark's own files cover never lists the ledger. Segments are streamed
    and indexed, never held: a record is read from its segment when asked for (``LedgerRecords``)."""

    fm: CheckpointFileManager
    path: str
    _records: LedgerRecords | None = None
    segments: list[str] = field(default_factory=list)
    _pairings: list[PairingRecord] = field(default_factory=list)
    _handle: tuple | None = field(default=None, repr=False)  # (segment index, open reader) of _read_line
    writes_index: bool = False  # a load writes the index of each segment it had to read (``sync`` sets it)
    _live: dict = field(default_factory=dict, repr=False)  # id(log) -> (log, live paths): ``live_sink_paths``

    @classmethod
    def for_checkpoint(cls, ckpt: Checkpoint) -> "Ledger":
        return cls(ckpt.fm, join(ops_dir(ckpt.fm, ckpt.root), "ledger"))

    @property
    def loaded(self) -> bool:
        """Whether the segments were read (or indexed) yet: a caller that never needed them leaves them unread."""
        return self._records is not None

    @property
    def records(self) -> LedgerRecords:
        if self._records is None:
            self.load()
        return self._records

    # -- reading ---------------------------------------------------------------------------------
    def load(self) -> None:
        """Index every segment: from its stored index (``INDEX_DIR``), else reading it one line at a time
        (memory stays flat however many batches it holds)."""
        found_infos = self.fm.walk(self.path)
        found = [f.path[len(self.path) + 1:] for f in found_infos]
        names = sorted(r for r in found if "/" not in r and not r.startswith("."))
        names_set = set(names)
        pairing = sorted(r for r in found if r.startswith(PAIRING_DIR + "/") and "/" not in r[len(PAIRING_DIR) + 1:]
                         and not r.rsplit("/", 1)[-1].startswith("."))
        self.segments = names
        data = self.fm.read_many([join(self.path, r) for r in pairing])
        self._pairings = [PairingRecord.parse(data[join(self.path, r)], self.fm.url(join(self.path, r)))
                          for r in pairing if data.get(join(self.path, r)) is not None]
        stamps = {f.path[len(self.path) + 1:]: (f.size, f.mtime) for f in found_infos
                  if f.path[len(self.path) + 1:] in names_set}
        have = {r[len(INDEX_DIR) + 1:-len(".idx")] for r in found if r.startswith(INDEX_DIR + "/") and r.endswith(".idx")}
        stored = self._stored_indexes([n for n in names if n in have], stamps)
        index: dict[int, int] = {}
        more: dict[int, list[int]] = {}
        for seg, n in enumerate(names):
            try:
                if "-truncate-" in n:
                    after = json.loads(self.fm.read_bytes(join(self.path, n)))["after_batch"]
                    for b in [b for b in index if b > after]:
                        del index[b]
                        more.pop(b, None)
                    continue
                entries = stored.get(n)
                if entries is None:
                    entries = _entries(self._lines(n))
                    if self.writes_index:
                        self._save_index(n, stamps[n], entries)
                _apply_entries(seg, entries, index, more)
            except FileNotFoundError:
                continue  # merged away since the listing: its records are in the merged segment
            except (ValueError, KeyError, TypeError, AttributeError):
                raise BadInputError("batch ledger segment is not what this tool writes (not JSON lines of batch "
                                    "records)", path=self.fm.url(join(self.path, n)),
                                    fix="restore the ledger from a backup, or move this segment away (the ledger "
                                    "then forgets what it recorded)") from None
        self._close()
        self._records = LedgerRecords(self, index, more)

    def _segment_names(self) -> list[str]:
        return sorted(f.name for f in self.fm.list(self.path) if not f.is_dir and not f.name.startswith("."))

    def _close(self) -> None:
        if self._handle is not None:
            self._handle[1].close()
            self._handle = None

    def _lines(self, name: str):
        """(byte offset, line) of each non-empty line of a segment, streamed."""
        offset = 0
        with self.fm.open_read(join(self.path, name)) as f:
            for line in f:
                n = len(line)
                if line.strip():
                    yield offset, line
                offset += n

    def _read_line(self, seg: int, offset: int, batch: int | None = None) -> dict:
        """The record line at ``offset`` of segment ``seg`` (of ``batch``, when given: anything else is
        refused). The last segment read stays open: records asked for in batch order are neighbours, and a
        buffered reader seeks within what it holds."""
        handle = self._handle
        if handle is None or handle[0] != seg:
            if handle is not None:
                handle[1].close()
            self._handle = handle = (seg, self.fm.open_read(join(self.path, self.segments[seg])))
        f = handle[1]
        f.seek(offset)
        try:
            rec = json.loads(f.readline())
            if batch is not None and rec["batch"] != batch:
                raise ValueError
        except (ValueError, KeyError, TypeError):
            name = self.segments[seg]
            raise BadInputError(f"batch ledger segment does not hold the record of batch {batch} at byte {offset}, "
                                "where its index says it is (changed since it was written)",
                                path=self.fm.url(join(self.path, name)),
                                fix=f"delete {INDEX_DIR}/{name}.idx beside it (the segment is then read again); if "
                                "the segment itself is damaged, restore the ledger from a backup") from None
        return rec

    # -- segment indexes ---------------------------------------------------------------------------
    def _index_path(self, name: str) -> str:
        return join(self.path, INDEX_DIR, f"{name}.idx")

    def _stored_indexes(self, names: list[str], stamps: dict[str, tuple]) -> dict[str, "array.array"]:
        """The stored index of each of ``names`` (segments whose index is listed) that is whole and names
        the segment as it is now (by name, size and mtime: ``stamps``); the others are left out (their
        segments are read)."""
        if not names:
            return {}
        paths = {n: self._index_path(n) for n in names}
        data = self.fm.read_many(list(paths.values()), errors={})
        out = {}
        for n, path in paths.items():
            entries = _parse_index(data.get(path), n, stamps.get(n))
            if entries is not None:
                out[n] = entries
        return out

    def _save_index(self, name: str, stamp: tuple | None, entries: "array.array") -> None:
        """Write a segment's index for the segment as ``stamp`` (size, mtime) says it is; None: ask the store
        (one stat, or HEAD). Best effort: a ledger that cannot hold one, or a store that gave up after its
        retries, only means the segment is read whole next time."""
        try:
            if stamp is None:
                info = self.fm.info(join(self.path, name))
                stamp = (info.size, info.mtime) if info is not None else None
            if stamp is None or stamp[1] is None:
                return  # no mtime to name the segment by: it is read whole
            self.fm.write_bytes(self._index_path(name), _index_bytes(name, stamp, entries), overwrite=True)
        except (OSError, *STORE_FAILURES):
            pass

    @property
    def pairings(self) -> list[PairingRecord]:
        """Every pairing record, oldest first."""
        if self._records is None:
            self.load()
        return list(self._pairings)

    def pairing_records(self) -> list[PairingRecord]:
        """``pairings`` without reading the segments when they are not read yet: one listing of
        ``pairing/`` and its few small files (what a rollback without ``--sink`` asks)."""
        if self._records is not None:
            return list(self._pairings)
        base = join(self.path, PAIRING_DIR)
        found = [f.path[len(base) + 1:] for f in self.fm.walk(base)]  # one LIST on object stores, even when absent
        names = sorted(r for r in found if "/" not in r and not r.startswith("."))
        data = self.fm.read_many([join(base, n) for n in names])
        return [PairingRecord.parse(data[join(base, n)], self.fm.url(join(base, n)))
                for n in names if data.get(join(base, n)) is not None]

    def has(self, kind: str, batch: int) -> bool:
        return bool(self.records.kinds(batch) & _KINDS[kind])

    def batches(self, kind: str) -> list[int]:
        bit = _KINDS[kind]
        return sorted(b for b in self.records if self.records.kinds(b) & bit)

    def raw(self, kind: str, batch: int) -> bytes:
        return self.records[batch][kind].encode("utf-8")

    def offsets(self, batch: int) -> OffsetSeq:
        return parse_offsets(self.raw("offsets", batch), f"ledger:offsets/{batch}", batch)

    def commit(self, batch: int) -> CommitMetadata:
        return parse_commit(self.raw("commits", batch), f"ledger:commits/{batch}", batch)

    def sink_entries(self, sink: SinkOutput, batch: int) -> list[LogEntry] | None:
        rec = self.records.get(batch, {}).get("sinks", {}).get(sink.url)
        if rec is None:
            return None
        return [LogEntry(raw, json.loads(raw)) for raw in rec["entries"]]

    def has_sink_entries(self, sink: SinkOutput, batch: int) -> bool:
        """Whether the ledger recorded what ``batch`` wrote to this sink (without parsing the entries)."""
        if not self.records.kinds(batch) & _KINDS["sinks"]:
            return False
        return sink.url in self.records.get(batch, {}).get("sinks", {})

    def sink_log_files_at(self, sink: SinkOutput, t: int, history: bool = False) -> dict[int, list[LogEntry]] | None:
        """Contents of the sink log files a reader needs as of batch ``t`` that are gone from disk.

        A plain file is the batch's own entries that the log still holds as of its latest batch
        (``live_sink_paths``): a file sink only adds entries, so an entry of a batch up to ``t`` that the log no
        longer holds was dropped on purpose (``sink retain``, ``sink compact --drop-missing``, Spark's
        ``retention`` option), and the files left on disk were rewritten without it; a rebuilt file leaves it
        out the same way (else a rollback, or the window judged for one, would bring back what was dropped).
        ``history``: every entry the batch wrote, dropped since or not (``sink files --as-of-batch``).
        A compact file at c is everything live after c: a later compact on disk (or the latest state) minus
        what batches c+1.. added.
        """
        log = sink.log
        out: dict[int, list[LogEntry]] = {}
        for b in log.missing_for(t):
            if not is_compaction_batch(b, log.interval):
                entries = self.sink_entries(sink, b)
                if entries is None:
                    return None
                live = None if history else self.live_sink_paths(sink)
                out[b] = entries if live is None else [e for e in entries if e.path in live]
                continue
            later = [c for c in log.compact_ids if c > b and not log.missing_for(c)]
            base = min(later) if later else log.latest
            if base is None or log.missing_for(base):
                return None
            added: set[str] = set()
            for k in range(b + 1, base + 1):
                entries = self.sink_entries(sink, k)
                if entries is None:
                    return None
                added.update(e.path for e in entries)
            out[b] = [e for e in log.entries_after(base) if e.path not in added]
        return out

    def live_sink_paths(self, sink: SinkOutput) -> frozenset[str] | None:
        """The paths readers of the sink see as of its latest batch (Spark's ``allFiles()`` then), or None
        when the log cannot be read as of it (a gap, a damaged file: fsck names it). Computed once per log
        model (the files are read once by it, and the window asks for every batch it judges)."""
        log = sink.log
        cached = self._live.get(id(log))
        if cached is not None and cached[0] is log:
            return cached[1]
        live = None
        if log.latest is not None:
            try:
                entries = log.entries_after(log.latest)
            except LogFormatError:
                entries = None
            if entries is not None:
                deleted = {e.path for e in entries if e.doc.get("action") == "delete"}
                live = frozenset(e.path for e in entries if e.doc.get("action", "add") != "delete"
                                 and e.path not in deleted)
        self._live[id(log)] = (log, live)  # the log is held, so its id names no other log meanwhile
        return live

    def covers_sink(self, sink: SinkOutput, t: int) -> bool:
        return self.sink_log_files_at(sink, t) is not None

    # -- writing ---------------------------------------------------------------------------------
    def _write_segment(self, kind: str, body: bytes, suffix: str | None = None, names: list[str] | None = None) -> str:
        name = f"{self._stamp_after_segments(names)}-{kind}-{suffix or uuid.uuid4().hex[:8]}." \
               f"{'json' if kind == 'truncate' else 'jsonl'}"
        self.fm.write_bytes(join(self.path, name), body, overwrite=False)
        self._close()
        last = self.segments[-1] if self.segments else ""
        self.segments.append(name)
        entries = _entries(_body_lines(body)) if kind == "sync" else None
        if entries is not None:
            self._save_index(name, None, entries)
        if self._records is not None and entries is not None and name > last:
            # the new last segment: index its lines from the body just written, not every segment again
            self._records.add_entries(len(self.segments) - 1, entries)
        else:
            self._records = None  # indexed again when next asked (positions name segments by their order)
        return name

    def _stamp_after_segments(self, names: list[str] | None = None) -> str:
        """The time that names a new segment: now, or just after the newest segment's time when that is not
        earlier (a host whose clock was ahead wrote it). Segments apply in name order, so a new one (a
        truncation above all) must sort after every segment there: else a truncation would hide nothing,
        and a sync's records would sort before a truncation and be hidden by it."""
        now = utc_stamp()
        if names is None:  # ``names``: the segments as the caller just listed them
            names = self.segments if self._records is not None else self._segment_names()
        newest = max((n.split("-", 1)[0] for n in names), default="")
        return now if newest < now else _one_microsecond_after(newest)

    def record_pairing(self, record: PairingRecord) -> str:
        """Add a pairing record (immutable, like the segments); returns its path relative to the ledger."""
        rel = f"{PAIRING_DIR}/{utc_stamp()}-{uuid.uuid4().hex[:8]}.json"
        self.fm.write_bytes(join(self.path, rel), record.to_bytes(), overwrite=False)
        if self._records is not None:
            self._pairings.append(record)
        return rel

    def truncate(self, after_batch: int, op_id: str, names: list[str] | None = None) -> str:
        """Forget records above ``after_batch`` (written by a rollback; removed by its undo)."""
        body = json.dumps({"format": FORMAT, "after_batch": after_batch, "op_id": op_id}).encode()
        return self._write_segment("truncate", body, op_id, names)

    def _truncations(self, op_id: str) -> list[str]:
        return [f.name for f in self.fm.list(self.path) if f.name.endswith(f"-truncate-{op_id}.json")]

    def ensure_truncation(self, after_batch: int, op_id: str) -> None:
        """Idempotent ``truncate`` (a resumed rollback may or may not have written it); one listing."""
        names = sorted(f.name for f in self.fm.list(self.path) if not f.is_dir and not f.name.startswith("."))
        if not any(n.endswith(f"-truncate-{op_id}.json") for n in names):
            self.truncate(after_batch, op_id, names)

    def remove_truncation(self, op_id: str) -> None:
        for n in self._truncations(op_id):
            self.fm.delete(join(self.path, n))

    def compact_segments(self, max_run: int = MAX_SYNC_RUN) -> list[str]:
        """Keep the segment count small without rewriting the whole ledger: in each run of consecutive
        sync segments (truncations, kept so undo can remove them, split runs) longer than ``max_run``,
        merge the newest segments into one, so the file count grows with rollbacks, not with every sync.

        Which segments (``_to_merge``): the newest two, then each older one while it is no bigger than
        those taken so far together. Sizes then halve at least from one merged segment to the next older
        one, like a binary counter: a record is rewritten about log2(syncs) times in its life, and a run
        keeps at most ``max_run`` segments, of which about log2 are merged ones. (Merging the whole run each
        time rewrote every record every ``max_run`` syncs: a year of batches, read and written again.)

        The merged segment sorts where the last merged one was; it is written before the merged ones are
        deleted, and records merge idempotently, so a crash in between loses nothing; the merge's intent
        (``MERGING_DIR``, written first) lets the next compaction delete the inputs left behind, which would
        else keep the run too long and be merged again on every sync. The merged segments' checksum
        sidecars go with them, and so do sidecars whose segment is gone (an earlier release left them).
        Returns the names of the merged segments written."""
        if self._records is None:
            self.segments = self._segment_names()
        if not any(len(run) > max_run for run in _sync_runs(self.segments)):
            return []
        listing = self.fm.list(self.path)
        if any(f.is_dir and f.name == MERGING_DIR for f in listing) and self._finish_merges(listing):
            listing = self.fm.list(self.path)
            self.segments = sorted(f.name for f in listing if not f.is_dir and not f.name.startswith("."))
            self._close()
            self._records = None
        listed = {f.name: f for f in listing if not f.is_dir}
        written = []
        for run in _sync_runs(self.segments):
            if len(run) <= max_run:
                continue
            merge = _to_merge(run, {n: listed[n].size if n in listed else 0 for n in run})
            stamp = merge[-1].split("-", 1)[0]
            name = f"{stamp}-merged-{uuid.uuid4().hex[:8]}.jsonl"
            intent = join(self.path, MERGING_DIR, f"{name}.json")
            self.fm.write_bytes(intent, json.dumps({"format": FORMAT, "merged": name, "inputs": merge}).encode(),
                                overwrite=False)
            entries = array.array("q")
            offset = 0
            with self.fm.create_atomic(join(self.path, name), overwrite=False) as out:
                for batch, kinds, line in self._merged_lines(merge):
                    chunk = line if offset == 0 else b"\n" + line
                    entries.extend((batch, offset + len(chunk) - len(line), kinds))
                    out.write(chunk)
                    offset += len(chunk)
            self._save_index(name, None, entries)
            self._delete_segments(merge)
            self._delete_intent(intent)
            self.segments = sorted([n for n in self.segments if n not in merge] + [name])
            self._close()
            self._records = None
            written.append(name)
        # sidecars of segments gone before this release deleted them, stray indexes
        present = set(self.segments)  # as they are now, merged ones included
        self._delete_segments([], orphans=[
            *[n for n in listed if is_hadoop_crc_name(n) and hadoop_crc_target(n) not in listed],
            *[f"{INDEX_DIR}/{f.name}" for f in self.fm.list(join(self.path, INDEX_DIR))
              if not f.is_dir and _indexed_segment(f.name) not in present]])
        return written

    def _finish_merges(self, listing: list) -> bool:
        """Finish the merges that stopped after writing their intent (``MERGING_DIR``): delete the inputs
        still there of each merged segment that exists (its records hold theirs), and the intent; an intent
        whose merged segment was never written, or that is not one this tool writes, is only deleted (its
        inputs stay: nothing is lost, they are merged again). Returns whether any segment was deleted."""
        segments = {f.name for f in listing if not f.is_dir and not f.name.startswith(".")}
        deleted = False
        intents = [f for f in self.fm.list(join(self.path, MERGING_DIR)) if not f.is_dir]
        names = {f.name for f in intents}
        for f in intents:
            if f.name.startswith(".") or not f.name.endswith(".json"):  # a sidecar, or an intent never published
                if not is_hadoop_crc_name(f.name) or hadoop_crc_target(f.name) not in names:
                    self.fm.delete_many([f.path])
                continue
            merged = f.name[:-len(".json")]
            try:
                intent = json.loads(self.fm.read_bytes(f.path))
                inputs = intent["inputs"]
                if intent["merged"] != merged or not all(isinstance(n, str) for n in inputs):
                    raise ValueError
            except FileNotFoundError:
                continue  # finished by another pass since the listing
            except (ValueError, KeyError, TypeError):
                inputs = []
            stamp = merged.split("-", 1)[0]
            inputs = [n for n in inputs if n in segments and n != merged and "-truncate-" not in n
                      and n.split("-", 1)[0] <= stamp] if merged in segments else []
            if inputs:
                self._delete_segments(inputs)
                deleted = True
            self._delete_intent(f.path)
        return deleted

    def _delete_intent(self, path: str) -> None:
        parent, name = path.rsplit("/", 1)
        crc = self.fm.hadoop_crc
        self.fm.delete_many([join(parent, n) for n in sidecar_names(name) if crc or not n.startswith(".")] + [path])

    def _delete_segments(self, names: list[str], orphans: list[str] = ()) -> None:
        """Delete segments with their checksum sidecars and indexes (those first), and ``orphans`` (names
        relative to the ledger). Indexes go best effort: one left behind names a segment that is gone, and
        is never read (a segment's name is never used again)."""
        crc = self.fm.hadoop_crc
        sidecars = [n for seg in names for n in sidecar_names(seg) if crc or not n.startswith(".")]
        sidecars += [n for n in orphans if not n.startswith(INDEX_DIR + "/")]
        indexes = [f"{INDEX_DIR}/{n}" for seg in names for n in [f"{seg}.idx", *sidecar_names(f"{seg}.idx")]
                   if crc or not n.startswith(".")]
        indexes += [n for n in orphans if n.startswith(INDEX_DIR + "/")]
        if indexes:
            try:
                self.fm.delete_many([join(self.path, n) for n in indexes])
            except (OSError, *STORE_FAILURES):
                pass
        if sidecars:
            self.fm.delete_many([join(self.path, n) for n in sidecars])
        if names:
            self.fm.delete_many([join(self.path, n) for n in names])

    def _merged_lines(self, run: list[str]):
        """One line per batch, in batch order, merging the run's segments (each written in batch order)
        as they stream: memory holds one record per segment, not the run. Yields (batch, kinds, line)."""
        def records(seg: int, n: str):
            for offset, line in self._lines(n):
                try:
                    rec = json.loads(line)
                    if not isinstance(rec["batch"], int):
                        raise TypeError
                except (ValueError, KeyError, TypeError):
                    raise BadInputError(f"batch ledger segment is not what this tool writes (byte {offset} is not a "
                                        "JSON batch record): it cannot be merged",
                                        path=self.fm.url(join(self.path, n)),
                                        fix="restore the ledger from a backup, or move this segment away (the ledger "
                                        "then forgets what it recorded)") from None
                yield rec["batch"], seg, rec

        current: dict | None = None
        for b, _, rec in heapq.merge(*(records(i, n) for i, n in enumerate(run)), key=lambda t: (t[0], t[1])):
            if current is not None and current["batch"] != b:
                yield current["batch"], _kinds(current), json.dumps(current, separators=(",", ":")).encode()
                current = None
            if current is None:
                current = {"batch": b}
            _merge(current, rec)
        if current is not None:
            yield current["batch"], _kinds(current), json.dumps(current, separators=(",", ":")).encode()


def _one_microsecond_after(stamp: str) -> str:
    """``utc_stamp``'s form (``YYYYmmddTHHMMSS.ffffffZ``), one microsecond later."""
    from datetime import datetime, timedelta

    try:
        t = datetime.strptime(stamp, "%Y%m%dT%H%M%S.%fZ") + timedelta(microseconds=1)
    except ValueError:  # not a name this tool wrote: sort after it by appending to it
        return stamp + "0"
    return t.strftime("%Y%m%dT%H%M%S.%fZ")


def _sync_runs(segments: list[str]) -> list[list[str]]:
    """The runs of consecutive sync (and merged) segments: truncations, kept so undo can remove them, split them."""
    runs: list[list[str]] = [[]]
    for n in segments:
        if "-truncate-" in n:
            runs.append([])
        else:
            runs[-1].append(n)
    return runs


def _to_merge(run: list[str], sizes: dict[str, int]) -> list[str]:
    """The newest segments of ``run`` (oldest first) that ``compact_segments`` merges: the newest two, then
    each older one while it is no bigger than those taken so far together."""
    taken = run[-2:]
    total = sum(sizes[n] for n in taken)
    for n in reversed(run[:-2]):
        if sizes[n] > total:
            break
        taken.insert(0, n)
        total += sizes[n]
    return taken


def _indexed_segment(name: str) -> str:
    """The segment an entry of ``INDEX_DIR`` belongs to (``<segment>.idx``, or its ``.crc`` sidecar)."""
    if is_hadoop_crc_name(name):
        name = hadoop_crc_target(name)
    return name[:-len(".idx")] if name.endswith(".idx") else name


def _kinds(rec: dict) -> int:
    kinds = 0
    for k, bit in _KINDS.items():
        if rec.get(k) is not None:
            kinds |= bit
    return kinds


def _entries(lines) -> "array.array":
    """``batch, offset, kinds`` of each record line (``(byte offset, line)`` pairs), flat: 24 bytes a line."""
    out = array.array("q")
    for offset, line in lines:
        rec = json.loads(line)
        b = rec["batch"]
        if not isinstance(b, int):
            raise TypeError
        out.extend((b, offset, _kinds(rec)))
    return out


def _apply_entries(seg: int, entries: "array.array", index: dict[int, int], more: dict[int, list[int]]) -> list[int]:
    """Add the lines of segment number ``seg`` (``_entries``) to the index: each batch's newest line, its
    earlier ones in ``more``. Returns the batches the lines hold."""
    touched = []
    it = iter(entries)
    for b, offset, kinds in zip(it, it, it):
        prev = index.get(b)
        if prev is not None:
            more.setdefault(b, []).append(prev >> _MASK_BITS)
            kinds |= prev & ((1 << _MASK_BITS) - 1)
        index[b] = (((offset << _SEG_BITS) | seg) << _MASK_BITS) | kinds
        touched.append(b)
    return touched


def _index_bytes(name: str, stamp: tuple, entries: "array.array") -> bytes:
    """A segment's index: a JSON header naming the segment (name, size, mtime), the entry count and a digest,
    then the entries as little-endian 64-bit integers."""
    payload = _little_endian(entries).tobytes()
    header = {"format": INDEX_FORMAT, "segment": name, "size": stamp[0], "mtime": stamp[1],
              "count": len(entries) // 3, "sha256": hashlib.sha256(payload).hexdigest()}
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def _parse_index(data: bytes | None, name: str, stamp: tuple | None) -> "array.array | None":
    """The entries of a stored index if it is whole, names segment ``name`` as ``stamp`` (size, mtime) says it
    is, and every entry could be one of that segment's lines; else None."""
    if data is None or stamp is None or stamp[1] is None:
        return None
    head, sep, payload = data.partition(b"\n")
    try:
        header = json.loads(head)
        if not sep or header.get("format") != INDEX_FORMAT or header.get("segment") != name \
                or header.get("size") != stamp[0] or header.get("mtime") != stamp[1] \
                or len(payload) != 24 * header.get("count", -1) \
                or hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            return None
    except (ValueError, TypeError, AttributeError):
        return None
    entries = _little_endian(array.array("q", payload))
    if entries and (min(entries[0::3]) < 0 or min(entries[1::3]) < 0 or max(entries[1::3]) >= stamp[0]
                    or min(entries[2::3]) < 0 or max(entries[2::3]) > 7):
        return None  # a batch id, offset or kinds no line of this segment can have
    return entries


def _little_endian(entries: "array.array") -> "array.array":
    if sys.byteorder == "big":
        entries = array.array("q", entries)
        entries.byteswap()
    return entries


def _body_lines(body: bytes):
    """(byte offset, line) of each non-empty line of a segment's bytes, as ``Ledger._lines`` reads them."""
    offset = 0
    pieces = body.split(b"\n")
    for i, piece in enumerate(pieces):
        line = piece + b"\n" if i < len(pieces) - 1 else piece
        if line.strip():
            yield offset, line
        offset += len(line)


def _merge(into: dict, rec: dict) -> None:
    for k, v in rec.items():
        if k == "sinks":
            into.setdefault("sinks", {}).update(v)
        elif v is not None:
            into[k] = v


def sync(ckpt: Checkpoint | None, sinks: list[SinkOutput] = (), ledger: "Ledger | None" = None, *,
         assume_paired: bool = False, guard: Callable[[], None] | None = None) -> dict:
    """Record every batch Spark's files still describe and the ledger does not have yet.

    With a checkpoint, first the pairing of the checkpoint and its sinks (``pairing.record_pairing``): a
    sink that is not the query's output is refused (PairingRefused) before anything is recorded.
    Without a checkpoint (``ledger`` given) only the sinks' batches are recorded.

    A batch the ledger holds is not recorded again, unless the checkpoint's ``offsets/N`` now says
    something else than the ledger's record of N: the checkpoint then runs on another timeline (a backup
    restored where the original ran on, a query started again from scratch at the same place), and the
    ledger forgets its records from the first batch that differs (``diverged_at``) before recording what
    is there now; otherwise a later rollback would put the abandoned timeline's files back. A fenced
    checkpoint (an interrupted operation) is refused: its files are half-way between two states.

    ``guard`` (the leases' check, under ``ledger sync``) is called before each write: a sync whose lease
    lapsed while it read stops (``LeaseLost``) rather than record, beside the command that took the lease
    over (a rollback truncating the ledger), batches that command removes."""
    check = guard_saying(guard, "nothing half-done is kept: a segment is written whole or not at all, and records "
                         "merge idempotently; run the same command again")
    ledger = ledger or Ledger.for_checkpoint(ckpt)
    ledger.writes_index = True  # a writer: the index of a segment it has to read whole is kept for next time
    timeline = None
    if ckpt is not None:
        if ckpt.fence is not None:
            from .fence import recovery_advice

            raise RefusedError(f"an interrupted checkpoint-ops {ckpt.fence.operation} fenced this checkpoint: its "
                               "files are half-way through that operation, and recording them would keep batches it "
                               "removes", path=ckpt.url, fix=recovery_advice(ckpt.fence, ckpt.url)
                               + ", then run the same command again")
        timeline = diverged_at(ckpt, ledger)
        if timeline is not None:
            check()
            ledger.truncate(timeline.batch - 1, f"timeline-{uuid.uuid4().hex[:8]}")
    pairing = []
    if ckpt is not None and sinks:
        from .pairing import record_pairing  # pairing reads the ledger: imported here, not at the top

        check()
        pairing = record_pairing(ckpt, list(sinks), ledger, by="ledger sync", assume_paired=assume_paired)
    new: dict[int, dict] = {}

    def rec(b: int) -> dict:
        return new.setdefault(b, {"batch": b})

    damaged: list = []  # files Spark could not read either: never recorded, named in the result
    if ckpt is not None:
        L = ckpt.listing
        raw: dict[str, bytes] = {}
        # only what the ledger does not have yet is read: a sync reads what is new, not the whole log
        offsets = ckpt.load_offsets([b for b in ckpt.offset_files if not ledger.has("offsets", b)], raw=raw,
                                    errors=damaged)  # one read per file: the parsed and the raw form
        commits = ckpt.load_commits([b for b in ckpt.commit_files if not ledger.has("commits", b)], raw=raw,
                                    errors=damaged)
        need = [L.abs(f"offsets/{b}") for b in offsets if not ledger.has("offsets", b)]
        need += [L.abs(f"commits/{b}") for b in commits if not ledger.has("commits", b)]
        raw.update(ckpt.fm.read_many([p for p in need if p not in raw]))  # parsed earlier in this process
        for b, o in offsets.items():
            if not ledger.has("offsets", b):
                r = rec(b)
                r["offsets"] = raw[L.abs(f"offsets/{b}")].decode("utf-8")
                r["timestamp_ms"], r["watermark_ms"] = o.timestamp_ms, o.watermark_ms
                r["source_offsets"] = {s.source_id: s.value for s in o.offsets}
        for b, c in commits.items():
            if not ledger.has("commits", b):
                r = rec(b)
                r["commits"] = raw[L.abs(f"commits/{b}")].decode("utf-8")
                r["state"] = {"version": b + 1, "unique_ids": c.state_unique_ids}
    sink_counts = {}
    for sink in sinks:
        count = 0
        todo = [b for b in sink.log.files if not ledger.has_sink_entries(sink, b)]
        for b, entries in attribute_sink_batches(sink.log, damaged, batches=todo).items():
            if ledger.sink_entries(sink, b) is None:
                rec(b).setdefault("sinks", {})[sink.url] = {"entries": [e.raw for e in entries]}
                count += 1
        sink_counts[sink.url] = count
    segment = None
    known = [b for b in (*ledger.records.first_last(), *new) if b is not None]
    if new:
        body = "\n".join(json.dumps(new[b], separators=(",", ":")) for b in sorted(new)).encode()
        check()  # the reads before may have been long (every new file of a big checkpoint, on a slow store)
        segment = ledger._write_segment("sync", body)
        check()
        ledger.compact_segments()
    recorded = sorted(new)
    return {
        "ledger": ledger.fm.url(ledger.path),
        "segment": segment,
        "batches_recorded": len(recorded),
        "range": {"first": recorded[0], "last": recorded[-1]} if recorded else None,
        "sink_batches_recorded": sink_counts,
        "ledger_batches": {"first": min(known, default=None), "last": max(known, default=None)},
        "skipped": [{"path": e.path, "problem": e.problem} for e in {e.path: e for e in damaged}.values()],
        "pairing": [v.to_dict() for v in pairing],
        "forgot_from": timeline.to_dict() if timeline is not None else None,
    }


@dataclass(frozen=True)
class Divergence:
    """Where the ledger stops being this checkpoint's timeline: the first record not vouched for."""

    batch: int  # the first record forgotten
    path: str  # the offsets file that shows it: one that differs from the ledger's record, or the newest one
    # when the ledger holds offsets beyond it

    def to_dict(self) -> dict:
        return {"batch": self.batch, "offsets_file": self.path,
                "why": "the ledger's records from this batch on are not this checkpoint's timeline (a restore, or "
                       "a query started again here): offsets_file differs from the ledger's record of it, or is "
                       "the checkpoint's newest while the ledger holds offsets beyond it; they were forgotten"}


def diverged_at(ckpt: Checkpoint, ledger: "Ledger") -> Divergence | None:
    """Where the ledger's records stop being this checkpoint's timeline, or None.

    Each ``offsets/N`` names its batch's time and offsets, so two timelines never write the same bytes for
    a batch: the newest batch both hold is compared (one small read each, per sync); only when it differs
    is every batch both hold compared, oldest first, for the first that differs (or, when none agrees below
    it, the ledger's first record: older records cannot be compared any more). A file on disk that does
    not parse (torn, damaged) is no evidence either way and is passed over."""
    if ckpt.kind != "structured" or not ckpt.offset_files:
        return None
    common = []
    for b in sorted(ckpt.offset_files, reverse=True):  # the newest first: the ledger has all but the new ones
        if ledger.has("offsets", b):
            common.append(b)
            if len(common) == 1:
                if _same_offsets(ckpt, ledger, b) is not False:
                    return _ahead(ckpt, ledger)
    if not common:
        return None
    agreed = False  # a batch both hold the same below the first that differs: the timelines met there
    for b in reversed(common):
        same = _same_offsets(ckpt, ledger, b)
        if same:
            agreed = True
        elif same is False:
            # with no batch agreeing below it, nothing shows the two timelines ever met: none of the older
            # records (Spark purged what they could be compared with) is vouched for either
            first = ledger.records.first_last()[0]
            return Divergence(b if agreed or first is None else min(b, first),
                              ckpt.listing.url(ckpt.offset_files[b].rel))
    return _ahead(ckpt, ledger)


def _ahead(ckpt: Checkpoint, ledger: "Ledger") -> Divergence | None:
    """Offsets records above the checkpoint's newest ``offsets/`` file while no ``commits/`` file is above it
    either: a backup restored in place of one that ran on (a rollback hides what it removes behind its own
    truncation; a restart in continuous mode deletes uncommitted offsets files, whose records are no loss).
    A lost or deleted newest offsets file leaves its commit: those records are then this checkpoint's,
    and the ledger may be the only copy (fsck reports the damage)."""
    top = max(ckpt.offset_files)
    if ckpt.latest_commit is not None and ckpt.latest_commit > top:
        return None
    last = ledger.records.first_last()[1]
    if last is None or last <= top:
        return None
    if any(ledger.has("offsets", b) for b in range(top + 1, last + 1)):
        return Divergence(top + 1, ckpt.listing.url(ckpt.offset_files[top].rel))
    return None


def _same_offsets(ckpt: Checkpoint, ledger: "Ledger", batch: int) -> bool | None:
    """Whether ``offsets/batch`` on disk is the ledger's record of it (None: the file cannot tell)."""
    raw: dict[str, bytes] = {}
    if batch not in ckpt.load_offsets([batch], raw=raw, errors=[]):
        return None
    data = raw.get(ckpt.listing.abs(ckpt.offset_files[batch].rel))
    if data is None:
        data = ckpt.fm.read_bytes(ckpt.listing.abs(ckpt.offset_files[batch].rel))
    return data == ledger.raw("offsets", batch)


def attribute_batch(log: CompactibleLog, b: int) -> list[LogEntry] | None:
    """The entries batch ``b`` added, if Spark's files still tell (None if not). A plain file is
    exactly its batch's entries; a compact file's own batch added what it holds beyond the log state
    just before it, when that state can still be read. Raises LogFormatError on a damaged file."""
    f = log.files.get(b)
    if f is None:
        return None
    if not f.compact or b == 0:
        return log.read([b])[b]
    if log.missing_for(b - 1):
        return None
    # Spark's compaction writes the previous log state, in order, then this batch's entries: compare the
    # bytes of the two in blocks (fast, and memory stays flat however big the log); if they part (a
    # `retention` option filtered entries) fall back to comparing sets of paths.
    rest = log.common_prefix_rest(b, list(all_valid_batches(b - 1, log.interval)))
    if rest is None:
        before = {e.path for e in log.entries_after(b - 1)}
        return [e for e in log.read([b])[b] if e.path not in before]
    tail = []
    url = log.listing.url(log.rel(b))
    for line in rest.split(b"\n"):
        if not line:
            continue
        text = line.decode("utf-8", "replace")
        doc = parse_json_line(text, url, len(tail) + 2, last=False)
        if not isinstance(doc, dict):
            raise LogFormatError("a line is not a JSON object", path=url, kind="malformed")
        tail.append(LogEntry(text, doc))
    return tail


def attribute_sink_batches(log: CompactibleLog, damaged: list | None = None,
                           batches=None) -> dict[int, list[LogEntry]]:
    """Which entries each batch added (of ``batches``, by default all), for every batch Spark's files still
    let us tell. Batches whose files cannot be read are left out (and their errors added to ``damaged``,
    else raised)."""
    out: dict[int, list[LogEntry]] = {}
    for b in (log.files if batches is None else batches):
        try:
            got = attribute_batch(log, b)
        except LogFormatError as e:
            if damaged is None:
                raise
            damaged.append(e)
            continue
        if got is not None:
            out[b] = got
    return out


def ledger_or_none(ckpt: Checkpoint) -> "Ledger | None":
    """The checkpoint's batch ledger (read lazily, only if Spark's own files do not answer); None for a
    checkpoint at a bucket root, which has no place beside it for one."""
    try:
        return Ledger.for_checkpoint(ckpt)
    except BadInputError:
        return None


def ledger_at(fm: CheckpointFileManager, checkpoint_root: str) -> Ledger:
    """The ledger of a checkpoint, without loading it."""
    return Ledger(fm, join(ops_dir(fm, checkpoint_root), "ledger"))

