"""``checkpoint-ops backup``: incremental, verified, relocatable checkpoint backups."""

from __future__ import annotations

import sys

from ..cli import Parents, emit, run_operation, storage_options
from ..errors import EXIT_FINDINGS, EXIT_OK
from ..units import parse_duration


def _warn(note: str) -> None:
    """A notice on stderr, as ``run_operation``'s are."""
    print(f"checkpoint-ops: warning: {note}", file=sys.stderr, flush=True)


def cmd_backup_create(args) -> int:
    from ..backup import create_backup
    from ..operation import InterruptedAfterPublishing

    r = create_backup(args.checkpoint, args.dest, args.sink, storage_options(args), progress=not args.json,
                      source_compact_interval=args.source_compact_interval,
                      sink_compact_interval=args.sink_compact_interval,
                      without_recorded_sinks=args.without_recorded_sinks,
                      warn=_warn)
    try:
        _emit_backup(args, r)
    except KeyboardInterrupt:  # while the result was shown: the backup is published all the same
        raise InterruptedAfterPublishing(r["backup_id"], args.dest) from None
    return EXIT_OK


def _emit_backup(args, r: dict) -> None:
    at = f" at batch {r['batch']}" if r["batch"] is not None else ""
    emit(args, r, f"Backup {r['backup_id']} of {r['checkpoint']}{at}: {r['files']} files, {r['bytes']} bytes; new "
                  f"{r['new_objects']} objects, {r['new_bytes']} bytes (read {r['read_files']} changed files)"
                  + (f"; replaced {r['repaired_objects']} damaged object(s) (found bad by `backup verify`, of the "
                     "wrong size, or left part-written by an interrupted backup)" if r["repaired_objects"] else "")
                  + (f"; incremental to {r['parent']}" if r["parent"] else "") + f"\n  {r['manifest']}"
                  + (f"\n  also took {r['kept']}" if r.get("kept") else "")
                  + "".join(f"\n  WARNING: left out {s['url']!r}: {s['problem']}" for s in r["skipped_names"]))


def cmd_backup_list(args) -> int:
    from ..backup import Repository, list_backups

    rows = list_backups(Repository.open(args.dest, storage_options(args)))
    lines = [f"{len(rows)} backup(s) in {args.dest}" + (":" if rows else "")]
    for b in rows:
        planned = f" (+ planned {b.batch + 1})" if b.kept_planned else ""
        held = (f"{b.created}  {b.checkpoint}  batch {b.batch}{planned}  {b.files} files  {b.bytes} bytes (new {b.new_bytes})  "
                if b.damaged is None else "")
        lines.append(f"  {b.id}  {held}{b.describe_verification()}")
    emit(args, {"destination": args.dest, "backups": [b.to_dict() for b in rows]}, "\n".join(lines))
    return EXIT_OK


def cmd_backup_verify(args) -> int:
    from ..backup import Repository, verify_backups

    r = verify_backups(Repository.open(args.dest, storage_options(args)), args.backup_id)
    lines = [f"{len(r['backups'])} backup(s), {r['objects_checked']} objects checked: "
             + ("all good" if r["ok"] else f"{len(r['bad_objects'])} BAD")]
    for b in r["backups"]:
        for bad in b["bad"]:
            lines.append(f"  {b['backup_id']}: {bad['object']} ({bad['root']}/{bad['file']}): {bad['problem']}")
    for d in r["damaged"]:
        lines.append(f"  {d['id']}: DAMAGED, not verified: {d['manifest']} {d['problem']}")
    for backup_id in r["pruned_meanwhile"]:
        lines.append(f"  {backup_id}: deleted by a prune while it was verified (its objects may go with it): not "
                     "verified")
    emit(args, r, "\n".join(lines))
    return EXIT_OK if r["ok"] else EXIT_FINDINGS


def cmd_backup_restore(args) -> int:
    from ..backup.restore import RestoreOperation

    op = RestoreOperation(args.dest, args.backup_id, args.target, args.sink_target, args.relocate, args.to_batch,
                          storage_options(args))
    return run_operation(args, op)


