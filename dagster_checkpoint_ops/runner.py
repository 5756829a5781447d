"""What a streaming asset does when it runs: roll back if asked, run the query, report.

Plain functions (no Dagster decorators here), called by the assets ``streaming.py`` makes.
"""

import json
import re
import time
from dataclasses import dataclass
from typing import Optional

import dagster as dg

from checkpoint_ops.activity import record_ended_run
from checkpoint_ops.check_pass import run_check_pass
from checkpoint_ops.collector import fewer_collections
from checkpoint_ops.errors import (STORE_FAILURES, BadInputError, CheckpointOpsError, StoreUnavailableError,
                                   parameter_names)
from checkpoint_ops.fence import is_fence, parse_fence, recovery_advice
from checkpoint_ops.fsck import Finding
from checkpoint_ops.ledger import Ledger, PairingRecord
from checkpoint_ops.lease import LeaseLost, LeaseSet, acquire_all, lease_root
from checkpoint_ops.model.checkpoint import Checkpoint
from checkpoint_ops.operation import RunOptions, run
from checkpoint_ops.pairing import PAIRING_FILE, same_location
from checkpoint_ops.plan import SIDECAR_PREFIX, Plan
from checkpoint_ops.query_owner import Claim, claim
from checkpoint_ops.query_profile import describe_query
from checkpoint_ops.recorded_sinks import recorded_sink_left_ahead
from checkpoint_ops.rollback import RollbackOperation
from checkpoint_ops.session_settings import session_settings
from checkpoint_ops.storage.paths import join
from checkpoint_ops.timeline import batch_times
from checkpoint_ops.units import parse_time
from dagster_checkpoint_ops.compat import RollbackTarget, accept_after_run, check_before_run

NUM_PROGRESS = "spark.sql.streaming.numRecentProgressUpdates"
MAINTENANCE = "spark.sql.streaming.stateStore.maintenanceInterval"
LEASE_POLL_S = 1.0  # how often a run checks its leases while its query runs (the heartbeat finds a loss)

# How the library's messages name parameters here: run-config keys, not CLI flags (errors.param).
RUN_CONFIG_NAMES = {"to_batch": "rollback_to_batch", "to_time": "rollback_to_time", "dry_run": "dry_run",
                    "force": None, "checkpoint": None, "source_compact_interval": "the query's Spark settings",
                    "sink_compact_interval": "the query's Spark settings", "sink": None,
                    "without_recorded_sinks": None}


def failure(e: CheckpointOpsError, what: str) -> dg.Failure:
    """The run fails with the tool's own reason (nothing was changed)."""
    return dg.Failure(description=f"{what}: {e.render()}",
                      metadata={"problem": e.problem, "path": e.path or "", "fix": e.fix or ""})


def plan_markdown(plan: Plan) -> str:
    """What a plan deletes, writes or rewrites, grouped by reason, as a table for the UI."""
    groups: dict[tuple, list] = {}
    for a in plan.actions:
        reason = a.reason[len(SIDECAR_PREFIX):] + " (checksum sidecars)" if a.reason.startswith(SIDECAR_PREFIX) \
            else a.reason
        groups.setdefault((a.kind, a.root, reason), []).append(a)
    rows = ["| action | files | where | why | e.g. |", "|---|---|---|---|---|"]
    for (kind, root, reason), acts in groups.items():
        rows.append(f"| {kind} | {len(acts)} | {root} | {reason} | `{sorted(a.rel for a in acts)[0]}` |")
    return "\n".join(rows) if plan.actions else "nothing to change"


def _run_rollback(context, query, config, files, leases: LeaseSet, dry_run: bool, plan_hash: Optional[str] = None):
    """The rollback the run config asks for, through the operation runner under the run's leases (planned only
    when ``dry_run``; ``plan_hash``: applied only if its plan is still that one): the runner's result."""
    with parameter_names(RUN_CONFIG_NAMES):
        try:
            to_time = parse_time(config.rollback_to_time, "rollback_to_time") if config.rollback_to_time else None
            op = RollbackOperation(query.checkpoint, config.rollback_to_batch, to_time, list(query.sinks),
                                   storage_options=files.options(), query_held=True)  # this asset runs the query
            return run(op, RunOptions(dry_run=dry_run, yes=True, plan_hash=plan_hash, held=leases,
                                      storage_options=files.options(),
                                      owner=f"dagster run {context.run.run_id} ({query.name})"))
        except CheckpointOpsError as e:
            raise failure(e, "rollback refused") from None


