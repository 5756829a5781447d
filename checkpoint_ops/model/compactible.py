"""Compactible logs (``CompactibleFileStreamLog``): the file-source log and the file-sink log.

Batch ``b`` is a compaction batch when ``(b + 1) % interval == 0``; it is written as
``b.compact`` and holds every live entry so far. Readers take the latest compact ``<= latest``
plus the plain files after it. The interval is never stored: it is derived from the files on
disk exactly as Spark derives it, so this module mirrors that derivation to the letter.
"""

from __future__ import annotations

import functools
import json
from typing import Callable, Iterator, NamedTuple

from .listing import Listing
from .logfile import LogFile, LogFormatError, log_files, parse_json_line, split_versioned, unreadable

SPARK_DEFAULT_COMPACT_INTERVAL = 10


def is_compaction_batch(batch_id: int, interval: int) -> bool:
    return (batch_id + 1) % interval == 0


def all_valid_batches(batch_id: int, interval: int) -> range:
    """Files a reader needs for the log state after ``batch_id`` (Spark's getAllValidBatches)."""
    start = max(0, (batch_id + 1) // interval * interval - 1)
    return range(start, batch_id + 1)


def valid_batches_before_compaction(compaction_id: int, interval: int) -> range:
    """Files a compaction at ``compaction_id`` merges (previous compact plus plain files)."""
    return range(max(0, compaction_id - interval), compaction_id)


def previous_compaction(batch_id: int, interval: int) -> int | None:
    """The latest compaction id ``<= batch_id``, or None before the first one."""
    c = (batch_id + 1) // interval * interval - 1
    return c if c >= 0 else None


def derive_compact_interval(default_interval: int, latest_compact_id: int) -> int:
    """Spark's deriveCompactInterval, for a log with exactly one ``.compact`` file."""
    n = latest_compact_id + 1
    if n <= default_interval:
        return n
    if default_interval < n // 2:
        for d in range(default_interval, n // 2 + 1):
            if n % d == 0:
                return d
        return n
    return n


def infer_interval(compact_ids: list[int], default_interval: int) -> tuple[int, str]:
    """The interval Spark would use for a log with these compact files, and how it was found."""
    ids = sorted(compact_ids, reverse=True)
    if len(ids) >= 2:
        return ids[0] - ids[1], f"difference of the two latest compact files ({ids[1]}, {ids[0]})"
    if len(ids) == 1:
        return (
            derive_compact_interval(default_interval, ids[0]),
            f"derived from {ids[0]}.compact and compactInterval {default_interval}",
        )
    return default_interval, f"no compact file yet: compactInterval {default_interval}"


class LogEntry(NamedTuple):
    """One entry line, kept verbatim so rewritten files are byte-identical to Spark's (a tuple: long
    logs make hundreds of thousands of these)."""

    raw: str
    doc: dict

    @property
    def path(self) -> str:
        return self.doc.get("path", "")


_new_entry = functools.partial(tuple.__new__, LogEntry)


class CompactibleLog:
    """A compactible log directory under a listing root."""

    def __init__(self, listing: Listing, rel_dir: str, kind: str, default_interval: int = SPARK_DEFAULT_COMPACT_INTERVAL):
        self.listing = listing
        self.rel_dir = rel_dir
        self.kind = kind  # "source log" | "sink log"
        self.default_interval = default_interval
        self.files: dict[int, LogFile] = log_files(listing, rel_dir, compactible=True)
        self.compact_ids = [b for b, f in self.files.items() if f.compact]
        self.interval, self.interval_source = infer_interval(self.compact_ids, default_interval)
        self._entries: dict[int, list[LogEntry]] = {}
        self._compacts_held: list[int] = []  # compact files in ``_entries``, least recently parsed first
        self._bad: dict[int, LogFormatError] = {}  # files that failed to read or parse, once
        self._checked: set[int] = set()  # files ``check`` (or a caller's own check) found readable, once

    @property
    def batch_ids(self) -> list[int]:
        return list(self.files)

    @property
    def latest(self) -> int | None:
        return max(self.files) if self.files else None

    def file_name(self, batch_id: int, interval: int | None = None) -> str:
        return f"{batch_id}.compact" if is_compaction_batch(batch_id, interval or self.interval) else str(batch_id)

    def rel(self, batch_id: int, interval: int | None = None) -> str:
        return f"{self.rel_dir}/{self.file_name(batch_id, interval)}"

    def missing_for(self, batch_id: int) -> list[int]:
        """Files a reader of the state after ``batch_id`` needs but cannot find (with the right name)."""
        return [b for b in all_valid_batches(batch_id, self.interval) if self._file_as_spark_names_it(b) is None]

    def _file_as_spark_names_it(self, batch_id: int) -> LogFile | None:
        f = self.files.get(batch_id)
        if f is None or f.compact != is_compaction_batch(batch_id, self.interval):
            return None
        return f

    # -- reading ---------------------------------------------------------------------------
    def parse(self, data: bytes, path: str) -> list[LogEntry]:
        _, lines = split_versioned(data, path, self.kind)
        try:  # one parser call for the whole file (compact files hold every entry so far)
            docs = json.loads("[" + ",".join(lines) + "]")
        except ValueError:
            docs = None
        if docs is not None and len(docs) == len(lines) and all(isinstance(d, dict) for d in docs):
            return list(map(_new_entry, zip(lines, docs)))  # no Python frame per entry
        out = []  # something is wrong: find the line, and say which
        for i, line in enumerate(lines):
            doc = parse_json_line(line, path, i + 2, last=i == len(lines) - 1)
            if not isinstance(doc, dict):
                raise LogFormatError(f"line {i + 2} is not a JSON object", path=path, kind="malformed")
            out.append(LogEntry(line, doc))
        return out

    def check(self, batch_id: int) -> None:
        """Raise what ``read([batch_id])`` would raise for this file, without keeping its entries: the
        file is streamed a line at a time, so memory stays flat however many entries a compact file
        holds (the file source log of a long-running query holds every file it ever read)."""
        if batch_id in self._entries or batch_id in self._checked or batch_id not in self.files:
            return
        if batch_id in self._bad:
            raise self._bad[batch_id]
        path = self.listing.abs(self.files[batch_id].rel)
        url = self.listing.fm.url(path)
        try:
            with self.listing.fm.open_read(path) as f:
                check_log_stream(f, url, self.kind)
            self._checked.add(batch_id)
        except FileNotFoundError:
            self._bad[batch_id] = e = LogFormatError("file vanished while reading (is a query running?)",
                                                     path=url, kind="missing")
            raise e from None
        except OSError as e:
            self._bad[batch_id] = err = unreadable(url, e)
            raise err from None
        except LogFormatError as e:
            self._bad[batch_id] = e
            raise

    def is_checked(self, batch_id: int) -> bool:
        """Whether this file was already found readable (parsed, or checked by ``check``) by this model."""
        return batch_id in self._entries or batch_id in self._checked

    def mark_checked(self, batch_id: int) -> None:
        """A caller checked this file's bytes with ``check_log_stream`` and found it readable."""
        self._checked.add(batch_id)

    def read(self, batch_ids) -> dict[int, list[LogEntry]]:
        """Entries of these batch files (reading each file at most once); raises on a bad file."""
        for b in batch_ids:
            if b in self._bad:
                raise self._bad[b]
        need = [b for b in batch_ids if b not in self._entries and b in self.files]
        if need:
            paths = {self.listing.abs(self.files[b].rel): b for b in need}
            failed: dict[str, OSError] = {}
            data = self.listing.fm.read_many(paths, errors=failed)
            for path, blob in data.items():
                b = paths[path]
                try:
                    if path in failed:
                        raise unreadable(self.listing.fm.url(path), failed[path])
                    if blob is None:
                        raise LogFormatError("file vanished while reading (is a query running?)",
                                             path=self.listing.fm.url(path), kind="missing")
                    self._entries[b] = self.parse(blob, self.listing.fm.url(path))
                except LogFormatError as e:
                    self._bad[b] = e
            for b in need:
                if b in self._bad:
                    raise self._bad[b]
        got = {b: self._entries[b] for b in batch_ids if b in self._entries}
        self._release_compacts([b for b in need if b in self._entries])
        return got

    # A compact file holds every entry so far, so the entries of all of them grow with the square of the batches
    # (the window reads one as of each retained batch; fsck parses each): only the newest parsed are held.
    COMPACTS_HELD = 2

    def _release_compacts(self, parsed: list[int]) -> None:
        """After ``parsed`` were parsed into ``_entries``: drop the entries of all but the ``COMPACTS_HELD`` compact
        files parsed last. A dropped file stays known readable (``is_checked``); asked for again, it is read
        again."""
        held = self._compacts_held
        for b in parsed:
            if self.files[b].compact:
                if b in held:
                    held.remove(b)
                held.append(b)
        while len(held) > self.COMPACTS_HELD:
            b = held.pop(0)
            if self._entries.pop(b, None) is not None:
                self._checked.add(b)

    def stream_lines(self, batch_id: int):
        """The entry lines of one file as bytes, streamed (the log can be far bigger than memory).
        Checks only the version line; callers that need entries parse what they keep."""
        path = self.listing.abs(self.files[batch_id].rel)
        url = self.listing.fm.url(path)
        try:
            with self.listing.fm.open_read(path) as f:
                head = f.readline().rstrip(b"\r\n")
                if not head:
                    raise LogFormatError("file is empty (0 bytes)", path=url, kind="empty")
                if head != b"v1":
                    raise LogFormatError(f"first line {head[:20]!r} is not 'v1'", path=url, kind="no-version")
                for line in f:
                    line = line.rstrip(b"\r\n")
                    if line:
                        yield line
        except OSError as e:
            raise unreadable(url, e) from None

    def common_prefix_rest(self, batch_id: int, previous: list[int], block: int = 4 * 2**20) -> bytes | None:
        """If file ``batch_id`` is the entries of ``previous`` (in order) followed by more, those more
        (newline-separated entry lines); None if it is not. Compared in blocks of bytes."""
        fm = self.listing.fm

        def entry_bytes(b: int):
            with fm.open_read(self.listing.abs(self.files[b].rel)) as f:
                if f.readline().rstrip(b"\r\n") != b"v1":
                    raise LogFormatError("not a v1 log file", path=self.listing.url(self.files[b].rel),
                                         kind="no-version")
                while chunk := f.read(block):
                    yield chunk

        def joined():  # what the previous files contribute: their entry lines, newline-separated
            first = True
            for b in previous:
                sep = b"" if first else b"\n"
                for chunk in entry_bytes(b):
                    if sep:
                        chunk, sep = sep + chunk, b""
                    if chunk:
                        first = False
                    yield chunk

        try:
            mine = entry_bytes(batch_id)
            buf = b""
            for want in joined():
                while len(buf) < len(want):
                    more = next(mine, None)
                    if more is None:
                        return None
                    buf += more
                if buf[:len(want)] != want:
                    return None
                buf = buf[len(want):]
            rest = buf + b"".join(mine)
        except OSError as e:
            raise unreadable(self.listing.url(self.files[batch_id].rel), e) from None
        if previous and rest and not rest.startswith(b"\n"):
            return None
        return rest

    def prefetch(self, batch_ids) -> None:
        """Read these files in one concurrent batch (object stores) without raising: errors are kept
        for ``read`` to raise when someone asks for that file."""
        need = [b for b in batch_ids if b in self.files and b not in self._entries and b not in self._bad]
        if len(need) > 1:
            try:
                self.read(need)
            except LogFormatError:
                pass  # recorded per file in _bad

    def read_all_lenient(self, on_bytes: Callable[[dict[str, bytes]], None], skip=(),
                         chunk_bytes: int = 64 * 2**20) -> list[LogFormatError]:
        """Read and parse every file once (but those in ``skip``, batch ids a caller already knows to be
        sound, and those already found readable), collecting errors per file instead of stopping: the errors.

        Read a chunk of files at a time (about ``chunk_bytes``): ``on_bytes`` gets each chunk's bytes by absolute
        path (for checksum checks) before they are let go, since a log's compact files together grow with the
        square of its batches. Parsed entries land in the cache that ``read``/``entries_after`` use (of compact
        files, the last ``COMPACTS_HELD``).
        """
        paths = {self.listing.abs(f.rel): b for b, f in self.files.items()
                 if b not in self._entries and b not in self._checked and b not in skip}
        errors = [e for b, e in self._bad.items() if self.listing.abs(self.files[b].rel) in paths]
        todo = [p for p, b in paths.items() if b not in self._bad]
        # a compact file's size (a stat on local disk, where the listing has none); a plain one holds one batch's
        sizes = {p: self.files[paths[p]].info.size if self.files[paths[p]].compact
                 else self.files[paths[p]].info.known_size for p in todo}
        for chunk in in_chunks(todo, sizes, chunk_bytes):
            failed: dict[str, OSError] = {}
            raw = {}
            for path, blob in self.listing.fm.read_many(chunk, errors=failed).items():
                if path in failed:
                    self._bad[paths[path]] = e = unreadable(self.listing.fm.url(path), failed[path])
                    errors.append(e)
                    continue
                if blob is None:
                    continue
                raw[path] = blob
                try:
                    self._entries[paths[path]] = self.parse(blob, self.listing.fm.url(path))
                    self._release_compacts([paths[path]])
                except LogFormatError as e:
                    self._bad[paths[path]] = e
                    errors.append(e)
            on_bytes(raw)
        return errors

    def entries_after(self, batch_id: int) -> list[LogEntry]:
        """Spark's ``allFiles()`` as of ``batch_id``; raises if a needed file is missing."""
        missing = self.missing_for(batch_id)
        if missing:
            rels = ", ".join(self.rel(b) for b in missing)
            raise LogFormatError(
                f"{self.kind} cannot be read as of batch {batch_id}: missing {rels}",
                path=self.listing.url(self.rel_dir),
                kind="gap",
            )
        ids = list(all_valid_batches(batch_id, self.interval))
        got = self.read(ids)
        return [e for b in ids for e in got[b]]

    @staticmethod
    def serialize(entries: list[LogEntry], version: int = 1) -> bytes:
        """File content as Spark writes it: version line, one JSON per line, no trailing newline."""
        return "\n".join([f"v{version}", *(e.raw for e in entries)]).encode("utf-8")

    @staticmethod
    def entry(doc: dict) -> LogEntry:
        return LogEntry(json.dumps(doc, separators=(",", ":")), doc)


def in_chunks(paths: list[str], sizes: dict[str, int | None], budget: int, most: int = 1024) -> Iterator[list[str]]:
    """``paths`` in order, in runs of about ``budget`` bytes (``sizes``; unknown counts as 0) and at most ``most``
    paths, each at least one."""
    run, held = [], 0
    for path in paths:
        size = sizes.get(path) or 0
        if run and (held + size > budget or len(run) == most):
            yield run
            run, held = [], 0
        run.append(path)
        held += size
    if run:
        yield run


def check_log_stream(f, path: str, kind: str) -> None:
    """``CompactibleLog.parse`` of a binary stream, keeping nothing: raises the same LogFormatError it
    would (the whole file is not UTF-8 before any line is not JSON; the last line that is not JSON is
    truncated, an earlier one is not JSON; a line that is JSON but not an object is malformed)."""
    head = f.readline()
    had_newline = head.endswith(b"\n")
    split_versioned(head[:-1] if had_newline else head, path, kind)
    if not had_newline:
        return  # the version line alone: no entries
    first_error: LogFormatError | None = None
    not_utf8 = False
    lineno = 1
    line = f.readline()
    while True:
        lineno += 1
        nxt = f.readline() if line.endswith(b"\n") else None
        last = nxt is None
        body = line[:-1] if line.endswith(b"\n") else line
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            not_utf8 = True
            text = None
        if text is not None and first_error is None:
            try:
                doc = parse_json_line(text, path, lineno, last=last)
                if not isinstance(doc, dict):
                    raise LogFormatError(f"line {lineno} is not a JSON object", path=path, kind="malformed")
            except LogFormatError as e:
                first_error = e
        if last:
            break
        line = nxt
    if not_utf8:
        raise LogFormatError("file is not UTF-8 text", path=path, kind="malformed",
                             fix="restore this file from a backup or roll back past it")
    if first_error is not None:
        raise first_error
