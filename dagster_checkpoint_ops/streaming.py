"""Any streaming query as a Dagster asset, with its checkpoint's backups, sink compaction, health checks and
reprocessing, from one call.

.. code-block:: python

    from dagster_checkpoint_ops import StreamingQuery, streaming_definitions

    def build(spark):
        return spark.readStream.schema(SCHEMA).json("/data/in").writeStream.format("parquet").option(
            "path", "/data/out")

    q = StreamingQuery(name="events_stream", build=build, checkpoint="/data/ckpt", sinks=["/data/out"])
    defs = streaming_definitions([q])

``build(spark)`` returns the query's unstarted ``DataStreamWriter`` (file sink, ``foreachBatch``, anything);
the asset sets the checkpoint location and ``Trigger.AvailableNow``, runs it under the checkpoint's lease,
syncs the batch ledger and reports what happened. Run config ``rollback_to_batch`` / ``rollback_to_time``
rolls the checkpoint and its file sinks back first (journaled, undoable), so one materialization reprocesses
from any batch in reach; ``dry_run`` only records the plan, as an observation (no materialization).
"""

import os
import re
import warnings
from typing import Optional, Sequence

import dagster as dg
from pydantic import Field

from checkpoint_ops.errors import CheckpointOpsError
from checkpoint_ops.pairing import same_location

from dagster_checkpoint_ops.backups import FRESHNESS_CHECK, backup_job, freshness_check, freshness_result, freshness_spec
from dagster_checkpoint_ops.compaction import compaction_job
from dagster_checkpoint_ops.drill import CHECK as DRILL_CHECK
from dagster_checkpoint_ops.drill import drill_job, drill_result, drill_schedule, drill_spec
from dagster_checkpoint_ops.health import CHECK as HEALTH_CHECK
from dagster_checkpoint_ops.health import failure_sensor, health_check, health_result, health_spec
from dagster_checkpoint_ops.observe import SENSOR as PROGRESS_SENSOR
from dagster_checkpoint_ops.observe import progress_sensor
from dagster_checkpoint_ops.operations import RESTORE_JOB, UNDO_JOB, external_rollback_job, restore_job, undo_job
from dagster_checkpoint_ops.pools import warn_if_pool_unlimited
from dagster_checkpoint_ops.query import StreamingQuery, job_name, pool_name, schedule_name
from dagster_checkpoint_ops.reprocess import reprocess_request_sensor
from dagster_checkpoint_ops.runner import run_stream
from dagster_checkpoint_ops.resources.checkpoint_files import CheckpointFileManagerResource
from dagster_checkpoint_ops.resources.settings import StreamingSettings
from dagster_checkpoint_ops.resources.spark import LOCAL_SPARK, SparkResource

__all__ = ["ReprocessConfig", "StreamingQuery", "default_home", "streaming_definitions"]

HOME_DIR = ".checkpoint-ops-home"  # in the current directory, when neither environment variable is set


def default_home() -> str:
    """The working directory of the definitions: ``$CHECKPOINT_OPS_HOME``, else ``$DAGSTER_HOME/checkpoint-ops``,
    else ``.checkpoint-ops-home/`` in the current directory; an absolute path. Reads the environment only:
    nothing is created (never inside the installed package)."""
    explicit = os.environ.get("CHECKPOINT_OPS_HOME")
    if explicit:
        return os.path.abspath(explicit)
    dagster_home = os.environ.get("DAGSTER_HOME")
    if dagster_home:
        return os.path.abspath(os.path.join(dagster_home, "checkpoint-ops"))
    return os.path.abspath(HOME_DIR)


class ReprocessConfig(dg.Config):
    """Roll the query back before it runs, to reprocess from a batch (all optional)."""

    rollback_to_batch: Optional[int] = Field(
        default=None, description="Roll the checkpoint and its file sinks back so this committed batch is the last "
        "one, then reprocess from the next (journaled; undo with checkpoint-ops undo).")
    rollback_to_time: Optional[str] = Field(
        default=None, description="Or: roll back to the last batch planned at or before this ISO 8601 time "
        "(UTC when it has no offset), e.g. 2026-11-21T06:30:00Z.")
    dry_run: bool = Field(
        default=False, description="Only record the rollback plan, as an observation of the asset (not a "
        "materialization): nothing changes, the query does not run.")
    skip_compat_check: bool = Field(
        default=False, description="Start the query without first letting Spark judge it against the checkpoint (a "
        "changed query may then fail at restart, or silently behave differently).")


