"""The window memo: which batches an earlier pass found restartable, and on exactly which files.

The rollback window (``window.py``) asks, for every retained batch from the newest down, whether its
restart set (``restart.py``) is all there and readable. Assembling a set reads and parses its offsets,
its source-log and sink-log files and the data files those name, so a window of N batches costs O(N)
even when every file verdict comes from the verdict cache. The memo makes it O(new batches): an earlier
pass remembers, for each batch whose set it found sound, a 64-bit **dependency digest**, and a later
pass takes the batch as sound without assembling its set while the digest it computes now is the same.

**The digest of batch t** covers a superset of the files the shallow restart set of t reads (and of the
files whose arrival could change which files it reads), each by name, size and mtime, and for log files
with their Hadoop ``.crc`` sidecar:

* the *context*, shared by every batch: ``metadata``; the state provider, checkpoint format and every
  state store directory; every file under ``state/`` that is not a state file of a store (operator
  metadata, the v3 schema files, each store's ``_metadata/schema``; not a store's ``SSTs/`` and ``logs/``,
  which only a deep check reads); each source log's directory and compact interval; each sink's
  location and compact interval;
* ``offsets/t-1``, ``offsets/t`` and ``commits/t``;
* for each source with a log, its log offset k in ``offsets/t`` and every log file with an id in
  ``[k - interval - 1, k]`` (the latest compact file at or below k and the plain files after it are in
  that range);
* for each file sink, u = min(t, the sink log's latest batch) and every sink-log file with an id in
  ``[u - interval - 1, u]``;
* the state files of every store with a version in ``[base(t + 1), t + 1]``, where base(v) is the
  lowest, over the stores, of the newest snapshot (HDFS ``.snapshot``, RocksDB ``.zip``) at or below v
  (a load of version v reads no state file below its snapshot).

A file changed, gone or added anywhere in those ranges changes the digest, and the batch is judged
again: a state delta deleted by maintenance, a sink-log file truncated, a purge by retention all
invalidate exactly the batches whose sets could use the file.

**Not remembered** (judged on every pass, as without a memo): a batch whose set was not sound (damage
must be named as it is now); a set with a log file Spark may still rewrite (``verdicts.live_rels``,
``metadata`` apart: the window judges the newest batch, which always has such files, first, and with
it ``metadata``); a set that used a file the batch ledger supplied or a source-log file
rebuilt from a later compact file (those reach past the ranges above); anything when the checkpoint is
fenced, uses state unique ids (checkpoint format V2: the lineage runs through ``commits/``), or when a
sink's data files do not match the seal the last pass left (``verdicts.DataSeal``: a data file that a
sound batch's sink-log entries name may be gone). Batches are remembered only with the verdict cache's
rules: the memo lives in it (``verdicts.py``), is an optimisation only, and a damaged one is ignored.
A stamp is enough for the other files: what the shallow set judges of a state file or a sink data file
(there, size, readable, sidecar size) is what the listing says, and the stamp is that.

**Nothing read for a remembered batch.** Its entry keeps, beside the digest, each source log's offset in
``offsets/t`` as the pass that remembered it read them. The digest covers ``offsets/t`` by its stamp, so
while the digest matches, ``offsets/t`` is the file those offsets were read from (the verdict cache's own
premise), and the digest is computed from the listing alone: a pass reads the files of the batches it
judges, not of every retained one. An entry without them (written by an earlier version) is checked by
reading ``offsets/t``, and rewritten with them.

**Size.** One entry per remembered batch: its id, a 16-hex-digit digest and the source logs' offsets,
about 35 bytes in the cache for one source.
"""

from __future__ import annotations

import bisect
import hashlib
import re

from .model.listing import Listing

_LOG_NAME = re.compile(r"^\.?(\d+)(?:\.compact)?(?:\.crc)?$")
# a store's subdirectories whose files only a deep check reads (RocksDB's SSTs and archived logs); its
# ``_metadata/schema`` (the v1/v2 state schema) every restart set reads, so it is in the context
_UNREAD_STORE_SUBDIRS = frozenset({"SSTs", "logs"})
_MASK = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # odd: multiplying by it mod 2**64 is a bijection


def _h(*parts) -> int:
    """A stable 64-bit hash (Python's ``hash`` of a str differs between processes)."""
    return int.from_bytes(hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=8).digest(), "big")


def _mix(acc: int, value: int) -> int:
    return ((acc ^ value) * _MIX + 0x632BE59BD9B4E019) & _MASK


