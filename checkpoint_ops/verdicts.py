"""The verdict cache: what earlier checks found about files that cannot have changed since.

Inspect, fsck (and the Dagster health check), the rollback window and ledger sync judge each log file
Spark left: does it parse, does its Hadoop ``.crc`` sidecar match it, do the sink data files its
entries name exist. Spark never rewrites a log file once a later batch has been written, so a
verdict of "sound" found for a file stays true for as long as the file is the same file. The cache
remembers those verdicts between runs so that a materialization reads only what is new.

**Key.** A file is the same file when its name, size and modification time (what the listing gives:
``mtime`` locally, ``LastModified`` on object stores) are the same, and so are those of its Hadoop
``.crc`` sidecar (or it still has none). Anything else is a different file and is judged again.

**What is cached.** Only verdicts of *sound*: a damaged file is judged again on every run (damage is
rare, and its finding must name what is there now). The files of ``offsets/`` and ``commits/`` are judged
like the logs; of an offsets file the verdict keeps what fsck asks of every one without reading it again
(its format version and number of sources, ``record_sound(detail=...)``); inspect's per-batch list still
reads them all, so a materialization's pass leaves it out (``check_pass``). Verdicts that depend on other files say so in
their key: that a sink log file's entries all have their data file holds while no file of the sink's
output that existed when it was judged has gone (``DataSeal``).

**Files Spark may still rewrite are never taken from the cache** (``live_rels``):

* in the checkpoint: ``metadata``; the newest ``offsets/`` and ``commits/`` files and every one above
  the latest commit (a running or failed batch; Spark rewrites a torn newest file); the newest file of
  each source log;
* in each file sink: the newest file of its ``_spark_metadata`` log;
* any log file modified within ``MTIME_SLACK`` seconds of the newest file of its log (object stores
  and some file systems keep modification times to the second: a rewrite in the same second with the
  same size would otherwise look unchanged);
* state files are not cached at all (their verdicts are judged from the listing and what a restart
  reads, each run).

**The window memo** (``window_memo.py``) is kept here too: for each batch whose restart set a pass found
sound, a digest of every file that set could read; a batch whose digest is unchanged is not judged
again. Its own rules say what it never remembers.

**An optimisation only.** Deleting the cache, or a damaged one (torn, not JSON, another format, a newer
format, entries of the wrong shape), changes no verdict: it is ignored (and replaced by the next save),
never trusted. So is a cache other code wrote (``written_by``: the version and a digest of this package's
code, ``tool_build``, so a change between releases counts too): its verdicts and remembered findings are
what that code's checks found, and a check added since would never see the files it vouches for. The cache lives beside the ledger, never inside the checkpoint
(``<parent>/.checkpoint-ops/<name>/verdicts.json``), and is written whole through the file manager's
atomic write: two writers at once leave one of the two whole caches (last writer wins), never a torn
one, and a torn one would be ignored anyway.

**Who writes it.** The read-only commands ``inspect`` and ``fsck`` never write (their contract is that
they change nothing anywhere): the CLI gives them no cache. Only the Dagster path reads and writes it
(``check_pass.py``: the materialization's one pass, then its health check), beside the ledger it
writes anyway. A cache that cannot be written only makes the next run slower (``save`` returns False).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import weakref
from array import array
from dataclasses import dataclass

from . import __version__
from .errors import STORE_FAILURES
from .journal import ops_dir
from .model.listing import Listing
from .pairing import PAIRING_FILE
from .storage import CheckpointFileManager
from .storage.checksums import hadoop_crc_name
from .storage.paths import join

FORMAT = 1
CACHE_NAME = "verdicts.json"
MTIME_SLACK = 2.0  # seconds: files this close to the newest of their log are judged again every run
_NOT_DATA = {PAIRING_FILE, hadoop_crc_name(PAIRING_FILE)}  # in a sink's root, never named by its log


@functools.lru_cache(maxsize=1)
def tool_build() -> str:
    """This package's version and a digest of its code (every ``.py`` file, in order): what a verdict cache
    records as ``written_by``. The version alone stays the same across unreleased changes."""
    h = hashlib.sha256()
    package = os.path.dirname(os.path.abspath(__file__))
    for directory, subdirs, names in os.walk(package):
        subdirs.sort()
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(directory, name)
            h.update(os.path.relpath(path, package).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return f"{__version__}+{h.hexdigest()[:12]}"


@dataclass(frozen=True)
class DataSeal:
    """What a sink's output held when its verdicts were found: every file outside the log modified up to
    ``horizon``, by count and digest of names. While the files modified up to ``horizon`` are still
    exactly these, no file the verdicts relied on has gone (a file deleted and written again has a newer
    mtime, and breaks the seal; so does one restored with an old mtime that was not there). Our own
    pairing record (``pairing.PAIRING_FILE`` and its sidecar), rewritten by every ledger sync and named
    by no sink-log entry, is not part of the seal."""

    horizon: float
    count: int
    digest: str

    @classmethod
    def of(cls, listing: Listing, horizon: float | None = None) -> "DataSeal":
        names, mtimes = _data_files(listing)
        if horizon is None:
            top = max((mtime for mtime in mtimes if mtime > 0.0), default=0.0)  # never below 0 (files dated 1970)
        else:
            names = [rel for rel, mtime in zip(names, mtimes) if mtime <= horizon]
        digest = hashlib.sha256("\n".join(names).encode()).hexdigest()
        return cls(top if horizon is None else horizon, len(names), digest)

    def holds(self, listing: Listing) -> bool:
        return DataSeal.of(listing, self.horizon) == self

    def to_dict(self) -> dict:
        return {"horizon": self.horizon, "count": self.count, "digest": self.digest}


_DATA_FILES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # listing -> (names, their mtimes)


def _data_files(listing: Listing) -> tuple[list[str], array]:
    """A sink listing's files outside its log, sorted by name, and their mtimes (0 where unknown): found once per
    listing (a snapshot of one walk, never changed), which a pass seals and checks its seal against up to three
    times. Kept while the listing lives, compactly: the names are the listing's own strings, the mtimes 8 bytes each."""
    got = _DATA_FILES.get(listing)
    if got is None:
        files = listing.files
        names = sorted(rel for rel in files if not rel.startswith("_spark_metadata/") and rel not in _NOT_DATA)
        got = _DATA_FILES[listing] = (names, array("d", [files[rel].mtime or 0.0 for rel in names]))
    return got


