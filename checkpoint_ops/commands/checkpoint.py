"""Read-only commands on a checkpoint: ``inspect``, ``offsets``, ``fsck``."""

from __future__ import annotations

from ..cli import Parents, emit, open_checkpoint, storage_options
from ..errors import EXIT_FINDINGS, EXIT_OK
from ..ledger import ledger_or_none


def cmd_inspect(args) -> int:
    from ..inspect import inspect_checkpoint, render_inspect

    ckpt, sinks = open_checkpoint(args)
    ledger = ledger_or_none(ckpt) if ckpt.kind == "structured" else None
    report = inspect_checkpoint(ckpt, sinks, ledger=ledger)
    if ledger is not None:
        _window_with_recorded_sinks(args, ckpt, sinks, ledger, report)
    emit(args, report, render_inspect(report))
    return EXIT_OK


def _window_with_recorded_sinks(args, ckpt, sinks, ledger, report: dict) -> None:
    """The rollback window judged with the file sinks the batch ledger records and ``--sink`` left out, as a
    rollback takes them (refusing without them): judged without, it offered batches the rollback refused (a
    hostile review: window 0..12, rollback to 7 refused, 9 the earliest)."""
    from ..recorded_sinks import left_out
    from ..window import rollback_window

    recorded = [m.output for m in left_out(ckpt, list(sinks), ledger, storage_options=storage_options(args),
                                           compact_interval=args.sink_compact_interval, data=True)
                if m.output is not None]  # with its data files listed, as --sink opens one (the window checks them)
    if recorded:
        window = rollback_window(ckpt, [*sinks, *recorded], ledger).to_dict()
        report["rollback_window"] = {**window, "with_recorded_sinks": [s.url for s in recorded]}


def cmd_offsets(args) -> int:
    from ..inspect import batch_offsets, render_offsets

    ckpt, _ = open_checkpoint(args)
    report = batch_offsets(ckpt, args.batch, ledger=ledger_or_none(ckpt))
    emit(args, report, render_offsets(report))
    damaged = report["commit_problem"] or report["start_problem"]
    return EXIT_FINDINGS if damaged else EXIT_OK  # answered, with damage found beside it


def cmd_fsck(args) -> int:
    from ..fsck import FsckReport, run_fsck

    ckpt, sinks = open_checkpoint(args)
    findings = run_fsck(ckpt, sinks, deep=args.deep, ledger=ledger_or_none(ckpt) if ckpt.kind == "structured" else None,
                        storage_options=storage_options(args), sink_compact_interval=args.sink_compact_interval)
    report = FsckReport.of(ckpt, findings)
    emit(args, report.to_dict(), report.render())
    return EXIT_FINDINGS if findings else EXIT_OK


def register(sub, parents: Parents) -> None:
    common = [*parents.reading, parents.intervals]
    p = sub.add_parser("inspect", parents=[*common, parents.sinks],
                       help="summarise a checkpoint (batches, sources, state, rollback window, lease)")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("offsets", parents=common, help="the source offsets batch N started from and ended at")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--batch", type=int, required=True, metavar="N")
    p.set_defaults(func=cmd_offsets)

    p = sub.add_parser("fsck", parents=[*common, parents.sinks],
                       help="check a checkpoint (and sinks) for anything that breaks a restart")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--deep", action="store_true",
                   help="also verify every checksum sidecar against its file (reads every file)")
    p.set_defaults(func=cmd_fsck)