def _stamp(info) -> str:
    error = info.error
    return f"{info.size}:{info.mtime!r}" if error is None else f"error:{error}"


class _IdHashes:
    """XOR of the hashes of every file of one log directory, by batch id (a file and its ``.crc``
    sidecar, ``n`` and ``n.compact`` share an id), for single ids and ranges.

    Computed per id when first asked, from the names a file of that id can have (``n``, ``n.compact``,
    each with and without a leading dot and a ``.crc`` suffix): a pass asks for the ids of the batches
    it judges, not for every file of a directory of 10,000s. Where the directory holds a name whose id
    has a leading zero (``007``: Spark's ``isBatchFile`` takes it as batch 7), or a subdirectory named
    like a log file (the model takes it as that batch's file, one Spark fails to read), every name is
    grouped by its id up front, as the pattern reads it, directories included."""

    def __init__(self, listing: Listing, rel_dir: str):
        self.rel_dir = rel_dir
        self._files = listing.files_in(rel_dir)
        self._by_id: dict[int, int] = {}
        self._last_range: tuple[int, int, int] | None = None  # (first, last, XOR) of the last range asked
        match = _LOG_NAME.match
        self._dirs = [name for name in listing.subdirs(rel_dir) if match(name)]
        odd = bool(self._dirs) or any(name.startswith(("0", ".0")) and _leading_zero(name) for name in self._files)
        self._all = self._group_all() if odd else None

    def _group_all(self) -> dict[int, int]:
        parts: dict[int, list[str]] = {}
        match = _LOG_NAME.match
        for name, info in self._files.items():
            m = match(name)
            if m:
                parts.setdefault(int(m.group(1)), []).append(f"{name}\t{_stamp(info)}")
        for name in self._dirs:
            parts.setdefault(int(match(name).group(1)), []).append(f"{name}/\tdirectory")
        return {b: _h(self.rel_dir, *sorted(names)) for b, names in parts.items()}

    def one(self, b: int) -> int:
        if self._all is not None:
            return self._all.get(b, 0)
        got = self._by_id.get(b)
        if got is None:
            files = self._files
            names = [f"{name}\t{_stamp(files[name])}" for name in _names_of(b) if name in files]
            got = self._by_id[b] = _h(self.rel_dir, *sorted(names)) if names else 0
        return got

    def range(self, first: int, last: int) -> int:
        """XOR over ids ``first..last`` (inclusive). The window asks for ranges that slide by one batch at a time
        (newest down), so the last range's XOR is kept and moved by its edges: an id XORed in twice cancels, and
        ``first..last`` is the last range XOR the ids between the two firsts and between the two lasts."""
        first = max(first, 0)
        if last < first:
            return 0
        last_range = self._last_range
        if last_range is not None:
            was_first, was_last, acc = last_range
            if abs(first - was_first) + abs(last - was_last) < last - first + 1:
                for b in range(min(first, was_first), max(first, was_first)):
                    acc ^= self.one(b)
                for b in range(min(last, was_last) + 1, max(last, was_last) + 1):
                    acc ^= self.one(b)
                self._last_range = (first, last, acc)
                return acc
        acc = 0
        for b in range(first, last + 1):
            acc ^= self.one(b)
        self._last_range = (first, last, acc)
        return acc


def _names_of(b: int) -> list[str]:
    """Every name ``_LOG_NAME`` reads as id ``b`` when written without leading zeros."""
    return [f"{dot}{b}{compact}{crc}" for dot in ("", ".") for compact in ("", ".compact") for crc in ("", ".crc")]


def _leading_zero(name: str) -> bool:
    m = _LOG_NAME.match(name)
    return m is not None and len(m.group(1)) > 1 and m.group(1)[0] == "0"