def file_stamp(listing: Listing, rel: str) -> str | None:
    """The cache key of one file: size and mtime of it and of its Hadoop ``.crc`` sidecar; None when
    the listing cannot say (not listed, or an entry with an error)."""
    info = listing.get(rel)
    if info is None or info.error is not None or info.mtime is None:
        return None
    parent, _, name = rel.rpartition("/")
    crc_rel = f"{parent}/{hadoop_crc_name(name)}" if parent else hadoop_crc_name(name)
    crc = listing.get(crc_rel)
    crc_part = "-" if crc is None else f"{crc.size}:{crc.mtime!r}"
    return f"{info.size}:{info.mtime!r}|{crc_part}"


_LIVE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> [(sinks, live_rels)]


def live_rels(ckpt, sinks) -> set[tuple[str, str]]:
    """``(root, rel)`` of every log file Spark may still rewrite (module docstring), with the roots
    ``restart.py`` uses: ``checkpoint`` and ``sink<i>``. Found once per model (a model is a snapshot of
    one listing; the window, fsck and the fingerprint of one pass all ask): a copy each time."""
    sinks = tuple(sinks)
    known = _LIVE.setdefault(ckpt, [])
    for got_sinks, got in known:
        if len(got_sinks) == len(sinks) and all(a is b for a, b in zip(got_sinks, sinks)):
            return set(got)
    live = _live_rels(ckpt, sinks)
    known.append((sinks, frozenset(live)))
    return live


