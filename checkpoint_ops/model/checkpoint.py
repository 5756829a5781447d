"""The checkpoint model: everything a Structured Streaming query keeps in its checkpoint.

Built from one listing; file contents are read lazily and at most once. Read-only: every change
goes through a plan and the file manager.
"""

from __future__ import annotations

import errno
import json
from functools import cached_property

from ..errors import BadInputError
from ..storage import CheckpointFileManager, open_file_manager
from .commits import CommitMetadata, parse_commit
from .compactible import SPARK_DEFAULT_COMPACT_INTERVAL
from .dstream import DStreamModel, is_dstream_checkpoint, scan_dstream
from .listing import Listing, is_hidden_temp, new_query_blocked, require_no_dir_links
from .logfile import LogFile, LogFormatError, log_files, refuse_misnamed_batch_files, unreadable
from .offsets import CODEC_KEY, PROVIDER_CLASS_KEY, OffsetSeq, parse_offsets
from .operators import OperatorFiles
from .sink import SINK_LOG_DIR, SinkOutput
from .sources import SourceDir, classify_sources
from .state import StateModel, misnamed_state_entry

STRUCTURED_DIRS = ("offsets", "commits", "sources", "state")
SHUFFLE_PARTITIONS_KEY = "spark.sql.shuffle.partitions"  # pinned in the offsets log: the state's partitions