def streaming_asset(query: StreamingQuery) -> dg.AssetsDefinition:
    """The query's asset, with its three checks evaluated inside its step: the health check on the
    materialization's own pass (no second listing, no step of its own), the backup and drill checks from
    the backup destination. Each check can also run on its own (the UI's Execute, a check-only job): the
    step then evaluates just the selected checks, and neither Spark nor the query starts."""
    description = query.description or f"Streaming query {query.name}, run until its input is drained."
    extra = {}
    if query.automation_condition is not None:
        extra["automation_condition"] = query.automation_condition
    if query.freshness_policy is not None:
        extra["freshness_policy"] = query.freshness_policy
    # skippable: a dry run observes the asset (its plan as metadata) and materializes nothing
    spec = dg.AssetSpec(query.name, kinds={"spark"}, group_name=query.group, description=description,
                        tags=query.tags or None, skippable=True, **extra)
    key = dg.AssetKey(query.name)

    @dg.multi_asset(name=query.name, specs=[spec], pool=pool_name(query.name), can_subset=True,
                    check_specs=[health_spec(query), freshness_spec(query), drill_spec(query)])
    def _asset(context: dg.AssetExecutionContext, config: ReprocessConfig, spark: SparkResource,
               checkpoint_files: CheckpointFileManagerResource, streaming_settings: StreamingSettings):
        try:
            findings = None  # the health check runs fsck, unless the materialization's pass just did
            if key in context.selected_asset_keys:
                warn_if_pool_unlimited(context)
                materialized = run_stream(context, query, config, spark.spark_session, checkpoint_files)
                findings = materialized.findings
                if config.dry_run:  # nothing ran, nothing changed: no materialization for automation to act on
                    yield dg.AssetObservation(asset_key=key, metadata=materialized.metadata)
                else:
                    yield dg.MaterializeResult(asset_key=key, metadata=materialized.metadata)
            wanted = {check.name for check in context.selected_asset_check_keys}
            if HEALTH_CHECK in wanted:
                yield health_result(query, checkpoint_files, findings, runs_here=True)
            if FRESHNESS_CHECK in wanted:
                yield freshness_result(query, streaming_settings, checkpoint_files)
            if DRILL_CHECK in wanted:
                yield drill_result(query, streaming_settings, checkpoint_files)
        except CheckpointOpsError as e:  # the library's reason, not a traceback
            raise step_failure(query, e) from None

    return _asset


def step_failure(query: StreamingQuery, e: CheckpointOpsError) -> dg.Failure:
    """A library refusal in the asset's step, as Dagster shows a failure: the asset, where it looked, the reason."""
    return dg.Failure(
        description=f"asset {query.name}: {e.render()}\n  the asset's checkpoint: {query.checkpoint}; its declared "
        f"sinks (the StreamingQuery sinks= argument, or the component's YAML sinks: field): {list(query.sinks)}",
        metadata={"problem": e.problem, "path": e.path or "", "fix": e.fix or ""})


def external_asset(query: StreamingQuery) -> dg.AssetSpec:
    """A query that runs elsewhere: an external asset (observed, never materialized here)."""
    extra = {"freshness_policy": query.freshness_policy} if query.freshness_policy is not None else {}
    return dg.AssetSpec(key=query.name, kinds={"spark"}, group_name=query.group, tags=query.tags or None,
                        description=query.description or f"Streaming query {query.name}, run elsewhere; its "
                        "checkpoint is observed, checked, backed up and compacted here.", **extra)


def _refuse_shared_locations(queries: Sequence[StreamingQuery]) -> None:
    """Two queries on one checkpoint, or writing one file sink, lose rows: each commits batches in the other's
    checkpoint, or Spark's file sink skips the batch ids the other logged. Refused when the definitions load."""
    def place(url: str) -> str:  # a URL with a scheme (s3://, file:/...) as it is, a path made absolute
        return url if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", url) and not re.match(r"[A-Za-z]:[\\/]", url) \
            else os.path.abspath(url)

    seen: list[tuple[str, str, str]] = []  # (location, what, query)
    for q in queries:
        for url, what in [(q.checkpoint, "checkpoint")] + [(s, "sink") for s in q.sinks]:
            for other_url, other_what, other in seen:
                if same_location(place(url), place(other_url)):
                    who = (f"query {q.name} names one location twice" if other == q.name else
                           f"queries {other} and {q.name} share one location")
                    raise ValueError(
                        f"{who}: {other_url} is {other}'s {other_what} and {url} is {q.name}'s {what}. Each query "
                        "needs a checkpoint and file sinks of its own (two queries on one checkpoint commit batches "
                        "in each other's, and a file sink skips the batch ids another query logged there)")
            seen.append((url, what, q.name))


