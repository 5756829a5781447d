"""Will Spark's rerun of the rolled-back batches find their input files?

A rollback to batch N drops the file-source log entries of the batches after N, so Spark, when it runs them
again, selects those files afresh from the input directory. A file that is no longer there is not selected:
its rows are missing from the rerun's output, and nothing says so. Spark's own ``cleanSource`` moves
(``archive``, into ``sourceArchiveDir`` under the file's full path) or deletes (``delete``) every file of a
committed batch; other jobs archive input on their own. So the rollback plan looks for the files the removed
entries name (each looked up, or one listing of a directory holding many of them: an input directory may
hold years of files) and warns with the count, examples and what to do.

Bounded, as a rollback on an object store is judged by its requests: the files of the first ``MAX_JUDGED``
rolled-back batches are looked for (the earliest: a cleaner has had the longest to move them), from their own
log files, and for a compaction batch (or one Spark compacted away) from the compaction file that holds it,
streamed. Only files on the checkpoint's own store (same scheme) are looked for, and when the first batch's
are not, nothing more is read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import unquote

from .model.compactible import CompactibleLog
from .storage.manager import CheckpointFileManager
from .storage.paths import basename, dirname, join, parse_url

MAX_EXAMPLES = 3
MAX_JUDGED = 8  # rolled-back batches whose input files are looked for
MAX_PROBED = 16  # up to this many files of one directory are looked up one by one, more by a listing
_BATCH_ID = re.compile(rb'"batchId"\s*:\s*(\d+)')


@dataclass(frozen=True)
class RerunInputs:
    """Of ``looked`` input files, those not found (``missing``: each as a path to move it back to, decoded:
    a local path, or ``s3a://bucket/key``); ``unchecked``: files on another store, not looked for."""

    looked: int
    missing: list[str]
    unchecked: int = 0


def on_store(fm: CheckpointFileManager, url: str) -> bool:
    """``url`` (as a file-source log names it) is on ``fm``'s store."""
    try:
        return parse_url(url).scheme == fm.location.scheme
    except ValueError:
        return False


def input_urls(log: CompactibleLog, batches: list[int]) -> list[str]:
    """The input files the file-source log says ``batches`` read: from each batch's own log file, or, for a
    compaction batch and one Spark compacted away, from the first compaction file that holds it (streamed,
    only its lines of those batches parsed: it holds every entry since batch 0)."""
    plain = [b for b in batches if b in log.files and not log.files[b].compact]
    urls = []
    if plain:
        entries = log.read(plain)
        urls += [e.path for b in plain for e in entries.get(b, ()) if e.path]
    by_compact: dict[int, set[int]] = {}
    for b in batches:
        if b in plain:
            continue
        holders = [c for c in log.compact_ids if c >= b]
        if holders:
            by_compact.setdefault(min(holders), set()).add(b)
    for c, wanted in sorted(by_compact.items()):
        for line in log.stream_lines(c):
            m = _BATCH_ID.search(line)
            if m is not None and int(m.group(1)) in wanted:
                try:
                    path = json.loads(line).get("path")
                except (ValueError, AttributeError):
                    continue  # damage: fsck names it
                if path:
                    urls.append(path)
    return urls


def find_missing(fm: CheckpointFileManager, urls: list[str]) -> RerunInputs:
    """Which of ``urls`` (as a file-source log names them: ``file:///...``, ``s3a://bucket/key``) are not on
    ``fm``'s store now: per directory, each file looked up (a HEAD on S3) when there are at most ``MAX_PROBED``
    of them, else one listing of the directory."""
    by_dir: dict[str, list[tuple[str, str]]] = {}
    unchecked = 0
    for url in sorted(set(urls)):
        try:
            loc = parse_url(url)
        except ValueError:
            unchecked += 1
            continue
        if loc.scheme != fm.location.scheme:
            unchecked += 1
            continue
        path = loc.path if loc.is_local else unquote(loc.path)
        by_dir.setdefault(dirname(path), []).append((basename(path), loc.url(path)))
    missing: list[str] = []
    looked = 0
    for directory, files in sorted(by_dir.items()):
        try:
            if len(files) <= MAX_PROBED:  # an input directory may hold years of files: not listed for a few
                gone = [shown for name, shown in files if fm.info(join(directory, name)) is None]
            else:
                present = {info.name for info in fm.list(directory) if not info.is_dir}
                gone = [shown for name, shown in files if name not in present]
        except OSError:  # cannot be read (no permission): not judged
            unchecked += len(files)
            continue
        looked += len(files)
        missing += gone
    return RerunInputs(looked, missing, unchecked)


def missing_warning(source: str, judged: list[int], rolled_back: int, found: RerunInputs,
                    listed_as: str) -> str | None:
    """The plan's warning for the files ``found`` missing among those of the source-log offsets ``judged`` (of
    the ``rolled_back`` offsets the rollback removes; a file source's log offset is the batch id when every
    batch read files); ``listed_as``: the plan summary key that lists them all. None: none is missing."""
    if not found.missing:
        return None
    n = len(found.missing)
    shown = ", ".join(found.missing[:MAX_EXAMPLES]) + (f" and {n - MAX_EXAMPLES} more" if n > MAX_EXAMPLES else "")
    offsets = f"log offset {judged[0]}" if len(judged) == 1 else f"log offsets {judged[0]}..{judged[-1]}"
    rest = rolled_back - len(judged)
    return (f"{source}: {n} of the {found.looked} input files of its {offsets} are no longer where Spark read them "
            f"({shown}; all in the plan's summary, '{listed_as}'): when Spark runs the rolled-back batches again it "
            "will not select them, and their rows will be missing from the output"
            + (f" (the files of its {rest} later log offsets the rollback removes were not looked for: check them "
               "the same way)" if rest > 0 else "")
            + ". Before the query runs again, move each back to that path (with the file source's "
            "cleanSource=archive, sourceArchiveDir holds each under its full path); with cleanSource=delete they "
            "are gone, and only a backup of the input brings them back")


__all__ = ["MAX_JUDGED", "RerunInputs", "find_missing", "input_urls", "missing_warning", "on_store"]
