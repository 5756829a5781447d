"""Checkpoint health: an fsck check on each streaming asset, and fsck findings after a failed run."""

from typing import Optional

import dagster as dg

from checkpoint_ops.check_pass import shared_fsck
from checkpoint_ops.collector import fewer_collections
from checkpoint_ops.errors import CheckpointOpsError, StoreUnavailableError
from checkpoint_ops.fsck import Finding
from checkpoint_ops.model.sink import SinkOutput
from checkpoint_ops.query_owner import not_started
from dagster_checkpoint_ops.query import StreamingQuery, job_name, pool_name
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource


CHECK = "checkpoint_health_check"
DESCRIPTION = "fsck: nothing in the checkpoint or its sinks that would stop a restart or lose data."


def fsck_metadata(query: StreamingQuery, files: CheckpointFileManagerResource,
                  findings: Optional[list[Finding]] = None) -> tuple[list, dict]:
    """fsck of a query's checkpoint and file sinks: (error findings, metadata). ``findings``: those a pass
    just made under the run's lease (nothing is read again), else fsck runs (``shared_fsck``)."""
    if findings is None:
        with fewer_collections():  # listings and models that hold no cycles (collector.py)
            ckpt = files.checkpoint(query.checkpoint)
            sinks = [files.sink(s) for s in query.sinks]
            findings = shared_fsck(ckpt, sinks)  # the materialization's pass, if nothing changed since
    errors = [f for f in findings if f.severity == "error"]
    return errors, {
        "errors": dg.MetadataValue.int(len(errors)),
        "warnings": dg.MetadataValue.int(len(findings) - len(errors)),
        "findings": dg.MetadataValue.json([f.to_dict() for f in findings]),
    }


def _keys(query: StreamingQuery) -> dict:
    return {"asset_key": query.name, "check_name": CHECK, "severity": dg.AssetCheckSeverity.ERROR}


def health_result(query: StreamingQuery, files: CheckpointFileManagerResource,
                  findings: Optional[list[Finding]] = None, *, runs_here: bool = False) -> dg.AssetCheckResult:
    """The health check's evaluation (``findings`` as in ``fsck_metadata``). A checkpoint fsck cannot read at
    all fails it with the tool's reason (the file, what is wrong, what to do). ``runs_here``: the asset runs the
    query and creates its checkpoint, so nothing at the checkpoint's location passes while the query has not run
    yet (a dry run, or a check-only run, of a new asset), and fails when it did run (``query_owner.not_started``).
    A query that runs elsewhere has a checkpoint wherever it is declared: nothing there fails."""
    keys = _keys(query)
    try:
        errors, md = fsck_metadata(query, files, findings)
    except StoreUnavailableError as e:  # not judged (no finding), and still blocking: consumers wait for a verdict
        return dg.AssetCheckResult(**keys, passed=False,
                                   description=f"not judged: the checkpoint's store did not answer ({e.problem}); "
                                   "judged again at the next evaluation",
                                   metadata={"judged": False, "problem": e.problem, "path": e.path or ""})
    except CheckpointOpsError as e:
        first = _before_first_run(query, files) if runs_here and findings is None else None
        if first is not None:
            return first
        return dg.AssetCheckResult(**keys, passed=False, description=f"fsck could not run: {e.render()}",
                                   metadata={"problem": e.problem, "path": e.path or "", "fix": e.fix or ""})
    return dg.AssetCheckResult(
        **keys, passed=not errors, metadata=md,
        description=f"{len(errors)} error(s): {errors[0].path}: {errors[0].problem}" if errors else "healthy")


def _before_first_run(query: StreamingQuery, files: CheckpointFileManagerResource) -> Optional[dg.AssetCheckResult]:
    """The check's result when nothing is at the checkpoint's location, else None (fsck's error stands)."""
    keys = _keys(query)
    try:
        fm, root = files.file_manager(query.checkpoint)
        sinks = [SinkOutput(*files.file_manager(url), data=False) for url in query.sinks]
        judged = not_started(fm, root, query.name, sinks)
    except CheckpointOpsError:
        return None
    if judged is None:
        return None
    if judged.problem is None:
        return dg.AssetCheckResult(
            **keys, passed=True, description=f"not run yet: nothing at {judged.checkpoint}; the first "
            "materialization creates the checkpoint", metadata={"checkpoint": dg.MetadataValue.text("not created yet")})
    return dg.AssetCheckResult(**keys, passed=False, description=f"{judged.checkpoint}: {judged.problem}. Fix: {judged.fix}",
                               metadata={"problem": judged.problem, "path": judged.path or "", "fix": judged.fix or ""})


def health_spec(query: StreamingQuery) -> dg.AssetCheckSpec:
    """The health check of a query these definitions run: evaluated inside its asset's step, on the
    materialization's own pass (``streaming.streaming_asset``); blocking."""
    return dg.AssetCheckSpec(CHECK, asset=query.name, blocking=True, description=DESCRIPTION)


def health_check(query: StreamingQuery) -> dg.AssetChecksDefinition:
    """The health check of a query that runs elsewhere: a step of its own, in the checkpoint's pool."""
    @dg.asset_check(asset=query.name, name=CHECK, blocking=True, pool=pool_name(query.name), description=DESCRIPTION)
    def _check(checkpoint_files: CheckpointFileManagerResource) -> dg.AssetCheckResult:
        return health_result(query, checkpoint_files)

    return _check


def queries_of_run(run: dg.DagsterRun, queries: list[StreamingQuery]) -> list[StreamingQuery]:
    """The streaming queries a run materialized: by its job (``<name>_job``), else by its asset
    selection (the UI's Materialize button launches the implicit asset job)."""
    by_job = {job_name(q.name): q for q in queries}
    if run.job_name in by_job:
        return [by_job[run.job_name]]
    if run.asset_selection is None:
        return list(queries) if run.job_name == "__ASSET_JOB" else []
    selected = {k.to_user_string() for k in run.asset_selection}
    return [q for q in queries if q.name in selected]


def failure_sensor(queries: list[StreamingQuery], name: str = "checkpoint_failure_sensor") -> dg.SensorDefinition:
    @dg.run_failure_sensor(name=name, default_status=dg.DefaultSensorStatus.RUNNING,
                           description="Records fsck findings of a failed streaming run's checkpoint on its asset.")
    def checkpoint_failure_sensor(context: dg.RunFailureSensorContext,
                                  checkpoint_files: CheckpointFileManagerResource) -> None:
        for query in queries_of_run(context.dagster_run, queries):
            record_findings(context, query, checkpoint_files)

    return checkpoint_failure_sensor


def record_findings(context: dg.RunFailureSensorContext, query: StreamingQuery,
                    checkpoint_files: CheckpointFileManagerResource) -> None:
    try:
        errors, md = fsck_metadata(query, checkpoint_files)
    except Exception as e:  # the checkpoint itself may be unusable: say so on the asset
        errors, md = [e], {"fsck": dg.MetadataValue.text(f"fsck could not run: {e}")}
    md["failed_run"] = dg.MetadataValue.dagster_run(context.dagster_run.run_id)
    found = ("not judged: its store did not answer" if len(errors) == 1 and isinstance(errors[0], StoreUnavailableError)
             else f"{len(errors)} fsck error(s)")
    context.instance.report_runless_asset_event(
        dg.AssetObservation(asset_key=query.name, metadata=md,
                            description=f"checkpoint after failed run {context.dagster_run.run_id}: {found}"))