def rollback_target(plan: Plan) -> RollbackTarget:
    """Where a rollback ``plan`` leaves the checkpoint (planned under the run's leases, which the run holds until it
    applies the same plan): the compat step judges the query there first."""
    return RollbackTarget(plan.target_batch, tuple(url for rid, url in plan.roots.items() if rid.startswith("sink")),
                          plan.hash)


def refuse_recorded_sink_left_ahead(query, target: RollbackTarget, files) -> None:
    """The file sink the recorded query profile says this asset's query writes, left out of the rollback (the asset
    does not declare it) with its log ahead of the target: Spark's file sink would skip the re-run batches without
    running them (their rows never reach it, and a stateful query's state for them is never written). The asset
    runs that query, so this is refused, not warned of as a command-line rollback does (which may be of a checkpoint
    whose query writes elsewhere now). Nothing changed."""
    try:
        # the model unlisted (only the profile beside it is read): the plan has just listed the checkpoint
        ahead = recorded_sink_left_ahead(Checkpoint(*files.file_manager(query.checkpoint)), list(target.sinks),
                                         target.batch, storage_options=files.options())
    except CheckpointOpsError as e:
        raise failure(e, "rollback refused") from None
    if ahead is None:
        return
    path, latest = ahead
    raise dg.Failure(
        description=f"rollback refused: asset {query.name}'s query writes the file sink {path} (its recorded profile "
        f"says so), which the asset does not declare, so the rollback to batch {target.batch} would leave its log at "
        f"batch {latest}: Spark's file sink would skip batches {target.batch + 1}..{latest} without running them "
        f"(their rows never reach it, and the state of a stateful query is missing from then on). Nothing ran, "
        f"nothing changed. Fix: declare it in the asset's {SINKS_FIELD}, then materialize again with the same run "
        "config.", metadata={"undeclared_sink": path, "sink_log_latest_batch": latest})


def rollback(context, query, config, files, leases: LeaseSet, judged: Optional[RollbackTarget] = None) -> dict:
    """Plan (and unless a dry run, apply) the rollback the run config asks for, through the operation
    runner under the run's leases; metadata for the UI. ``judged``: the plan the compat step judged the query
    against (``rollback_target``): a plan that is not that one any more is refused, nothing changed."""
    return rollback_metadata(context, query, _run_rollback(context, query, config, files, leases,
                                                           dry_run=config.dry_run,
                                                           plan_hash=judged.plan_hash if judged is not None else None))


def rollback_metadata(context, query, result) -> dict:
    """The UI's metadata of a rollback the operation runner planned (and maybe applied): ``result``."""
    plan = result.plan
    md = {
        "rollback_target_batch": dg.MetadataValue.int(plan.target_batch),
        "rollback_plan_hash": dg.MetadataValue.text(plan.hash),
        "rollback_plan": dg.MetadataValue.md(plan_markdown(plan)),
        "rollback_counts": dg.MetadataValue.json(plan.counts()),
        "rollback_warnings": dg.MetadataValue.json(plan.warnings),
    }
    for w in plan.warnings:
        context.log.warning(f"rollback plan: {w}")
    if result.applied:
        op_id = result.outcome.op_id
        context.log.info(f"rolled {query.name} back to batch {plan.target_batch} ({op_id}): "
                         f"{plan.counts()['delete']} files moved aside")
        md["rollback_op_id"] = dg.MetadataValue.text(op_id)
        md["rollback_requests"] = dg.MetadataValue.json(result.outcome.requests)  # per root, by kind
        md["rollback_retries"] = dg.MetadataValue.json(result.outcome.retries)  # of those, retried after a store failure
    return md


def undo_metadata(query, md: dict, progress: list[dict]) -> dict:
    """How to revert this run's rollback, if anything can: once the run reprocessed batches after it,
    undo would mix two timelines (and refuses), so the metadata says what to do instead."""
    if "rollback_op_id" not in md:
        return {}
    if progress:
        batches = [p["batchId"] for p in progress]
        return {"undo": dg.MetadataValue.text(
            f"not possible any more: this run reprocessed batches {batches[0]}..{batches[-1]} after the rollback; "
            "to go back, materialize again with rollback_to_batch")}
    return {"undo_command": dg.MetadataValue.text(f"checkpoint-ops undo {query.checkpoint}")}


def _progress(p) -> dict:
    return json.loads(p.json) if hasattr(p, "json") else dict(p)


