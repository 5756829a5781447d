"""The operation history beside a checkpoint, and pruning the undo records of finished operations.

Every rollback moves what it deletes into ``trash/<op id>/`` so ``undo`` can put it back. That
copy grows with each rollback; pruning deletes the trash of operations the user no longer wants to
undo. An operation is marked ``pruned`` in its journal *before* its trash goes, so ``undo`` refuses
it cleanly (instead of restoring half a tree) and a crash halfway is finished by pruning again.
Operations still in progress are never pruned: their trash is what ``--resume``/``undo`` need.
"""

from __future__ import annotations

import time
from calendar import timegm
from dataclasses import dataclass, field
from typing import Callable

from .errors import BadInputError
from .fence import is_fence, parse_fence
from .executor import Anchor, per_file_manager
from .journal import Journal, load_journal, scan_journals
from .lease import guard_saying
from .operation import ApplyContext, Operation, Site
from .plan import Plan
from .storage import CheckpointFileManager, FileInfo, open_file_manager
from .storage.paths import basename, dirname

PRUNED = "pruned"


def _created_s(j: Journal) -> float:
    return float(timegm(time.strptime(j.record["created"], "%Y-%m-%dT%H:%M:%SZ")))


def _status(j: Journal, markers: set[str], fenced_op: str | None) -> str:
    if j.op_id == fenced_op:
        return "in-progress"  # the checkpoint is fenced by it: resume or undo it first
    for marker in ("undone", "abandoned"):
        if marker in markers:
            return marker
    if "undoing" in markers:
        return "in-progress"  # an interrupted undo: run undo again to finish it
    return "applied" if "applied" in markers else "unfinished"


@dataclass(frozen=True)
class HistoryEntry:
    """One journaled operation as ``history`` lists it (``--json``: docs/cli.md)."""

    op_id: str
    operation: str
    created: str
    target_batch: int | None
    plan_hash: str
    status: str  # applied | undone | abandoned | unfinished | in-progress
    counts: dict
    undo_record: str  # kept | pruned | none
    journal: Journal

    def to_dict(self) -> dict:
        return {"op_id": self.op_id, "operation": self.operation, "created": self.created,
                "target_batch": self.target_batch, "plan_hash": self.plan_hash, "status": self.status,
                "counts": self.counts, "undo_record": self.undo_record}


def history(anchor: Anchor) -> list[HistoryEntry]:
    """Every journaled operation, oldest first: what it did, its state, and whether undo can revert it."""
    ops = anchor.ops
    fenced = parse_fence(anchor.metadata).op_id if anchor.checkpoint and is_fence(anchor.metadata) else None
    out = []
    for path, markers in scan_journals(anchor.fm, ops).items():  # one listing for every journal and marker
        j = load_journal(anchor.fm, path)
        plan = j.record["plan"]
        status = _status(j, markers, fenced)
        pruned = PRUNED in markers
        undoable = j.record.get("undoable", True)
        out.append(HistoryEntry(
            j.op_id, j.record["operation"], j.record["created"], plan.get("target_batch"), plan["plan_hash"], status,
            plan["counts"],
            "pruned" if pruned else ("kept" if undoable and status in ("applied", "in-progress", "unfinished")
                                     else "none"),
            j))
    return out


