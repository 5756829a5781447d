"""Operations on a checkpoint from the launchpad: undo the newest operation, restore a backup into an empty
target, and roll back a query that runs elsewhere. Each goes through the operation runner
(``checkpoint_ops.operation.run``: lease, refuse if active, plan, journal, fence, apply), inside
``parameter_names`` so a refusal names run-config keys, and records what it did as metadata the way the
streaming asset's rollback does (plan hash, plan table, counts, operation id)."""

from typing import Optional

import dagster as dg
from pydantic import Field

from checkpoint_ops.backup.restore import RestoreOperation
from checkpoint_ops.errors import CheckpointOpsError, parameter_names
from checkpoint_ops.operation import OperationResult, RunOptions, run
from checkpoint_ops.recovery import UndoOperation
from dagster_checkpoint_ops.query import StreamingQuery, pool_name, rollback_job_name
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource
from dagster_checkpoint_ops.resources.settings import StreamingSettings
from dagster_checkpoint_ops.runner import failure, plan_markdown, refuse_checkpoint_of_another_query, rollback

UNDO_JOB = "checkpoint_undo_job"
RESTORE_JOB = "checkpoint_restore_job"

# How the library's messages name parameters in these jobs' run config.
UNDO_NAMES = {"dry_run": "dry_run", "force": None, "checkpoint": "query", "op": "op_id"}
RESTORE_NAMES = {"dry_run": "dry_run", "force": None, "checkpoint": "target", "to_batch": "to_batch",
                 "relocate": "relocations", "sink_target": "sink_targets"}


class UndoConfig(dg.Config):
    """Revert the newest operation on a query's checkpoint (and its sinks), byte for byte."""

    query: str = Field(description="The streaming query (asset name) whose checkpoint's newest operation to undo.")
    dry_run: bool = Field(default=False, description="Only record the undo plan as metadata: nothing changes.")
    op_id: Optional[str] = Field(default=None, description="Undo this operation (its op_id metadata), and only if it "
                                 "is still the newest when the run holds the lease; default: the newest when the run "
                                 "starts.")


class RestoreConfig(dg.Config):
    """Restore one of a query's backups into an empty target (never over a live checkpoint)."""

    query: str = Field(description="The streaming query (asset name) whose backups to restore from.")
    backup_id: str = Field(description="The backup to restore (see the backup job's backup_id metadata, or "
                           "`checkpoint-ops backup list DEST`).")
    target: str = Field(description="An empty directory (or prefix) for the restored checkpoint.")
    sink_targets: list[str] = Field(default=[], description="An empty directory for each of the backup's file "
                                    "sinks, in the query's sink order.")
    relocations: list[str] = Field(default=[], description="More locations to map, each OLD=NEW (e.g. a file "
                                   "source's input directory).")
    to_batch: Optional[int] = Field(default=None, description="Restore as of this batch instead of the backup's "
                                    "last one.")
    dry_run: bool = Field(default=False, description="Only record the restore plan as metadata: nothing is written.")


class ExternalRollbackConfig(dg.Config):
    """Roll back a query that runs elsewhere; stop it first (it holds its checkpoint's lease while active)."""

    rollback_to_batch: Optional[int] = Field(default=None, description="The committed batch to keep as the last.")
    rollback_to_time: Optional[str] = Field(default=None, description="Or: the last batch planned at or before this "
                                            "ISO 8601 time (UTC when it has no offset).")
    dry_run: bool = Field(default=False, description="Only record the rollback plan as metadata: nothing changes.")


def _query(queries: list[StreamingQuery], name: str) -> StreamingQuery:
    by_name = {q.name: q for q in queries}
    if name not in by_name:
        raise dg.Failure(description=f"query {name!r} is not one of these definitions' queries: {sorted(by_name)}",
                         metadata={"fix": "set query to one of them"})
    return by_name[name]


def operation_metadata(result: OperationResult) -> dict:
    """The plan and what was applied, named as the streaming asset's rollback names them."""
    plan = result.plan
    md = {"plan_hash": dg.MetadataValue.text(plan.hash), "plan": dg.MetadataValue.md(plan_markdown(plan)),
          "counts": dg.MetadataValue.json(plan.counts()), "warnings": dg.MetadataValue.json(plan.warnings),
          "dry_run": dg.MetadataValue.bool(not result.applied)}
    if result.applied:
        md["op_id"] = dg.MetadataValue.text(result.outcome.op_id)
    return md


