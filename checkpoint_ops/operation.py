"""The operation layer: one runner for every command that changes a checkpoint, a sink output or a
backup destination, used alike by the CLI and by the Dagster layer.

An **operation** is its sites (the roots it changes: a checkpoint, sink outputs, a restore target, a
backup destination), a plan builder, and the hooks its apply needs. ``run`` does, for every one:

    take the lease of every site
      → read what the plan needs (never before the lease: another writer may have been mid-way)
      → refuse if the query looks active (``--force``: go on, and the plan's warnings say what was overridden)
      → plan
      → dry-run: return the plan, change nothing
      → confirm (``yes``, the exact ``plan_hash`` reviewed, or a person at a prompt)
      → apply (the executor journals, fences, changes, unfences; the heartbeat keeps the leases)
      → release the leases, whatever happened

Operations live beside their planners (``rollback.RollbackOperation``, ``recovery.UndoOperation``,
``sinklog.SinkCompactOperation``, ``backup.restore.RestoreOperation``, ...). Results are typed.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol

from .errors import BadInputError, RefusedError
from .interrupts import interrupts_held
from .lease import LEASE_LEFT_BEHIND, LeaseSet, acquire_all, release_problem as _why
from .plan import Plan
from .storage import CheckpointFileManager

MIN_PLAN_HASH = 8  # a shorter prefix is too weak to count as "the plan I reviewed"


@dataclass(frozen=True)
class Site:
    """A root an operation changes: its lease is taken before anything is read there."""

    fm: CheckpointFileManager
    root: str
    what: str  # for people: "checkpoint /data/ckpt", "sink output s3://b/out"

    @property
    def url(self) -> str:
        return self.fm.url(self.root)

    def lease_target(self) -> tuple[CheckpointFileManager, str, str]:
        return self.fm, self.root, self.what


class Outcome(Protocol):
    """What applying an operation did (typed per operation; ``to_dict`` is its ``--json`` form)."""

    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class ApplyContext:
    """What an operation's apply may use."""

    storage_options: dict | None
    progress: bool
    leases: LeaseSet
    held: LeaseSet | None = None  # leases the caller held already (a Dagster run's): checked too

    def guard(self) -> None:
        """Between steps: stop if a lease was lost, or not renewed for too long (``Lease.check``)."""
        self.leases.check()
        if self.held is not None:
            self.held.check()

    @property
    def holder(self) -> str | None:
        """Who applies (the holder of the leases taken for it), for the journal; None under leases a
        caller already held (a Dagster run's)."""
        return self.leases.leases[0].holder.describe() if self.leases.leases else None


class Operation(abc.ABC):
    """One mutating command (module docstring)."""

    name: ClassVar[str]
    #: apply only after --yes, --plan-hash or a prompt (resume finishes a plan confirmed when it started)
    confirm_required: ClassVar[bool] = True
    #: take the sites' leases (``lease break`` removes someone else's instead)
    takes_lease: ClassVar[bool] = True
    #: how its apply is recovered when it stops part-way: ``"journal"`` (it journals what it changes: resume or undo
    #: it at ``recovery_url``), ``"acts on a journal"`` (undo, resume: run either again) or ``"again"`` (run it again)
    recovery: ClassVar[str] = "again"
    #: where a notice for the person waiting goes (``RunOptions.warn``, set by ``run``): e.g. that it waits for
    #: another process
    warn: Callable[[str], None] | None = None

    @abc.abstractmethod
    def sites(self) -> list[Site]:
        """The roots to lease, known from the arguments alone."""

    def recovery_url(self) -> str | None:
        """Where ``resume`` and ``undo`` find this operation's journal (its anchor): its first site by default."""
        sites = self.sites()
        return sites[0].url if sites else None

    def precheck(self) -> None:
        """Refuse, before any lease is written, what needs no reading under the lease: by default, a
        site that is not an existing directory (a lease there would create it)."""
        for site in self.sites():
            require_directory(site)

    def open(self) -> None:
        """Read what the plan needs; called once the leases are held."""

    def more_sites(self) -> list[Site]:
        """Roots known only once opened (an undo's are in its journal); leased before planning."""
        return []

    def check_active(self, force: bool) -> list[str] | None:
        """Refuse (``RefusedError``) if the query looks active, unless ``force``: then return warnings saying
        what was overridden and what it risks (``run`` adds them to the plan's warnings)."""

    @abc.abstractmethod
    def plan(self, stage: bool) -> Plan:
        """The plan. ``stage``: it will be applied, so content too big for the journal may be staged."""

    @abc.abstractmethod
    def apply(self, plan: Plan, ctx: ApplyContext) -> Outcome:
        """Carry the plan out (journaled, fenced, resumable and undoable through the executor)."""

    def discard(self, plan: Plan) -> None:
        """The plan will not be applied (dry run, refused, declined): drop what ``plan`` staged."""

    def nothing_to_do(self, plan: Plan) -> bool:
        return plan.empty

    def describe(self, plan: Plan, outcome: Outcome) -> str:
        """One line for people after applying."""
        return f"Applied {self.name} plan {plan.hash[:12]}."


