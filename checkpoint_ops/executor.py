"""Applying a plan, resuming it after a crash, and undoing it.

Apply, in order (every step is idempotent, so ``--resume`` simply runs them again):

1. write the journal (plan, new file contents, original ``metadata``) beside the checkpoint;
2. **fence**: replace ``metadata`` with text Spark cannot parse, so no query starts mid-way;
3. write new files (atomically, never replacing anything);
4. move deleted files aside into the trash, phase by phase: sink log (newest first), commits,
   offsets, source logs, state, litter, then sink data files (or into ``--keep-files``). On an
   object store with versioning the delete itself is reversible and nothing is copied;
5. **unfence**: put the original ``metadata`` back; 6. mark the journal ``applied``.

Undo deletes what was written, moves everything back, and restores ``metadata``: the tree is
byte-for-byte what it was. It refuses if anything was written since (Spark ran after the rollback).
"""

from __future__ import annotations

import base64
import sys
from dataclasses import dataclass

from .errors import BadInputError, RefusedError
from .fence import Fence, fence_bytes, is_fence, parse_fence
from .journal import Journal, load_journal, new_op_id, ops_dir, scan_journals, write_journal
from .ledger import ledger_at
from .model.checkpoint import Checkpoint
from .model.listing import Listing
from .model.logfile import log_files
from .plan import DELETE, KEEP, WRITE, FileAction, Plan
from .storage import CheckpointFileManager, open_file_manager
from .storage.paths import join

CHUNK = 1000  # files per batched move or delete (a crash test kills between any two: storage/killswitch.py)


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
                 progress: bool = False, plan: Plan | None = None, current_metadata: bytes | None = None):
        self.journal = journal
        self._current_metadata = current_metadata  # known when applying fresh: no re-read
        self.roots = roots
        self.keep = keep
        self.plan = plan if plan is not None else Plan.from_journal(journal.record["plan"])
        self.original_metadata = _b64(journal.record.get("original_metadata"))
        self.chunk = CHUNK
        self.steps = 0
        self._scanned: dict[str, Listing] | None = None
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
                      self.original_metadata or b"")
        self.ckpt.fm.write_bytes(meta, fence_bytes(fence, self.ckpt.url), overwrite=True)
        self._step()

    def _unfence(self) -> None:
        meta = self.ckpt.abs("metadata")
        if self.original_metadata is None:
            self.ckpt.fm.delete(meta)
        else:
            self.ckpt.fm.write_bytes(meta, self.original_metadata, overwrite=True)
        self._step()

    # -- primitive steps ---------------------------------------------------------------------------
    def _write(self, a: FileAction) -> None:
        root = self.roots[a.root]
        content = self.plan.contents[a.sha256]
        try:
            root.fm.write_bytes(root.abs(a.rel), content, overwrite=False)
        except FileExistsError:
            if root.fm.read_bytes(root.abs(a.rel)) != content:  # a resumed run wrote it already?
                raise RefusedError("a file the plan creates already exists with other content",
                                   path=root.fm.url(root.abs(a.rel)),
                                   fix="something changed the checkpoint during the operation; undo it and re-plan")
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
        self._fence("rollback")
        if resuming:
            actions = self._pending(actions)
            self._drop_stray_temps(self._listings())
        self._retire([a for a in actions if a.kind == DELETE and a.phase == "write"])  # replaced files
        for a in actions:
            if a.kind == WRITE:
                self._write(a)
        # Each root's deletes go in as few batches as possible, in phase order. The one barrier:
        # a sink's data files go only after its log no longer lists them (readers stay consistent).
        self._retire([a for a in actions if a.kind == DELETE and a.phase not in ("write", "sink-data")])
        self._retire([a for a in actions if a.kind == DELETE and a.phase == "sink-data"])
        self._keep([a for a in actions if a.kind == KEEP])
        self._unfence()
        self.journal.mark("applied")
        self._step()

    def _listings(self) -> dict[str, Listing]:
        """One listing per root, taken once before a resumed run changes anything."""
        if self._scanned is None:
            self._scanned = {rid: Listing.scan(r.fm, r.path) for rid, r in self.roots.items()}
        return self._scanned

    def effects_on_disk(self) -> int:
        """How many of the plan's actions have taken effect (moved away, or written)."""
        listings = self._listings()
        done = 0
        for a in self.plan.actions:
            root = self.roots[a.root]
            if a.kind == WRITE:
                done += a.rel in listings[a.root] and root.fm.read_bytes(root.abs(a.rel)) == self.plan.contents[a.sha256]
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
        """On resume: the actions whose effect is not on disk yet."""
        listings = self._listings()
        out = []
        for a in actions:
            present = a.rel in listings[a.root]
            if a.kind == WRITE:
                out.append(a)  # _write is idempotent (compares content)
            elif present:
                out.append(a)
        return out

    # -- undo --------------------------------------------------------------------------------------
    def undo(self, applied: bool) -> None:
        plan = self.plan
        listings = {rid: Listing.scan(r.fm, r.path) for rid, r in self.roots.items()}
        if applied:
            self._check_untouched(listings)
        # "undoing" before anything changes: an undo that got past its unfence but not to its
        # "undone" marker would otherwise look like an applied rollback whose files came back.
        self.journal.mark("undoing")
        self._fence("undo")
        self._drop_stray_temps(listings)
        # 1. what the operation wrote goes
        removed = set()
        for a in plan.actions:
            if a.kind != WRITE:
                continue
            root = self.roots[a.root]
            if a.rel in listings[a.root]:
                if root.fm.read_bytes(root.abs(a.rel)) != plan.contents[a.sha256]:
                    raise RefusedError("a file the rollback wrote was changed since", path=root.fm.url(root.abs(a.rel)),
                                       fix="restore the checkpoint from a backup")
                root.fm.delete(root.abs(a.rel))
                removed.add((a.root, a.rel))
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
                                   fix="the trash was modified; restore the checkpoint from a backup")
        kept = [a for a in plan.actions if a.kind == KEEP]
        if kept:
            kfm, kpath = self.keep
            for rid in {a.root for a in kept}:
                root = self.roots[rid]
                pairs = [(join(kpath, a.dest), root.abs(a.rel)) for a in kept
                         if a.root == rid and a.rel not in listings[rid]]
                _transfer(kfm, root.fm, pairs)
            self._step(len(kept))
        self._unfence()
        self.journal.mark("undone")
        self._step()

    def _check_untouched(self, listings: dict[str, Listing]) -> None:
        """Undo is only safe if nothing was written to the roots since the rollback."""
        t = self.plan.target_batch
        newer = []
        if t is not None:  # a batch above the target means the query ran after the rollback
            for rid, listing in listings.items():
                dirs = ("offsets", "commits") if rid == "checkpoint" else ("_spark_metadata",)
                for d in dirs:
                    newer += [f.rel for b, f in log_files(listing, d, compactible=True).items() if b > t]
        for a in self.plan.actions:
            if a.kind in (DELETE, KEEP) and a.rel in listings[a.root]:
                newer.append(a.rel)
        if newer:
            root = self.roots["checkpoint"]
            raise RefusedError(
                f"{newer[0]} is new since the rollback: something wrote here after it (did the query run?), and "
                "undo would mix two timelines",
                path=root.url,
                fix="stop the query and roll back to the batch you want instead",
            )


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


