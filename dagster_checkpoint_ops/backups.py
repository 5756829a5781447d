"""Scheduled checkpoint backups: a backup op per query (in its checkpoint's pool), and how fresh they are."""

import calendar
import time

import dagster as dg

from checkpoint_ops.backup import Repository, create_backup, list_backups, verify_backups
from checkpoint_ops.backup.retention import BackupPruneOperation
from checkpoint_ops.backup.listing import VERIFIED
from checkpoint_ops.backup.repository import TIME_FORMAT
from checkpoint_ops.errors import BadInputError, CheckpointOpsError, StoreUnavailableError
from checkpoint_ops.operation import RunOptions, run
from checkpoint_ops.units import parse_duration
from dagster_checkpoint_ops.maintenance import maintenance_job, query_op
from dagster_checkpoint_ops.query import StreamingQuery
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource
from dagster_checkpoint_ops.resources.settings import StreamingSettings


def backup_query(context, query: StreamingQuery, settings: StreamingSettings,
                 files: CheckpointFileManagerResource) -> dict:
    """Back up one query (checkpoint, file sinks, ledger), verify the backup, prune old ones."""
    opts = files.options()
    fm, root = files.file_manager(query.checkpoint)
    if not fm.walk(root):
        context.log.info(f"{query.name}: no checkpoint yet at {query.checkpoint}: nothing to back up")
        return {}
    dest = settings.backup_dest_of(query)
    sinks = [s for s in query.sinks if _has_log(files, s)]  # a sink that never wrote a batch has no log yet
    try:
        r = create_backup(query.checkpoint, dest, sinks, opts, warn=context.log.warning)
        repo = Repository.open(dest, opts)
        v = verify_backups(repo, r["backup_id"])
        pruned = run(BackupPruneOperation(dest, keep_last=settings.backup_keep_last, storage_options=opts),
                     RunOptions(yes=True, storage_options=opts, owner=f"dagster run {context.run.run_id} (backup of "
                                f"{query.name})"))
    except CheckpointOpsError as e:
        raise dg.Failure(description=f"backup of {query.name} failed: {e.render()}") from None
    md = {
        "backup_id": dg.MetadataValue.text(r["backup_id"]),
        "backup_batch": dg.MetadataValue.int(r["batch"] if r["batch"] is not None else -1),
        "backup_files": dg.MetadataValue.int(r["files"]),
        "backup_bytes": dg.MetadataValue.int(r["bytes"]),
        "backup_new_bytes": dg.MetadataValue.int(r["new_bytes"]),
        # objects found part-written (a backup that died before its manifest) and replaced: 0 unless one did
        "backup_repaired_objects": dg.MetadataValue.int(r["repaired_objects"]),
        "backup_verified": dg.MetadataValue.bool(v["ok"]),
        "backups_pruned": dg.MetadataValue.int(pruned.outcome.manifests_deleted if pruned.applied else 0),
        "backup_destination": dg.MetadataValue.text(dest),
        "backup_retries": dg.MetadataValue.json(r["retries"]),  # per store, by kind: how flaky it was
    }
    context.log_event(dg.AssetObservation(asset_key=query.name, metadata=md))
    if not v["ok"]:
        raise dg.Failure(description=f"backup {r['backup_id']} of {query.name} failed verification: "
                         f"{v['bad_objects'][:3]}", metadata=md)
    return r


def _has_log(files: CheckpointFileManagerResource, url: str) -> bool:
    fm, root = files.file_manager(url)
    return bool(fm.list(f"{root}/_spark_metadata"))


def backup_job(queries: list[StreamingQuery], name: str = "checkpoint_backup_job") -> dg.JobDefinition:
    ops = [query_op(q, "backup", f"Back up {q.name}'s checkpoint, sinks and ledger; verify it; prune old backups.",
                    backup_query) for q in queries]
    return maintenance_job(name,
                           "Back up every streaming query's checkpoint (each in its checkpoint's pool).", ops)


FRESHNESS_CHECK = "backup_freshness_check"
FRESHNESS_DESCRIPTION = "The query's newest verified backup is younger than backup_max_age."


def unreadable_destination(e: StoreUnavailableError) -> str:
    """A check's description when the backup destination's store kept failing: not "no backup yet"."""
    return f"the backup destination could not be read ({e.problem}); judged again at the next evaluation"


def freshness_result(query: StreamingQuery, streaming_settings: StreamingSettings,
                     checkpoint_files: CheckpointFileManagerResource) -> dg.AssetCheckResult:
    """The freshness check's evaluation: the age of the newest verified backup in the query's destination."""
    dest = streaming_settings.backup_dest_of(query)
    limit = parse_duration(streaming_settings.backup_max_age, "backup_max_age")
    keys = {"asset_key": query.name, "check_name": FRESHNESS_CHECK}
    try:
        rows = list_backups(Repository.open(dest, checkpoint_files.options()))
    except StoreUnavailableError as e:
        return dg.AssetCheckResult(**keys, passed=False, severity=dg.AssetCheckSeverity.WARN,
                                   description=unreadable_destination(e),
                                   metadata={"destination": dg.MetadataValue.text(dest)})
    except BadInputError as e:
        return dg.AssetCheckResult(**keys, passed=False, severity=dg.AssetCheckSeverity.WARN,
                                   description=f"no backup yet: {e.problem}",
                                   metadata={"destination": dg.MetadataValue.text(dest)})
    good = [r for r in rows if r.status == VERIFIED]
    if not good:
        return dg.AssetCheckResult(**keys, passed=False, severity=dg.AssetCheckSeverity.WARN,
                                   description=f"{len(rows)} backup(s), none verified",
                                   metadata={"destination": dg.MetadataValue.text(dest)})
    newest = good[-1]
    age = time.time() - calendar.timegm(time.strptime(newest.created, TIME_FORMAT))
    return dg.AssetCheckResult(
        **keys, passed=age <= limit, severity=dg.AssetCheckSeverity.WARN,
        description=f"newest verified backup {newest.id} (batch {newest.batch}) is {int(age)} s old "
        f"(limit {streaming_settings.backup_max_age})",
        metadata={"newest_backup": dg.MetadataValue.text(newest.id), "age_s": dg.MetadataValue.int(int(age)),
                  "batch": dg.MetadataValue.int(newest.batch if newest.batch is not None else -1),
                  "destination": dg.MetadataValue.text(dest)})


def freshness_spec(query: StreamingQuery) -> dg.AssetCheckSpec:
    """The freshness check of a query these definitions run: evaluated inside its asset's step."""
    return dg.AssetCheckSpec(FRESHNESS_CHECK, asset=query.name, description=FRESHNESS_DESCRIPTION)


def freshness_check(query: StreamingQuery) -> dg.AssetChecksDefinition:
    """The freshness check of a query that runs elsewhere: a step of its own."""
    @dg.asset_check(asset=query.name, name=FRESHNESS_CHECK, description=FRESHNESS_DESCRIPTION)
    def _check(streaming_settings: StreamingSettings,
               checkpoint_files: CheckpointFileManagerResource) -> dg.AssetCheckResult:
        return freshness_result(query, streaming_settings, checkpoint_files)

    return _check