def _refuse_if_fenced(query, files) -> None:
    """An interrupted operation fenced the checkpoint: say how to finish it (Spark's own error is opaque).
    One read of ``metadata`` (where the fence is), not a listing of the whole checkpoint: a missing or
    unreadable ``metadata`` is Spark's to start or to refuse."""
    fm, root = files.file_manager(query.checkpoint)
    try:
        raw = fm.read_bytes(join(root, "metadata"))
    except OSError:
        return
    if is_fence(raw):
        f = parse_fence(raw)
        raise dg.Failure(description=f"{query.checkpoint}: an interrupted checkpoint-ops {f.operation} ({f.op_id}) "
                         f"fenced this checkpoint: {recovery_advice(f, fm.url(root.rstrip('/')))}, then run again.")


def refuse_sink_of_another_query(query, files) -> None:
    """A declared file sink whose pairing record (``checkpoint_ops.pairing``, written by every ledger sync)
    names another checkpoint, or this location when its query was started again from scratch: Spark's file
    sink would skip every batch id that query logged there, so the run would commit batches whose rows never
    reach the output. Refused before the query starts (nothing changed). One read per sink, and of
    ``metadata``; a damaged record is left to the checks after the run. A store that does not answer stops the run
    here (``StoreUnavailableError``): skipped, the refusal would let the query commit batches whose rows never
    reach the output."""
    fm, root = files.file_manager(query.checkpoint)
    here = fm.url(root.rstrip("/"))
    query_id, known = None, True
    try:
        query_id = json.loads(fm.read_bytes(join(root, "metadata"))).get("id")
    except FileNotFoundError:
        pass  # a new checkpoint, or one deleted: the query starts again from batch 0
    except (OSError, ValueError, AttributeError, BadInputError):
        known = False  # unreadable: fsck and the compat step say so; judged by the record's checkpoint alone
    for url in query.sinks:
        sink_fm, sink_root = files.file_manager(url)
        where = join(sink_root, PAIRING_FILE)
        try:
            record = PairingRecord.parse(sink_fm.read_bytes(where), sink_fm.url(where))
        except (OSError, BadInputError):
            continue
        if not any(same_location(s, sink_fm.url(sink_root)) for s in record.sinks):
            continue  # a record copied with the directory: it says nothing about this output
        if not same_location(record.checkpoint, here):
            why = (f"{sink_fm.url(where)} records it as the output of checkpoint {record.checkpoint} (query "
                   f"{record.query_id}): two queries cannot share one file sink (each skips the batch ids the "
                   "other logged there)")
            fix = (f"give asset {query.name} an output directory of its own; if {record.checkpoint} no longer writes "
                   f"{url}, move {sink_fm.url(where)} away")
        elif known and record.query_id is not None and query_id != record.query_id:
            why = (f"{sink_fm.url(where)} records it as the output of the query {record.query_id} at this "
                   f"checkpoint, which now holds " + (f"query {query_id}" if query_id else "no query (it was deleted)")
                   + ": the query starts again from batch 0, and Spark's file sink would skip every batch id the "
                   "old one logged there")
            fix = (f"start the new query with a new, empty output directory (or move {url} away), or restore the "
                   "old checkpoint")
        else:
            continue
        raise dg.Failure(
            description=f"asset {query.name}: its {SINKS_FIELD} {url} is not the output of this query's checkpoint "
            f"{query.checkpoint}: {why}. Refused before the query started: nothing ran, nothing changed. Fix: {fix}.",
            metadata={"sink": url, "recorded_checkpoint": record.checkpoint,
                      "recorded_query_id": record.query_id or "", "checkpoint_query_id": query_id or ""})


