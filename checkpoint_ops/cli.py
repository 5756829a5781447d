"""``checkpoint-ops``: the command line, argument wiring over the library.

Each command group lives in ``checkpoint_ops/commands/`` and is built from the shared parent parsers
here (``Parents``). Every command that changes anything builds an ``Operation`` and hands it to the one
runner (``operation.run``) through ``run_operation``: lease, activity check, plan, ``--dry-run``,
confirmation (``--yes``, ``--plan-hash`` or a prompt), apply, release. Nothing here changes files.

Exit codes: 0 done/healthy, 1 findings or refused, 2 unusable input, 3 internal error (a bug).
"""

from __future__ import annotations

import time

# When this command started, taken before anything else is imported: ``undo`` and ``resume`` act on the
# operation that was newest then, and refuse if another command acted since (recovery.py).
STARTED = time.time()

import argparse
import getpass
import json
import os
import re
import signal
import sys
import threading
import traceback
from dataclasses import dataclass

from . import __version__
from .collector import fewer_collections
from .errors import (EXIT_BAD_INPUT, EXIT_OK, BadInputError, CheckpointOpsError, StorageError,
                     is_storage_failure)
from .fence import recovery_advice, resume_command, revert_command
from .model.checkpoint import Checkpoint, open_sink
from .model.compactible import SPARK_DEFAULT_COMPACT_INTERVAL
from .operation import (LEASE_LEFT_BEHIND, InterruptedAfterPublishing, Operation, OperationResult, RunOptions,
                        StoppedAfterApplying, StoppedBeforeChanges, StoppedPartWay, StoppedWhileApplying, run)

EXIT_INTERNAL = 3


# ---- shared options --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parents:
    """The shared parent parsers every command is built from."""

    output: argparse.ArgumentParser  # --json
    storage: argparse.ArgumentParser  # --storage-options
    intervals: argparse.ArgumentParser  # --source-compact-interval, --sink-compact-interval
    sinks: argparse.ArgumentParser  # --sink (repeatable)
    mutating: argparse.ArgumentParser  # --dry-run, --yes, --plan-hash, --force, --verbose

    @property
    def reading(self) -> list[argparse.ArgumentParser]:
        """What every command takes."""
        return [self.output, self.storage]


def _parents() -> Parents:
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print machine-readable JSON (keys: docs/cli.md)")
    storage = argparse.ArgumentParser(add_help=False)
    storage.add_argument("--storage-options", metavar="JSON",
                         help="fsspec storage options as JSON (S3 also honours AWS_ENDPOINT_URL)")
    intervals = argparse.ArgumentParser(add_help=False)
    intervals.add_argument("--source-compact-interval", type=int, default=SPARK_DEFAULT_COMPACT_INTERVAL, metavar="N",
                           help="spark.sql.streaming.fileSource.log.compactInterval, if you changed it (only used "
                           "when a source log has a single .compact file; default %(default)s)")
    intervals.add_argument("--sink-compact-interval", type=int, default=SPARK_DEFAULT_COMPACT_INTERVAL, metavar="N",
                           help="spark.sql.streaming.fileSink.log.compactInterval, if you changed it (default "
                           "%(default)s)")
    sinks = argparse.ArgumentParser(add_help=False)
    sinks.add_argument("--sink", metavar="OUTPUT_PATH", action="append", default=[],
                       help="a file sink's output directory (holding _spark_metadata/); repeatable")
    mutating = argparse.ArgumentParser(add_help=False)
    mutating.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")
    mutating.add_argument("--yes", "-y", action="store_true", help="apply without asking")
    mutating.add_argument("--plan-hash", metavar="HASH",
                          help="apply only the plan with this hash (from --dry-run; at least 8 characters): the "
                          "exact plan you reviewed, no prompt")
    mutating.add_argument("--force", action="store_true",
                          help="skip the check that no query is running (a lease is never overridden: see "
                          "`lease break`)")
    mutating.add_argument("--verbose", "-v", action="store_true", help="list every file in the printed plan")
    return Parents(output, storage, intervals, sinks, mutating)