def undo_job(queries: list[StreamingQuery], name: str = UNDO_JOB) -> dg.JobDefinition:
    @dg.op(name=name.removesuffix("_job"), description="Undo the newest operation on a query's checkpoint (journaled).")
    def checkpoint_undo(context: dg.OpExecutionContext, config: UndoConfig,
                        checkpoint_files: CheckpointFileManagerResource) -> None:
        query = _query(queries, config.query)
        refuse_checkpoint_of_another_query(context, query, checkpoint_files, job="undo")
        opts = checkpoint_files.options()
        with parameter_names(UNDO_NAMES):
            undo = UndoOperation(query.checkpoint, opts, op_id=config.op_id)
            try:
                result = run(undo, RunOptions(dry_run=config.dry_run, yes=True, storage_options=opts,
                                        owner=f"dagster run {context.run.run_id} (undo {query.name})",
                                        warn=context.log.warning))
            except CheckpointOpsError as e:
                raise failure(e, "undo refused") from None
        md = {**operation_metadata(result), "checkpoint": dg.MetadataValue.path(query.checkpoint)}
        # an undo is no operation of its own: the op_id is the operation it reverts (or would), named as such
        md.pop("op_id", None)
        if undo.journal is not None:
            md["undone_op_id"] = dg.MetadataValue.text(undo.journal.op_id)
        context.log_event(dg.AssetObservation(asset_key=query.name, metadata=md,
                                              description="undo " + ("planned" if config.dry_run else "applied")))

    @dg.job(name=name, description="Undo the newest checkpoint-ops operation on a query's checkpoint and "
            "sinks (launchpad: query, dry_run); refused while the query runs.")
    def _job():
        checkpoint_undo()

    return _job


def restore_job(queries: list[StreamingQuery], name: str = RESTORE_JOB) -> dg.JobDefinition:
    @dg.op(name=name.removesuffix("_job"), description="Restore a backup of a query into an empty target.")
    def checkpoint_restore(context: dg.OpExecutionContext, config: RestoreConfig, streaming_settings: StreamingSettings,
                           checkpoint_files: CheckpointFileManagerResource) -> None:
        query = _query(queries, config.query)
        opts = checkpoint_files.options()
        dest = streaming_settings.backup_dest_of(query)
        with parameter_names(RESTORE_NAMES):
            try:
                op = RestoreOperation(dest, config.backup_id, config.target, config.sink_targets, config.relocations,
                                      config.to_batch, opts)
                result = run(op, RunOptions(dry_run=config.dry_run, yes=True, storage_options=opts,
                                            owner=f"dagster run {context.run.run_id} (restore {query.name})",
                                            warn=context.log.warning))
            except CheckpointOpsError as e:
                raise failure(e, "restore refused") from None
        md = {**operation_metadata(result), "backup_id": dg.MetadataValue.text(config.backup_id),
              "backup_destination": dg.MetadataValue.text(dest), "restored_to": dg.MetadataValue.path(config.target)}
        if config.sink_targets:
            md["sink_targets"] = dg.MetadataValue.json(list(config.sink_targets))
        context.log_event(dg.AssetObservation(asset_key=query.name, metadata=md, description=(
            f"backup {config.backup_id} " + ("restore planned" if config.dry_run else f"restored into {config.target}"))))

    @dg.job(name=name, description="Restore one of a query's backups into an empty target (launchpad: query, "
            "backup_id, target, sink_targets, relocations, to_batch, dry_run).")
    def _job():
        checkpoint_restore()

    return _job


def external_rollback_job(query: StreamingQuery) -> dg.JobDefinition:
    """The rollback of a query that runs elsewhere: refused (naming the holder) while the query holds its
    checkpoint's lease (``checkpoint_ops.spark.hold_lease_while_active``)."""

    @dg.op(name=f"rollback_{query.name}", pool=pool_name(query.name),
           description=f"Roll {query.name}'s checkpoint and file sinks back (journaled, undoable); stop the query "
           "first.")
    def _op(context: dg.OpExecutionContext, config: ExternalRollbackConfig,
            checkpoint_files: CheckpointFileManagerResource) -> None:
        if config.rollback_to_batch is None and not config.rollback_to_time:
            raise dg.Failure(description="rollback refused: give rollback_to_batch or rollback_to_time")
        refuse_checkpoint_of_another_query(context, query, checkpoint_files, job="rollback")
        md = rollback(context, query, config, checkpoint_files, None)
        if config.dry_run:
            md["dry_run"] = dg.MetadataValue.bool(True)
        elif "rollback_op_id" in md:
            md["undo"] = dg.MetadataValue.text(f"launch {UNDO_JOB} with query: {query.name} before the query runs "
                                               "again")
        context.log_event(dg.AssetObservation(asset_key=query.name, metadata=md))

    @dg.job(name=rollback_job_name(query.name), tags={"checkpoint/query": query.name},
            description=f"Roll back {query.name} (it runs elsewhere: stop it first; launchpad: rollback_to_batch or "
            "rollback_to_time, dry_run).")
    def _job():
        _op()

    return _job
