"""Applying a plan, resuming it after a crash, and undoing it.

Every operation that changes files (rollback, restore, sink-log compaction, retention, orphan cleanup)
is a ``Plan`` applied here. Its **anchor** is the checkpoint it concerns, or the sink output when an
operation has no checkpoint; the journal and the undo records (trash) live beside it. Apply, in order
(every step is idempotent, so ``--resume`` simply runs them again):

1. write the journal (plan, new small file contents, ``metadata`` before and after) beside the anchor;
2. **fence** (checkpoint anchors): replace ``metadata`` with text Spark cannot parse, so no query starts
   mid-way;
3. write new files (atomically, never replacing anything; a restore's sink logs first, phase
   ``sink-log-write``, so a reader never sees its data files without the log that lists them), then
   rewrite replaced files in place (atomically; the old content is copied into the trash first);
4. move deleted files aside into the trash, phase by phase: sink log (newest first), commits, offsets,
   source logs, state, litter, then sink data files (or into the user's directory). On an object store
   with versioning the delete itself is reversible and nothing is copied;
5. **unfence**: put ``metadata`` back (or the new one a restore brings); 6. mark the journal ``applied``.

Undo deletes what was written (last written first: a restore's sink data files before the log that lists
them), puts back what was rewritten or moved, removes the ledger truncation the operation wrote, and
restores ``metadata``, all before its ``undone`` marker: the tree (and the batch ledger)
is byte-for-byte what it was. It refuses if anything was written since (Spark ran after it), and
it checks its whole undo record before it changes anything.

What differs between operations is data in the journal, never a branch on the operation's name:
``ledger_truncation`` (a rollback's: the batch ledger forgets the abandoned timeline),
``undo_guard`` (per root, the logs whose batches above the target mean "something wrote here since"),
``final_metadata`` (a restore brings its own ``metadata``) and ``undoable``.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import hashlib
import sys
from dataclasses import dataclass, field
from typing import Callable

from .errors import BadInputError, RefusedError, StorageError, StoreUnavailableError, is_storage_failure
from .fence import Fence, fence_bytes, is_fence, parse_fence, resume_command
from .journal import OPS_DIR, Journal, load_journal, new_op_id, ops_dir, scan_journals, write_journal
from .ledger import ledger_at
from .model.listing import Listing, is_hidden_temp
from .model.logfile import log_files
from .pairing import same_location
from .plan import DELETE, KEEP, REPLACE, WRITE, FileAction, Plan
from .storage import CheckpointFileManager, OpCounter, open_file_manager
from .storage.checksums import hadoop_crc_name
from .storage.paths import basename, dirname, join, parse_url

CHUNK = 1000  # files per batched move or delete (a crash test kills between any two: storage/killswitch.py)
_STREAM = 8 * 2**20
_LIST_FROM = 4  # wanted objects in one directory from which a resume lists it rather than asking for each


@dataclass
class Anchor:
    """What an operation's journal hangs off: a checkpoint (fenced while it runs), or a sink output."""

    fm: CheckpointFileManager
    root: str
    url: str
    metadata: bytes | None = None  # the checkpoint's current metadata (None: missing, or not a checkpoint)
    checkpoint: bool = True

    @classmethod
    def of_checkpoint(cls, ckpt) -> "Anchor":
        return cls(ckpt.fm, ckpt.root, ckpt.url, ckpt.metadata_raw, True)

    @classmethod
    def of_sink(cls, sink) -> "Anchor":
        return cls(sink.fm, sink.root, sink.url, None, False)

    @property
    def ops(self) -> str:
        return ops_dir(self.fm, self.root)


@dataclass
class Root:
    url: str
    fm: CheckpointFileManager
    path: str
    trash: str
    versioned: bool

    def abs(self, rel: str) -> str:
        return f"{self.path}/{rel}"

    def trash_path(self, rel: str) -> str:
        return f"{self.trash}/{rel}"


