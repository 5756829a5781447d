"""Finishing, rolling forward and undoing journaled operations: ``resume`` and ``undo``.

Every recovery path ends. Whatever was interrupted, one of two commands reaches a checkpoint Spark
starts from, and neither points back at the other:

* an interrupted operation (fenced, or journaled and not marked): ``resume`` finishes it, ``undo``
  reverts it;
* an interrupted undo: ``undo`` finishes it, ``resume`` rolls the operation forward again (its result
  is a checkpoint Spark starts from);
* an operation whose undo record lost files: ``undo`` says so once, before changing anything, and names
  ``resume`` (interrupted) or says the checkpoint is consistent as it is (applied).

An operation (or undo) that fences its checkpoint and is found *not* fenced, unmarked, may have let Spark run:
it had put ``metadata`` back and stopped before its marker, or it had not fenced yet. Neither command then
re-applies a plan blindly: one whose every change is on disk is only recorded (``applied``, ``undone``); one
with changes left goes on only if nothing was written since its plan (``Executor.check_resumable``,
``check_roll_forward``; undo checks as for an applied operation), else it is refused, changing nothing.

The journal an anchor's ``resume``/``undo`` acts on is the fence's, else the newest one that is not
undone or abandoned (operations the journal marks as not undoable, such as a ``lease break``, are
history only).
"""

from __future__ import annotations

import time

from .activity import refuse_if_active
from .errors import BadInputError, RefusedError, StoreUnavailableError, param
from .executor import (
    Anchor,
    AppliedOperation,
    Executor,
    UndoRecordLost,
    abandon_if_unstarted,
    clear_staged_sources,
    ensure_ledger_truncation,
    foreign_journal,
    interrupted,
    refused_by_store,
    reopen,
)
from .fence import is_fence, journal_elsewhere, parse_fence, recovery_advice
from .journal import Journal, load_journal, op_id_time, scan_journals
from .lease import read_lease
from .liveness import OPERATION
from .model.checkpoint import Checkpoint
from .model.sink import SINK_LOG_DIR
from .operation import ApplyContext, Operation, Site
from .plan import Plan
from .storage import open_file_manager
from .storage.paths import join

# States of the journal ``find_journal`` returns.
FENCED_UNDO = "fenced-undo"
UNDOING = "undoing"  # an undo was interrupted while the checkpoint was not fenced
UNFINISHED = "unfinished"  # journal written, not fenced yet (or unfenced but not marked)
APPLIED = "applied"


def open_anchor(url: str, storage_options: dict | None = None, source_compact_interval: int = 10
                ) -> tuple[Anchor, Checkpoint | None]:
    """What a journal-level command (undo, resume, history, prune) acts on: a checkpoint, or the output
    of a file sink whose operations ran without a checkpoint; and the checkpoint's model if it is one."""
    fm, root = open_file_manager(url, storage_options)
    ckpt = Checkpoint(fm, root, source_compact_interval=source_compact_interval)
    if ckpt.kind == "unknown" and ckpt.listing.has_dir(SINK_LOG_DIR):
        return Anchor(fm, root, fm.url(root), None, checkpoint=False), None
    only_litter = all(rel.rsplit("/", 1)[-1].startswith(".") for rel in ckpt.listing.files)
    if only_litter and scan_journals(fm, Anchor(fm, root, url).ops):
        return Anchor.of_checkpoint(ckpt), ckpt  # a restore that stopped before its first file: its journal says
    ckpt.require_checkpoint(url)
    return Anchor.of_checkpoint(ckpt), ckpt


