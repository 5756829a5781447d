"""Planning a rollback to batch N: everything that must change so Spark re-runs N+1 exactly.

Afterwards the last committed batch is N and Spark plans N+1 from ``offsets/N`` (reference §6):

* ``offsets/`` and ``commits/`` above N go, but for ``offsets/N+1`` of a **no-data batch** (the source
  offsets of batch N again: Spark ran it because the watermark moved on, and in append mode it emitted the
  windows that closed). Spark plans such a batch only within a run, never at a restart whose last batch
  is committed, so deleting it would lose its rows until new input arrives (for a finished source, for
  good). It stays planned and uncommitted, and Spark runs it again at restart with its recorded
  watermark (state, sink log and sink files above N are rolled back as for any batch above N). One Spark
  already purged is written back from the batch ledger, planned;
* each file-source log is trimmed to the log offset ``offsets/N`` records, rebuilding files Spark
  already compacted away from a later compact file (entries carry ``batchId``);
* state versions above N+1 go (a stale higher snapshot would be loaded later and silently give
  wrong state), with V2 ``<v>_<uuid>`` files, checksum files, operator metadata v2 and schema files
  above N, and SSTs that only deleted snapshots referenced;
* each file sink's ``_spark_metadata`` becomes exactly what it was after N (the sink skips batch ids
  it has logged, so leftovers silently drop re-run data), rebuilding compacted files when needed,
  and the data files batches above N wrote are deleted or moved to ``--keep-files``;
* leftover ``.tmp`` files and checksum sidecars of files that are gone are cleaned up.

``metadata`` (the query id) is kept. Nothing here writes: the result is a ``Plan``.
"""

from __future__ import annotations

import zipfile
from datetime import datetime
from typing import Iterator

from .errors import BadInputError, RefusedError, param, require_batch_number
from .fence import is_fence, parse_fence, recovery_advice
from .journal import load_journal, ops_dir, scan_journals
from .ledger import diverged_at, ledger_or_none
from .lag import SinkLag, sink_lag
from .pairing import LINED_UP, record_pairing_after, refuse_repeated, require_pairing, timing_alone_warning
from .recorded_sinks import RecordedSinksCheck
from .rerun_inputs import MAX_JUDGED, find_missing, input_urls, missing_warning, on_store
from .restart import Damage, RestartSets, damage_in_removed
from .activity import recent_commit_warning, refuse_if_active
from .executor import Anchor, AppliedOperation, JournalHooks, apply_plan, checkpoint_roots
from .model.checkpoint import Checkpoint, require_sink
from .model.compactible import (
    SPARK_DEFAULT_COMPACT_INTERVAL,
    CompactibleLog,
    LogEntry,
    all_valid_batches,
    infer_interval,
    is_compaction_batch,
    previous_compaction,
)
from .model.listing import Listing
from .model.logfile import LogFormatError
from .model.offsets import OffsetSeq
from .model.sink import SinkOutput
from .operation import ApplyContext, Operation, Site
from .plan import SIDECAR_PREFIX, WRITE, Plan
from .storage import open_file_manager
from .storage.checksums import hadoop_crc_name, hadoop_crc_target, is_hadoop_crc_name
from .units import iso_ms
from .window import rollback_window

CKPT = "checkpoint"


def no_data_next(ck: Checkpoint, t: int, ledger=None, purged: bool = False) -> tuple[OffsetSeq, OffsetSeq] | None:
    """(``offsets/N``, ``offsets/N+1``) if batch N+1 (``t + 1``) is a no-data batch (module docstring): its
    source offsets are batch N's. None if it is not, or if either cannot be read (then N+1 goes, as any batch
    above N). A rollback to N keeps it planned; a backup cut at N takes it (``backup/create.py``).
    ``purged``: ``offsets/N+1`` Spark purged is read from the batch ledger (a rollback to N restores it)."""
    on_disk = t + 1 in ck.offset_files
    if not (on_disk or (purged and ledger is not None)) or (t not in ck.offset_files and ledger is None):
        return None
    try:
        after = ck.offsets(t + 1) if on_disk else ledger.offsets(t + 1)
        before = ck.offsets(t) if t in ck.offset_files else ledger.offsets(t)
    except (LogFormatError, OSError, ValueError, KeyError):
        return None
    if before is None or after is None or not after.offsets:
        return None
    same = [(o.source_id, o.value) for o in after.offsets] == [(o.source_id, o.value) for o in before.offsets]
    return (before, after) if same else None


def no_data_note(t: int, before: OffsetSeq, after: OffsetSeq) -> str:
    """What keeping ``offsets/{t + 1}`` of a no-data batch means, for a plan's or a backup's summary."""
    return (f"offsets/{t + 1}: batch {t + 1} is a no-data batch (the source offsets of batch {t}; watermark "
            f"{_ms(before.watermark_ms)} -> {_ms(after.watermark_ms)}): it stays planned, and Spark runs it "
            "again at restart, emitting what its watermark closes")


def sidecars(listing: Listing, rel: str) -> list[str]:
    """Checksum files that accompany ``rel`` and exist."""
    parent, _, name = rel.rpartition("/")
    pre = f"{parent}/" if parent else ""
    cands = [hadoop_crc_name(name), f"{name}.crc", hadoop_crc_name(f"{name}.crc")]
    return [pre + c for c in cands if pre + c in listing]