def storage_options(args) -> dict | None:
    text = getattr(args, "storage_options", None)
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


def open_checkpoint(args) -> tuple[Checkpoint, list]:
    """The checkpoint named by ``args.checkpoint`` and the sinks of ``--sink``, read only."""
    from .pairing import refuse_repeated

    opts = storage_options(args)
    refuse_repeated(list(getattr(args, "sink", None) or []))
    ckpt = Checkpoint.open(args.checkpoint, opts, source_compact_interval=args.source_compact_interval)
    try:
        sinks = [open_sink(s, opts, args.sink_compact_interval) for s in getattr(args, "sink", [])]
    except BadInputError as e:
        fence = ckpt.fence if ckpt.kind == "structured" else None
        if fence is None:
            raise
        # an interrupted operation of ours moves sink log files aside while it runs: say that first
        raise BadInputError(f"{e.problem}; the checkpoint is fenced by an interrupted {fence.operation} "
                            f"({fence.op_id}), which changes its sinks' logs too and may have left this one part-way",
                            path=e.path, fix=recovery_advice(fence, ckpt.url) + ", then run this again") from None
    return ckpt, sinks


# ---- output --------------------------------------------------------------------------------------


def print_json(data) -> None:
    """Indented for a person at a terminal; one line for programs, which json's C encoder writes many
    times faster (a large rollback plan lists tens of thousands of actions)."""
    indent = 2 if sys.stdout.isatty() else None
    print(json.dumps(data, indent=indent, default=str))


def emit(args, data, text: str) -> None:
    if args.json:
        print_json(data)
    else:
        print(text)


def warn(note: str) -> None:
    """A warning on stderr (stdout holds the result, ``--json`` included)."""
    print(f"checkpoint-ops: warning: {note}", file=sys.stderr, flush=True)


def _prompt(question: str) -> bool:
    """A 'y' from a person at the terminal; anything else, Ctrl-D included, is a no."""
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        print(file=sys.stderr)
        return False
    return answer.strip().lower() in ("y", "yes")


def run_operation(args, op: Operation, extra: dict | None = None) -> int:
    """Run a mutating command's operation through the one runner, with the shared flags."""
    command = " ".join(str(a) for a in (args.command, getattr(args, "sink_command", None),
                                          getattr(args, "backup_command", None), getattr(args, "lease_command", None))
                       if a)
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment
        user = str(os.getuid())
    options = RunOptions(
        dry_run=args.dry_run, yes=args.yes, plan_hash=args.plan_hash, force=args.force, progress=not args.json,
        owner=f"checkpoint-ops {command} (user {user})", storage_options=storage_options(args),
        show_plan=None if args.json else (lambda plan: print(plan.render(verbose=args.verbose), flush=True)),
        prompt=_prompt if sys.stdin.isatty() else None,
        warn=warn,
    )
    stopped = None
    try:
        result: OperationResult = run(op, options)
    except StoppedAfterApplying as e:  # Ctrl-C while its leases were released: done, so what it did is shown
        if e.result is None:  # stopped after its journal said applied: no result to show
            raise
        stopped, result = e, e.result
    try:
        if args.json:
            print_json({**result.to_dict(), **(extra or {})})
        elif result.applied:
            print(op.describe(result.plan, result.outcome))
        else:
            print(result.plan.render(verbose=args.verbose))
        sys.stdout.flush()
    except KeyboardInterrupt as e:  # done and released: only what it did was not all shown
        raise StoppedAfterApplying(op.name, op.recovery_url(), result, recovery=op.recovery, cut_short=True,
                                   lease_left=stopped is not None and stopped.lease_left) from e
    if stopped is not None and stopped.lease_left:
        raise stopped
    if stopped is not None:  # the interrupt stopped nothing: exit 0, so nothing runs the operation again
        for line in stopped_after_applying(stopped):
            print(line, file=sys.stderr)
    return EXIT_OK