class WindowMemo:
    """Dependency digests of a checkpoint's batches, and what an earlier pass remembered (``cache``: a
    ``verdicts.VerdictCache``). ``usable``: batches may be remembered (module docstring); ``trusted``:
    and what earlier passes remembered may be used (every sink's data seal holds). Otherwise
    ``is_sound`` answers False and ``remember`` does nothing."""

    def __init__(self, ckpt, sinks, cache):
        self.ckpt, self.sinks, self.cache = ckpt, list(sinks), cache
        self.usable = self._usable()
        self.trusted = self.usable and all(self.cache.seal_holds(f"sink{i}", s.listing)
                                           for i, s in enumerate(self.sinks) if s.log.latest is not None)
        self._live: set | None = None
        self._answers: dict[int, bool] = {}
        if self.usable:
            self._prepare()

    def _usable(self) -> bool:
        ck = self.ckpt
        if self.cache is None or ck.kind != "structured" or ck.fence is not None or ck.state.has_unique_ids:
            return False
        return not any(f.unique_id is not None for s in ck.state.stores() for f in s.files)

    # -- digests ---------------------------------------------------------------------------------
    def _prepare(self) -> None:
        ck, L = self.ckpt, self.ckpt.listing
        self.offsets = _IdHashes(L, "offsets")
        self.commits = _IdHashes(L, "commits")
        self.source_logs = [(sid, src.log, _IdHashes(L, src.log.rel_dir))
                            for sid, src in sorted(ck.sources.items()) if src.log is not None]
        self.sink_logs = [(s.log.latest, s.log.interval, _IdHashes(s.listing, s.log.rel_dir)) for s in self.sinks]
        stores = ck.state.stores()
        store_dirs = {s.rel_dir for s in stores}
        state_files = {f.rel for s in stores for f in s.files} | {r for s in stores for f in s.files for r in f.sidecars}
        context = [f"ctx\t{ck.state.provider}\t{ck.checkpoint_format_version}"]
        for rel in ("metadata", ".metadata.crc"):
            info = L.get(rel)
            context.append(f"{rel}\t{_stamp(info) if info else '-'}")
        for s in sorted(stores, key=lambda s: s.rel_dir):
            context.append(f"store\t{s.rel_dir}\t{s.has_changelog}")
        for rel, info in L.under("state"):
            parent = rel.rpartition("/")[0]
            up, _, sub = parent.rpartition("/")
            if rel in state_files or parent in store_dirs or (up in store_dirs and sub in _UNREAD_STORE_SUBDIRS):
                continue  # state files are hashed by version; a store's SSTs and logs no shallow check reads
            context.append(f"{rel}\t{_stamp(info)}")  # with each store's ``_metadata/schema`` (v1/v2 schema)
        for sid, log, _ in self.source_logs:
            context.append(f"source\t{sid}\t{log.rel_dir}\t{log.interval}")
        for i, s in enumerate(self.sinks):
            context.append(f"sink\t{i}\t{s.url}\t{s.log.interval}")
        self.context = _h(*sorted(context))
        # state: XOR of each version's files over every store, prefix XORs, and each store's snapshots
        by_version: dict[int, int] = {}
        self.snapshots: list[list[int]] = []
        for s in stores:
            snaps = []
            for f in s.files:
                h = _h(f.rel, _stamp(f.info) if f.info is not None else "-",
                       *(f"{r}:{_stamp(L.get(r)) if L.get(r) else '-'}" for r in sorted(f.sidecars)))
                by_version[f.version] = by_version.get(f.version, 0) ^ h
                if f.kind in ("snapshot", "zip"):
                    snaps.append(f.version)
            self.snapshots.append(sorted(snaps))
        # by the versions present, not every version between the lowest and the highest: a stray file of a
        # version far from the others (a removed operator's leftovers) costs one entry, not one per version
        self._state_versions = sorted(by_version)
        acc, prefix = 0, [0]
        for v in self._state_versions:
            acc ^= by_version[v]
            prefix.append(acc)
        self._state_prefix = prefix

    def _state_range(self, first: int, last: int) -> int:
        """XOR of the state files' hashes of every version in ``first..last`` (inclusive)."""
        lo = bisect.bisect_left(self._state_versions, first)
        hi = bisect.bisect_right(self._state_versions, last)
        return self._state_prefix[hi] ^ self._state_prefix[lo] if hi > lo else 0

    def _base(self, version: int) -> int:
        """The lowest version any store's load of ``version`` starts from (its newest snapshot at or below)."""
        base = version
        for snaps in self.snapshots:
            i = bisect.bisect_right(snaps, version)
            base = min(base, snaps[i - 1] if i else 0)
            if base == 0:
                break
        return base

    def _log_offsets(self, batch: int) -> list[int | None] | None:
        """Each source log's offset in ``offsets/batch`` (in ``source_logs`` order); None if it does not parse."""
        offsets = self.ckpt.load_offsets([batch], errors=[]).get(batch)
        if offsets is None:
            return None
        return [so.log_offset if (so := offsets.source(sid)) else None for sid, _, _ in self.source_logs]

    def digest(self, batch: int, log_offsets: list[int | None] | None = None) -> str | None:
        """The dependency digest of ``batch`` now (None: it cannot be computed, e.g. offsets/``batch``
        does not parse). ``log_offsets``: the source logs' offsets of ``offsets/batch`` as an earlier pass
        read them (``remember``), so that nothing is read: the digest covers ``offsets/batch`` by its
        stamp, so while it is the same it is the same file, and these are still its offsets."""
        if log_offsets is None:
            log_offsets = self._log_offsets(batch)
            if log_offsets is None:
                return None
        acc = _mix(self.context, batch)
        acc = _mix(acc, self.offsets.one(batch - 1))
        acc = _mix(acc, self.offsets.one(batch))
        acc = _mix(acc, self.commits.one(batch))
        for (sid, log, ids), k in zip(self.source_logs, log_offsets):
            acc = _mix(acc, _h("k", sid, k))
            if k is not None:
                acc = _mix(acc, ids.range(k - log.interval - 1, k))
        for latest, interval, ids in self.sink_logs:
            if latest is None:
                continue
            upto = min(batch, latest)
            acc = _mix(acc, upto)
            acc = _mix(acc, ids.range(upto - interval - 1, upto))
        if self.snapshots:
            v = batch + 1
            acc = _mix(acc, self._state_range(self._base(v), v))
        return f"{acc:016x}"

    # -- what earlier passes found -----------------------------------------------------------------
    @staticmethod
    def _entry(digest: str, log_offsets: list[int | None]) -> str:
        """What the cache keeps for a batch: its digest, and the source logs' offsets it was computed with."""
        return digest + "|" + ",".join("-" if k is None else str(k) for k in log_offsets)

    def _parse_entry(self, entry: str) -> tuple[str, list[int | None] | None]:
        """(digest, log offsets or None: an entry without them, or with a count that is not this
        checkpoint's, is checked by reading ``offsets/batch``)."""
        digest, sep, rest = entry.partition("|")
        if not sep:
            return digest, None
        parts = rest.split(",") if rest else []
        if len(parts) != len(self.source_logs) or not all(p == "-" or p.isdecimal() for p in parts):
            return digest, None
        return digest, [None if p == "-" else int(p) for p in parts]

    def without_log_offsets(self, batches) -> list[int]:
        """Of these batches, those remembered by an entry without its log offsets (an earlier version's):
        answering them reads ``offsets/t``, so a caller reads those in one go first."""
        if not self.trusted:
            return []
        out = []
        for b in batches:
            entry = self.cache.window_digest(b)
            if entry is not None and self._parse_entry(entry)[1] is None:
                out.append(b)
        return out

    def answers(self, batch: int) -> bool:
        """Whether an earlier pass found ``batch``'s restart set sound on exactly these files. Reads
        nothing when the entry carries its log offsets; changes nothing (``is_sound`` takes the answer)."""
        if not self.trusted:
            return False
        if batch not in self._answers:
            entry = self.cache.window_digest(batch)
            ok = False
            if entry is not None:
                want, log_offsets = self._parse_entry(entry)
                ok = self.digest(batch, log_offsets) == want
            self._answers[batch] = ok
        return self._answers[batch]

    def is_sound(self, batch: int) -> bool:
        """``answers``, and the batch stays remembered (with its log offsets) for the next pass."""
        if not self.answers(batch):
            return False
        want, log_offsets = self._parse_entry(self.cache.window_digest(batch))
        if log_offsets is None:  # an entry of an earlier version: offsets/batch was read to check it
            log_offsets = self._log_offsets(batch)
        self.cache.remember_window(batch, self._entry(want, log_offsets))
        self.cache.window_hits += 1
        return True

    def remember(self, batch: int, restart_set) -> None:
        """Remember a batch just judged: only a sound set read from Spark's own files (module docstring)."""
        if not self.usable or restart_set.damage or any(f.origin != "disk" for f in restart_set.files):
            return
        if self._live is None:
            from .verdicts import live_rels

            self._live = live_rels(self.ckpt, self.sinks) - {("checkpoint", "metadata")}
        if any((f.root, f.rel) in self._live for f in restart_set.files):
            return
        log_offsets = self._log_offsets(batch)
        got = self.digest(batch, log_offsets) if log_offsets is not None else None
        if got is not None:
            self.cache.remember_window(batch, self._entry(got, log_offsets))


__all__ = ["WindowMemo"]