class _Builder:
    def __init__(self, ckpt: Checkpoint, sinks: list[SinkOutput], target: int, keep_dir: str | None, ledger):
        self.ckpt = ckpt
        self.sinks = sinks
        self.target = target
        self.ledger = ledger
        self.from_ledger = False  # the plan writes or reads something only the batch ledger has
        roots = {CKPT: ckpt.url}
        for i, s in enumerate(sinks):
            roots[f"sink{i}"] = s.url
        self.plan = Plan("rollback", roots, target, keep_dir=keep_dir)
        self.deleted: dict[str, set[str]] = {rid: set() for rid in roots}
        self.written: dict[str, set[str]] = {rid: set() for rid in roots}

    # -- helpers -----------------------------------------------------------------------------
    def delete(self, root: str, listing: Listing, rel: str, reason: str, phase: str,
               known_sidecars: list[str] | None = None, size: int | None = None) -> None:
        gone, listed, plan = self.deleted[root], listing.files, self.plan
        for r in (rel, *(sidecars(listing, rel) if known_sidecars is None else known_sidecars)):
            info = listed.get(r)
            if info is None or r in gone:
                continue
            gone.add(r)
            # sizes only where they are known without a stat per file (object-store listings, sink logs)
            known = size if r == rel and size is not None else info.known_size
            plan.delete(root, r, reason if r == rel else SIDECAR_PREFIX + reason, phase, known)

    def write(self, root: str, listing: Listing, rel: str, content: bytes, reason: str) -> None:
        if rel in listing:
            self.delete(root, listing, rel, "replaced by a rebuilt file", "write")
        self.written[root].add(rel)
        self.plan.write(root, rel, content, reason)

    # -- components ----------------------------------------------------------------------------
    def logs(self) -> None:
        ck, t = self.ckpt, self.target
        L, C = ck.latest_offset, ck.latest_commit
        no_data = no_data_next(ck, t, self.ledger, purged=True)
        planned = no_data[1] if no_data is not None else None
        if no_data is not None:
            self.plan.summary["kept"] = no_data_note(t, no_data[0], planned)
            self.plan.summary["kept_planned"] = [f"offsets/{t + 1}"]
            if t + 1 not in ck.offset_files:  # Spark purged it: without it the rerun never emits that batch's rows
                self.from_ledger = True
                self.write(CKPT, ck.listing, f"offsets/{t + 1}", self.ledger.raw("offsets", t + 1),
                           f"offsets/{t + 1} of a no-data batch restored from the batch ledger (Spark purged it): "
                           "it stays planned")
        for b in ck.offset_files:
            if b > t and not (planned is not None and b == t + 1):
                self.delete(CKPT, ck.listing, f"offsets/{b}", f"offsets of batches after {t}", "offsets")
        for b in ck.commit_files:
            if b > t:
                self.delete(CKPT, ck.listing, f"commits/{b}", f"commits of batches after {t}", "commits")
        for kind, ids, b in (("offsets", ck.offset_files, t), ("offsets", ck.offset_files, t - 1),
                             ("commits", ck.commit_files, t)):
            if b >= 0 and b not in ids:  # purged by Spark: the ledger recorded it (checked before)
                self.from_ledger = True
                self.write(CKPT, ck.listing, f"{kind}/{b}", self.ledger.raw(kind, b),
                           f"{kind}/{b} restored from the batch ledger (Spark purged it)")
        self.plan.summary["last committed batch"] = f"{C} -> {t}" + (f" (latest planned was {L})" if L != C else "") \
            + (f"; batch {t + 1} stays planned" if planned is not None else "")

    def sources(self) -> None:
        ck, t = self.ckpt, self.target
        if t in ck.offset_files:
            offsets = ck.offsets(t)
        else:
            self.from_ledger = True
            offsets = self.ledger.offsets(t)
        for sid, src in ck.sources.items():
            if src.log is None:
                continue
            so = offsets.source(sid)
            if so is None:  # not a source of the query at batch t: not ours to trim
                self.plan.warnings.append(f"{src.rel_dir} is not a source in offsets/{t}; left unchanged")
                continue
            k = so.log_offset  # None when the source had no offset yet ("-"): its log empties
            log = src.log
            self._warn_missing_inputs(src.rel_dir, log, k)
            reason = f"file-source log entries selected after batch {t} (log offset > {k})"
            for b in log.batch_ids:
                if k is None or b > k:
                    self.delete(CKPT, ck.listing, log.rel(b), reason, "source-log")
            if k is not None:
                self._rebuild_source_log(log, k)
                self._check_readable(log, k, CKPT)
            before = log.latest
            self.plan.summary[f"source {sid}"] = f"log offset {before} -> {k}"

    def _warn_missing_inputs(self, rel_dir: str, log: CompactibleLog, k: int | None) -> None:
        """Warn when input files of the batches after log offset ``k`` are gone (``rerun_inputs``), listing them
        all in the summary. Bounded: the first ``MAX_JUDGED`` of them, and only the first when its files are on
        another store than the checkpoint."""
        first, latest = (0 if k is None else k + 1), log.latest
        if latest is None or latest < first:
            return
        judged = list(range(first, min(latest, first + MAX_JUDGED - 1) + 1))
        try:
            urls = input_urls(log, judged[:1])
            if urls and not on_store(self.ckpt.fm, urls[0]):
                return
            urls += input_urls(log, judged[1:])
        except (BadInputError, LogFormatError, OSError):
            return  # damage in what the rollback removes: damage_in_removed names it
        found = find_missing(self.ckpt.fm, urls)
        key = f"input files gone ({rel_dir})"
        warning = missing_warning(rel_dir, judged, latest - first + 1, found, key)
        if warning:
            self.plan.warnings.append(warning)
            self.plan.summary[key] = found.missing

    def _rebuild_source_log(self, log: CompactibleLog, k: int) -> None:
        c = previous_compaction(k, log.interval)
        needed = ([c] if c is not None else []) + list(range((c + 1) if c is not None else 0, k + 1))
        for b in needed:
            f = log.files.get(b)
            if f is not None and f.compact == is_compaction_batch(b, log.interval):
                continue
            donor = min(x for x in log.compact_ids if x >= b)  # reachability guarantees one exists
            entries = log.read([donor])[donor]
            if is_compaction_batch(b, log.interval):
                keep = [e for e in entries if _batch(e) <= b]
            else:
                keep = [e for e in entries if _batch(e) == b]
            self.write(CKPT, self.ckpt.listing, log.rel(b), CompactibleLog.serialize(keep),
                       f"rebuilt from {log.rel(donor)} (Spark compacted it away; entries carry batchId)")

    def state(self) -> None:
        ck, t = self.ckpt, self.target
        st = ck.state
        top = t + 1
        reason = (f"state versions above {top} (batch {t} committed version {top}); a stale higher version "
                  "would be loaded later")
        deleted_zips, kept_zips = [], {}
        count = 0
        for op in st.operators.values():
            for store in op.stores.values():
                for f in store.files:
                    if f.version > top:
                        self.delete(CKPT, ck.listing, f.rel, reason, "state", f.sidecars)
                        count += 1
                        if f.kind == "zip":
                            deleted_zips.append((store, f))
                    elif f.kind == "zip":
                        kept_zips.setdefault(id(store), []).append(f)
                for rel in store.orphan_sidecars:
                    self.delete(CKPT, ck.listing, rel, "checksum file whose state file is gone", "litter")
            for b, rel in op.metadata_v2.items():
                if b > t:
                    self.delete(CKPT, ck.listing, rel, f"operator metadata written by batches after {t}", "state")
            for _, b, rel in op.schema_files:
                if b > t:
                    self.delete(CKPT, ck.listing, rel, f"state schema written by batches after {t}", "state")
        # SSTs are shared between snapshots: drop only those no remaining snapshot references. A zip
        # we cannot read leaves its store's SSTs alone (Spark's maintenance deletes orphans later).
        used_by_store: dict[int, set[str] | None] = {}
        for store, z in deleted_zips:
            if id(store) not in used_by_store:
                used_by_store[id(store)] = _ssts_of(st, kept_zips.get(id(store), []))
            used, names = used_by_store[id(store)], _ssts_of(st, [z])
            if used is None or names is None:
                continue
            for name in names:
                rel = store.ssts.get(name)
                if rel and name not in used:
                    self.delete(CKPT, ck.listing, rel, "SST files only deleted snapshots referenced", "state")
        if st.operators:
            self.plan.summary["state"] = f"{count} state files above version {top} ({st.provider})"

    def litter(self) -> None:
        ck = self.ckpt
        for rel in ck.temp_files():
            self.delete(CKPT, ck.listing, rel, "leftover temporary file of an interrupted write", "litter")
        # the state stores' own orphans were found by the state scan; the rest of the checkpoint is checked
        # here, state/ included (operator metadata and schema folders, a store's SSTs/ and logs/)
        for d in [""] + [d for d in ck.listing.subdirs("") if d != "state"]:
            self._stale_sidecars(CKPT, ck.listing, d, recursive=bool(d))
        for d in _dirs_under(ck.listing, "state"):
            if d not in ck.state.store_dirs:
                self._stale_sidecars(CKPT, ck.listing, d, recursive=False)

    def _stale_sidecars(self, root: str, listing: Listing, under: str = "", recursive: bool = True) -> None:
        """Checksum sidecars whose file is gone (or is being rewritten where nothing regenerates
        them). From the listing alone; sidecars that disagree with a file we keep are fsck's call."""
        gone, written = self.deleted[root], self.written[root]
        if recursive:
            rels = [r for r, _ in listing.under(under) if r.endswith(".crc")]
        else:
            rels = [(f"{under}/" if under else "") + n for n in listing.files_in(under) if n.endswith(".crc")]
        for rel in rels:
            parent, _, name = rel.rpartition("/")
            if rel in gone or not is_hadoop_crc_name(name):
                continue
            target = (f"{parent}/" if parent else "") + hadoop_crc_target(name)
            if target in written:
                if not listing.fm.hadoop_crc:  # our write regenerates it only where Hadoop's .crc is kept
                    self.delete(root, listing, rel, "checksum sidecar of a rewritten file", "litter")
            elif target not in listing or target in gone:  # a temp file's too: one that is there goes with it
                self.delete(root, listing, rel, "checksum sidecar of a file that is gone", "litter")

    def sink(self, i: int, sink: SinkOutput, lag: SinkLag | None = None) -> None:
        rid, t, log, L = f"sink{i}", self.target, sink.log, sink.listing
        s = log.latest
        # committed batches the sink log lost: what they wrote is known only from the listing
        unlogged = [b for b in (lag.missing if lag is not None else ()) if b > t]
        if (s is None or s <= t) and not unlogged:
            self.plan.summary[rid] = f"latest batch {s}: nothing to roll back"
            return
        for b, rel in zip(lag.missing if lag is not None else (), lag.missing_rels if lag is not None else ()):
            if b > t:
                self.plan.warnings.append(
                    f"{rel} is missing: batch {b} was committed but the sink log has no entry for it (the sink is "
                    f"behind its checkpoint); the rollback re-runs it, and the data files no sink log entry lists as "
                    f"of batch {t} are taken from the listing")
        before = self._sink_entries_before(sink, s) if not unlogged else None
        after_entries = self._sink_entries_after(i, sink, t)
        after = {e.path for e in after_entries}
        for b in log.batch_ids:
            if b > t:
                self.delete(rid, L, log.rel(b), f"sink log of batches after {t} (the sink would skip re-run batches)",
                            "sink-log")
        self._check_readable(log, t, rid, sink)
        removed, nbytes, outside = 0, 0, []
        if before is None:  # what the removed batches wrote is unknown: take it from the listing
            kept_rels = [sink.rel_of(e) for e in after_entries]
            elsewhere = [e.path for e, rel in zip(after_entries, kept_rels) if rel is None]
            if elsewhere:  # the log names another place: every file here would look unlisted, and be deleted
                raise RefusedError(
                    f"the sink log lists {len(elsewhere)} files of the batches it keeps outside the output directory "
                    f"(e.g. {elsewhere[0]}): the output was copied or moved, and with the removed batches' log "
                    f"{'missing' if unlogged else 'damaged'} what they wrote would be taken from the listing, where "
                    "every file of the kept batches looks unlisted too; nothing was changed",
                    path=sink.url, fix="run the rollback against the output's original location")
            kept = {rel for rel in kept_rels if rel is not None}
            gone = [(rel, size) for rel, size in sink.data_files().items() if rel not in kept]
            reason = (f"data files no sink log entry lists as of batch {t} (the removed batches' log is "
                      f"{'missing' if unlogged else 'damaged'}, so what they wrote is taken from the listing)")
        else:
            gone = []
            for path, e in before.items():
                if path in after:
                    continue
                rel = sink.rel_of(e)
                if rel is None:
                    outside.append(path)
                elif rel in L:  # else already gone
                    gone.append((rel, int(e.doc.get("size") or 0)))  # the sink log records the size
            reason = f"data files batches after {t} wrote"
        for rel, size in gone:
            removed += 1
            nbytes += size
            if self.plan.keep_dir:
                self.plan.keep(rid, rel, reason, size)
                self.deleted[rid].add(rel)
                for sc in sidecars(L, rel):
                    self.delete(rid, L, sc, SIDECAR_PREFIX + reason, "sink-data")
            else:
                self.delete(rid, L, rel, reason, "sink-data", size=size)
        if outside:
            raise RefusedError(
                f"{len(outside)} files to remove are outside the output directory (e.g. {outside[0]}): the output "
                "was copied or moved, and this tool will not delete files elsewhere",
                path=sink.url,
                fix="run the rollback against the output's original location",
            )
        self._stale_sidecars(rid, L, "_spark_metadata")
        self.plan.summary[rid] = (f"batches {t + 1}..{s} removed from the sink log" if s > t else
                                  f"the sink log ends at batch {s}") + f": {removed} data files ({nbytes} bytes)" + \
            (f"; batches {unlogged[0]}..{unlogged[-1]} were committed without a sink log entry: reprocessing "
             "rewrites them" if unlogged else "")

    def _sink_entries_before(self, sink: SinkOutput, s: int) -> dict[str, LogEntry] | None:
        """What readers of the sink see now (the latest batch ``s``), to tell which data files the
        removed batches wrote; None if a log file the rollback removes is too damaged to say."""
        try:
            return {e.path: e for e in sink.log.entries_after(s)}
        except LogFormatError:
            return None  # damage_in_removed names the file in the plan's warnings

    def _sink_entries_after(self, i: int, sink: SinkOutput, t: int) -> list[LogEntry]:
        """The sink log's entries as of batch t, writing any file Spark already compacted away."""
        rid, log = f"sink{i}", sink.log
        missing = log.missing_for(t)
        if not missing:
            return log.entries_after(t)
        self.from_ledger = True
        files = self.ledger.sink_log_files_at(sink, t)  # reachability checked that the ledger covers it
        for b in missing:
            self.write(rid, sink.listing, log.rel(b), CompactibleLog.serialize(files[b]),
                       "sink log rebuilt from the batch ledger (Spark compacted it away)")
        return [e for b in all_valid_batches(t, log.interval) for e in
                (files[b] if b in missing else log.read([b])[b])]

    def _check_readable(self, log: CompactibleLog, upto: int, root: str, sink: SinkOutput | None = None) -> None:
        """After the change Spark derives the log's interval from the files left; with it, every
        file a reader of batch ``upto`` needs must be there under the right name. One compact file left
        can derive another interval than the one the log was written with (``19.compact`` alone gives 20
        with the default 10): the query's next compaction would then come at another batch, and a reader
        that derives the interval again after Spark's cleanup misses a compact file that was never written
        (readers and the restart fail). The compact file before it is then written too (``_keep_interval``),
        so the two latest give the interval, or the rollback is refused."""
        names, compacts = self._names_after(log, root)
        interval, how = infer_interval(compacts, log.default_interval)
        if interval != log.interval and compacts and self._keep_interval(log, compacts[-1], root, sink):
            names, compacts = self._names_after(log, root)
            interval, how = infer_interval(compacts, log.default_interval)
        if interval != log.interval and compacts and compacts[-1] - log.interval < 0:  # the log's first compact file
            raise RefusedError(
                f"after the rollback {log.rel_dir} would keep one compact file, {compacts[-1]}.compact, its first, "
                f"and Spark would derive compact interval {interval} from it ({how}), not {log.interval}, the interval "
                "the log was written with",
                path=log.listing.url(log.rel_dir),
                fix=f"pass the compactInterval the query runs with ({param('source_compact_interval')} / "
                    f"{param('sink_compact_interval')}): Spark derives the interval from it when one compact file is "
                    "left")
        if interval != log.interval and compacts:
            earlier = compacts[-1] - log.interval
            raise RefusedError(
                f"after the rollback {log.rel_dir} would keep one compact file, {compacts[-1]}.compact, and Spark "
                f"would derive compact interval {interval} from it ({how}), not {log.interval}, the interval the log "
                f"was written with: its next compaction would come at another batch, and readers and the restart "
                f"fail once Spark's cleanup leaves a compact file of one interval with the plain files of the other; "
                f"{earlier}.compact, which would keep the interval, cannot be rebuilt "
                + ("(Spark removed it, and the batch ledger does not cover it)" if sink is not None else
                   "(Spark removed it, and its entries carry no batchId)"),
                path=log.listing.url(log.rel_dir),
                fix=f"roll back to a batch from {compacts[-1] + log.interval} on, or to one before {compacts[-1]} that "
                    "is still reachable (`checkpoint-ops inspect` shows the rollback window); a batch ledger kept from "
                    "now on (`checkpoint-ops ledger sync --sink`, or the Dagster asset) lets later rollbacks rebuild it")
        missing = [log.rel(b, interval) for b in all_valid_batches(upto, interval) if log.rel(b, interval) not in names]
        if missing:
            raise RefusedError(
                f"after the rollback Spark would read {log.rel_dir} with compact interval {interval} ({how}) and "
                f"miss {missing[0]}",
                path=log.listing.url(log.rel_dir),
                fix="pass the compactInterval the query runs with "
                f"({param('source_compact_interval')} / {param('sink_compact_interval')}): Spark derives the "
                "interval from it when one compact file is left",
            )

    def _names_after(self, log: CompactibleLog, root: str) -> tuple[set[str], list[int]]:
        """The log's file names after the plan (kept and written), and its compact ids, ascending."""
        gone, new = self.deleted[root], self.written[root]
        prefix = log.rel_dir + "/"
        names = {f.rel for f in log.files.values() if f.rel not in gone} | {r for r in new if r.startswith(prefix)}
        return names, sorted(int(r[len(prefix):-len(".compact")]) for r in names if r.endswith(".compact"))

    def _keep_interval(self, log: CompactibleLog, last: int, root: str, sink: SinkOutput | None) -> bool:
        """Write the compact file one interval before ``last`` (the only one left), as Spark wrote it: a source
        log's from a later compact file on disk (its entries carry batchId), a sink log's from the batch ledger.
        False when it cannot be rebuilt."""
        earlier = last - log.interval
        if earlier < 0 or not is_compaction_batch(earlier, log.interval):
            return False
        rel = log.rel(earlier, log.interval)
        if sink is None:
            donors = [c for c in log.compact_ids if c >= earlier and log.rel(c, log.interval) in log.listing]
            if not donors:
                return False
            try:
                keep = [e for e in log.read([min(donors)])[min(donors)] if _batch(e) <= earlier]
            except (BadInputError, LogFormatError):
                return False
            why = f"rebuilt from {log.rel(min(donors))} (entries carry batchId)"
        else:
            if self.ledger is None:
                return False
            files = self.ledger.sink_log_files_at(sink, earlier)
            if files is None or earlier not in files:
                return False
            keep, why = files[earlier], "rebuilt from the batch ledger"
            self.from_ledger = True
        self.write(root, log.listing, rel, CompactibleLog.serialize(keep),
                   f"{why}: with {last}.compact alone Spark would derive another compact interval than "
                   f"{log.interval}, the one the log was written with")
        return True


