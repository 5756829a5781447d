"""``fsck``: find what would stop Spark from restarting, or make it silently lose or corrupt data.

Read-only. Each finding names the file, what is wrong and a concrete next step. ``error`` means
Spark fails or misbehaves; ``warning`` means harmless today but a trap (stale files, litter).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass

from .fence import recovery_advice
from .lease import LeaseState, lease_of
from .lag import planned_batch_logged_without_state, sink_ahead_of_commits, sink_lag
from .model.checkpoint import Checkpoint
from .model.compactible import SPARK_DEFAULT_COMPACT_INTERVAL, CompactibleLog
from .model.listing import is_hidden_temp, is_unfinished_write, new_query_blocked, spark_batch_id
from .model.logfile import LogFormatError, misnamed_batch_file, misnamed_log_files
from .model.operator_metadata import OperatorMetadata
from .model.operators import FileProblem
from .model.sink import SINK_LOG_DIR, SinkOutput
from .model.state import misnamed_state_entry
from .model.logfile import unreadable
from .pairing import PAIRING_FILE, check_pairing
from .recorded_sinks import left_out
from .restart import PURGED, log_finding_code, metadata_damage, restart_set, state_bytes_problem
from .window import rollback_window
from .storage.checksums import (
    hadoop_crc_matches,
    hadoop_crc_size,
    hadoop_crc_target,
    is_hadoop_crc_name,
    spark_checksum_matches,
)

ERROR = "error"
WARNING = "warning"


_OFFSETS_DETAIL = re.compile(r"\d+:\d+")  # what the verdict cache records of a sound offsets file


@dataclass
class Finding:
    severity: str
    code: str
    path: str
    problem: str
    fix: str

    def to_dict(self) -> dict:
        return asdict(self)


class Fsck:
    def __init__(self, ckpt: Checkpoint, sinks: list[SinkOutput] = (), deep: bool = False, ledger=None, *,
                 cache=None, sets=None, storage_options: dict | None = None,
                 sink_compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL):
        """``cache`` (a ``verdicts.VerdictCache``): log files an earlier run found sound and Spark can no
        longer rewrite are not read again, and what this run finds sound is recorded in it (the caller
        saves it). ``sets``: the ``RestartSets`` the rollback window is judged with (shared with inspect
        in one pass). Neither changes a finding. ``storage_options``, ``sink_compact_interval``: how to open
        the outputs the ledger records besides ``sinks`` (judged as if given, ``recorded_sinks.py``)."""
        self.ckpt = ckpt
        self._blocked: set[str] = set()  # what keeps a new query from starting here (_temp_files)
        self.ledger = ledger  # where Spark's files no longer reach, the window may
        self.sinks = list(sinks)
        self.recorded: list = []  # the recorded outputs not given (``recorded_sinks.LeftOut``), as run() found them
        self.storage_options, self.sink_compact_interval = storage_options, sink_compact_interval
        self.deep = deep
        self.cache = cache if not deep else None
        self.sets = sets
        self._live: set | None = None
        self._crc_known: dict[str, bool] = {}  # big files checked streamed: whether their .crc matches
        self.findings: list[Finding] = []
        self._read: dict[str, bytes] = {}  # absolute path -> content of files already read
        self._judged: set[str] = set()  # log files read and let go: their sidecar verdicts are in _crc_known
        self._sound_offsets: dict[int, str] = {}  # offsets files taken from the cache: "version:sources"
        self._parsed_offsets: dict = {}
        self.cmd = f"checkpoint-ops rollback {shlex.quote(ckpt.url)}"

    def add(self, severity: str, code: str, path: str, problem: str, fix: str) -> None:
        self.findings.append(Finding(severity, code, path, problem, fix))

    def run(self) -> list[Finding]:
        if self.ckpt.kind == "dstream":
            self._dstream()
            return self.findings
        self._recorded_sinks()  # first: every sink the run judges is known before anything is read (the cache)
        self._metadata()
        errors: list[LogFormatError] = []
        # offsets and commits files an earlier run found sound are not read again (the verdict cache); of
        # each such offsets file the cache keeps what the restart rules ask of every one: its sources
        self._sound_offsets = self._sound_batch_files("offsets", self.ckpt.offset_files)
        sound_commits = self._sound_batch_files("commits", self.ckpt.commit_files)
        offset_ids = [b for b in self.ckpt.offset_files if b not in self._sound_offsets]
        commit_ids = [b for b in self.ckpt.commit_files if b not in sound_commits]
        offsets = self.ckpt.load_offsets(offset_ids, errors=errors, raw=self._read)
        commits = self.ckpt.load_commits(commit_ids, errors=errors, raw=self._read)
        self._parsed_offsets = offsets
        # the damaged ones too (a shared pass's window may have parsed them first: their bytes are kept), as
        # when they are read here; only a file that cannot be read at all is not tried again
        unreadable_urls = {e.path for e in errors if e.kind == "unreadable"}
        judged = [self.ckpt.offset_files[b].rel for b in offset_ids] + [self.ckpt.commit_files[b].rel for b in commit_ids]
        self._read_for_sidecars(self.ckpt.listing, [rel for rel in judged
                                                    if self.ckpt.listing.url(rel) not in unreadable_urls])
        for e in errors:
            self._log_error(e)
        self._misnamed_batch_files()
        dirs = sorted(f.rel for files in (self.ckpt.offset_files, self.ckpt.commit_files) for f in files.values()
                      if f.info is not None and f.info.is_dir)
        if dirs:
            # Spark takes each as the batch its name says and fails on it: what follows from that batch (commits
            # ahead, gaps, missing state and sink entries) would be findings about a batch that never ran
            self.add(WARNING, "checks-skipped", self.ckpt.listing.url(dirs[0]),
                     f"the restart rules, state, sink and rollback window checks are skipped while {', '.join(dirs[:3])}"
                     f"{' and more' if len(dirs) > 3 else ''} {'is a directory' if len(dirs) == 1 else 'are directories'}"
                     " (named above): they would judge batches that never ran",
                     "move the directory out as said above, then run fsck again")
            self._temp_files()
            self._checksums(self.ckpt.listing)
            return self.findings
        self._restart_rules(offsets, commits)
        self._sources(offsets)
        self._state(commits)
        self._temp_files()
        self._checksums(self.ckpt.listing)
        for sink, verdict in zip(self.sinks, check_pairing(self.ckpt, self.sinks, self.ledger)):
            if not verdict.ok:
                self.add(ERROR, "sink-not-paired", sink.url, verdict.problem, verdict.fix)
            self._sink(sink, paired=verdict.ok)
        self._restart_set()
        self._window()
        self._operator_files()
        self._record_sound()
        return self.findings

    # -- the verdict cache ---------------------------------------------------------------------------
    def _roots(self):
        yield "checkpoint", self.ckpt.listing, [s.log for s in self.ckpt.sources.values() if s.log is not None]
        for i, sink in enumerate(self.sinks):
            yield f"sink{i}", sink.listing, [sink.log]

    def _live_rels(self) -> set:
        if self._live is None:
            from .verdicts import live_rels

            self._live = live_rels(self.ckpt, self.sinks)
        return self._live

    def _skip(self, log: CompactibleLog) -> set[int]:
        """Batch ids of ``log`` that an earlier run found sound (parsed, checksum sidecar matching)."""
        if self.cache is None:
            return set()
        from .verdicts import file_stamp

        root, listing = next((r, L) for r, L, logs in self._roots() if any(x is log for x in logs))
        live = self._live_rels()
        return {b for b, f in log.files.items() if (root, f.rel) not in live
                and self.cache.is_sound("log", root, f.rel, file_stamp(listing, f.rel))}

    def _sound_batch_files(self, kind: str, files: dict) -> dict[int, str]:
        """Batch id -> recorded detail of the ``offsets/`` or ``commits/`` files an earlier run found sound
        (parsed, sidecar matching) that Spark can no longer rewrite."""
        if self.cache is None or self.ckpt.fence is not None:
            return {}
        from .verdicts import file_stamp

        live, listing = self._live_rels(), self.ckpt.listing
        sound = {}
        for b, f in files.items():
            if ("checkpoint", f.rel) in live:
                continue
            detail = self.cache.sound_detail(kind, "checkpoint", f.rel, file_stamp(listing, f.rel))
            # what this tool records ("version:sources" of an offsets file, nothing of a commit); anything
            # else is a damaged entry: the file is judged again
            if detail is not None and (_OFFSETS_DETAIL.fullmatch(detail) if kind == "offsets" else detail == ""):
                sound[b] = detail
        return sound

    def _read_for_sidecars(self, L, rels, hold: bool = True) -> None:
        """The bytes of these files that an earlier reader parsed without keeping them (the sync, the
        window or the pairing, in a shared pass), so their Hadoop sidecars are checked by content like
        the rest: only files that have a sidecar, from the pass's kept bytes where it has them. Held for
        ``_checksums`` (``hold``), or judged now a chunk at a time and let go (``_judge_sidecars``)."""
        from .model.compactible import in_chunks
        from .storage.checksums import hadoop_crc_name

        kept = (self.ckpt.kept_bytes or {}) if L is self.ckpt.listing else {}
        again, now = [], {}
        for rel in rels:
            path = L.abs(rel)
            parent, _, name = rel.rpartition("/")
            sidecar = f"{parent}/{hadoop_crc_name(name)}" if parent else hadoop_crc_name(name)
            if path in self._read or path in self._crc_known or sidecar not in L:
                continue
            if path in kept:
                now[path] = kept[path]
            else:
                again.append(path)
        if hold:
            self._read.update(now)
            if again:
                self._read.update({p: d for p, d in L.fm.read_many(again, errors={}).items() if d is not None})
            return
        self._judge_sidecars(L, now)
        infos = {p: L.get(p[len(L.root) + 1:]) for p in again}  # a compact file's size: a stat on local disk
        sizes = {p: f.size if p.endswith(".compact") else f.known_size for p, f in infos.items() if f is not None}
        for chunk in in_chunks(again, sizes, self.READ_CHUNK_BYTES):
            self._judge_sidecars(L, {p: d for p, d in L.fm.read_many(chunk, errors={}).items() if d is not None})

    READ_CHUNK_BYTES = 64 * 2**20  # log files read at once (their sidecars judged, then let go)

    def _judge_sidecars(self, L, blobs: dict[str, bytes]) -> None:
        """Whether each of these files (absolute path -> bytes, as read) matches its Hadoop sidecar, into
        ``_crc_known``, so that the bytes need not be held until ``_checksums`` (a log's compact files together
        grow with the square of its batches). A file with no sidecar, or whose sidecar cannot be read, has no
        verdict; ``_checksums`` reports a sidecar of the wrong size by its size first."""
        from .storage.checksums import hadoop_crc_name

        self._judged.update(blobs)
        sidecars = {}
        for path in blobs:
            rel = path[len(L.root) + 1:]
            parent, _, name = rel.rpartition("/")
            side = f"{parent}/{hadoop_crc_name(name)}" if parent else hadoop_crc_name(name)
            if side in L:
                sidecars[L.abs(side)] = path
        if sidecars:
            for side_path, crc in L.fm.read_many(list(sidecars), errors={}).items():
                if crc is not None:
                    self._crc_known[sidecars[side_path]] = hadoop_crc_matches(blobs[sidecars[side_path]], crc)

    def _record_sound(self) -> None:
        """Every log file this run read and found nothing wrong with (nor with its sidecar)."""
        if self.cache is None or self.ckpt.fence is not None:
            return
        from .storage.checksums import hadoop_crc_name
        from .verdicts import file_stamp

        named = {f.path for f in self.findings}
        live = self._live_rels()
        listing = self.ckpt.listing
        for kind, files in (("offsets", self.ckpt.offset_files), ("commits", self.ckpt.commit_files)):
            for b, f in files.items():
                if ("checkpoint", f.rel) in live or listing.abs(f.rel) not in self._read:
                    continue
                crc = f"{kind}/{hadoop_crc_name(f.name)}"
                if listing.url(f.rel) in named or listing.url(crc) in named:
                    continue
                o = self._parsed_offsets.get(b) if kind == "offsets" else None
                if kind == "offsets" and o is None:
                    continue
                detail = f"{o.version}:{len(o.offsets)}" if o is not None else ""
                self.cache.record_sound(kind, "checkpoint", f.rel, file_stamp(listing, f.rel), detail)
        for root, listing, logs in self._roots():
            for log in logs:
                for f in log.files.values():
                    if (root, f.rel) in live or (listing.abs(f.rel) not in self._read
                                                  and listing.abs(f.rel) not in self._crc_known
                                                  and listing.abs(f.rel) not in self._judged):
                        continue
                    parent, _, name = f.rel.rpartition("/")
                    crc = f"{parent}/{hadoop_crc_name(name)}" if parent else hadoop_crc_name(name)
                    if listing.url(f.rel) in named or listing.url(crc) in named:
                        continue
                    self.cache.record_sound("log", root, f.rel, file_stamp(listing, f.rel))

    def _operator_files(self) -> None:
        """Operator metadata and state schema files: damage the restart set does not need (it named
        the rest), and transformWithState schema paths that point out of the checkpoint."""
        ck = self.ckpt
        if ck.fence is not None:
            return
        catalog = ck.operator_files
        named = {f.path for f in self.findings}
        for op in sorted(ck.state.operators.values(), key=lambda o: o.op_id):
            parsed = catalog.read(catalog.files(op))
            for rel, got in parsed.items():
                if not isinstance(got, FileProblem) or got.path in named:
                    continue
                if rel == op.metadata_v1_rel:
                    self.add(WARNING, "operator-metadata-damaged", got.path,
                             f"{got.problem}: Spark 4.3 does not read it to restart, but Spark's state-metadata and "
                             "statestore readers fail on it, and the operator has no name here",
                             "restore it from a backup (Spark writes it only when it is missing: deleting it while "
                             "the query is stopped makes the next run write a new one)")
                else:
                    noun = "operator-metadata" if got.role == "operator metadata" else "state-schema"
                    self.add(WARNING, f"{noun}-damaged", got.path,
                             f"{got.problem}: a restart from the latest batch does not read it, a rollback to the "
                             "batches it covers does", "restore it from a backup")
            newest = op.metadata_v2.get(max(op.metadata_v2)) if op.metadata_v2 else None
            md = parsed.get(newest) if newest else None
            outside = catalog.outside_paths(md) if isinstance(md, OperatorMetadata) else []
            if outside:
                self.add(WARNING, "state-schema-outside-checkpoint", ck.listing.url(newest),
                         f"the operator metadata names state schema files outside this checkpoint (e.g. {outside[0]}): "
                         "it was copied or moved, and Spark reads the schema from the old location when the query "
                         "restarts, failing once that is gone",
                         "restore the checkpoint with `checkpoint-ops backup restore` (which rewrites these paths), "
                         "or run it from its original location")

    def _window(self) -> None:
        """Damage further down that cuts the rollback window short (Spark's retention deletes from the
        bottom only, so a missing or broken file above it is damage). Harmless for a restart now."""
        C = self.ckpt.latest_commit
        if C is None or self.ckpt.fence is not None:
            return
        w = rollback_window(self.ckpt, self.sinks, self.ledger, sets=self.sets)
        d = w.stop
        if d is None or d.kind == PURGED or w.earliest is None:
            return
        if any(f.path == d.url for f in self.findings):
            return
        self.add(WARNING, "window-cut", d.url,
                 f"no rollback can reach batch {w.earliest - 1} or earlier: {d.problem} (a restart from the "
                 "latest batch does not need it)", d.fix)

    def _restart_set(self) -> None:
        """The files Spark reads to restart after the latest committed batch, in the same words a
        rollback uses (only what no finding above already names)."""
        C = self.ckpt.latest_commit
        if C is None or self.ckpt.fence is not None:
            return
        named = {f.path for f in self.findings}
        for d in restart_set(self.ckpt, C, self.sinks, deep=True).damage:
            if d.url in named:
                continue
            named.add(d.url)
            self.add(ERROR, d.code if d.kind != "purged" else "restart-file-gone", d.url,
                     f"{d.problem} (Spark reads it to restart after batch {C})", d.fix)

    # -- logs ------------------------------------------------------------------------------------
    def _log_error(self, e: LogFormatError) -> None:
        self.add(ERROR, log_finding_code(e), e.path, e.problem, e.fix or "restore this file from a backup or roll back past it")

    def _metadata(self) -> None:
        ck = self.ckpt
        if ck.metadata_raw is not None:
            self._read[ck.listing.abs("metadata")] = ck.metadata_raw
        if ck.fence:
            f = ck.fence
            self.add(ERROR, "operation-interrupted", ck.listing.url("metadata"),
                     f"a checkpoint-ops {f.operation} ({f.op_id}) is in progress or was interrupted: metadata is "
                     "fenced so Spark cannot start from a half-changed checkpoint",
                     recovery_advice(f, ck.url))
            return
        d = metadata_damage(ck)
        if d is not None:
            self.add(ERROR, d.code, d.url, d.problem, d.fix)

    def _restart_rules(self, offsets: dict, commits: dict) -> None:
        ck = self.ckpt
        L, C = ck.latest_offset, ck.latest_commit
        url = ck.listing.url
        if L is not None and L > 0 and (L - 1) not in ck.offset_files:
            fix = (f"delete offsets/{L} (batch {L} is not committed, so Spark plans it again)"
                   if C is None or C < L else
                   f"restore offsets/{L - 1} from a backup, or roll back to an earlier complete batch: {self.cmd} --to-batch <N>")
            self.add(ERROR, "offsets-gap", url(f"offsets/{L - 1}"),
                     f"offsets/{L - 1} is missing: Spark's restart reads offsets/{L} and offsets/{L - 1} and fails "
                     f"with 'batch {L - 1} doesn't exist'", fix)
        if C is not None and L is not None and C > L:
            self.add(ERROR, "commits-ahead", url(f"commits/{C}"),
                     f"commits/{C} is ahead of the latest offsets ({L}): Spark fails with "
                     "CONCURRENT_STREAM_LOG_UPDATE", f"delete commits above {L} (commits/{L + 1}..{C})")
        elif C is not None and L is not None and C < L - 1:
            self.add(ERROR, "commits-behind", url(f"commits/{C}"),
                     f"the latest commit ({C}) is more than one batch behind the latest offsets ({L}): Spark "
                     f"treats batches {C + 1}..{L - 1} as done without running them (unless the query used "
                     "asyncProgressTrackingEnabled)", f"roll back to batch {C}: {self.cmd} --to-batch {C}")
        elif C is None and ck.commits_lost is not None:  # every commit deleted: as commits-behind, from the first
            lost = ck.commits_lost
            self.add(ERROR, "commits-behind", url("commits"),
                     f"commits/ holds no commit, but offsets/ plans batches {lost.start}..{lost.stop}: batches "
                     f"{lost.start}..{lost.stop - 1} ran and their commits were deleted (unless the query used "
                     f"asyncProgressTrackingEnabled); Spark runs batch {lost.stop} again on restart and treats the "
                     "others as done, and no rollback or backup finds a committed batch",
                     "restore the checkpoint from a backup taken before the commits were deleted; or start the query "
                     f"as it is, if running batch {lost.stop} alone again is what you want")
        # v1 offsets name sources by position: every file must list the same number.
        counts = {b: len(o.offsets) for b, o in offsets.items() if o.version == 1}
        for b, detail in self._sound_offsets.items():  # what the cache kept of files not read again
            version, _, n = detail.partition(":")
            if version == "1":
                counts[b] = int(n)
        counts = dict(sorted(counts.items()))
        if counts:
            expected = counts[max(counts)]
            for b, n in counts.items():
                if n != expected:
                    self.add(ERROR, "source-count-mismatch", url(f"offsets/{b}"),
                             f"offsets/{b} lists {n} sources but offsets/{max(counts)} lists {expected} "
                             "(a truncated write?)",
                             "restore it from a backup, or roll back past it")

    def _sources(self, offsets: dict) -> None:
        ck = self.ckpt
        L = ck.latest_offset
        latest = offsets.get(L) if L is not None else None
        for sid, src in ck.sources.items():
            log = src.log
            if log is None:
                continue
            ok = self._parse_compactible(log)
            if log.latest is not None and ok:
                missing = log.missing_for(log.latest)
                for b in missing:
                    self.add(ERROR, "source-log-gap", ck.listing.url(log.rel(b)),
                             f"{log.rel(b)} is missing: the source log cannot be read as of {log.latest} "
                             "(Spark's restart fails)", "restore it from a backup, or roll back to an earlier batch")
            so = latest.source(sid) if latest else None
            k = so.log_offset if so else None
            if k is not None and (log.latest is None or k > log.latest):
                self.add(ERROR, "source-log-behind", ck.listing.url(src.rel_dir),
                         f"offsets/{L} expects log offset {k} but the source log ends at {log.latest}",
                         "restore the source log from a backup, or roll back to an earlier batch")

    def _parse_compactible(self, log: CompactibleLog) -> bool:
        skip = self._skip(log)
        L = log.listing
        if log.kind == "source log":  # only whether each file reads: checked streaming, entries not kept
            errors = self._check_lenient(log, skip)
        else:  # the bytes judged against their sidecars a chunk at a time, not held (_judge_sidecars)
            errors = log.read_all_lenient(lambda blobs: self._judge_sidecars(L, blobs), skip=skip,
                                          chunk_bytes=self.READ_CHUNK_BYTES)
        # files parsed before this check (the pairing, or the window in a shared pass) came from the
        # model without their bytes: read those too, so their checksum sidecars are checked like the rest
        # a file found damaged before (by the window) is read too: its sidecar is judged like the rest, as
        # when this check parses it itself; only one that cannot be read at all is not tried again
        unreadable_urls = {e.path for e in errors if e.kind == "unreadable"}
        self._read_for_sidecars(L, [f.rel for b, f in log.files.items() if b not in skip
                                    and L.abs(f.rel) not in self._crc_known and L.url(f.rel) not in unreadable_urls],
                                hold=False)
        for e in errors:
            self._log_error(e)
        return not errors

    STREAM_ABOVE = 4 * 2**20  # log files bigger than this are checked streamed, never held

    def _check_lenient(self, log: CompactibleLog, skip) -> list[LogFormatError]:
        """``read_all_lenient`` without keeping the entries (a compact file of a long-running source
        holds every file it ever read): the errors. Small files are read a chunk at a time and judged against
        their sidecars (``_judge_sidecars``); big ones are streamed, their Hadoop checksum computed as they
        pass (``_crc_known``)."""
        import io

        from .model.compactible import check_log_stream, in_chunks

        L = log.listing
        errors: list[LogFormatError] = []
        small = {L.abs(f.rel): b for b, f in log.files.items() if b not in skip
                 and (f.info.known_size or f.info.size) <= self.STREAM_ABOVE}
        big = [b for b, f in log.files.items() if b not in skip and L.abs(f.rel) not in small]
        sizes = {p: log.files[b].info.known_size or log.files[b].info.size for p, b in small.items()}
        for chunk in in_chunks(list(small), sizes, self.READ_CHUNK_BYTES):
            failed: dict[str, OSError] = {}
            raw: dict[str, bytes] = {}
            for path, blob in L.fm.read_many(chunk, errors=failed).items():
                url = L.fm.url(path)
                try:
                    if path in failed:
                        raise unreadable(url, failed[path])
                    if blob is None:
                        continue
                    raw[path] = blob
                    if not log.is_checked(small[path]):  # the window may have checked it already
                        check_log_stream(io.BytesIO(blob), url, log.kind)
                        log.mark_checked(small[path])
                except LogFormatError as e:
                    errors.append(e)
            self._judge_sidecars(L, raw)
        for b in big:
            e = self._stream_check(log, b, check_log_stream)
            if e is not None:
                errors.append(e)
        return errors

    def _stream_check(self, log: CompactibleLog, b: int, check) -> LogFormatError | None:
        """Check one big log file streamed, and its ``.crc`` sidecar's content as it passes."""
        from .storage.checksums import HADOOP_CRC_MAGIC, HadoopCrc, hadoop_crc_name

        L = log.listing
        f = log.files[b]
        path, url = L.abs(f.rel), L.url(f.rel)
        side_rel = f"{log.rel_dir}/{hadoop_crc_name(f.name)}"
        side = L.get(side_rel)
        crc = want = None
        if side is not None and side.size == hadoop_crc_size(f.info.size):
            try:
                want = L.fm.read_bytes(L.abs(side_rel))
            except OSError:
                want = None
            if want is not None and len(want) >= 8 and want[:4] == HADOOP_CRC_MAGIC:
                bpc = int.from_bytes(want[4:8], "big", signed=True)
                crc = HadoopCrc(bpc) if bpc > 0 else None
        problem = None
        try:
            with L.fm.open_read(path) as fh:
                reader = _Tee(fh, crc)
                try:
                    check(reader, url, log.kind)
                except LogFormatError as e:
                    problem = e
                while reader.read(2**20):
                    pass
        except OSError as e:
            return unreadable(url, e)
        # True where there is no sidecar to compare (a size mismatch is reported by _checksums)
        self._crc_known[path] = want is None or (crc is not None and crc.digest() == want)
        return problem

    # -- state ----    # -- state -----------------------------------------------------------------------------------
    def _state(self, commits: dict) -> None:
        ck = self.ckpt
        st = ck.state
        if not st.operators:
            return
        st.operator_metadata()
        C, L = ck.latest_commit, ck.latest_offset
        for op in st.operators.values():
            for store in op.stores.values():
                # Whether version C+1 loads is the restart set's question (see _restart_set).
                # Stale: versions no batch in offsets/ could have written (> L + 1).
                top = (L if L is not None else -1) + 1
                stale = [f for f in store.files if f.version > top]
                if stale:
                    vs = sorted({f.version for f in stale})
                    consequence = ("not loaded (commits pin the ids) but they skew cleanup"
                                   if any(f.unique_id for f in stale) else
                                   "a restart may load them instead of rebuilding, silently giving wrong state")
                    self.add(WARNING, "state-stale", ck.listing.url(stale[0].rel),
                             f"{len(stale)} state files of {store.label} are above version {top} "
                             f"(versions {vs[0]}..{vs[-1]}), left by an abandoned run or a naive rollback: {consequence}",
                             f"remove them with `{self.cmd} --to-batch {C}` (stop the query first)" if C is not None
                             else "no batch has committed, so no rollback reaches them: follow the new-query-refused "
                             "finding (a state/ that holds only batch 0's uncommitted writes is deleted, and Spark "
                             "starts afresh)")
                for rel in store.orphan_sidecars:
                    self.add(WARNING, "orphan-crc", ck.listing.url(rel),
                             "checksum file without its state file", "delete it (Spark's maintenance would, too)")

    # -- litter and checksums ----------------------------------------------------------------------
    def _misnamed_batch_files(self) -> None:
        """A log entry Spark lists as a batch but reads that batch from another name (``misnamed_log_files``)."""
        for listing, rel_dir, compactible in self.ckpt.batch_logs(self.sinks):
            for entry in misnamed_log_files(listing, rel_dir, compactible):
                problem, fix = misnamed_batch_file(listing, entry)
                self.add(ERROR if entry.oldest_kept is None else WARNING, "misnamed-batch-file",
                         listing.url(entry.rel), problem, fix)
        for rel, right, stray in self.ckpt.misnamed_state():
            problem, fix = misnamed_state_entry(rel, right, stray)
            self.add(ERROR if stray is None else WARNING, "misnamed-state-file", self.ckpt.listing.url(rel),
                     problem, fix)

    def _temp_files(self) -> None:
        # offsets/ holds no batch file: Spark starts a new query here, and refuses to (not while an operation fences
        # the checkpoint: its temp files and half-written logs are its own, and resume or undo finishes it)
        blocked = self.ckpt.listing.blocks_new_query() if self.ckpt.fence is None else []
        self._blocked = set(blocked)
        if blocked:
            problem, fix = new_query_blocked(self.ckpt.listing, blocked)
            self.add(ERROR, "new-query-refused", self.ckpt.url, problem, fix)
        named = tuple(f"{rel}/" for rel in blocked)
        for rel in self.ckpt.temp_files():
            if rel in blocked or rel.startswith(named):
                continue  # named above, with why Spark cares
            self.add(WARNING, "temp-file", self.ckpt.listing.url(rel),
                     "leftover temporary file from an interrupted write (hidden; Spark never reads it)",
                     "delete it (and its .crc sidecar, if any) while no query runs on this checkpoint")

    def _checksums(self, L) -> None:
        """Hadoop ``.X.crc`` sidecars: orphaned, wrong size, or (for files we read) wrong content."""
        fm = L.fm
        to_verify: list[tuple[str, str]] = []
        for rel, info in L.files.items():
            parent, _, name = rel.rpartition("/")
            if not is_hadoop_crc_name(name):
                continue
            target_name = hadoop_crc_target(name)
            target = f"{parent}/{target_name}" if parent else target_name
            tinfo = L.get(target)
            if tinfo is None:
                if L is self.ckpt.listing and parent in self.ckpt.state.store_dirs:
                    continue  # reported with its store (the state check above)
                latest = (self.ckpt.latest_offset if parent == "offsets" else self.ckpt.latest_commit) \
                    if L is self.ckpt.listing and parent in ("offsets", "commits") else None
                batch = spark_batch_id(target_name)
                if rel in self._blocked:
                    continue  # named with why a new query does not start here (_temp_files)
                # the name Spark writes for that batch, on a store whose writes make one (a checksum file system)
                if L.fm.hadoop_crc and L is self.ckpt.listing and parent in ("offsets", "commits") \
                        and batch is not None and target_name == str(batch) and (latest is None or batch > latest):
                    self.add(ERROR, "orphan-crc", L.url(rel), f"checksum sidecar of {parent}/{target_name}, which is not "
                             f"there: Spark's write of that file, when it runs that batch, fails on it (it reports "
                             "'Multiple streaming queries are concurrently using' the log)",
                             "delete it while no query runs on this checkpoint")
                    continue
                self.add(WARNING, "orphan-crc", L.url(rel), f"checksum sidecar of a file that no longer exists ({target_name})",
                         "delete it")
                continue
            if is_hidden_temp(target_name):
                continue  # a temp file's sidecar goes with it (temp-file above): Spark never reads either
            if info.size != hadoop_crc_size(tinfo.size):
                self._stale_crc(L, rel, target, f"({tinfo.size} bytes)")
                continue
            if L.abs(target) in self._crc_known:
                if not self._crc_known[L.abs(target)]:
                    self._stale_crc(L, rel, target)
                continue
            if self.deep or L.abs(target) in self._read:
                to_verify.append((rel, target))
        if to_verify:
            need = [L.abs(t) for _, t in to_verify if L.abs(t) not in self._read] + [L.abs(r) for r, _ in to_verify]
            data = fm.read_many(need, errors={})  # unreadable files are reported where they are parsed
            for rel, target in to_verify:
                content = self._read.get(L.abs(target))
                if content is None:
                    content = data.get(L.abs(target))
                crc = data.get(L.abs(rel))
                if content is None or crc is None:
                    continue
                if not hadoop_crc_matches(content, crc):
                    self._stale_crc(L, rel, target)
        if self.deep and L is self.ckpt.listing:
            self._spark_checksums()

    def _stale_crc(self, L, rel: str, target: str, how: str = "(the file was rewritten without updating it)") -> None:
        """A Hadoop sidecar that does not match its file. Spark reads a sink's data files and RocksDB's state files
        through Hadoop's FileSystem API, which checks it: its readers fail, or the state load (an error). It does not
        check it when it reads the checkpoint's logs, ``metadata``, operator metadata, state schemas, the HDFS
        store's state files or the sink log (proven: it restarts over them), so there it only trips tools that read
        through that API (a warning)."""
        name = target.rsplit("/", 1)[-1]
        parent = target.rpartition("/")[0]
        store_dirs = self.ckpt.state.store_dirs if L is self.ckpt.listing else ()
        rocksdb = self.ckpt.state.provider != "hdfs"
        if rocksdb and (parent in store_dirs or (parent.endswith("/SSTs") and parent[:-5] in store_dirs)):
            self.add(ERROR, "stale-crc", L.url(rel), f"checksum sidecar does not match the state file {name} {how}: "
                     "RocksDB's load checks it and fails on it (it falls back to older snapshots, then fails where "
                     "the changelogs before them are purged)",
                     f"if {name} is right, delete the .crc file; else restore both from a backup")
            return
        fix = (f"if {name} is right (edited on purpose), delete the .crc file (a missing checksum is accepted; Hadoop "
               f"rewrites it on the next write); if {name} changed by itself (a disk or copy fault), restore both "
               "from a backup")
        if L is not self.ckpt.listing and not target.startswith(SINK_LOG_DIR + "/"):
            self.add(ERROR, "stale-crc", L.url(rel), f"checksum sidecar does not match the sink data file {name} "
                     f"{how}: Spark's readers of the sink fail with ChecksumException", fix)
            return
        self.add(WARNING, "stale-crc", L.url(rel),
                 f"checksum sidecar does not match {name} {how}: Spark does not check it when it reads a "
                 "checkpoint (its logs, metadata and the HDFS store's state) or a sink log, but tools that read through Hadoop's FileSystem API (`hadoop fs -cat`, "
                 "distcp) fail with ChecksumException", fix)

    def _spark_checksums(self) -> None:
        """Deep: every state file's bytes (LZ4 framing, zip structure, format version) and Spark's own
        CRC32C checksum files of V2 state files. Read a store at a time (bounded memory)."""
        ck = self.ckpt
        L = ck.listing
        for store in ck.state.stores():
            pairs = []
            for f in store.files:
                ck_rel = next((s for s in f.sidecars if s.endswith(f.name + ".crc")
                               and not s.rsplit("/", 1)[-1].startswith(".")), None)
                pairs.append((f, ck_rel))
            failed: dict = {}
            data = ck.fm.read_many([L.abs(f.rel) for f, _ in pairs] + [L.abs(c) for _, c in pairs if c], errors=failed)
            for f, chk in pairs:
                m = data.get(L.abs(f.rel))
                if L.abs(f.rel) in failed:
                    self.add(ERROR, "state-file-damaged", L.url(f.rel), unreadable(L.url(f.rel), failed[L.abs(f.rel)]).problem,
                             "restore it from a backup, or roll back to a batch before the damage")
                    continue
                if m is None:
                    continue
                problem = state_bytes_problem(f, m, ck.state.codec)
                if problem:
                    self.add(ERROR, "state-file-damaged", L.url(f.rel), problem,
                             "restore it from a backup, or roll back to a batch before the damage")
                    continue
                if f.kind == "zip":
                    ck.state.preload({f.rel: m})
                    for name in ck.state.zip_ssts(f):
                        if name not in store.ssts:
                            sub = "logs" if name.endswith(".log") else "SSTs"
                            self.add(ERROR, "state-missing", L.url(f"{store.rel_dir}/{sub}/{name}"),
                                     f"{f.name} names {sub}/{name}, which is missing: RocksDB cannot restore that "
                                     "version", "restore it from a backup, or roll back to a batch that does not "
                                     "load this version")
                    ck.state.preload(None)
                c = data.get(L.abs(chk)) if chk else None
                if c is not None and not spark_checksum_matches(m, c):
                    self.add(ERROR, "stale-checksum-file", L.url(chk),
                             f"Spark checksum file does not match {f.name}: loading it fails checksum verification",
                             "restore the state file from a backup; if the file is right, delete its checksum file")

    # -- sinks -------------------------------------------------------------------------------------
    def _recorded_sinks(self) -> None:
        """The outputs the ledger records for this checkpoint and fsck was not given: judged as if given
        with --sink; one with no sink log any more, or that cannot be read, is a warning (recorded_sinks.py)."""
        self.recorded = left_out(self.ckpt, self.sinks, self.ledger, storage_options=self.storage_options,
                                 compact_interval=self.sink_compact_interval, data=True)
        for m in self.recorded:
            if m.output is not None:
                self.sinks.append(m.output)
            elif m.gone is not None and self.ckpt.fence is not None:
                # an interrupted operation of ours moves a sink's log aside while it works: not an output gone
                self.add(WARNING, "recorded-sink-missing", m.url,
                         f"the batch ledger records that this checkpoint's query writes this file sink (recorded by "
                         f"{m.recorded.recorded_by}), but {m.gone}: the interrupted {self.ckpt.fence.operation} "
                         "(operation-interrupted) changes its log too and may have left it part-way",
                         f"{recovery_advice(self.ckpt.fence, self.ckpt.url)}, then run fsck again; leave the batch "
                         "ledger's pairing records as they are")
            elif m.gone is not None:
                self.add(WARNING, "recorded-sink-missing", m.url,
                         f"the batch ledger records that this checkpoint's query writes this file sink (recorded by "
                         f"{m.recorded.recorded_by}), but {m.gone}",
                         "nothing is at risk (a rollback goes ahead and says so in its plan). If the output moved or "
                         "was abandoned for good, move the record naming it out of "
                         f"{self.ledger.fm.url(self.ledger.path)}/pairing/ (keep a copy); record a moved output with "
                         f"`checkpoint-ops ledger sync {shlex.quote(self.ckpt.url)} --sink NEW`")
            else:
                self.add(WARNING, "recorded-sink-unreadable", m.url,
                         f"the batch ledger records that this checkpoint's query writes this file sink (recorded by "
                         f"{m.recorded.recorded_by}), but it cannot be read to check it: {m.unreadable}",
                         "check the location and --storage-options, then run fsck again (a rollback is refused "
                         "until it can be read, or given --without-recorded-sinks)")

    def _sink(self, sink: SinkOutput, paired: bool = True) -> None:
        """The sink's own log and files; and, when it belongs to the checkpoint, how the two compare."""
        log = sink.log
        L = sink.listing
        for rel in L.files_in(""):  # the temp file of our own pairing record's write, killed part-way
            if rel.startswith(f".{PAIRING_FILE}.") and is_unfinished_write(rel):
                self.add(WARNING, "temp-file", L.url(rel), "leftover temp file of a checkpoint-ops write of the "
                         f"pairing record ({PAIRING_FILE}) that never finished (hidden; Spark never reads it)",
                         "delete it (and its .crc sidecar, if any) while no checkpoint-ops command runs on this output")
        if not self._parse_compactible(log) or log.latest is None:
            self._checksums(L)
            return
        missing = log.missing_for(log.latest)
        for b in missing:
            self.add(ERROR, "sink-log-gap", L.url(log.rel(b)),
                     f"{log.rel(b)} is missing: readers of the sink (spark.read, file-source on the output) and "
                     "the next compaction fail with FileNotFoundException",
                     "restore it from a backup (a batch ledger can rebuild it: `checkpoint-ops ledger`)")
        ck_latest = self.ckpt.latest_offset
        lag = sink_lag(self.ckpt, sink, self.ledger) if paired else None
        if lag is not None and lag.behind:
            self._sink_behind(sink, lag)
        if paired and ck_latest is not None and log.latest > ck_latest:
            self.add(ERROR, "sink-ahead", L.url(log.rel(log.latest)),
                     f"the sink log has batches up to {log.latest} but the checkpoint plans only up to {ck_latest}: "
                     f"the file sink silently skips batch ids it already logged, so batches {ck_latest + 1}.."
                     f"{log.latest} will be dropped when they re-run (what a rollback of offsets/commits alone leaves)",
                     f"roll back the sink with the checkpoint: {self.cmd} --to-batch {self.ckpt.latest_commit} "
                     f"--sink {shlex.quote(sink.url)}")
        elif paired and planned_batch_logged_without_state(self.ckpt, log.latest):
            committed = self.ckpt.latest_commit
            self.add(ERROR, "sink-ahead", L.url(log.rel(log.latest)),
                     f"the sink log holds batch {log.latest}, which the checkpoint planned and did not commit, and "
                     f"no state store has its version ({log.latest + 1}; the state ends at batch {committed}): the "
                     f"file sink skips the batch when it re-runs, Spark commits it without its state, and the next "
                     f"batch fails (CANNOT_LOAD_STATE_STORE) (what a rollback without the sink that kept a no-data "
                     f"batch planned leaves)",
                     f"roll back the sink with the checkpoint: {self.cmd} --to-batch {committed} "
                     f"--sink {shlex.quote(sink.url)}")
        ahead = sink_ahead_of_commits(self.ckpt, sink.url, log.latest) if paired else None
        if ahead is not None:
            self.add(ERROR, "sink-ahead-of-commit", L.url(log.rel(log.latest)), ahead.problem, ahead.fix)
        if missing:
            self._checksums(L)
            return
        entries = log.entries_after(log.latest)
        known: set[str] = set()
        outside = []
        for e in entries:
            rel = sink.rel_of(e)
            if rel is None:
                outside.append(e.path)
                rel = sink.relocated_rel(e)
                if rel is None:
                    continue
            known.add(rel)
            if rel not in L:
                self.add(ERROR, "sink-file-missing", L.url(rel),
                         "listed in the sink log but missing: readers of the sink fail",
                         "restore the file from a backup; if it is lost, " + (
                             f"drop its entry from the sink log (`checkpoint-ops sink compact {sink.url} "
                             "--drop-missing`: its rows are then gone for readers too, as they are now)"
                             if log.compact_ids else
                             f"`checkpoint-ops sink compact {sink.url} --drop-missing` drops its entry once Spark "
                             f"has written the sink log's first compact file ({log.rel(log.interval - 1)}); until "
                             "then readers fail on it"))
        if outside:
            unmatched = len(entries) - len(known)
            self.add(ERROR, "sink-path-outside-output", sink.url,
                     f"{len(outside)} sink log entries point outside this output directory (e.g. {outside[0]}): "
                     "the output was copied or moved, and Spark readers look for files at the old location"
                     + (f"; {unmatched} of them have no file here either" if unmatched else
                        "; every one of them has a file at the same relative path here"),
                     "point --sink at the original location, or rewrite the sink log paths for the new location")
        for rel in sorted(set(sink.data_files()) - known):
            if lag is not None and lag.behind:
                self.add(WARNING, "sink-orphan-file", L.url(rel),
                         f"data file not in the sink log. The sink log is behind its checkpoint ({lag.describe()} "
                         "committed without a log entry), so this may be the data of a batch whose entry is missing",
                         f"do not delete it: roll back and reprocess as the sink-behind finding says; afterwards "
                         f"`checkpoint-ops sink orphans {shlex.quote(sink.url)}` lists what is still orphaned")
                continue
            self.add(WARNING, "sink-orphan-file", L.url(rel),
                     "data file not in the sink log (a failed or rolled-back batch wrote it, or `sink retain` or "
                     "`sink compact --drop-missing` dropped its entry and kept the file): Spark readers ignore it, but "
                     "readers that list the directory (ignoreMetadata, other engines) see it",
                     f"while the query is stopped, `checkpoint-ops sink orphans {shlex.quote(sink.url)} --delete` "
                     "moves it into an undo record (pass --checkpoint so the query's lease is checked)")
        self._checksums(L)

    def _sink_behind(self, sink: SinkOutput, lag) -> None:
        target = lag.rollback_target
        fix = (f"roll back the checkpoint and the sink to the last batch the sink has, then run the query to "
               f"reprocess: `{self.cmd} --to-batch {target} --sink {shlex.quote(sink.url)}`; the run re-runs "
               f"{lag.describe()} and writes their rows again. Do not delete data files: those of {lag.describe()} "
               "are what the sink log lost" if target is not None else
               "restore the checkpoint and its sink from a backup taken before the loss (no rollback can re-run "
               "batch 0 with this sink log). Do not delete data files")
        self.add(ERROR, "sink-behind", sink.listing.url(lag.missing_rels[0]),
                 f"{lag.describe()} {'were' if len(lag.missing) > 1 else 'was'} committed ({lag.committed_by}) but "
                 f"the sink log has no entry for {'them' if len(lag.missing) > 1 else 'it'} "
                 f"({', '.join(lag.missing_rels[:3])}{', ...' if len(lag.missing) > 3 else ''} missing): those rows are "
                 "not in the output for Spark's readers, and the query will not write them again (it runs only "
                 f"batches after {lag.last_committed})", fix)

    # -- legacy --------------------------------------------------------------------------------------
    def _dstream(self) -> None:
        m = self.ckpt.dstream
        L = self.ckpt.listing
        for c in m.checkpoints:
            if c.size == 0:
                self.add(ERROR, "empty-checkpoint-file", L.url(c.rel), "DStream checkpoint file is empty",
                         "delete it; Spark falls back to the previous checkpoint file")
        if m.temp_file:
            self.add(WARNING, "temp-file", L.url(m.temp_file), "leftover 'temp' from an interrupted checkpoint write",
                     "delete it while the application is stopped")