def refuse_checkpoint_of_another_query(context, query, files, write: bool = False,
                                       job: Optional[str] = None) -> Claim:
    """The checkpoint is recorded as another asset's (``checkpoint_ops.query_owner``): two assets running one
    checkpoint take turns with its batches, each sending them to its own sinks. Refused before anything runs
    (nothing changed). ``write``: record the checkpoint as this asset's if it is not yet (``record_owner``,
    once the query is about to start: a run that fails before claims nothing). ``job``: a job that changes the
    checkpoint without running the query (an undo, a compaction) is refused alike: it is the other asset's to
    change (a hostile review: a copied component's undo job planned an undo of the first one's checkpoint)."""
    fm, root = files.file_manager(query.checkpoint)
    try:
        got = claim(fm, root, query.name, f"dagster run {context.run.run_id} ({query.name})", write=write)
    except CheckpointOpsError as e:
        raise failure(e, f"{query.name} cannot run") from None
    if got.note:  # said once: as judged (info), then as done or not done (warning)
        (context.log.warning if write else context.log.info)(f"{query.name}: {got.note}")
    if got.other is None:
        return got
    where = fm.url(got.path)
    if job is not None:
        raise dg.Failure(
            description=f"{job} of {query.name}: its checkpoint {query.checkpoint} is run by asset {got.other.name} "
            f"(recorded in {where} by {got.other.by}), so {query.name} is a second definition on it (a copy, or a "
            f"component and Python definitions naming one checkpoint) and its {job} would change asset "
            f"{got.other.name}'s checkpoint. Refused: nothing changed. Fix: give {query.name} a checkpoint of its "
            f"own, or use asset {got.other.name}'s {job}; if asset {got.other.name} was renamed to {query.name}, "
            f"delete {where}.",
            metadata={"checkpoint": query.checkpoint, "recorded_asset": got.other.name, "record": where})
    raise dg.Failure(
        description=f"asset {query.name}: its checkpoint {query.checkpoint} is run by asset {got.other.name} "
        f"(recorded in {where} by {got.other.by}): two assets running one checkpoint take turns with its batches, "
        "each writing them to its own sinks, so each output misses the other's batches for good. Refused before "
        f"anything ran: nothing ran, nothing changed. Fix: give asset {query.name} a checkpoint of its own; if "
        f"asset {got.other.name} was renamed to {query.name} (or no longer runs), delete {where} and run again.",
        metadata={"checkpoint": query.checkpoint, "recorded_asset": got.other.name, "record": where})


def record_owner(context, query, files, judged: Claim) -> None:
    """Record the checkpoint as this asset's before its query starts, unless the record already says so."""
    if not judged.recorded and judged.path is not None:
        refuse_checkpoint_of_another_query(context, query, files, write=True)


def _is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _spark_duration_s(text: str) -> float:
    """A Spark time setting ('10s', '60000ms', '1m', bare milliseconds) in seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", text or "")
    if not m:
        return 60.0
    unit = {"ms": 0.001, None: 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
    return float(m.group(1)) * unit


def release_state_stores(spark, stateful: bool) -> None:
    """A stopped query's state stores stay loaded until the next maintenance, which may still write
    snapshots or delete old files in the checkpoint: let go of them before the lease does, so a
    rollback right after the run cannot race that maintenance."""
    if not stateful:
        return
    if not _is_connect(spark):
        if not spark.streams.active:  # stopping the stores would break another query of this session
            spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()
        return
    # A Spark Connect server unloads them at its next maintenance pass: wait one interval.
    interval = _spark_duration_s(spark.conf.get(MAINTENANCE, "60s"))
    time.sleep(min(interval + 1, 120))


SINKS_FIELD = "sinks (the StreamingQuery sinks= argument, or the component's YAML sinks: field)"


def _writer_sink(spark, writer, sink=None):
    """The writer's sink (kind and path as Spark was given them), None when it cannot be read."""
    if sink is not None:
        return sink
    try:
        return describe_query(spark, writer).sink
    except Exception:  # another Spark's writer: the sink stays unknown, the run checks the sinks after it
        return None


def refuse_undeclared_sink(query, sink) -> None:
    """A file-sink writer whose output directory is not the declared one: the run would commit batches to
    one directory while rollback, backup, compaction and the checks work on another. Refused before the
    query starts (nothing changed)."""
    if sink is None or sink.kind != "file" or not sink.path or not query.sinks:
        return
    wrong = [s for s in query.sinks if not same_location(s, sink.path)]
    if not wrong:
        return
    what = (f"declares {list(query.sinks)}, not the directory the query writes" if len(wrong) == len(query.sinks)
            else f"also declares {wrong}, which the query does not write (it has one sink)")
    raise dg.Failure(
        description=f"asset {query.name}: its query writes its file sink to {sink.path}, but the asset's {SINKS_FIELD} "
        f"{what}. Refused before the query started: nothing ran, nothing changed. Fix: set sinks to "
        f"[{sink.path!r}] (the writer's option('path')), or correct the path in the query's writer.",
        metadata={"writer_sink": sink.path, "declared_sinks": dg.MetadataValue.json(list(query.sinks))})