def _dirs_under(listing: Listing, rel_dir: str) -> Iterator[str]:
    """``rel_dir`` and every directory below it in ``listing``, from the listing's index of folders (not
    a pass over its files)."""
    todo = [rel_dir] if listing.has_dir(rel_dir) else []
    while todo:
        d = todo.pop()
        yield d
        todo += [f"{d}/{sub}" for sub in listing.subdirs(d)]


def _ssts_of(st, zips) -> set[str] | None:
    """The SST and log files these RocksDB zips name, or None if one cannot be read."""
    out: set[str] = set()
    for z in zips:
        try:
            out.update(st.zip_ssts(z))
        except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError):
            return None
    return out


def _ms(ms: int | None) -> str:
    return iso_ms(ms) if ms is not None else "none"


def _batch(e: LogEntry) -> int:
    b = e.doc.get("batchId")
    if not isinstance(b, int):
        raise BadInputError(f"source log entry without batchId: {e.raw[:80]}")
    return b


def resolve_target(ckpt: Checkpoint, to_batch: int | None, to_time: datetime | None, ledger=None) -> int:
    """``to_batch``, or the last committed batch planned at or before ``to_time``: of those Spark keeps, and of
    those the batch ledger recorded (its copies of ``offsets/N`` and ``commits/N``, up to the last commit), so a
    time reaches as far back as a batch id does."""
    if (to_batch is None) == (to_time is None):
        raise BadInputError(f"give exactly one of {param('to_batch')} and {param('to_time')}")
    if to_batch is not None:
        return require_batch_number(to_batch, "to_batch")
    ms = int(to_time.timestamp() * 1000)
    kept = {b for b in ckpt.offset_files if b in ckpt.commit_files}
    last = ckpt.latest_commit
    recorded = set()
    if ledger is not None and last is not None:
        recorded = {b for b in ledger.batches("offsets") if b <= last and b not in ckpt.offset_files
                    and (b in ckpt.commit_files or ledger.has("commits", b))}
    committed = sorted(kept | recorded)
    if not committed:
        raise RefusedError("no committed batch with offsets on disk to choose from", path=ckpt.url)

    def planned_ms(batch: int) -> int:
        seq = ledger.offsets(batch) if batch in recorded else ckpt.offsets(batch)
        return seq.timestamp_ms or 0

    # batchTimestampMs grows with the batch id: binary search reads about log2(n) files.
    lo, hi, best = 0, len(committed) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if planned_ms(committed[mid]) <= ms:
            best, lo = committed[mid], mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise RefusedError(
            f"no retained committed batch started at or before {iso_ms(ms)} (the earliest retained"
            f"{' or recorded in the batch ledger' if recorded else ''}, batch {committed[0]}, started at "
            f"{iso_ms(planned_ms(committed[0]))})",
            path=ckpt.url,
            fix=f"pick a later time, or a {param('to_batch')} within the rollback window (`checkpoint-ops inspect` "
                "shows it)",
        )
    return best


