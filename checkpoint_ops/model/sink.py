"""A file sink's output directory and its ``_spark_metadata`` log (``FileStreamSinkLog``)."""

from __future__ import annotations

import os
from urllib.parse import unquote

from ..storage import CheckpointFileManager
from ..storage.paths import Location, spark_url_to_location
from .compactible import SPARK_DEFAULT_COMPACT_INTERVAL, CompactibleLog, LogEntry
from .listing import Listing

_UNSEEN = object()

SINK_LOG_DIR = "_spark_metadata"


class SinkOutput:
    """``<output>/``: data files plus the sink log, from one listing of the output directory.

    ``data=False`` lists only ``_spark_metadata/``: an output can hold millions of data files, and
    commands that only read or rewrite the log should not pay for (or hold) their listing.
    """

    def __init__(self, fm: CheckpointFileManager, root: str, default_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL,
                 data: bool = True, origin: Location | None = None):
        self.fm = fm
        self.root = root.rstrip("/")
        # where the log's absolute paths point: this location, unless it is a copy of another (a backup)
        self.origin = origin or Location(fm.location.scheme, self.root)
        self._rel_dirs: dict[str, str | None] = {}  # directory in log entries -> relative dir (bounded: few)
        self.data_listed = data
        self.pairing_written = False  # our pairing record was written here since the listing (pairing.py)
        self.listing = Listing.scan(fm, self.root) if data else \
            Listing(fm, self.root, fm.walk(f"{self.root}/{SINK_LOG_DIR}", empty_dirs=True))
        self.log = CompactibleLog(self.listing, SINK_LOG_DIR, "sink log", default_interval)

    @property
    def url(self) -> str:
        return self.fm.url(self.root)

    def exists(self) -> bool:
        return len(self.listing) > 0

    def entry_location(self, e: LogEntry) -> str | None:
        """The fsspec path of an entry's file if it lives on this file system, else None."""
        loc = spark_url_to_location(e.path)
        if loc.scheme != self.fm.location.scheme:
            return None
        return loc.path

    def rel_of(self, e: LogEntry) -> str | None:
        """Path of an entry's file relative to the output root, or None if it lies elsewhere."""
        return self.rel_of_path(e.path)

    def rel_of_path(self, path: str) -> str | None:
        """``rel_of`` for a path as the log writes it."""
        # URL parsing per entry dominated long logs; entries share a few directories, so parse each once
        head, _, name = path.rpartition("/")
        rel_dir = self._rel_dirs.get(head, _UNSEEN)
        if rel_dir is _UNSEEN:
            rel_dir = self._rel_dirs[head] = self._rel_dir(head)
        if rel_dir is None or not name:
            return None
        name = unquote(name) if "%" in name else name
        return f"{rel_dir}/{name}" if rel_dir else name

    def _rel_dir(self, head: str) -> str | None:
        """A directory URL from the log, relative to the output root ("" for the root itself)."""
        loc = spark_url_to_location(head + "/_")
        base = self.origin.path.rstrip("/")
        if loc.scheme != self.origin.scheme:
            return None
        if not loc.path.startswith(base + "/") and loc.is_local and base == self.root:
            # this output named through a symbolic link (or the query wrote through one): one place, other spellings
            # (read as elsewhere, every data file looked unlisted, and a rollback planned deleting them all)
            real_base, real_dir = os.path.realpath(base), os.path.realpath(loc.path[:-2])
            if real_dir == real_base or real_dir.startswith(real_base + "/"):
                return real_dir[len(real_base) + 1:]
        if not loc.path.startswith(base + "/"):
            return None
        return loc.path[len(base) + 1:-2]

    def relocated_rel(self, e: LogEntry) -> str | None:
        """For an entry naming another location (a copied or moved output): the longest path suffix
        that exists under this output, i.e. where the file went. None if nothing matches."""
        parts = spark_url_to_location(e.path).path.strip("/").split("/")
        for k in range(len(parts)):
            cand = "/".join(parts[k:])
            if cand in self.listing.files:
                return cand
        return None

    def data_files(self) -> dict[str, int]:
        """Files under the output that are data of the sink (rel -> size): what a reader listing the
        directory (``ignoreMetadata``, other engines) reads as data, by Spark's file index rules
        (``spark_reads_as_data``), less any checkpoint kept inside the output (``checkpoint_dirs``).
        Nothing else is ever an orphan or counted as data.
        """
        assert self.data_listed, "the output's data files were not listed (SinkOutput(..., data=True))"
        inside = self.checkpoint_dirs()
        out = {}
        for rel, info in self.listing.files.items():
            if not spark_reads_as_data(rel) or _under_checkpoint(rel, inside):
                continue
            out[rel] = info.size
        return out

    def checkpoint_dirs(self) -> list[str]:
        """Directories of the output that hold a Structured Streaming checkpoint (a ``metadata`` file
        and an ``offsets/`` directory), relative to the output ("" for the output itself)."""
        found = []
        for rel in self.listing.files:
            if rel == CHECKPOINT_METADATA or rel.endswith("/" + CHECKPOINT_METADATA):
                parent = rel[: -len(CHECKPOINT_METADATA)].rstrip("/")
                if self.listing.has_dir(f"{parent}/offsets" if parent else "offsets"):
                    found.append(parent)
        return sorted(found)


CHECKPOINT_METADATA = "metadata"
# What a checkpoint at the output's own root owns there (the rest of the root is the sink's).
_CHECKPOINT_TOP = ("offsets", "commits", "sources", "state")


def _under_checkpoint(rel: str, checkpoint_dirs: list[str]) -> bool:
    for d in checkpoint_dirs:
        if d and (rel == d or rel.startswith(d + "/")):
            return True
        if not d and (rel == CHECKPOINT_METADATA or rel.split("/", 1)[0] in _CHECKPOINT_TOP):
            return True
    return False


def spark_lists_name(name: str) -> bool:
    """Whether Spark's file listing keeps a file or directory of this name (Hadoop's
    ``HadoopFSUtils.shouldFilterOutPathName``, which ``InMemoryFileIndex`` applies at every level):
    it drops names starting with ``.``, names starting with ``_`` unless they contain ``=`` (a
    partition column may start with one), and ``*._COPYING_``, but keeps ``_metadata*`` and
    ``_common_metadata*`` (Parquet summary files)."""
    excluded = (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")
    kept = name.startswith("_common_metadata") or name.startswith("_metadata")
    return not excluded or kept


def spark_reads_as_data(rel: str) -> bool:
    """Whether Spark reads the file at ``rel`` (relative to the directory it was asked to read) as
    data: every directory on the way is listed (``spark_lists_name``), and so is the file, and the
    file passes ``PartitioningAwareFileIndex.isDataPath`` (no ``.`` prefix, no ``_`` prefix without
    ``=``: so a ``_metadata`` file is listed, but not read as data)."""
    *dirs, name = rel.split("/")
    if not all(spark_lists_name(d) for d in dirs) or not spark_lists_name(name):
        return False
    return not ((name.startswith("_") and "=" not in name) or name.startswith("."))
