"""Applying a plan, resuming it after a crash, and undoing it.

Every operation that changes files (rollback, restore, sink-log compaction, retention, orphan cleanup)
is a ``Plan`` applied here. Its **anchor** is the checkpoint it concerns, or the sink output when an
operation has no checkpoint; the journal and the undo records (trash) live beside it. Apply, in order
(every step is idempotent, so ``--resume`` simply runs them again):

1. write the journal (plan, new small file contents, ``metadata`` before and after) beside the anchor;
2. **fence** (checkpoint anchors): replace ``metadata`` with text Spark cannot parse, so no query starts
   mid-way;
3. write new files (atomically, never replacing anything), then rewrite replaced files in place
   (atomically; the old content is copied into the trash first);
4. move deleted files aside into the trash, phase by phase: sink log (newest first), commits, offsets,
   source logs, state, litter, then sink data files (or into the user's directory). On an object store
   with versioning the delete itself is reversible and nothing is copied;
5. **unfence**: put ``metadata`` back (or the new one a restore brings); 6. mark the journal ``applied``.

Undo deletes what was written, puts back what was rewritten or moved, and restores ``metadata``: the
tree is byte-for-byte what it was. It refuses if anything was written since (Spark ran after it).
"""

from __future__ import annotations

import base64
import hashlib
import sys
from dataclasses import dataclass

from .errors import BadInputError, RefusedError, StoreUnavailableError
from .fence import Fence, fence_bytes, is_fence, parse_fence, resume_command
from .journal import Journal, load_journal, new_op_id, ops_dir, scan_journals, write_journal
from .ledger import ledger_at
from .model.listing import Listing
from .model.logfile import log_files
from .plan import DELETE, KEEP, REPLACE, WRITE, FileAction, Plan
from .storage import CheckpointFileManager, open_file_manager
from .storage.paths import join, parse_url

