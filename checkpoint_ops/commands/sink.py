"""``checkpoint-ops sink``: a file sink's log at batch granularity."""

from __future__ import annotations

from ..cli import Parents, emit, run_operation, storage_options
from ..errors import EXIT_OK, BadInputError
from ..units import parse_duration


def cmd_sink_files(args) -> int:
    from ..sinklog import batch_files, files_as_of_batch, open_context

    if (args.batch is None) == (args.as_of_batch is None):
        raise BadInputError("give exactly one of --batch N (the files batch N wrote) and --as-of-batch N (the whole "
                            "output as it was after batch N)")
    ctx = open_context(args.output, args.checkpoint, storage_options(args), args.sink_compact_interval)
    if args.as_of_batch is not None:
        snap = files_as_of_batch(ctx, args.as_of_batch)
        lines = [f"The output {snap.output} as of batch {snap.as_of_batch}: {len(snap.paths)} file(s), {snap.bytes} "
                 f"bytes (from the {snap.source}); read it with spark.read.parquet(*paths):"]
        lines += [f"  {path}" for path in snap.paths]
        emit(args, snap.to_dict(), "\n".join(lines))
        return EXIT_OK
    r = batch_files(ctx, args.batch)
    lines = [f"Batch {r['batch']} wrote {len(r['files'])} file(s), {r['bytes']} bytes, to {r['output']} "
             f"(from the {r['source']}):"]
    lines += [f"  {f['path']} ({f['size']} bytes)" for f in r["files"]]
    emit(args, r, "\n".join(lines))
    return EXIT_OK


def _common(args) -> dict:
    return {"storage_options": storage_options(args), "compact_interval": args.sink_compact_interval}


def cmd_sink_compact(args) -> int:
    from ..sinklog import SinkCompactOperation

    return run_operation(args, SinkCompactOperation(args.output, args.checkpoint, args.drop_missing, **_common(args)))


def cmd_sink_retain(args) -> int:
    from ..sinklog import SinkRetainOperation

    older = parse_duration(args.older_than, "--older-than") if args.older_than else None
    op = SinkRetainOperation(args.output, args.checkpoint, args.keep_after_batch, older, args.delete_files,
                             drop_every_batch=args.force, **_common(args))
    return run_operation(args, op)


def cmd_sink_orphans(args) -> int:
    from ..sinklog import SinkOrphansOperation

    op = SinkOrphansOperation(args.output, args.checkpoint, parse_duration(args.min_age, "--min-age"), args.delete,
                              args.quarantine, **_common(args))
    if not (args.delete or args.quarantine):
        args.dry_run = True  # without --delete or --quarantine it only lists them
    return run_operation(args, op)


def _command(ssub, parents: Parents, name: str, func, help: str, mutating: bool = True,
             checkpoint_required: bool = False):
    extra = [parents.mutating] if mutating else []
    p = ssub.add_parser(name, parents=[*parents.reading, parents.intervals, *extra], help=help)
    p.add_argument("output", metavar="OUTPUT_PATH", help="the file sink's output directory (holding _spark_metadata/)")
    p.add_argument("--checkpoint", metavar="CKPT", required=checkpoint_required,
                   help="the query's checkpoint: its batch ledger is used, its lease taken, and it is fenced "
                   "while the operation runs")
    p.set_defaults(func=func)
    return p


def register(sub, parents: Parents) -> None:
    p = sub.add_parser("sink", help="a file sink's log at batch granularity: files of a batch, compaction, "
                       "retention, orphans")
    ssub = p.add_subparsers(dest="sink_command", required=True, metavar="ACTION")
    q = _command(ssub, parents, "files", cmd_sink_files, "the files batch N wrote, or (--as-of-batch) the whole output "
                 "as it was after batch N (from Spark's log, else the ledger)", mutating=False)
    q.add_argument("--batch", type=int, metavar="N", help="the files batch N wrote")
    q.add_argument("--as-of-batch", type=int, metavar="N", help="every file of the output as it was right after "
                   "batch N, to read with spark.read.parquet(*paths) (time travel; nothing is rolled back)")
    q = _command(ssub, parents, "compact", cmd_sink_compact,
                 "offline compaction Spark keeps reading and compacting after")
    q.add_argument("--drop-missing", action="store_true", help="drop entries whose data file is gone (readers would "
                   "fail on them)")
    q = _command(ssub, parents, "retain", cmd_sink_retain, "drop whole old batches from the log (and their files)",
                 checkpoint_required=True)
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--keep-after-batch", type=int, metavar="N", help="drop batches up to and including N")
    g.add_argument("--older-than", metavar="DURATION", help="drop batches that ran longer ago (e.g. 30d, 12h)")
    q.add_argument("--delete-files", action="store_true", help="also delete the dropped batches' data files")
    q = _command(ssub, parents, "orphans", cmd_sink_orphans, "data files no log entry references")
    q.add_argument("--min-age", default="1h", metavar="DURATION",
                   help="only files older than this (in-flight writers are younger; default %(default)s)")
    g = q.add_mutually_exclusive_group()
    g.add_argument("--delete", action="store_true", help="delete them (kept for undo until pruned)")
    g.add_argument("--quarantine", metavar="DIR", help="move them into DIR")
