"""The progress of a query that runs elsewhere, read from its checkpoint alone (no Spark, no access to the
query): its latest committed batch and when it ran, what each new batch read and wrote, and how far behind
its file sources are (files in their input directories that no batch has read yet).

Spark records no row counts in a checkpoint; what it does record per batch is the files a file source
read and the files (and bytes) a file sink wrote, which is what this reports. Reads only."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from .ledger import Ledger, attribute_batch
from .model.checkpoint import Checkpoint
from .model.logfile import LogFormatError
from .model.sink import SinkOutput
from .timeline import batch_times

MAX_BATCHES = 100  # newest batches described per call: a sensor that was off for a long time catches up in steps


@dataclass(frozen=True)
class BatchProgress:
    """One committed batch: when Spark planned it, the files its file sources read and its file sinks wrote
    (None where Spark's logs no longer tell, e.g. compacted away)."""

    batch: int
    time: str | None
    input_files: int | None
    output_files: int | None
    output_bytes: int | None

    def to_dict(self) -> dict:
        return {"batch": self.batch, "time": self.time, "input_files": self.input_files,
                "output_files": self.output_files, "output_bytes": self.output_bytes}


@dataclass(frozen=True)
class QueryProgress:
    """What a checkpoint says about its query's progress since ``since_batch``."""

    checkpoint: str
    last_committed_batch: int | None
    last_batch_time: str | None
    batches: tuple[BatchProgress, ...]  # committed after since_batch, ascending (at most MAX_BATCHES, newest)
    unprocessed_files: int | None  # files waiting in the file sources' input directories; None: no file source
    input_dirs: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "last_committed_batch": self.last_committed_batch,
                "last_batch_time": self.last_batch_time, "batches": [b.to_dict() for b in self.batches],
                "unprocessed_files": self.unprocessed_files, "input_dirs": list(self.input_dirs)}


def _entries(log, batch: int):
    try:
        return attribute_batch(log, batch)
    except LogFormatError:
        return None


def _count(parts: list) -> int | None:
    return None if any(p is None for p in parts) else sum(parts)


def query_progress(ckpt: Checkpoint, sinks: list[SinkOutput] = (), since_batch: int | None = None,
                   ledger: Ledger | None = None, storage_options: dict | None = None) -> QueryProgress:
    """The query's progress as its checkpoint records it; batches committed after ``since_batch`` (all of them,
    up to MAX_BATCHES newest, when None). ``unprocessed_files`` counts the files in the directories the file
    sources read from (as their logs show them) that no batch has read: the source's lag in files."""
    last = ckpt.latest_commit
    first = 0 if since_batch is None else since_batch + 1
    new = [b for b in range(max(first, (last or 0) - MAX_BATCHES + 1), (last if last is not None else -1) + 1)
           if b in ckpt.commit_files or (ledger is not None and ledger.has("commits", b))]
    times = batch_times(ckpt, new + ([last] if last is not None else []), ledger)
    file_sources = [s for s in ckpt.sources.values() if s.kind == "file" and s.log is not None]
    batches = []
    for b in new:
        inputs = [_entries(s.log, b) for s in file_sources]
        outputs = [_entries(s.log, b) for s in sinks]
        out_bytes = [None if o is None else sum(int(e.doc.get("size") or 0) for e in o) for o in outputs]
        batches.append(BatchProgress(b, times[b].time,
                                     _count([None if i is None else len(i) for i in inputs]) if inputs else None,
                                     _count([None if o is None else len(o) for o in outputs]) if outputs else None,
                                     _count(out_bytes) if outputs else None))
    unprocessed, dirs = _unprocessed(file_sources, storage_options)
    return QueryProgress(ckpt.url, last, times[last].time if last is not None else None, tuple(batches),
                         unprocessed, dirs)


def _unprocessed(file_sources, storage_options: dict | None) -> tuple[int | None, tuple[str, ...]]:
    if not file_sources:
        return None, ()
    seen: dict[str, set[str]] = {}
    for src in file_sources:
        if src.log.latest is None:
            continue
        try:
            entries = src.log.entries_after(src.log.latest)
        except LogFormatError:
            return None, ()
        for e in entries:
            directory, name = posixpath.split(e.path)
            seen.setdefault(directory, set()).add(name)
    import fsspec

    waiting = 0
    for directory, names in seen.items():
        fs, path = fsspec.core.url_to_fs(directory, **(storage_options or {}))
        try:
            listed = fs.ls(path, detail=False)
        except FileNotFoundError:
            continue
        waiting += sum(1 for p in listed if not posixpath.basename(p).startswith(("_", "."))
                       and posixpath.basename(p) not in names)
    return waiting, tuple(sorted(seen))
