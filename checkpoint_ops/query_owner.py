"""Which named query runs a checkpoint: one checkpoint, one query.

Two definitions that both run one checkpoint (two Dagster components, two code locations, an asset copied
under a new name while the old one still runs) take turns with its batches: each run resumes where the
other stopped, writes its batches to its own sinks, and the other's sinks miss them for good; with two
different queries, the state of one is loaded by the other. Nothing in the checkpoint says which query it
belongs to, and each run alone looks sound (at most a "sink moved" warning), so the first run of a query
records its name beside the checkpoint (``journal.ops_dir``, ``owner.json``), and a run under another name
is refused before anything runs.

The record names the checkpoint's location too: a copy of the ops directory made along with a copied
checkpoint says nothing about the copy, which the first query that runs it claims. A local checkpoint is known
by its real path (symbolic links resolved; the record lives beside that), so one directory reached by two
spellings (a volume mounted at two paths through links) has one record. A record that cannot be
read says nothing either (the run claims the checkpoint again, and says so). A query renamed on purpose is
the one case to act on by hand: delete the record (the refusal names it).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from .errors import BadInputError, CheckpointOpsError
from .activity import ENDED_RUN_FILE
from .journal import ops_dir, restore_stopped_at
from .ledger import ledger_at
from .model.listing import Listing, new_query_blocked
from .model.sink import SINK_LOG_DIR, SinkOutput
from .pairing import same_location
from .storage.manager import CheckpointFileManager
from .storage.paths import join

OWNER_FILE = "owner.json"


@dataclass(frozen=True)
class Owner:
    """The query recorded as running a checkpoint: its ``name``, the ``checkpoint`` location it was recorded
    for, the run that recorded it (``by``) and when (``recorded_at``, epoch seconds)."""

    name: str
    checkpoint: str
    by: str
    recorded_at: float


@dataclass(frozen=True)
class Claim:
    """What ``claim`` found. ``other``: the query that runs this checkpoint, when it is not the one claiming
    (nothing written). ``path``: the record's file (None: the checkpoint has no place for it, a bucket root).
    ``note``: why an existing record was (or, judged only, will be) replaced: unreadable, or made for another
    location; or why it could not be written."""

    path: str | None
    other: Owner | None = None
    note: str | None = None
    recorded: bool = False  # the record names the claiming query (now)


def owner_path(fm: CheckpointFileManager, root: str) -> str:
    """The record's file: beside the checkpoint, for a local one beside its real path (symbolic links
    resolved), so that every spelling of one directory finds one record."""
    return join(ops_dir(fm, _real(fm, root)), OWNER_FILE)


def _real(fm: CheckpointFileManager, root: str) -> str:
    return os.path.realpath(root) if fm.location.is_local else root.rstrip("/")


def claim(fm: CheckpointFileManager, root: str, name: str, by: str, *, write: bool = True) -> Claim:
    """Claim the checkpoint at ``root`` for the query ``name`` (run by ``by``). Another query's record for
    this location is returned in ``Claim.other`` and nothing is written; else the record is written if it is
    missing or says nothing here (``write=False``: only judged; ``Claim.recorded`` says whether it already
    names ``name``). One read; one write the first time (a write the store refuses past its retries is said in
    ``Claim.note``, not raised: the next run records it). A record that cannot be read for want of the store
    (not for its content) raises: judging without it could hand the checkpoint to another query. Call it
    under the checkpoint's lease."""
    try:
        path = owner_path(fm, root)
    except CheckpointOpsError:
        return Claim(None)
    here = fm.url(_real(fm, root))
    note = None
    action = "rewritten" if write else "to be rewritten when the query runs"
    try:
        data = fm.read_bytes(path)
    except (FileNotFoundError, NotADirectoryError):
        data = None
    except OSError as e:
        raise BadInputError(f"the record of which query runs this checkpoint cannot be read: {e}",
                            path=fm.url(path), fix="run again once the store answers (nothing ran, nothing "
                            "changed)") from None
    recorded = None
    if data is not None:
        try:
            doc = json.loads(data)
            recorded = Owner(str(doc["name"]), str(doc["checkpoint"]), str(doc.get("by", "")),
                             float(doc.get("recorded_at", 0)))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            note = f"{fm.url(path)} could not be read ({e}): {action} for {name}"
    if recorded is not None:
        if not same_location(recorded.checkpoint, here):
            note = f"{fm.url(path)} was recorded for {recorded.checkpoint} (a copy): {action} for {here}"
        elif recorded.name == name:
            return Claim(path, recorded=True)
        else:
            return Claim(path, other=recorded)
    if write:
        doc = {"name": name, "checkpoint": here, "by": by, "recorded_at": time.time()}
        try:
            fm.write_bytes(path, json.dumps(doc, indent=1).encode(), overwrite=True)
        except (OSError, CheckpointOpsError) as e:  # the store failed past its retries: the next run records it
            note = (note + "; " if note else "") + f"{fm.url(path)} could not be written ({e}): not recorded this time"
        else:
            return Claim(path, note=note, recorded=True)
    return Claim(path, note=note)