@dataclass(frozen=True)
class RunOptions:
    """How to run an operation (the CLI's shared flags; the Dagster layer's run config)."""

    dry_run: bool = False
    yes: bool = False
    plan_hash: str | None = None
    force: bool = False
    progress: bool = False
    owner: str = "checkpoint-ops"
    storage_options: dict | None = None
    #: show the plan before confirming (the CLI prints it)
    show_plan: Callable[[Plan], None] | None = None
    #: ask a person (None: nobody to ask, e.g. no terminal)
    prompt: Callable[[str], bool] | None = None
    #: leases the caller holds already (the streaming runner holds its checkpoint's for the whole run)
    held: LeaseSet | None = None
    #: tell the user at once (a lease taken over from a dead holder), even if the operation then fails
    warn: Callable[[str], None] | None = None


@dataclass(frozen=True)
class OperationResult:
    """What ``run`` did: the plan, and the outcome unless it was a dry run or nothing to do."""

    operation: str
    plan: Plan
    dry_run: bool
    outcome: Any = None  # an Outcome when applied
    notes: tuple[str, ...] = ()  # warnings for the user (a lease taken over from a dead holder)

    @property
    def applied(self) -> bool:
        return self.outcome is not None

    def to_dict(self, with_plan: bool = True) -> dict:
        return {"operation": self.operation, "dry_run": self.dry_run,
                "plan": self.plan.to_dict() if with_plan else None,
                "result": self.outcome.to_dict() if self.outcome is not None else None,
                "notes": list(self.notes)}


def require_directory(site: Site) -> None:
    """``site`` is an existing directory. On an object store there is nothing to check: a lease under an
    empty prefix leaves no trace once released, and the plan says what is (not) there."""
    fm = site.fm
    if fm.strategy == "direct-put":
        return
    info = fm.info(site.root)
    if info is None:
        raise BadInputError("nothing at this location", path=site.url,
                            fix="check the path (and --storage-options for remote file systems)")
    if not info.is_dir:
        raise BadInputError("this is a file, not a directory", path=site.url,
                            fix="point at the directory itself (a checkpoint: the one holding offsets/ and "
                            "commits/; a sink: the one holding _spark_metadata/)")


def require_objects_under(fm: CheckpointFileManager, root: str, url: str) -> None:
    """On an object store, which has no directories to check (``require_directory``): something is under ``root``
    (one short listing), else ``root`` is a typo (a prefix, a bucket) or names an object, not a prefix."""
    if fm.any_under(root):
        return
    info = fm.info(root)
    if info is not None and not info.is_dir:
        raise BadInputError("this is an object, not a prefix", path=url,
                            fix="point at the prefix itself (a checkpoint: the one holding offsets/ and commits/; a "
                            "sink: the one holding _spark_metadata/)")
    raise BadInputError("nothing at this location (no object under this prefix, or no such bucket)", path=url,
                        fix="check the URL (and --storage-options: the endpoint and credentials)")


def check_plan_hash(plan: Plan, expected: str, where: str) -> None:
    if len(expected) < MIN_PLAN_HASH:
        raise BadInputError(f"--plan-hash {expected!r} is too short to name one plan",
                            fix=f"give at least {MIN_PLAN_HASH} characters of the hash --dry-run printed")
    if not plan.hash.startswith(expected.lower()):
        raise RefusedError(f"the plan changed since it was reviewed: it is now {plan.hash[:12]}, not {expected}",
                           path=where, fix="review the new plan with --dry-run")


def confirm(op: Operation, plan: Plan, options: RunOptions, where: str) -> None:
    """Go ahead only with ``yes``, the reviewed plan's hash, or a 'yes' from a person."""
    if options.plan_hash:
        check_plan_hash(plan, options.plan_hash, where)
        return  # the exact plan that was reviewed
    if options.yes or not op.confirm_required:
        return
    if options.prompt is None:
        raise RefusedError(f"not applying {op.name} plan {plan.hash[:12]} without confirmation", path=where,
                           fix="review it with --dry-run, then run again with --yes (or --plan-hash HASH)")
    if not options.prompt(f"Apply {op.name} plan {plan.hash[:12]}?"):
        raise RefusedError("not applied: declined at the prompt", path=where)