# ---- the parser ------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with ``--json`` honoured for a usage error too: the error document on stdout as for every other
    error (exit 2, usage on stderr as before). A review's `rollback ... --to-batchh 3 --json` printed nothing on
    stdout for the program reading it."""

    json_wanted = False  # set for the command line being parsed (``_main``): whether it asks for --json

    def error(self, message: str):
        if _Parser.json_wanted:
            print_json(BadInputError(message, fix=f"`{self.prog} --help` lists what it takes").to_dict())
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    from .commands import COMMANDS

    parser = _Parser(
        prog="checkpoint-ops",
        description="Safe, audited operations on Spark Structured Streaming checkpoints.",
        epilog="Exit codes: 0 done/healthy, 1 findings or refused, 2 unusable input, 3 internal error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parents = _parents()
    for register in COMMANDS:
        register(sub, parents)
    return parser


def _location(args, e: BaseException | None = None) -> str | None:
    """The location a command was given, for an error that names none: the one given, or of several (a
    backup's source and destination, a checkpoint and its sinks) the one in the bucket an S3 "no such bucket"
    reply names; else None (which one failed is not known here)."""
    given = [getattr(args, name) for name in ("checkpoint", "output", "url", "target", "dest")
             if isinstance(getattr(args, name, None), str)]
    given += [v for v in (getattr(args, "sink", None) or []) if isinstance(v, str)]
    given += [v for v in (getattr(args, "sink_target", None) or []) if isinstance(v, str)]
    bucket = _missing_bucket(e) if e is not None else None
    if bucket is not None:
        inside = [url for url in given if _in_bucket(bucket, [url])]
        if len(inside) == 1:
            return inside[0]
    return given[0] if len(given) == 1 else None


def _missing_bucket(e: BaseException) -> str | None:
    from .storage.direct_put import missing_bucket

    return missing_bucket(e)


def _in_bucket(bucket: str, urls: list) -> bool:
    return any(isinstance(url, str) and re.match(rf"[A-Za-z][A-Za-z0-9+.-]*://{re.escape(bucket)}(/|$)", url)
               for url in urls)


_READ_ONLY = {("inspect", None), ("offsets", None), ("fsck", None), ("history", None), ("compat", None),
              ("ledger", "show"), ("sink", "files"), ("lease", "show")}


def _reads_only(args) -> bool:
    """A command that changes nothing: a storage failure in it leaves nothing to resume or undo (a review: fsck of a
    missing bucket advised both)."""
    command = getattr(args, "command", None)
    action = getattr(args, f"{command}_command", None) if command else None
    return (command, action) in _READ_ONLY


def _storage_error(args, e: BaseException) -> StorageError:
    """A storage failure no operation wrapped, as an error that says where and what to do next: a backup
    stopped part-way is finished by running it again (its docs), any other operation by resume or undo."""
    bucket = _missing_bucket(e)
    problem = f"no such bucket: {bucket!r}" if bucket else f"storage error: {e}"
    check = ("check the bucket's name, the endpoint and the credentials (AWS_* / --storage-options)" if bucket else
             "check the location, credentials (AWS_* / --storage-options) and the endpoint")
    action = getattr(args, "backup_command", None) if getattr(args, "command", None) == "backup" else None
    targets = [getattr(args, "target", None), *(getattr(args, "sink_target", None) or [])]
    path = _location(args, e)
    if action == "restore" and bucket and _in_bucket(bucket, [getattr(args, "dest", None)]):
        path = args.dest  # read first: the one that failed, whichever else is in that bucket
        # the backups are read from there: the restore stopped before it read one, so wrote nothing
        check = ("check the backup destination's bucket name, the endpoint and the credentials (AWS_* / "
                 "--storage-options)")
        then = "; nothing was restored"
    elif action == "restore" and bucket and _in_bucket(bucket, targets):
        # the restore's own target: nothing can have been written there, and resume or undo would not make it
        at_root = [url for url in targets if isinstance(url, str) and _in_bucket(bucket, [url])
                   and not url.split("://", 1)[-1].strip("/").partition("/")[2]]
        check = (f"create the bucket {bucket!r} first (a restore makes its target's prefix, not a bucket), or check "
                 "its name, the endpoint and the credentials (AWS_* / --storage-options)")
        if at_root:
            check += (f"; and restore into a prefix in it ({at_root[0].rstrip('/')}/NAME), not the bucket's root: "
                      "the journal and ledger are kept beside the target")
        then = "; nothing was restored into it: run the restore again once it exists"
    elif action in ("create", "prune"):
        then = "; a backup (or prune) that stopped part-way is finished by running the same command again"
    elif action in ("list", "verify", "drill") or _reads_only(args):
        then = ""  # nothing changed: they read (a drill restores into scratch space of its own)
    else:
        then = ("; an operation that stopped part-way is finished by `checkpoint-ops resume` or reverted by "
                "`checkpoint-ops undo` (`checkpoint-ops history` lists what is unfinished)")
    return StorageError(problem, path=path, fix=f"{check}{then}")


def stopped_after_applying(e: StoppedAfterApplying) -> list[str]:
    """What an interrupt that came once the operation had finished says: it is done (nothing to resume)."""
    where = e.where or "PATH"
    result = e.result
    dry_run = result is not None and result.dry_run
    what = f"the {e.operation}'s dry run" if dry_run else f"the {e.operation}"
    if result is not None and (dry_run or not result.applied):
        done, fix = "nothing was changed" if dry_run else "it found nothing to do", "nothing to resume or undo"
    else:
        done = "it had applied its whole plan"
        if e.recovery == "journal":
            fix = (f"nothing is left to resume; `{revert_command(e.operation, where)}` reverts it (`checkpoint-ops "
                   f"history {where}` lists it)")
        elif e.recovery == "acts on a journal":
            fix = (f"nothing is left to resume or undo (`checkpoint-ops history {where}` shows the operation it "
                   "acted on)")
        else:
            fix = "nothing is left to do"
    shown = ("; its output was not shown" if result is None else "; its output was cut short" if e.cut_short else
             "; its output is above")
    lines = [f"checkpoint-ops: {where}: interrupted after {what} finished: {done}{shown}", f"  fix: {fix}"]
    if e.lease_left:
        lines.append("  note: a second interrupt stopped the release of its lease, which may be left; "
                     f"{LEASE_LEFT_BEHIND}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The command line. As the console script (``argv`` None), a first Ctrl-C that comes once the command has
    returned its exit code (while the interpreter shuts down: threads joined, files closed) changes nothing and is
    let go: a review's restore printed its result, then died of that SIGINT (exit 130, where the command had
    finished and said 0; a wrapper that reacts to 130 would undo a finished restore). A second one stops it."""
    try:
        return _main(argv)
    finally:
        if argv is None:
            _let_a_late_interrupt_go()


def _let_a_late_interrupt_go() -> None:
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # ignored (a job in the background), or handled by whoever runs this

    def first(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # the next one ends the process, as a Ctrl-C does

    signal.signal(signal.SIGINT, first)


def _main(argv: list[str] | None) -> int:
    # the console script's start is when this module was imported; a call in process (argv given) starts now
    started = STARTED if argv is None else time.time()
    parser = build_parser()
    # as argparse reads it: --json, or a prefix of it that it takes for --json (--js)
    _Parser.json_wanted = any(a.startswith("--j") and "--json".startswith(a)
                              for a in (sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    args.started = started
    as_json = getattr(args, "json", False)
    try:
        with fewer_collections():  # a command's big structures hold no cycles (collector.py)
            return args.func(args)
    except CheckpointOpsError as e:
        if as_json:
            print_json(e.to_dict())
        print(f"checkpoint-ops: {e.render()}", file=sys.stderr)
        return e.exit_code
    except StoppedBeforeChanges as e:
        if e.recovery == "acts on a journal":  # an undo or a resume: what it acts on is left as it was
            where = e.where or "PATH"
            print(f"checkpoint-ops: {where}: interrupted: the {e.operation} stopped before it changed anything; the "
                  "operation it acts on is as it was (a checkpoint that operation fenced stays fenced)",
                  file=sys.stderr)
            print(f"  fix: run `checkpoint-ops {e.operation} {where}` again to apply it (`checkpoint-ops history "
                  f"{where}` shows the operation it acts on)", file=sys.stderr)
            return 130
        print(f"checkpoint-ops: interrupted: the {e.operation} stopped before it changed anything (nothing was "
              "journaled)", file=sys.stderr)
        print(f"  fix: there is nothing of it to resume or undo (`undo` would revert the operation before it); run "
              f"the {e.operation} again to apply it", file=sys.stderr)
        return 130
    except StoppedPartWay as e:
        print(f"checkpoint-ops: interrupted: the {e.operation} stopped part-way (it journals nothing to resume or "
              "undo)", file=sys.stderr)
        print(f"  fix: run the {e.operation} again: it finishes what this one began (`resume` and `undo` act on other "
              "operations)", file=sys.stderr)
        return 130
    except StoppedAfterApplying as e:
        for line in stopped_after_applying(e):
            print(line, file=sys.stderr)
        return 130
    except StoppedWhileApplying as e:
        where = e.where or "PATH"
        print(f"checkpoint-ops: {where}: interrupted: the {e.operation} stopped while applying its plan, and may have "
              "changed files", file=sys.stderr)
        reverts = ("goes back to the result of the operation it was undoing" if e.operation == "undo" else
                   "reverts it")
        print(f"  fix: `{resume_command(e.operation, where)}` finishes it, or `{revert_command(e.operation, where)}` "
              f"{reverts} (a checkpoint it fenced names both)", file=sys.stderr)
        return 130
    except InterruptedAfterPublishing as e:
        print(f"checkpoint-ops: interrupted after backup {e.backup_id} was published: it is complete, and its output "
              "may not have been shown", file=sys.stderr)
        print(f"  fix: nothing to run again (`checkpoint-ops backup list {e.dest_url}` shows it)", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        if getattr(args, "command", None) == "backup" and getattr(args, "backup_command", None) == "create":
            print("checkpoint-ops: interrupted: the backup stopped before it was published (a backup exists only once "
                  "its manifest is stored); the checkpoint was only read", file=sys.stderr)
            print("  fix: run the same command again to take the backup (nothing this one stored is visible as a "
                  "backup; `backup prune` removes what no backup uses)", file=sys.stderr)
            return 130
        if getattr(args, "command", None) == "prune" or (getattr(args, "command", None) == "backup" and getattr(
                args, "backup_command", None) == "prune"):
            what = "backup prune" if args.command == "backup" else "prune"
            print(f"checkpoint-ops: interrupted: the {what} stopped (it journals nothing to resume or undo)",
                  file=sys.stderr)
            print(f"  fix: run the {what} again: it finishes what this one began", file=sys.stderr)
            return 130
        print("checkpoint-ops: interrupted", file=sys.stderr)
        print("  fix: if it was changing something, `checkpoint-ops resume PATH` finishes the operation and "
              "`checkpoint-ops undo PATH` reverts it (a checkpoint it fenced names both; `checkpoint-ops history "
              "PATH` lists what is unfinished); a command that only read changed nothing", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:  # a bug, or a storage failure we did not anticipate
        if is_storage_failure(e):
            error = _storage_error(args, e)
            if as_json:
                print_json(error.to_dict())
            print(f"checkpoint-ops: {error.render()}", file=sys.stderr)
            return EXIT_BAD_INPUT
        traceback.print_exc()
        print(f"checkpoint-ops: internal error ({type(e).__name__}): please report it with the traceback above",
              file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
