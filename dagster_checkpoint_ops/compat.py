"""The compat step of every streaming materialization: before the query starts, Spark judges it against
the checkpoint (``checkpoint_ops.compat``).

* **fails at restart**: the run fails with each reason, Spark's error class and the guide's rule; the
  query does not start and nothing changes;
* **silently different**, or **check by hand** (a plan change below a stateful operator checkpoint-ops cannot
  prove harmless): a warning in the run's log and the materialization's metadata; the run goes on. The
  changed query becomes the accepted one (what later runs are judged against) only once a batch commits with
  it: a run that commits nothing warns, and the next run warns again;
* nothing changed since Spark last accepted this query (same plan fingerprint, recorded beside the
  checkpoint): Spark is not restarted again, only the checks Spark does not make run (a few reads).

Run config ``skip_compat_check: true`` skips it, for the user who knows. The step reuses the run's Spark
session; the scratch copy goes to a local temporary directory. The query is built once: when Spark's restart
did not run on a copy, the run starts the writer the check judged (``CompatStep.writer``).
"""

import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import dagster as dg

from checkpoint_ops.compat import (CHECK, FAILS, SILENT, CompatReport, QueryBuildError, accept_at, build_writer,
                                   check_compat)
from checkpoint_ops.errors import CheckpointOpsError
from checkpoint_ops.model import Checkpoint
from checkpoint_ops.pairing import same_location
from checkpoint_ops.query_profile import SinkProfile


@dataclass(frozen=True)
class CompatStep:
    """What the compat step gives the run: metadata for the materialization, and the query's writer while it
    is still as ``query.build`` made it (Spark's restart did not run on a copy with it), for the run to start
    instead of building the query again. ``writer`` None: the run builds it."""

    metadata: dict
    writer: Optional[Any] = field(default=None, repr=False)
    sink: Optional[SinkProfile] = None  # the writer's sink as Spark was given it (None: not read, the check skipped)
    # a changed query warned about (silently different, check by hand): recorded as the accepted one only once a
    # batch committed with it (``accept_after_run``), so a run that processed nothing does not use up the warning
    pending: Optional[tuple] = field(default=None, repr=False)


@dataclass(frozen=True)
class RollbackTarget:
    """Where a planned rollback leaves the checkpoint: the batch, and the file sinks it rolls back with it."""

    batch: int
    sinks: tuple[str, ...] = ()
    plan_hash: Optional[str] = None  # the plan's: the one applied must be it