class Checkpoint:
    """A Structured Streaming checkpoint directory (or a legacy DStream one, see ``kind``)."""

    def __init__(
        self,
        fm: CheckpointFileManager,
        root: str,
        *,
        source_compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL,
        listing: Listing | None = None,
    ):
        self.fm = fm
        self.root = root.rstrip("/")
        self.source_compact_interval = source_compact_interval
        self.listing = listing or Listing.scan(fm, self.root)
        self._offsets: dict[int, OffsetSeq] = {}
        self._commits: dict[int, CommitMetadata] = {}
        self._bad: dict[tuple[str, int], LogFormatError] = {}  # files that failed to read or parse, once
        # while a dict (``run_check_pass`` sets it for one pass): the bytes of the offsets and commits files
        # read, so the pass's fsck checks their sidecars by content without reading them again
        self.kept_bytes: dict[str, bytes] | None = None
        self.metadata_error: LogFormatError | None = None  # set when metadata exists but cannot be read

    @classmethod
    def open(cls, url: str, storage_options: dict | None = None, **kw) -> "Checkpoint":
        fm, root = open_file_manager(url, storage_options)
        ckpt = cls(fm, root, **kw)
        ckpt.require_checkpoint(url)
        return ckpt

    @property
    def url(self) -> str:
        return self.fm.url(self.root)

    def require_checkpoint(self, url: str) -> None:
        root_error = self.listing.unreadable_dirs.get("")
        if root_error is not None:
            raise BadInputError(f"cannot be read ({root_error.strerror or root_error})", path=url,
                                fix="make the checkpoint directory readable by this user (or fix the storage "
                                "permissions)")
        require_no_dir_links(self.listing, "checkpoint")
        blocked = self.listing.blocks_new_query() if len(self.listing) == 0 else []
        if blocked:  # directories Spark created (or someone emptied), and no file in them
            problem, fix = new_query_blocked(self.listing, blocked)
            raise BadInputError(problem, path=url, fix=fix)
        if len(self.listing) == 0:
            info = self.fm.info(self.root) if self.fm.strategy != "direct-put" else None
            if info is not None and not info.is_dir:
                raise BadInputError("this is a file, not a checkpoint directory", path=url,
                                    fix="point at the directory given as checkpointLocation (the one holding "
                                    "offsets/ and commits/)")
            raise BadInputError(
                "no such checkpoint (nothing found at this location)",
                path=url,
                fix="check the path (and --storage-options / AWS_ENDPOINT_URL for object stores)",
            )
        if self.kind == "unknown" and self.listing.only_unfinished_writes():
            temp = min(self.listing.files, key=lambda rel: (rel.endswith(".crc"), rel))
            raise BadInputError(
                f"no checkpoint yet: only the temp file of a write that never finished ({temp}; a query stopped "
                "while Spark wrote its first metadata leaves one)",
                path=url,
                fix="start the query: Spark never reads a temp file and starts it afresh here (or delete the temp "
                "file and its .crc)",
            )
        if self.kind == "unknown":
            raise BadInputError(
                "not a Spark checkpoint: no metadata, offsets/, commits/ or checkpoint-<time> files",
                path=url,
                fix="point at the directory given as checkpointLocation (the one holding offsets/ and commits/)",
            )

    @cached_property
    def kind(self) -> str:
        """``structured`` | ``dstream`` | ``unknown``."""
        L = self.listing
        if "metadata" in L or any(L.has_dir(d) for d in STRUCTURED_DIRS):
            return "structured"
        if is_dstream_checkpoint(L):
            return "dstream"
        return "unknown"

    @cached_property
    def dstream(self) -> DStreamModel:
        return scan_dstream(self.listing)

    # -- metadata ---------------------------------------------------------------------------
    @cached_property
    def metadata_raw(self) -> bytes | None:
        if "metadata" not in self.listing:
            return None
        try:
            return self.fm.read_bytes(self.listing.abs("metadata"))
        except FileNotFoundError:
            return None
        except OSError as e:  # there, but unreadable: callers that need it see metadata_error
            self.metadata_error = unreadable(self.listing.url("metadata"), e)
            return None

    @cached_property
    def fence(self):
        """The fence of an interrupted checkpoint-ops operation, or None."""
        from ..fence import is_fence, parse_fence

        return parse_fence(self.metadata_raw) if is_fence(self.metadata_raw) else None

    @cached_property
    def query_id(self) -> str | None:
        raw = self.fence.original_metadata if self.fence else self.metadata_raw
        if not raw:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise LogFormatError(
                "metadata is not JSON (Spark cannot restart: the query id is lost)",
                path=self.listing.url("metadata"),
                kind="not-json",
                fix="restore it from a backup; the id also appears in Spark's driver logs and in sink "
                "idempotency markers",
            ) from None
        return doc.get("id") if isinstance(doc, dict) else None

    # -- offsets and commits --------------------------------------------------------------------
    @cached_property
    def offset_files(self) -> dict[int, LogFile]:
        return log_files(self.listing, "offsets")

    @cached_property
    def commit_files(self) -> dict[int, LogFile]:
        return log_files(self.listing, "commits")

    @property
    def latest_offset(self) -> int | None:
        return max(self.offset_files) if self.offset_files else None

    @property
    def latest_commit(self) -> int | None:
        return max(self.commit_files) if self.commit_files else None

    @property
    def commits_lost(self) -> range | None:
        """Batches ``offsets/`` shows ran that no commit records, with no commit after them: Spark plans a batch
        only once the one before it committed (unless the query set ``asyncProgressTrackingEnabled``), so every
        planned batch below the newest one committed once. None when the commits log is where it should be
        (its last commit is the newest planned batch, or the one before it)."""
        L, C = self.latest_offset, self.latest_commit
        if L is None or (C is not None and C >= L - 1):
            return None
        first = C + 1 if C is not None else min(self.offset_files)
        return range(first, L) if first < L else None

    def nothing_committed(self, doing: str) -> tuple[str, str | None]:
        """Why there is no committed batch to ``doing`` ("roll back to"), and what to do: a commits log that
        was deleted (``commits_lost``) is named as such, not as "nothing committed yet"."""
        lost = self.commits_lost
        if lost is None:
            return f"no batch has been committed yet: there is nothing to {doing}", None
        return (f"commits/ holds no commit, but offsets/ plans batches {lost.start}..{lost.stop}: batches "
                f"{lost.start}..{lost.stop - 1} ran (Spark plans a batch only once the one before it committed), and "
                f"their commits were deleted, so there is no committed batch to {doing}",
                "restore the checkpoint from a backup taken before the commits were deleted (`checkpoint-ops backup "
                f"list DEST`); or start the query as it is: Spark runs batch {lost.stop} again and goes on (batches "
                f"{lost.start}..{lost.stop - 1} are not run again)")

    def _load(self, files: dict[int, LogFile], cache: dict, parse, batch_ids, errors: list | None, raw: dict | None):
        ids = list(files) if batch_ids is None else [b for b in batch_ids if b in files]
        kind = "commits" if cache is self._commits else "offsets"
        known_bad = [self._bad[(kind, b)] for b in ids if (kind, b) in self._bad]
        if known_bad:
            if errors is None:
                raise known_bad[0]
            errors.extend(known_bad)
        need = [b for b in ids if b not in cache and (kind, b) not in self._bad]
        if need:
            paths = {self.listing.abs(files[b].rel): b for b in need}
            failed: dict[str, OSError] = {}
            for path, data in self.fm.read_many(paths, errors=failed).items():
                b = paths[path]
                if data is None:
                    if path not in failed and files[b].info.is_dir:  # an object store's marker: no EISDIR to read
                        failed[path] = IsADirectoryError(errno.EISDIR, "Is a directory", path)
                    e = (unreadable(self.fm.url(path), failed[path]) if path in failed else
                         LogFormatError("file vanished while reading (is a query running?)", path=self.fm.url(path),
                                        kind="missing"))
                    self._bad[(kind, b)] = e
                    if errors is None:
                        raise e
                    errors.append(e)
                    continue
                if raw is not None:
                    raw[path] = data
                if self.kept_bytes is not None:
                    self.kept_bytes[path] = data
                try:
                    cache[b] = parse(data, self.fm.url(path), b)
                except LogFormatError as e:
                    self._bad[(kind, b)] = e
                    if errors is None:
                        raise
                    errors.append(e)
        return {b: cache[b] for b in ids if b in cache}

    def load_offsets(self, batch_ids=None, *, errors: list | None = None, raw: dict | None = None) -> dict[int, OffsetSeq]:
        """Parse offsets files (all by default), reading each at most once.

        Raises LogFormatError, unless ``errors`` is given: then bad files are collected there and
        skipped. ``raw`` (optional) receives the bytes read, by absolute path.
        """
        return self._load(self.offset_files, self._offsets, parse_offsets, batch_ids, errors, raw)

    def offsets(self, batch_id: int) -> OffsetSeq | None:
        return self.load_offsets([batch_id]).get(batch_id)

    def load_commits(self, batch_ids=None, *, errors: list | None = None, raw: dict | None = None) -> dict[int, CommitMetadata]:
        """Like ``load_offsets``, for ``commits/``."""
        return self._load(self.commit_files, self._commits, parse_commit, batch_ids, errors, raw)

    def commit(self, batch_id: int) -> CommitMetadata | None:
        return self.load_commits([batch_id]).get(batch_id)

    @cached_property
    def latest_offsets(self) -> OffsetSeq | None:
        """The newest offsets file that parses (a damaged newest file is fsck's business)."""
        for b in sorted(self.offset_files, reverse=True):
            errors: list = []
            got = self.load_offsets([b], errors=errors)
            if b in got:
                return got[b]
        return None

    @property
    def conf(self) -> dict:
        """The session conf Spark recorded (provider, codec, ...): from an offsets file already read
        if there is one (every batch records the same), else from the newest."""
        for b in sorted(self._offsets, reverse=True):
            if self._offsets[b].conf:
                return self._offsets[b].conf
        o = self.latest_offsets
        return o.conf if o else {}

    # -- sources and state ----------------------------------------------------------------------
    @cached_property
    def sources(self) -> dict[str, SourceDir]:
        return classify_sources(self.listing, self.source_compact_interval)

    @cached_property
    def state(self) -> StateModel:
        return StateModel(self.listing, self.conf.get(PROVIDER_CLASS_KEY), self.conf.get(CODEC_KEY, "lz4"))

    @cached_property
    def operator_files(self) -> OperatorFiles:
        """The operator metadata and state schema files, read and parsed on demand (each once)."""
        return OperatorFiles(self.state)

    @property
    def checkpoint_format_version(self) -> int | None:
        if not self.state.operators:
            return None
        c = next((got[b] for b in sorted(self.commit_files, reverse=True)
                  if b in (got := self.load_commits([b], errors=[]))), None)  # the newest that parses
        if (c and c.state_unique_ids) or self.state.has_unique_ids:
            return 2
        return 1

    def unique_ids_for(self, op_id: int, partition: int, store_index: int):
        """``ids_for(version)`` from the commit log: version v's id is in ``commits/v-1``."""

        def ids_for(version: int) -> str | None:
            if (version - 1) not in self.commit_files:
                return None
            got = self.load_commits([version - 1], errors=[])  # a damaged commit: fall back to the lineage
            c = got.get(version - 1)
            return c.unique_id(op_id, partition, store_index) if c else None

        return ids_for

    def batch_logs(self, sinks=()) -> list[tuple[Listing, str, bool]]:
        """(listing, directory, compactible) of every log Spark lists by batch: ``offsets/``, ``commits/``, each
        file source's log and each of ``sinks``' ``_spark_metadata/``."""
        logs = [(self.listing, "offsets", False), (self.listing, "commits", False)]
        logs += [(self.listing, src.log.rel_dir, True) for src in self.sources.values() if src.log is not None]
        return logs + [(sink.listing, SINK_LOG_DIR, True) for sink in sinks]

    def refuse_misnamed(self, sinks, doing: str) -> None:
        """Refuse (bad input, nothing changed) a name Spark parses as a batch, operator, partition or version but
        reads from another (``logfile.refuse_misnamed_batch_files``, ``StateModel.misnamed``). ``doing`` ends the
        message: what the command did not do."""
        refuse_misnamed_batch_files(self.batch_logs(sinks), doing)
        found = [(rel, right) for rel, right, stray in self.misnamed_state() if stray is None]
        if found:
            rel, right = found[0]
            problem, fix = misnamed_state_entry(rel, right, None)
            raise BadInputError(f"{problem}{' (and more)' if len(found) > 1 else ''}; {doing}",
                                path=self.listing.url(rel), fix=fix)

    def pinned_partitions(self) -> int | None:
        """The state's partitions: ``spark.sql.shuffle.partitions`` as the offsets log pins it, or None."""
        try:
            return int(self.conf.get(SHUFFLE_PARTITIONS_KEY) or 0) or None
        except (TypeError, ValueError):
            return None

    def misnamed_state(self) -> list[tuple[str, str, str | None]]:
        """(rel, the name Spark reads instead, why Spark never reaches it or None) of each name under ``state/``
        Spark parses but does not read (``StateModel.misnamed``). A stray: Spark's own name is there beside it, or
        a partition beyond those the offsets log pins (Spark loads partitions below it only)."""
        if not self.state.misnamed:
            return []  # (no read of the offsets log for its conf)
        try:
            pinned = self.pinned_partitions()
        except (OSError, BadInputError, LogFormatError):  # an offsets log fsck names: no partition is beyond
            pinned = None
        out = []
        for rel, right in self.state.misnamed:
            parts = right.split("/")
            if self.listing.get(right) is not None or self.listing.has_dir(right):
                stray = f"{right} is there"
            elif pinned and len(parts) >= 3 and parts[2].isdecimal() and int(parts[2]) >= pinned:
                stray = f"partition {parts[2]} is beyond the {pinned} partitions the offsets log pins"
            else:
                stray = None
            out.append((rel, right, stray))
        return out

    def temp_files(self) -> list[str]:
        """Leftover ``.*.tmp`` files anywhere in the checkpoint."""
        # the suffix first: one C call per listed file, the name split only for the few that end so
        return sorted(rel for rel in self.listing.files
                      if rel.endswith(".tmp") and is_hidden_temp(rel.rpartition("/")[2]))