class StoppedBeforeChanges(KeyboardInterrupt):
    """An interrupt (Ctrl-C) that stopped an operation before its apply began: it changed nothing and journaled
    nothing, so there is nothing of it to resume or undo (an undo would revert the operation before it). For an
    undo or a resume (``recovery`` "acts on a journal"), the operation it acts on at ``where`` is as it was."""

    def __init__(self, operation: str, where: str | None = None, recovery: str = "journal"):
        super().__init__(operation)
        self.operation, self.where, self.recovery = operation, where, recovery


class StoppedPartWay(KeyboardInterrupt):
    """An interrupt (Ctrl-C) while an operation that journals nothing applied (a prune, a backup prune): running it
    again finishes it."""

    def __init__(self, operation: str):
        super().__init__(operation)
        self.operation = operation


class StoppedWhileApplying(KeyboardInterrupt):
    """An interrupt (Ctrl-C) while an operation applied its plan (``where``: its ``recovery_url``): it may have changed
    files; a journaled one is finished by ``resume`` or reverted by ``undo`` there."""

    def __init__(self, operation: str, where: str | None):
        super().__init__(operation)
        self.operation, self.where = operation, where


class InterruptedAfterPublishing(KeyboardInterrupt):
    """An interrupt (Ctrl-C) that came once backup ``backup_id`` was published (its manifest stored at ``dest_url``):
    the backup is complete, and nothing is to be run again (``backup/create.py``)."""

    def __init__(self, backup_id: str, dest_url: str):
        super().__init__(backup_id)
        self.backup_id, self.dest_url = backup_id, dest_url


class StoppedAfterApplying(KeyboardInterrupt):
    """An interrupt (Ctrl-C) that came once an operation had finished (``result``: what it did; a dry run changed
    nothing): while its leases were released or its output was shown, or (``result`` None) once its journal said
    applied, in the steps after (a restore's intent released). Nothing of it is left to resume; its leases are
    released first (``lease_left``: a second interrupt stopped the release, and a lease may be left)."""

    def __init__(self, operation: str, where: str | None, result: "OperationResult | None", lease_left: bool = False,
                 recovery: str = "journal", cut_short: bool = False):
        super().__init__(operation)
        self.operation, self.where, self.result, self.lease_left = operation, where, result, lease_left
        self.recovery, self.cut_short = recovery, cut_short  # ``Operation.recovery``; the output was cut short


def _release(leases: LeaseSet, warn: Callable[[str], None] | None = None) -> list[int]:
    """Release ``leases`` with a first interrupt held back until they are released (``warn`` told at once, so a
    slow release is not taken for a hang); returns the interrupts held."""

    def told() -> None:
        if warn is not None:
            warn("interrupted: releasing the lease(s) first (Ctrl-C again to stop at once, leaving them to go stale)")

    with interrupts_held(told) as caught:
        leases.release()
    return caught


def _journals_since(url: str | None, since: float, storage_options: dict | None) -> list[set[str]] | None:
    """The markers of each operation journaled at ``url`` at or after ``since`` (one whose op id tells no time
    counts, with no markers); None when that cannot be told (no location, or the store or path failed). One scan."""
    from .journal import op_id_time, ops_dir, scan_journals
    from .storage import open_file_manager

    if url is None:
        return None
    try:
        fm, root = open_file_manager(url, storage_options)
        journals = scan_journals(fm, ops_dir(fm, root))
    except Exception:  # noqa: BLE001 - the store or the path: the caller's cautious answer
        return None
    out = []
    for path, markers in journals.items():
        stamp = op_id_time(path.rstrip("/").rsplit("/", 1)[-1])
        if stamp is None:
            out.append(set())
        elif stamp >= since - 0.001:
            out.append(set(markers))
    return out


def _journaled_since(url: str | None, since: float, storage_options: dict | None) -> bool:
    """Whether an operation was journaled at ``url`` at or after ``since`` (when in doubt: True, so the advice
    stays resume or undo)."""
    found = _journals_since(url, since, storage_options)
    return found is None or bool(found)


