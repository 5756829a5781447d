"""The text format shared by Spark's metadata logs (``HDFSMetadataLog``).

A log is a directory with one file per batch id, named by the decimal id (compactible logs add
``.compact``). A file is a version line ``v<n>`` followed by ``\\n``-joined lines, no trailing
newline. Spark ignores any name that is not a number, so hidden temp and ``.crc`` files are not
batches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import BadInputError, UnsupportedVersionError
from ..storage import FileInfo
from .listing import Listing, misnamed_batch_id, spark_batch_id

COMPACT_SUFFIX = ".compact"

# Highest format version Spark 4.3 reads, per log kind (reference §6.3).
MAX_VERSIONS = {
    "offsets": 2,
    "commits": 3,
    "source log": 1,
    "sink log": 1,
    "kafka initial offsets": 1,
    "operator metadata": 2,
}


@dataclass(frozen=True)
class LogFile:
    batch_id: int
    name: str
    rel: str
    info: FileInfo

    @property
    def compact(self) -> bool:
        return self.name.endswith(COMPACT_SUFFIX)


def batch_id_from_name(name: str, compactible: bool = False) -> int | None:
    """The batch Spark reads from a file of this name: the name (minus ``.compact``) parses as a long, written as
    Spark writes it (``31``, not ``031``: ``misnamed_log_files``)."""
    if compactible and name.endswith(COMPACT_SUFFIX):
        name = name[: -len(COMPACT_SUFFIX)]
    batch = spark_batch_id(name)
    return batch if batch is not None and str(batch) == name else None


def log_files(listing: Listing, rel_dir: str, compactible: bool = False) -> dict[int, LogFile]:
    """Batch files of one log directory, by batch id: the files Spark reads each batch from.

    A directory named like a batch file counts, as it does for Spark's ``isBatchFile`` (reading it
    then fails, and says so). A name Spark lists as a batch but reads no batch from (``031``) does not
    (``misnamed_log_files`` names it).
    """
    out: dict[int, LogFile] = {}
    entries = dict(listing.files_in(rel_dir))
    # a directory holding only empty directories (``offsets/14/sub``) is no subdirectory to the listing, which
    # keeps a store directory with no file from being a store: here it is one, as Spark lists it
    prefix = f"{rel_dir}/" if rel_dir else ""
    nested = {rel[len(prefix):].partition("/")[0] for rel in listing.empty_dirs if rel.startswith(prefix)}
    for d in sorted(set(listing.subdirs(rel_dir)) | nested):
        if batch_id_from_name(d, compactible) is not None:
            entries.setdefault(d, listing.dir_entry(f"{rel_dir}/{d}" if rel_dir else d))
    for name, info in entries.items():
        bid = batch_id_from_name(name, compactible)
        if bid is None:
            continue
        prev = out.get(bid)
        if prev is not None and prev.compact and not name.endswith(COMPACT_SUFFIX):
            continue  # both "9" and "9.compact": Spark reads the name its interval dictates
        out[bid] = LogFile(bid, name, f"{rel_dir}/{name}" if rel_dir else name, info)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class MisnamedEntry:
    """An entry of a log directory Spark lists as batch ``batch`` but reads no batch from (``offsets/031``,
    ``offsets/+31``: Spark reads batch 31 from ``offsets/31`` only). ``oldest_kept``: the oldest batch the log
    holds under its own name, where this one is below it (a stray Spark never reaches), else None."""

    rel: str
    batch: int
    oldest_kept: int | None = None


def misnamed_log_files(listing: Listing, rel_dir: str, compactible: bool = False) -> list[MisnamedEntry]:
    """Every entry of a log directory (files and directories) Spark lists as a batch but reads no batch from."""
    prefix = f"{rel_dir}/" if rel_dir else ""
    names = set(listing.files_in(rel_dir)) | set(listing.subdirs(rel_dir))
    names |= {rel[len(prefix):].partition("/")[0] for rel in listing.empty_dirs if rel.startswith(prefix)}
    found, kept = [], []
    for name in names:
        stem = name[: -len(COMPACT_SUFFIX)] if compactible and name.endswith(COMPACT_SUFFIX) else name
        if not stem:
            continue
        bid = spark_batch_id(stem)
        if bid is not None and str(bid) == stem:  # the name Spark writes (every name but a stray's)
            kept.append(bid)
            continue
        bid = misnamed_batch_id(stem)
        if bid is not None:
            found.append((f"{prefix}{name}", bid))
    oldest = min(kept) if kept else None
    return [MisnamedEntry(rel, bid, oldest if oldest is not None and bid < oldest else None)
            for rel, bid in sorted(found)]


def misnamed_batch_file(listing: Listing, entry: MisnamedEntry) -> tuple[str, str]:
    """The problem and the fix for a ``MisnamedEntry``."""
    rel, batch = entry.rel, entry.batch
    rel_dir, _, name = rel.rpartition("/")
    right = f"{batch}{COMPACT_SUFFIX}" if name.endswith(COMPACT_SUFFIX) else str(batch)
    right_rel = f"{rel_dir}/{right}" if rel_dir else right
    problem = (f"{rel} is not a name Spark reads: Spark lists it as batch {batch} (its name parses as that number) "
               f"but reads batch {batch} only from {right_rel}")
    move_out = (f"move {rel} (and its `.{name}.crc` sidecar, if any) out of this directory, keeping a copy, then run "
                "`checkpoint-ops fsck` again")
    if entry.oldest_kept is not None:
        return (problem + f", and batch {batch} is below every batch this log keeps (the oldest is "
                f"{entry.oldest_kept}): a stray Spark never reaches"), move_out
    forms = (str(batch), f"{batch}{COMPACT_SUFFIX}")
    there = next((f"{rel_dir}/{x}" if rel_dir else x for x in forms
                  if listing.get(f"{rel_dir}/{x}" if rel_dir else x) is not None
                  or listing.dir_entry(f"{rel_dir}/{x}" if rel_dir else x) is not None), None)
    if there is not None:
        return (problem + f". {there} is there: Spark reads no batch from this one, but counts it among the batches "
                "it lists (its newest batch, and the compact interval it works out from the newest `.compact` "
                "names), and a rollback or compaction cannot tell which of the two is that batch's"), move_out
    from .sink import SINK_LOG_DIR

    problem += (f", which is missing: Spark's readers of the output fail where they read batch {batch} (every batch "
                f"since the last compact file, as of the newest): File {right_rel} does not exist"
                if rel_dir == SINK_LOG_DIR else
                f", which is missing: the query fails to start where Spark reads batch {batch} (File {right_rel} "
                "does not exist)")
    fix = (f"if it is batch {batch}'s file, rename it to {right_rel} (and its `.{name}.crc` sidecar, if any, to "
           f"`.{right}.crc`); otherwise move it out of this directory, keeping a copy. Then run "
           "`checkpoint-ops fsck` again")
    return problem, fix


def refuse_misnamed_batch_files(logs, doing: str) -> None:
    """Refuse (bad input, nothing changed) where a log of ``logs`` ((listing, rel_dir, compactible) each) holds an
    entry Spark lists as a batch but reads no batch from, at or above the oldest batch the log keeps: Spark reads
    that batch under another name, and the command would judge the log without it (a rollback would leave it
    above its target). A stray below every kept batch does not stop it. ``doing`` ends the message: what the
    command did not do."""
    for listing, rel_dir, compactible in logs:
        found = [e for e in misnamed_log_files(listing, rel_dir, compactible) if e.oldest_kept is None]
        if found:
            problem, fix = misnamed_batch_file(listing, found[0])
            raise BadInputError(f"{problem}{' (and more in this log)' if len(found) > 1 else ''}; {doing}",
                                path=listing.url(found[0].rel), fix=fix)


class LogFormatError(BadInputError):
    """A log file that Spark would refuse to read."""

    def __init__(self, problem: str, *, path: str, fix: str | None = None, kind: str = "malformed"):
        self.kind = kind  # empty | no-version | unknown-version | not-json | truncated | malformed
        super().__init__(problem, path=path, fix=fix)


class UnknownVersionError(LogFormatError, UnsupportedVersionError):
    pass


def unreadable(path: str, e: OSError) -> LogFormatError:
    """The error for a file that cannot be read at all (what Spark would hit too)."""
    import errno

    if isinstance(e, IsADirectoryError) or e.errno == errno.EISDIR:
        what = "is a directory where Spark expects a file: Spark lists it as a batch file and fails to read it"
        fix = "move the directory out of the checkpoint (keep a copy), then run fsck again"
    elif isinstance(e, PermissionError):
        what = "cannot be read: permission denied"
        fix = "give the user that runs Spark and checkpoint-ops read access (Spark fails the same way)"
    elif e.errno == errno.ELOOP:
        what = "cannot be read: a symbolic link loop"
        fix = "replace the link with the file it should point to (restore it from a backup)"
    else:
        what = f"cannot be read: {e.strerror or e}"
        fix = "check the storage, then restore this file from a backup"
    return LogFormatError(what, path=path, kind="unreadable", fix=fix)


TORN_LOG_FIX = ("if it is the newest file of its log: the newest `commits/N`, or `offsets/N` of a batch with "
                "no `commits/N` yet, can be deleted with its `.N.crc` sidecar (Spark runs batch N again; its write "
                "of the file fails on a sidecar left behind; for `offsets/0`, delete state/ too, and batch 0 from "
                "a file sink's log: fsck names both once offsets/0 is gone); once batch N "
                "committed, "
                "`checkpoint-ops rollback` to the batch before it instead (deleting only `offsets/N` leaves a "
                "commit without its offsets, which Spark refuses; the rollback also trims the source and sink "
                "logs); otherwise restore it from a backup")


def split_versioned(data: bytes, path: str, log_kind: str, *, strip_nul: bool = False) -> tuple[int, list[str]]:
    """Validate the version line and return (version, remaining lines)."""
    if strip_nul and data[:1] == b"\x00":
        data = data[1:]  # Kafka's initial offsets file starts with one 0x00 (SPARK-19517)
    if not data:
        raise LogFormatError(
            "file is empty (0 bytes): Spark fails with 'Incomplete log file'",
            path=path,
            kind="empty",
            fix="a crash left a torn write: " + TORN_LOG_FIX,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LogFormatError("file is not UTF-8 text", path=path, kind="malformed",
                             fix="restore this file from a backup or roll back past it")
    lines = text.split("\n")
    head = lines[0].strip()
    max_version = MAX_VERSIONS[log_kind]
    if not head.startswith("v") or not head[1:].isdecimal():
        raise LogFormatError(
            f"first line {head[:40]!r} is not a version line like 'v1'",
            path=path,
            kind="no-version",
            fix="restore this file from a backup or roll back past it",
        )
    version = int(head[1:])
    if version > max_version:
        raise UnknownVersionError(
            f"{log_kind} format v{version} is newer than this tool and Spark 4.3 understand (max v{max_version})",
            path=path,
            kind="unknown-version",
            fix="it was written by a newer Spark: use a spark-checkpoint-ops release that supports it; "
            "do not edit this checkpoint with an older tool",
        )
    if version <= 0:
        raise LogFormatError(f"invalid version line {head!r}", path=path, kind="malformed",
                             fix="restore this file from a backup or roll back past it")
    return version, lines[1:]


def parse_json_line(line: str, path: str, lineno: int, *, last: bool) -> object:
    try:
        return json.loads(line)
    except ValueError:
        kind = "truncated" if last else "not-json"
        what = "ends mid-record (truncated write?)" if last else f"line {lineno} is not valid JSON"
        raise LogFormatError(
            f"{what}: {line[:80]!r}",
            path=path,
            kind=kind,
            fix=TORN_LOG_FIX,
        ) from None