def plan_rollback(
    ckpt: Checkpoint,
    to_batch: int | None = None,
    to_time: datetime | None = None,
    sinks: list[SinkOutput] = (),
    keep_files: str | None = None,
    ledger=None,
    force: bool = False,
    recorded_sinks: RecordedSinksCheck | None = None,
) -> Plan:
    """The complete plan for rolling ``ckpt`` (and its file sinks) back to one batch. With
    ``recorded_sinks``, an output the checkpoint's ledger records and ``sinks`` leave out is refused
    (``recorded_sinks.py``; a backup being restored, whose records name the original locations, has none)."""
    if ckpt.kind != "structured":
        raise BadInputError("rollback works on Structured Streaming checkpoints; this is a DStream checkpoint",
                            path=ckpt.url)
    if is_fence(ckpt.metadata_raw):
        fence = parse_fence(ckpt.metadata_raw)
        raise RefusedError(
            f"an earlier {fence.operation} ({fence.op_id}) was interrupted and the checkpoint is fenced",
            path=ckpt.listing.url("metadata"),
            fix=recovery_advice(fence, ckpt.url) + ", then run this rollback again",
        )
    sinks = list(sinks)
    _refuse_dirs_named_as_batches(ckpt, sinks)
    target = resolve_target(ckpt, to_batch, to_time, ledger)
    C = ckpt.latest_commit
    if C is None:
        problem, fix = ckpt.nothing_committed("roll back to")
        raise RefusedError(problem, path=ckpt.url, fix=fix)
    if target > C:
        raise RefusedError(f"batch {target} was never committed (the last committed batch is {C}"
                           f"{_last_operation(ckpt)})", path=ckpt.url, fix=f"choose a batch up to {C}")
    pairing_warnings = [timing_alone_warning(v) for v in require_pairing(ckpt, sinks, ledger) if v.status == LINED_UP]
    left_out_warnings = recorded_sinks.check(ckpt, sinks, ledger, target) if recorded_sinks is not None else []
    lags = [sink_lag(ckpt, s) for s in sinks]  # against the checkpoint's own commits (the ledger stays unread)
    for s, lag in zip(sinks, lags):
        if s.log.latest is not None and target > s.log.latest:
            back = lag.rollback_target
            raise RefusedError(
                f"the sink log of {s.url} ends at batch {s.log.latest}: after a rollback to {target}, batches "
                f"{s.log.latest + 1}..{target} would stay committed without their rows in the sink, and the query "
                "would not write them again",
                path=s.listing.url(s.log.rel(s.log.latest + 1)),
                fix=(f"roll back to the last batch the sink has: `checkpoint-ops rollback {ckpt.url} --to-batch {back} "
                     f"--sink {s.url}`, then reprocess" if back is not None else "restore from a backup"),
            )
    warnings = check_restart_set(ckpt, target, sinks, ledger, force=force, what="roll back to")
    b = _Builder(ckpt, sinks, target, keep_files, ledger)
    b.plan.warnings += pairing_warnings + warnings + left_out_warnings
    b.logs()
    b.sources()
    b.state()
    for i, (s, lag) in enumerate(zip(sinks, lags)):
        b.sink(i, s, lag)
    b.litter()
    b.plan.warnings += damage_in_removed(ckpt, sinks, b.plan, target)
    if b.from_ledger:  # else the plan took everything from Spark's own files
        # a purged no-data batch N+1 written back from the ledger is one of its records too
        upto = target + 1 if any(a.rel == f"offsets/{target + 1}" and a.kind == WRITE for a in b.plan.actions) \
            else target
        _refuse_another_timelines_records(ckpt, ledger, upto)
    return b.plan