def check_before_run(context, query, config, spark, files, as_of: Optional[RollbackTarget] = None) -> CompatStep:
    """Judge ``query`` against its checkpoint before it runs (``as_of``: as the planned rollback, not yet applied,
    leaves it). Raises ``dg.Failure`` when Spark would refuse the restart (or the checkpoint cannot be judged)."""
    if getattr(config, "skip_compat_check", False):
        context.log.warning(f"{query.name}: compat check skipped (skip_compat_check): a changed query may fail at "
                            "restart or silently behave differently")
        return CompatStep({"compat": dg.MetadataValue.text("skipped (skip_compat_check)")})
    fm, root = files.file_manager(query.checkpoint)
    ahead = ListedAhead(fm, root)
    try:
        writer = build_writer(query.build, spark)
    except Exception as e:  # noqa: BLE001 - raised below, after the listing's own error (an interrupt: at once)
        built = e
    else:
        built = None
    ckpt = ahead.result()  # a listing that failed says so first, as before the build ran beside it
    try:
        if built is not None:
            raise built
        report = check_compat(ckpt, spark, query.build, storage_options=files.options(), reuse_judged=True,
                              writer=writer, as_of=as_of.batch if as_of is not None else None,
                              cut_sinks=as_of.sinks if as_of is not None else ())
    except QueryBuildError as e:  # the user's code, before anything ran
        raise dg.Failure(description=f"{query.name}: build(spark) failed before the query started (nothing ran, "
                         f"nothing changed): {e.render()}\n{e.trace}",
                         metadata={"problem": e.problem, "fix": e.fix or "", "traceback": e.trace}) from None
    except CheckpointOpsError as e:
        raise dg.Failure(description=f"compat check of {query.name} could not judge the checkpoint: {e.render()}",
                         metadata={"problem": e.problem, "path": e.path or "", "fix": e.fix or ""}) from None
    md = report_metadata(report)
    fails = report.of(FAILS)
    if fails:
        if as_of is not None:  # judged before the rollback: it was not applied
            fixes = "; ".join(d.fix for d in fails if d.fix)
            raise dg.Failure(description=f"{query.name} would not restart from its checkpoint rolled back to batch "
                             f"{as_of.batch}: " + "; ".join(_reason(d) for d in fails) + " The rollback was not "
                             "applied: nothing ran, nothing changed. "
                             + (f"Fix: {fixes}, then materialize again with the same run config." if fixes else
                                "Fix: change the query so that Spark accepts the state at that batch (or roll back "
                                "to another batch), then materialize again."), metadata=md)
        raise dg.Failure(description=f"{query.name} would not restart from its checkpoint: "
                         + "; ".join(_reason(d) for d in fails) + _way_out(query, report, fails), metadata=md)
    for d in report.of(SILENT):
        context.log.warning(f"{query.name}: silently different after the restart: {_reason(d)}")
    for d in report.of(CHECK):
        context.log.warning(f"{query.name}: check this change by hand: {_reason(d)}")
    # where to record it, not the judged model: the run must not hold its listing (every retained file) meanwhile
    # and a query at a new checkpoint: a run refused before it started (an output left without its checkpoint)
    # recorded it with nothing run, and later runs took that record for Spark's acceptance (no restart judged)
    # judged as of a rollback's target, before it is applied: recorded once a batch commits after it (a rollback
    # that then fails leaves the checkpoint where the record would not be of its query)
    pending = (fm, root, report) if report.of(SILENT) or report.of(CHECK) or report.batch is None \
        or as_of is not None else None
    if pending is None:
        _accept(context, query, fm, root, report)
    # a judged writer was changed (noop sink); its sink is read before the judge, as built
    return CompatStep(md, writer if report.judge is None else None,
                      report.query.sink if report.query is not None else None, pending)


class ListedAhead:
    """The checkpoint's model, made on a thread while the user's ``build(spark)`` runs (which mostly waits on the
    JVM): its listing and what the compat check derives from it first (its kind, the offsets and commits logs), the
    same requests it would make after the build, and no others. ``result()`` waits for it; a listing that failed
    raises there, in the caller's thread, the error it met (the store is not asked again)."""

    def __init__(self, fm, root: str):
        self._fm, self._root = fm, root
        self._model: Optional[Checkpoint] = None
        self._error: Optional[Exception] = None
        self._thread = threading.Thread(target=self._make, name=f"list {root}", daemon=True)
        self._thread.start()

    def _make(self) -> None:
        try:
            ckpt = Checkpoint(self._fm, self._root)
        except Exception as e:  # noqa: BLE001 - raised by result(), in the caller's thread
            self._error = e
            return
        self._model = ckpt
        try:
            ckpt.kind, ckpt.offset_files, ckpt.commit_files  # from the listing: no request
        except Exception:  # noqa: BLE001 - not kept: asked again by the check, which raises it where it did before
            pass

    def result(self) -> Checkpoint:
        self._thread.join()
        if self._error is not None:
            raise self._error
        # the thread ended without either (no Exception: it cannot happen in a listing): made here
        return self._model if self._model is not None else Checkpoint(self._fm, self._root)


