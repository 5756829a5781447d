"""One pass over a checkpoint after a run: ledger sync, inspect and fsck on one model, with the verdict cache.

A materialization records the new batches in the ledger, describes the checkpoint (inspect) and
judges it (fsck, the health check). Done separately, each lists and reads every retained log file;
``run_check_pass`` does them on one listing and one model, judges the rollback window once for both
(one ``RestartSets``), and takes what earlier runs found sound from the verdict cache
(``verdicts.py``) and the batches of the rollback window from the window memo (``window_memo.py``), so it
reads what is new. It remembers the fsck findings with a fingerprint of what
they judged, so the health check that follows (``shared_fsck``) reuses them while nothing changed
and runs fsck (with the cache) when anything did.

The verdict cache is an optimisation only: ``cache=None`` gives the same answers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .fsck import Finding, Fsck
from .inspect import inspect_checkpoint
from .ledger import Ledger, ledger_at
from .ledger import sync as sync_ledger
from .model.checkpoint import Checkpoint
from .model.sink import SinkOutput
from .pairing import PAIRING_FILE
from .recorded_sinks import LeftOut, left_out
from .storage.checksums import hadoop_crc_name
from .restart import RestartSets
from .verdicts import VerdictCache, live_rels


@dataclass(frozen=True)
class CheckPass:
    """What one pass found: the ledger sync's result, inspect's report, fsck's findings, and how much the
    verdict cache answered (``cache_hits`` files not read again; ``cache_ignored``: why a stored cache was
    not used)."""

    synced: dict
    report: dict
    findings: list[Finding]
    cache_hits: int
    cache_misses: int
    cache_ignored: str | None
    window_hits: int = 0  # batches of the rollback window taken from the window memo (window_memo.py)

    def to_dict(self) -> dict:
        return {"ledger_sync": self.synced, "inspect": self.report, "findings": [f.to_dict() for f in self.findings],
                "cache": {"hits": self.cache_hits, "misses": self.cache_misses, "ignored": self.cache_ignored,
                          "window_hits": self.window_hits}}


def run_check_pass(ckpt: Checkpoint, sinks: list[SinkOutput] = (), *, cache: VerdictCache | None = None,
                   sync: bool = True, save: bool = True, batches: bool = True) -> CheckPass:
    """Ledger sync (if ``sync``), inspect and fsck of ``ckpt`` and its file sinks in one pass. ``cache``
    (default: the checkpoint's own, beside its ledger) is read, and written back if ``save``.
    ``batches=False``: inspect's report without its per-batch list (``inspect_checkpoint``), so the pass
    reads no retained offsets or commits file that fsck's verdict cache already vouches for."""
    sinks = list(sinks)
    if cache is None:
        cache = VerdictCache.for_checkpoint(ckpt)
    ledger = Ledger.for_checkpoint(ckpt)  # one index for the sync and the pass (the sync adds its segment)
    ckpt.kept_bytes = {}  # what the sync and the window read of offsets/ and commits/, for fsck's sidecar check
    try:
        synced = sync_ledger(ckpt, sinks, ledger) if sync else {}
        sets = RestartSets(ckpt, sinks, ledger, deep=False, cache=cache)
        report = inspect_checkpoint(ckpt, sinks, ledger=ledger, sets=sets, batches=batches)
        fsck = Fsck(ckpt, sinks, ledger=ledger, cache=cache, sets=sets)
        findings = fsck.run()
    finally:
        ckpt.kept_bytes = None
    _seal_and_remember(ckpt, sinks, cache, findings, fsck.recorded)
    if save:
        cache.save()
    return CheckPass(synced, report, findings, cache.hits, cache.misses, cache.ignored, cache.window_hits)


def shared_fsck(ckpt: Checkpoint, sinks: list[SinkOutput] = (), *, cache: VerdictCache | None = None,
                save: bool = True) -> list[Finding]:
    """fsck's findings for ``ckpt`` and its sinks: those of the last pass if it judged exactly what is
    there now (every listed file by name, size and mtime, the ledger's files, and the bytes of every
    file Spark may still rewrite), else a new fsck with the verdict cache."""
    sinks = list(sinks)
    if cache is None:
        cache = VerdictCache.for_checkpoint(ckpt)
    ledger = Ledger.for_checkpoint(ckpt)
    # fsck also judges the outputs the ledger records and it is not given: as they are now
    recorded = left_out(ckpt, sinks, ledger, data=True)
    got = cache.findings_for(fingerprint(ckpt, sinks, recorded))
    if got is not None:
        return [Finding(**f) for f in got]
    # the window with the cache too (the window memo: only batches changed since the pass are judged)
    sets = RestartSets(ckpt, sinks, ledger, deep=False, cache=cache)
    fsck = Fsck(ckpt, sinks, ledger=ledger, cache=cache, sets=sets)
    findings = fsck.run()
    # keep what the pass found and this fsck did not judge again (the window's file verdicts)
    cache.keep_unjudged({f"sink{i}": s.listing for i, s in enumerate(sinks)})
    _seal_and_remember(ckpt, sinks, cache, findings, fsck.recorded)
    if save:
        cache.save()
    return findings


def _seal_and_remember(ckpt: Checkpoint, sinks: list[SinkOutput], cache: VerdictCache, findings,
                       recorded: list[LeftOut]) -> None:
    for i, sink in enumerate(sinks):
        cache.seal(f"sink{i}", sink.listing)
    cache.remember_findings(fingerprint(ckpt, sinks, recorded), [f.to_dict() for f in findings])


def fingerprint(ckpt: Checkpoint, sinks: list[SinkOutput], recorded: list[LeftOut] = ()) -> str:
    """A digest of everything fsck's findings depend on: each listing (name, size, mtime; its empty and
    unreadable directories: the model takes a directory named like a log file for an unreadable one), the
    ledger's files, the content of the files Spark may still rewrite (``verdicts.live_rels``) and of each
    sink's pairing record, read now; and the outputs the ledger records that fsck judges besides
    ``sinks`` (``recorded``, from ``recorded_sinks.left_out``: each by its listing, or by why it has
    none). Not the lease (``listing.own``): no finding depends on it (fsck's report shows it beside the
    findings), and the materialization's own lease is gone by its health check. The pairing record by
    content, not by its listing entry: the pass's ledger sync rewrites it after the pass's listing was
    taken."""
    h = hashlib.sha256()
    for m in recorded:
        h.update(f"recorded\0{m.url}\0{m.gone}\0{m.unreadable}\0{m.output is not None}\n".encode())
    sinks = list(sinks) + [m.output for m in recorded if m.output is not None]
    roots = [("checkpoint", ckpt.listing)] + [(f"sink{i}", s.listing) for i, s in enumerate(sinks)]
    for i, sink in enumerate(sinks):  # the compact interval a sink is judged with (configured, not on disk)
        h.update(f"interval\0sink{i}\0{sink.log.interval}\n".encode())
    for root, listing in roots:
        h.update(f"\0{root}\0{listing.url('')}\0".encode())
        skip = _PAIRING if root != "checkpoint" else ()
        h.update("".join(sorted([f"{rel}\t{info.size}\t{info.mtime!r}\n" for rel, info in listing.files.items()
                                 if rel not in skip])).encode())
        h.update("".join(sorted(f"dir\t{rel}\n" for rel in listing.empty_dirs)).encode())
        h.update("".join(sorted(f"unreadable\t{rel}\t{err}\n" for rel, err in listing.unreadable_dirs.items())).encode())
        if skip:
            got = listing.fm.read_many([listing.abs(rel) for rel in sorted(skip)], errors={})
            for rel in sorted(skip):
                h.update(f"pairing:{rel}\0".encode())
                h.update(hashlib.sha256(got.get(listing.abs(rel)) or b"").digest())
    ledger = ledger_at(ckpt.fm, ckpt.root)
    for f in sorted(ckpt.fm.walk(ledger.path), key=lambda f: f.path):
        h.update(f"ledger:{f.path}\t{f.size}\t{f.mtime!r}\n".encode())
    live = sorted(live_rels(ckpt, sinks))
    for root, listing in roots:
        paths = [listing.abs(rel) for r, rel in live if r == root and rel in listing]
        data = listing.fm.read_many(paths, errors={})
        for p in paths:
            h.update(f"live:{p}\0".encode())
            h.update(hashlib.sha256(data.get(p) or b"").digest())
    return h.hexdigest()


_PAIRING = (PAIRING_FILE, hadoop_crc_name(PAIRING_FILE))  # in each sink's root

__all__ = ["CheckPass", "run_check_pass", "shared_fsck", "fingerprint"]