def _refuse_dirs_named_as_batches(ckpt: Checkpoint, sinks: list[SinkOutput] = ()) -> None:
    """Refuse (bad input, nothing changed) a directory named as a batch in a log Spark lists by batch
    (``offsets/32``, ``commits/32``, ``sources/0/32``, ``<output>/_spark_metadata/40``; or an object store's marker
    ``offsets/32/``): Spark lists it as that batch's file and fails to read it or, once a rerun reaches that batch,
    to write it (CONCURRENT_STREAM_LOG_UPDATE). A rollback left it, reporting success."""
    logs = [(ckpt.listing, ckpt.offset_files), (ckpt.listing, ckpt.commit_files)]
    logs += [(ckpt.listing, src.log.files) for src in ckpt.sources.values() if src.log is not None]
    logs += [(s.listing, s.log.files) for s in sinks]
    ckpt.refuse_misnamed(sinks, "the rollback is refused, nothing was changed")
    for listing, files in logs:  # ``log_files`` lists a directory named as a batch, as Spark does
        named = [f.rel for f in files.values() if f.info.is_dir]
        if named:
            raise BadInputError(
                f"{named[0]} is a directory where Spark expects a batch file"
                f"{' (and more)' if len(named) > 1 else ''}: Spark lists it as a batch file and fails to read it, "
                "or to write that batch when a rerun reaches it; a rollback would leave it. Nothing was changed",
                path=listing.url(named[0]),
                fix="move the directory out of the checkpoint or output (keep a copy), then run `checkpoint-ops fsck` "
                    "and the rollback again")