class _TrashDirs:
    """Each trash directory (beside the checkpoint, beside each sink) listed once for all operations:
    on an object store every listing is a request, and the history can be long."""

    def __init__(self, anchor: Anchor, storage_options: dict | None):
        self.anchor = anchor
        self.storage_options = storage_options
        self._fms: dict[str, CheckpointFileManager] = {}
        self._by_op: dict[str, dict[str, list[FileInfo]]] = {}

    def fm(self, j: Journal, rid: str) -> CheckpointFileManager:
        """The file manager of one root the operation touched (its trash lives beside that root)."""
        if rid == "checkpoint":
            return self.anchor.fm
        url = j.record["plan"]["roots"][rid]
        if url not in self._fms:
            self._fms[url] = open_file_manager(url, self.storage_options)[0]
        return self._fms[url]

    def file_managers(self) -> dict[str, CheckpointFileManager]:
        """The file managers opened for other roots than the checkpoint, by URL."""
        return dict(self._fms)

    def files(self, j: Journal, rid: str) -> tuple[CheckpointFileManager, str, list[FileInfo]]:
        """The file manager, the trash path, and the files left in the trash of ``j`` beside ``rid``."""
        fm = self.fm(j, rid)
        trash = j.record["trash"][rid].rstrip("/")
        parent = dirname(trash)
        key = fm.url(parent)
        if key not in self._by_op:
            groups: dict[str, list[FileInfo]] = {}
            for f in fm.walk(parent):
                groups.setdefault(f.path[len(parent) + 1:].split("/", 1)[0], []).append(f)
            self._by_op[key] = groups
        return fm, trash, self._by_op[key].get(basename(trash), [])


def plan_prune(anchor: Anchor, keep_last: int | None = None, older_than_s: float | None = None,
               storage_options: dict | None = None, now: float | None = None) -> Plan:
    """Plan deleting the undo records (trash) of applied operations beyond the newest ``keep_last``
    and, if given, created more than ``older_than_s`` seconds ago. Undone or abandoned operations, and
    ones pruned before but not finished, lose whatever trash is left."""
    if keep_last is None and older_than_s is None:
        raise BadInputError("say which undo records to keep: --keep-last K and/or --older-than DURATION")
    if (keep_last is not None and keep_last < 0) or (older_than_s is not None and older_than_s < 0):
        raise BadInputError("--keep-last and --older-than must not be negative")
    now = time.time() if now is None else now
    entries = history(anchor)
    applied = [e for e in entries if e.status == "applied" and e.undo_record == "kept"]
    kept_newest = {e.op_id for e in applied[len(applied) - keep_last:]} if keep_last else set()
    plan = Plan("prune", {}, None)
    trash_dirs = _TrashDirs(anchor, storage_options)
    chosen, kept, skipped = [], [], []
    for e in entries:
        j: Journal = e.journal
        if e.status in ("in-progress", "unfinished"):
            skipped.append(f"{e.op_id} ({e.status}: finish it with `checkpoint-ops resume` or revert it with `checkpoint-ops undo` first)")
            continue
        if e.status == "applied" and e.undo_record == "kept":
            too_new = older_than_s is not None and now - _created_s(j) < older_than_s
            if e.op_id in kept_newest or too_new:
                kept.append(e.op_id)
                continue
            why = f"undo record of {e.operation} {e.op_id} to batch {e.target_batch} (applied)"
        else:
            why = f"left-over undo record of {e.operation} {e.op_id} ({e.status}" + (
                ", pruned before)" if e.undo_record == "pruned" else ")")
        found = False
        for rid in j.record.get("trash", {}):
            fm, trash, files = trash_dirs.files(j, rid)
            if files:
                root_id = f"{e.op_id}/{rid}"
                plan.roots[root_id] = fm.url(trash)
                for f in files:
                    plan.delete(root_id, f.path[len(trash) + 1:], why, "trash", f.known_size)
                found = True
        if found or (e.status == "applied" and e.undo_record == "kept"):
            chosen.append(e.op_id)
    plan.summary = {"prune": chosen or "nothing", "keep undoable": kept or "none"}
    if skipped:
        plan.summary["skipped"] = skipped
    if any(any(e.journal.record.get("versioned", {}).values()) for e in entries if e.op_id in chosen):
        plan.warnings.append("on versioned buckets the deleted objects' old versions stay until the bucket's "
                             "lifecycle rules expire them; pruning only ends undo's claim on them")
    return plan