def streaming_definitions(queries: Sequence[StreamingQuery], home: Optional[str] = None,
                          backup_url: Optional[str] = None, spark_config: Optional[dict] = None,
                          spark_remote: Optional[str] = None, *, backup_cron: str = "*/30 * * * *",
                          compaction_cron: str = "15 * * * *", backup_keep_last: int = 24,
                          backup_max_age: str = "2h", sink_retention: Optional[str] = None,
                          drill_cron: str = "45 3 * * *", scope: Optional[str] = None) -> dg.Definitions:
    """Definitions for these queries: an asset each (with ``checkpoint_health_check``,
    ``backup_freshness_check`` and ``restore_drill_check``), ``<name>_job`` (and ``<name>_schedule`` for a
    query with a ``schedule``), and, shared, ``checkpoint_backup_job``/``checkpoint_backup_schedule``,
    ``sink_compaction_job``/``sink_compaction_schedule``, ``checkpoint_restore_drill_job``/
    ``checkpoint_restore_drill_schedule`` (``drill_cron``, daily by default), ``checkpoint_undo_job``,
    ``checkpoint_restore_job``, ``reprocess_request_sensor``, ``checkpoint_failure_sensor`` and the resources they
    use. A query that runs elsewhere (``build=None``) is an external asset with the same checks, backups and
    compaction, ``<name>_rollback_job`` and ``checkpoint_progress_sensor``.

    ``home`` defaults to ``default_home()`` (``$CHECKPOINT_OPS_HOME``, else ``$DAGSTER_HOME/checkpoint-ops``, else
    ``.checkpoint-ops-home/`` in the current directory);
    ``backup_url`` to ``<home>/backups`` (each query's backups under ``<backup_url>/<name>``).
    ``spark_config`` adds to (or overrides) local Spark's settings, ``spark.master`` included;
    ``spark_remote="sc://host:port"`` drives a remote cluster through Spark Connect.

    ``scope`` names one set of definitions among several in a code location (a ``StreamingQueryComponent``
    passes its query's name): the shared jobs, schedules and sensors are then called ``<scope>_<name>``, the
    request-folder sensor is left out (it serves the unscoped definitions), and equal resources are the same
    objects, so ``dg.Definitions.merge`` accepts them side by side.
    """
    queries = list(queries)
    names = [q.name for q in queries]
    if len(set(names)) != len(names):
        raise ValueError(f"query names must be unique: {names}")
    _refuse_shared_locations(queries)

    def shared(name: str) -> str:
        return f"{scope}_{name}" if scope else name

    built = [q for q in queries if not q.external]
    external = [q for q in queries if q.external]
    home = home or default_home()
    backup_url = backup_url or f"{home.rstrip('/')}/backups"
    assets = [streaming_asset(q) for q in built] + [external_asset(q) for q in external]
    # a built query's checks are its asset's (streaming_asset); one that runs elsewhere has them as steps
    checks = [c for q in external for c in (health_check(q), freshness_check(q))]
    asset_jobs = [dg.define_asset_job(job_name(q.name), selection=dg.AssetSelection.assets(q.name),
                                      tags={"checkpoint/query": q.name},
                                      description=f"Run {q.name} (with run config: roll back and reprocess first).")
                  for q in built]
    backups = backup_job(queries, shared("checkpoint_backup_job"))
    jobs = [*asset_jobs, backups, undo_job(queries, shared(UNDO_JOB)), restore_job(queries, shared(RESTORE_JOB))]
    jobs += [external_rollback_job(q) for q in external]
    schedules = [dg.ScheduleDefinition(name=shared("checkpoint_backup_schedule"), job=backups,
                                       cron_schedule=backup_cron, execution_timezone="UTC",
                                       default_status=dg.DefaultScheduleStatus.RUNNING,
                                       description="Back up every query's checkpoint (and sinks) on a schedule.")]
    if built:
        drills = drill_job(built, shared("checkpoint_restore_drill_job"))
        jobs.append(drills)
        schedules.append(drill_schedule(drills, drill_cron, shared("checkpoint_restore_drill_schedule")))
    by_name = {job.name: job for job in asset_jobs}
    schedules += [dg.ScheduleDefinition(name=schedule_name(q.name), job=by_name[job_name(q.name)],
                                        cron_schedule=q.schedule, execution_timezone="UTC",
                                        default_status=dg.DefaultScheduleStatus.RUNNING,
                                        description=f"Run {q.name} until its input is drained, on a schedule.")
                  for q in built if q.schedule]
    compaction = compaction_job(queries, shared("sink_compaction_job"))
    if compaction is not None:
        jobs.append(compaction)
        schedules.append(dg.ScheduleDefinition(
            name=shared("sink_compaction_schedule"), job=compaction, cron_schedule=compaction_cron,
            execution_timezone="UTC",
            description="Compact every file sink's log (and apply batch-granular retention if set)."))
    sensors = [failure_sensor(queries, shared("checkpoint_failure_sensor"))]
    if built and not scope:
        sensors.append(reprocess_request_sensor(built, asset_jobs))
    if external:
        sensors.append(progress_sensor(external, shared(PROGRESS_SENSOR)))
    token = dg.EnvVar("SPARK_CONNECT_TOKEN") if os.environ.get("SPARK_CONNECT_TOKEN") else None
    creds = {k: dg.EnvVar(env) for k, env in (("key", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY"),
                                              ("endpoint_url", "AWS_ENDPOINT_URL")) if os.environ.get(env)}
    resources = {
        "spark": SparkResource(spark_config={**LOCAL_SPARK, **(spark_config or {})}, spark_remote=spark_remote,
                               spark_connect_token=token),
        "checkpoint_files": CheckpointFileManagerResource(**creds),
        "streaming_settings": StreamingSettings(home=home, backup_url=backup_url, backup_keep_last=backup_keep_last,
                                                backup_max_age=backup_max_age, sink_retention=sink_retention),
    }
    resources = {key: same_resource(value, key, scope) for key, value in resources.items()}
    # One process per run: Spark starts once, in the run's process, not once per step.
    return dg.Definitions(assets=assets, asset_checks=checks, jobs=jobs, schedules=schedules, sensors=sensors,
                          resources=resources, executor=dg.in_process_executor)


_RESOURCES: dict[tuple[str, str], dg.ConfigurableResource] = {}


# per resource key, the last one made by Python definitions (scope None) and by a component (its scope)
_LAST: dict[str, dict[bool, tuple[Optional[str], dg.ConfigurableResource]]] = {}

def same_resource(resource: dg.ConfigurableResource, key: Optional[str] = None,
                  scope: Optional[str] = None) -> dg.ConfigurableResource:
    """An equal resource made earlier, else this one: ``dg.Definitions.merge`` accepts two sets of definitions
    with a resource key only when both hold the very same object. A component (``scope``) always makes the
    default shared settings: when Python definitions in this process customised them, the merge of the two
    will refuse, so this warns first, naming the differing arguments and what to do."""
    resource = _RESOURCES.setdefault((type(resource).__qualname__, repr(resource)), resource)
    if key is not None:
        mine = _LAST.setdefault(key, {})
        mine[scope is not None] = (scope, resource)
        other = mine.get(scope is None)
        if other is not None and other[1] is not resource:
            warn_differing(key, *((scope, resource), other)[:: 1 if scope is None else -1])
    return resource


def warn_differing(key: str, python: tuple, component: tuple) -> None:
    """Say which shared setting differs between Python definitions and a component, before Dagster's merge
    refuses with only the resource key."""
    (_, mine), (name, theirs) = python, component
    fields = [f for f in type(mine).model_fields if getattr(mine, f, None) != getattr(theirs, f, None)]
    warnings.warn(
        f"streaming_definitions({', '.join(f'{f}=...' for f in fields)}) customises the shared resource '{key}' "
        f"({', '.join(f'{f}={getattr(mine, f, None)!r}' for f in fields)}), but StreamingQueryComponent '{name}' "
        f"uses the defaults ({', '.join(f'{f}={getattr(theirs, f, None)!r}' for f in fields)}): "
        f"dg.Definitions.merge of the two fails with \"different resources with same key '{key}'\". Components "
        "take no shared settings: in a code location with components, leave these arguments at their defaults and "
        "set them per query (StreamingQuery backup_url=, sink_retention=, spark_config=; YAML backup_url:, "
        "retention:, spark_config:) or the home through $CHECKPOINT_OPS_HOME; see docs/dagster.md.",
        UserWarning, stacklevel=3)