def _refuse_another_timelines_records(ckpt: Checkpoint, ledger, upto: int) -> None:
    """A plan that takes files from the batch ledger (Spark purged what the target needs) is refused when
    the ledger's records of the batches up to ``upto`` it may take (the target's, and a purged no-data batch
    after it) are of another timeline (``ledger.diverged_at``: a backup restored where another ran, a query
    started again here, and no ``ledger sync`` since): restoring them would put that timeline's files back."""
    gone = diverged_at(ckpt, ledger)
    if gone is not None and gone.batch <= upto:
        raise RefusedError(
            f"the batch ledger's records from batch {gone.batch} on are not this checkpoint's: "
            f"{gone.path} is not the file the ledger recorded (a restore where another "
            "checkpoint ran, or a query started again at this place), and the rollback would restore files "
            "from them", path=gone.path,
            fix=f"run `checkpoint-ops ledger sync {ckpt.url}` (it forgets those records), then roll back to a batch "
                "the checkpoint or the ledger still holds (`checkpoint-ops inspect` shows the window)")


def _last_operation(ckpt: Checkpoint) -> str:
    """", since <operation> <op id> at <time>" when a journaled operation was the last to change the
    checkpoint (say, another rollback that went first)."""
    try:
        journals = scan_journals(ckpt.fm, ops_dir(ckpt.fm, ckpt.root))
    except BadInputError:
        return ""
    for path, markers in reversed(journals.items()):
        if "applied" in markers and not markers & {"undone", "abandoned"}:
            j = load_journal(ckpt.fm, path)
            target = j.record["plan"].get("target_batch")
            return (f", since {j.record['operation']} {j.op_id}" + (f" to batch {target}" if target is not None else "")
                    + f" at {j.record['created']}")
    return ""