class Executor:
    def __init__(self, journal: Journal, roots: dict[str, Root], keep: tuple[CheckpointFileManager, str] | None,
                 progress: bool = False, plan: Plan | None = None, current_metadata: bytes | None = None,
                 storage_options: dict | None = None, guard: Callable[[], None] | None = None):
        self.journal = journal
        self.guard = guard  # called between steps: raises if the operation lost its lease
        self._current_metadata = current_metadata  # known when applying fresh: no re-read
        self.roots = roots
        self.keep = keep
        self.storage_options = storage_options
        self.plan = plan if plan is not None else Plan.from_journal(journal.record["plan"])
        self.original_metadata = _b64(journal.record.get("original_metadata"))
        # what unfencing leaves: the original metadata, unless the operation brings its own (a restore)
        final = journal.record.get("final_metadata", journal.record.get("original_metadata"))
        self.final_metadata = _b64(final)
        self.fenced = "checkpoint" in roots and journal.record.get("fence", True)
        # what the anchor's ``metadata`` held when the command opened it (a recovery's ``reopen``; a fresh
        # apply's: the original), kept for the checks: ``_current_metadata`` is used up by the fence
        self.anchor_metadata = current_metadata
        self.fence_up = False  # this run wrote (or found) its fence and has not taken it down
        self.unfenced = False  # this run put ``metadata`` back: Spark can start from the checkpoint now
        self.chunk = CHUNK
        self.steps = 0
        self._scanned: dict[str, Listing] | None = None
        self._memo: dict[tuple[str, str], bool] = {}  # undo's checks: does a file hold the plan's content?
        self._trash: dict[str, dict[str, int | None]] = {}  # root id -> its undo record's files (rel -> size)
        self._sources: dict[tuple, CheckpointFileManager] = {}  # one file manager per store content comes from
        self._bar = None
        if progress:
            self.show_progress()

    # -- bookkeeping ---------------------------------------------------------------------------------
    def show_progress(self) -> None:
        """A progress bar on a terminal (stderr), one step per file."""
        if self._bar is None and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=len(self.plan.actions) + 3, unit="file", file=sys.stderr, leave=False)

    def _step(self, n: int = 1) -> None:
        if self.guard is not None:
            self.guard()
        self.steps += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    @property
    def ckpt(self) -> Root:
        return self.roots["checkpoint"]

    # -- fence ------------------------------------------------------------------------------------------
    def _fence(self, operation: str) -> None:
        if not self.fenced:
            return
        meta = self.ckpt.abs("metadata")
        current, self._current_metadata = self._current_metadata, None
        if current is None:
            try:
                current = self.ckpt.fm.read_bytes(meta)
            except FileNotFoundError:
                current = None
        if is_fence(current):
            f = parse_fence(current)
            if f.op_id != self.journal.op_id:
                raise RefusedError(f"the checkpoint is fenced by another operation ({f.op_id})",
                                   path=self.ckpt.fm.url(meta))
            if f.operation == operation:
                self.fence_up = True
                return
        fence = Fence(operation, self.journal.op_id, self.journal.fm.url(self.journal.path),
                      self.original_metadata or self.final_metadata or b"")
        self.ckpt.fm.write_bytes(meta, fence_bytes(fence, self.ckpt.url), overwrite=True)
        self.fence_up = True
        self._step()

    def _unfence(self, metadata: bytes | None) -> None:
        if not self.fenced:
            return
        meta = self.ckpt.abs("metadata")
        if metadata is None:
            self.ckpt.fm.delete(meta)
        else:
            self.ckpt.fm.write_bytes(meta, metadata, overwrite=True)
        self.fence_up, self.unfenced = False, True
        self._step()

    @property
    def open_to_spark(self) -> bool:
        """An operation that fences its checkpoint, found (when the command opened it) not fenced: either it
        had not fenced it yet, or it (or its undo) had put ``metadata`` back. Spark may have run since."""
        return self.fenced and not is_fence(self.anchor_metadata)

    @property
    def fenced_now(self) -> bool:
        """Whether the checkpoint holds this operation's fence now, as far as this run knows."""
        return self.fence_up or (self.fenced and not self.unfenced and is_fence(self.anchor_metadata))

    @property
    def anchor_url(self) -> str:
        return self.journal.record.get("anchor", {}).get("url") or self.journal.record["checkpoint"]

    # -- content --------------------------------------------------------------------------------------
    def _source(self, sha: str) -> tuple[CheckpointFileManager, str]:
        """Where the content for ``sha`` is, through one file manager per store (opening one costs a
        new client: per object, a restore spent most of its time there)."""
        url = self.plan.sources[sha]
        loc = parse_url(url)
        store = (loc.original_scheme, loc.scheme, "" if loc.is_local else loc.path.split("/", 1)[0])
        if store not in self._sources:
            self._sources[store] = open_file_manager(url, self.storage_options)[0]
        return self._sources[store], loc.path

    def _put(self, root: Root, a: FileAction, overwrite: bool) -> None:
        """Publish the action's content at its path, checking it against the plan's hash as it goes
        (a mismatch publishes nothing)."""
        path = root.abs(a.rel)
        if a.sha256 in self.plan.contents:
            root.fm.write_bytes(path, self.plan.contents[a.sha256], overwrite=overwrite)
            return
        sfm, spath = self._source(a.sha256)
        h = hashlib.sha256()
        with sfm.open_read(spath) as src, root.fm.create_atomic(path, overwrite=overwrite) as out:
            while chunk := src.read(_STREAM):
                h.update(chunk)
                out.write(chunk)
            if h.hexdigest() != a.sha256:
                raise RefusedError(f"the content for {a.rel} does not match its checksum (sha256 {a.sha256[:12]}...)",
                                   path=sfm.url(spath), fix="the stored copy is damaged: nothing was written for it; "
                                   "undo this operation and use another copy")

    def _matches(self, root: Root, a: FileAction) -> bool:
        """Whether the file at the action's path already holds the action's content."""
        path = root.abs(a.rel)
        if a.sha256 in self.plan.contents:
            try:
                return root.fm.read_bytes(path) == self.plan.contents[a.sha256]
            except FileNotFoundError:
                return False
        return _sha256_of(root.fm, path) == a.sha256

    # -- primitive steps ---------------------------------------------------------------------------
    def _write(self, a: FileAction) -> None:
        root = self.roots[a.root]
        try:
            self._put(root, a, overwrite=False)
        except FileExistsError:
            if not self._matches(root, a):  # a resumed run wrote it already?
                raise RefusedError("a file the plan creates already exists with other content",
                                   path=root.fm.url(root.abs(a.rel)),
                                   fix="something changed the files during the operation; undo it and re-plan")
            root.fm.ensure_checksum(root.abs(a.rel))  # the crash may have come before its sidecar
        self._step()

    def _replace(self, a: FileAction) -> None:
        """Keep the old content in the trash, then rewrite the file in one atomic step (readers never
        see it missing). On resume: done if the file already holds the new content."""
        root = self.roots[a.root]
        if self._matches(root, a):
            root.fm.ensure_checksum(root.abs(a.rel))  # the crash may have come before its sidecar
            self._step()
            return
        if not root.fm.exists(root.trash_path(a.rel)):
            root.fm.copy(root.abs(a.rel), root.trash_path(a.rel))
        self._put(root, a, overwrite=True)
        self._step()

    def _retire(self, actions: list[FileAction]) -> None:
        """Move files aside, or just delete them where the store keeps versions.

        Files a write replaces always go to the trash: on a versioned store their old version
        would sit under the new one, out of undo's reach.
        """
        for rid in self.roots:
            acts = [a for a in actions if a.root == rid]
            root = self.roots[rid]
            for i in range(0, len(acts), self.chunk):
                chunk = acts[i : i + self.chunk]
                if root.versioned and chunk[0].phase != "write":
                    root.fm.delete_many([root.abs(a.rel) for a in chunk])
                else:
                    root.fm.move_many([(root.abs(a.rel), root.trash_path(a.rel)) for a in chunk])
                self._step(len(chunk))

    def _keep(self, actions: list[FileAction]) -> None:
        if not actions:
            return
        kfm, kpath = self.keep
        for i in range(0, len(actions), self.chunk):
            chunk = actions[i : i + self.chunk]
            for rid in {a.root for a in chunk}:
                root = self.roots[rid]
                pairs = [(root.abs(a.rel), join(kpath, a.dest)) for a in chunk if a.root == rid]
                _transfer(root.fm, kfm, pairs)
            self._step(len(chunk))

    # -- apply -------------------------------------------------------------------------------------
    def apply(self, resuming: bool) -> None:
        plan = self.plan
        actions = plan.ordered()
        if resuming:  # before the fence, so that a refusal changes nothing
            actions = self._pending(actions)
            self._check_trash_free([a for a in actions if a.kind == DELETE])
        self._fence(plan.operation)
        if resuming:
            self._drop_stray_temps(self._listings())
        self._retire([a for a in actions if a.kind == DELETE and a.phase == "write"])  # replaced files
        for a in actions:
            if a.kind == WRITE:
                self._write(a)
        for a in actions:
            if a.kind == REPLACE:
                self._replace(a)
        # Each root's deletes go in as few batches as possible, in phase order. The one barrier:
        # a sink's data files go only after its log no longer lists them (readers stay consistent).
        self._retire([a for a in actions if a.kind == DELETE and a.phase not in ("write", "sink-data")])
        self._retire([a for a in actions if a.kind == DELETE and a.phase == "sink-data"])
        self._keep([a for a in actions if a.kind == KEEP])
        self._unfence(self.final_metadata)
        self.journal.mark("applied")
        self._step()

    def _listings(self) -> dict[str, Listing]:
        """One listing per root, taken once before a resumed run changes anything."""
        if self._scanned is None:
            self._scanned = {rid: Listing.scan(r.fm, r.path) for rid, r in self.roots.items()}
        return self._scanned

    def effects_on_disk(self) -> int:
        """How many of the plan's actions have taken effect (moved away, written, or rewritten). A move
        counts once its copy is there: on an object store a move is a copy, then a delete, and a run stopped
        in between has copies in the trash (or the keep directory) that only finishing the plan accounts for."""
        listings = self._listings()
        kept: dict[str, int | None] | None = None
        done = 0
        for a in self.plan.actions:
            root = self.roots[a.root]
            if a.kind == WRITE:
                done += a.rel in listings[a.root] and self._matches(root, a)
            elif a.kind == REPLACE:
                done += root.fm.exists(root.trash_path(a.rel))
            elif a.rel not in listings[a.root]:
                done += 1
            else:  # still in place: copied already?
                size = listings[a.root].files[a.rel].size
                if a.kind == KEEP:
                    kept = self._kept_files() if kept is None else kept
                    done += kept.get(a.dest) == size
                elif not root.versioned or a.phase == "write":
                    done += self._trash_files(a.root).get(a.rel, -1) in (size, None)
        return done

    def _kept_files(self) -> dict[str, int | None]:
        """What the keep directory holds (rel -> size; one listing)."""
        if self.keep is None:
            return {}
        kfm, kpath = self.keep
        return {f.path[len(kpath.rstrip("/")) + 1:]: f.size for f in kfm.walk(kpath)}

    def _drop_stray_temps(self, listings: dict[str, Listing]) -> None:
        """Temp files of our own writes that a crash left behind (hidden ``.<name>.<uuid>.tmp``, not
        in the plan): the fence kept Spark away, so every such file is ours. Deleted, not kept: they
        were never part of the tree."""
        for rid, listing in listings.items():
            planned = {a.rel for a in self.plan.actions if a.root == rid}
            stray = [rel for rel in listing.files if rel not in planned and is_hidden_temp(rel.rpartition("/")[2])]
            if stray:
                root = self.roots[rid]
                root.fm.delete_many([root.abs(r) for r in stray])

    def _pending(self, actions: list[FileAction]) -> list[FileAction]:
        """On resume: the actions whose effect is not on disk yet (writes and rewrites check their
        content themselves)."""
        listings = self._listings()
        return [a for a in actions if a.kind in (WRITE, REPLACE) or a.rel in listings[a.root]]

    def _trash_files(self, rid: str) -> dict[str, int | None]:
        """What the undo record of root ``rid`` holds: rel -> size (one listing per root, taken once)."""
        if rid not in self._trash:
            root = self.roots[rid]
            self._trash[rid] = {f.path[len(root.trash) + 1:]: f.size for f in root.fm.walk(root.trash)}
        return self._trash[rid]

    def _check_trash_free(self, deletes: list[FileAction]) -> None:
        """A resumed run never replaces what the undo record holds: a file to move aside whose name is in the
        trash already must be the same file (a move the crash cut between its copy and its delete), else the
        one in the trash is the original and the one in place came after (the query ran?). Refused before
        anything changes."""
        for rid, root in self.roots.items():
            moving = [a for a in deletes if a.root == rid and (not root.versioned or a.phase == "write")]
            if not moving:
                continue
            held, listing = self._trash_files(rid), self._listings()[rid]
            for a in moving:
                if a.rel not in held:
                    continue
                here = listing.files.get(a.rel)
                same = (here is None or held[a.rel] is None or here.size == held[a.rel]) and \
                    _sha256_of(root.fm, root.abs(a.rel)) == _sha256_of(root.fm, root.trash_path(a.rel))
                if not same:
                    raise RefusedError(
                        f"{a.rel} is in the undo record of the {self.plan.operation} {self.journal.op_id} already, "
                        "with other content: the file in place was written after the operation moved the original "
                        "aside, and moving it there would lose the original", path=root.fm.url(root.abs(a.rel)),
                        fix=f"nothing was changed; stop the query, then `checkpoint-ops history {self.anchor_url}` "
                            "and `checkpoint-ops fsck` show where the checkpoint stands")

    def sources_missing(self) -> list[str]:
        """On resume: the URLs of the stored contents (a restore's backup objects) the plan's writes stream from
        that are gone. Every write's, done or not: a resumed write opens its content before it finds its file in
        place (``_put``, then ``_write``'s check of what is there)."""
        shas = sorted({a.sha256 for a in self.plan.actions if a.kind in (WRITE, REPLACE) and a.sha256
                       and a.sha256 not in self.plan.contents and a.sha256 in self.plan.sources})
        # by directory (a backup's objects/<aa>/): one listing of a directory that holds several of them, instead
        # of a request per object (a HEAD each on an object store: a whole restore's worth of them)
        groups: dict[tuple[int, str], tuple[CheckpointFileManager, list[tuple[str, str]]]] = {}
        for sha in shas:
            fm, path = self._source(sha)
            groups.setdefault((id(fm), dirname(path)), (fm, []))[1].append((sha, path))

        def gone(key: tuple[int, str]) -> list[str]:
            fm, wanted = groups[key]
            if len(wanted) < _LIST_FROM:
                return [sha for sha, path in wanted if not fm.exists(path)]
            there = {basename(f.path) for f in fm.list(key[1]) if not f.is_dir}
            return [sha for sha, path in wanted if basename(path) not in there]

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            missing = {sha for found in pool.map(gone, list(groups)) for sha in found}
        return [self.plan.sources[sha] for sha in shas if sha in missing]

    def pending_effects(self) -> list[FileAction]:
        """The plan's actions whose result is not on disk (from the listing taken once): a file it writes
        or rewrites without that content, a file it removes still in place."""
        listings = self._listings()
        out = []
        for a in self.plan.actions:
            present = a.rel in listings[a.root]
            if a.kind == WRITE and not (present and self._unchanged(a)):
                out.append(a)
            elif a.kind == REPLACE and not self._unchanged(a):
                out.append(a)
            elif a.kind in (DELETE, KEEP) and present and a.phase != "write":  # (replaced: the write's result)
                out.append(a)
        return out

    def undone_on_disk(self) -> bool:
        """Whether everything undo puts back is back (an undo that put ``metadata`` back and then stopped):
        ``metadata`` as before the operation, what it wrote gone, what it rewrote and moved in place again."""
        if self.fenced and self.anchor_metadata != self.original_metadata:
            return False
        listings = self._listings()
        for a in self.plan.actions:
            root, present = self.roots[a.root], a.rel in listings[a.root]
            if a.kind == WRITE and present and self._unchanged(a):
                return False
            if a.kind in (DELETE, KEEP) and not present:
                return False
            if a.kind == REPLACE and (self._unchanged(a) or root.fm.exists(root.trash_path(a.rel))):
                return False
        return True

    def record_applied(self) -> None:
        """Mark an operation applied whose every change is on disk and whose ``metadata`` is back (the
        sidecars of what it wrote last first: the crash may have come between a file and its sidecar)."""
        self._ensure_sidecars([(a.root, a.rel) for a in self.plan.actions if a.kind in (WRITE, REPLACE)])
        self.journal.mark("applied")

    def _ensure_sidecars(self, files: list[tuple[str, str]]) -> None:
        """The Hadoop sidecar of each of ``files`` (root id, rel) and of the checkpoint's ``metadata`` (the
        unfence's write), where a crash after the file left it out."""
        if self.fenced:
            files = [*files, ("checkpoint", "metadata")]
        for rid, rel in files:
            root = self.roots[rid]
            root.fm.ensure_checksum(root.abs(rel))
        if self.fenced:  # and the temp file of the unfence's write the crash cut short, if any
            drop_fence_temps(self.ckpt.fm, self.ckpt.path)

    def record_undone(self, by: str | None = None) -> None:
        """Finish an undo whose every change is on disk: its ledger truncation goes, then the marker."""
        self._ensure_sidecars([])
        self._remove_emptied_dirs()  # killed after its unfence, the undo may not have got to them
        if self.journal.record.get("ledger_truncation") is not None and "checkpoint" in self.roots:
            ledger_at(self.ckpt.fm, self.ckpt.path).remove_truncation(self.journal.op_id)
        self.journal.mark("undone", by=by)

    def check_resumable(self) -> bool:
        """For a resume that finds the checkpoint not fenced (``open_to_spark``): True if the operation had
        made every change and put ``metadata`` back (only its ``applied`` marker is missing: record it);
        False to finish it as usual (nothing was written since). Raises ``RefusedError`` if files were written
        or changed since the operation's plan: the query may have run, and finishing the plan would delete
        (or overwrite the undo record with) what it wrote."""
        if not self.pending_effects():
            return True
        self._refuse_written_since(self._written_since(self._listings(), put_back=False), "finishing it")
        return False

    def check_roll_forward(self) -> None:
        """For a resume that rolls forward an undo found not fenced (it had not fenced the checkpoint yet,
        or had put ``metadata`` back): refused if the checkpoint is not the one the undo left (emptied or
        replaced) or anything was written since (the query may have run)."""
        if self.fenced and self.anchor_metadata not in (self.original_metadata, self.final_metadata):
            self._refuse_anchor("`metadata` is missing" if self.anchor_metadata is None else
                                "`metadata` holds neither what it held before the operation nor after it",
                                "rolling it forward")
        self._refuse_written_since(self._written_since(self._listings(), put_back=True), "rolling it forward")

    def _refuse_written_since(self, changed: list[str], doing: str) -> None:
        if not changed:
            return
        op = f"{self.plan.operation} {self.journal.op_id}"
        more = f" (and {len(changed) - 1} more: {', '.join(changed[1:4])}{', ...' if len(changed) > 4 else ''})" \
            if len(changed) > 1 else ""
        fenced = " and the checkpoint is not fenced" if self.fenced else ""
        raise RefusedError(
            f"{changed[0]}{more} is new or changed since the {op}{fenced}: something wrote here after it (did the "
            f"query run?), and {doing} would delete or replace what was written since",
            path=self.roots[next(iter(self.roots))].url,
            fix="nothing was changed; stop the query: the checkpoint is as it left it. To go back to a batch, roll "
                "back to it (with --dry-run first)")

    def _written_since(self, listings: dict[str, Listing], put_back: bool) -> list[str]:
        """Files (``rel``) written or changed since the operation, judged against what it left (``put_back``
        False) or against what was there before it (True: an undo put that back): a batch above its target in
        the logs its journal guards (but, put back, one it removed); a file it removed (in place again; put back:
        of another size than it had); a file it rewrote, changed since."""
        t = self.plan.target_batch
        removed = {(a.root, a.rel): a for a in self.plan.actions if a.kind in (DELETE, KEEP)}
        left = {("checkpoint", rel) for rel in self.journal.record.get("left_planned", [])}
        newer: list[tuple[str, str]] = []
        if t is not None:
            for rid, dirs in self.journal.record.get("undo_guard", {}).items():
                if rid in listings:
                    for d in dirs:
                        newer += [(rid, f.rel) for b, f in log_files(listings[rid], d, compactible=True).items()
                                  if b > t and not (put_back and (rid, f.rel) in removed) and (rid, f.rel) not in left]
        for a in self.plan.actions:
            here = listings[a.root].files.get(a.rel)
            if a.kind in (DELETE, KEEP) and here is not None:
                if not put_back:
                    newer.append((a.root, a.rel))
                elif a.size is not None and here.size is not None and here.size != a.size:
                    newer.append((a.root, a.rel))
            elif a.kind == REPLACE and not put_back and not self._unchanged(a):
                newer.append((a.root, a.rel))
        return list(dict.fromkeys(rel for _, rel in newer))

    def _check_anchor(self) -> None:
        """Undo puts back only what the operation changed: it is only right on the tree the operation left.
        A checkpoint emptied (or replaced) since would come back as a fragment, so ``metadata`` must be what
        the operation left (and ``_check_target_batch``)."""
        if not self.fenced:
            return
        if self.anchor_metadata != self.final_metadata:
            self._refuse_anchor("`metadata` is missing" if self.anchor_metadata is None else
                                "`metadata` is not what the operation left", "undoing it")

    def _check_target_batch(self, listings: dict[str, Listing]) -> None:
        """The rest of ``_check_anchor``: the target batch's files in the logs its journal guards (and it
        changed) must be there. Judged after ``_written_since``: a query that ran on past the target deletes
        them too (Spark's cleanup), and that is what to say then."""
        if not self.fenced:
            return
        t = self.plan.target_batch
        if t is None or t < 0:
            return
        listing = listings["checkpoint"]
        touched = {a.rel.rpartition("/")[0] for a in self.plan.actions if a.root == "checkpoint"}
        for d in self.journal.record.get("undo_guard", {}).get("checkpoint", []):
            if d in touched and t not in log_files(listing, d, compactible=True):
                self._refuse_anchor(f"{d}/{t} (the last batch the operation left) is missing", "undoing it")

    def _refuse_anchor(self, what: str, doing: str) -> None:
        op = f"{self.plan.operation} {self.journal.op_id}"
        raise RefusedError(
            f"{what}: the checkpoint is not the one the {op} left (emptied or replaced since?), and {doing} "
            "would put back only the files the operation changed: a fragment of a checkpoint",
            path=self.ckpt.fm.url(self.ckpt.abs("metadata")),
            fix="nothing was changed; to get the old checkpoint back, restore a backup "
                f"(`checkpoint-ops backup list DEST`); `checkpoint-ops history {self.anchor_url}` lists the operations")

    # -- undo --------------------------------------------------------------------------------------
    def preview_undo(self, applied: bool) -> Plan:
        """What undo will do, as a plan to print and confirm, after checking everything it needs: that
        nothing was written since (``applied``), that what the operation wrote is still its own, and
        that its undo record (trash, keep directory) holds every file it must put back. Raises
        ``RefusedError`` (``UndoRecordLost`` for the last) before anything is changed."""
        plan = self.plan
        listings = self._listings()
        if applied:
            self._check_untouched(listings)
        changed = [a for a in plan.actions if a.kind == WRITE and a.rel in listings[a.root]
                   and not self._unchanged(a)]
        if changed:
            a = changed[0]
            root = self.roots[a.root]
            raise RefusedError(f"a file the {plan.operation} wrote was changed since: undo would remove what "
                               "someone else wrote", path=root.fm.url(root.abs(a.rel)),
                               fix="find out who changed it; restore the files from a backup")
        lost = self._missing_from_undo_record(listings)
        if lost:
            raise UndoRecordLost(self.journal, lost)
        inverse = Plan("undo", dict(plan.roots), plan.target_batch)
        why = f"{plan.operation} {self.journal.op_id}"
        for a in plan.ordered():
            present = a.rel in listings[a.root]
            if a.kind == WRITE and present:
                inverse.actions.append(FileAction(DELETE, a.root, a.rel, f"written by {why}", "write", a.size))
            elif a.kind == REPLACE and self._unchanged(a):
                inverse.actions.append(FileAction(REPLACE, a.root, a.rel, f"content before {why} put back from its "
                                                  "undo record", "replace", None))
            elif a.kind == DELETE and not present:
                inverse.actions.append(FileAction(WRITE, a.root, a.rel, f"moved aside by {why}, put back from its "
                                                  "undo record", a.phase, a.size))
            elif a.kind == KEEP and not present:
                inverse.actions.append(FileAction(WRITE, a.root, a.rel, f"moved to {plan.keep_dir} by {why}, moved "
                                                  "back", a.phase, a.size))
        inverse.summary = {"undo": f"{plan.operation} {self.journal.op_id}"
                           + (f" to batch {plan.target_batch}" if plan.target_batch is not None else "")
                           + f" (plan {plan.hash[:12]})", "result": "every file as it was before it"}
        return inverse

    def _unchanged(self, a: FileAction) -> bool:
        """``_matches`` for the checks before undo changes anything: each file is read once."""
        key = (a.root, a.rel)
        if key not in self._memo:
            self._memo[key] = self._matches(self.roots[a.root], a)
        return self._memo[key]

    def _missing_from_undo_record(self, listings: dict[str, Listing]) -> list[str]:
        """URLs of files undo must put back that are in neither their place nor the undo record."""
        plan, missing = self.plan, []
        for rid, root in self.roots.items():
            need = [a for a in plan.actions if a.root == rid and (
                (a.kind == DELETE and a.rel not in listings[rid] and (not root.versioned or a.phase == "write"))
                or (a.kind == REPLACE and a.rel in listings[rid] and self._unchanged(a)))]
            if need:
                have = {f.path[len(root.trash) + 1:] for f in root.fm.walk(root.trash)}
                missing += [root.fm.url(root.trash_path(a.rel)) for a in need if a.rel not in have]
        kept = [a for a in plan.actions if a.kind == KEEP and a.rel not in listings[a.root]]
        if kept:
            kfm, kpath = self.keep
            have = {f.path[len(kpath.rstrip("/")) + 1:] for f in kfm.walk(kpath)}
            missing += [kfm.url(join(kpath, a.dest)) for a in kept if a.dest not in have]
        return missing

    def undo(self, applied: bool, by: str | None = None) -> None:
        """Revert the operation (module docstring); ``by`` (who undoes it) goes into its ``undone`` marker."""
        plan = self.plan
        self.preview_undo(applied)  # every check, before anything changes (cached: no second listing)
        listings = self._listings()
        # "undoing" before anything changes: an undo that got past its unfence but not to its
        # "undone" marker would otherwise look like an applied operation whose files came back.
        self.journal.mark("undoing")
        self._fence("undo")
        self._drop_stray_temps(listings)
        # 1. what the operation wrote goes (with its checksum sidecars), and what it rewrote gets its
        # old content back, last written first (a restore's sink data files go before the log that lists
        # them: readers of its sink target never see data files without their log)
        for a in reversed(plan.ordered()):
            root = self.roots[a.root]
            if a.kind == WRITE and a.rel in listings[a.root]:
                root.fm.delete(root.abs(a.rel))  # a sidecar the plan also wrote goes with it: fine
            elif a.kind == REPLACE and root.fm.exists(root.trash_path(a.rel)):
                if self._matches(root, a):
                    with root.fm.open_read(root.trash_path(a.rel)) as old, \
                            root.fm.create_atomic(root.abs(a.rel), overwrite=True) as out:
                        while chunk := old.read(_STREAM):
                            out.write(chunk)
                root.fm.delete_many([root.trash_path(a.rel)])
            if a.kind in (WRITE, REPLACE):
                self._step()
        # 2. what it moved aside comes back
        written = {(a.root, a.rel) for a in plan.actions if a.kind == WRITE}
        restored: dict[str, list[str]] = {}
        for rid, root in self.roots.items():
            retired = [a for a in plan.actions if a.root == rid and a.kind == DELETE
                       and (a.rel not in listings[rid] or (rid, a.rel) in written)]
            restored[rid] = [a.rel for a in retired]
            in_trash = [a for a in retired if not root.versioned or a.phase == "write"]
            lost = root.fm.move_many([(root.trash_path(a.rel), root.abs(a.rel)) for a in in_trash])
            if root.versioned:
                undelete = [root.abs(a.rel) for a in retired if a.phase != "write"]
                not_restored = root.fm.undelete_many(undelete) if undelete else []
                lost += [p for p in not_restored if not root.fm.exists(p)]
            self._step(len(retired))
            if lost:  # checked before anything changed: only a concurrent change to the trash gets here
                raise RefusedError(f"{len(lost)} moved-aside files vanished from the undo record while undo ran "
                                   f"(e.g. {lost[0]})", path=root.fm.url(root.trash),
                                   fix=f"{'the checkpoint stays fenced: ' if self.fenced_now else ''}"
                                   "`checkpoint-ops resume` finishes the "
                                   f"{plan.operation} instead (its result is a checkpoint Spark starts from)")
        kept = [a for a in plan.actions if a.kind == KEEP]
        if kept:
            kfm, kpath = self.keep
            for rid in {a.root for a in kept}:
                root = self.roots[rid]
                back = [a for a in kept if a.root == rid and a.rel not in listings[rid]]
                _transfer(kfm, root.fm, [(join(kpath, a.dest), root.abs(a.rel)) for a in back])
                restored.setdefault(rid, []).extend(a.rel for a in back)
            self._step(len(kept))
        self._verify_restored(restored)
        self._remove_emptied_dirs()
        # the ledger forgets the truncation before the undo is marked done: killed in between, running undo
        # again (or resume) still sees an unfinished undo and finishes it (or rolls it forward)
        trunc = self.journal.record.get("ledger_truncation")
        if trunc is not None and "checkpoint" in self.roots:
            ledger_at(self.ckpt.fm, self.ckpt.path).remove_truncation(self.journal.op_id)
        self._unfence(self.original_metadata)
        self.journal.mark("undone", by=by)
        self._step()

    def _remove_emptied_dirs(self) -> None:
        """After undo took away what the operation wrote: the directories holding those files that hold nothing
        now (``state/0/3``, ``sources/0``; never a root itself) go too; the operation found each absent, or at
        most empty. Left behind, a restore undone left a location Spark refuses to start a new query at (an empty
        directory under ``state/``: STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). A directory that holds anything
        stays (the file system refuses to remove it); on S3 it is their directory markers that go."""
        by_root: dict[str, set[str]] = {}
        for a in self.plan.actions:
            if a.kind != WRITE:
                continue
            parent = a.rel.rpartition("/")[0]
            while parent:
                by_root.setdefault(a.root, set()).add(parent)
                parent = parent.rpartition("/")[0]
        for rid, rels in by_root.items():
            root = self.roots[rid]
            root.fm.remove_dirs_if_empty([root.abs(rel) for rel in rels])

    def _check_untouched(self, listings: dict[str, Listing]) -> None:
        """Undo is only safe on the tree the operation left (``_check_anchor``, ``_check_target_batch``) if
        nothing was written to the roots since (``_written_since``): no batch above its target in the logs its
        journal guards, and every file it removed or rewrote as it left it."""
        self._check_anchor()
        newer = self._written_since(listings, put_back=False)
        if newer:
            root = next(iter(self.roots.values()))
            raise RefusedError(
                f"{newer[0]} is new or changed since the {self.plan.operation}: something wrote here after it (did "
                "the query run?), and undo would mix two timelines",
                path=root.url,
                fix="stop the query; to go back further, roll back to the batch you want instead",
            )
        self._check_target_batch(listings)

    def _verify_restored(self, restored: dict[str, list[str]]) -> None:
        """After undo put files back: every one of them is there (one listing per root it put files in). A
        store that said it restored a file it did not (a versioned delete under a second delete marker) is
        caught here, before ``metadata`` and the ``undone`` marker say the tree is as it was."""
        for rid, rels in restored.items():
            if not rels:
                continue
            root = self.roots[rid]
            cut = len(root.path.rstrip("/")) + 1
            have = {f.path[cut:] for f in root.fm.walk(root.path)}
            missing = [rel for rel in rels if rel not in have]
            if missing:
                op = f"{self.plan.operation} {self.journal.op_id}"
                fenced = "the checkpoint stays fenced and " if self.fenced_now else ""
                raise RefusedError(
                    f"undo could not bring back {len(missing)} file(s) the {op} removed (e.g. {missing[0]}): the "
                    "store said it brought them back, but they are still missing", path=root.fm.url(root.abs(missing[0])),
                    fix=f"{fenced}the undo is not marked done: run `checkpoint-ops undo {self.anchor_url}` again; if "
                        f"they stay missing, `checkpoint-ops resume {self.anchor_url}` finishes the "
                        f"{self.plan.operation} instead (its result is a checkpoint Spark starts from)")