CHUNK = 1000  # files per batched move or delete (a crash test kills between any two: storage/killswitch.py)
_STREAM = 8 * 2**20


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
                 storage_options: dict | None = None):
        self.journal = journal
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
        self.chunk = CHUNK
        self.steps = 0
        self._scanned: dict[str, Listing] | None = None
        self._sources: dict[tuple, CheckpointFileManager] = {}
        self._bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=len(self.plan.actions) + 3, unit="file", file=sys.stderr, leave=False)

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _step(self, n: int = 1) -> None:
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
                return
        fence = Fence(operation, self.journal.op_id, self.journal.fm.url(self.journal.path),
                      self.original_metadata or self.final_metadata or b"")
        self.ckpt.fm.write_bytes(meta, fence_bytes(fence, self.ckpt.url), overwrite=True)
        self._step()

    def _unfence(self, metadata: bytes | None) -> None:
        if not self.fenced:
            return
        meta = self.ckpt.abs("metadata")
        if metadata is None:
            self.ckpt.fm.delete(meta)
        else:
            self.ckpt.fm.write_bytes(meta, metadata, overwrite=True)
        self._step()

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
        self._fence(plan.operation)
        if resuming:
            actions = self._pending(actions)
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
        """How many of the plan's actions have taken effect (moved away, written, or rewritten)."""
        listings = self._listings()
        done = 0
        for a in self.plan.actions:
            root = self.roots[a.root]
            if a.kind == WRITE:
                done += a.rel in listings[a.root] and self._matches(root, a)
            elif a.kind == REPLACE:
                done += root.fm.exists(root.trash_path(a.rel))
            else:
                done += a.rel not in listings[a.root]
        return done

    def _drop_stray_temps(self, listings: dict[str, Listing]) -> None:
        """Temp files of our own writes that a crash left behind (hidden ``.<name>.<uuid>.tmp``, not
        in the plan): the fence kept Spark away, so every such file is ours. Deleted, not kept: they
        were never part of the tree."""
        for rid, listing in listings.items():
            planned = {a.rel for a in self.plan.actions if a.root == rid}
            stray = [rel for rel in listing.files if rel not in planned and _is_temp(rel)]
            if stray:
                root = self.roots[rid]
                root.fm.delete_many([root.abs(r) for r in stray])

    def _pending(self, actions: list[FileAction]) -> list[FileAction]:
        """On resume: the actions whose effect is not on disk yet (writes and rewrites check their
        content themselves)."""
        listings = self._listings()
        return [a for a in actions if a.kind in (WRITE, REPLACE) or a.rel in listings[a.root]]

    # -- undo --------------------------------------------------------------------------------------
    def undo(self, applied: bool) -> None:
        plan = self.plan
        listings = {rid: Listing.scan(r.fm, r.path) for rid, r in self.roots.items()}
        if applied:
            self._check_untouched(listings)
        # "undoing" before anything changes: an undo that got past its unfence but not to its
        # "undone" marker would otherwise look like an applied operation whose files came back.
        self.journal.mark("undoing")
        self._fence("undo")
        self._drop_stray_temps(listings)
        # 1. what the operation wrote goes, and what it rewrote gets its old content back
        removed = set()
        for a in plan.actions:
            root = self.roots[a.root]
            if a.kind == WRITE and a.rel in listings[a.root]:
                if not self._matches(root, a):
                    raise RefusedError(f"a file the {plan.operation} wrote was changed since",
                                       path=root.fm.url(root.abs(a.rel)), fix="restore the files from a backup")
                root.fm.delete(root.abs(a.rel))
                removed.add((a.root, a.rel))
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
        for rid, root in self.roots.items():
            retired = [a for a in plan.actions if a.root == rid and a.kind == DELETE
                       and (a.rel not in listings[rid] or (rid, a.rel) in removed)]
            in_trash = [a for a in retired if not root.versioned or a.phase == "write"]
            lost = root.fm.move_many([(root.trash_path(a.rel), root.abs(a.rel)) for a in in_trash])
            if root.versioned:
                undelete = [root.abs(a.rel) for a in retired if a.phase != "write"]
                not_restored = root.fm.undelete_many(undelete) if undelete else []
                lost += [p for p in not_restored if not root.fm.exists(p)]
            self._step(len(retired))
            if lost:
                raise RefusedError(f"{len(lost)} moved-aside files are missing from the trash (e.g. {lost[0]})",
                                   path=root.fm.url(root.trash),
                                   fix="the trash was modified; restore the files from a backup")
        kept = [a for a in plan.actions if a.kind == KEEP]
        if kept:
            kfm, kpath = self.keep
            for rid in {a.root for a in kept}:
                root = self.roots[rid]
                pairs = [(join(kpath, a.dest), root.abs(a.rel)) for a in kept
                         if a.root == rid and a.rel not in listings[rid]]
                _transfer(kfm, root.fm, pairs)
            self._step(len(kept))
        self._unfence(self.original_metadata)
        self.journal.mark("undone")
        self._step()

    def _check_untouched(self, listings: dict[str, Listing]) -> None:
        """Undo is only safe if nothing was written to the roots since the operation."""
        t = self.plan.target_batch
        newer = []
        if t is not None and self.plan.operation in ("rollback", "restore", "sink-compact", "sink-retain",
                                                       "sink-orphans"):
            # a batch above the one the operation left: the query ran since
            for rid, listing in listings.items():
                if rid == "ledger":
                    continue
                if rid == "checkpoint":
                    dirs = ("offsets", "commits") if self.plan.operation in ("rollback", "restore") else ()
                else:
                    dirs = ("_spark_metadata",)
                for d in dirs:
                    newer += [f.rel for b, f in log_files(listing, d, compactible=True).items() if b > t]
        for a in self.plan.actions:
            if a.kind in (DELETE, KEEP) and a.rel in listings[a.root]:
                newer.append(a.rel)
            elif a.kind == REPLACE and not self._matches(self.roots[a.root], a):
                newer.append(a.rel)
        if newer:
            root = next(iter(self.roots.values()))
            raise RefusedError(
                f"{newer[0]} is new or changed since the {self.plan.operation}: something wrote here after it (did "
                "the query run?), and undo would mix two timelines",
                path=root.url,
                fix="stop the query; to go back further, roll back to the batch you want instead",
            )


def _sha256_of(fm: CheckpointFileManager, path: str) -> str | None:
    h = hashlib.sha256()
    try:
        with fm.open_read(path) as f:
            while chunk := f.read(_STREAM):
                h.update(chunk)
    except FileNotFoundError:
        return None
    return h.hexdigest()