def open_sink(url: str, storage_options: dict | None = None, compact_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL) -> SinkOutput:
    fm, root = open_file_manager(url, storage_options)
    return require_sink(SinkOutput(fm, root, compact_interval), url)


def require_sink(sink: SinkOutput, url: str) -> SinkOutput:
    """``sink`` if it is a file sink's output with a log, else BadInputError naming ``url``."""
    require_no_dir_links(sink.listing, "sink output")
    if not sink.log.files and any(rel == SINK_LOG_DIR or rel.startswith(SINK_LOG_DIR + "/")
                                  for rel in sink.listing.empty_dirs):
        raise BadInputError(
            f"{SINK_LOG_DIR}/ is there but holds no log file: no batch has committed to this file sink yet (Spark "
            "makes the directory when the query starts, so a query stopped before its first batch leaves it empty), "
            "or its log files were deleted; there is nothing of the sink to judge",
            path=url,
            fix="if the query has not committed a batch yet, leave the sink out (no --sink) until it has; if the log "
                "files were lost, restore the output from a backup; nothing was changed",
        )
    if not sink.exists():
        raise BadInputError(
            "no such sink output directory (nothing found at this location)",
            path=url,
            fix="pass the file sink's output path (the directory holding _spark_metadata/)",
        )
    if not sink.log.files:
        raise BadInputError(
            "not a file-sink output: no _spark_metadata/ log here",
            path=url,
            fix="pass the path given to writeStream...start(path); other sinks keep no log to inspect",
        )
    return sink