def find_journal(anchor: Anchor, want: str) -> tuple[Journal, str]:
    """The journal ``resume`` (want="resume") or ``undo`` (want="undo") acts on, and its state:
    ``fenced-<operation>`` (``fenced-undo`` included), ``undoing``, ``unfinished`` or ``applied``."""
    fm, ops = anchor.fm, anchor.ops
    if anchor.checkpoint and is_fence(anchor.metadata):
        f = parse_fence(anchor.metadata)
        try:
            return load_journal(fm, join(ops, "journal", f.op_id)), f"fenced-{f.operation}"
        except BadInputError as e:
            if not journal_elsewhere(f, anchor.url):
                raise
            # fenced under another name (a link) or copied while fenced: the fence says where its journal is
            raise BadInputError(f"{e.problem} (the fence names its journal at {f.journal})", path=e.path,
                                fix=recovery_advice(f, anchor.url)) from None
    for path, markers in reversed(scan_journals(fm, ops).items()):
        if "undone" in markers or "abandoned" in markers:
            continue
        j = load_journal(fm, path)
        if not j.record.get("undoable", True) and "applied" in markers:
            continue  # history only (a lease break)
        if UNDOING in markers:
            return j, UNDOING
        if "applied" in markers:
            if want == "undo" and "pruned" in markers:
                target = j.record["plan"]["target_batch"]
                raise RefusedError(
                    f"the last {j.record['operation']} ({j.op_id}"
                    + (f", to batch {target}" if target is not None else "") + ") cannot be undone: its undo "
                    "record was pruned", path=fm.url(j.path),
                    fix="restore from a backup taken before it; `checkpoint-ops history` lists what can still be "
                        "undone")
            return j, APPLIED
        return j, UNFINISHED
    raise RefusedError(f"nothing to {want}: no unfinished or undoable operation in the journal", path=fm.url(ops),
                       fix="`checkpoint-ops history` lists what was journaled here and what became of it")


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def _age(seconds: float) -> str:
    """A duration as people say it: "40 s", "15 min", "3 h", "2 days"."""
    seconds = max(0.0, seconds)
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return f"{int(seconds)} s"


def _describe(journal: Journal) -> str:
    rec = journal.record
    target = rec["plan"].get("target_batch")
    return f"{journal.op_id} ({rec['operation']}" + (f" to batch {target})" if target is not None else ")")


def _interrupted_undo(state: str) -> bool:
    return state in (FENCED_UNDO, UNDOING)


NOTHING = "nothing"  # what ``_JournalOperation.target`` holds when there was nothing to act on