class RestartSetDamaged(BadInputError):
    """A file Spark needs to restart after the target batch is damaged (exit 2)."""

    def __init__(self, target: int, damage: list[Damage], what: str):
        self.damage = damage
        first = damage[0]
        more = f" (and {len(damage) - 1} more: {', '.join(d.rel for d in damage[1:4])}" + \
               (", ..." if len(damage) > 4 else "") + ")" if len(damage) > 1 else ""
        super().__init__(
            f"cannot {what} batch {target}: Spark's restart after batch {target} reads {first.rel}, which "
            f"{first.summary.split(' ', 1)[1]}: {first.problem}{more}",
            path=first.url,
            fix=first.fix,
        )

    def to_dict(self) -> dict:
        return {**super().to_dict(), "damage": [d.to_dict() for d in self.damage]}


def check_restart_set(ckpt: Checkpoint, target: int, sinks: list[SinkOutput], ledger, *, force: bool = False,
                      what: str = "roll back to") -> list[str]:
    """Refuse unless Spark can restart after ``target`` from what is there: damage in its restart set
    is unusable input (exit 2); files Spark's retention purged put it out of reach (exit 1, naming the
    earliest reachable batch). Returns warnings (a missing ``metadata`` accepted with ``force``)."""
    rs = RestartSets(ckpt, sinks, ledger, deep=True).of(target)
    warnings = []
    broken = rs.broken
    if force:
        accepted = [d for d in broken if d.code == "missing-metadata"]
        warnings += [f"{d.summary}, accepted with --force: {d.problem}" for d in accepted]
        broken = [d for d in broken if d not in accepted]
    if broken:
        raise RestartSetDamaged(target, broken, what)
    if rs.purged:
        window = rollback_window(ckpt, sinks, ledger)
        reach = (f"The earliest reachable batch is {window.earliest} (window {window.earliest}..{window.latest})"
                 if window.earliest is not None else "No batch is reachable")
        raise RefusedError(
            f"cannot {what} batch {target}: {_purged_text(rs.purged)}. {reach}",
            path=ckpt.url,
            fix=(f"roll back to a batch from {window.earliest} to {window.latest}" if window.earliest is not None else
                 "restore the checkpoint from a backup")
            + "; a batch ledger (`checkpoint-ops ledger sync`) or a backup taken earlier reaches further",
        )
    return warnings