@dataclass(frozen=True)
class NotStarted:
    """An empty checkpoint location, judged for the query that creates it there. ``problem`` is None when that is
    sound: the query has not run yet. Otherwise it says why a first run there is unsafe: the checkpoint of a query
    that did run is gone, or a declared file sink already holds a sink log. ``path`` is the file that shows it."""

    checkpoint: str
    problem: str | None = None
    fix: str | None = None
    path: str | None = None


def not_started(fm: CheckpointFileManager, root: str, name: str, sinks: list[SinkOutput] = ()) -> NotStarted | None:
    """None when anything Spark reads is at ``root`` (fsck judges it), else what an empty location (or one holding
    only the temp files of writes that never finished) means for the query ``name`` that creates its checkpoint
    there. ``sinks``: its file sinks, listed for their logs alone (``SinkOutput(..., data=False)``). Reads the
    listing of ``root``, the owner record and each sink's log listing; writes nothing."""
    listing = Listing.scan(fm, root.rstrip("/"))
    if not listing.only_unfinished_writes() or listing.unreadable_dirs:
        return None
    here = fm.url(root.rstrip("/"))
    stopped = restore_stopped_at(fm, root.rstrip("/"))
    if stopped is not None:
        return NotStarted(
            here, f"{stopped.what} stopped part-way at this location; a run now would start a new query where that "
            "operation puts (or removes) a checkpoint", stopped.fix, here)
    found = claim(fm, root, name, "", write=False)
    ran = found.other.name if found.other is not None else name if found.recorded else None
    if ran is not None and _left_a_trace(fm, root):
        return NotStarted(
            here, f"the checkpoint is gone: nothing is at this location, but {fm.url(found.path)} records that "
            f"query {ran} ran it, and its batch ledger or ended-run record is still beside it; a run now would start "
            "again from batch 0 and read all its input again",
            f"restore the checkpoint (checkpoint-ops backup list, then backup restore), or, to start over on purpose, "
            f"move the query's outputs away and delete {fm.url(found.path)}", fm.url(found.path))
    blocked = listing.blocks_new_query()
    if blocked:
        problem, fix = new_query_blocked(listing, blocked)
        return NotStarted(here, problem, fix, here)
    for sink in sinks:
        if sink.log.files:
            return NotStarted(
                here, f"there is no checkpoint yet, but the file sink {sink.url} already logs batches "
                f"{min(sink.log.files)}..{sink.log.latest} in {SINK_LOG_DIR}/: a query started here would skip those batch ids, "
                "so the rows of its first batches would never reach the output",
                f"give the query an empty output directory (or move {sink.url} away), or restore the checkpoint that "
                "wrote it", sink.url)
    return NotStarted(here)


def _left_a_trace(fm: CheckpointFileManager, root: str) -> bool:
    """Whether a query run left a record beside the checkpoint besides the owner record: the batch ledger (the
    pass after every run syncs it) or the record of a failed run (``activity.ENDED_RUN_FILE``). The owner record
    alone is written just before the query starts, and a run refused before Spark writes anything leaves it."""
    if fm.walk(ledger_at(fm, root).path):
        return True
    return fm.exists(join(ops_dir(fm, root), ENDED_RUN_FILE))


__all__ = ["OWNER_FILE", "Owner", "Claim", "claim", "owner_path", "NotStarted", "not_started"]
