"""Journaled operations on a checkpoint: ``rollback``, ``undo``, ``resume``, ``history``, ``prune``."""

from __future__ import annotations

from ..cli import Parents, emit, run_operation, storage_options
from ..errors import EXIT_OK, BadInputError
from ..units import parse_duration, parse_time


def cmd_rollback(args) -> int:
    from ..recovery import ResumeOperation
    from ..rollback import RollbackOperation

    opts = storage_options(args)
    if args.resume:  # the older spelling of `resume`, for a rollback
        if args.to_batch is not None or args.to_time is not None:
            raise BadInputError("--resume finishes the interrupted rollback's own plan: drop --to-batch/--to-time")
        return run_operation(args, ResumeOperation(args.checkpoint, opts, args.source_compact_interval,
                                                   started=args.started), extra={"resumed": True})
    if args.to_batch is None and args.to_time is None:
        raise BadInputError("give --to-batch N or --to-time ISO8601 (or --resume)")
    to_time = parse_time(args.to_time, "--to-time") if args.to_time else None
    op = RollbackOperation(args.checkpoint, args.to_batch, to_time, args.sink, args.keep_files, opts,
                           args.source_compact_interval, args.sink_compact_interval, force=args.force,
                           without_recorded_sinks=args.without_recorded_sinks)
    return run_operation(args, op)


def cmd_undo(args) -> int:
    from ..recovery import UndoOperation

    return run_operation(args, UndoOperation(args.checkpoint, storage_options(args), args.source_compact_interval,
                                             op_id=args.op, started=args.started))


def cmd_resume(args) -> int:
    from ..recovery import ResumeOperation

    op = ResumeOperation(args.checkpoint, storage_options(args), args.source_compact_interval, started=args.started)
    return run_operation(args, op, extra={"resumed": True})


def cmd_history(args) -> int:
    from ..prune import history
    from ..recovery import open_anchor

    anchor, _ = open_anchor(args.checkpoint, storage_options(args), args.source_compact_interval)
    entries = [e.to_dict() for e in history(anchor)]
    lines = [f"{len(entries)} operation(s) journaled for {anchor.url}" + (":" if entries else "")]
    for e in entries:
        c = e["counts"]
        target = f" to batch {e['target_batch']}" if e["target_batch"] is not None else ""
        lines.append(f"  {e['op_id']}  {e['operation']}{target}  {e['status']}, undo record "
                     f"{e['undo_record']}  (deleted {c['delete']}, wrote {c['write']}, rewrote {c.get('replace', 0)}, "
                     f"moved {c['keep']})")
    if any(e["undo_record"] == "kept" for e in entries):  # a kept record is not yet an undo that goes through
        lines.append(f"undo reverts the newest operation only, and refuses once anything was written after it (a "
                     f"batch Spark ran): `checkpoint-ops undo {anchor.url} --dry-run` says whether it can")
    doc = {"checkpoint": anchor.url, "operations": entries}
    paired = None if anchor.checkpoint else _paired_checkpoint(anchor, args)
    if paired is not None:  # an output: what ran with its checkpoint is journaled there (a review read "0" as none)
        doc["journaled_with_checkpoint"] = paired
        lines.append(f"this is the output of checkpoint {paired}: operations run with it (rollback, restore, undo, "
                     f"sink commands given --checkpoint) are journaled beside it: `checkpoint-ops history {paired}`")
    emit(args, doc, "\n".join(lines))
    return EXIT_OK


def _paired_checkpoint(anchor, args) -> str | None:
    """The checkpoint the output's pairing record names, if it is there (``pairing.paired_checkpoint_url``)."""
    from ..errors import CheckpointOpsError
    from ..model.sink import SinkOutput
    from ..pairing import paired_checkpoint_url

    try:
        return paired_checkpoint_url(SinkOutput(anchor.fm, anchor.root, data=False), storage_options(args))
    except (CheckpointOpsError, OSError):  # a hint only: history answers without it
        return None


def cmd_prune(args) -> int:
    from ..prune import PruneOperation

    older = parse_duration(args.older_than, "--older-than") if args.older_than else None
    op = PruneOperation(args.checkpoint, args.keep_last, older, storage_options(args), args.source_compact_interval)
    return run_operation(args, op)


def register(sub, parents: Parents) -> None:
    common = [*parents.reading, parents.intervals]
    mutating = [*common, parents.mutating]

    p = sub.add_parser("rollback", parents=[*mutating, parents.sinks],
                       help="roll a checkpoint and its file sinks back to a batch (journaled, undoable)",
                       description="--force also goes ahead without a metadata file (Spark would start the query "
                       "under a new id).")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--to-batch", type=int, metavar="N", help="the batch that will be the last committed one")
    target.add_argument("--to-time", metavar="ISO8601",
                        help="roll back to the last batch planned at or before this time (batchTimestampMs)")
    p.add_argument("--keep-files", metavar="DIR", help="move the sink data files of rolled-back batches here instead "
                   "of deleting them")
    p.add_argument("--without-recorded-sinks", action="store_true",
                   help="roll back although the batch ledger records file sinks of this query not given with --sink "
                   "(outputs abandoned on purpose; they are left as they are and the plan warns)")
    p.add_argument("--resume", action="store_true", help="finish an interrupted rollback (the same as `resume`)")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("undo", parents=mutating,
                       help="revert the last operation (or finish an interrupted undo) byte for byte")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--op", metavar="OP_ID", help="undo this operation (an id from `history`), and only if it is "
                   "still the one to undo when the lease is held; without it, the newest when the command starts")
    p.set_defaults(func=cmd_undo)

    p = sub.add_parser("resume", parents=mutating,
                       help="finish an interrupted operation (its journaled plan), or roll it forward after an "
                       "interrupted undo")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("history", parents=common,
                       help="the operations journaled for a checkpoint (or a sink output), and which can be undone")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("prune", parents=mutating, help="delete the undo records (trash) of older finished operations")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--keep-last", type=int, metavar="K", help="keep the newest K applied operations undoable")
    p.add_argument("--older-than", metavar="DURATION",
                   help="prune only operations created longer ago (e.g. 30d, 12h)")
    p.set_defaults(func=cmd_prune)