@dataclass(frozen=True)
class PruneResult:
    """What ``apply_prune`` deleted (``--json`` ``result``)."""

    pruned: list[str]
    files_deleted: int
    bytes_deleted: int
    plan_hash: str
    requests: dict = field(default_factory=dict)  # store (checkpoint, or the URL of a sink) -> requests by kind
    retries: dict = field(default_factory=dict)  # store -> of them, retries by kind

    def to_dict(self) -> dict:
        return {"pruned": self.pruned, "files_deleted": self.files_deleted, "bytes_deleted": self.bytes_deleted,
                "plan_hash": self.plan_hash, "requests": self.requests, "retries": self.retries}


# deletes per request between two lease checks (an object store's DeleteObjects takes 1,000 keys)
_DELETE_CHUNK = 1000
_RERUN = ("the prune stopped part-way: each operation it marked pruned can no longer be undone and keeps what is "
          "left of its undo record until a prune finishes it; run the same command again to finish it")


def apply_prune(plan: Plan, anchor: Anchor, storage_options: dict | None = None,
                guard: Callable[[], None] | None = None) -> PruneResult:
    """Mark each chosen operation pruned (undo refuses it from then on), then delete its trash.
    ``guard`` (the operation's lease check) is called before each mark and each chunk of deletes: a
    prune whose lease lapsed stops (``LeaseLost``, saying to run it again) before another command that
    took the lease over (an undo of the next operation, say) sees its undo record go."""
    check = guard_saying(guard, _RERUN)
    ops = anchor.ops
    trash_dirs = _TrashDirs(anchor, storage_options)
    chosen = plan.summary.get("prune")
    chosen = chosen if isinstance(chosen, list) else []
    by_root: dict[str, list[str]] = {}
    for a in plan.actions:
        by_root.setdefault(a.root, []).append(a.rel)
    for op_id in chosen:
        check()
        j = load_journal(anchor.fm, f"{ops}/journal/{op_id}")
        j.mark(PRUNED)
        for rid, trash in j.record.get("trash", {}).items():
            rels = by_root.get(f"{op_id}/{rid}")
            if not rels:
                continue
            fm = trash_dirs.fm(j, rid)
            base = trash.rstrip("/")
            for start in range(0, len(rels), _DELETE_CHUNK):
                check()
                fm.delete_many([f"{base}/{r}" for r in rels[start:start + _DELETE_CHUNK]])
            fm.remove_empty_dirs(base)
    counters = per_file_manager({"checkpoint": anchor.fm, **trash_dirs.file_managers()})
    return PruneResult(chosen, len(plan.actions), plan.counts()["bytes_deleted"], plan.hash,
                       {store: c.snapshot() for store, c in counters.items()},
                       {store: c.retries() for store, c in counters.items()})


class PruneOperation(Operation):
    """``checkpoint-ops prune``: the undo records of older finished operations."""

    name = "prune"

    def __init__(self, url: str, keep_last: int | None = None, older_than_s: float | None = None,
                 storage_options: dict | None = None, source_compact_interval: int = 10):
        self.url, self.keep_last, self.older_than_s = url, keep_last, older_than_s
        self.storage_options, self.source_compact_interval = storage_options, source_compact_interval
        self.anchor: Anchor | None = None
        self._sites = [Site(*open_file_manager(url, storage_options), url)]

    def sites(self) -> list[Site]:
        return self._sites

    def open(self) -> None:
        from .recovery import open_anchor

        self.anchor, _ = open_anchor(self.url, self.storage_options, self.source_compact_interval)

    def plan(self, stage: bool) -> Plan:
        return plan_prune(self.anchor, self.keep_last, self.older_than_s, self.storage_options)

    def nothing_to_do(self, plan: Plan) -> bool:
        return plan.summary["prune"] == "nothing"  # an operation to mark pruned may have no trash left

    def apply(self, plan: Plan, ctx: ApplyContext) -> PruneResult:
        return apply_prune(plan, self.anchor, ctx.storage_options, guard=ctx.guard)

    def describe(self, plan: Plan, outcome: PruneResult) -> str:
        return (f"Pruned {', '.join(outcome.pruned)}: deleted {outcome.files_deleted} file(s); these operations can no "
                "longer be undone.")