def cmd_backup_prune(args) -> int:
    from ..backup.retention import BackupPruneOperation

    within = parse_duration(args.keep_within, "--keep-within") if args.keep_within else None
    op = BackupPruneOperation(args.dest, args.keep_last, within, storage_options(args),
                              temp_min_age_s=parse_duration(args.temp_min_age, "--temp-min-age"))
    return run_operation(args, op)


def cmd_backup_drill(args) -> int:
    from ..backup import Repository
    from ..compat import load_query
    from ..drill import run_drill
    from .compat import spark_session

    opts = storage_options(args)
    repo = Repository.open(args.dest, opts)
    build = load_query(args.query)
    with spark_session(args) as spark:
        result = run_drill(repo, args.backup_id, spark, build, scratch_url=args.scratch, relocate=args.relocate,
                           storage_options=opts, warn=_warn)
    emit(args, result.to_dict(), result.render())
    return EXIT_OK if result.passed else EXIT_FINDINGS


def register(sub, parents: Parents) -> None:
    from .compat import spark_parent

    p = sub.add_parser("backup", help="incremental, verified, relocatable checkpoint backups")
    bsub = p.add_subparsers(dest="backup_command", required=True, metavar="ACTION")

    q = bsub.add_parser("create", parents=[*parents.reading, parents.intervals, parents.sinks],
                        help="back up a checkpoint (and its sinks) at its last commit")
    q.add_argument("checkpoint", metavar="CHECKPOINT")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("--without-recorded-sinks", action="store_true",
                   help="back up the checkpoint although the batch ledger records file sinks of its query not given "
                   "with --sink (outputs abandoned on purpose)")
    q.set_defaults(func=cmd_backup_create)

    q = bsub.add_parser("list", parents=parents.reading, help="the backups at a destination")
    q.add_argument("dest", metavar="DEST_URL")
    q.set_defaults(func=cmd_backup_list)

    q = bsub.add_parser("verify", parents=parents.reading, help="re-read every stored object and check its hash")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("backup_id", metavar="BACKUP_ID", nargs="?")
    q.set_defaults(func=cmd_backup_verify)

    q = bsub.add_parser("restore", parents=[*parents.reading, parents.mutating],
                        help="restore a backup into an empty location")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("backup_id", metavar="BACKUP_ID")
    q.add_argument("target", metavar="TARGET_CHECKPOINT")
    q.add_argument("--sink-target", metavar="OUTPUT_PATH", action="append", default=[],
                   help="where each backed-up file sink goes (repeat, in the order they were backed up)")
    q.add_argument("--relocate", metavar="OLD=NEW", action="append", default=[],
                   help="rewrite paths under OLD to NEW in source logs, sink logs and the ledger (repeatable; either "
                   "path may hold '=', e.g. date=2026-11-21)")
    q.add_argument("--to-batch", type=int, metavar="M", help="roll the restored copy back to batch M")
    q.set_defaults(func=cmd_backup_restore)

    q = bsub.add_parser("drill", parents=[*parents.reading, spark_parent()],
                        help="restore a backup into scratch space and let Spark restart the query on it (noop sink): "
                        "does the backup restart?")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("backup_id", metavar="BACKUP_ID", nargs="?", help="default: the newest backup")
    q.add_argument("--relocate", metavar="OLD=NEW", action="append", default=[],
                   help="as for restore: rewrite paths under OLD to NEW in the restored logs (repeatable)")
    q.set_defaults(func=cmd_backup_drill)

    q = bsub.add_parser("prune", parents=[*parents.reading, parents.mutating],
                        help="delete old backups and the objects nothing needs")
    q.add_argument("dest", metavar="DEST_URL")
    q.add_argument("--keep-last", type=int, metavar="K", help="keep the newest K backups of each checkpoint")
    q.add_argument("--keep-within", metavar="DURATION", help="keep backups taken within DURATION (e.g. 7d)")
    q.add_argument("--temp-min-age", default="1h", metavar="DURATION",
                   help="remove leftovers of interrupted writes only once this old (default %(default)s)")
    q.set_defaults(func=cmd_backup_prune)
