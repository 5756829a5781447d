"""Restore drills on a schedule: does each query's newest backup really restart?

``checkpoint_restore_drill_job`` has one op per query: it restores the query's newest backup into scratch
space, lets Spark restart the query there against a ``noop`` sink (``checkpoint_ops.drill``), and reports
the result, the recovery point (age of the newest backup that passed a drill) and the recovery time
(restore plus restart) as an observation of the asset and as the evaluation of its ``restore_drill_check``.
Run by ``checkpoint_restore_drill_schedule``. Executed on its own (or in a materialization's step), the check
reports the newest drill recorded in the backup destination, without drilling again.
"""

import calendar
import os
import time

import dagster as dg

from checkpoint_ops.backup import Repository
from checkpoint_ops.drill import DrillResult, drill_records, recovery_point, run_drill
from checkpoint_ops.errors import BadInputError, CheckpointOpsError, StoreUnavailableError
from dagster_checkpoint_ops.backups import unreadable_destination
from dagster_checkpoint_ops.query import StreamingQuery, pool_name
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource
from dagster_checkpoint_ops.resources.settings import StreamingSettings
from dagster_checkpoint_ops.resources.spark import SparkResource

CHECK = "restore_drill_check"


def drill_metadata(result: DrillResult) -> dict:
    md = {
        "drill_backup_id": dg.MetadataValue.text(result.backup_id),
        "drill_batch": dg.MetadataValue.int(result.batch if result.batch is not None else -1),
        "drill_passed": dg.MetadataValue.bool(result.passed),
        "drill_stage": dg.MetadataValue.text(result.stage),
        "recovery_time_s": dg.MetadataValue.float(round(result.recovery_time_s, 3)),
        "restore_s": dg.MetadataValue.float(round(result.restore_s, 3)),
        "restart_s": dg.MetadataValue.float(round(result.restart_s, 3)),
        "recovery_point_backup": dg.MetadataValue.text(result.recovery_point_backup or "none"),
        "recovery_point_s": dg.MetadataValue.float(round(result.recovery_point_s, 1)
                                                   if result.recovery_point_s is not None else -1.0),
        "backup_destination": dg.MetadataValue.text(result.destination),
    }
    if not result.passed:
        md["drill_cause"] = dg.MetadataValue.text(result.cause or "")
        md["drill_cause_files"] = dg.MetadataValue.json(list(result.cause_files))
    return md


def drill_query(context: dg.OpExecutionContext, query: StreamingQuery, spark, settings: StreamingSettings,
                files: CheckpointFileManagerResource) -> DrillResult | None:
    """Drill the query's newest backup; log the observation and the check's evaluation. A failed drill fails
    the op (after both are logged)."""
    dest = settings.backup_dest_of(query)
    opts = files.options()
    try:
        repo = Repository.open(dest, opts)
    except StoreUnavailableError as e:  # not "no backups": the drill did not run
        raise dg.Failure(description=f"restore drill of {query.name} could not run: {e.render()}") from None
    except BadInputError as e:
        context.log.warning(f"{query.name}: no backups to drill at {dest}: {e.problem}")
        context.log_event(dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey(query.name), check_name=CHECK, passed=False, severity=dg.AssetCheckSeverity.WARN,
            description=f"no backup to drill: {e.problem}",
            metadata={"backup_destination": dg.MetadataValue.text(dest)}))
        return None
    scratch = os.path.join(settings.home, "scratch")
    try:
        result = run_drill(repo, None, spark, query.build, scratch_url=scratch, storage_options=opts,
                           warn=context.log.warning)
    except CheckpointOpsError as e:
        raise dg.Failure(description=f"restore drill of {query.name} stopped: {e.render()}") from None
    md = drill_metadata(result)
    context.log_event(dg.AssetObservation(asset_key=query.name, metadata=md))
    context.log_event(dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(query.name), check_name=CHECK, passed=result.passed,
        severity=dg.AssetCheckSeverity.ERROR, description=_describe(result), metadata=md))
    if not result.passed:
        raise dg.Failure(description=f"restore drill of {query.name}: {_describe(result)}", metadata=md)
    return result


def _describe(result: DrillResult) -> str:
    if result.passed:
        return (f"backup {result.backup_id} (batch {result.batch}) restored and restarted in "
                f"{result.recovery_time_s:.1f} s")
    files = f" ({', '.join(result.cause_files)})" if result.cause_files else ""
    return f"backup {result.backup_id} failed at {result.stage}: {result.cause}{files}"