def run_fsck(ckpt: Checkpoint, sinks: list[SinkOutput] = (), deep: bool = False, ledger=None, *,
             cache=None, sets=None, storage_options: dict | None = None,
             sink_compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL) -> list[Finding]:
    """Every finding for ``ckpt`` and ``sinks``, and for the outputs its ledger records besides them."""
    return Fsck(ckpt, sinks, deep, ledger, cache=cache, sets=sets, storage_options=storage_options,
                sink_compact_interval=sink_compact_interval).run()


@dataclass(frozen=True)
class FsckReport:
    """``fsck``'s answer: the findings, and who holds the checkpoint's lease (``--json`` keys: docs/cli.md)."""

    path: str
    findings: list[Finding]
    lease: LeaseState

    @classmethod
    def of(cls, ckpt: Checkpoint, findings: list[Finding]) -> "FsckReport":
        return cls(ckpt.url, findings, lease_of(ckpt.fm, ckpt.root, ckpt.listing))

    @property
    def healthy(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict:
        return {"path": self.path, "healthy": self.healthy, "findings": [f.to_dict() for f in self.findings],
                "lease": self.lease.to_dict()}

    def render(self) -> str:
        return render_findings(self.findings, self.path) + f"\n  lease: {self.lease.describe()}"


def render_findings(findings: list[Finding], url: str) -> str:
    if not findings:
        return f"{url}: healthy (no findings)"
    lines = [f"{url}: {len(findings)} finding(s)"]
    # findings that say the same of other files (a sink's orphans, a directory of stale sidecars) are shown once,
    # with the other paths after it; --json lists every one
    alike: dict[tuple, list[Finding]] = {}
    for f in findings:
        alike.setdefault((f.severity, f.code, f.problem, f.fix), []).append(f)
    for group in alike.values():
        f = group[0]
        lines.append(f"  [{f.severity}] {f.code}: {f.path}")
        lines.append(f"      {f.problem}")
        lines.append(f"      fix: {f.fix}")
        if len(group) > 1:
            shown = ", ".join(g.path for g in group[1:1 + _ALIKE_SHOWN])
            rest = len(group) - 1 - _ALIKE_SHOWN
            lines.append(f"      the same for {len(group) - 1} more: {shown}"
                         + (f" and {rest} more (--json lists every one)" if rest > 0 else ""))
    return "\n".join(lines)


_ALIKE_SHOWN = 5  # paths named after a finding that others repeat word for word


class _Tee:
    """A binary reader that feeds what passes through it to a ``HadoopCrc`` (if one is given)."""

    def __init__(self, f, crc):
        self._f = f
        self._crc = crc

    def readline(self) -> bytes:
        line = self._f.readline()
        if self._crc is not None and line:
            self._crc.update(line)
        return line

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        if self._crc is not None and data:
            self._crc.update(data)
        return data