def run_query(context, query, spark, files, writer=None, sink=None, leases: Optional[LeaseSet] = None) -> list[dict]:
    """Start the user's writer on the query's checkpoint with Trigger.AvailableNow (the run holds the
    checkpoint's lease). ``writer``: the one the compat step built and left as built (else built here);
    ``sink``: its sink as the compat step read it (else read here). A file sink other than the declared one
    is refused before the query starts. ``leases``: the run's, checked while the query runs: taken from the
    run (its heartbeat lapsed and a command took them over, or they were broken by hand), the query is
    stopped and the run fails."""
    _refuse_if_fenced(query, files)
    spark.conf.set(NUM_PROGRESS, "100000")  # metadata covers every batch of the run
    with query_spark_conf(spark, query):
        if writer is None:
            writer = query.build(spark)
        if not (hasattr(writer, "start") and hasattr(writer, "trigger")):
            raise dg.Failure(description=f"{query.name}: build(spark) must return an unstarted DataStreamWriter "
                             f"(df.writeStream...), not {type(writer).__name__}")
        refuse_undeclared_sink(query, _writer_sink(spark, writer, sink))
        refuse_sink_of_another_query(query, files)
        started = writer.option("checkpointLocation", query.checkpoint).trigger(availableNow=True).start()
        try:
            lost = _await_unless_taken(started, leases) or _taken_now(leases)
        except Exception as e:  # the query failed: its own message, not a py4j/gRPC stack
            # taken meanwhile, the other holder's changes may be why: say so, and write nothing more
            lost = _taken_now(leases)
            if lost is not None:
                raise _taken_failure(query, started, lost, spark, failed=e) from None
            # the batch it left planned is this run's (it held the lease): a rollback to repair it is not refused
            # for the planned batch looking recent (checkpoint_ops.activity); only once the query has stopped
            # (a client-side error, e.g. a Spark Connect session lost, can leave it running on the server: stopped
            # here if it can be, as the leases are released next)
            try:
                stopped = not started.isActive
                if not stopped:
                    started.stop()
                    stopped = not started.isActive
            except Exception:  # cannot tell: the age rule stays
                stopped = False
            if stopped:
                fm, root = files.file_manager(query.checkpoint)
                record_ended_run(fm, root, f"dagster run {context.run.run_id} ({query.name}), which failed")
            raise dg.Failure(description=f"streaming query {query.name} failed: {str(e).strip()[:2000]}") from e
        except BaseException:  # the run terminated (Dagster's interrupt, Ctrl-C): the leases go next, so the query too
            try:
                started.stop()
            except Exception:  # noqa: BLE001 - the interrupt is what is raised
                pass
            raise
        if lost is not None:
            raise _taken_failure(query, started, lost, spark) from None
    progress = [_progress(p) for p in started.recentProgress]
    release_state_stores(spark, any(p.get("stateOperators") for p in progress))
    return progress


def _await_unless_taken(started, leases: Optional[LeaseSet]) -> Optional[LeaseLost]:
    """Wait for the query to end, checking the run's leases every ``LEASE_POLL_S``: why they were taken from the
    run, if they were (the query still runs then), else None."""
    if leases is None:
        started.awaitTermination()
        return None
    while not started.awaitTermination(LEASE_POLL_S):
        try:
            leases.check()  # the heartbeat found a record another holder's
        except LeaseLost as e:
            return e
    return None


def _taken_now(leases: Optional[LeaseSet]) -> Optional[LeaseLost]:
    """Why the run's leases are not its own now (each record read), else None; None too when the store does not
    answer (the run goes on as it would have: its own outcome says what the store did)."""
    if leases is None:
        return None
    try:
        leases.verify()
    except LeaseLost as e:
        return e
    except (OSError, *STORE_FAILURES):
        return None
    return None


def _taken_failure(query, started, lost: LeaseLost, spark, failed: Optional[Exception] = None) -> dg.Failure:
    """The run's lease was taken while its query ran: another holder may be changing the checkpoint, so the
    query stops now, its state stores are let go (their maintenance must not write beside that holder), and
    nothing more is written under the lease (no ended-run record, no ledger)."""
    try:
        started.stop()
        stopped = "stopped"
    except Exception as e:  # noqa: BLE001 - said; the loss is the failure
        stopped = f"left running (stopping it failed: {str(e).strip()[:500]}); stop it yourself now"
    if not _is_connect(spark):  # a Spark Connect server unloads them at its own next maintenance
        try:
            release_state_stores(spark, True)
        except Exception:  # noqa: BLE001 - the loss is the failure
            pass
    where = lease_root(lost.path) if lost.path else query.checkpoint
    then = f" (it had failed: {str(failed).strip()[:1000]})" if failed is not None else ""
    return dg.Failure(
        description=f"streaming query {query.name} was {stopped}{then}: {lost.path}: {lost.problem}. It must not run "
        f"while another holder may be changing its checkpoint. See who holds the lease now (`checkpoint-ops lease show "
        f"{where}`): a command took it over because this run's heartbeat lapsed (the process was paused, or could not "
        "reach the lease's store, for longer than the lease's time to live), or it was broken by hand. The batches "
        "the query committed before it stopped stay committed; once that holder is done, materialize again.")