def _is_temp(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.startswith(".") and name.endswith(".tmp")


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


def _open_roots(urls: dict[str, str], trash: dict[str, str], versioned: dict[str, bool],
                storage_options: dict | None) -> dict[str, Root]:
    roots = {}
    for rid, url in urls.items():
        fm, path = open_file_manager(url, storage_options)
        roots[rid] = Root(url, fm, path, trash[rid], versioned.get(rid, False))
    return roots


def apply_plan(plan: Plan, anchor: Anchor, fms: dict[str, tuple[CheckpointFileManager, str]],
               storage_options: dict | None = None, progress: bool = False,
               final_metadata: bytes | None = None, journal_extra: dict | None = None) -> dict:
    """Journal and apply ``plan`` (built just now from what is at its roots: ``fms``, root id ->
    (file manager, path)). A plan with a ``checkpoint`` root is fenced while it runs;
    ``final_metadata`` is what its ``metadata`` holds afterwards (default: what it holds now)."""
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
        **({"final_metadata": _b64e(final_metadata)} if final_metadata is not None else {}),
        **(journal_extra or {}),
    }
    try:
        journal = write_journal(anchor.fm, anchor.ops, record)
    except StoreUnavailableError as e:  # its journal may or may not have been stored: nothing else was
        raise e.finish_with(f"nothing was changed yet; once the store answers, run "
                            f"`{resume_command(plan.operation, anchor.url)}` (it drops the journal if one was "
                            "stored), then the same command again") from e.__cause__
    try:
        if plan.operation == "rollback":  # ledger records above the target belong to the old timeline
            ledger_at(anchor.fm, anchor.root).truncate(plan.target_batch, op_id)
        ex = Executor(journal, roots, keep, progress, plan=plan, current_metadata=anchor.metadata,
                      storage_options=storage_options)
        try:
            ex.apply(resuming=False)
        finally:
            ex.close()
    except StoreUnavailableError as e:
        raise _interrupted(e, anchor, journal) from e.__cause__
    return _result(journal, "applied", roots, ex)


def _interrupted(e: StoreUnavailableError, anchor: Anchor, journal: Journal, undoing: bool = False) -> \
        StoreUnavailableError:
    """A journaled operation stopped part-way because the store kept failing: say how to finish it."""
    operation = journal.record["operation"]
    command = f"checkpoint-ops undo {anchor.url}" if undoing else resume_command(operation, anchor.url)
    fenced = " and the checkpoint stays fenced (Spark cannot start on it)" if anchor.checkpoint else ""
    return e.finish_with(f"the {'undo of ' if undoing else ''}{operation} {journal.op_id} stopped part-way; it is "
                         f"journaled{fenced}: once the store answers, finish it with `{command}`")


def _result(journal: Journal, status: str, roots: dict[str, Root], ex: "Executor | None" = None) -> dict:
    """What an applied (or undone) operation did. ``requests`` and ``retries``: per root, the requests
    its file manager issued (every attempt) and how many were retries, by kind; ``source`` adds the
    stores content was streamed from (a restore's backup objects)."""
    plan = journal.record["plan"]
    counters = {rid: r.fm.counter for rid, r in roots.items()}
    sources = [fm.counter for fm in (ex._sources.values() if ex is not None else ())]
    requests = {rid: c.snapshot() for rid, c in counters.items()}
    retries = {rid: c.retries() for rid, c in counters.items()}
    if sources:
        requests["source"], retries["source"] = _summed(sources)
    return {
        "op_id": journal.op_id,
        "operation": journal.record["operation"],
        "status": status,
        "plan_hash": plan["plan_hash"],
        "target_batch": plan["target_batch"],
        "journal": journal.fm.url(journal.path),
        "counts": plan["counts"],
        "requests": requests,
        "retries": retries,
    }


def _summed(counters) -> tuple[dict[str, int], dict[str, int]]:
    requests: dict[str, int] = {}
    retries: dict[str, int] = {}
    for c in counters:
        for k, n in c.snapshot().items():
            requests[k] = requests.get(k, 0) + n
        for k, n in c.retries().items():
            retries[k] = retries.get(k, 0) + n
    return dict(sorted(requests.items())), dict(sorted(retries.items()))