def accept_after_run(context, query, step: CompatStep, last_committed: Optional[int]) -> None:
    """Record a changed query the compat step warned about (or a query at a new checkpoint) as the accepted one
    once it committed a batch (also when the run failed after it). A run that committed nothing (no new input, or
    refused before the query started) leaves the old record: the next run judges against it again, and warns
    again, until a batch runs with the change."""
    if step.pending is None:
        return
    fm, root, report = step.pending
    before = report.batch if report.batch is not None else -1
    if last_committed is not None and last_committed > before:
        _accept(context, query, fm, root, report)
    else:
        then = ("it is recorded once a batch commits" if report.batch is None else
                "the next run judges it again")
        what = "the query committed no batch on its new checkpoint" if report.batch is None else \
            "the changed query committed no batch"
        context.log.info(f"{query.name}: {what} in this run: it is not recorded as accepted ({then})")


def _accept(context, query, fm, root: str, report: CompatReport) -> None:
    try:
        accept_at(fm, root, report)
    except CheckpointOpsError as e:  # no place beside the checkpoint (a bucket root): the next run judges again
        context.log.warning(f"{query.name}: query profile not recorded: {e.render()}")


def report_metadata(report: CompatReport) -> dict:
    fails, silent, check = report.of(FAILS), report.of(SILENT), report.of(CHECK)
    verdict = ("compatible" if report.compatible else "fails at restart" if fails else
               f"silently different ({len(silent)})" if silent else f"check by hand ({len(check)})")
    md = {
        "compat": dg.MetadataValue.text(verdict),
        "compat_differences": dg.MetadataValue.json([d.to_dict() for d in report.differences]),
        "compat_spark_restart": dg.MetadataValue.text(
            "not needed (unchanged)" if report.spark_restarts is None and report.batch is not None
            else "not needed (new checkpoint)" if report.batch is None
            else f"restarted batch {report.judge.batch} ({report.judge.seconds:.1f} s)" if report.spark_restarts
            else f"refused: {report.judge.error_class or report.judge.exception}"),
    }
    if report.batch is not None:  # the committed batch it was judged at (a rollback's target, before it applied)
        md["compat_batch"] = dg.MetadataValue.int(report.batch)
    error_classes = sorted({d.error_class for d in fails if d.error_class})
    if error_classes:
        md["compat_error_classes"] = dg.MetadataValue.text(", ".join(error_classes))
    if report.notes:
        md["compat_notes"] = dg.MetadataValue.json(list(report.notes))
    return md


def _way_out(query, report: CompatReport, fails) -> str:
    """What the run's failure offers: a rollback materialization where one resolves every refusal and covers the
    sink (a sink the asset does not declare is not rolled back with it); else skipping the check, unless a refusal
    is one no query change causes (skipping it fails the same way in Spark)."""
    targets = {d.rollback_to for d in fails}
    sink = report.query.sink if report.query is not None else None
    declared = sink is not None and sink.path and any(same_location(s, sink.path) for s in query.sinks)
    if len(targets) == 1 and None not in targets:
        if declared:
            return (f" (materialize with run config rollback_to_batch: {targets.pop()} to roll the checkpoint and its "
                    "file sinks back and run the query)")
        return (f" (declare the query's file sink ({sink.path if sink is not None else 'its output directory'}) in "
                f"the asset's sinks, so a rollback covers it, then materialize with run config rollback_to_batch: "
                f"{targets.pop()})")
    if any(d.fix for d in fails):
        return ""  # the reasons name the fix; skipping the check would fail the same way
    if any(d.found_by == "spark" for d in fails):  # skipping the check runs into the same refusal, in Spark itself
        return (" Spark itself refused this restart on a copy of the checkpoint, so skipping the check would only run "
                "into the same error. Fix: change the query back to what the state was written with, or run the new "
                "query on a new checkpoint (and a new output directory).")
    return " (run config skip_compat_check: true runs it anyway)"


def _reason(d) -> str:
    cls = f" [{d.error_class}]" if d.error_class else ""
    change = f" ({d.was} -> {d.now})" if d.was is not None and d.was != d.now else \
        f" ({d.now})" if d.now is not None else ""
    return f"{d.aspect}{cls}{change}: {_sentence(d.effect)} Rule: {_sentence(d.rule)}"


def _sentence(text: str) -> str:
    text = text.rstrip()
    return text if text.endswith(".") else text + "."