def query_spark_conf(spark, query):
    """The query's own ``spark_config`` over the session's, for this query's run only: the previous values
    (or their absence) are restored afterwards, so the next query in the same session sees the shared settings."""
    return session_settings(spark, query.spark_config or {})


def hold_leases(context, query, files) -> LeaseSet:
    """The leases of the query's checkpoint and file sinks, for the whole materialization: no command
    (and no other run) changes them meanwhile. A dead earlier run's lease is taken over, with a warning."""
    sites = [(*files.file_manager(url), url) for url in [query.checkpoint, *query.sinks]]
    try:
        # held across the Spark run, which has no steps to stop at: renewed however late (lease.py)
        leases = acquire_all(sites, f"dagster run {context.run.run_id} ({query.name})", stepwise=False)
    except CheckpointOpsError as e:
        raise failure(e, f"{query.name} cannot run") from None
    for note in leases.notes:
        context.log.warning(note)
    return leases


@dataclass(frozen=True)
class StreamRun:
    """What one materialization produced: its metadata, and the fsck findings of the pass it made after the
    run under its leases (``None`` when no pass ran: a dry run). The health check reports those findings."""

    metadata: dict
    findings: Optional[list[Finding]] = None


def run_stream(context, query, config, spark, files) -> StreamRun:
    """The whole materialization, under the leases: rollback if asked, the run, the ledger, and what happened."""
    t0 = time.monotonic()
    md: dict = {}
    # released whatever happens; a release the store fails is a warning, never the step's outcome (an error naming
    # the resume of a rollback stopped part-way, or a run that committed batches)
    with hold_leases(context, query, files).held(lambda note: context.log.warning(f"{query.name}: {note}")) as leases:
        owner = refuse_checkpoint_of_another_query(context, query, files)  # judged; recorded before the query starts
        compat = target = None
        if config.rollback_to_batch is not None or config.rollback_to_time:
            # judged where the rollback leaves the checkpoint, before it is applied: a query Spark refuses there is
            # refused with nothing changed (not after the rollback, which then stood); a dry run says the same
            planned = _run_rollback(context, query, config, files, leases, dry_run=True)
            target = rollback_target(planned.plan)
            refuse_recorded_sink_left_ahead(query, target, files)  # also with skip_compat_check
            with query_spark_conf(spark, query), fewer_collections():
                compat = check_before_run(context, query, config, spark, files, as_of=target)  # records nothing
            if config.dry_run:  # the plan judged is the dry run's: not planned again
                md.update(rollback_metadata(context, query, planned))
                md.update(compat.metadata)
                md["dry_run"] = dg.MetadataValue.bool(True)
                return StreamRun(md)
            md.update(rollback(context, query, config, files, leases, target))
        elif config.dry_run:
            return StreamRun({"dry_run": dg.MetadataValue.bool(True),
                              "rollback_plan": dg.MetadataValue.md("no rollback asked for")})
        try:
            if compat is None:
                with query_spark_conf(spark, query), fewer_collections():  # Spark judges it with the run's settings
                    compat = check_before_run(context, query, config, spark, files)
            md.update(compat.metadata)
            record_owner(context, query, files, owner)
            progress = run_query(context, query, spark, files, compat.writer, compat.sink, leases)  # built once
        except Exception as e:
            if compat is not None:  # the query may have committed batches before it failed: they ran with it
                _accept_after_failure(context, query, compat, files)
            if "rollback_op_id" not in md:
                raise
            known = isinstance(e, (dg.Failure, CheckpointOpsError))  # their own words say it all
            raise after_rollback_failure(query, md, e, files) from (None if known else e)
        md.update(undo_metadata(query, md, progress))
        try:
            with fewer_collections():  # the pass's listing and models hold no cycles (collector.py)
                described, findings = describe(query, files, progress)
        except CheckpointOpsError as e:
            _accept_after_failure(context, query, compat, files)
            raise after_run_failure(query, e, progress) from None
        md.update(described)
        accept_after_run(context, query, compat, described["last_committed_batch"].value)
        leases.check()  # a lease lost mid-run (a hung run broken by hand) fails the run, loudly
    md["duration_s"] = dg.MetadataValue.float(round(time.monotonic() - t0, 3))
    return StreamRun(md, findings)