# ---- entry points ---------------------------------------------------------------------------------


def _open_roots(urls: dict[str, str], trash: dict[str, str], versioned: dict[str, bool],
                storage_options: dict | None) -> dict[str, Root]:
    roots = {}
    for rid, url in urls.items():
        fm, path = open_file_manager(url, storage_options)
        roots[rid] = Root(url, fm, path, trash[rid], versioned.get(rid, False))
    return roots


def apply_plan(plan: Plan, ckpt: Checkpoint, sink_roots: dict[str, tuple[CheckpointFileManager, str]],
               storage_options: dict | None = None, progress: bool = False) -> dict:
    """Journal and apply ``plan`` (built from ``ckpt`` and those sinks just now)."""
    op_id = new_op_id(plan.operation)
    ops = ops_dir(ckpt.fm, ckpt.root)
    fms = {"checkpoint": (ckpt.fm, ckpt.root), **sink_roots}
    trash, versioned, roots = {}, {}, {}
    for rid, (fm, path) in fms.items():
        trash[rid] = join(ops_dir(fm, path) if rid != "checkpoint" else ops, "trash", op_id)
        # only probe versioning where something is deleted there
        versioned[rid] = fm.versioning_enabled(path) if any(a.root == rid for a in plan.actions) else False
        roots[rid] = Root(plan.roots[rid], fm, path, trash[rid], versioned[rid])
    keep = open_file_manager(plan.keep_dir, storage_options) if plan.keep_dir else None
    record = {
        "op_id": op_id,
        "operation": plan.operation,
        "checkpoint": ckpt.url,
        "plan": plan.to_journal(),
        "trash": trash,
        "versioned": versioned,
        "original_metadata": base64.b64encode(ckpt.metadata_raw).decode() if ckpt.metadata_raw is not None else None,
    }
    journal = write_journal(ckpt.fm, ops, record)
    if plan.operation == "rollback":  # ledger records above the target belong to the old timeline
        ledger_at(ckpt.fm, ckpt.root).truncate(plan.target_batch, op_id)
    ex = Executor(journal, roots, keep, progress, plan=plan, current_metadata=ckpt.metadata_raw)
    try:
        ex.apply(resuming=False)
    finally:
        ex.close()
    return _result(journal, "applied", roots)