class _JournalOperation(Operation):
    """An operation on a journaled one: its anchor, its journal, the roots that journal names.

    Which operation it acts on is decided when the command starts (``precheck``: the newest, or the one
    ``op_id`` names) and checked again under the lease (``open``): another command that held the lease first
    may have undone, finished or added one since, and acting on whatever is newest *then* would undo (or
    finish) an operation nobody asked for. A mismatch is refused (exit 1, nothing changed).

    ``precheck`` runs only after the command has started up, which on a loaded machine can take longer than a
    whole undo: another undo started together may have finished by then, and the newest operation ``precheck``
    sees is already the one before. So the command's own start (``started``: the CLI records it before anything
    is imported) counts too: under the lease, an operation that was undone or dropped at or after that time by
    another command (its marker's ``time``), newer than or equal to the one this would act on, or one journaled
    at or after that time (its op id's stamp), is refused the same way: it was not what was newest when this
    command started."""

    recovery = "acts on a journal"

    def __init__(self, url: str, storage_options: dict | None = None, source_compact_interval: int = 10,
                 op_id: str | None = None, started: float | None = None):
        self.url = url
        self.storage_options = storage_options
        self.source_compact_interval = source_compact_interval
        self.op_id = op_id  # the operation asked for by id (``undo --op``), else None: the newest
        self.fm, self.root = open_file_manager(url, storage_options)
        self.anchor: Anchor | None = None
        self.ckpt: Checkpoint | None = None
        self.journal: Journal | None = None
        self.state = ""
        self.ex: Executor | None = None
        self.target: str | None = None  # the op id resolved when the command started (NOTHING: none)
        self.started = time.time() if started is None else started  # when the command started (class docstring)

    def sites(self) -> list[Site]:
        return [Site(self.fm, self.root, self.url)]

    def precheck(self) -> None:
        super().precheck()
        if self.target is None:
            self.resolve()

    def resolve(self) -> str:
        """Decide now which operation this acts on (read-only, no lease): the one ``op_id`` names, which must
        be journaled here, else the newest one ``find_journal`` picks (``NOTHING`` if none). ``run`` does it
        first thing; a caller that shows the user what will be undone before running it calls it then."""
        anchor = self._glance()
        if self.op_id is not None:
            ids = [path.rsplit("/", 1)[-1] for path in scan_journals(anchor.fm, anchor.ops)]
            if self.op_id not in ids:
                raise BadInputError(f"no operation {self.op_id} is journaled for this location", path=anchor.url,
                                    fix=f"`checkpoint-ops history {anchor.url}` lists the operations and their ids")
            self.target = self.op_id
            return self.target
        try:
            self.target = find_journal(anchor, self.want)[0].op_id
        except RefusedError:
            self.target = NOTHING
        return self.target

    def _glance(self) -> Anchor:
        """The anchor as far as choosing a journal needs it (its ``metadata``, which may be a fence), without
        listing the checkpoint: ``open`` reads it whole under the lease."""
        try:
            metadata = self.fm.read_bytes(join(self.root, "metadata"))
        except OSError:  # missing (a sink output, a restore target) or unreadable: ``open`` says which
            metadata = None
        return Anchor(self.fm, self.root, self.fm.url(self.root), metadata, checkpoint=True)

    def open(self) -> None:
        self.anchor, self.ckpt = open_anchor(self.url, self.storage_options, self.source_compact_interval)
        self._refusal: RefusedError | None = None
        try:
            self.journal, self.state = find_journal(self.anchor, self.want)
        except RefusedError as e:
            # Nothing to do. Still lease what the newest operation changed before saying so: a holder
            # killed while releasing its leases leaves some behind, and this takes them over and clears them.
            self._refusal = e if self.target in (None, NOTHING) else self._moved_on(None, e)
            newest = list(scan_journals(self.anchor.fm, self.anchor.ops))
            self.journal = load_journal(self.anchor.fm, newest[-1]) if newest else None
            if self.journal is not None and foreign_journal(self.anchor, self.journal) is not None:
                self.journal = None  # another location's: its roots are not this command's to lease
            return
        refusal = foreign_journal(self.anchor, self.journal)
        if refusal is not None:  # before any lease of the roots its plan names (the other location's)
            raise refusal
        if self.target is not None and self.journal.op_id != self.target:
            self._refusal = self._moved_on(self.journal)
        else:
            self._refusal = self._acted_since_start()

    def _acted_since_start(self) -> RefusedError | None:
        """The refusal when another command acted here after this one started (class docstring), else None."""
        mine = self.journal
        again = f"run `checkpoint-ops {self.want} {self.anchor.url}` again to see what is newest now"
        since = f"after this {self.want} started ({_utc(self.started)})"
        journaled = op_id_time(mine.op_id)
        if self.op_id is None and journaled is not None and journaled >= self.started:
            return RefusedError(f"operation {_describe(mine)} was journaled {since}, by another command: it is not "
                                f"what was newest when this {self.want} started", path=self.anchor.url, fix=again)
        journals = scan_journals(self.anchor.fm, self.anchor.ops)
        for path, markers in journals.items():
            if path.rsplit("/", 1)[-1] < mine.op_id:
                continue  # older than the one this acts on: it did not decide what was newest
            for marker, done in (("undone", "undone"), ("abandoned", "dropped as stale")):
                if marker not in markers:
                    continue
                other = load_journal(self.anchor.fm, path)
                at = other.marked_at(marker)
                if at is not None and at >= self.started:
                    info = other.marker_info(marker)
                    by = f" by {info['by']}" if info.get("by") else " by another command"
                    return RefusedError(
                        f"operation {_describe(other)} was {done}{by} at {_utc(at)}, {since}: "
                        f"what was newest then is changed, and this {self.want} would act on {_describe(mine)}, "
                        f"which it was not started for (two `{self.want}` started together act on one operation, "
                        "not two)", path=self.anchor.url, fix=again)
        return None

    def _moved_on(self, newest: Journal | None, otherwise: RefusedError | None = None) -> RefusedError:
        """The refusal when the operation resolved at the start is not the one to act on under the lease
        (``newest``: the one that is; None: none is, and ``otherwise`` says why unless the start's one was
        undone, dropped or finished meanwhile)."""
        again = f"run `checkpoint-ops {self.want} {self.anchor.url}` again to see what is newest now"
        asked = "asked for" if self.op_id is not None else f"newest when this {self.want} started"
        now = (f"; the one to {self.want} now is {_describe(newest)}" if newest is not None else
               f"; nothing is left to {self.want}")
        if self.target == NOTHING:
            return RefusedError(f"nothing was left to {self.want} when this {self.want} started, and "
                                f"{_describe(newest)} was journaled since (by another command, which held the lease "
                                "first)",
                                path=self.anchor.url, fix=again)
        mine = load_journal(self.anchor.fm, join(self.anchor.ops, "journal", self.target))
        for marker, done in (("undone", "undone"), ("abandoned", "dropped as stale"), ("applied", "finished")):
            if marker == "applied" and self.want != "resume":
                continue
            if mine.has_marker(marker):
                info = mine.marker_info(marker)
                by = f" by {info['by']}" if info.get("by") else " by another command"
                return RefusedError(f"operation {_describe(mine)} was already {done}{by}"
                                    + (f" at {info['at']}" if info.get("at") else "") + now,
                                    path=self.anchor.url, fix=again)
        if otherwise is not None:
            return otherwise
        return RefusedError(f"operation {_describe(mine)} ({asked}) is not the one to {self.want}{now} (journaled "
                            f"after it, or it was not the newest {self.want}able one)", path=self.anchor.url,
                            fix=again)

    def _holder_stopped_since(self, op_id: str):
        """(holder, lease state, journal of ``op_id``, url) when a command died holding the anchor's lease, which it
        took after ``op_id`` was journaled, else None: an undoable operation (``_UNDOABLE``), which journaled nothing,
        or an undo that had finished (``_undone_by``). That command is what a user who runs ``undo`` or ``resume``
        next means, and nothing of it is left to act on. Reads the lease (and, for a dead undo, the journals)."""
        state = read_lease(self.fm, self.root)
        holder = state.holder
        journaled = op_id_time(op_id)
        if holder is None or state.stale_reason is None or journaled is None or holder.acquired_ms / 1000 <= journaled:
            return None
        if holder.kind != OPERATION or holder.operation not in (*_UNDOABLE, "undo"):
            return None
        url = self.fm.url(self.root)
        mine = load_journal(self.fm, join(Anchor(self.fm, self.root, url).ops, "journal", op_id))
        if holder.operation == "undo" and not self._undone_by(holder, op_id):
            # a dead undo that had not finished: ``op_id`` is what it was undoing (or about to), and running undo
            # again finishes it. One that had finished (killed while it released its lease) marked a newer
            # operation undone, and leaves ``op_id`` the one before it, which undo run again, meant to finish it,
            # would revert instead (a second review)
            return None
        return holder, state, mine, url

    def _undone_by(self, holder, op_id: str) -> bool:
        """Whether an operation journaled after ``op_id`` was marked undone since ``holder`` took the lease."""
        ops = Anchor(self.fm, self.root, self.fm.url(self.root)).ops
        for path, markers in scan_journals(self.fm, ops).items():
            if "undone" not in markers or path.rsplit("/", 1)[-1] <= op_id:
                continue
            at = load_journal(self.fm, path).marked_at("undone")
            if at is not None and at >= holder.acquired_ms / 1000:
                return True
        return False

    def more_sites(self) -> list[Site]:
        """The checkpoint and sinks the journaled plan changes (never its ledger or trash)."""
        out = []
        if self.journal is None:
            return out
        for rid, url in self.journal.record["plan"]["roots"].items():
            if rid == "checkpoint" or rid.startswith("sink"):
                fm, root = open_file_manager(url, self.storage_options)
                out.append(Site(fm, root, url))
        return out

    def check_active(self, force: bool) -> list[str]:
        if self._refusal is not None:
            raise self._refusal
        return refuse_if_active(self.ckpt, force) if self.ckpt is not None else []

    def _executor(self, ctx: ApplyContext | None = None) -> Executor:
        if self.ex is None:
            self.ex = reopen(self.anchor, self.journal, self.storage_options)
        if ctx is not None:
            self.ex.guard = ctx.guard
            if ctx.progress:
                self.ex.show_progress()
        return self.ex

    def _stale_unstarted(self, stage: bool) -> None:
        """An operation that never changed anything has a plan that may be stale now (Spark may have
        run since): it is dropped (marked ``abandoned``, its ledger truncation removed), not resumed. A copy it
        left in its trash or keep directory (a move on an object store stopped before its delete) is a change:
        ``effects_on_disk``."""
        ex = self._executor()
        op, op_id = self.journal.record["operation"], self.journal.op_id
        if stage:
            if not abandon_if_unstarted(self.anchor, self.journal, ex):
                return
            done = "its plan may be stale now and was dropped"
        elif ex.effects_on_disk() > 0:
            return
        else:
            done = "its plan may be stale now: running this without --dry-run drops it"
        raise RefusedError(f"the interrupted {op} {op_id} stopped before changing anything, so there is nothing "
                           f"to {self.want}; {done}", path=self.anchor.url,
                           fix=f"plan the {op} again (with --dry-run first)")


