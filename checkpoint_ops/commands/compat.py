"""``checkpoint-ops compat``: will a changed query restart from this checkpoint, and behave as its code
says? Spark judges: it restarts the query on a scratch copy of the restart set against a noop sink. Also
the Spark session that ``--query`` functions get here and in ``backup drill``."""

from __future__ import annotations

import argparse
import contextlib

from ..cli import Parents, emit, open_checkpoint, storage_options
from ..errors import BadInputError, param
from ..ledger import ledger_or_none
from ..recorded_sinks import recorded_sinks


@contextlib.contextmanager
def spark_session(args):
    """The Spark session ``--query`` functions get: the active one if any, else a new local (or
    ``--spark-remote``) session, stopped afterwards. pyspark is imported here only."""
    from pyspark.sql import SparkSession

    confs = []
    for text in args.spark_conf:  # checked before any session is used, so a slip is never silently ignored
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise BadInputError(f"--spark-conf {text!r} is not KEY=VALUE", fix="e.g. --spark-conf spark.master=local[4]")
        confs.append((key, value))
    active = SparkSession.getActiveSession()
    if active is not None and not args.spark_remote:
        yield active
        return
    builder = SparkSession.builder.appName("checkpoint-ops")
    if args.spark_remote:
        builder = builder.remote(args.spark_remote)
    else:
        builder = builder.config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        if not any(key == "spark.log.level" for key, _ in confs):
            # the verdict carries Spark's error (its class and message): its log printed the same failure as 95
            # lines of stack trace before it (a hostile review); --spark-conf spark.log.level=WARN shows them
            builder = builder.config("spark.log.level", "FATAL")
    for key, value in confs:
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def spark_parent() -> argparse.ArgumentParser:
    """The options of commands that run the user's query in Spark."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--query", required=True, metavar="MODULE:FUNCTION",
                   help="FUNCTION(spark) returns the query's unstarted DataStreamWriter (the module is imported from "
                   "the current directory or PYTHONPATH)")
    p.add_argument("--scratch", metavar="DIR", help="where Spark restarts the copy (default: a temporary directory; "
                   "with a cluster, a location its executors reach)")
    p.add_argument("--spark-conf", metavar="KEY=VALUE", action="append", default=[],
                   help="a Spark setting for the session (repeatable; e.g. spark.master=local[4])")
    p.add_argument("--spark-remote", metavar="sc://HOST:PORT", help="use a Spark Connect server")
    return p


def cmd_compat(args) -> int:
    from ..compat import accept, check_compat, load_query, require_committed

    ckpt, _ = open_checkpoint(args)
    cut_sinks: list[str] = []
    if args.as_of_batch is not None:
        if args.record:
            raise BadInputError(f"{param('record')} with {param('as_of_batch')}: the query would be recorded as "
                                "accepted at a batch the checkpoint has not been rolled back to",
                                path=ckpt.url, fix=f"leave out {param('record')}: after the rollback, the query's "
                                "first run (or `compat --record` then) records it")
        require_committed(ckpt, args.as_of_batch)  # before a Spark session starts
        # a rollback takes the given sinks and those the checkpoint's ledger records (it refuses to leave one out)
        cut_sinks = [*args.sink, *(sink.url for sink in recorded_sinks(ckpt, ledger_or_none(ckpt)))]
    build = load_query(args.query)
    with spark_session(args) as spark:
        report = check_compat(ckpt, spark, build, old_sinks=args.sink, scratch_url=args.scratch,
                              storage_options=storage_options(args), as_of=args.as_of_batch, cut_sinks=cut_sinks)
    text = report.render()
    if args.record:
        recorded = accept(ckpt, report)
        text += "\nrecorded the query's profile beside the checkpoint" if recorded else \
            "\nnot recorded: Spark refuses this query"
    emit(args, report.to_dict(), text)
    return report.exit_code


def register(sub, parents: Parents) -> None:
    p = sub.add_parser("compat", parents=[*parents.reading, parents.intervals, parents.sinks, spark_parent()],
                       help="will a changed query restart from this checkpoint, and behave as its code says? (Spark "
                       "restarts it on a scratch copy against a noop sink)")
    p.add_argument("checkpoint", metavar="CHECKPOINT")
    p.add_argument("--record", action="store_true", help="record the query's profile beside the checkpoint when "
                   "Spark accepts it (the next compat compares sink, output mode and source options with it)")
    p.add_argument("--as-of-batch", type=int, metavar="N", help="judge the query where a rollback to committed batch "
                   "N would leave the checkpoint, before rolling back (the --sink outputs, and those the checkpoint's "
                   "ledger records, taken to be rolled back with it); reads only")
    p.set_defaults(func=cmd_compat)