def drill_op(query: StreamingQuery) -> dg.OpDefinition:
    # In the checkpoint's pool: the backup job's prune must not delete the objects of the backup being drilled.
    @dg.op(name=f"drill_{query.name}", pool=pool_name(query.name), description=f"Restore {query.name}'s newest "
           "backup into scratch space and let Spark restart the query on it (noop sink).")
    def _op(context: dg.OpExecutionContext, spark: SparkResource, streaming_settings: StreamingSettings,
            checkpoint_files: CheckpointFileManagerResource) -> None:
        drill_query(context, query, spark.spark_session, streaming_settings, checkpoint_files)

    return _op


def drill_job(queries: list[StreamingQuery], name: str = "checkpoint_restore_drill_job") -> dg.JobDefinition:
    ops = [drill_op(q) for q in queries]

    @dg.job(name=name,
            description="Restore every query's newest backup into scratch space and restart it there (noop sink): "
            "recovery point and recovery time.")
    def _job():
        for op in ops:
            op()

    return _job


def drill_schedule(job: dg.JobDefinition, cron: str, name: str = "checkpoint_restore_drill_schedule") -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(name=name, job=job, cron_schedule=cron,
                                 execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.RUNNING,
                                 description="Drill every query's newest backup (restore and restart) on a schedule.")


DESCRIPTION = ("The newest restore drill of the query's backups passed (restore, then Spark restarts the query on "
               "it); checkpoint_restore_drill_job runs the drills.")


def drill_spec(query: StreamingQuery) -> dg.AssetCheckSpec:
    """The drill check: evaluated by ``checkpoint_restore_drill_job`` (``drill_query``) and, reporting the
    newest recorded drill (``drill_result``), inside each materialization's step."""
    return dg.AssetCheckSpec(CHECK, asset=query.name, description=DESCRIPTION)


def drill_result(query: StreamingQuery, streaming_settings: StreamingSettings,
                 checkpoint_files: CheckpointFileManagerResource) -> dg.AssetCheckResult:
    """The newest drill recorded in the query's backup destination, without drilling again."""
    dest = streaming_settings.backup_dest_of(query)
    keys = {"asset_key": query.name, "check_name": CHECK}
    try:
        repo = Repository.open(dest, checkpoint_files.options())
        records = drill_records(repo)
        point, age = recovery_point(repo)
    except StoreUnavailableError as e:
        return dg.AssetCheckResult(**keys, passed=False, severity=dg.AssetCheckSeverity.WARN,
                                   description=unreadable_destination(e),
                                   metadata={"backup_destination": dg.MetadataValue.text(dest)})
    except BadInputError as e:
        return dg.AssetCheckResult(**keys, passed=False, severity=dg.AssetCheckSeverity.WARN,
                                   description=f"no backup yet: {e.problem}",
                                   metadata={"backup_destination": dg.MetadataValue.text(dest)})
    if not records:
        return dg.AssetCheckResult(**keys, passed=False, severity=dg.AssetCheckSeverity.WARN,
                                   description="no restore drill yet (checkpoint_restore_drill_job runs them)",
                                   metadata={"backup_destination": dg.MetadataValue.text(dest)})
    backup_id, record = max(records.items(), key=lambda item: item[1].get("drilled_at", ""))
    drilled = calendar.timegm(time.strptime(record["drilled_at"], "%Y-%m-%dT%H:%M:%SZ"))
    return dg.AssetCheckResult(
        **keys, passed=bool(record.get("passed")), severity=dg.AssetCheckSeverity.ERROR,
        description=(f"newest drill ({backup_id}, {int(time.time() - drilled)} s ago) "
                     + ("passed" if record.get("passed") else f"failed at {record.get('stage')}: "
                        f"{record.get('cause')}")),
        metadata={"drill_backup_id": dg.MetadataValue.text(backup_id),
                  "drill_passed": dg.MetadataValue.bool(bool(record.get("passed"))),
                  "recovery_time_s": dg.MetadataValue.float(
                      float(record.get("restore_s", 0)) + float(record.get("restart_s", 0))),
                  "recovery_point_backup": dg.MetadataValue.text(point or "none"),
                  "recovery_point_s": dg.MetadataValue.float(round(age, 1) if age is not None else -1.0),
                  "backup_destination": dg.MetadataValue.text(dest)})
