"""``checkpoint-ops``: the command line. Every command takes ``--json`` and ``--storage-options``.

Exit codes: 0 done/healthy, 1 findings or refused, 2 unusable input, 3 internal error (a bug).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from . import __version__
from .errors import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, BadInputError, CheckpointOpsError
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
        print(json.dumps(data, indent=2, sort_keys=False, default=str))
    else:
        print(text)


# ---- commands ---------------------------------------------------------------------------------


def cmd_inspect(args) -> int:
    from .inspect import inspect_checkpoint, render_inspect

    ckpt, sinks = _open(args)
    report = inspect_checkpoint(ckpt, sinks)
    _emit(args, report, render_inspect(report))
    return EXIT_OK


def cmd_offsets(args) -> int:
    from .inspect import batch_offsets, render_offsets

    ckpt, _ = _open(args)
    report = batch_offsets(ckpt, args.batch)
    _emit(args, report, render_offsets(report))
    return EXIT_OK


def cmd_fsck(args) -> int:
    from .fsck import render_findings, run_fsck

    ckpt, sinks = _open(args)
    findings = run_fsck(ckpt, sinks, deep=args.deep)
    data = {
        "path": ckpt.url,
        "healthy": not findings,
        "findings": [f.to_dict() for f in findings],
    }
    _emit(args, data, render_findings(findings, ckpt.url))
    return EXIT_FINDINGS if findings else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="checkpoint-ops",
        description="Safe, audited operations on Spark Structured Streaming checkpoints.",
        epilog="Exit codes: 0 done/healthy, 1 findings or refused, 2 unusable input, 3 internal error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", help="summarise a checkpoint (batches, sources, state, rollback window)")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    _common(p)
    _sink_args(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("offsets", help="the source offsets batch N started from and ended at")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--batch", type=int, required=True, metavar="N")
    _common(p)
    p.set_defaults(func=cmd_offsets)

    p = sub.add_parser("fsck", help="check a checkpoint (and sinks) for anything that breaks a restart")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--deep", action="store_true",
                   help="also verify every checksum sidecar against its file (reads every file)")
    _common(p)
    _sink_args(p)
    p.set_defaults(func=cmd_fsck)
    return parser


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
        if isinstance(e, OSError):
            print(f"checkpoint-ops: storage error: {e}", file=sys.stderr)
            if getattr(args, "json", False):
                print(json.dumps({"error": "StorageError", "problem": str(e)}))
            return EXIT_BAD_INPUT
        traceback.print_exc()
        print(f"checkpoint-ops: internal error ({type(e).__name__}): please report it with the traceback above",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