class UndoRecordLost(RefusedError):
    """Files undo must put back are gone from the undo record: undo cannot restore the tree."""

    def __init__(self, journal: Journal, missing: list[str]):
        self.journal = journal
        self.missing = missing
        super().__init__(
            f"the undo record of {journal.record['operation']} {journal.op_id} is incomplete: {len(missing)} file(s) "
            f"it must put back are gone (e.g. {missing[0]}), so undo cannot restore the tree as it was",
            path=journal.fm.url(journal.path))


def _sha256_of(fm: CheckpointFileManager, path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with fm.open_read(path) as f:
            while chunk := f.read(_STREAM):
                h.update(chunk)
    except FileNotFoundError:
        return None
    return h.hexdigest()


def _transfer(src_fm: CheckpointFileManager, dst_fm: CheckpointFileManager, pairs: list[tuple[str, str]]) -> None:
    """Move files between (possibly different) file systems."""
    if not pairs:
        return
    if type(src_fm) is type(dst_fm) and src_fm.location.scheme == dst_fm.location.scheme:
        src_fm.move_many(pairs)
        return
    for src, dst in pairs:
        dst_fm.write_bytes(dst, src_fm.read_bytes(src), overwrite=True)
        src_fm.delete(src)


def _b64(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)


def _b64e(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


# ---- entry points ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class JournalHooks:
    """What an operation's journal tells apply, resume and undo besides its plan (module docstring)."""

    final_metadata: bytes | None = None  # what ``metadata`` holds afterwards (None: what it holds now)
    ledger_truncation: int | None = None  # the batch ledger forgets batches above this (a rollback)
    undo_guard: dict[str, list[str]] = field(default_factory=dict)  # root id -> log dirs (``_check_untouched``)
    undoable: bool = True
    # checkpoint files above the target the operation left in place: the planned no-data batch a rollback
    # keeps (rollback.py), not a write since (``_written_since``)
    left_planned: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # recorded for people (a restore's backup id)

    def record(self) -> dict:
        out = {"undo_guard": self.undo_guard, "undoable": self.undoable, **self.extra}
        if self.left_planned:
            out["left_planned"] = list(self.left_planned)
        if self.final_metadata is not None:
            out["final_metadata"] = _b64e(self.final_metadata)
        if self.ledger_truncation is not None:
            out["ledger_truncation"] = {"after_batch": self.ledger_truncation}
        return out


@dataclass(frozen=True)
class AppliedOperation:
    """What the executor did (``--json`` ``result``; keys documented in docs/cli.md). ``requests`` and
    ``retries``: per root, the requests its file manager issued (every attempt) and how many were
    retries, by kind; a root that shares its file manager with an earlier one (a restore's ``ledger``
    shares the ``checkpoint``'s) is counted there only, once; ``source`` adds the stores content was
    streamed from (a restore's backup objects)."""

    op_id: str
    operation: str
    status: str  # applied | undone | abandoned
    plan_hash: str
    target_batch: int | None
    journal: str
    counts: dict
    requests: dict  # root id -> requests (or file-system calls) by kind
    retries: dict  # root id -> retried requests by kind

    def to_dict(self) -> dict:
        return {"op_id": self.op_id, "operation": self.operation, "status": self.status,
                "plan_hash": self.plan_hash, "target_batch": self.target_batch, "journal": self.journal,
                "counts": self.counts, "requests": self.requests, "retries": self.retries}

    @classmethod
    def of(cls, journal: Journal, status: str, roots: dict[str, "Root"],
           ex: "Executor | None" = None) -> "AppliedOperation":
        plan = journal.record["plan"]
        counters = per_file_manager({rid: r.fm for rid, r in roots.items()})
        requests = {rid: c.snapshot() for rid, c in counters.items()}
        retries = {rid: c.retries() for rid, c in counters.items()}
        sources = [fm.counter for fm in (ex._sources.values() if ex is not None else ())]
        if sources:
            requests["source"], retries["source"] = _summed(sources)
        return cls(journal.op_id, journal.record["operation"], status, plan["plan_hash"], plan["target_batch"],
                   journal.fm.url(journal.path), plan["counts"], requests, retries)


def per_file_manager(fms: dict[str, CheckpointFileManager]) -> dict[str, OpCounter]:
    """Root id -> the counter of its file manager, each file manager once (under the first root that uses
    it): two roots on one file manager share its counter, and reporting it under both would count every
    request twice."""
    out: dict[str, OpCounter] = {}
    seen: set[int] = set()
    for rid, fm in fms.items():
        if id(fm) not in seen:
            seen.add(id(fm))
            out[rid] = fm.counter
    return out


def _summed(counters) -> tuple[dict[str, int], dict[str, int]]:
    requests: dict[str, int] = {}
    retries: dict[str, int] = {}
    for counter in counters:
        for kind, n in counter.snapshot().items():
            requests[kind] = requests.get(kind, 0) + n
        for kind, n in counter.retries().items():
            retries[kind] = retries.get(kind, 0) + n
    return dict(sorted(requests.items())), dict(sorted(retries.items()))


def checkpoint_roots(ckpt=None, sinks=()) -> dict[str, tuple[CheckpointFileManager, str]]:
    """Root id -> (file manager, path) of a checkpoint's plan: ``checkpoint``, ``sink0``, ``sink1``..."""
    out = {}
    if ckpt is not None:
        out["checkpoint"] = (ckpt.fm, ckpt.root)
    for i, sink in enumerate(sinks):
        out[f"sink{i}"] = (sink.fm, sink.root)
    return out


def _open_roots(urls: dict[str, str], trash: dict[str, str], versioned: dict[str, bool],
                storage_options: dict | None) -> dict[str, Root]:
    roots = {}
    for rid, url in urls.items():
        fm, path = open_file_manager(url, storage_options)
        roots[rid] = Root(url, fm, path, trash[rid], versioned.get(rid, False))
    return roots


def apply_plan(plan: Plan, anchor: Anchor, fms: dict[str, tuple[CheckpointFileManager, str]],
               storage_options: dict | None = None, progress: bool = False, hooks: JournalHooks = JournalHooks(),
               guard: Callable[[], None] | None = None) -> AppliedOperation:
    """Journal and apply ``plan`` (built just now from what is at its roots: ``fms``, root id ->
    (file manager, path)). A plan with a ``checkpoint`` root is fenced while it runs."""
    op_id = new_op_id(plan.operation)
    trash, versioned, roots = {}, {}, {}
    for rid, (fm, path) in fms.items():
        trash[rid] = join(ops_dir(fm, path), "trash", op_id)
        # only probe versioning where something is deleted there
        versioned[rid] = fm.versioning_enabled(path) if any(a.root == rid and a.kind == DELETE
                                                            for a in plan.actions) else False
        roots[rid] = Root(plan.roots[rid], fm, path, trash[rid], versioned[rid])
    keep = open_file_manager(plan.keep_dir, storage_options) if plan.keep_dir else None
    record = {
        "op_id": op_id,
        "operation": plan.operation,
        "checkpoint": anchor.url,
        "anchor": {"url": anchor.url, "checkpoint": anchor.checkpoint},
        "plan": plan.to_journal(),
        "trash": trash,
        "versioned": versioned,
        "original_metadata": _b64e(anchor.metadata),
        **hooks.record(),
    }
    try:
        # a fence temp the killed operation left is litter the new plan moves aside: settling leaves it to the plan,
        # else the plan's undo record would miss it (the undo then refused as incomplete)
        planned = frozenset(a.rel for a in plan.actions
                            if a.root == "checkpoint" and a.kind == DELETE and "/" not in a.rel)
        settle_unstarted(anchor, storage_options, planned if anchor.checkpoint else frozenset())
        journal = write_journal(anchor.fm, anchor.ops, record)
    except StoreUnavailableError as e:  # its journal may or may not have been stored: nothing else was
        raise e.finish_with(f"nothing was changed yet; once the store answers, run "
                            f"`{resume_command(plan.operation, anchor.url)}` (it drops the journal if one was "
                            "stored), then the same command again") from e.__cause__
    ex: Executor | None = None
    try:
        if hooks.ledger_truncation is not None:  # records above the target belong to the old timeline
            ledger_at(anchor.fm, anchor.root).truncate(hooks.ledger_truncation, op_id)
        ex = Executor(journal, roots, keep, progress, plan=plan, current_metadata=anchor.metadata,
                      storage_options=storage_options, guard=guard)
        try:
            ex.apply(resuming=False)
        finally:
            ex.close()
    except StoreUnavailableError as e:
        raise interrupted(e, anchor, journal, ex=ex) from e.__cause__
    except Exception as e:
        raise interrupted(refused_by_store(e, anchor), anchor, journal, ex=ex) from e
    return AppliedOperation.of(journal, "applied", roots, ex)


def refused_by_store(e: Exception, anchor: Anchor) -> StorageError:
    """``e`` as the store's refusal of a request (access denied, no such bucket, disk full: an answer, not
    retried) for ``interrupted`` to say how to finish; raises ``e`` itself when it is no storage failure (a bug)."""
    if not is_storage_failure(e):
        raise e
    return StorageError(f"the store refused a request: {e}", path=anchor.url,
                        fix="fix what it refused (credentials, permissions, space)")


def interrupted(e: StorageError | StoreUnavailableError, anchor: Anchor, journal: Journal, undoing: bool = False,
                ex: Executor | None = None) -> StorageError | StoreUnavailableError:
    """A journaled operation stopped part-way because the store kept failing (``StoreUnavailableError``), or
    refused a request (a ``StorageError`` whose fix says what to mend first): say how to finish it, and
    whether Spark can start on the checkpoint now (from what ``ex``, the executor that stopped, did: an
    operation that had put ``metadata`` back only lacks its marker)."""
    outage = isinstance(e, StoreUnavailableError)
    when = "once the store answers" if outage else f"{e.fix}; then"  # a refusal: mend it first
    operation = journal.record["operation"]
    command = f"checkpoint-ops undo {anchor.url}" if undoing else resume_command(operation, anchor.url)
    what = f"{'undo of ' if undoing else ''}{operation} {journal.op_id}"
    if ex is not None and ex.unfenced:
        before = f"as it was before the {operation}" if undoing else f"from the {operation}'s result"
        done = "undone" if undoing else "finished"
        fix = (f"the {what} made every change and put `metadata` back (Spark can start {before}), but the store "
               f"failed before the journal recorded it as {done}: {when}{', and' if outage else ','} before the query "
               f"starts, record it with `{command}`")
    else:
        fenced = (" and the checkpoint stays fenced (Spark cannot start on it)" if ex is not None and ex.fenced_now
                  else "")
        fix = f"the {what} stopped part-way; it is journaled{fenced}: {when}, finish it with `{command}`"
    return e.finish_with(fix) if outage else StorageError(e.problem, path=e.path, fix=fix)


def foreign_journal(anchor: Anchor, journal: Journal) -> BadInputError | None:
    """The refusal for a journal that records its operation at another location than ``anchor`` (a copy of the
    checkpoint made with its ``.checkpoint-ops`` directory, or both moved): its plan names the other location's
    files and the copies it moved aside there, so undoing or resuming it here would take them from there. None
    for a journal of ``anchor``'s own."""
    rec = journal.record
    recorded = rec.get("anchor", {}).get("url") or rec.get("checkpoint")
    if recorded is None or same_location(recorded, anchor.url):
        return None
    return BadInputError(
        f"the journal of operation {journal.op_id} here records it at {recorded}, not at {anchor.url}: this looks "
        f"like a copy (or a move) of that location with its {OPS_DIR} directory, and the journal's plan names the "
        f"files there and the copies it moved aside there; nothing was changed",
        path=journal.fm.url(journal.path),
        fix=f"undo or resume it where it ran (`checkpoint-ops undo {recorded}`, `checkpoint-ops resume {recorded}`; "
            f"moved: move both back there first), then copy the checkpoint again: this copy keeps that operation's "
            f"fence and journal, which cannot be finished here (a copy made with `checkpoint-ops backup create` and "
            f"`backup restore` has a journal of its own)")


def reopen(anchor: Anchor, journal: Journal, storage_options: dict | None = None, progress: bool = False,
           guard: Callable[[], None] | None = None, foreign_ok: bool = False) -> Executor:
    """An executor for a journaled operation (to resume, roll forward or undo it). A journal of another location
    (``foreign_journal``) is refused unless ``foreign_ok`` (dropping one that never started touches only
    ``anchor``'s own files)."""
    refusal = foreign_journal(anchor, journal)
    if refusal is not None and not foreign_ok:
        raise refusal
    rec = journal.record
    plan = rec["plan"]
    roots = _open_roots(plan["roots"], rec["trash"], rec.get("versioned", {}), storage_options)
    if "checkpoint" in roots:
        roots["checkpoint"] = Root(plan["roots"]["checkpoint"], anchor.fm, anchor.root, rec["trash"]["checkpoint"],
                                   rec.get("versioned", {}).get("checkpoint", False))
    keep = open_file_manager(plan["keep_dir"], storage_options) if plan.get("keep_dir") else None
    try:
        return Executor(journal, roots, keep, progress, current_metadata=anchor.metadata,
                        storage_options=storage_options, guard=guard)
    except ValueError as e:
        raise BadInputError(str(e), path=journal.fm.url(journal.path)) from None


def abandon_if_unstarted(anchor: Anchor, journal: Journal, ex: Executor, every_root: bool = True,
                         keep: frozenset[str] = frozenset()) -> bool:
    """Drop a journaled operation that never changed anything (marked ``abandoned``: its plan may be stale now),
    with the temp file of the write it was killed in and its ledger truncation. False (nothing done) when any of
    its actions took effect. ``every_root``: its stray temp files in every root of its plan (``resume`` holds
    their leases); else only those of its fence, in the anchor (all a kill before the fence can leave there)."""
    if ex.effects_on_disk() > 0:
        return False
    if every_root:
        ex._drop_stray_temps(ex._listings())
    elif anchor.checkpoint:
        drop_fence_temps(anchor.fm, anchor.root, keep)
    # its ledger truncation first: stopped in between, the journal is still unfinished and this runs again
    ledger_at(anchor.fm, anchor.root).remove_truncation(journal.op_id)
    journal.mark("abandoned")
    return True


def drop_fence_temps(fm: CheckpointFileManager, root: str, keep: frozenset[str] = frozenset()) -> None:
    """Remove the temp files a killed write of ``metadata`` or of its checksum sidecar left in the checkpoint
    ``root`` (hidden ``.metadata.<uuid>.tmp``, ``..metadata.crc.<uuid>.tmp``): only a fence or an unfence writes
    ``metadata`` once the checkpoint exists (Spark writes it when it creates one), so they are ours. Not those
    named in ``keep``: a new plan moves them aside itself (and its undo puts them back)."""
    temps = [f.path for f in fm.list(root) if not f.is_dir and is_hidden_temp(f.name) and f.name not in keep
             and f.name.startswith((".metadata.", f".{hadoop_crc_name('metadata')}."))]
    if temps:
        fm.delete_many(temps)


_SETTLED = {"applied", "undone", "abandoned", "undoing"}  # markers of a journal that is no longer unfinished


def settle_unstarted(anchor: Anchor, storage_options: dict | None = None,
                     planned: frozenset[str] = frozenset()) -> list[str]:
    """Before a new operation is journaled at ``anchor`` (under its lease, the checkpoint not fenced): drop each
    earlier one that stopped before it changed anything (killed between its journal and its fence, as a
    re-run is the natural next step). Left unfinished under the new one, it could never be ended: ``resume`` and
    ``undo`` act on the newest operation, ``prune`` keeps unfinished ones, and once the new one has changed the
    files the old plan names, the old one looks started. Returns the op ids dropped; one that did change
    something is left for ``resume`` or ``undo``. ``planned``: names in the checkpoint's root the new plan
    removes itself (a fence temp of the dropped one), left in place for it."""
    dropped = []
    for path, markers in scan_journals(anchor.fm, anchor.ops).items():
        if markers & _SETTLED:
            continue
        try:
            journal = load_journal(anchor.fm, path)
            ex = reopen(anchor, journal, storage_options, foreign_ok=True)  # copied with the checkpoint: dropped too
        except BadInputError:  # a damaged journal stays as it is (resume and undo name it); the new one goes on
            continue
        # the new operation holds the anchor's lease, not necessarily those of the old plan's other roots
        if abandon_if_unstarted(anchor, journal, ex, every_root=False, keep=planned):
            dropped.append(journal.op_id)
    return dropped


STAGING_DIR = "staging"  # beside a root (``ops_dir``): rewrites a plan streamed there before it was applied


def staging_dir(fm: CheckpointFileManager, root: str) -> str:
    return join(ops_dir(fm, root), STAGING_DIR)


def clear_staged_sources(plan: Plan, fms: dict[str, tuple[CheckpointFileManager, str]]) -> None:
    """Delete the staged rewrites a finished plan used: its sources in the staging directory beside one of its
    roots (``fms``: root id -> (file manager, path)). Other sources (a restore's backup objects) are never
    touched. Best effort when the store is failing: they are hidden, and the next plan that stages sweeps
    those no unfinished operation needs (``sinklog.sweep_staging``)."""
    urls = set(plan.sources.values())
    for fm, path in fms.values():
        try:
            prefix = fm.url(staging_dir(fm, path)) + "/"
        except BadInputError:  # a root at a bucket root: nothing is staged beside it
            continue
        staged = [parse_url(u).path for u in sorted(urls) if u.startswith(prefix)]
        if staged:
            # their Hadoop checksum sidecars first (local disk keeps one per file), as ``delete`` does
            sidecars = [join(dirname(p), hadoop_crc_name(basename(p))) for p in staged] if fm.hadoop_crc else []
            with contextlib.suppress(StoreUnavailableError):  # best effort: the error that stopped it matters
                fm.delete_many(sidecars + staged)


def ensure_ledger_truncation(anchor: Anchor, journal: Journal) -> None:
    """A resumed or rolled-forward operation that truncates the ledger has its truncation (idempotent)."""
    trunc = journal.record.get("ledger_truncation")
    if trunc is not None:
        ledger_at(anchor.fm, anchor.root).ensure_truncation(trunc["after_batch"], journal.op_id)