def _live_rels(ckpt, sinks) -> set[tuple[str, str]]:
    live: set[tuple[str, str]] = set()
    if ckpt.kind != "structured":
        return live
    live.add(("checkpoint", "metadata"))
    C = ckpt.latest_commit
    for kind, files in (("offsets", ckpt.offset_files), ("commits", ckpt.commit_files)):
        if files:
            top = max(files)
            live.update(("checkpoint", f.rel) for b, f in files.items()
                        if b == top or (C is not None and b > C) or C is None)
            _recent(live, "checkpoint", ckpt.listing, files.values())
    for src in ckpt.sources.values():
        if src.log is not None and src.log.files:
            live.add(("checkpoint", src.log.files[max(src.log.files)].rel))
            _recent(live, "checkpoint", ckpt.listing, src.log.files.values())
    for i, sink in enumerate(sinks):
        if sink.log.files:
            live.add((f"sink{i}", sink.log.files[max(sink.log.files)].rel))
            _recent(live, f"sink{i}", sink.listing, sink.log.files.values())
    return live


def _recent(live: set, root: str, listing: Listing, files) -> None:
    files = list(files)
    times = [f.info.mtime for f in files if f.info.mtime is not None]
    if not times:
        return
    newest = max(times)
    live.update((root, f.rel) for f in files if f.info.mtime is None or f.info.mtime >= newest - MTIME_SLACK)