def _result(journal: Journal, status: str, roots: dict[str, Root]) -> dict:
    plan = journal.record["plan"]
    return {
        "op_id": journal.op_id,
        "status": status,
        "plan_hash": plan["plan_hash"],
        "target_batch": plan["target_batch"],
        "journal": journal.fm.url(journal.path),
        "counts": plan["counts"],
        "requests": {rid: r.fm.counter.snapshot() for rid, r in roots.items()},
    }


def find_journal(ckpt: Checkpoint, want: str) -> tuple[Journal, str]:
    """The journal ``--resume`` (want="resume") or ``undo`` (want="undo") acts on, and its state.

    States: ``fenced-<operation>``, ``fenced-undo``, ``undoing`` (an undo interrupted while the
    checkpoint was not fenced), ``unfinished`` (journal written, not fenced yet or unfenced but not
    marked), ``applied``.
    """
    fm = ckpt.fm
    ops = ops_dir(fm, ckpt.root)
    if is_fence(ckpt.metadata_raw):
        f = parse_fence(ckpt.metadata_raw)
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
                    fix="restore the checkpoint from a backup taken before it; `checkpoint-ops history` lists "
                        "what can still be undone")
            return j, "applied"
        return j, "unfinished"
    raise RefusedError(f"nothing to {want}: no unfinished or undoable operation in the journal", path=fm.url(ops))


def _reopen(ckpt: Checkpoint, journal: Journal, storage_options: dict | None, progress: bool) -> Executor:
    rec = journal.record
    plan = rec["plan"]
    roots = _open_roots(plan["roots"], rec["trash"], rec.get("versioned", {}), storage_options)
    roots["checkpoint"] = Root(plan["roots"]["checkpoint"], ckpt.fm, ckpt.root, rec["trash"]["checkpoint"],
                               rec.get("versioned", {}).get("checkpoint", False))
    keep = open_file_manager(plan["keep_dir"], storage_options) if plan.get("keep_dir") else None
    try:
        return Executor(journal, roots, keep, progress)
    except ValueError as e:
        raise BadInputError(str(e), path=journal.fm.url(journal.path)) from None


def _abandon_if_unstarted(ckpt: Checkpoint, journal: Journal, ex: "Executor", want: str) -> None:
    """A journal whose operation never fenced the checkpoint and changed nothing has a plan that
    may be stale (Spark may have run since): drop it, and its ledger truncation, instead."""
    if ex.effects_on_disk() > 0:
        return  # it did change something: carry on
    journal.mark("abandoned")
    ledger_at(ckpt.fm, ckpt.root).remove_truncation(journal.op_id)
    raise RefusedError(
        f"the interrupted {journal.record['operation']} {journal.op_id} stopped before changing anything, so "
        f"there is nothing to {want}; its plan may be stale now and was dropped",
        path=ckpt.url,
        fix="plan the rollback again (checkpoint-ops rollback ... --dry-run)",
    )


def resume(ckpt: Checkpoint, storage_options: dict | None = None, progress: bool = False) -> dict:
    journal, state = find_journal(ckpt, "resume")
    if state == "applied":
        raise RefusedError(f"the last operation ({journal.op_id}) completed: nothing to resume", path=ckpt.url)
    if state in ("fenced-undo", "undoing"):
        raise RefusedError(f"an undo of {journal.op_id} was interrupted", path=ckpt.url,
                           fix=f"run `checkpoint-ops undo {ckpt.url}` again to finish it")
    ex = _reopen(ckpt, journal, storage_options, progress)
    if state == "unfinished":
        _abandon_if_unstarted(ckpt, journal, ex, "resume")
    if journal.record["operation"] == "rollback":
        ledger_at(ckpt.fm, ckpt.root).ensure_truncation(journal.record["plan"]["target_batch"], journal.op_id)
    try:
        ex.apply(resuming=True)
    finally:
        ex.close()
    return _result(journal, "applied", ex.roots)


def undo(ckpt: Checkpoint, storage_options: dict | None = None, progress: bool = False) -> dict:
    journal, state = find_journal(ckpt, "undo")
    ex = _reopen(ckpt, journal, storage_options, progress)
    if state == "unfinished":
        _abandon_if_unstarted(ckpt, journal, ex, "undo")
    try:
        ex.undo(applied=(state == "applied"))
    finally:
        ex.close()
    ledger_at(ckpt.fm, ckpt.root).remove_truncation(journal.op_id)
    return _result(journal, "undone", ex.roots)
