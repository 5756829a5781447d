"""``checkpoint-ops ledger``: the batch ledger (which files each batch wrote, kept past compaction)."""

from __future__ import annotations

import json

from ..cli import Parents, emit, open_checkpoint, warn
from ..errors import EXIT_FINDINGS, EXIT_OK, BadInputError, require_batch_number


def cmd_ledger_sync(args) -> int:
    from ..lease import acquire_all
    from ..ledger import sync

    ckpt, sinks = open_checkpoint(args)  # read-only first: a location that is not a checkpoint gets no lease
    sites = [(ckpt.fm, ckpt.root, ckpt.url)] + [(s.fm, s.root, s.url) for s in sinks]
    # one writer at a time: a rollback, an undo or a run never has the ledger merged under it, nor the
    # pairing records rewritten; the model is read again under the leases
    # a release the store fails after the sync is told, not raised: the ledger was synced
    with acquire_all(sites, "checkpoint-ops ledger sync").held(warn) as leases:
        ckpt, sinks = open_checkpoint(args)
        r = sync(ckpt, sinks, assume_paired=args.assume_paired, guard=leases.check)
    rng = f"batches {r['range']['first']}..{r['range']['last']}" if r["range"] else "nothing new"
    text = (f"Ledger {r['ledger']}: recorded {r['batches_recorded']} batch(es) ({rng}); "
            + ", ".join(f"{n} sink batch(es) of {u}" for u, n in r["sink_batches_recorded"].items()))
    for v in r["pairing"]:
        text += f"\n  pairing of {v['sink']}: {v['status']} ({v['evidence']})"
    if r["forgot_from"]:
        text += (f"\n  forgot the ledger's records from batch {r['forgot_from']['batch']} on: "
                 f"{r['forgot_from']['offsets_file']} is not the file the ledger recorded (another timeline: a "
                 "restore, or a query started again here)")
    for d in r["skipped"]:
        text += f"\n  skipped (damaged, not recorded): {d['path']}: {d['problem']}"
    emit(args, r, text)
    return EXIT_FINDINGS if r["skipped"] else EXIT_OK


def cmd_ledger_show(args) -> int:
    from ..ledger import Ledger

    ckpt, _ = open_checkpoint(args)
    ledger = Ledger.for_checkpoint(ckpt)
    if args.batch is None:
        batches = sorted(ledger.records)
        data = {"ledger": ledger.fm.url(ledger.path), "segments": ledger.segments,
                "batches": {"first": batches[0] if batches else None, "last": batches[-1] if batches else None,
                            "count": len(batches)}}
        text = (f"Ledger {data['ledger']}: {len(batches)} batch(es)"
                + (f" ({batches[0]}..{batches[-1]})" if batches else "") + f" in {len(ledger.segments)} segment(s)")
        emit(args, data, text)
        return EXIT_OK
    require_batch_number(args.batch, "batch", ledger.fm.url(ledger.path))
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
    emit(args, data, "\n".join(lines))
    return EXIT_OK


def register(sub, parents: Parents) -> None:
    p = sub.add_parser("ledger", help="the batch ledger: which files each batch wrote, kept past compaction")
    lsub = p.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    common = [*parents.reading, parents.intervals]
    q = lsub.add_parser("sync", parents=[*common, parents.sinks], help="record every batch Spark's files still "
                        "describe")
    q.add_argument("checkpoint", metavar="CHECKPOINT")
    q.add_argument("--assume-paired", action="store_true", help="record each --sink as this checkpoint's output even "
                   "when its batch history does not show it (never over a sink recorded with another checkpoint)")
    q.set_defaults(func=cmd_ledger_sync)
    q = lsub.add_parser("show", parents=common, help="what the ledger knows (one batch with --batch)")
    q.add_argument("checkpoint", metavar="CHECKPOINT")
    q.add_argument("--batch", type=int, metavar="N")
    q.set_defaults(func=cmd_ledger_show)