class VerdictCache:
    """Verdicts of sound files, by ``(root, rel)`` and ``file_stamp``; and each sink's ``DataSeal``.

    ``load`` never raises on a damaged cache: it starts empty and says why in ``ignored``. ``save``
    keeps only what this run confirmed or found (files gone since drop out, so the cache stays the
    size of what Spark retains).
    """

    def __init__(self, fm: CheckpointFileManager, path: str, sound: dict[str, str] | None = None,
                 seals: dict[str, DataSeal] | None = None, ignored: str | None = None,
                 old_findings: tuple[str, list] | None = None, window: dict[str, str] | None = None):
        self.fm = fm
        self.path = path
        self._old = dict(sound or {})
        self._old_seals = dict(seals or {})
        self._new: dict[str, str] = {}
        self._new_seals: dict[str, DataSeal] = {}
        self.ignored = ignored  # why the stored cache was not used (None: it was, or there was none)
        self._old_findings = old_findings  # (fingerprint, findings as dicts) of the last whole fsck
        self._new_findings: tuple[str, list] | None = None
        self._old_window = dict(window or {})  # batch id (str) -> dependency digest (window_memo.py)
        self._new_window: dict[str, str] = {}
        self.window_hits = 0  # batches the window took from the memo
        self.hits = 0
        self.save_error: str | None = None
        self.misses = 0

    @classmethod
    def for_checkpoint(cls, ckpt) -> "VerdictCache":
        return cls.load(ckpt.fm, join(ops_dir(ckpt.fm, ckpt.root), CACHE_NAME))

    @classmethod
    def load(cls, fm: CheckpointFileManager, path: str) -> "VerdictCache":
        try:
            data = fm.read_bytes(path)
        except FileNotFoundError:
            return cls(fm, path)
        except OSError as e:
            return cls(fm, path, ignored=f"cannot be read: {e}")
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                got = doc.get("format") if isinstance(doc, dict) else None
                return cls(fm, path, ignored=f"format {got!r} is not {FORMAT}")
            if doc.get("written_by") != tool_build():
                return cls(fm, path, ignored=f"written by checkpoint-ops {doc.get('written_by')!r}, not by this "
                                             f"code ({tool_build()}): every file is judged afresh")
            sound = doc["sound"]
            if not isinstance(sound, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                      for k, v in sound.items()):
                raise TypeError
            seals = {k: DataSeal(float(v["horizon"]), int(v["count"]), str(v["digest"]))
                     for k, v in doc["seals"].items()}
            last = doc.get("fsck")
            old_findings = None
            if last is not None:
                if not isinstance(last["fingerprint"], str) or not isinstance(last["findings"], list) or \
                        not all(isinstance(f, dict) for f in last["findings"]):
                    raise TypeError
                old_findings = (last["fingerprint"], last["findings"])
            window = doc.get("window", {})
            if not isinstance(window, dict) or not all(isinstance(k, str) and k.isdecimal() and isinstance(v, str)
                                                       for k, v in window.items()):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls(fm, path, ignored="not a verdict cache this tool writes (torn or damaged)")
        return cls(fm, path, sound, seals, old_findings=old_findings, window=window)

    # -- verdicts ------------------------------------------------------------------------------
    @staticmethod
    def _key(scope: str, root: str, rel: str) -> str:
        return f"{scope}\t{root}\t{rel}"

    def is_sound(self, scope: str, root: str, rel: str, stamp: str | None) -> bool:
        """Whether an earlier run found this very file sound (for ``scope``: what was judged)."""
        if stamp is None:
            return False
        key = self._key(scope, root, rel)
        if self._old.get(key) == stamp or self._new.get(key) == stamp:
            self._new[key] = stamp
            self.hits += 1
            return True
        self.misses += 1
        return False

    def record_sound(self, scope: str, root: str, rel: str, stamp: str | None, detail: str | None = None) -> None:
        """``detail``: a fact the judge found in the file and needs again without reading it (kept with
        the stamp, given back by ``sound_detail``)."""
        if stamp is not None:
            self._new[self._key(scope, root, rel)] = stamp if detail is None else f"{stamp}#{detail}"

    def sound_detail(self, scope: str, root: str, rel: str, stamp: str | None) -> str | None:
        """The ``detail`` recorded with this very file's verdict of sound (None: judge it again). A stamp
        has no ``#``: size and mtime of the file and of its sidecar."""
        if stamp is None:
            return None
        key = self._key(scope, root, rel)
        for got in (self._new.get(key), self._old.get(key)):
            if got is not None and got.startswith(stamp + "#"):
                self._new[key] = got
                self.hits += 1
                return got[len(stamp) + 1:]
        self.misses += 1
        return None

    def keep_unjudged(self, listings: dict[str, Listing]) -> None:
        """Keep the stored verdicts this run did not judge again (a caller that judged only part of what
        the cache holds, like a health check's fsck, must not drop the window's verdicts); but not the
        sink-data verdicts of an output (``listings``: root -> its listing now) whose seal no longer
        holds, since the next seal is taken from what is there now."""
        broken = {root for root, listing in listings.items() if not self.seal_holds(root, listing)}
        for key, stamp in self._old.items():
            scope, root, _ = key.split("\t", 2)
            if scope == "sink data" and root in broken:
                continue
            self._new.setdefault(key, stamp)
        if not broken:  # the memo's batches relied on every sink's data files as sealed
            for batch, digest in self._old_window.items():
                self._new_window.setdefault(batch, digest)

    # -- the window memo -------------------------------------------------------------------------
    def window_digest(self, batch: int) -> str | None:
        """The dependency digest an earlier pass remembered for ``batch`` (``window_memo.py``)."""
        return self._old_window.get(str(batch))

    def remember_window(self, batch: int, digest: str) -> None:
        self._new_window[str(batch)] = digest

    # -- sink data -----------------------------------------------------------------------------
    def seal_holds(self, root: str, listing: Listing) -> bool:
        """Whether every file of this output the stored verdicts relied on is still there."""
        seal = self._old_seals.get(root)
        return seal is not None and seal.holds(listing)

    def seal(self, root: str, listing: Listing) -> None:
        self._new_seals[root] = DataSeal.of(listing)

    # -- a whole fsck ---------------------------------------------------------------------------
    def findings_for(self, fingerprint: str) -> list[dict] | None:
        """The findings of the last whole fsck, if it judged exactly these files (``fingerprint``)."""
        for got in (self._new_findings, self._old_findings):
            if got is not None and got[0] == fingerprint:
                return got[1]
        return None

    def remember_findings(self, fingerprint: str, findings: list[dict]) -> None:
        self._new_findings = (fingerprint, findings)

    # -- storage -------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        doc = {"format": FORMAT, "written_by": tool_build(), "sound": self._new,
               "seals": {k: v.to_dict() for k, v in self._new_seals.items()}, "window": self._new_window}
        if self._new_findings is not None:
            doc["fsck"] = {"fingerprint": self._new_findings[0], "findings": self._new_findings[1]}
        return json.dumps(doc,
                          separators=(",", ":"), sort_keys=True).encode()

    def save(self) -> bool:
        """Write what this run confirmed (atomically, whole; last writer wins). A cache that cannot be
        written is only slower next time: False (and ``save_error``), never an exception."""
        try:
            self.fm.write_bytes(self.path, self.to_bytes(), overwrite=True)
        except (OSError, *STORE_FAILURES) as e:  # the store refused or kept failing: a healthy verdict stands
            self.save_error = str(e)
            return False
        return True