def find_journal(anchor: Anchor, want: str) -> tuple[Journal, str]:
    """The journal ``--resume`` (want="resume") or ``undo`` (want="undo") acts on, and its state.

    States: ``fenced-<operation>``, ``fenced-undo``, ``undoing`` (an undo interrupted while the
    checkpoint was not fenced), ``unfinished`` (journal written, not fenced yet or unfenced but not
    marked), ``applied``.
    """
    fm, ops = anchor.fm, anchor.ops
    if anchor.checkpoint and is_fence(anchor.metadata):
        f = parse_fence(anchor.metadata)
        return load_journal(fm, join(ops, "journal", f.op_id)), f"fenced-{f.operation}"
    for path, markers in reversed(scan_journals(fm, ops).items()):
        j = load_journal(fm, path)
        if "undone" in markers or "abandoned" in markers:
            continue
        if "undoing" in markers:
            return j, "undoing"  # an undo was interrupted (after its unfence, or before its fence)
        if "applied" in markers:
            if want == "undo" and "pruned" in markers:
                raise RefusedError(
                    f"the last {j.record['operation']} ({j.op_id}, to batch {j.record['plan']['target_batch']}) "
                    "cannot be undone: its undo record was pruned", path=fm.url(j.path),
                    fix="restore from a backup taken before it; `checkpoint-ops history` lists what can still be "
                        "undone")
            return j, "applied"
        return j, "unfinished"
    raise RefusedError(f"nothing to {want}: no unfinished or undoable operation in the journal", path=fm.url(ops))


def _reopen(anchor: Anchor, journal: Journal, storage_options: dict | None, progress: bool) -> Executor:
    rec = journal.record
    plan = rec["plan"]
    roots = _open_roots(plan["roots"], rec["trash"], rec.get("versioned", {}), storage_options)
    if "checkpoint" in roots:
        roots["checkpoint"] = Root(plan["roots"]["checkpoint"], anchor.fm, anchor.root, rec["trash"]["checkpoint"],
                                   rec.get("versioned", {}).get("checkpoint", False))
    keep = open_file_manager(plan["keep_dir"], storage_options) if plan.get("keep_dir") else None
    try:
        return Executor(journal, roots, keep, progress, storage_options=storage_options)
    except ValueError as e:
        raise BadInputError(str(e), path=journal.fm.url(journal.path)) from None


def _abandon_if_unstarted(anchor: Anchor, journal: Journal, ex: Executor, want: str) -> None:
    """A journal whose operation never fenced the checkpoint and changed nothing has a plan that
    may be stale (Spark may have run since): drop it, and its ledger truncation, instead."""
    if ex.effects_on_disk() > 0:
        return  # it did change something: carry on
    ex._drop_stray_temps(ex._listings())  # the temp file of the write it was killed in, if any
    # its ledger truncation first: stopped in between, the journal is still unfinished and this runs again
    ledger_at(anchor.fm, anchor.root).remove_truncation(journal.op_id)
    journal.mark("abandoned")
    raise RefusedError(
        f"the interrupted {journal.record['operation']} {journal.op_id} stopped before changing anything, so "
        f"there is nothing to {want}; its plan may be stale now and was dropped",
        path=anchor.url,
        fix=f"plan the {journal.record['operation']} again (with --dry-run first)",
    )


def resume(anchor: Anchor, storage_options: dict | None = None, progress: bool = False) -> dict:
    journal, state = find_journal(anchor, "resume")
    if state == "applied":
        raise RefusedError(f"the last operation ({journal.op_id}) completed: nothing to resume", path=anchor.url)
    if state in ("fenced-undo", "undoing"):
        raise RefusedError(f"an undo of {journal.op_id} was interrupted", path=anchor.url,
                           fix=f"run `checkpoint-ops undo {anchor.url}` again to finish it")
    try:
        ex = _reopen(anchor, journal, storage_options, progress)
        if state == "unfinished":
            _abandon_if_unstarted(anchor, journal, ex, "resume")
        if journal.record["operation"] == "rollback":
            ledger_at(anchor.fm, anchor.root).ensure_truncation(journal.record["plan"]["target_batch"],
                                                                journal.op_id)
        try:
            ex.apply(resuming=True)
        finally:
            ex.close()
    except StoreUnavailableError as e:  # every step is idempotent: the same resume finishes it
        raise _interrupted(e, anchor, journal) from e.__cause__
    return _result(journal, "applied", ex.roots, ex)


def undo(anchor: Anchor, storage_options: dict | None = None, progress: bool = False) -> dict:
    journal, state = find_journal(anchor, "undo")
    try:
        ex = _reopen(anchor, journal, storage_options, progress)
        if state == "unfinished":
            _abandon_if_unstarted(anchor, journal, ex, "undo")
        try:
            ex.undo(applied=(state == "applied"))
        finally:
            ex.close()
        ledger_at(anchor.fm, anchor.root).remove_truncation(journal.op_id)
    except StoreUnavailableError as e:  # undo starts with its "undoing" marker: running it again finishes it
        raise _interrupted(e, anchor, journal, undoing=True) from e.__cause__
    return _result(journal, "undone", ex.roots, ex)