class ResumeOperation(_JournalOperation):
    """Finish an interrupted operation, or roll it forward after an interrupted undo."""

    name = "resume"
    want = "resume"
    confirm_required = False  # the plan was confirmed when the operation started

    record_only = False  # every change was on disk and ``metadata`` back: only the ``applied`` marker is written
    _claim = None  # a restore's intent at its backup destination, while it plans and applies (``hold_for_resume``)

    def precheck(self) -> None:
        """Where the newest operation finished and a command that took the lease after it died before it journaled
        anything, there is nothing to resume, and it is said without taking the stale lease over: that lease is
        what makes an ``undo`` run next refuse to revert the older operation instead of the stopped command (a
        hostile review: resume cleared it, and the undo that followed removed a whole restored checkpoint)."""
        super().precheck()
        if self.op_id is not None or self.target in (None, NOTHING):
            return
        stopped = self._holder_stopped_since(self.target)
        if stopped is None or not stopped[2].has_marker("applied"):
            return
        holder, state, mine, url = stopped
        done = ("after it had finished its undo" if holder.operation == "undo" else
                "before it journaled anything, so it changed nothing here that resume could finish")
        raise RefusedError(
            f"nothing to resume: the last command to take this location's lease, {holder.describe()}, was stopped "
            f"({state.stale_reason}) {done}; the newest journaled operation, {_describe(mine)}, completed. Nothing "
            "was changed (the stale lease is left as it is, so that an undo run next still refuses to revert that "
            "older operation instead)",
            path=url, fix=("nothing is left of the stopped undo to finish" if holder.operation == "undo" else
                           "to do what the stopped command set out to do, run it again (it takes the stale lease over)")
            + f"; to revert {mine.op_id} itself, name it: `checkpoint-ops undo {url} {param('op')} {mine.op_id}`")

    def plan(self, stage: bool) -> Plan:
        if self.state == APPLIED:
            raise RefusedError(f"the last operation ({self.journal.op_id}) completed: nothing to resume",
                               path=self.anchor.url)
        if self.state == UNFINISHED:
            self._stale_unstarted(stage)
        ex = self._executor()
        if ex.open_to_spark:  # Spark may have run since (module docstring)
            if _interrupted_undo(self.state):
                ex.check_roll_forward()
            else:
                self.record_only = ex.check_resumable()
        if not self.record_only:  # a restore reads its backup's objects again: under its intent (a dry run: checked)
            from .backup.restore import hold_for_resume

            try:
                self._claim = hold_for_resume(self.journal.record, self.anchor.url, ex, self.storage_options,
                                              hold=stage, rolling_forward=_interrupted_undo(self.state), warn=self.warn)
            except StoreUnavailableError as e:  # its default "run the same command again" reads as the restore's
                raise interrupted(e, self.anchor, self.journal) from e.__cause__
        return ex.plan

    def nothing_to_do(self, plan: Plan) -> bool:
        return False  # an interrupted operation with every file done still unfences and marks itself

    def discard(self, plan: Plan) -> None:
        self._release_claim()

    def _release_claim(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            claim.release_quietly()

    def apply(self, plan: Plan, ctx: ApplyContext) -> AppliedOperation:
        try:
            if self._claim is not None:
                self._claim.check()  # it held all along: no prune took it for stale and collected objects
            return self._apply(ctx)
        finally:
            self._release_claim()

    def _apply(self, ctx: ApplyContext) -> AppliedOperation:
        ex = self._executor(ctx)
        try:
            if self.record_only:
                ex.record_applied()
            else:
                ensure_ledger_truncation(self.anchor, self.journal)
                try:
                    ex.apply(resuming=True)
                finally:
                    ex.close()
            if _interrupted_undo(self.state):
                self.journal.unmark(UNDOING)  # rolled forward: it stands applied, undoable again
        except StoreUnavailableError as e:  # every step is idempotent: the same resume finishes it
            raise interrupted(e, self.anchor, self.journal, ex=ex) from e.__cause__
        except Exception as e:  # refused (access denied...): the same resume finishes it once that is mended
            raise interrupted(refused_by_store(e, self.anchor), self.anchor, self.journal, ex=ex) from e
        # finished: the rewrites it staged beside its roots are not needed any more (as after an apply)
        clear_staged_sources(ex.plan, {rid: (root.fm, root.path) for rid, root in ex.roots.items()})
        return AppliedOperation.of(self.journal, "applied", ex.roots, ex)

    def describe(self, plan: Plan, outcome: AppliedOperation) -> str:
        if self.record_only:
            return (f"Recorded {outcome.op_id} ({outcome.operation}, plan {outcome.plan_hash[:12]}) as finished: every "
                    "change it makes was on disk and `metadata` back; nothing else was changed")
        how = "Rolled forward" if _interrupted_undo(self.state) else "Resumed and finished"
        return f"{how} {outcome.op_id} ({outcome.operation}, plan {outcome.plan_hash[:12]})" + (
            f"; last committed batch is now {outcome.target_batch}" if outcome.operation == "rollback" else "")


# Operations a user undoes: one that died holding the lease before it journaled is what an undo run next is
# meant for (``UndoOperation``). Not an undo or a resume (they act on the journaled operation itself), nor a prune
# or a ledger sync (nothing to undo of them), nor a run (a Dagster materialization, a query holding the lease: run
# again, it would process new input, and the operation before it could never be undone).
_UNDOABLE = ("rollback", "restore", "sink-compact", "sink-retain", "sink-orphans")


class UndoOperation(_JournalOperation):
    """Revert the newest operation (or finish an interrupted undo), byte for byte.

    Asked for the newest (no ``op_id``), it refuses when the last command to hold the anchor's lease died
    holding it after that operation was journaled (a rollback killed while it planned, say): what the user
    means to undo is that command, which left nothing to undo, and the newest operation is an older one (a
    restore, whose undo removes the whole checkpoint). The dead holder's lease stays as it was, so running
    the same undo again refuses again; naming the operation (``op_id``) undoes it, and running the stopped
    command again takes the lease over and ends this."""

    name = "undo"
    want = "undo"

    record_only = False  # the undo had put everything back: only its ``undone`` marker (and ledger) is left
    checked = False  # undo checks as for an applied operation (``Executor.preview_undo``)

    def precheck(self) -> None:
        super().precheck()
        if self.op_id is None and self.target not in (None, NOTHING):
            refusal = self._stopped_since(self.target)
            if refusal is not None:
                raise refusal

    def _stopped_since(self, op_id: str) -> RefusedError | None:
        """The refusal when a command died holding the anchor's lease after ``op_id`` was journaled, leaving
        nothing of itself to undo (``_holder_stopped_since``; class docstring), else None. Takes nothing over: the
        next undo sees the same."""
        stopped = self._holder_stopped_since(op_id)
        if stopped is None:
            return None
        holder, state, mine, url = stopped
        age = _age(time.time() - op_id_time(op_id))
        what = ("had finished its undo (`checkpoint-ops history` shows it undone), so there is nothing of it to "
                "finish" if holder.operation == "undo" else "has no journaled operation to undo")
        return RefusedError(
            f"the last command to take this location's lease, {holder.describe()}, was stopped ({state.stale_reason}) "
            f"after the newest operation here was journaled, and {what}: undo would "
            f"revert {_describe(mine)}, journaled {age} ago, not the command that was stopped. Nothing was changed",
            path=url,
            fix=f"if you mean to revert {op_id}, name it ({param('op')} {op_id}); "
                + ("the stopped undo needs nothing more" if holder.operation == "undo" else
                   "to finish what the stopped command set out to do, run it again (it takes the stale lease over)")
                + "; `checkpoint-ops history` lists what was journaled here")

    def plan(self, stage: bool) -> Plan:
        if self.state == UNFINISHED:
            self._stale_unstarted(stage)
        ex = self._executor()
        # not fenced: an undo that had put everything back is only recorded; otherwise Spark may have run on the
        # operation's result, so undo checks as it does for an applied operation (module docstring)
        self.record_only = self.state == UNDOING and ex.open_to_spark and ex.undone_on_disk()
        self.checked = self.state == APPLIED or (ex.open_to_spark and not self.record_only)
        try:
            return ex.preview_undo(applied=self.checked)
        except UndoRecordLost as e:
            op = self.journal.record["operation"]
            if self.state == APPLIED:
                fix = (f"the checkpoint is consistent as it is (the result of the {op}); to go back further, "
                       f"restore a backup taken before {self.journal.op_id} (`checkpoint-ops backup list DEST`)")
            else:
                fix = (f"finish the {op} instead: `checkpoint-ops resume {self.anchor.url}` (its result is a "
                       "checkpoint Spark starts from)")
            raise RefusedError(e.problem, path=e.path, fix=fix) from None

    def nothing_to_do(self, plan: Plan) -> bool:
        return False  # with every file back, an interrupted undo still restores metadata and marks itself

    def apply(self, plan: Plan, ctx: ApplyContext) -> AppliedOperation:
        ex = self._executor(ctx)
        try:
            try:
                if self.record_only:
                    ex.record_undone(by=ctx.holder)
                else:
                    ex.undo(applied=self.checked, by=ctx.holder)  # the ledger's truncation goes before its mark
            finally:
                ex.close()
        except StoreUnavailableError as e:  # undo starts with its "undoing" marker: running it again finishes it
            raise interrupted(e, self.anchor, self.journal, undoing=True, ex=ex) from e.__cause__
        except Exception as e:  # refused: the same undo finishes it once that is mended
            raise interrupted(refused_by_store(e, self.anchor), self.anchor, self.journal, undoing=True, ex=ex) from e
        return AppliedOperation.of(self.journal, "undone", ex.roots, ex)

    def describe(self, plan: Plan, outcome: AppliedOperation) -> str:
        return f"Undone {outcome.op_id}: everything it changed is as it was before it."

    @property
    def undoing(self) -> str:
        """What is being undone, for the confirmation prompt."""
        rec = self.journal.record
        target = rec["plan"].get("target_batch")
        return f"{rec['operation']} {self.journal.op_id}" + (f" to batch {target}" if target is not None else "")