def _purged_text(purged: list) -> str:
    """The purged files of a restart set, said once per reason: ``_spark_metadata/0 .. _spark_metadata/7 (8 files)
    are gone and cannot be rebuilt (...)``, not the same sentence eight times (a hostile review). Files of several
    roots (two sinks' ``_spark_metadata/0``) are named by their full location."""
    several = len({d.root for d in purged}) > 1
    groups: dict[tuple, list] = {}
    for i, d in enumerate(purged):
        tail = d.problem[len(d.rel):] if d.problem.startswith(d.rel) else None
        groups.setdefault((d.root, tail) if tail is not None else (d.root, None, i), []).append(d)
    parts = []
    for key, items in groups.items():
        tail = key[1]
        if tail is None:
            parts += [d.problem for d in items]
            continue
        names = [d.url if several else d.rel for d in items]
        if len(items) > 1 and _consecutive([d.rel for d in items]):
            named, plural = f"{names[0]} .. {names[-1]} ({len(items)} files)", True
        else:
            named, plural = ", ".join(names), len(items) > 1
        parts.append(f"{named} are {tail.removeprefix(' is ')}" if plural and tail.startswith(" is ")
                     else f"{named}{tail}")
    return "; ".join(parts)


def _consecutive(rels: list[str]) -> bool:
    """``rels`` are one directory's files named by consecutive batch ids (``_spark_metadata/0`` .. ``/7``)."""
    dirs = {rel.rpartition("/")[0] for rel in rels}
    names = [rel.rpartition("/")[2] for rel in rels]
    if len(dirs) != 1 or not all(n.isascii() and n.isdigit() for n in names):
        return False
    ids = [int(n) for n in names]
    return ids == list(range(ids[0], ids[0] + len(ids)))


# ---- the operation -------------------------------------------------------------------------------------


class RollbackOperation(Operation):
    """``checkpoint-ops rollback``: a checkpoint and its file sinks back to one batch (module docstring)."""

    recovery = "journal"

    name = "rollback"

    def __init__(self, checkpoint_url: str, to_batch: int | None = None, to_time: datetime | None = None,
                 sink_urls: list[str] = (), keep_files: str | None = None, storage_options: dict | None = None,
                 source_compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL,
                 sink_compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL, force: bool = False,
                 without_recorded_sinks: bool = False, query_held: bool = False):
        """``query_held``: the caller runs the checkpoint's query itself, under the checkpoint's lease it holds now
        (the Dagster asset's own rollback): a recent commit is that query's, which has ended, and is not warned of."""
        self.url = checkpoint_url
        self.query_held = query_held
        self.to_batch, self.to_time, self.keep_files, self.force = to_batch, to_time, keep_files, force
        self.without_recorded_sinks = without_recorded_sinks
        self.sink_urls = list(sink_urls)
        refuse_repeated(self.sink_urls)
        self.storage_options = storage_options
        self.source_compact_interval, self.sink_compact_interval = source_compact_interval, sink_compact_interval
        self.fm, self.root = open_file_manager(checkpoint_url, storage_options)
        self.sink_fms = [open_file_manager(u, storage_options) for u in self.sink_urls]
        self.ckpt: Checkpoint | None = None
        self.sinks: list[SinkOutput] = []
        self.ledger = None

    def sites(self) -> list[Site]:
        return [Site(self.fm, self.root, f"checkpoint {self.url}")] + [
            Site(fm, root, f"sink output {url}") for (fm, root), url in zip(self.sink_fms, self.sink_urls)]

    def open(self) -> None:
        self.ckpt = Checkpoint(self.fm, self.root, source_compact_interval=self.source_compact_interval)
        self.ckpt.require_checkpoint(self.url)
        self.sinks = [require_sink(SinkOutput(fm, root, self.sink_compact_interval), url)
                      for (fm, root), url in zip(self.sink_fms, self.sink_urls)]
        self.ledger = ledger_or_none(self.ckpt)
        # before the activity check: a commits/031 of commits/31 leaves offsets/31 looking uncommitted
        self.ckpt.refuse_misnamed(self.sinks, "the rollback is refused, nothing was changed")

    def check_active(self, force: bool) -> list[str]:
        return refuse_if_active(self.ckpt, force) + ([] if self.query_held else recent_commit_warning(self.ckpt))

    def plan(self, stage: bool) -> Plan:
        recorded = RecordedSinksCheck(self.storage_options, self.sink_compact_interval, self.without_recorded_sinks)
        return plan_rollback(self.ckpt, self.to_batch, self.to_time, self.sinks, keep_files=self.keep_files,
                             ledger=self.ledger, force=self.force, recorded_sinks=recorded)

    def apply(self, plan: Plan, ctx: ApplyContext) -> AppliedOperation:
        hooks = JournalHooks(ledger_truncation=plan.target_batch, undo_guard={"checkpoint": ["offsets", "commits"]},
                             left_planned=plan.summary.get("kept_planned", []))
        applied = apply_plan(plan, Anchor.of_checkpoint(self.ckpt), checkpoint_roots(self.ckpt, self.sinks),
                             ctx.storage_options, ctx.progress, hooks, guard=ctx.guard)
        if self.sinks:  # checked when planned; now recorded on both sides (an operation that took both)
            record_pairing_after(self.ckpt, self.sinks, self.ledger, operation="rollback", op_id=applied.op_id,
                                 anchor_url=self.ckpt.url)
        return applied

    def describe(self, plan: Plan, outcome: AppliedOperation) -> str:
        return (f"Applied plan {plan.hash[:12]} ({outcome.op_id}): last committed batch is now {plan.target_batch}. "
                f"Undo with: checkpoint-ops undo {self.ckpt.url}")

