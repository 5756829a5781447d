"""``checkpoint-ops``: the command line. Every command takes ``--json`` and ``--storage-options``.

Exit codes: 0 done/healthy, 1 findings or refused, 2 unusable input, 3 internal error (a bug).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback

from . import __version__
from .errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, BadInputError, CheckpointOpsError, RefusedError
from .model.checkpoint import Checkpoint, open_sink
from .model.compactible import SPARK_DEFAULT_COMPACT_INTERVAL

EXIT_INTERNAL = 3


def _storage_options(text: str | None) -> dict | None:
    if not text:
        return None
    try:
        opts = json.loads(text)
    except ValueError as e:
        raise BadInputError(f"--storage-options is not valid JSON: {e}",
                            fix='pass a JSON object, e.g. --storage-options \'{"anon": false}\'') from None
    if not isinstance(opts, dict):
        raise BadInputError("--storage-options must be a JSON object")
    return opts


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON (keys: docs/cli.md)")
    p.add_argument("--storage-options", metavar="JSON",
                   help="fsspec storage options as JSON (S3 also honours AWS_ENDPOINT_URL)")
    p.add_argument("--source-compact-interval", type=int, default=SPARK_DEFAULT_COMPACT_INTERVAL, metavar="N",
                   help="spark.sql.streaming.fileSource.log.compactInterval, if you changed it (only used when a "
                   "source log has a single .compact file; default %(default)s)")


def _sink_args(p: argparse.ArgumentParser, multiple: bool = True) -> None:
    p.add_argument("--sink", metavar="OUTPUT_PATH", action="append", default=[],
                   help="a file sink's output directory (holding _spark_metadata/)" + ("; repeatable" if multiple else ""))
    p.add_argument("--sink-compact-interval", type=int, default=SPARK_DEFAULT_COMPACT_INTERVAL, metavar="N",
                   help="spark.sql.streaming.fileSink.log.compactInterval, if you changed it (default %(default)s)")


def _open(args) -> tuple[Checkpoint, list]:
    opts = _storage_options(args.storage_options)
    ckpt = Checkpoint.open(args.checkpoint, opts, source_compact_interval=args.source_compact_interval)
    sinks = [open_sink(s, opts, getattr(args, "sink_compact_interval", SPARK_DEFAULT_COMPACT_INTERVAL))
             for s in getattr(args, "sink", [])]
    return ckpt, sinks


def _emit(args, data, text: str) -> None:
    if args.json:
        # Indented for a person at a terminal; one line for programs, which json's C encoder writes
        # many times faster (a large rollback plan lists tens of thousands of actions).
        indent = 2 if sys.stdout.isatty() else None
        print(json.dumps(data, indent=indent, default=str))
    else:
        print(text)


# ---- commands ---------------------------------------------------------------------------------


def cmd_inspect(args) -> int:
    from .inspect import inspect_checkpoint, render_inspect

    ckpt, sinks = _open(args)
    report = inspect_checkpoint(ckpt, sinks, ledger=_ledger(ckpt, args) if ckpt.kind == "structured" else None)
    _emit(args, report, render_inspect(report))
    return EXIT_OK


def cmd_offsets(args) -> int:
    from .inspect import batch_offsets, render_offsets

    ckpt, _ = _open(args)
    report = batch_offsets(ckpt, args.batch, ledger=_ledger(ckpt, args))
    _emit(args, report, render_offsets(report))
    return EXIT_OK


def cmd_fsck(args) -> int:
    from .fsck import render_findings, run_fsck

    ckpt, sinks = _open(args)
    findings = run_fsck(ckpt, sinks, deep=args.deep,
                        ledger=_ledger(ckpt, args) if ckpt.kind == "structured" else None)
    data = {
        "path": ckpt.url,
        "healthy": not findings,
        "findings": [f.to_dict() for f in findings],
    }
    _emit(args, data, render_findings(findings, ckpt.url))
    return EXIT_FINDINGS if findings else EXIT_OK


def _parse_time(text: str):
    from datetime import datetime, timezone

    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise BadInputError(f"--to-time {text!r} is not an ISO 8601 time",
                            fix="e.g. --to-time 2026-11-21T06:30:00Z (a time without offset is taken as UTC)") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _confirm(args, what: str) -> None:
    """Apply only with --yes, or after a 'y' on an interactive terminal."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise RefusedError(f"not applying {what} without confirmation",
                           fix="review it with --dry-run, then run again with --yes")
    answer = input(f"Apply {what}? [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise RefusedError("not applied: declined at the prompt")


def cmd_rollback(args) -> int:
    from .activity import refuse_if_active
    from .executor import Anchor, apply_plan, resume
    from .rollback import plan_rollback

    ckpt, sinks = _open(args)
    progress = not args.json
    if args.resume:
        if args.to_batch is not None or args.to_time is not None:
            raise BadInputError("--resume finishes the interrupted rollback's own plan: drop --to-batch/--to-time")
        refuse_if_active(ckpt, args.force)
        result = resume(Anchor.of_checkpoint(ckpt), _storage_options(args.storage_options), progress)
        _emit(args, {"resumed": True, "result": result},
              f"Resumed and finished {result['op_id']} (plan {result['plan_hash'][:12]}); last committed batch is now "
              f"{result['target_batch']}")
        return EXIT_OK
    if args.to_batch is None and args.to_time is None:
        raise BadInputError("give --to-batch N or --to-time ISO8601 (or --resume)")
    refuse_if_active(ckpt, args.force)
    ledger = _ledger(ckpt, args)
    plan = plan_rollback(ckpt, args.to_batch, _parse_time(args.to_time) if args.to_time else None, sinks,
                         keep_files=args.keep_files, ledger=ledger, force=args.force)
    if args.dry_run or plan.empty:
        _emit(args, {"dry_run": bool(args.dry_run), "plan": plan.to_dict() if args.json else None},
              plan.render(verbose=args.verbose))
        return EXIT_OK
    if args.plan_hash and not plan.hash.startswith(args.plan_hash):
        raise RefusedError(f"the plan changed since it was reviewed: now {plan.hash[:12]}, expected {args.plan_hash}",
                           path=ckpt.url, fix="review the new plan with --dry-run")
    if not args.json:
        print(plan.render(verbose=args.verbose))
    _confirm(args, f"plan {plan.hash[:12]}")
    roots = {"checkpoint": (ckpt.fm, ckpt.root), **{f"sink{i}": (s.fm, s.root) for i, s in enumerate(sinks)}}
    result = apply_plan(plan, Anchor.of_checkpoint(ckpt), roots, _storage_options(args.storage_options), progress)
    _emit(args, {"dry_run": False, "plan": plan.to_dict() if args.json else None, "result": result},
          f"Applied plan {plan.hash[:12]} ({result['op_id']}): last committed batch is now {plan.target_batch}. "
          f"Undo with: checkpoint-ops undo {ckpt.url}")
    return EXIT_OK


def _anchor(args):
    """What a journal-level command (undo, resume, history, prune) acts on: a checkpoint, or the
    output of a file sink whose operations had no checkpoint."""
    from .activity import refuse_if_active
    from .executor import Anchor
    from .model.sink import SINK_LOG_DIR
    from .storage import open_file_manager

    from .journal import ops_dir, scan_journals

    opts = _storage_options(args.storage_options)
    fm, root = open_file_manager(args.checkpoint, opts)
    ckpt = Checkpoint(fm, root, source_compact_interval=args.source_compact_interval)
    if ckpt.kind == "unknown" and ckpt.listing.has_dir(SINK_LOG_DIR):
        return Anchor(fm, root, fm.url(root), None, checkpoint=False)
    only_litter = all(rel.rsplit("/", 1)[-1].startswith(".") for rel in ckpt.listing.files)
    if only_litter and scan_journals(fm, ops_dir(fm, root)):
        return Anchor.of_checkpoint(ckpt)  # a restore that stopped before its first file: its journal says so
    ckpt.require_checkpoint(args.checkpoint)
    if getattr(args, "force", None) is not None:
        refuse_if_active(ckpt, args.force)
    return Anchor.of_checkpoint(ckpt)


def cmd_undo(args) -> int:
    from .executor import find_journal, undo

    anchor = _anchor(args)
    journal, state = find_journal(anchor, "undo")
    if not args.json:
        plan = journal.record["plan"]
        c = plan["counts"]
        print(f"Undo {journal.op_id} ({state}): {journal.record['operation']}"
              + (f" to batch {plan['target_batch']}" if plan.get("target_batch") is not None else "")
              + f", plan {plan['plan_hash'][:12]}, restoring {c['delete'] + c['keep'] + c.get('replace', 0)} files "
              f"and removing {c['write']}")
    _confirm(args, f"undo of {journal.op_id}")
    result = undo(anchor, _storage_options(args.storage_options), not args.json)
    _emit(args, {"result": result}, f"Undone {result['op_id']}: everything it changed is as it was before it.")
    return EXIT_OK


def cmd_resume(args) -> int:
    from .executor import resume

    anchor = _anchor(args)
    result = resume(anchor, _storage_options(args.storage_options), not args.json)
    _emit(args, {"resumed": True, "result": result},
          f"Resumed and finished {result['op_id']} ({result['operation']}, plan {result['plan_hash'][:12]})")
    return EXIT_OK


def cmd_history(args) -> int:
    from .prune import history

    anchor = _anchor(args)
    entries = [{k: v for k, v in e.items() if not k.startswith("_")} for e in history(anchor)]
    lines = [f"{len(entries)} operation(s) journaled for {anchor.url}" + (":" if entries else "")]
    for e in entries:
        c = e["counts"]
        target = f" to batch {e['target_batch']}" if e["target_batch"] is not None else ""
        lines.append(f"  {e['op_id']}  {e['operation']}{target}  {e['status']}, undo record "
                     f"{e['undo_record']}  (deleted {c['delete']}, wrote {c['write']}, rewrote {c.get('replace', 0)}, "
                     f"moved {c['keep']})")
    _emit(args, {"checkpoint": anchor.url, "operations": entries}, "\n".join(lines))
    return EXIT_OK


def cmd_prune(args) -> int:
    from .prune import apply_prune, plan_prune

    anchor = _anchor(args)
    opts = _storage_options(args.storage_options)
    plan = plan_prune(anchor, args.keep_last, args.older_than, opts)
    nothing = plan.summary["prune"] == "nothing"
    if args.dry_run or nothing:
        _emit(args, {"dry_run": bool(args.dry_run), "plan": plan.to_dict() if args.json else None},
              plan.render(verbose=args.verbose))
        return EXIT_OK
    if not args.json:
        print(plan.render(verbose=args.verbose))
    _confirm(args, f"pruning of {len(plan.summary['prune'])} undo record(s)")
    result = apply_prune(plan, anchor, opts)
    _emit(args, {"dry_run": False, "plan": plan.to_dict() if args.json else None, "result": result},
          f"Pruned {', '.join(result['pruned'])}: deleted {result['files_deleted']} file(s); "
          "these operations can no longer be undone.")
    return EXIT_OK


def cmd_ledger_sync(args) -> int:
    from .ledger import sync

    ckpt, sinks = _open(args)
    r = sync(ckpt, sinks)
    rng = f"batches {r['range']['first']}..{r['range']['last']}" if r["range"] else "nothing new"
    text = (f"Ledger {r['ledger']}: recorded {r['batches_recorded']} batch(es) ({rng}); "
            + ", ".join(f"{n} sink batch(es) of {u}" for u, n in r["sink_batches_recorded"].items()))
    for d in r["skipped"]:
        text += f"\n  skipped (damaged, not recorded): {d['path']}: {d['problem']}"
    _emit(args, r, text)
    return EXIT_FINDINGS if r["skipped"] else EXIT_OK


def cmd_ledger_show(args) -> int:
    from .ledger import Ledger

    ckpt, _ = _open(args)
    ledger = Ledger.for_checkpoint(ckpt)
    if args.batch is None:
        batches = sorted(ledger.records)
        data = {"ledger": ledger.fm.url(ledger.path), "segments": ledger.segments,
                "batches": {"first": batches[0] if batches else None, "last": batches[-1] if batches else None,
                            "count": len(batches)}}
        text = (f"Ledger {data['ledger']}: {len(batches)} batch(es)"
                + (f" ({batches[0]}..{batches[-1]})" if batches else "") + f" in {len(ledger.segments)} segment(s)")
        _emit(args, data, text)
        return EXIT_OK
    rec = ledger.records.get(args.batch)
    if rec is None:
        raise BadInputError(f"the ledger has no record of batch {args.batch}", path=ledger.fm.url(ledger.path),
                            fix="`checkpoint-ops ledger show CHECKPOINT` lists the batches it has")
    sinks = {}
    for url, s in rec.get("sinks", {}).items():
        files = [json.loads(e) for e in s["entries"]]
        sinks[url] = [{"path": f["path"], "size": f["size"], "mtime_ms": f["modificationTime"]} for f in files]
    data = {"batch": args.batch, "timestamp_ms": rec.get("timestamp_ms"), "watermark_ms": rec.get("watermark_ms"),
            "source_offsets": rec.get("source_offsets"), "state": rec.get("state"), "sink_files": sinks}
    lines = [f"Batch {args.batch}: source offsets {data['source_offsets']}, state {data['state']}"]
    for url, files in sinks.items():
        lines.append(f"  wrote {len(files)} file(s) to {url}:")
        lines += [f"    {f['path']} ({f['size']} bytes)" for f in files]
    _emit(args, data, "\n".join(lines))
    return EXIT_OK


# ---- sink ---------------------------------------------------------------------------------------


def _sink_context(args, data: bool = False):
    from .sinklog import open_context

    return open_context(args.output, getattr(args, "checkpoint", None), _storage_options(args.storage_options),
                        args.sink_compact_interval, data=data)


def _refuse_if_sink_active(args, ctx) -> None:
    from .activity import refuse_if_active, sink_active_reasons

    if ctx.ckpt is not None:
        refuse_if_active(ctx.ckpt, args.force)
        return
    reasons = sink_active_reasons(ctx.sink)
    if reasons and not args.force:
        raise RefusedError("the query writing this sink looks active: " + "; ".join(reasons), path=ctx.sink.url,
                           fix="stop the query and try again (pass --checkpoint so its lease is checked too); --force "
                           "overrides this check")


def _apply_sink_plan(args, ctx, build, what: str, report_only: bool = False) -> int:
    """Dry run, or plan (staging rewrites), show, confirm and apply: as rollback does."""
    from .sinklog import apply, clear_staging, sweep_staging

    if args.dry_run or report_only:
        plan = build(stage=False)
        _emit(args, {"dry_run": True, "plan": plan.to_dict() if args.json else None}, plan.render(verbose=args.verbose))
        return EXIT_OK
    _refuse_if_sink_active(args, ctx)
    sweep_staging(ctx)
    plan = build(stage=True)
    try:
        if plan.empty:
            _emit(args, {"dry_run": False, "plan": plan.to_dict() if args.json else None, "result": None},
                  plan.render(verbose=args.verbose))
            return EXIT_OK
        if args.plan_hash and not plan.hash.startswith(args.plan_hash):
            raise RefusedError(f"the plan changed since it was reviewed: now {plan.hash[:12]}, expected {args.plan_hash}",
                               path=ctx.sink.url, fix="review the new plan with --dry-run")
        if not args.json:
            print(plan.render(verbose=args.verbose))
        _confirm(args, f"{what} plan {plan.hash[:12]}")
    except BaseException:
        clear_staging(ctx, plan)
        raise
    result = apply(ctx, plan, _storage_options(args.storage_options), not args.json)
    _emit(args, {"dry_run": False, "plan": plan.to_dict() if args.json else None, "result": result},
          f"Applied {what} plan {plan.hash[:12]} ({result['op_id']}). Undo with: checkpoint-ops undo "
          f"{ctx.anchor.url}")
    return EXIT_OK


def cmd_sink_files(args) -> int:
    from .sinklog import batch_files

    ctx = _sink_context(args)
    r = batch_files(ctx, args.batch)
    lines = [f"Batch {r['batch']} wrote {len(r['files'])} file(s), {r['bytes']} bytes, to {r['output']} "
             f"(from the {r['source']}):"]
    lines += [f"  {f['path']} ({f['size']} bytes)" for f in r["files"]]
    _emit(args, r, "\n".join(lines))
    return EXIT_OK


def cmd_sink_compact(args) -> int:
    from .sinklog import plan_compact

    ctx = _sink_context(args, data=args.drop_missing)
    return _apply_sink_plan(args, ctx, lambda stage: plan_compact(ctx, args.drop_missing, stage), "sink compaction")


def cmd_sink_retain(args) -> int:
    from .sinklog import parse_duration, plan_retain

    older = parse_duration(args.older_than) if args.older_than else None
    ctx = _sink_context(args, data=args.delete_files)
    return _apply_sink_plan(args, ctx, lambda stage: plan_retain(ctx, args.keep_after_batch, older,
                                                                 args.delete_files, stage), "sink retention")


def cmd_sink_orphans(args) -> int:
    from .sinklog import parse_duration, plan_orphans

    ctx = _sink_context(args, data=True)
    min_age = parse_duration(args.min_age)
    return _apply_sink_plan(args, ctx, lambda stage: plan_orphans(ctx, min_age, args.delete, args.quarantine),
                            "orphan cleanup", report_only=not (args.delete or args.quarantine))


def _sink_command(sub, name: str, func, help: str, mutating: bool = True, checkpoint: str = "optional"):
    p = sub.add_parser(name, help=help)
    p.add_argument("output", metavar="OUTPUT_PATH", help="the file sink's output directory (holding _spark_metadata/)")
    if checkpoint != "none":
        p.add_argument("--checkpoint", metavar="CKPT", required=checkpoint == "required",
                       help="the query's checkpoint: its batch ledger is used, its lease checked, and it is fenced "
                       "while the operation runs")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON (keys: docs/cli.md)")
    p.add_argument("--storage-options", metavar="JSON", help="fsspec storage options as JSON")
    p.add_argument("--sink-compact-interval", type=int, default=SPARK_DEFAULT_COMPACT_INTERVAL, metavar="N",
                   help="spark.sql.streaming.fileSink.log.compactInterval, if you changed it (default %(default)s)")
    if mutating:
        p.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
        p.add_argument("--yes", "-y", action="store_true", help="apply without asking")
        p.add_argument("--force", action="store_true", help="skip the check that the query is not running")
        p.add_argument("--plan-hash", metavar="HASH", help="apply only if the plan's hash starts with HASH")
        p.add_argument("--verbose", "-v", action="store_true", help="list every file in the printed plan")
    p.set_defaults(func=func)
    return p


# ---- backup -------------------------------------------------------------------------------------


def cmd_backup_create(args) -> int:
    from .backup import create_backup

    r = create_backup(args.checkpoint, args.dest, args.sink, _storage_options(args.storage_options),
                      progress=not args.json, source_compact_interval=args.source_compact_interval,
                      sink_compact_interval=args.sink_compact_interval)
    at = f" at batch {r['batch']}" if r["batch"] is not None else ""
    _emit(args, r, f"Backup {r['backup_id']} of {r['checkpoint']}{at}: {r['files']} files, {r['bytes']} bytes; new "
                   f"{r['new_objects']} objects, {r['new_bytes']} bytes (read {r['read_files']} changed files)"
                   + (f"; incremental to {r['parent']}" if r["parent"] else "") + f"\n  {r['manifest']}")
    return EXIT_OK


def cmd_backup_list(args) -> int:
    from .backup import Repository, list_backups

    rows = list_backups(Repository.open(args.dest, _storage_options(args.storage_options)))
    lines = [f"{len(rows)} backup(s) in {args.dest}" + (":" if rows else "")]
    for b in rows:
        lines.append(f"  {b['id']}  {b['created']}  {b['checkpoint']}  batch {b['batch']}  {b['files']} files  "
                     f"{b['bytes']} bytes (new {b['new_bytes']})  verified: {b['verified'] or 'never'}")
    _emit(args, {"destination": args.dest, "backups": rows}, "\n".join(lines))
    return EXIT_OK


def cmd_backup_verify(args) -> int:
    from .backup import Repository, verify_backups

    r = verify_backups(Repository.open(args.dest, _storage_options(args.storage_options)), args.backup_id)
    lines = [f"{len(r['backups'])} backup(s), {r['objects_checked']} objects checked: "
             + ("all good" if r["ok"] else f"{len(r['bad_objects'])} BAD")]
    for b in r["backups"]:
        for bad in b["bad"]:
            lines.append(f"  {b['backup_id']}: {bad['object']} ({bad['root']}/{bad['file']}): {bad['problem']}")
    _emit(args, r, "\n".join(lines))
    return EXIT_OK if r["ok"] else EXIT_FINDINGS


def cmd_backup_restore(args) -> int:
    from .backup import Repository, plan_restore, restore_backup
    from .backup.restore import clear_staged

    opts = _storage_options(args.storage_options)
    repo = Repository.open(args.dest, opts)
    rp = plan_restore(repo, args.backup_id, args.target, args.sink_target, args.relocate, args.to_batch, opts,
                      stage=not args.dry_run)
    if args.dry_run:
        _emit(args, {"dry_run": True, "plan": rp.plan.to_dict() if args.json else None},
              rp.plan.render(verbose=args.verbose))
        return EXIT_OK
    try:
        if not args.json:
            print(rp.plan.render(verbose=args.verbose))
        _confirm(args, f"restore plan {rp.plan.hash[:12]}")
    except BaseException:
        clear_staged(rp)
        raise
    result = restore_backup(rp, repo, opts, progress=not args.json)
    _emit(args, {"dry_run": False, "plan": rp.plan.to_dict() if args.json else None, "result": result},
          f"Restored backup {args.backup_id} into {args.target} ({result['op_id']}); batch "
          f"{rp.plan.target_batch} is the last committed one. Undo with: checkpoint-ops undo {args.target}")
    return EXIT_OK


def cmd_backup_prune(args) -> int:
    from .backup import Repository, apply_backup_prune, plan_backup_prune
    from .sinklog import parse_duration

    repo = Repository.open(args.dest, _storage_options(args.storage_options))
    within = parse_duration(args.keep_within) if args.keep_within else None
    plan = plan_backup_prune(repo, args.keep_last, within)
    if args.dry_run or plan.empty:
        _emit(args, {"dry_run": bool(args.dry_run), "plan": plan.to_dict() if args.json else None},
              plan.render(verbose=args.verbose))
        return EXIT_OK
    if not args.json:
        print(plan.render(verbose=args.verbose))
    _confirm(args, f"deleting backups {plan.summary['delete']}")
    r = apply_backup_prune(repo, plan)
    _emit(args, {"dry_run": False, "plan": plan.to_dict() if args.json else None, "result": r},
          f"Deleted {r['manifests_deleted']} backup(s) and {r['objects_deleted']} unreferenced objects "
          f"({r['bytes_deleted']} bytes)" + (f"; {r['note']}" if r.get("note") else ""))
    return EXIT_OK


def cmd_backup_drill(args) -> int:
    from .backup import Repository
    from .compat import load_query
    from .drill import run_drill

    opts = _storage_options(args.storage_options)
    repo = Repository.open(args.dest, opts)
    build = load_query(args.query)
    with _spark(args) as spark:
        result = run_drill(repo, args.backup_id, spark, build, scratch_url=args.scratch, relocate=args.relocate,
                           storage_options=opts)
    _emit(args, result.to_dict(), result.render())
    return EXIT_OK if result.passed else EXIT_FINDINGS


def cmd_compat(args) -> int:
    from .compat import accept, check_compat, load_query

    ckpt, _ = _open(args)
    build = load_query(args.query)
    with _spark(args) as spark:
        report = check_compat(ckpt, spark, build, old_sinks=args.sink, scratch_url=args.scratch,
                              storage_options=_storage_options(args.storage_options))
    text = report.render()
    if args.record:
        recorded = accept(ckpt, report)
        text += "\nrecorded the query's profile beside the checkpoint" if recorded else \
            "\nnot recorded: Spark refuses this query"
    _emit(args, report.to_dict(), text)
    return report.exit_code


@contextlib.contextmanager
def _spark(args):
    """The Spark session ``--query`` functions get: the active one if any, else a new local (or
    ``--spark-remote``) session, stopped afterwards. pyspark is imported here only."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and not args.spark_remote:
        yield active
        return
    builder = SparkSession.builder.appName("checkpoint-ops")
    if args.spark_remote:
        builder = builder.remote(args.spark_remote)
    else:
        builder = builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    for text in args.spark_conf:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise BadInputError(f"--spark-conf {text!r} is not KEY=VALUE", fix="e.g. --spark-conf spark.master=local[4]")
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def _spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--query", required=True, metavar="MODULE:FUNCTION",
                   help="FUNCTION(spark) returns the query's unstarted DataStreamWriter (the module is imported from "
                   "the current directory or PYTHONPATH)")
    p.add_argument("--scratch", metavar="DIR", help="where Spark restarts the copy (default: a temporary directory; "
                   "with a cluster, a location its executors reach)")
    p.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", default=[],
                   help="a Spark setting for the session (repeatable; e.g. spark.master=local[4])")
    p.add_argument("--spark-remote", metavar="sc://HOST:PORT", help="use a Spark Connect server")


def _backup_command(sub, name: str, func, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help)
    p.set_defaults(func=func)
    return p


def _backup_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON (keys: docs/cli.md)")
    p.add_argument("--storage-options", metavar="JSON", help="fsspec storage options as JSON (both ends)")


def _ledger(ckpt: Checkpoint, args):
    """The checkpoint's batch ledger (read only if Spark's own files do not answer)."""
    from .ledger import Ledger

    try:
        return Ledger.for_checkpoint(ckpt)
    except BadInputError:
        return None  # a bucket-root checkpoint has no place for a ledger


def _command(sub, name: str, func, help: str, sinks: bool = False) -> argparse.ArgumentParser:
    """A subcommand taking CHECKPOINT and the common options (and --sink if ``sinks``)."""
    p = sub.add_parser(name, help=help)
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    _common(p)
    if sinks:
        _sink_args(p)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="checkpoint-ops",
        description="Safe, audited operations on Spark Structured Streaming checkpoints.",
        epilog="Exit codes: 0 done/healthy, 1 findings or refused, 2 unusable input, 3 internal error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _command(sub, "inspect", cmd_inspect, "summarise a checkpoint (batches, sources, state, rollback window)", sinks=True)

    p = _command(sub, "offsets", cmd_offsets, "the source offsets batch N started from and ended at")
    p.add_argument("--batch", type=int, required=True, metavar="N")

    p = _command(sub, "fsck", cmd_fsck, "check a checkpoint (and sinks) for anything that breaks a restart", sinks=True)
    p.add_argument("--deep", action="store_true",
                   help="also verify every checksum sidecar against its file (reads every file)")

    p = _command(sub, "rollback", cmd_rollback,
                 "roll a checkpoint and its file sinks back to a batch (journaled, undoable)", sinks=True)
    target = p.add_mutually_exclusive_group()
    target.add_argument("--to-batch", type=int, metavar="N", help="the batch that will be the last committed one")
    target.add_argument("--to-time", metavar="ISO8601",
                        help="roll back to the last batch planned at or before this time (batchTimestampMs)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    p.add_argument("--keep-files", metavar="DIR", help="move the sink data files of rolled-back batches here instead "
                   "of deleting them")
    p.add_argument("--yes", "-y", action="store_true", help="apply without asking")
    p.add_argument("--resume", action="store_true", help="finish an interrupted rollback (its journaled plan)")
    p.add_argument("--force", action="store_true", help="skip the check that no query is running, and go ahead "
                   "without a metadata file (Spark would start the query under a new id)")
    p.add_argument("--plan-hash", metavar="HASH", help="apply only if the plan's hash starts with HASH (from --dry-run)")
    p.add_argument("--verbose", "-v", action="store_true", help="list every file in the printed plan")

    p = _command(sub, "compat", cmd_compat, "will a changed query restart from this checkpoint, and behave as "
                 "its code says? (Spark restarts it on a scratch copy against a noop sink)", sinks=True)
    _spark_args(p)
    p.add_argument("--record", action="store_true", help="record the query's profile beside the checkpoint when "
                   "Spark accepts it (the next compat compares sink, output mode and source options with it)")

    p = _command(sub, "undo", cmd_undo, "revert the last rollback (or an interrupted one) byte for byte")
    p.add_argument("--yes", "-y", action="store_true", help="undo without asking")
    p.add_argument("--force", action="store_true", help="skip the check that no query is running")

    _command(sub, "history", cmd_history, "the operations journaled for a checkpoint (or a sink output), and "
             "which can be undone")

    p = _command(sub, "resume", cmd_resume, "finish an interrupted operation (its journaled plan)")
    p.add_argument("--force", action="store_true", help="skip the check that no query is running")

    p = _command(sub, "prune", cmd_prune, "delete the undo records (trash) of older finished operations")
    p.add_argument("--keep-last", type=int, metavar="K", help="keep the newest K applied operations undoable")
    p.add_argument("--older-than", type=float, metavar="DAYS",
                   help="prune only operations created more than DAYS ago")
    p.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    p.add_argument("--yes", "-y", action="store_true", help="apply without asking")
    p.add_argument("--verbose", "-v", action="store_true", help="list every file in the printed plan")

    p = sub.add_parser("sink", help="a file sink's log at batch granularity: files of a batch, compaction, "
                       "retention, orphans")
    ssub = p.add_subparsers(dest="sink_command", required=True, metavar="ACTION")
    q = _sink_command(ssub, "files", cmd_sink_files, "the files batch N wrote (from Spark's log, else the ledger)",
                      mutating=False)
    q.add_argument("--batch", type=int, required=True, metavar="N")
    q = _sink_command(ssub, "compact", cmd_sink_compact, "offline compaction Spark keeps reading and compacting after")
    q.add_argument("--drop-missing", action="store_true", help="drop entries whose data file is gone (readers would "
                   "fail on them)")
    q = _sink_command(ssub, "retain", cmd_sink_retain, "drop whole old batches from the log (and their files)",
                      checkpoint="required")
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--keep-after-batch", type=int, metavar="N", help="drop batches up to and including N")
    g.add_argument("--older-than", metavar="DURATION", help="drop batches that ran longer ago (e.g. 30d, 12h)")
    q.add_argument("--delete-files", action="store_true", help="also delete the dropped batches' data files")
    q = _sink_command(ssub, "orphans", cmd_sink_orphans, "data files no log entry references", checkpoint="none")
    q.add_argument("--min-age", default="1h", metavar="DURATION",
                   help="only files older than this (in-flight writers are younger; default %(default)s)")
    g = q.add_mutually_exclusive_group()
    g.add_argument("--delete", action="store_true", help="delete them (kept for undo until pruned)")
    g.add_argument("--quarantine", metavar="DIR", help="move them into DIR")

    p = sub.add_parser("backup", help="incremental, verified, relocatable checkpoint backups")
    bsub = p.add_subparsers(dest="backup_command", required=True, metavar="ACTION")
    q = _backup_command(bsub, "create", cmd_backup_create, "back up a checkpoint (and its sinks) at its last commit")
    q.add_argument("checkpoint", metavar="CHECKPOINT")
    q.add_argument("dest", metavar="DEST_URL")
    _common(q)
    _sink_args(q)
    q = _backup_command(bsub, "list", cmd_backup_list, "the backups at a destination")
    q.add_argument("dest", metavar="DEST_URL")
    _backup_common(q)
    q = _backup_command(bsub, "verify", cmd_backup_verify, "re-read every stored object and check its hash")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("backup_id", metavar="BACKUP_ID", nargs="?")
    _backup_common(q)
    q = _backup_command(bsub, "restore", cmd_backup_restore, "restore a backup into an empty location")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("backup_id", metavar="BACKUP_ID")
    q.add_argument("target", metavar="TARGET_CHECKPOINT")
    q.add_argument("--sink-target", metavar="OUTPUT_PATH", action="append", default=[],
                   help="where each backed-up file sink goes (repeat, in the order they were backed up)")
    q.add_argument("--relocate", metavar="OLD=NEW", action="append", default=[],
                   help="rewrite paths under OLD to NEW in source logs, sink logs and the ledger (repeatable)")
    q.add_argument("--to-batch", type=int, metavar="M", help="roll the restored copy back to batch M")
    q.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    q.add_argument("--yes", "-y", action="store_true", help="apply without asking")
    q.add_argument("--verbose", "-v", action="store_true", help="list every file in the printed plan")
    _backup_common(q)
    q = _backup_command(bsub, "drill", cmd_backup_drill, "restore a backup into scratch space and let Spark restart "
                        "the query on it (noop sink): does the backup restart?")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("backup_id", metavar="BACKUP_ID", nargs="?", help="default: the newest backup")
    q.add_argument("--relocate", metavar="OLD=NEW", action="append", default=[],
                   help="as for restore: rewrite paths under OLD to NEW in the restored logs (repeatable)")
    _spark_args(q)
    _backup_common(q)
    q = _backup_command(bsub, "prune", cmd_backup_prune, "delete old backups and the objects nothing needs")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("--keep-last", type=int, metavar="K", help="keep the newest K backups of each checkpoint")
    q.add_argument("--keep-within", metavar="DURATION", help="keep backups taken within DURATION (e.g. 7d)")
    q.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    q.add_argument("--yes", "-y", action="store_true", help="apply without asking")
    q.add_argument("--verbose", "-v", action="store_true", help="list every file in the printed plan")
    _backup_common(q)

    p = sub.add_parser("ledger", help="the batch ledger: which files each batch wrote, kept past compaction")
    lsub = p.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    _command(lsub, "sync", cmd_ledger_sync, "record every batch Spark's files still describe", sinks=True)
    q = _command(lsub, "show", cmd_ledger_show, "what the ledger knows (one batch with --batch)")
    q.add_argument("--batch", type=int, metavar="N")
    return parser


def _is_storage_client_error(e: Exception) -> bool:
    """Errors of the object-store clients (no credentials, endpoint unreachable, access denied)."""
    return type(e).__module__.split(".")[0] in ("botocore", "aiobotocore", "s3fs", "gcsfs", "adlfs", "aiohttp")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CheckpointOpsError as e:
        if getattr(args, "json", False):
            print(json.dumps(e.to_dict(), indent=2))
        print(f"checkpoint-ops: {e.render()}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("checkpoint-ops: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:  # a bug, or a storage failure we did not anticipate
        if isinstance(e, OSError) or _is_storage_client_error(e):
            print(f"checkpoint-ops: storage error: {e}", file=sys.stderr)
            print("  fix: check the location, credentials (AWS_* / --storage-options) and the endpoint",
                  file=sys.stderr)
            if getattr(args, "json", False):
                print(json.dumps({"error": "StorageError", "problem": str(e)}))
            return EXIT_BAD_INPUT
        traceback.print_exc()
        print(f"checkpoint-ops: internal error ({type(e).__name__}): please report it with the traceback above",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