def run(op: Operation, options: RunOptions = RunOptions()) -> OperationResult:
    """The one sequence (module docstring). The leases are released whatever happened; a release that
    fails (the store does not answer) never hides the error that stopped the operation, and never turns
    a completed one into a failure: it is a warning, and the lease left behind goes stale. An interrupt before
    the apply began is raised as ``StoppedBeforeChanges``; one during it as ``StoppedWhileApplying`` once the operation
    journaled (``StoppedBeforeChanges`` before that), or ``StoppedPartWay`` for one that journals nothing. One while the
    leases of a finished operation are released is held back until they are (``interrupts_held``), then raised as
    ``StoppedAfterApplying``, which carries the result."""
    leases = LeaseSet()
    applying: list[float] = []  # when the apply began (``_run``)
    try:
        try:
            result = _run(op, options, leases, applying)
        except KeyboardInterrupt as e:
            if isinstance(e, (StoppedBeforeChanges, StoppedWhileApplying, StoppedPartWay, StoppedAfterApplying)):
                raise
            if not applying:
                raise StoppedBeforeChanges(op.name, op.recovery_url(), op.recovery) from e
            if op.recovery == "again":
                raise StoppedPartWay(op.name) from e
            where = op.recovery_url()
            journaled = _journals_since(where, applying[0], options.storage_options) if op.recovery == "journal" \
                else None  # (when it cannot be told: the cautious answer, resume or undo)
            if journaled == []:
                raise StoppedBeforeChanges(op.name) from e  # before its journal: undo would revert the one before
            if journaled and any("applied" in markers for markers in journaled):
                # its journal says applied: stopped in what follows (a restore's intent released), not in a change
                raise StoppedAfterApplying(op.name, where, None, recovery=op.recovery, cut_short=True) from e
            raise StoppedWhileApplying(op.name, where) from e
    except BaseException:
        try:
            _release(leases, options.warn)  # the error that stopped the operation is still the one raised
        except BaseException as e:  # noqa: BLE001 - that error is the one to report, even after another Ctrl-C
            why = "another interrupt stopped its release" if isinstance(e, KeyboardInterrupt) else _why(e)
            if options.warn is not None:  # what to do is that error's fix, not this one's
                options.warn(f"its lease could not be released ({why}); {LEASE_LEFT_BEHIND}")
        raise
    try:
        held = _release(leases, options.warn)
    except KeyboardInterrupt as e:  # a second Ctrl-C stopped the release: done, with a lease perhaps left
        raise StoppedAfterApplying(op.name, op.recovery_url(), result, lease_left=True, recovery=op.recovery) from e
    except Exception as e:  # noqa: BLE001 - done and journaled: only the lease is left behind
        what = f"the {op.name}'s dry run (nothing was changed)" if options.dry_run else f"the {op.name}"
        note = f"{what} completed, but its lease could not be released ({_why(e)}); {LEASE_LEFT_BEHIND}"
        if options.warn is not None:
            options.warn(note)
        result = dataclasses.replace(result, notes=(*result.notes, note))
        held = []
    if held:  # the operation finished, and its leases are released: only the caller's output is left
        raise StoppedAfterApplying(op.name, op.recovery_url(), result, recovery=op.recovery)
    return result


def _run(op: Operation, options: RunOptions, leases: LeaseSet, applying: list[float]) -> OperationResult:
    """``run`` without the release (its caller releases ``leases``, whatever happens); ``applying`` gets the time
    the apply begins."""
    op.warn = options.warn
    op.precheck()
    if op.takes_lease:
        acquire_all([s.lease_target() for s in op.sites()], options.owner, options.held, into=leases,
                    operation=op.name, warn=options.warn)
    op.open()
    if op.takes_lease:
        acquire_all([s.lease_target() for s in op.more_sites()], options.owner, options.held, into=leases,
                    operation=op.name, warn=options.warn)
    notes = tuple(leases.notes)
    if options.warn is not None:
        for note in notes:
            options.warn(note)
    overridden = op.check_active(options.force) or []  # a dry run, too, says what applying would meet
    plan = op.plan(stage=not options.dry_run)
    plan.warnings[:0] = [w for w in overridden if w not in plan.warnings]  # shown, and in --json, as any warning
    where = op.sites()[0].url if op.sites() else None
    try:
        if options.dry_run or op.nothing_to_do(plan):
            op.discard(plan)
            return OperationResult(op.name, plan, options.dry_run, None, notes)
        if options.plan_hash:  # a plan that is not the one reviewed is refused before it is shown
            check_plan_hash(plan, options.plan_hash, where)
        if options.show_plan is not None:
            options.show_plan(plan)
        confirm(op, plan, options, where)
        ctx = ApplyContext(options.storage_options, options.progress, leases, options.held)
        ctx.guard()  # planning (or a prompt) may have outlasted the leases: nothing is written without them
    except BaseException:
        op.discard(plan)
        raise
    applying.append(time.time())  # a journal of it is stamped no earlier
    outcome = op.apply(plan, ctx)
    return OperationResult(op.name, plan, False, outcome, notes)