def _accept_after_failure(context, query, compat, files) -> None:
    """``accept_after_run`` for a run that failed after its compat step: batches it committed before the failure
    ran with the query. Never raises: the run's own failure is what is reported (the store may be what failed)."""
    try:
        accept_after_run(context, query, compat, files.checkpoint(query.checkpoint).latest_commit)
    except Exception as e:  # noqa: BLE001
        context.log.warning(f"{query.name}: query profile not recorded after the failure: {e}")


def after_rollback_failure(query, md: dict, e: BaseException, files) -> dg.Failure:
    """The run's rollback was applied, then the run stopped before its query finished (a refusal, the build or the
    query failing, the store): the reason, without its "nothing ran, nothing changed" (the rollback did change the
    checkpoint), and not to repeat the rollback: run again with the same config, it would roll back what this run's
    query committed since and hand those batches' rows to the sink a second time."""
    if isinstance(e, CheckpointOpsError):
        reason = f"{e.path}: {e.problem}" if e.path else e.problem
    elif isinstance(e, dg.Failure):
        reason = e.description or type(e).__name__
    else:
        reason = f"{type(e).__name__}: {str(e).strip()[:2000]}"
    reason = re.sub(r"\s*\(?nothing ran, nothing changed\)?:?", "", reason)
    batch, op_id = md["rollback_target_batch"].value, md["rollback_op_id"].value
    try:
        ckpt = files.checkpoint(query.checkpoint)
        latest, planned, url = ckpt.latest_commit, ckpt.latest_offset, ckpt.url
    except Exception:  # noqa: BLE001 - the store may be what stopped the run: said without it
        latest, planned, url = None, None, query.checkpoint
    since = (f" its query committed batches {batch + 1}..{latest} after it;" if latest is not None and latest > batch
             else "")
    # nothing ran after it (not even a batch planned): the rollback can still be undone (undo refuses once the query
    # wrote anything after it: two timelines); unknown (the store failed): not offered
    undoable = latest is not None and latest <= batch and (planned is None or planned <= batch)
    undo = "" if since or not undoable else (
        f"; or revert the rollback first: the checkpoint undo job (query {query.name}, op_id {op_id}) or "
        f"`checkpoint-ops undo {url} --op {op_id}` puts the checkpoint and its sinks back as they were before this "
        "run")
    return dg.Failure(
        description=f"asset {query.name}: its rollback to batch {batch} ({op_id}) was applied in this run and "
        f"stands;{since} then the run stopped: {reason}. Once that is mended, materialize again WITHOUT "
        "rollback_to_batch or rollback_to_time: the same config would roll back again"
        + (" what the query committed since, and hand those batches' rows to the sink a second time" if since
           else undo),
        metadata={"rollback_target_batch": batch, "rollback_op_id": op_id,
                  "last_committed_batch": latest if latest is not None else -1, "stopped_by": reason[:2000]})


def after_run_failure(query, e: CheckpointOpsError, progress: list[dict]) -> dg.Failure:
    """The query ran, but what follows it (ledger sync, inspection of the checkpoint and the declared sinks)
    refused: say what already happened, then the library's reason and what to do."""
    batches = [p["batchId"] for p in progress]
    ran = (f"the query ran and committed batches {batches[0]}..{batches[-1]} (its checkpoint and output moved on "
           "and stay so; the next run continues after them)" if batches else "the query ran (no new input)")
    if isinstance(e, StoreUnavailableError):  # its own fix ("nothing was changed") is wrong beside what ran
        reason = f"{e.path}: {e.problem}" if e.path else e.problem
        fix = "run it again once the store answers"
        then = "\n  fix: run it again once the store answers (nothing is wrong with the declared sinks)"
    else:
        reason, fix = e.render(), e.fix or ""
        then = ("\n  the declared sinks must be the output directories of the query's file sinks (empty for "
                "foreachBatch, Kafka and other sinks): correct them and run again")
    return dg.Failure(
        description=f"asset {query.name}: {ran}, but checking its checkpoint {query.checkpoint} and its declared "
        f"{SINKS_FIELD} {list(query.sinks)} after the run failed, so no materialization was recorded: {reason}{then}",
        metadata={"problem": e.problem, "path": e.path or "", "fix": fix,
                  "declared_sinks": dg.MetadataValue.json(list(query.sinks)),
                  "batches_committed": dg.MetadataValue.json(batches)})


def _input_rows(progress: dict) -> int:
    # summed over the sources: a Spark Connect client's progress has no top-level numInputRows
    return sum(int(src.get("numInputRows") or 0) for src in progress.get("sources", []))


def describe(query, files, progress: list[dict]) -> tuple[dict, list[Finding]]:
    """Metadata after a run (batches, rows, offsets, state, sinks, ledger, rollback window), and the pass's
    fsck findings."""
    ckpt = files.checkpoint(query.checkpoint)
    sinks = [files.sink(s) for s in query.sinks]
    # ledger sync, inspect and the health check's fsck in one pass, reading only what is new (verdict cache);
    # the metadata shows this run's batches (on_call_metadata), not inspect's list of every retained one
    checked = run_check_pass(ckpt, sinks, batches=False)
    ledger, report = checked.synced, checked.report
    batches = [p["batchId"] for p in progress]
    offsets = {}
    if progress:
        for i, src in enumerate(progress[-1].get("sources", [])):
            offsets[src.get("description", str(i))] = {"start": progress[0]["sources"][i].get("startOffset"),
                                                        "end": src.get("endOffset")}
    state_rows = sum(int(op.get("numRowsTotal") or 0) for op in (progress[-1].get("stateOperators", [])
                                                                 if progress else []))
    state_bytes = sum(op["bytes"] for op in report["state"]["operators"])
    w = report["rollback_window"]
    md = {
        "batches_run": dg.MetadataValue.int(len(batches)),
        "batch_ids": dg.MetadataValue.text(f"{batches[0]}..{batches[-1]}" if batches else "none (no new input)"),
        "input_rows": dg.MetadataValue.int(sum(_input_rows(p) for p in progress)),
        "source_offsets": dg.MetadataValue.json(offsets),
        "last_committed_batch": dg.MetadataValue.int(report["last_committed_batch"]
                                                     if report["last_committed_batch"] is not None else -1),
        "state_rows": dg.MetadataValue.int(state_rows),
        "state_bytes": dg.MetadataValue.int(state_bytes),
        "rollback_window": dg.MetadataValue.text(f"{w['earliest']}..{w['latest']}" if w["earliest"] is not None
                                                 else f"none ({w['earliest_reason']})"),
        "ledger_batches_recorded": dg.MetadataValue.int(ledger["batches_recorded"]),
        "checkpoint": dg.MetadataValue.path(query.checkpoint),
    }
    if sinks:
        md["sink_files"] = dg.MetadataValue.int(sum(s["files"] for s in report["sinks"]))
        md["sink_bytes"] = dg.MetadataValue.int(sum(s["bytes"] for s in report["sinks"]))
    md.update(on_call_metadata(ckpt, Ledger.for_checkpoint(ckpt), progress, w))
    return md, checked.findings


def on_call_metadata(ckpt, ledger, progress: list[dict], window: dict) -> dict:
    """What on call reads to pick a rollback target: each batch of the run with its time (from the offsets log)
    and its rows in and out, and the rollback window in times as well as batch ids (``rollback_to_time`` takes
    any time from the window's first to its last)."""
    ends = [b for b in (window["earliest"], window["latest"]) if b is not None]
    # committed batches only: a run with no new input reports an idle progress for the next batch id
    progress = [p for p in progress if p["batchId"] in ckpt.commit_files]
    times = batch_times(ckpt, [p["batchId"] for p in progress] + ends, ledger)
    rows = ["| batch | time (UTC) | input rows | output rows |", "|---|---|---|---|"]
    per_batch = []
    for p in progress:
        batch = p["batchId"]
        out_rows = (p.get("sink") or {}).get("numOutputRows")
        entry = {"batch": batch, "time": times[batch].time, "input_rows": _input_rows(p),
                 "output_rows": int(out_rows) if out_rows is not None and int(out_rows) >= 0 else None}
        per_batch.append(entry)
        rows.append(f"| {batch} | {entry['time'] or '?'} | {entry['input_rows']} | "
                    f"{entry['output_rows'] if entry['output_rows'] is not None else 'n/a'} |")
    md = {"batches": dg.MetadataValue.md("\n".join(rows) if per_batch else "no batch ran (no new input)"),
          "batch_details": dg.MetadataValue.json(per_batch)}
    if ends:
        first, last = times[window["earliest"]].time, times[window["latest"]].time
        md["rollback_window_times"] = dg.MetadataValue.text(f"{first or '?'}..{last or '?'}")
        md["rollback_window_detail"] = dg.MetadataValue.json({
            "earliest_batch": window["earliest"], "earliest_time": first,
            "latest_batch": window["latest"], "latest_time": last,
            "hint": "rollback_to_batch takes a batch id in this range; rollback_to_time the time of the batch to keep"})
    return md

